//! The model of one trace: everything a report needs from it.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxHashMap;

use gpumemtrace_format::{Api, Event, MemKind, Module, Process, PyCode, PyFrame, Stats, Thread};

use super::growth::StackTrend;
use super::pool::Pool;
use super::timeseries::{PhaseUse, Series};
use crate::read::live::{GroupKey, StackUse};
use crate::read::phases::PhaseSpan;
use crate::read::records::Outcome;

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
    pub(super) peak_event: Option<u64>,
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
    /// Compressed frames left out as damaged, reading going on after each: where each started
    /// in the file and why (see the format crate's `compress`).
    pub damaged: Vec<(u64, String)>,
    pub groups: BTreeMap<GroupKey, Group>,
    pub devices: BTreeMap<i32, DeviceTotal>,
    pub failures: Vec<Failure>,
    pub bad_frees: Vec<BadFree>,
    /// Bad frees beyond [`super::groups::MAX_BAD_FREES`], counted but not listed.
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
    pub(super) combined_ids: FxHashMap<(u32, u32), u32>,
    /// The first thread seen using each stack key.
    pub stack_tid: FxHashMap<u32, u32>,
    /// Time of the last event or phase record.
    pub end_ns: u64,
    /// Live bytes over time per group (see `timeseries`).
    pub series: BTreeMap<GroupKey, Series>,
    /// Bytes and count allocated per stack (every allocation, freed or not), largest first.
    pub allocated: BTreeMap<GroupKey, Vec<StackUse>>,
    /// Allocations by phase (`""`: no phase).
    pub by_phase: BTreeMap<(GroupKey, String), PhaseUse>,
    pub spans: Vec<PhaseSpan>,
    /// Spans of one phase (thread, depth) at most this many ns apart were merged (0: none).
    pub spans_merged_within_ns: u64,
    /// Allocation calls the filter left out.
    pub filtered_out: u64,
    /// Every phase name the trace has (pushed ranges and marks), whatever the filter.
    pub phase_names: Vec<String>,
    /// Devices of every allocation call (-1: host memory), whatever the filter, sorted.
    pub alloc_devices: Vec<i32>,
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
    /// An aggregate trace's summary (see `aggregate`): its groups come from it.
    pub aggregate: Option<gpumemtrace_format::AggStart>,
    /// Aggregate traces: per group and phase, the group's highest live bytes just after one of
    /// the phase's allocations.
    pub phase_peaks: BTreeMap<(GroupKey, String), u64>,
}

/// First stack key of a (native, Python) pair; native stack ids stay below it.
pub const PY_KEY: u32 = 0x8000_0000;

/// More bytes than any machine's address space holds (2^57: x86-64 with 5-level paging).
const IMPOSSIBLE_BYTES: u64 = 1 << 57;
/// Later than any process runs: 2^62 ns after its clock's zero, some 146 years.
const IMPOSSIBLE_NS: u64 = 1 << 62;
/// More devices than any machine has (NVLink domains reach 72 GPUs; a process sees its node's).
pub const IMPOSSIBLE_DEVICE: i32 = 4096;

impl Trace {
    /// Whether the trace has a phase of this name (with allocations in it or not).
    pub fn has_phase(&self, name: &str) -> bool {
        self.phase_names.iter().any(|n| n == name)
    }

    /// What a report of this trace must warn of before its figures, one line each: where
    /// reading stopped short (a truncated or corrupt file: `covers` names what covers the events
    /// before that point, "the summary", "this report"), and values no process can have.
    pub fn warnings(&self, covers: &str) -> Vec<String> {
        let mut w = Vec::new();
        if let Outcome::Truncated { offset } = &self.outcome {
            w.push(format!(
                "the trace is truncated at byte {offset} (the process may have been killed); {covers} covers the events before it"
            ));
        }
        w.extend(self.damage(covers));
        w.extend(self.implausible());
        w
    }

    /// The corrupt bytes reading met, one line each (among [`Trace::warnings`]): where it
    /// stopped at them, and the damaged compressed frames it left out. Any makes the trace
    /// damaged: a report then covers part of the run (`summary` says so in its exit status,
    /// `check` judges nothing).
    pub fn damage(&self, covers: &str) -> Vec<String> {
        let mut w = Vec::new();
        if let Outcome::Corrupt { offset, message } = &self.outcome {
            w.push(format!("the trace is corrupt at byte {offset} ({message}); {covers} covers the events before it"));
        }
        for (at, why) in &self.damaged {
            w.push(format!(
                "the trace is corrupt in the compressed frame from byte {at} ({why}): its records are left out, and {covers} misses them (reading went on at the next frame)"
            ));
        }
        w
    }

    /// Whether [`Trace::damage`] has anything to say.
    pub fn is_damaged(&self) -> bool {
        matches!(self.outcome, Outcome::Corrupt { .. }) || !self.damaged.is_empty()
    }

    /// Prints [`Trace::warnings`] on stderr, each after the trace's name (`path`).
    pub fn warn(&self, path: &std::path::Path, covers: &str) {
        for w in self.warnings(covers) {
            eprintln!("warning: {}: {w}", crate::read::input::display(path));
        }
    }

    /// What in the trace no process can have done (successful allocations past any address
    /// space, times past any run, device numbers past any machine), if anything. The format
    /// carries no checksum in a plain body (`GPUMEMTRACE_COMPRESS=0`) nor in traces of writers
    /// before checksums, so there a corrupt byte that still decodes shows only in such values; a
    /// report of them must say so rather than print them as findings.
    pub fn implausible(&self) -> Option<String> {
        let what = if let Some((k, g)) = self.groups.iter().find(|(_, g)| g.allocated_bytes.max(g.peak_bytes) >= IMPOSSIBLE_BYTES) {
            let label = crate::units::group_label(k.device, k.kind);
            format!("{label}: {} allocated, more than any address space", crate::units::size(g.allocated_bytes.max(g.peak_bytes)))
        } else if self.end_ns >= IMPOSSIBLE_NS {
            format!("an event {} after the clock's zero", crate::units::seconds(self.end_ns))
        } else {
            let device = self.groups.keys().map(|k| k.device).find(|&d| !(-1..IMPOSSIBLE_DEVICE).contains(&d))?;
            format!("device number {device}")
        };
        Some(format!(
            "{what}: no process does this; the trace is likely corrupt (corrupt bytes that still decode, where no checksum covers them, show only so), and its figures are not to be trusted"
        ))
    }

    /// The key an event's allocation is recorded under: its native stack id, or the id of the
    /// pair when it also has a Python stack.
    pub(super) fn stack_key(&mut self, e: &Event) -> u32 {
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

