//! The records of a trace, as the encoder takes them and the reader gives them back.

/// What kind of memory an API hands out. The report keeps these apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemKind {
    /// `cudaMalloc`, `cuMemAlloc`, pitch/3D variants, stream-ordered allocations.
    Device = 1,
    /// `cudaMallocManaged`, `cuMemAllocManaged`.
    Managed = 2,
    /// Page-locked host memory: `cudaMallocHost`, `cudaHostAlloc`, `cuMemHostAlloc`...
    HostPinned = 3,
    /// Physical memory of the VMM API (`cuMemCreate`/`cuMemRelease`); the address is the handle.
    VmmPhysical = 4,
    /// Reserved virtual address space (`cuMemAddressReserve`/`cuMemAddressFree`); uses no memory.
    VmmReserved = 5,
    /// Mappings of physical memory into reserved space (`cuMemMap`/`cuMemUnmap`).
    VmmMapped = 6,
    /// Blocks a framework's caching allocator hands out from its segments (PyTorch's tensors,
    /// reported through `c10::reportMemoryUsageToProfiler`). They lie inside device or VMM
    /// memory recorded at the driver level, so they never add to a device's total.
    Block = 7,
}

impl MemKind {
    pub const ALL: [MemKind; 7] = [
        MemKind::Device,
        MemKind::Managed,
        MemKind::HostPinned,
        MemKind::VmmPhysical,
        MemKind::VmmReserved,
        MemKind::VmmMapped,
        MemKind::Block,
    ];

    pub fn from_u8(v: u8) -> Option<MemKind> {
        MemKind::ALL.iter().copied().find(|k| *k as u8 == v)
    }

    /// Short stable name used in reports and JSON.
    pub fn name(self) -> &'static str {
        match self {
            MemKind::Device => "device",
            MemKind::Managed => "managed",
            MemKind::HostPinned => "host-pinned",
            MemKind::VmmPhysical => "vmm-physical",
            MemKind::VmmReserved => "vmm-reserved",
            MemKind::VmmMapped => "vmm-mapped",
            MemKind::Block => "block",
        }
    }

    /// The address namespace of the kind's addresses: device, managed and pinned host pointers
    /// share the process's virtual address space (0); VMM handles (1), reservations (2) and
    /// mappings (3) are each their own, and so are blocks (4: a segment's first block has the
    /// segment's own address). A free finds its allocation by (namespace, address).
    pub fn namespace(self) -> u8 {
        match self {
            MemKind::Device | MemKind::Managed | MemKind::HostPinned => 0,
            MemKind::VmmPhysical => 1,
            MemKind::VmmReserved => 2,
            MemKind::VmmMapped => 3,
            MemKind::Block => 4,
        }
    }

    /// Whether the kind occupies GPU memory: device, managed and VMM physical memory.
    /// Reservations use none, mappings only point at physical memory (counting them would count
    /// it twice), pinned memory lives on the host, blocks lie inside device or mapped memory.
    pub fn occupies_gpu(self) -> bool {
        matches!(self, MemKind::Device | MemKind::Managed | MemKind::VmmPhysical)
    }
}

/// What an API call does to its memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Alloc = 1,
    Free = 2,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        match v {
            1 => Some(Op::Alloc),
            2 => Some(Op::Free),
            _ => None,
        }
    }
}

/// Describes the process that wrote the trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    pub ppid: u32,
    /// CLOCK_MONOTONIC at the start of tracing; event times count from here.
    pub start_monotonic_ns: u64,
    /// CLOCK_REALTIME at the same moment (nanoseconds since the Unix epoch).
    pub start_realtime_ns: u64,
    pub exe: String,
    pub args: Vec<String>,
    /// Stack depth the tracer was configured with.
    pub max_frames: u32,
    /// `RANK` and `LOCAL_RANK` of a torchrun-style launcher, when set.
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
}

/// One entry of the hook table: an interposed function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Api {
    pub id: u32,
    pub name: String,
    pub kind: MemKind,
    pub op: Op,
}

/// A loaded object (executable or shared library), for offline symbolization.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Module {
    pub id: u32,
    /// Load bias: runtime address = file virtual address + bias.
    pub bias: u64,
    /// Lowest and one-past-highest runtime address of its loadable segments.
    pub start: u64,
    pub end: u64,
    pub path: String,
    /// GNU build-id (empty when the object has none).
    pub build_id: Vec<u8>,
}

/// An interned native stack: return addresses, innermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stack {
    pub id: u32,
    pub frames: Vec<u64>,
}

/// One intercepted call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// Id of an [`Api`] record.
    pub api: u32,
    /// Nanoseconds since [`Process::start_monotonic_ns`].
    pub time_ns: u64,
    pub tid: u32,
    /// Id of a [`Stack`] record; 0 = no stack captured.
    pub stack: u32,
    /// The call's return code as the real function produced it (0 = success).
    pub result: u32,
    /// Device ordinal; -1 for host memory or when unknown.
    pub device: i32,
    /// Pointer allocated or freed; for VMM physical memory the handle. 0 when the call failed.
    pub addr: u64,
    /// Bytes requested (allocation) or given (`cuMemAddressFree`, `cuMemUnmap`); 0 when unknown.
    pub size: u64,
    /// Stream handle for stream-ordered calls, else 0.
    pub stream: u64,
    /// For `cuMemMap`: the physical allocation handle mapped. Else 0.
    pub extra: u64,
    /// Id of a [`PyStack`] record: the calling thread's Python stack; 0 = none.
    pub pystack: u32,
    /// Bits of [`event_flags`].
    pub flags: u32,
    /// For `block` events: the allocator's own count of allocated and reserved bytes on the
    /// device after this call, when it reports them (PyTorch 1.10+); else 0.
    pub total_allocated: u64,
    pub total_reserved: u64,
}

/// [`Event::flags`] bits.
pub mod event_flags {
    /// The calling thread was running Python code. Set whenever `pystack` is, and also for
    /// events recorded without stacks (frees) on the process's main thread, so a reader can tell
    /// a program's own calls from those of the interpreter's shutdown.
    pub const PYTHON: u32 = 1;
}

/// A Python code object, written once, before the first Python stack that uses it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyCode {
    pub id: u32,
    /// `co_name`.
    pub name: String,
    /// `co_qualname` (3.11+; else equal to `name`).
    pub qualname: String,
    /// `co_filename`.
    pub filename: String,
    /// `co_firstlineno`.
    pub firstlineno: u32,
    /// How `linetable` is encoded: see [`LineTableFormat`].
    pub linetable_format: u8,
    /// A copy of `co_linetable` (3.10+), to turn instruction offsets into lines offline.
    pub linetable: Vec<u8>,
}

impl PyCode {
    /// A code object nothing is known of (its description never arrived): frames keep their
    /// place in the stack, nameless.
    pub fn unknown(id: u32) -> PyCode {
        PyCode { id, name: "<unknown>".into(), qualname: "<unknown>".into(), filename: "<unknown>".into(), ..PyCode::default() }
    }
}

/// Encodings of [`PyCode::linetable`].
pub mod line_table_format {
    /// No table: every frame reports `firstlineno`.
    pub const NONE: u8 = 0;
    /// CPython 3.10 `co_linetable` (pairs of byte-offset delta, line delta).
    pub const PY310: u8 = 1;
    /// CPython 3.11+ location table (PEP 657).
    pub const PY311: u8 = 2;
}

/// One Python frame: which code, where in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// Id of a [`PyCode`] record.
    pub code: u32,
    /// Byte offset of the current instruction in the code's bytecode.
    pub instr_offset: u32,
    /// Bit 0: this frame was the first one its interpreter-loop invocation ran (an "entry"
    /// frame): where, walking outward, the next native `_PyEval_EvalFrameDefault` begins.
    pub flags: u8,
}

/// An interned Python stack, innermost frame first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PyStack {
    pub id: u32,
    pub frames: Vec<PyFrame>,
}

/// What a phase record does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseOp {
    /// A range opens on the thread (`gpumemtrace_push`, `nvtxRangePush`).
    Push = 1,
    /// The thread's innermost open range closes.
    Pop = 2,
    /// A process-wide marker: from now on the phase is `name` (`gpumemtrace_mark`).
    Mark = 3,
}

/// A phase boundary: events carry the phase that is current when they happen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// Nanoseconds since [`Process::start_monotonic_ns`].
    pub time_ns: u64,
    pub tid: u32,
    pub op: PhaseOp,
    /// Empty for `Pop`.
    pub name: String,
}

/// A thread's name (as `pthread_setname_np` / `/proc/self/task/TID/comm` tell), written before
/// the thread's first event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Thread {
    pub tid: u32,
    pub name: String,
    /// True when the thread had a Python thread state when first seen.
    pub python: bool,
}

/// Counters the tracer writes when it stops (and may write more than once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events recorded so far.
    pub events: u64,
    /// Events that could not be recorded (never silently: they are counted here).
    pub dropped: u64,
    /// True when this is the last record of a cleanly finished trace.
    pub final_: bool,
}

/// Aggregate mode (`GPUMEMTRACE_AGGREGATE=1`): instead of one record per event, the trace holds
/// summaries, each `AggStart`, its `AggSite`s and `AggPeak`s, then `AggEnd` with the same `seq`.
/// A summary covers the whole run up to its time; the last complete one is the trace's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggStart {
    /// Numbers the summaries of a trace, from 0 (the empty one written at the start).
    pub seq: u64,
    /// Nanoseconds since [`Process::start_monotonic_ns`].
    pub time_ns: u64,
    /// Events the tracer recorded up to this summary (summarized or written as events).
    pub events: u64,
    /// True for the summary written when the process finished its trace.
    pub final_: bool,
    /// When the Python program ended (as the reader finds it in a full trace: the first event
    /// of the main thread without Python code after its last one with it), if it has.
    pub python_exit_ns: Option<u64>,
}

/// One allocation site of one group (device, memory kind) over the run so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggSite {
    pub seq: u64,
    pub device: i32,
    pub kind: MemKind,
    /// Stack and PyStack ids of its allocations (0 = none).
    pub stack: u32,
    pub pystack: u32,
    /// Successful allocations and their bytes; successful frees of them.
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    /// Its allocations live now: bytes, count.
    pub live_bytes: u64,
    pub live_count: u64,
    /// Its allocations live at its group's peak: bytes, count.
    pub peak_bytes: u64,
    pub peak_count: u64,
    /// Its allocations live when the Python program ended (0 when it has not).
    pub exit_bytes: u64,
    pub exit_count: u64,
    /// The thread of its first allocation.
    pub tid: u32,
}

/// The peak of one group, or (`kind` None) of a device's GPU memory (the kinds that occupy it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggPeak {
    pub seq: u64,
    pub device: i32,
    pub kind: Option<MemKind>,
    pub bytes: u64,
    /// When it was first reached, ns since the start.
    pub time_ns: u64,
}

/// One group's allocations in one phase (the phase of each call as a reader decides it from
/// the Phase records of a full trace, see docs/format.md "Phases").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggPhase {
    pub seq: u64,
    pub device: i32,
    pub kind: MemKind,
    /// Empty: calls made in no phase.
    pub name: String,
    pub allocations: u64,
    pub allocated_bytes: u64,
    /// Failed allocation calls.
    pub failed: u64,
    /// The group's highest live bytes just after one of the phase's allocations.
    pub peak_bytes: u64,
}

/// What was live on a device when the failed call just before it was made (aggregate mode: its
/// reader replays the failure without the live set that gives this).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggFailure {
    pub device: i32,
    /// GPU memory live on the device then (the kinds that occupy it), as a full trace's reader
    /// finds it at that event.
    pub live_bytes: u64,
}

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Process(Process),
    Api(Api),
    Module(Module),
    Stack(Stack),
    Event(Event),
    /// A message from the tracer (e.g. why tracing stopped early).
    Notice(String),
    Stats(Stats),
    PyCode(PyCode),
    PyStack(PyStack),
    Phase(Phase),
    Thread(Thread),
    AggStart(AggStart),
    AggSite(AggSite),
    AggPeak(AggPeak),
    AggPhase(AggPhase),
    AggFailure(AggFailure),
    /// The summary of this `seq` is complete.
    AggEnd(u64),
    /// A record with a tag this reader does not know (newer writer); skipped.
    Unknown(u8),
}
