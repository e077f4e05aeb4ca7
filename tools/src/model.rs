//! Loads a trace and replays its events into per-group statistics.
//!
//! Loading streams the file twice rather than keeping its events: memory stays proportional
//! to the live set (plus the interned stacks), however long the trace. Pass 1 replays
//! everything and notes at which event each group peaks; pass 2 replays up to the last of
//! those events and snapshots the live set of each group at its peak.
//!
//! The model only records, by stack id; turning stacks into call sites is the reports' job.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};

use rustc_hash::FxHashMap;
use std::ops::ControlFlow;

use gpumemtrace_format::{
    Api, Event, MemKind, Module, Op, Process, PyCode, PyFrame, ReadError, Reader, Record, Stats,
    Thread,
};

pub use crate::timeseries::{Filter, Step, StepKind};
use crate::autograd::Backward;
use crate::growth::{Growth, StackTrend};
pub use crate::pool::Pool;
use crate::pool::Pools;
use crate::timeseries::ReplayExt;

/// How far reading got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Outcome {
    /// The reader reached a clean end of file.
    #[default]
    Complete,
    /// The file ends inside the record starting at `offset`.
    Truncated { offset: u64 },
    /// The record starting at `offset` is malformed.
    Corrupt { offset: u64, message: String },
}

/// Statistics are kept per device and memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub device: i32,
    pub kind: MemKind,
}

/// Live allocations made from one stack: bytes and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackUse {
    pub stack: u32,
    pub bytes: u64,
    pub count: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Group {
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    /// Failed allocation calls.
    pub failed: u64,
    /// Successful allocations that returned an address already live (the tracer missed a free).
    pub double_allocs: u64,
    pub peak_bytes: u64,
    /// When the peak was first reached.
    pub peak_time_ns: u64,
    /// The live set at the peak, by stack, largest first.
    pub peak_stacks: Vec<StackUse>,
    /// Still live when the trace ends.
    pub live_bytes: u64,
    pub live_count: u64,
    /// The live set at the end (the leaks), by stack, largest first.
    pub leak_stacks: Vec<StackUse>,
    /// Ordinal of the event that first reached the peak (pass 2 snapshots after it).
    peak_event: Option<u64>,
    /// Live when the Python program finished, before the interpreter's shutdown freed its
    /// objects (see [`Trace::python_exit`]): bytes, count. `leak_stacks` is then that live set.
    pub live_at_python_exit: Option<(u64, u64)>,
}

/// Memory that occupies a GPU: device, managed and VMM physical memory together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceTotal {
    pub peak_bytes: u64,
    pub peak_time_ns: u64,
    pub live_bytes: u64,
}

/// A failed allocation call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub api: String,
    pub device: i32,
    pub kind: MemKind,
    pub size: u64,
    pub result: u32,
    pub time_ns: u64,
    pub stack: u32,
    /// GPU memory (see [`DeviceTotal`]) live on `device` when the call failed.
    pub live_bytes_on_device: u64,
    /// The caching allocator's pool on `device` when the call failed (none without blocks).
    pub pool: Option<Pool>,
    /// Which event it was (1-based), for the post-mortem snapshot.
    pub ordinal: u64,
}

impl Failure {
    /// Out of memory, a capability probe, or another error.
    pub fn class(&self) -> crate::units::Failed {
        crate::units::classify(&self.api, self.result)
    }

    /// A failed allocation proper: anything but a capability probe.
    pub fn counts(&self) -> bool {
        self.class() != crate::units::Failed::Probe
    }
}

/// A free of a pointer that was not live, or a free that failed (`result != 0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadFree {
    pub api: String,
    pub device: i32,
    pub addr: u64,
    pub result: u32,
    pub time_ns: u64,
    pub stack: u32,
}

/// More bad frees than this are only counted: a trace that starts late in a process can
/// have one per event, and memory must not grow with the event count.
const MAX_BAD_FREES: usize = 100_000;

/// Everything a report needs from one trace.
#[derive(Debug, Default)]
pub struct Trace {
    pub process: Option<Process>,
    pub apis: FxHashMap<u32, Api>,
    pub modules: Vec<Module>,
    /// Interned stacks: return addresses, innermost first.
    pub stacks: HashMap<u32, Vec<u64>>,
    pub notices: Vec<String>,
    /// The last Stats record.
    pub stats: Option<Stats>,
    /// Event records read.
    pub events: u64,
    /// Events naming an API id with no Api record; they cannot be replayed.
    pub unknown_api_events: u64,
    pub outcome: Outcome,
    pub groups: BTreeMap<GroupKey, Group>,
    pub devices: BTreeMap<i32, DeviceTotal>,
    pub failures: Vec<Failure>,
    pub bad_frees: Vec<BadFree>,
    /// Bad frees beyond [`MAX_BAD_FREES`], counted but not listed.
    pub bad_frees_omitted: u64,
    /// Post-mortem of the last out-of-memory failure: what was live on its device at that
    /// moment, per group (GPU-memory kinds only), by stack, largest first.
    pub last_failure_live: Vec<(GroupKey, Vec<StackUse>)>,
    /// Python code objects and stacks (innermost first), by id.
    pub py_codes: HashMap<u32, PyCode>,
    pub py_stacks: HashMap<u32, Vec<PyFrame>>,
    /// Thread records, by thread id.
    pub threads: HashMap<u32, Thread>,
    /// Stack keys of events with a Python stack: [`PY_KEY`] and up, standing for a
    /// (native stack id, Python stack id) pair. Events without one keep their native stack id.
    pub combined: HashMap<u32, (u32, u32)>,
    combined_ids: FxHashMap<(u32, u32), u32>,
    /// The first thread seen using each stack key.
    pub stack_tid: FxHashMap<u32, u32>,
    /// Reports' additions (timeline, phases, allocated bytes by stack): see `timeseries`.
    pub ext: crate::timeseries::TraceExt,
    /// Per device with blocks: segments and blocks at the end of the trace (see `pool`).
    pub pools: BTreeMap<i32, Pool>,
    /// The same when the Python program finished (see `python_exit_ns`).
    pub pools_at_python_exit: BTreeMap<i32, Pool>,
    /// Per device with blocks: device memory that never held a block (direct driver
    /// allocations such as cuBLAS workspaces) live at the end, or when the Python program
    /// finished, by stack.
    pub direct_leak_stacks: BTreeMap<i32, Vec<StackUse>>,
    /// Stacks whose live bytes rose over the run (see `growth`), per group.
    pub growth: FxHashMap<GroupKey, Vec<StackTrend>>,
    /// When a Python program finished: the time of the first event of the interpreter's
    /// shutdown — the main thread calling CUDA without a Python frame after its last call with
    /// one. Python frees every module's objects then (tensors too), so what was still live just
    /// before is what the program leaked; the end of the trace would show almost nothing.
    pub python_exit_ns: Option<u64>,
}

/// First stack key of a (native, Python) pair; native stack ids stay below it.
pub const PY_KEY: u32 = 0x8000_0000;

impl Trace {
    /// The key an event's allocation is recorded under: its native stack id, or the id of the
    /// pair when it also has a Python stack.
    fn stack_key(&mut self, e: &Event) -> u32 {
        if e.pystack == 0 {
            return e.stack;
        }
        let next = PY_KEY + self.combined_ids.len() as u32;
        let key = *self.combined_ids.entry((e.stack, e.pystack)).or_insert(next);
        if key == next {
            self.combined.insert(key, (e.stack, e.pystack));
        }
        key
    }
}

impl Trace {
    /// Loads a trace from a source that can be opened twice (one per pass). (Reports load
    /// files through `timeseries::load`, which adds filters and a progress bar.)
    #[cfg(test)]
    pub fn load_from<R: Read>(open: impl Fn() -> io::Result<R>) -> Result<Trace, String> {
        Trace::load_with(open, &Filter::default(), &mut |_| {})
    }

    /// Loads a trace counting only the events `filter` admits, and shows every replayed
    /// event to `observe` (pass 1 only), in trace order.
    pub fn load_with<R: Read>(
        open: impl Fn() -> io::Result<R>,
        filter: &Filter,
        observe: &mut dyn FnMut(&Step),
    ) -> Result<Trace, String> {
        let mut trace = Trace::default();

        // Pass 1: everything but the peak snapshots.
        let (mut python_main_seen, mut python_exit): (bool, Option<(u64, u64)>) = (false, None);
        let mut replay = Replay::with_filter(filter);
        let mut backward = Backward::default();
        trace.outcome = for_each_record(open().map_err(|e| e.to_string())?, |rec| {
            match rec {
                Record::Process(p) => trace.process = Some(p),
                Record::Api(a) => {
                    trace.apis.insert(a.id, a);
                }
                Record::Module(m) => trace.modules.push(m),
                Record::Stack(s) => {
                    trace.stacks.insert(s.id, s.frames);
                }
                Record::Event(mut e) => {
                    trace.events += 1;
                    let own_python = e.pystack != 0 || e.flags & gpumemtrace_format::event_flags::PYTHON != 0;
                    let is_alloc = trace.apis.get(&e.api).is_some_and(|a| a.op == Op::Alloc);
                    e.pystack = backward.attribute(&e, is_alloc, &trace.py_codes, &trace.py_stacks);
                    e.stack = trace.stack_key(&e);
                    trace.stack_tid.entry(e.stack).or_insert(e.tid);
                    match trace.apis.get(&e.api) {
                        Some(api) => {
                            if let Some(step) = replay.apply(api, &e) {
                                observe(&replay.ext.step(api, &e, step));
                            }
                        }
                        None => trace.unknown_api_events += 1,
                    }
                    if trace.process.as_ref().is_some_and(|p| p.pid == e.tid) {
                        if own_python {
                            python_main_seen = true;
                            python_exit = None;
                        } else if python_main_seen && python_exit.is_none() {
                            python_exit = Some((replay.ordinal - 1, e.time_ns));
                        }
                    }
                }
                Record::Notice(n) => trace.notices.push(n),
                Record::Stats(s) => trace.stats = Some(s),
                Record::PyCode(c) => {
                    trace.py_codes.insert(c.id, c);
                }
                Record::PyStack(s) => {
                    trace.py_stacks.insert(s.id, s.frames);
                }
                Record::Thread(t) => {
                    trace.threads.insert(t.tid, t);
                }
                Record::Phase(p) => replay.ext.phase(&p, true),
                Record::Unknown(_) => {}
            }
            ControlFlow::Continue(())
        })?;

        // Pass 2: replay again up to the last peak, snapshotting each group at its own.
        let mut snapshot_at: BTreeMap<u64, Vec<GroupKey>> = BTreeMap::new();
        for (key, g) in &replay.groups {
            if let Some(n) = g.peak_event {
                snapshot_at.entry(n).or_default().push(*key);
            }
        }
        // And the live set on the device of the last allocation that ran out of memory, as it
        // failed (other errors, a capability probe, say nothing about what was live).
        let failure_at = replay
            .failures
            .iter()
            .rev()
            .find(|f| f.class() == crate::units::Failed::OutOfMemory)
            .map(|f| (f.ordinal, f.device));
        let failure_keys: Vec<GroupKey> = match failure_at {
            Some((_, device)) => {
                let mut keys: Vec<GroupKey> = replay
                    .groups
                    .keys()
                    .filter(|k| k.device == device && (k.kind.occupies_gpu() || k.kind == MemKind::Block))
                    .copied()
                    .collect();
                // Blocks first: the program's tensors, then the memory they lie in.
                keys.sort_by_key(|k| k.kind != MemKind::Block);
                keys
            }
            None => Vec::new(),
        };
        let python_exit = python_exit.filter(|&(n, _)| n > 0);
        trace.python_exit_ns = python_exit.map(|(_, t)| t);
        let mut at_python_exit: Vec<(GroupKey, u64, u64, Vec<StackUse>)> = Vec::new();
        let mut direct_at_python_exit: BTreeMap<i32, Vec<StackUse>> = BTreeMap::new();
        let last_snapshot = snapshot_at
            .keys()
            .next_back()
            .copied()
            .max(failure_at.map(|f| f.0))
            .max(python_exit.map(|p| p.0));
        if let Some(last) = last_snapshot {
            let mut apis = HashMap::new();
            let mut again = Replay::with_filter(filter);
            again.snapshot_only = true;
            let mut backward = Backward::default();
            // Errors were reported by pass 1, and pass 2 stops before reaching them.
            let _ = for_each_record(open().map_err(|e| e.to_string())?, |rec| {
                match rec {
                    // Api records are tracked as they come so both passes replay the same events.
                    Record::Api(a) => {
                        apis.insert(a.id, a);
                    }
                    Record::Phase(p) => again.ext.phase(&p, false),
                    Record::Event(mut e) => {
                        let is_alloc = apis.get(&e.api).is_some_and(|a: &Api| a.op == Op::Alloc);
                        e.pystack = backward.attribute(&e, is_alloc, &trace.py_codes, &trace.py_stacks);
                        if e.pystack != 0 {
                            // Every pair was seen by pass 1.
                            e.stack = trace.combined_ids.get(&(e.stack, e.pystack)).copied().unwrap_or(e.stack);
                        }
                        if let Some(api) = apis.get(&e.api) {
                            again.apply(api, &e);
                            for key in snapshot_at.get(&again.ordinal).into_iter().flatten() {
                                replay.group(*key).peak_stacks = again.by_stack(*key);
                            }
                            if python_exit.is_some_and(|(n, _)| n == again.ordinal) {
                                at_python_exit = again
                                    .groups
                                    .iter()
                                    .map(|(k, g)| (*k, g.live_bytes, g.live_count, again.by_stack(*k)))
                                    .collect();
                                trace.pools_at_python_exit = again.pools.by_device.clone();
                                direct_at_python_exit = again.direct_by_stack();
                            }
                            if failure_at.is_some_and(|(n, _)| n == again.ordinal) {
                                trace.last_failure_live = failure_keys
                                    .iter()
                                    .map(|&k| (k, again.by_stack(k)))
                                    .filter(|(_, v)| !v.is_empty())
                                    .collect();
                            }
                            if again.ordinal >= last {
                                return ControlFlow::Break(());
                            }
                        }
                    }
                    _ => {}
                }
                ControlFlow::Continue(())
            });
        }

        // Allocations displaced at their address and never freed: the trace missed a free.
        let displaced: Vec<GroupKey> = replay.displaced.values().flatten().map(|l| l.key).collect();
        for key in displaced {
            replay.group(key).double_allocs += 1;
        }
        let keys: Vec<GroupKey> = replay.groups.keys().copied().collect();
        for key in keys {
            replay.group(key).leak_stacks = replay.by_stack(key);
        }
        if python_exit.is_some() {
            for key in replay.groups.keys().copied().collect::<Vec<_>>() {
                replay.group(key).live_at_python_exit = Some((0, 0));
                replay.group(key).leak_stacks = Vec::new();
            }
            for (key, bytes, count, stacks) in at_python_exit {
                let g = replay.group(key);
                g.live_at_python_exit = Some((bytes, count));
                g.leak_stacks = stacks;
            }
        }
        trace.direct_leak_stacks = if python_exit.is_some() { direct_at_python_exit } else { replay.direct_by_stack() };
        let growth_end = trace.python_exit_ns.unwrap_or(replay.last_ns);
        trace.growth = std::mem::take(&mut replay.growth).finish(growth_end);
        trace.pools = std::mem::take(&mut replay.pools.by_device);
        trace.groups = replay.groups;
        trace.devices = replay.devices;
        trace.failures = replay.failures;
        trace.bad_frees = replay.bad_frees;
        trace.bad_frees_omitted = replay.bad_frees_omitted;
        trace.ext = replay.ext.finish();
        Ok(trace)
    }
}

/// Feeds every record to `f` until it breaks or the file ends; returns how reading ended.
/// Only a file that is not a trace at all, or an I/O error, is an `Err`.
fn for_each_record<R: Read>(
    source: R,
    mut f: impl FnMut(Record) -> ControlFlow<()>,
) -> Result<Outcome, String> {
    let mut reader = match Reader::new(source) {
        Ok(r) => r,
        Err(e) => return outcome_of(e),
    };
    loop {
        match reader.next_record() {
            Ok(Some(rec)) => {
                if f(rec).is_break() {
                    return Ok(Outcome::Complete);
                }
            }
            Ok(None) => return Ok(Outcome::Complete),
            Err(e) => return outcome_of(e),
        }
    }
}

fn outcome_of(e: ReadError) -> Result<Outcome, String> {
    match e {
        ReadError::Truncated { offset } => Ok(Outcome::Truncated { offset }),
        ReadError::Corrupt { offset, what } => Ok(Outcome::Corrupt {
            offset,
            message: what,
        }),
        e @ (ReadError::BadHeader(_) | ReadError::Io(_)) => Err(e.to_string()),
    }
}

struct Live {
    key: GroupKey,
    size: u64,
    stack: u32,
    /// When the allocation returned (its event's time).
    time_ns: u64,
}

/// What one replayed event did: its group, bytes and the stack that allocated them.
pub struct Applied {
    pub kind: StepKind,
    pub key: GroupKey,
    pub size: u64,
    /// The allocating stack (for a free: the stack of the allocation it frees).
    pub alloc_stack: u32,
}

impl Applied {
    fn new(kind: StepKind, key: GroupKey, size: u64, alloc_stack: u32) -> Applied {
        Applied {
            kind,
            key,
            size,
            alloc_stack,
        }
    }
}

/// The replay state machine, shared by both passes so that they agree.
#[derive(Default)]
struct Replay {
    live: FxHashMap<(u8, u64), Live>,
    /// Allocations whose address was handed out again before their free reached the trace.
    /// Threads record in parallel: thread A frees X, thread B gets X back, and B's event can be
    /// written before A's (when the writer stopped waiting for A). A free's time is taken before
    /// its call and an allocation's after, so a free older than the live allocation at its
    /// address belongs to the allocation it displaced.
    displaced: FxHashMap<(u8, u64), Vec<Live>>,
    groups: BTreeMap<GroupKey, Group>,
    devices: BTreeMap<i32, DeviceTotal>,
    failures: Vec<Failure>,
    bad_frees: Vec<BadFree>,
    bad_frees_omitted: u64,
    /// Events applied so far.
    ordinal: u64,
    /// Pass 2 only takes snapshots: the reports' series and tallies come from pass 1.
    snapshot_only: bool,
    /// Filter, phases, time series (see `timeseries`).
    ext: ReplayExt,
    /// Segments and blocks (see `pool`).
    pools: Pools,
    /// Live bytes per stack over time (pass 1).
    growth: Growth,
    /// Time of the last event seen.
    last_ns: u64,
}

impl Replay {
    fn with_filter(filter: &Filter) -> Replay {
        Replay {
            ext: ReplayExt::new(filter.clone()),
            ..Replay::default()
        }
    }

    fn group(&mut self, key: GroupKey) -> &mut Group {
        self.groups.entry(key).or_default()
    }

    /// Applies one event; returns what it did unless the filter left it out.
    fn apply(&mut self, api: &Api, e: &Event) -> Option<Applied> {
        self.ordinal += 1;
        self.last_ns = self.last_ns.max(e.time_ns);
        let ns = api.kind.namespace();
        if !self.ext.admit(api, e, ns) {
            return None;
        }
        let applied = self.apply_admitted(api, e, ns);
        let key = applied.key;
        let live = self.groups.get(&key).map_or(0, |g| g.live_bytes);
        if !self.snapshot_only {
            self.ext.record(e, &applied, live);
            match applied.kind {
                StepKind::Alloc => self.growth.change(key, applied.alloc_stack, e.time_ns, true, applied.size),
                StepKind::Free => self.growth.change(key, applied.alloc_stack, e.time_ns, false, applied.size),
                _ => {}
            }
        }
        Some(applied)
    }

    fn apply_admitted(&mut self, api: &Api, e: &Event, ns: u8) -> Applied {
        let fallback = GroupKey {
            device: e.device,
            kind: api.kind,
        };
        match (api.op, e.result == 0) {
            (Op::Alloc, true) => {
                // A mapping belongs to the device of the physical memory it maps, whatever
                // device was current when cuMemMap was called.
                let device = match api.kind {
                    MemKind::VmmMapped => self
                        .live
                        .get(&(MemKind::VmmPhysical.namespace(), e.extra))
                        .map_or(e.device, |l| l.key.device),
                    _ => e.device,
                };
                let key = GroupKey {
                    device,
                    kind: api.kind,
                };
                let entry = Live {
                    key,
                    size: e.size,
                    stack: e.stack,
                    time_ns: e.time_ns,
                };
                if let Some(old) = self.live.insert((ns, e.addr), entry) {
                    // Still live until its own free arrives (or a leak, if it never does).
                    self.displaced.entry((ns, e.addr)).or_default().push(old);
                }
                match api.kind {
                    MemKind::Device | MemKind::VmmMapped => self.pools.range_added(e.addr, e.size, device),
                    MemKind::Block => {
                        self.pools.block_allocated(e);
                    }
                    _ => {}
                }
                let ordinal = self.ordinal;
                let g = self.group(key);
                g.allocations += 1;
                g.allocated_bytes += e.size;
                g.live_bytes += e.size;
                g.live_count += 1;
                if g.live_bytes > g.peak_bytes {
                    g.peak_bytes = g.live_bytes;
                    g.peak_time_ns = e.time_ns;
                    g.peak_event = Some(ordinal);
                }
                if api.kind.occupies_gpu() {
                    let d = self.devices.entry(e.device).or_default();
                    d.live_bytes += e.size;
                    if d.live_bytes > d.peak_bytes {
                        d.peak_bytes = d.live_bytes;
                        d.peak_time_ns = e.time_ns;
                    }
                }
                Applied::new(StepKind::Alloc, key, e.size, e.stack)
            }
            (Op::Alloc, false) => {
                let key = GroupKey {
                    device: e.device,
                    kind: api.kind,
                };
                self.group(key).failed += 1;
                let live_bytes_on_device = self.devices.get(&e.device).map_or(0, |d| d.live_bytes);
                let ordinal = self.ordinal;
                let pool = self.pools.by_device.get(&e.device).cloned();
                self.failures.push(Failure {
                    pool,
                    ordinal,
                    api: api.name.clone(),
                    device: e.device,
                    kind: api.kind,
                    size: e.size,
                    result: e.result,
                    time_ns: e.time_ns,
                    stack: e.stack,
                    live_bytes_on_device,
                });
                Applied::new(StepKind::FailedAlloc, key, e.size, e.stack)
            }
            // cudaFree(NULL) is a documented no-op, commonly used to create the context.
            (Op::Free, true) if e.addr == 0 => Applied::new(StepKind::Ignored, fallback, 0, 0),
            (Op::Free, true) => match self.take_freed(ns, e) {
                // The freed entry says what was freed: cudaFree also frees managed memory.
                Some(old) => {
                    match old.key.kind {
                        MemKind::Device | MemKind::VmmMapped => self.pools.range_removed(e.addr, old.size),
                        MemKind::Block => self.pools.block_freed(e, old.key.device, old.size),
                        _ => {}
                    }
                    self.release(&old);
                    self.group(old.key).frees += 1;
                    Applied::new(StepKind::Free, old.key, old.size, old.stack)
                }
                None => {
                    self.bad_free(api, e);
                    Applied::new(StepKind::BadFree, fallback, 0, 0)
                }
            },
            (Op::Free, false) => {
                self.bad_free(api, e);
                Applied::new(StepKind::BadFree, fallback, 0, 0)
            }
        }
    }

    /// The allocation a successful free at `e.addr` frees: the live one, or, for a free older
    /// than it, the newest allocation it displaced (see `displaced`).
    fn take_freed(&mut self, ns: u8, e: &Event) -> Option<Live> {
        let k = (ns, e.addr);
        let older_than_live = self.live.get(&k).is_none_or(|l| e.time_ns < l.time_ns);
        if older_than_live {
            if let Some(v) = self.displaced.get_mut(&k) {
                let old = v.pop();
                if v.is_empty() {
                    self.displaced.remove(&k);
                }
                if old.is_some() {
                    return old;
                }
            }
        }
        self.live.remove(&k)
    }

    fn release(&mut self, old: &Live) {
        let g = self.group(old.key);
        g.live_bytes -= old.size;
        g.live_count -= 1;
        if old.key.kind.occupies_gpu() {
            if let Some(d) = self.devices.get_mut(&old.key.device) {
                d.live_bytes -= old.size;
            }
        }
    }

    fn bad_free(&mut self, api: &Api, e: &Event) {
        if self.bad_frees.len() >= MAX_BAD_FREES {
            self.bad_frees_omitted += 1;
            return;
        }
        self.bad_frees.push(BadFree {
            api: api.name.clone(),
            device: e.device,
            addr: e.addr,
            result: e.result,
            time_ns: e.time_ns,
            stack: e.stack,
        });
    }

    /// Per device with blocks: its live device memory that is not a pool segment, by stack.
    fn direct_by_stack(&self) -> BTreeMap<i32, Vec<StackUse>> {
        let mut out = BTreeMap::new();
        for &device in self.pools.by_device.keys() {
            let key = GroupKey { device, kind: MemKind::Device };
            let direct = self
                .live
                .iter()
                .filter(|((ns, addr), l)| *ns == 0 && l.key == key && !self.pools.is_segment(*addr))
                .map(|(_, l)| l);
            let v = Self::tally(direct);
            if !v.is_empty() {
                out.insert(device, v);
            }
        }
        out
    }

    /// The live entries of one group, by stack, largest first.
    fn by_stack(&self, key: GroupKey) -> Vec<StackUse> {
        Self::tally(self.live.values().chain(self.displaced.values().flatten()).filter(|l| l.key == key))
    }

    /// Live entries by stack, largest first.
    fn tally<'a>(live: impl Iterator<Item = &'a Live>) -> Vec<StackUse> {
        let mut by: HashMap<u32, StackUse> = HashMap::new();
        for l in live {
            let u = by.entry(l.stack).or_insert(StackUse {
                stack: l.stack,
                bytes: 0,
                count: 0,
            });
            u.bytes += l.size;
            u.count += 1;
        }
        let mut v: Vec<StackUse> = by.into_values().collect();
        v.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then(b.count.cmp(&a.count))
                .then(a.stack.cmp(&b.stack))
        });
        v
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gpumemtrace_format::{header, Encoder, Stack};

    // API ids of the synthetic traces.
    pub const MALLOC: u32 = 1;
    pub const FREE: u32 = 2;
    pub const MALLOC_MANAGED: u32 = 3;
    pub const MALLOC_HOST: u32 = 4;
    pub const FREE_HOST: u32 = 5;
    pub const MEM_CREATE: u32 = 6;
    pub const MEM_RELEASE: u32 = 7;
    pub const ADDRESS_RESERVE: u32 = 8;
    pub const ADDRESS_FREE: u32 = 9;
    pub const MEM_MAP: u32 = 10;
    pub const MEM_UNMAP: u32 = 11;

    /// Builds a trace in memory: header, Process and an Api table, then whatever is added.
    pub struct TraceBuilder {
        pub bytes: Vec<u8>,
        enc: Encoder,
    }

    impl TraceBuilder {
        pub fn new() -> TraceBuilder {
            let mut b = TraceBuilder {
                bytes: header().to_vec(),
                enc: Encoder::new(),
            };
            b.rec(Record::Process(Process {
                pid: 1234,
                ppid: 1,
                exe: "/usr/bin/demo".into(),
                args: vec!["demo".into(), "--fast".into()],
                max_frames: 32,
                ..Process::default()
            }));
            let apis = [
                (MALLOC, "cudaMalloc", MemKind::Device, Op::Alloc),
                (FREE, "cudaFree", MemKind::Device, Op::Free),
                (
                    MALLOC_MANAGED,
                    "cudaMallocManaged",
                    MemKind::Managed,
                    Op::Alloc,
                ),
                (
                    MALLOC_HOST,
                    "cudaMallocHost",
                    MemKind::HostPinned,
                    Op::Alloc,
                ),
                (FREE_HOST, "cudaFreeHost", MemKind::HostPinned, Op::Free),
                (MEM_CREATE, "cuMemCreate", MemKind::VmmPhysical, Op::Alloc),
                (MEM_RELEASE, "cuMemRelease", MemKind::VmmPhysical, Op::Free),
                (
                    ADDRESS_RESERVE,
                    "cuMemAddressReserve",
                    MemKind::VmmReserved,
                    Op::Alloc,
                ),
                (
                    ADDRESS_FREE,
                    "cuMemAddressFree",
                    MemKind::VmmReserved,
                    Op::Free,
                ),
                (MEM_MAP, "cuMemMap", MemKind::VmmMapped, Op::Alloc),
                (MEM_UNMAP, "cuMemUnmap", MemKind::VmmMapped, Op::Free),
            ];
            for (id, name, kind, op) in apis {
                b.rec(Record::Api(Api {
                    id,
                    name: name.into(),
                    kind,
                    op,
                }));
            }
            b
        }

        pub fn rec(&mut self, r: Record) -> &mut Self {
            self.enc.encode(&r, &mut self.bytes);
            self
        }

        pub fn stack(&mut self, id: u32, frames: &[u64]) -> &mut Self {
            self.rec(Record::Stack(Stack {
                id,
                frames: frames.to_vec(),
            }))
        }

        /// A successful call on device 0.
        pub fn ok(&mut self, api: u32, t: u64, addr: u64, size: u64, stack: u32) -> &mut Self {
            self.call(api, t, 0, addr, size, stack, 0)
        }

        #[allow(clippy::too_many_arguments)]
        pub fn call(
            &mut self,
            api: u32,
            t: u64,
            device: i32,
            addr: u64,
            size: u64,
            stack: u32,
            result: u32,
        ) -> &mut Self {
            self.rec(Record::Event(Event {
                api,
                time_ns: t,
                device,
                addr,
                size,
                stack,
                result,
                tid: 1,
                ..Event::default()
            }))
        }

        pub fn load(&self) -> Trace {
            Trace::load_from(|| Ok(&self.bytes[..])).unwrap()
        }
    }

    fn key(device: i32, kind: MemKind) -> GroupKey {
        GroupKey { device, kind }
    }

    fn uses(v: &[(u32, u64, u64)]) -> Vec<StackUse> {
        v.iter()
            .map(|&(stack, bytes, count)| StackUse {
                stack,
                bytes,
                count,
            })
            .collect()
    }

    #[test]
    fn leaks_of_a_python_program_are_what_was_live_before_interpreter_shutdown() {
        // pid 1234's main thread allocates from Python (pystack != 0), then the interpreter's
        // shutdown frees module globals from C (no Python frame): the leak is what was live then.
        let py = |api, t, addr, size, stack, pystack, tid| {
            Record::Event(Event { api, time_ns: t, addr, size, stack, pystack, tid, ..Event::default() })
        };
        let mut b = TraceBuilder::new();
        b.rec(py(MALLOC, 10, 0x1000, 100, 1, 1, 1234))
            .rec(py(MALLOC, 20, 0x2000, 50, 2, 2, 1234))
            .rec(py(MALLOC, 25, 0x3000, 7, 3, 0, 99)) // another thread, no Python: not shutdown
            .rec(py(FREE, 30, 0x2000, 0, 2, 2, 1234)) // freed by the program itself
            .rec(py(FREE, 40, 0x1000, 0, 4, 0, 1234)) // shutdown starts here
            .rec(py(FREE, 41, 0x3000, 0, 4, 0, 1234));
        let t = b.load();
        assert_eq!(t.python_exit_ns, Some(40));
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!(g.live_at_python_exit, Some((107, 2)));
        assert_eq!(g.leak_stacks.iter().map(|u| (u.bytes, u.count)).collect::<Vec<_>>(), [(100, 1), (7, 1)]);
        assert_eq!((g.live_bytes, g.live_count), (0, 0), "the end of the trace still says what it says");

        // No Python stacks at all: leaks are the end of the trace, as for any program.
        let mut b = TraceBuilder::new();
        b.rec(py(MALLOC, 10, 0x1000, 100, 1, 0, 1234)).rec(py(FREE, 40, 0x1000, 0, 4, 0, 1234));
        let t = b.load();
        assert_eq!(t.python_exit_ns, None);
        assert_eq!(t.groups[&key(0, MemKind::Device)].live_at_python_exit, None);
    }

    #[test]
    fn peak_and_leaks_per_group_with_address_reuse() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 10, 0x1000, 100, 1)
            .ok(MALLOC, 20, 0x2000, 200, 2) // 300 live
            .ok(FREE, 30, 0x1000, 0, 9) // 200
            .ok(MALLOC, 40, 0x1000, 50, 1) // 250: the address is reused
            .ok(MALLOC, 50, 0x3000, 150, 3) // 400: the peak
            .ok(FREE, 60, 0x2000, 0, 9) // 200
            .ok(MALLOC, 70, 0x4000, 200, 4); // 400 again: not a new peak
        let t = b.load();
        assert_eq!(t.outcome, Outcome::Complete);
        assert_eq!(t.events, 7);
        assert_eq!(t.groups.len(), 1);
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!(
            (
                g.allocations,
                g.allocated_bytes,
                g.frees,
                g.failed,
                g.double_allocs
            ),
            (5, 700, 2, 0, 0)
        );
        assert_eq!((g.peak_bytes, g.peak_time_ns), (400, 50));
        assert_eq!(g.peak_stacks, uses(&[(2, 200, 1), (3, 150, 1), (1, 50, 1)]));
        assert_eq!((g.live_bytes, g.live_count), (400, 3));
        assert_eq!(g.leak_stacks, uses(&[(4, 200, 1), (3, 150, 1), (1, 50, 1)]));
        assert_eq!(
            t.devices[&0],
            DeviceTotal {
                peak_bytes: 400,
                peak_time_ns: 50,
                live_bytes: 400
            }
        );
        assert!(t.bad_frees.is_empty());
    }

    #[test]
    fn groups_peak_separately() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .call(MALLOC, 2, 1, 0x2000, 300, 2, 0) // device 1
            .ok(FREE, 3, 0x1000, 0, 0)
            .ok(MALLOC, 4, 0x3000, 60, 3)
            .ok(MALLOC, 5, 0x4000, 60, 3) // device 0 peaks at 120 here
            .call(FREE, 6, 1, 0x2000, 0, 0, 0);
        let t = b.load();
        let d0 = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((d0.peak_bytes, d0.peak_time_ns), (120, 5));
        assert_eq!(d0.peak_stacks, uses(&[(3, 120, 2)]));
        let d1 = &t.groups[&key(1, MemKind::Device)];
        assert_eq!((d1.peak_bytes, d1.peak_time_ns, d1.live_bytes), (300, 2, 0));
        assert_eq!(d1.peak_stacks, uses(&[(2, 300, 1)]));
        assert!(d1.leak_stacks.is_empty());
    }

    #[test]
    fn cuda_free_frees_managed_memory() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC_MANAGED, 1, 0x5000, 64, 1)
            .ok(MALLOC, 2, 0x6000, 32, 2)
            .ok(MALLOC_HOST, 3, 0x7000, 1000, 3)
            .call(FREE, 4, -1, 0x5000, 0, 0, 0); // the free's own device does not matter
        let t = b.load();
        let m = &t.groups[&key(0, MemKind::Managed)];
        assert_eq!(
            (m.allocations, m.frees, m.peak_bytes, m.live_bytes),
            (1, 1, 64, 0)
        );
        let d = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((d.allocations, d.frees, d.live_bytes), (1, 0, 32));
        // Pinned host memory is not GPU memory.
        assert_eq!(
            t.devices[&0],
            DeviceTotal {
                peak_bytes: 96,
                peak_time_ns: 2,
                live_bytes: 32
            }
        );
        assert!(t.bad_frees.is_empty());
    }

    #[test]
    fn unknown_and_failed_frees_are_listed() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 10, 1)
            .ok(FREE, 2, 0x9999, 0, 5) // never allocated
            .ok(FREE, 3, 0, 0, 6) // cudaFree(NULL): a no-op
            .call(FREE, 4, 0, 0x1000, 0, 7, 400) // failed: the memory stays live
            .ok(FREE_HOST, 5, 0x1000, 0, 0); // same namespace: frees the device pointer
        let t = b.load();
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.frees, g.live_bytes), (1, 0));
        let got: Vec<_> = t
            .bad_frees
            .iter()
            .map(|f| (f.api.as_str(), f.addr, f.result, f.time_ns, f.stack))
            .collect();
        assert_eq!(
            got,
            [
                ("cudaFree", 0x9999, 0, 2, 5),
                ("cudaFree", 0x1000, 400, 4, 7)
            ]
        );
    }

    #[test]
    fn failed_alloc_records_live_gpu_memory_of_its_device() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .ok(MEM_CREATE, 2, 0x10, 300, 2) // VMM physical memory counts
            .ok(ADDRESS_RESERVE, 3, 0x2000_0000, 1 << 30, 3) // reservations do not
            .call(MALLOC, 4, 1, 0x2000, 50, 4, 0) // other device
            .ok(MALLOC_HOST, 5, 0x3000, 70, 5)
            .call(MALLOC, 6, 0, 0, 1 << 40, 6, 2);
        let t = b.load();
        assert_eq!(
            t.failures,
            [Failure {
                api: "cudaMalloc".into(),
                device: 0,
                kind: MemKind::Device,
                size: 1 << 40,
                result: 2,
                time_ns: 6,
                stack: 6,
                live_bytes_on_device: 400,
                pool: None,
                ordinal: 6,
            }]
        );
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.allocations, g.failed, g.live_bytes), (1, 1, 100));
        // The post-mortem: device 0's GPU memory as the last allocation failed.
        let live: Vec<(MemKind, u64)> =
            t.last_failure_live.iter().map(|(k, v)| (k.kind, v.iter().map(|u| u.bytes).sum())).collect();
        assert_eq!(live, [(MemKind::Device, 100), (MemKind::VmmPhysical, 300)]);
    }

    #[test]
    fn the_post_mortem_is_of_the_last_out_of_memory_not_of_a_probe() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .call(MALLOC, 2, 0, 0, 1 << 40, 2, 2) // out of memory: 100 B live
            .ok(MALLOC, 3, 0x2000, 50, 3)
            .call(MEM_CREATE, 4, 0, 0, 2 << 20, 4, 800); // PyTorch's probe, later
        let t = b.load();
        assert_eq!(t.failures.len(), 2);
        assert_eq!(t.failures.iter().map(Failure::counts).collect::<Vec<_>>(), [true, false]);
        let live: Vec<u64> = t.last_failure_live.iter().flat_map(|(_, v)| v.iter().map(|u| u.bytes)).collect();
        assert_eq!(live, [100]);
        // Only a probe: no post-mortem.
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1).call(MEM_CREATE, 2, 0, 0, 2 << 20, 4, 800);
        assert!(b.load().last_failure_live.is_empty());
    }

    #[test]
    fn vmm_namespaces_are_independent() {
        let mut b = TraceBuilder::new();
        b.ok(MEM_CREATE, 1, 0x10000, 2 << 20, 1) // handle 0x10000
            .ok(ADDRESS_RESERVE, 2, 0x10000, 4 << 20, 2) // VA 0x10000
            .ok(MEM_MAP, 3, 0x10000, 2 << 20, 3)
            .ok(MALLOC, 4, 0x10000, 1 << 20, 4)
            .ok(MEM_UNMAP, 5, 0x10000, 2 << 20, 0)
            .ok(MEM_RELEASE, 6, 0x10000, 0, 0);
        let t = b.load();
        let live = |kind| {
            let g = &t.groups[&key(0, kind)];
            assert_eq!(g.double_allocs, 0, "{kind:?}");
            (g.allocations, g.frees, g.live_bytes)
        };
        assert_eq!(live(MemKind::VmmPhysical), (1, 1, 0));
        assert_eq!(live(MemKind::VmmReserved), (1, 0, 4 << 20));
        assert_eq!(live(MemKind::VmmMapped), (1, 1, 0));
        assert_eq!(live(MemKind::Device), (1, 0, 1 << 20));
        assert!(t.bad_frees.is_empty());
        assert_eq!(t.devices[&0].peak_bytes, 3 << 20);
    }

    #[test]
    fn a_free_written_after_its_address_was_reused_frees_the_older_allocation() {
        // Thread A allocates X at t=1 and frees it at t=2 (time taken before the real free);
        // thread B gets X back at t=3, and B's event reaches the trace before A's free.
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1).ok(MALLOC, 3, 0x1000, 40, 2).ok(FREE, 2, 0x1000, 0, 3);
        let t = b.load();
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.allocations, g.frees, g.double_allocs, g.live_bytes, g.live_count), (2, 1, 0, 40, 1));
        assert_eq!(g.leak_stacks, uses(&[(2, 40, 1)]));
        assert!(t.bad_frees.is_empty());

        // The same, with B's own free reaching the trace before A's late one.
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .ok(MALLOC, 3, 0x1000, 40, 2)
            .ok(FREE, 4, 0x1000, 0, 3)
            .ok(FREE, 2, 0x1000, 0, 3);
        let t = b.load();
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.frees, g.live_bytes, g.live_count), (2, 0, 0));
        assert!(t.bad_frees.is_empty());
    }

    #[test]
    fn an_address_allocated_twice_without_a_free_keeps_both_and_says_so() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1).ok(MALLOC, 2, 0x1000, 40, 2);
        let t = b.load();
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.allocations, g.double_allocs, g.live_bytes, g.live_count, g.peak_bytes), (2, 1, 140, 2, 140));
        assert_eq!(g.leak_stacks, uses(&[(1, 100, 1), (2, 40, 1)]));
    }

    #[test]
    fn truncated_trace_yields_its_prefix() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1)
            .ok(MALLOC, 2, 0x2000, 200, 2);
        let cut_at = b.bytes.len() as u64;
        b.ok(MALLOC, 3, 0x3000, 300, 3);
        let bytes = &b.bytes[..b.bytes.len() - 2];
        let t = Trace::load_from(|| Ok(bytes)).unwrap();
        assert_eq!(t.outcome, Outcome::Truncated { offset: cut_at });
        assert_eq!(t.events, 2);
        let g = &t.groups[&key(0, MemKind::Device)];
        assert_eq!((g.allocations, g.peak_bytes, g.live_bytes), (2, 300, 300));
        assert_eq!(g.peak_stacks, uses(&[(2, 200, 1), (1, 100, 1)]));
        assert_eq!(t.process.as_ref().unwrap().pid, 1234);

        // A tracer that died before writing anything leaves an empty file.
        let t = Trace::load_from(|| Ok(&[][..])).unwrap();
        assert_eq!((t.outcome, t.events), (Outcome::Truncated { offset: 0 }, 0));
    }

    #[test]
    fn corrupt_trace_reports_the_offset() {
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x1000, 100, 1);
        let bad_at = b.bytes.len() as u64;
        // An Api record with memory kind 99.
        b.bytes
            .extend_from_slice(&[gpumemtrace_format::tag::API, 4, 7, 1, b'x', 99]);
        b.ok(MALLOC, 2, 0x2000, 200, 2); // never read
        let t = b.load();
        assert_eq!(
            t.outcome,
            Outcome::Corrupt {
                offset: bad_at,
                message: "unknown memory kind 99".into()
            }
        );
        assert_eq!(t.events, 1);
        assert_eq!(t.groups[&key(0, MemKind::Device)].live_bytes, 100);
    }

    #[test]
    fn a_file_that_is_not_a_trace_is_an_error() {
        let err = Trace::load_from(|| Ok(&b"#!/bin/sh\necho hello\n"[..])).unwrap_err();
        assert!(err.contains("not a gpumemtrace trace"), "{err}");
    }

    #[test]
    fn records_besides_events_are_kept() {
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x10, 0x20])
            .rec(Record::Module(Module {
                id: 1,
                path: "/lib/x.so".into(),
                ..Module::default()
            }))
            .rec(Record::Notice("stack capture disabled".into()))
            .rec(Record::Event(Event {
                api: 77,
                ..Event::default()
            }))
            .rec(Record::Stats(Stats {
                events: 1,
                dropped: 3,
                final_: true,
            }));
        let t = b.load();
        assert_eq!(t.stacks[&1], [0x10, 0x20]);
        assert_eq!(t.modules.len(), 1);
        assert_eq!(t.notices, ["stack capture disabled"]);
        assert_eq!((t.events, t.unknown_api_events), (1, 1));
        assert_eq!(t.stats.unwrap().dropped, 3);
        assert_eq!(t.apis[&MALLOC].name, "cudaMalloc");
    }
}
