//! Aggregate traces (`GPUMEMTRACE_AGGREGATE=1`, docs/format.md "Aggregate mode"): instead of
//! every event, summaries of the run (per-site totals, what each site held live at the end and
//! at its group's peak and at the Python program's end, the peaks, totals by phase). The last
//! complete summary is the trace's; its events (failures, frees of nothing live) are replayed as
//! usual (an `AggFailure` record after a failure says what was live on its device), and the
//! summary then fills in the groups. What needs the order of events in time (timelines,
//! growth, temporaries, phase spans, pools, what was live at a failure by site) an aggregate
//! trace cannot give.

use std::io::Read;

use gpumemtrace_format::{AggPeak, AggPhase, AggSite, AggStart, Event, Reader, Record};

use super::timeseries::PhaseUse;
use super::trace::{DeviceTotal, Trace};
use crate::read::filter::Filter;
use crate::read::live::{largest_first, GroupKey, StackUse};

/// The summaries as the loader reads them: the one being read and the last complete one.
#[derive(Default)]
pub struct Summaries {
    current: Option<Summary>,
    last: Option<Summary>,
}

#[derive(Default)]
struct Summary {
    start: AggStart,
    sites: Vec<AggSite>,
    peaks: Vec<AggPeak>,
    phases: Vec<AggPhase>,
}

/// Whether the trace read from `source` is aggregate: its first summary comes before its first
/// stack or event (the writer writes it right after the module map).
pub fn is_aggregate<R: Read>(source: R) -> bool {
    let Ok(reader) = Reader::new(source) else { return false };
    for rec in reader {
        match rec {
            Ok(Record::AggStart(_)) => return true,
            Ok(Record::Process(_) | Record::Api(_) | Record::Module(_) | Record::Notice(_) | Record::Thread(_)) => {}
            _ => return false,
        }
    }
    false
}

/// What reports that need the order of events in time say about an aggregate trace.
pub fn refusal(what: &str) -> String {
    format!(
        "{what} needs every event in time order, and this trace is aggregate (GPUMEMTRACE_AGGREGATE=1): it holds per-site totals, peaks and the live set at the end; use summary, phases, flamegraph, tree, check or diff, or trace again without aggregate mode"
    )
}

/// Filters an aggregate trace cannot apply: it has no phases, times or per-call stacks.
pub fn check_filter(f: &Filter) -> Result<(), String> {
    if f.phase.is_some() || f.module.is_some() || f.from_ns.is_some() || f.to_ns.is_some() {
        return Err("this trace is aggregate (GPUMEMTRACE_AGGREGATE=1): it has no phases and no time order, so --phase, --module, --from and --to cannot apply (--device can)".into());
    }
    Ok(())
}

impl Summaries {
    /// Takes an aggregate record (others are ignored).
    pub fn record(&mut self, rec: Record) {
        match rec {
            Record::AggStart(start) => self.current = Some(Summary { start, ..Summary::default() }),
            Record::AggSite(s) => {
                if let Some(c) = self.current.as_mut().filter(|c| c.start.seq == s.seq) {
                    c.sites.push(s);
                }
            }
            Record::AggPeak(p) => {
                if let Some(c) = self.current.as_mut().filter(|c| c.start.seq == p.seq) {
                    c.peaks.push(p);
                }
            }
            Record::AggPhase(p) => {
                if let Some(c) = self.current.as_mut().filter(|c| c.start.seq == p.seq) {
                    c.phases.push(p);
                }
            }
            Record::AggEnd(seq) => {
                if self.current.as_ref().is_some_and(|c| c.start.seq == seq) {
                    self.last = self.current.take();
                }
            }
            _ => {}
        }
    }

    /// Fills `trace`'s groups and devices from the last complete summary, keeping only groups
    /// of `device` when given.
    pub fn finish(self, trace: &mut Trace, device: Option<i32>) {
        let Some(s) = self.last else {
            trace.notices.push("this aggregate trace holds no complete summary: nothing was allocated as far as it tells".into());
            return;
        };
        trace.aggregate = Some(s.start);
        trace.notices.push(format!(
            "aggregate trace: totals by site, peaks and the live set of {} events, as summarized {:.1} s after the start (no time order: no timeline, phases or growth)",
            s.start.events,
            s.start.time_ns as f64 / 1e9
        ));
        trace.events = trace.events.max(s.start.events);
        trace.end_ns = trace.end_ns.max(s.start.time_ns);
        if !s.start.final_ {
            trace.notices.push(format!(
                "the last summary of this aggregate trace was written {:.1} s after the start, before the process finished its trace: later calls are not in it",
                s.start.time_ns as f64 / 1e9
            ));
        }
        // Everything but the failures (events, replayed as usual) comes from the summary.
        for g in trace.groups.values_mut() {
            *g = super::trace::Group { failed: g.failed, ..Default::default() };
        }
        let wanted = |d: i32| device.is_none_or(|w| w == d);
        // When the Python program ended, its leaks are what was live then (the interpreter's
        // shutdown frees the rest), as in a full trace.
        let exit = s.start.python_exit_ns.is_some();
        let mut at_exit: Vec<(GroupKey, StackUse)> = Vec::new();
        trace.devices.clear();
        trace.allocated.clear();
        for site in s.sites.iter().filter(|x| wanted(x.device)) {
            let key = GroupKey { device: site.device, kind: site.kind };
            let stack = trace.stack_key(&Event { stack: site.stack, pystack: site.pystack, ..Event::default() });
            // Sites come in the order of their first allocation.
            trace.stack_tid.entry(stack).or_insert(site.tid);
            let g = trace.groups.entry(key).or_default();
            g.allocations += site.allocations;
            g.allocated_bytes = g.allocated_bytes.saturating_add(site.allocated_bytes);
            g.frees += site.frees;
            g.live_bytes = g.live_bytes.saturating_add(site.live_bytes);
            g.live_count += site.live_count;
            if site.live_count > 0 && !exit {
                g.leak_stacks.push(StackUse { stack, bytes: site.live_bytes, count: site.live_count });
            }
            if exit {
                at_exit.push((key, StackUse { stack, bytes: site.exit_bytes, count: site.exit_count }));
            }
            if site.peak_count > 0 {
                g.peak_stacks.push(StackUse { stack, bytes: site.peak_bytes, count: site.peak_count });
            }
            if site.allocations > 0 {
                trace.allocated.entry(key).or_default().push(StackUse { stack, bytes: site.allocated_bytes, count: site.allocations });
            }
            if site.kind.occupies_gpu() {
                let d = trace.devices.entry(site.device).or_default();
                d.live_bytes = d.live_bytes.saturating_add(site.live_bytes);
            }
        }
        for p in s.peaks.iter().filter(|p| wanted(p.device)) {
            match p.kind {
                Some(kind) => {
                    let g = trace.groups.entry(GroupKey { device: p.device, kind }).or_default();
                    (g.peak_bytes, g.peak_time_ns) = (p.bytes, p.time_ns);
                }
                None => {
                    let d = trace.devices.entry(p.device).or_insert_with(DeviceTotal::default);
                    (d.peak_bytes, d.peak_time_ns) = (p.bytes, p.time_ns);
                }
            }
        }
        if exit {
            trace.groups.values_mut().for_each(|g| g.live_at_python_exit = Some((0, 0)));
            for (key, u) in at_exit.into_iter().filter(|(_, u)| u.count > 0) {
                let g = trace.groups.entry(key).or_default();
                let (bytes, count) = g.live_at_python_exit.unwrap_or_default();
                g.live_at_python_exit = Some((bytes + u.bytes, count + u.count));
                g.leak_stacks.push(u);
            }
        }
        for g in trace.groups.values_mut() {
            largest_first(&mut g.leak_stacks);
            largest_first(&mut g.peak_stacks);
        }
        // As `timeseries` orders them.
        trace.allocated.values_mut().for_each(|v| v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.cmp(&b.stack))));
        trace.by_phase.clear();
        trace.phase_peaks.clear();
        let mut names: Vec<String> = Vec::new();
        for p in s.phases.into_iter() {
            if !p.name.is_empty() && !names.contains(&p.name) {
                names.push(p.name.clone());
            }
            if !wanted(p.device) {
                continue;
            }
            let key = (GroupKey { device: p.device, kind: p.kind }, p.name);
            let use_ = PhaseUse { allocations: p.allocations, bytes: p.allocated_bytes, failed: p.failed };
            trace.phase_peaks.insert(key.clone(), p.peak_bytes);
            trace.by_phase.insert(key, use_);
        }
        trace.phase_names = names;
        // What only the order of events gives: none of it is in an aggregate trace.
        trace.growth.clear();
        trace.series.clear();
        trace.pools.clear();
        trace.pools_at_python_exit.clear();
        trace.direct_leak_stacks.clear();
        trace.last_failure_live.clear();
        trace.python_exit_ns = s.start.python_exit_ns;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumemtrace_format::MemKind;

    fn site(seq: u64, allocations: u64) -> Record {
        Record::AggSite(AggSite {
            seq,
            device: 0,
            kind: MemKind::Device,
            stack: 1,
            pystack: 0,
            allocations,
            allocated_bytes: allocations * 10,
            frees: allocations - 1,
            live_bytes: 10,
            live_count: 1,
            peak_bytes: 20,
            peak_count: 2,
            exit_bytes: 30,
            exit_count: 3,
            tid: 1,
        })
    }

    fn start(seq: u64, final_: bool) -> Record {
        Record::AggStart(AggStart { seq, time_ns: seq * 1_000_000_000, events: seq * 100, final_, python_exit_ns: None })
    }

    #[test]
    fn the_last_complete_summary_is_the_traces() {
        let mut s = Summaries::default();
        for r in [start(0, false), Record::AggEnd(0), start(1, false), site(1, 5)] {
            s.record(r);
        }
        s.record(Record::AggPeak(AggPeak { seq: 1, device: 0, kind: Some(MemKind::Device), bytes: 20, time_ns: 7 }));
        s.record(Record::AggEnd(1));
        // A summary cut short (the process died while writing it) does not count.
        for r in [start(2, false), site(2, 9)] {
            s.record(r);
        }
        let mut t = Trace::default();
        s.finish(&mut t, None);
        let g = &t.groups[&GroupKey { device: 0, kind: MemKind::Device }];
        assert_eq!((g.allocations, g.allocated_bytes, g.frees, g.live_bytes, g.live_count), (5, 50, 4, 10, 1));
        assert_eq!((g.peak_bytes, g.peak_time_ns), (20, 7));
        assert_eq!(g.peak_stacks, [StackUse { stack: 1, bytes: 20, count: 2 }]);
        assert_eq!(g.leak_stacks, [StackUse { stack: 1, bytes: 10, count: 1 }]);
        assert_eq!(t.events, 100);
        assert!(t.notices.iter().any(|n| n.contains("before the process finished its trace")), "{:?}", t.notices);
    }

    #[test]
    fn a_device_filter_keeps_that_devices_groups() {
        let mut s = Summaries::default();
        for r in [start(0, true), site(0, 3), Record::AggEnd(0)] {
            s.record(r);
        }
        let mut t = Trace::default();
        s.finish(&mut t, Some(1));
        assert!(t.groups.is_empty());
    }

    #[test]
    fn after_a_python_programs_end_its_leaks_are_what_was_live_then() {
        let mut s = Summaries::default();
        let start = Record::AggStart(AggStart { seq: 0, time_ns: 9, events: 3, final_: true, python_exit_ns: Some(5) });
        for r in [start, site(0, 3), Record::AggEnd(0)] {
            s.record(r);
        }
        let mut t = Trace::default();
        s.finish(&mut t, None);
        let g = &t.groups[&GroupKey { device: 0, kind: MemKind::Device }];
        assert_eq!(g.live_at_python_exit, Some((30, 3)));
        assert_eq!(g.leak_stacks, [StackUse { stack: 1, bytes: 30, count: 3 }]);
        assert_eq!((g.live_bytes, g.live_count), (10, 1), "live at the end stays what it was");
        assert_eq!(t.python_exit_ns, Some(5));
    }

    #[test]
    fn a_failures_live_bytes_come_from_the_record_right_after_it_and_only_it() {
        use gpumemtrace_format::{header, Api, AggFailure, Encoder, Op, Process};
        let failed = |api: u32, addr: u64| {
            Record::Event(Event { api, tid: 1, result: 2, addr, size: 1 << 40, ..Event::default() })
        };
        let recs = [
            Record::Process(Process { pid: 1, max_frames: 64, ..Process::default() }),
            Record::Api(Api { id: 0, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }),
            Record::Api(Api { id: 1, name: "cudaFree".into(), kind: MemKind::Device, op: Op::Free }),
            start(0, true),
            Record::AggEnd(0),
            failed(0, 0),
            Record::AggFailure(AggFailure { device: 0, live_bytes: 84 << 20 }),
            // A failed free is no failure of the list: a record after it must not rewrite the
            // allocation's.
            failed(1, 0x5000),
            Record::AggFailure(AggFailure { device: 0, live_bytes: 7 }),
        ];
        let mut bytes = header().to_vec();
        let mut enc = Encoder::new();
        for r in &recs {
            enc.encode(r, &mut bytes);
        }
        let t = Trace::load_from(|| Ok(&bytes[..])).unwrap();
        assert_eq!(t.failures.len(), 1);
        assert_eq!(t.failures[0].live_bytes_on_device, 84 << 20);
    }
}
