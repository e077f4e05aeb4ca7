//! What the reports beyond `summary` need from a replay, kept apart from `model.rs`'s core
//! statistics: which events count (`--device`, `--phase`), the phase of each event, phase
//! spans, live bytes over time (bounded), bytes allocated by stack, and a step-by-step view
//! of the replay for exporters.
//!
//! Memory stays bounded whatever the trace length: a [`Series`] keeps at most
//! [`MAX_BUCKETS`] min/max buckets per group and coarsens them as time goes on; phase spans
//! are capped at [`MAX_SPANS`].

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::path::Path;

use gpumemtrace_format::{Api, Event, Op, Phase, PhaseOp};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::input::{display, Input};
use crate::model::{Applied, GroupKey, Outcome, StackUse, Trace};

/// Buckets per series at most.
pub const MAX_BUCKETS: usize = 4096;
/// Phase spans kept at most (more are counted).
pub const MAX_SPANS: usize = 20_000;
/// Width of a series bucket before any coarsening.
const FIRST_BUCKET_NS: u64 = 1_000;

/// Which events a report counts. Frees count when the allocation they free counted.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only allocations made on this device (-1: host memory).
    pub device: Option<i32>,
    /// Only allocations made while this phase was open on the calling thread (innermost or
    /// enclosing range), or, on a thread with no open range, while it was the process mark.
    pub phase: Option<String>,
}

/// What a replayed event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    Alloc,
    Free,
    FailedAlloc,
    /// A free of a pointer that was not live, or a free that failed.
    BadFree,
    /// `cudaFree(NULL)` and the like.
    Ignored,
}

/// One replayed event, for exporters.
#[derive(Clone, Debug)]
#[allow(dead_code)] // the fields exporters may use
pub struct Step<'a> {
    pub kind: StepKind,
    pub time_ns: u64,
    /// The group of the memory: for a free, that of the allocation it frees.
    pub key: GroupKey,
    pub addr: u64,
    /// Bytes allocated, requested (failures) or released (frees).
    pub size: u64,
    /// The event's own stack.
    pub stack: u32,
    /// The stack that allocated the memory (frees: the allocation's).
    pub alloc_stack: u32,
    pub stream: u64,
    pub tid: u32,
    pub result: u32,
    pub api: &'a str,
    /// The event's phase (innermost open range of its thread, else the process mark).
    pub phase: Option<&'a str>,
    /// Live bytes of `key`'s group after the event.
    pub group_live: u64,
}

/// A stretch of the run with a name: a closed push/pop range, or the time from one mark to
/// the next (`tid` 0, depth 0).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PhaseSpan {
    pub name: String,
    pub tid: u32,
    /// Nesting depth on its thread (0 = outermost); marks are 0.
    pub depth: u32,
    pub mark: bool,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// Allocations per phase and group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseUse {
    pub allocations: u64,
    pub bytes: u64,
    pub failed: u64,
}

/// Live bytes over time, downsampled: bucket `i` covers `[i * bucket_ns, (i+1) * bucket_ns)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Series {
    pub bucket_ns: u64,
    pub buckets: Vec<Option<Bucket>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Lowest and highest live bytes after an event in the bucket.
    pub min: u64,
    pub max: u64,
    /// Live bytes after the bucket's last event.
    pub last: u64,
}

impl Default for Series {
    fn default() -> Self {
        Series {
            bucket_ns: FIRST_BUCKET_NS,
            buckets: Vec::new(),
        }
    }
}

impl Series {
    pub fn add(&mut self, t: u64, v: u64) {
        let mut i = (t / self.bucket_ns) as usize;
        while i >= MAX_BUCKETS {
            self.coarsen();
            i = (t / self.bucket_ns) as usize;
        }
        if self.buckets.len() <= i {
            self.buckets.resize(i + 1, None);
        }
        let b = self.buckets[i].get_or_insert(Bucket {
            min: v,
            max: v,
            last: v,
        });
        b.min = b.min.min(v);
        b.max = b.max.max(v);
        b.last = v;
    }

    fn coarsen(&mut self) {
        self.bucket_ns *= 2;
        let old = std::mem::take(&mut self.buckets);
        self.buckets = old
            .chunks(2)
            .map(|pair| match (pair[0], pair.get(1).copied().flatten()) {
                (Some(a), Some(b)) => Some(Bucket {
                    min: a.min.min(b.min),
                    max: a.max.max(b.max),
                    last: b.last,
                }),
                (a, b) => a.or(b),
            })
            .collect();
    }

    /// `(bucket start ns, min, max, last)` for every bucket, empty ones carrying the last
    /// value forward (0 before the first event).
    pub fn points(&self) -> Vec<(u64, u64, u64, u64)> {
        let mut last = 0;
        self.buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let t = i as u64 * self.bucket_ns;
                match b {
                    Some(b) => {
                        // The line enters the bucket at the previous value.
                        let p = (t, b.min.min(last), b.max.max(last), b.last);
                        last = b.last;
                        p
                    }
                    None => (t, last, last, last),
                }
            })
            .collect()
    }
}

/// Reports' additions to a [`Trace`].
#[derive(Clone, Debug, Default)]
pub struct TraceExt {
    /// Time of the last event or phase record.
    pub end_ns: u64,
    pub series: BTreeMap<GroupKey, Series>,
    /// Bytes and count allocated per stack (every allocation, freed or not), largest first.
    pub allocated: BTreeMap<GroupKey, Vec<StackUse>>,
    pub spans: Vec<PhaseSpan>,
    pub spans_omitted: u64,
    /// Allocations by phase (`""`: no phase).
    pub by_phase: BTreeMap<(GroupKey, String), PhaseUse>,
    /// Allocation calls the filter left out.
    pub filtered_out: u64,
    /// Every phase name the trace has (pushed ranges and marks), whatever the filter.
    pub phase_names: Vec<String>,
    /// Devices of every allocation call (-1: host memory), whatever the filter, sorted.
    pub alloc_devices: Vec<i32>,
}

impl TraceExt {
    /// Whether the trace has a phase of this name (with allocations in it or not).
    pub fn has_phase(&self, name: &str) -> bool {
        self.phase_names.iter().any(|n| n == name)
    }
}

/// Replay state for [`TraceExt`]; lives inside `model::Replay`.
#[derive(Default)]
pub struct ReplayExt {
    filter: Filter,
    /// Live allocations the filter left out, so that their frees are left out too.
    ignored: rustc_hash::FxHashSet<(u8, u64)>,
    names: Vec<String>,
    index: HashMap<String, u32>,
    /// Open ranges per thread: name id, start.
    threads: rustc_hash::FxHashMap<u32, Vec<(u32, u64)>>,
    mark: Option<(u32, u64)>,
    out: TraceExt,
    allocated: rustc_hash::FxHashMap<GroupKey, rustc_hash::FxHashMap<u32, (u64, u64)>>,
    /// `TraceExt::by_phase` while replaying, keyed by phase id (`u32::MAX`: none): no string
    /// per event. Named in `finish`.
    by_phase_id: rustc_hash::FxHashMap<(GroupKey, u32), PhaseUse>,
    last_live: u64,
    /// `TraceExt::alloc_devices`, and the last one seen (most calls repeat it).
    devices: rustc_hash::FxHashSet<i32>,
    last_device: Option<i32>,
}

impl ReplayExt {
    pub fn new(filter: Filter) -> ReplayExt {
        ReplayExt {
            filter,
            ..ReplayExt::default()
        }
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.names.push(name.to_owned());
        let i = self.names.len() as u32 - 1;
        self.index.insert(name.to_owned(), i);
        i
    }

    fn span(&mut self, name: u32, tid: u32, depth: u32, mark: bool, start: u64, end: u64) {
        if self.out.spans.len() >= MAX_SPANS {
            self.out.spans_omitted += 1;
            return;
        }
        self.out.spans.push(PhaseSpan {
            name: self.names[name as usize].clone(),
            tid,
            depth,
            mark,
            start_ns: start,
            end_ns: end,
        });
    }

    /// Applies a Phase record; `spans`: keep the spans (pass 1).
    pub fn phase(&mut self, p: &Phase, spans: bool) {
        self.out.end_ns = self.out.end_ns.max(p.time_ns);
        match p.op {
            PhaseOp::Push => {
                let id = self.intern(&p.name);
                self.threads.entry(p.tid).or_default().push((id, p.time_ns));
            }
            PhaseOp::Pop => {
                let stack = self.threads.entry(p.tid).or_default();
                // A pop without a push (the range opened before tracing) closes nothing.
                if let Some((id, start)) = stack.pop() {
                    let depth = stack.len() as u32;
                    if spans {
                        self.span(id, p.tid, depth, false, start, p.time_ns);
                    }
                }
            }
            PhaseOp::Mark => {
                let id = self.intern(&p.name);
                if let Some((old, start)) = self.mark.replace((id, p.time_ns)) {
                    if spans {
                        self.span(old, 0, 0, true, start, p.time_ns);
                    }
                }
            }
        }
    }

    /// The phase of an event on thread `tid` now.
    fn current(&self, tid: u32) -> Option<u32> {
        match self.threads.get(&tid).and_then(|s| s.last()) {
            Some(&(id, _)) => Some(id),
            None => self.mark.map(|(id, _)| id),
        }
    }

    fn in_phase(&self, tid: u32, want: &str) -> bool {
        let Some(&id) = self.index.get(want) else {
            return false;
        };
        match self.threads.get(&tid).filter(|s| !s.is_empty()) {
            Some(s) => s.iter().any(|&(n, _)| n == id),
            None => self.mark.is_some_and(|(n, _)| n == id),
        }
    }

    /// Whether the filter admits the event (`ns`: its pointer namespace).
    pub fn admit(&mut self, api: &Api, e: &Event, ns: u8) -> bool {
        self.out.end_ns = self.out.end_ns.max(e.time_ns);
        if api.op == Op::Alloc && self.last_device != Some(e.device) {
            self.last_device = Some(e.device);
            self.devices.insert(e.device);
        }
        if self.filter.device.is_none() && self.filter.phase.is_none() {
            return true;
        }
        match api.op {
            Op::Free => {
                if e.result == 0 && self.ignored.remove(&(ns, e.addr)) {
                    return false;
                }
                true
            }
            Op::Alloc => {
                let device_ok = self.filter.device.is_none_or(|d| d == e.device);
                let phase_ok = match &self.filter.phase {
                    Some(p) => self.in_phase(e.tid, p),
                    None => true,
                };
                if e.result == 0 {
                    if device_ok && phase_ok {
                        self.ignored.remove(&(ns, e.addr));
                    } else {
                        self.ignored.insert((ns, e.addr));
                    }
                }
                if !(device_ok && phase_ok) {
                    self.out.filtered_out += 1;
                }
                device_ok && phase_ok
            }
        }
    }

    /// Records an admitted event; `live`: its group's live bytes after it.
    pub fn record(&mut self, e: &Event, a: &Applied, live: u64) {
        self.last_live = live;
        let phase = self.current(e.tid).unwrap_or(u32::MAX);
        match a.kind {
            super::timeseries::StepKind::Alloc => {
                self.out.series.entry(a.key).or_default().add(e.time_ns, live);
                let u = self
                    .allocated
                    .entry(a.key)
                    .or_default()
                    .entry(a.alloc_stack)
                    .or_default();
                u.0 += a.size;
                u.1 += 1;
                let p = self.by_phase_id.entry((a.key, phase)).or_default();
                p.allocations += 1;
                p.bytes += a.size;
            }
            StepKind::Free => self.out.series.entry(a.key).or_default().add(e.time_ns, live),
            StepKind::FailedAlloc => self.by_phase_id.entry((a.key, phase)).or_default().failed += 1,
            StepKind::BadFree | StepKind::Ignored => {}
        }
    }

    /// The observer's view of an admitted event.
    pub fn step<'a>(&'a self, api: &'a Api, e: &Event, a: Applied) -> Step<'a> {
        Step {
            kind: a.kind,
            time_ns: e.time_ns,
            key: a.key,
            addr: e.addr,
            size: a.size,
            stack: e.stack,
            alloc_stack: a.alloc_stack,
            stream: e.stream,
            tid: e.tid,
            result: e.result,
            api: &api.name,
            phase: self.current(e.tid).map(|i| self.names[i as usize].as_str()),
            group_live: self.last_live,
        }
    }

    /// Closes open spans at the end of the trace and hands the results over.
    pub fn finish(mut self) -> TraceExt {
        let end = self.out.end_ns;
        if let Some((id, start)) = self.mark.take() {
            self.span(id, 0, 0, true, start, end);
        }
        let mut open: Vec<(u32, Vec<(u32, u64)>)> = self.threads.drain().collect();
        open.sort_by_key(|(tid, _)| *tid);
        for (tid, stack) in open {
            for (depth, (id, start)) in stack.into_iter().enumerate() {
                self.span(id, tid, depth as u32, false, start, end);
            }
        }
        self.out
            .spans
            .sort_by_key(|a| (a.start_ns, a.depth, a.tid));
        self.out.phase_names = self.names.clone();
        self.out.alloc_devices = self.devices.iter().copied().collect();
        self.out.alloc_devices.sort_unstable();
        for ((key, id), u) in std::mem::take(&mut self.by_phase_id) {
            let name = self.names.get(id as usize).cloned().unwrap_or_default();
            self.out.by_phase.insert((key, name), u);
        }
        for (key, by) in self.allocated {
            let mut v: Vec<StackUse> = by
                .into_iter()
                .map(|(stack, (bytes, count))| StackUse {
                    stack,
                    bytes,
                    count,
                })
                .collect();
            v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.stack.cmp(&b.stack)));
            self.out.allocated.insert(key, v);
        }
        self.out
    }
}

/// Loads `path` (`-`: standard input) with a progress bar on stderr (drawn only when stderr is
/// a terminal and the trace is large enough to wait for).
pub fn load(path: &Path, filter: &Filter, observe: &mut dyn FnMut(&Step)) -> Result<Trace, String> {
    load_input(&Input::open(path)?, filter, observe)
}

/// [`load`] from an opened input: a file is read once per pass, a stream was read once into
/// memory. A trace with nothing readable (an empty file, one that ends inside the header) is an
/// error: there is nothing to report on, and "no allocations" would say something untrue.
pub fn load_input(input: &Input, filter: &Filter, observe: &mut dyn FnMut(&Step)) -> Result<Trace, String> {
    let len = input.len();
    let bar = if len >= 32 << 20 {
        let b = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} ({eta})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        ProgressBar::hidden()
    };
    let p = display(input.path());
    let name = match input.path().file_name() {
        Some(n) => n.to_string_lossy().into_owned(),
        None => p.clone(),
    };
    let pass = std::cell::Cell::new(0);
    let r = Trace::load_with(
        || {
            pass.set(pass.get() + 1);
            bar.set_position(0);
            bar.set_message(match pass.get() {
                1 => format!("reading {name}"),
                _ => format!("peaks of {name}"),
            });
            input.reader().map(|r| BufReader::with_capacity(1 << 20, bar.wrap_read(r)))
        },
        filter,
        observe,
    )
    .map_err(|e| format!("{p}: {e}"));
    bar.finish_and_clear();
    match r {
        Ok(t) if t.outcome == Outcome::Truncated { offset: 0 } => Err(unreadable(&p, len)),
        r => r,
    }
}

/// Why a trace that stops before its first record cannot be read.
fn unreadable(path: &str, len: u64) -> String {
    if len == 0 {
        format!("{path}: the file is empty, not a trace (the traced process may have died before the tracer wrote anything)")
    } else {
        format!(
            "{path}: the file ends inside the trace header ({len} of {} bytes), not a readable trace",
            gpumemtrace_format::HEADER_LEN
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{TraceBuilder, FREE, MALLOC};
    use gpumemtrace_format::{MemKind, Record};

    fn phase(b: &mut TraceBuilder, t: u64, tid: u32, op: PhaseOp, name: &str) {
        b.rec(Record::Phase(Phase {
            time_ns: t,
            tid,
            op,
            name: name.into(),
        }));
    }

    #[test]
    fn series_coarsens_and_keeps_extremes() {
        let mut s = Series::default();
        s.add(0, 10);
        s.add(500, 30);
        s.add(999, 20);
        assert_eq!(s.buckets, [Some(Bucket { min: 10, max: 30, last: 20 })]);
        // Far beyond MAX_BUCKETS microseconds: the series coarsens, keeping min/max.
        s.add(10_000_000, 5);
        assert!(s.buckets.len() <= MAX_BUCKETS);
        assert_eq!(s.buckets[0], Some(Bucket { min: 10, max: 30, last: 20 }));
        let pts = s.points();
        assert_eq!(pts.last().unwrap().3, 5);
        assert_eq!(pts.iter().map(|p| p.2).max(), Some(30));
        // Empty buckets carry the last value forward.
        assert_eq!(pts[1], (s.bucket_ns, 20, 20, 20));
    }

    #[test]
    fn phases_filter_and_spans() {
        let mut b = TraceBuilder::new();
        phase(&mut b, 1, 1, PhaseOp::Mark, "epoch 1");
        b.ok(MALLOC, 2, 0x1000, 100, 1); // epoch 1
        phase(&mut b, 3, 1, PhaseOp::Push, "forward");
        b.ok(MALLOC, 4, 0x2000, 200, 2); // forward
        phase(&mut b, 5, 1, PhaseOp::Push, "attention");
        b.ok(MALLOC, 6, 0x3000, 300, 3); // attention inside forward
        phase(&mut b, 7, 1, PhaseOp::Pop, "");
        phase(&mut b, 8, 1, PhaseOp::Pop, "");
        b.ok(FREE, 9, 0x2000, 0, 0); // frees a forward allocation
        phase(&mut b, 10, 1, PhaseOp::Push, "backward");
        b.ok(MALLOC, 11, 0x4000, 400, 4);
        b.ok(FREE, 12, 0x1000, 0, 0);
        let all = b.load();
        let key = GroupKey { device: 0, kind: MemKind::Device };
        let by: Vec<_> = all
            .ext
            .by_phase
            .iter()
            .map(|((k, n), u)| (*k, n.as_str(), u.bytes))
            .collect();
        assert_eq!(
            by,
            [(key, "attention", 300), (key, "backward", 400), (key, "epoch 1", 100), (key, "forward", 200)]
        );
        let spans: Vec<_> = all
            .ext
            .spans
            .iter()
            .map(|s| (s.name.as_str(), s.depth, s.mark, s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            spans,
            [
                ("epoch 1", 0, true, 1, 12),
                ("forward", 0, false, 3, 8),
                ("attention", 1, false, 5, 7),
                ("backward", 0, false, 10, 12),
            ]
        );

        // --phase forward: the forward allocations (the nested one too); the free of one
        // counts, frees of others are not bad frees.
        let f = Filter { phase: Some("forward".into()), ..Filter::default() };
        let mut kinds = vec![];
        let t = Trace::load_with(|| Ok(&b.bytes[..]), &f, &mut |s| kinds.push((s.kind, s.phase.map(str::to_owned))))
            .unwrap();
        let g = &t.groups[&key];
        assert_eq!((g.allocations, g.allocated_bytes, g.frees, g.peak_bytes, g.live_bytes), (2, 500, 1, 500, 300));
        assert!(t.bad_frees.is_empty());
        assert_eq!(
            kinds,
            [
                (StepKind::Alloc, Some("forward".into())),
                (StepKind::Alloc, Some("attention".into())),
                (StepKind::Free, Some("epoch 1".into())),
            ]
        );
        assert_eq!(t.ext.filtered_out, 2);
    }

    #[test]
    fn device_filter_and_allocated_by_stack() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .call(MALLOC, 2, 1, 0x2000, 300, 2, 0)
            .ok(FREE, 3, 0x1000, 0, 0)
            .ok(MALLOC, 4, 0x1000, 100, 1)
            .ok(FREE, 5, 0x2000, 0, 0); // frees device 1's allocation from device 0
        let t = Trace::load_with(|| Ok(&b.bytes[..]), &Filter { device: Some(0), ..Filter::default() }, &mut |_| {})
            .unwrap();
        assert_eq!(t.groups.len(), 1);
        assert!(t.bad_frees.is_empty());
        let key = GroupKey { device: 0, kind: MemKind::Device };
        assert_eq!(t.ext.allocated[&key], [StackUse { stack: 1, bytes: 200, count: 2 }]);
        let pts = t.ext.series[&key].points();
        assert_eq!(pts, [(0, 0, 100, 100)]);
    }
}
