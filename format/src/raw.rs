//! What a tracer hands over before interning: events, phase boundaries and the native and
//! Python stacks they carry, as captured. The preload library builds them on its hot path and
//! passes them to its writer through the journal ([`crate::journal`]); a reader recovering a
//! journal gets them back. Plain data.

/// What the hooks hand to the writer, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    Event(RawEvent),
    Phase(RawPhase),
}

impl Msg {
    /// Position in the process's order of calls (the tracer's call order).
    pub fn seq(&self) -> u64 {
        match self {
            Msg::Event(e) => e.seq,
            Msg::Phase(p) => p.seq,
        }
    }
}

/// A phase boundary (`gpumemtrace_push` / `_pop` / `_mark`, NVTX ranges).
#[derive(Clone, Debug, PartialEq)]
pub struct RawPhase {
    pub seq: u64,
    /// CLOCK_MONOTONIC, absolute.
    pub time_ns: u64,
    pub tid: u32,
    pub op: crate::PhaseOp,
    pub name: String,
}

/// An event as the hot path captured it, before interning.
#[derive(Clone, Debug, PartialEq)]
pub struct RawEvent {
    /// The order key: the event's timestamp where the clock resolves nanoseconds, else a
    /// process-wide number (see the tracer's `clock::stamp`).
    pub seq: u64,
    pub api: u32,
    /// CLOCK_MONOTONIC, absolute.
    pub time_ns: u64,
    pub tid: u32,
    pub result: u32,
    pub device: i32,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub extra: u64,
    /// See [`crate::Event`].
    pub total_allocated: u64,
    pub total_reserved: u64,
    pub flags: u32,
    pub frames: Stack,
    /// The calling thread's Python stack, the first time this thread sends it; `None` when no
    /// supported interpreter runs or when `py_key` names a stack this thread sent before.
    pub py: Option<Box<PyCapture>>,
    /// Hash of the Python stack (0: none).
    pub py_key: u64,
    /// The thread had a Python thread state.
    pub py_tstate: bool,
    /// The thread's name, on its first event.
    pub thread_name: Option<String>,
}

impl RawEvent {
    /// Whether dropping the event would free anything: a warm event owns nothing, and the hot
    /// path skips its drop glue then. Every field is named here, so a new field that owns memory
    /// cannot be forgotten.
    #[inline]
    pub fn owns_memory(&self) -> bool {
        let RawEvent {
            seq: _,
            api: _,
            time_ns: _,
            tid: _,
            result: _,
            device: _,
            addr: _,
            size: _,
            stream: _,
            extra: _,
            total_allocated: _,
            total_reserved: _,
            flags: _,
            frames: Stack { key: _, frames },
            py,
            py_key: _,
            py_tstate: _,
            thread_name,
        } = self;
        frames.capacity() != 0 || py.is_some() || thread_name.is_some()
    }
}

/// A captured stack as the hot path hands it over: `key` names it (a 64-bit hash of its frames,
/// 0 for no frames); `frames` holds the frames only the first time this thread sends that key
/// in this tracer's life (empty afterwards: the writer already knows the key). So the warm path
/// allocates nothing and the writer hashes nothing.
#[derive(Clone, Debug, PartialEq)]
pub struct Stack {
    pub key: u64,
    pub frames: Vec<u64>,
}

// ---------------------------------------------------------------------------------------------
// Python stacks (see `python`: how they are read from the interpreter).

/// One captured frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawPyFrame {
    /// The code object's address, and a signature against the address's reuse.
    pub code: u64,
    pub sig: u64,
    /// Instruction byte offset in the code object.
    pub instr: u32,
    /// `python::ENTRY`.
    pub flags: u8,
}

/// What the writer needs of a code object, copied while it was certainly alive.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeInfo {
    pub code: u64,
    pub sig: u64,
    pub name: String,
    pub qualname: String,
    pub filename: String,
    pub firstlineno: u32,
    pub linetable_format: u8,
    pub linetable: Vec<u8>,
}

impl CodeInfo {
    /// The PyCode record that describes this code object as record `id`.
    pub fn into_record(self, id: u32) -> crate::PyCode {
        crate::PyCode {
            id,
            name: self.name,
            qualname: self.qualname,
            filename: self.filename,
            firstlineno: self.firstlineno,
            linetable_format: self.linetable_format,
            linetable: self.linetable,
        }
    }
}

/// A thread's Python stack at one event.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PyCapture {
    /// Innermost first.
    pub frames: Vec<RawPyFrame>,
    /// Code objects the process had not reported yet.
    pub new_codes: Vec<CodeInfo>,
}
