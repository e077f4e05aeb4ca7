//! The processes of one run together (torchrun ranks, a launcher and its workers): which
//! process held what on each device, and each device's combined peak over time.
//!
//! The traces are replayed side by side in wall-clock order (each trace's start time plus its
//! event times), so the combined peak is a real moment, not a sum of unrelated peaks. A
//! process's memory counts until its trace's last event (traces carry no exit time).

use std::collections::BTreeMap;
use std::io::{self, BufReader, Read, Write};

use gpumemtrace_format::{Event, Reader, Record};
use serde::Serialize;

use crate::read::filter::Filter;
use crate::read::input::Input;
use crate::read::replay::{Observer, Replay, Step, StepKind};
use crate::units::{seconds, size};

#[derive(Debug, Serialize)]
pub struct Merged {
    pub processes: Vec<ProcessPeak>,
    /// Combined GPU memory (device, managed, VMM physical) per device over all processes.
    pub devices: Vec<CombinedDevice>,
}

#[derive(Debug, Serialize)]
pub struct ProcessPeak {
    pub path: String,
    pub pid: u32,
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    /// Peak GPU memory per device in this process alone.
    pub peaks: BTreeMap<i32, u64>,
}

#[derive(Debug, Serialize)]
pub struct CombinedDevice {
    pub device: i32,
    pub peak_bytes: u64,
    /// Nanoseconds after the earliest trace started.
    pub peak_time_ns: u64,
    /// Each process's share at that moment, by pid.
    pub peak_by_pid: BTreeMap<u32, u64>,
    /// What the processes still held when their traces ended (their leaks, added up).
    pub live_bytes_at_end: u64,
}

/// One trace being read, with its next event, replayed by the one replay (`read::replay`).
struct Source<'a> {
    pid: u32,
    start_realtime_ns: u64,
    reader: gpumemtrace_format::recover::Recovering<BufReader<Box<dyn Read + Send + 'a>>>,
    replay: Replay,
    next: Option<Event>,
    gpu: GpuMemory,
    rank: Option<u32>,
    local_rank: Option<u32>,
}

/// The observer of a trace's replay: its GPU memory per device, its peaks, and the device the
/// last step changed.
#[derive(Default)]
struct GpuMemory {
    live: BTreeMap<i32, u64>,
    peaks: BTreeMap<i32, u64>,
    changed: Option<i32>,
}

impl Observer for GpuMemory {
    fn step(&mut self, s: &Step) {
        if !matches!(s.kind, StepKind::Alloc | StepKind::Free) || !s.key.kind.occupies_gpu() {
            return;
        }
        let d = s.key.device;
        self.live.insert(d, s.device_live);
        let peak = self.peaks.entry(d).or_default();
        *peak = (*peak).max(s.device_live);
        self.changed = Some(d);
    }
}

impl<'a> Source<'a> {
    fn open(input: &'a Input) -> Result<Source<'a>, String> {
        let path = input.path().display();
        let f = input.reader().map_err(|e| format!("{path}: {e}"))?;
        let reader = Reader::new(BufReader::new(f)).map_err(|e| format!("{path}: {e}"))?;
        let reader = gpumemtrace_format::recover::Recovering::new(reader, input.recovery());
        let mut s = Source {
            pid: 0,
            start_realtime_ns: 0,
            reader,
            replay: Replay::new(&Filter::default(), false),
            next: None,
            gpu: GpuMemory::default(),
            rank: None,
            local_rank: None,
        };
        s.advance();
        Ok(s)
    }

    /// Reads up to the next event (a read error ends the trace: what came before counts).
    fn advance(&mut self) {
        self.next = None;
        while let Ok(Some(rec)) = self.reader.next_record() {
            match rec {
                Record::Process(p) => {
                    self.pid = p.pid;
                    self.start_realtime_ns = p.start_realtime_ns;
                    self.rank = p.rank;
                    self.local_rank = p.local_rank;
                }
                Record::Event(e) => {
                    self.next = Some(e);
                    return;
                }
                rec => {
                    self.replay.feed(&rec, &mut ());
                }
            }
        }
    }

    fn next_time(&self) -> Option<u64> {
        self.next.map(|e| self.start_realtime_ns.saturating_add(e.time_ns))
    }

    /// Applies the pending event; returns the device whose GPU memory changed.
    fn apply(&mut self) -> Option<i32> {
        let e = self.next?;
        self.gpu.changed = None;
        self.replay.apply(&e, &mut self.gpu);
        self.gpu.changed
    }
}

/// Replays `inputs` together. Unreadable ones are skipped (the per-trace summaries report them).
pub fn merge(inputs: &[Input]) -> Merged {
    let mut sources: Vec<(&std::path::Path, Source)> =
        inputs.iter().filter_map(|i| Source::open(i).ok().map(|s| (i.path(), s))).collect();
    let origin = sources.iter().map(|(_, s)| s.start_realtime_ns).min().unwrap_or(0);
    let mut combined: BTreeMap<i32, CombinedDevice> = BTreeMap::new();
    // The source whose next event happened first (few processes: a linear scan is enough).
    while let Some(i) =
        (0..sources.len()).filter(|&i| sources[i].1.next.is_some()).min_by_key(|&i| sources[i].1.next_time())
    {
        let t = sources[i].1.next_time().unwrap_or(0);
        if let Some(device) = sources[i].1.apply() {
            let total = crate::units::total(sources.iter().map(|(_, s)| s.gpu.live.get(&device).copied().unwrap_or(0)));
            let c = combined.entry(device).or_insert(CombinedDevice {
                device,
                peak_bytes: 0,
                peak_time_ns: 0,
                peak_by_pid: BTreeMap::new(),
                live_bytes_at_end: 0,
            });
            if total > c.peak_bytes {
                c.peak_bytes = total;
                c.peak_time_ns = t.saturating_sub(origin);
                c.peak_by_pid = sources
                    .iter()
                    .filter_map(|(_, s)| s.gpu.live.get(&device).filter(|&&b| b > 0).map(|&b| (s.pid, b)))
                    .collect();
            }
        }
        sources[i].1.advance();
        if sources[i].1.next.is_none() {
            // The trace ended: the process's memory goes back to the driver when it exits. With
            // no exit time in the trace, its last event is the best moment there is.
            for (device, bytes) in std::mem::take(&mut sources[i].1.gpu.live) {
                if let Some(c) = combined.get_mut(&device) {
                    c.live_bytes_at_end = c.live_bytes_at_end.saturating_add(bytes);
                }
            }
        }
    }
    Merged {
        processes: sources
            .into_iter()
            .map(|(path, s)| ProcessPeak {
                path: path.display().to_string(),
                pid: s.pid,
                rank: s.rank,
                local_rank: s.local_rank,
                peaks: s.gpu.peaks,
            })
            .collect(),
        devices: combined.into_values().collect(),
    }
}

pub fn render(m: &Merged, out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "all {} processes together:", m.processes.len())?;
    for p in &m.processes {
        let rank = match (p.rank, p.local_rank) {
            (Some(r), Some(l)) => format!("rank {r} (local {l})"),
            (Some(r), None) => format!("rank {r}"),
            _ => "no rank".to_string(),
        };
        let peaks: Vec<String> = p.peaks.iter().map(|(d, b)| format!("device {d} peak {}", size(*b))).collect();
        let peaks = if peaks.is_empty() { "no GPU memory".to_string() } else { peaks.join(", ") };
        writeln!(out, "  pid {:<8} {rank:<18} {peaks}", p.pid)?;
    }
    for d in &m.devices {
        let shares: Vec<String> = d.peak_by_pid.iter().map(|(pid, b)| format!("pid {pid} {}", size(*b))).collect();
        writeln!(
            out,
            "  device {}: combined peak {} at {} ({}), {} live at the end",
            d.device,
            size(d.peak_bytes),
            seconds(d.peak_time_ns),
            shares.join(" + "),
            size(d.live_bytes_at_end)
        )?;
    }
    Ok(())
}
