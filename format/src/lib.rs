//! The gpumemtrace trace format, specified in `docs/format.md`.
//!
//! The preload library encodes records with [`Encoder`]; the CLI decodes them with [`Reader`].
//! Keeping both here, next to the specification, is what keeps them in step.
//!
//! A trace is a 12-byte header followed by length-prefixed records. Every record is
//! `tag: u8, len: varint, payload: [u8; len]`, so a reader can skip tags it does not know,
//! bound its allocations by `len`, and tell a clean end (between records) from a cut one.

use std::fmt;
use std::io::{self, Read};

mod compress;
pub mod journal;
pub mod raw;
pub use compress::Compressor;
mod fit;
pub use fit::{cut, fitted, MAX_ARGS_LEN, MAX_BUILD_ID_LEN, MAX_FIELD_LEN, MAX_LINETABLE_LEN};
use compress::Body;

/// First 8 bytes of every trace.
pub const MAGIC: &[u8; 8] = b"GPUMTRC\0";
/// Format version written after the magic (u16 little endian), then the header flags (u16).
/// Version 2 stores an event's thread and address as deltas from the previous event's; version 3
/// adds the `block` memory kind (PyTorch's caching-allocator blocks), event flags and the
/// allocator's own totals; version 4 gives the last two header bytes a meaning ([`flags`]): the
/// records are those of version 3. Readers still read versions 1 to 3.
pub const VERSION: u16 = 4;

/// Header flags (version 4; earlier versions wrote zeros there).
pub mod flags {
    /// The body after the header is one zstd stream of records (see `compress.rs`).
    pub const ZSTD: u16 = 1;
}
/// The oldest version this reader understands.
pub const MIN_VERSION: u16 = 1;
/// Size of the file header: magic, version, flags.
pub const HEADER_LEN: usize = 12;
/// No record payload may be longer than this; a longer length means a corrupt file.
pub const MAX_RECORD_LEN: u64 = 1 << 20;
/// No stack may have more frames than this.
pub const MAX_FRAMES: usize = 1024;

/// Record tags.
pub mod tag {
    pub const PROCESS: u8 = 0x01;
    pub const API: u8 = 0x02;
    pub const MODULE: u8 = 0x03;
    pub const STACK: u8 = 0x04;
    pub const EVENT: u8 = 0x05;
    pub const NOTICE: u8 = 0x06;
    pub const STATS: u8 = 0x07;
    pub const PY_CODE: u8 = 0x08;
    pub const PY_STACK: u8 = 0x09;
    pub const PHASE: u8 = 0x0A;
    pub const THREAD: u8 = 0x0B;
}

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
    /// events recorded without stacks (block frees), so a reader can tell a program's own
    /// calls from those of the interpreter's shutdown.
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
    /// A record with a tag this reader does not know (newer writer); skipped.
    Unknown(u8),
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Encodes records into a byte buffer. The caller writes the buffer out.
///
/// Event timestamps are stored as signed deltas from the previous event, so the encoder keeps
/// that one piece of state.
#[derive(Default)]
pub struct Encoder {
    prev: Prev,
    payload: Vec<u8>,
}

/// The previous event's fields that the next one is stored relative to.
#[derive(Clone, Copy, Default)]
struct Prev {
    time_ns: u64,
    tid: u32,
    addr: u64,
}

/// The file header of an uncompressed trace.
pub fn header() -> [u8; HEADER_LEN] {
    header_with(0)
}

/// The file header with `flags` ([`flags`]).
pub fn header_with(flags: u16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&flags.to_le_bytes());
    h
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Appends `rec` to `out`, its long fields cut to the format's bounds ([`fitted`]).
    pub fn encode(&mut self, rec: &Record, out: &mut Vec<u8>) {
        let rec: &Record = &fitted(rec);
        let p = &mut self.payload;
        p.clear();
        let t = match rec {
            Record::Process(r) => {
                put_uv(p, r.pid as u64);
                put_uv(p, r.ppid as u64);
                put_uv(p, r.start_monotonic_ns);
                put_uv(p, r.start_realtime_ns);
                put_str(p, &r.exe);
                put_uv(p, r.args.len() as u64);
                for a in &r.args {
                    put_str(p, a);
                }
                put_uv(p, r.max_frames as u64);
                put_uv(p, r.rank.map_or(0, |v| v as u64 + 1));
                put_uv(p, r.local_rank.map_or(0, |v| v as u64 + 1));
                tag::PROCESS
            }
            Record::Api(r) => {
                put_uv(p, r.id as u64);
                put_str(p, &r.name);
                p.push(r.kind as u8);
                p.push(r.op as u8);
                tag::API
            }
            Record::Module(r) => {
                put_uv(p, r.id as u64);
                put_uv(p, r.bias);
                put_uv(p, r.start);
                put_uv(p, r.end);
                put_str(p, &r.path);
                put_bytes(p, &r.build_id);
                tag::MODULE
            }
            Record::Stack(r) => {
                put_uv(p, r.id as u64);
                put_uv(p, r.frames.len() as u64);
                let mut prev = 0u64;
                for &f in &r.frames {
                    put_sv(p, f.wrapping_sub(prev) as i64);
                    prev = f;
                }
                tag::STACK
            }
            Record::Event(e) => {
                // Deltas: times grow slowly, one thread calls many times in a row, and a free
                // usually follows its allocation closely (often at the same address).
                put_uv(p, e.api as u64);
                put_sv(p, e.time_ns.wrapping_sub(self.prev.time_ns) as i64);
                put_sv(p, (e.tid as i64).wrapping_sub(self.prev.tid as i64));
                put_uv(p, e.stack as u64);
                put_uv(p, e.result as u64);
                put_sv(p, e.device as i64);
                put_sv(p, e.addr.wrapping_sub(self.prev.addr) as i64);
                self.prev = Prev { time_ns: e.time_ns, tid: e.tid, addr: e.addr };
                put_uv(p, e.size);
                put_uv(p, e.stream);
                put_uv(p, e.extra);
                put_uv(p, e.pystack as u64);
                // Fields added in version 3, written only when one is set: absent reads as 0.
                let base = p.len();
                put_uv(p, e.flags as u64);
                put_uv(p, e.total_allocated);
                put_uv(p, e.total_reserved);
                while p.len() > base && p.last() == Some(&0) {
                    p.pop();
                }
                tag::EVENT
            }
            Record::Notice(s) => {
                put_str(p, s);
                tag::NOTICE
            }
            Record::Stats(s) => {
                put_uv(p, s.events);
                put_uv(p, s.dropped);
                p.push(s.final_ as u8);
                tag::STATS
            }
            Record::PyCode(c) => {
                put_uv(p, c.id as u64);
                put_str(p, &c.name);
                put_str(p, &c.qualname);
                put_str(p, &c.filename);
                put_uv(p, c.firstlineno as u64);
                p.push(c.linetable_format);
                put_bytes(p, &c.linetable);
                tag::PY_CODE
            }
            Record::PyStack(s) => {
                put_uv(p, s.id as u64);
                put_uv(p, s.frames.len() as u64);
                for f in &s.frames {
                    put_uv(p, f.code as u64);
                    put_uv(p, f.instr_offset as u64);
                    p.push(f.flags);
                }
                tag::PY_STACK
            }
            Record::Phase(ph) => {
                put_uv(p, ph.time_ns);
                put_uv(p, ph.tid as u64);
                p.push(ph.op as u8);
                put_str(p, &ph.name);
                tag::PHASE
            }
            Record::Thread(t) => {
                put_uv(p, t.tid as u64);
                put_str(p, &t.name);
                p.push(t.python as u8);
                tag::THREAD
            }
            Record::Unknown(t) => *t,
        };
        if p.len() as u64 > MAX_RECORD_LEN {
            // Cannot happen after `fitted`; should it, a notice stands in for the record rather
            // than a length every reader rejects (which would end the trace there).
            p.clear();
            put_str(p, &format!("a record (tag {t:#04x}) over the format's bound was left out"));
            out.push(tag::NOTICE);
        } else {
            out.push(t);
        }
        put_uv(out, p.len() as u64);
        out.extend_from_slice(p);
    }
}

fn put_uv(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_sv(out: &mut Vec<u8>, v: i64) {
    put_uv(out, ((v << 1) ^ (v >> 63)) as u64);
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uv(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

// ---------------------------------------------------------------------------------------------
// Decoding

/// Why reading stopped early.
#[derive(Debug)]
pub enum ReadError {
    /// Not a gpumemtrace file, or a version this reader does not understand.
    BadHeader(String),
    /// The file ends in the middle of a record: everything before `offset` was read.
    Truncated { offset: u64 },
    /// A record is malformed.
    Corrupt { offset: u64, what: String },
    Io(io::Error),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::BadHeader(m) => write!(f, "not a gpumemtrace trace: {m}"),
            ReadError::Truncated { offset } => {
                write!(f, "trace is truncated: the last record, at byte {offset}, is incomplete")
            }
            ReadError::Corrupt { offset, what } => {
                write!(f, "trace is corrupt at byte {offset}: {what}")
            }
            ReadError::Io(e) => write!(f, "cannot read trace: {e}"),
        }
    }
}

impl std::error::Error for ReadError {}

/// Streams records out of a trace. Memory use is bounded by [`MAX_RECORD_LEN`].
pub struct Reader<R: Read> {
    inner: Body<R>,
    /// Byte offset of the next record.
    offset: u64,
    version: u16,
    prev: Prev,
    /// Read-ahead: unread bytes are `buf[pos..end]`.
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
    done: bool,
}

/// Bytes read from the source at a time.
const READ_CHUNK: usize = 256 * 1024;

impl<R: Read> Reader<R> {
    /// Checks the header. Fails on a file that is not a trace or has an unknown version.
    pub fn new(mut inner: R) -> Result<Reader<R>, ReadError> {
        let mut h = [0u8; HEADER_LEN];
        let n = read_full(&mut inner, &mut h).map_err(ReadError::Io)?;
        if n < HEADER_LEN {
            if h[..n.min(8)] == MAGIC[..n.min(8)] {
                return Err(ReadError::Truncated { offset: 0 });
            }
            return Err(ReadError::BadHeader("file is too short".into()));
        }
        if &h[..8] != MAGIC {
            return Err(ReadError::BadHeader("wrong magic bytes".into()));
        }
        let v = u16::from_le_bytes([h[8], h[9]]);
        if !(MIN_VERSION..=VERSION).contains(&v) {
            return Err(ReadError::BadHeader(format!(
                "format version {v}, this reader understands versions {MIN_VERSION} to {VERSION}"
            )));
        }
        let flags = if v >= 4 { u16::from_le_bytes([h[10], h[11]]) } else { 0 };
        if flags & !flags::ZSTD != 0 {
            return Err(ReadError::BadHeader(format!("unknown header flags {flags:#x}")));
        }
        let inner = if flags & flags::ZSTD != 0 { Body::zstd(inner).map_err(ReadError::Io)? } else { Body::Plain(inner) };
        Ok(Reader {
            inner,
            offset: HEADER_LEN as u64,
            version: v,
            prev: Prev::default(),
            buf: Vec::new(),
            pos: 0,
            end: 0,
            eof: false,
            done: false,
        })
    }

    /// Byte offset just past the last record returned.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The next record; `Ok(None)` at a clean end of file.
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        if self.done {
            return Ok(None);
        }
        let start = self.offset;
        // Tag and length (a varint of at most 10 bytes), parsed from the buffer.
        if let Err(e) = self.fill(11) {
            return Err(self.fail(ReadError::Io(e)));
        }
        let avail = &self.buf[self.pos..self.end];
        if avail.is_empty() {
            self.done = true;
            return Ok(None);
        }
        let tag = avail[0];
        let mut len = 0u64;
        let mut header = 0usize;
        for i in 0..10 {
            let Some(&b) = avail.get(1 + i) else {
                return Err(self.fail(ReadError::Truncated { offset: start }));
            };
            len |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                header = 2 + i;
                break;
            }
        }
        if header == 0 {
            return Err(self.fail(ReadError::Corrupt { offset: start, what: "record length varint is too long".into() }));
        }
        if len > MAX_RECORD_LEN {
            return Err(self.fail(ReadError::Corrupt {
                offset: start,
                what: format!("record length {len} exceeds the limit of {MAX_RECORD_LEN} bytes"),
            }));
        }
        let total = header + len as usize;
        if let Err(e) = self.fill(total) {
            return Err(self.fail(ReadError::Io(e)));
        }
        if self.end - self.pos < total {
            return Err(self.fail(ReadError::Truncated { offset: start }));
        }
        let payload = &self.buf[self.pos + header..self.pos + total];
        let rec = match decode(tag, payload, self.version, &mut self.prev) {
            Ok(r) => r,
            Err(what) => return Err(self.fail(ReadError::Corrupt { offset: start, what })),
        };
        self.pos += total;
        self.offset = start + total as u64;
        Ok(Some(rec))
    }

    /// Makes at least `want` unread bytes available in `buf[pos..end]`, or all that remain.
    fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.end - self.pos >= want || self.eof {
            return Ok(());
        }
        // Keep the unread tail, then read in large chunks (records are bounded, so is this).
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        let size = want.max(READ_CHUNK);
        if self.buf.len() < size {
            self.buf.resize(size, 0);
        }
        while self.end < want {
            match self.inner.read(&mut self.buf[self.end..]) {
                Ok(0) => {
                    self.eof = true;
                    break;
                }
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: ReadError) -> ReadError {
        self.done = true;
        e
    }
}

impl<R: Read> Iterator for Reader<R> {
    type Item = Result<Record, ReadError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

fn read_full<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A cursor over one record's payload.
struct Payload<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Payload<'a> {
    #[inline]
    fn uv(&mut self) -> Result<u64, String> {
        // Most numbers fit in one byte.
        if let Some(&b) = self.b.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(b as u64);
            }
        }
        let mut v = 0u64;
        for i in 0..10 {
            let Some(&b) = self.b.get(self.pos) else {
                return Err("record payload ends inside a number".into());
            };
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("number is longer than 10 bytes".into())
    }
    #[inline]
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let v = self.uv()?;
        u32::try_from(v).map_err(|_| format!("{what} {v} does not fit in 32 bits"))
    }
    #[inline]
    fn sv(&mut self) -> Result<i64, String> {
        let v = self.uv()?;
        Ok(((v >> 1) as i64) ^ -((v & 1) as i64))
    }
    #[inline]
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.b.get(self.pos).ok_or("record payload is too short")?;
        self.pos += 1;
        Ok(b)
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.uv()?;
        let rest = self.b.len() - self.pos;
        if n > rest as u64 {
            return Err(format!("byte string of length {n} overruns its record ({rest} bytes left)"));
        }
        let s = &self.b[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }
    fn string(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
    #[inline]
    fn at_end(&self) -> bool {
        self.pos >= self.b.len()
    }
}

fn decode(t: u8, b: &[u8], version: u16, prev: &mut Prev) -> Result<Record, String> {
    let mut p = Payload { b, pos: 0 };
    let rec = match t {
        tag::PROCESS => {
            let pid = p.u32("pid")?;
            let ppid = p.u32("ppid")?;
            let start_monotonic_ns = p.uv()?;
            let start_realtime_ns = p.uv()?;
            let exe = p.string()?;
            let n = p.uv()?;
            if n > b.len() as u64 {
                return Err(format!("argument count {n} exceeds the record size"));
            }
            let args = (0..n).map(|_| p.string()).collect::<Result<Vec<_>, _>>()?;
            let max_frames = p.u32("max_frames")?;
            // Optional trailing fields (0 or absent = not set).
            let mut opt = || -> Result<Option<u32>, String> {
                if p.at_end() {
                    return Ok(None);
                }
                let v = p.u32("rank")?;
                Ok(v.checked_sub(1))
            };
            let rank = opt()?;
            let local_rank = opt()?;
            Record::Process(Process { pid, ppid, start_monotonic_ns, start_realtime_ns, exe, args, max_frames, rank, local_rank })
        }
        tag::API => {
            let id = p.u32("api id")?;
            let name = p.string()?;
            let k = p.byte()?;
            let kind = MemKind::from_u8(k).ok_or_else(|| format!("unknown memory kind {k}"))?;
            let o = p.byte()?;
            let op = Op::from_u8(o).ok_or_else(|| format!("unknown operation {o}"))?;
            Record::Api(Api { id, name, kind, op })
        }
        tag::MODULE => Record::Module(Module {
            id: p.u32("module id")?,
            bias: p.uv()?,
            start: p.uv()?,
            end: p.uv()?,
            path: p.string()?,
            build_id: p.bytes()?.to_vec(),
        }),
        tag::STACK => {
            let id = p.u32("stack id")?;
            let n = p.uv()?;
            if n > MAX_FRAMES as u64 || n > b.len() as u64 {
                return Err(format!("stack with {n} frames exceeds the limit"));
            }
            let mut frames = Vec::with_capacity(n as usize);
            let mut prev = 0u64;
            for _ in 0..n {
                prev = prev.wrapping_add(p.sv()? as u64);
                frames.push(prev);
            }
            Record::Stack(Stack { id, frames })
        }
        tag::EVENT => {
            let api = p.u32("api id")?;
            let dt = p.sv()?;
            let time_ns = prev.time_ns.wrapping_add(dt as u64);
            let tid = if version >= 2 {
                let t = (prev.tid as i64).wrapping_add(p.sv()?);
                u32::try_from(t).map_err(|_| format!("thread id {t} out of range"))?
            } else {
                p.u32("thread id")?
            };
            let stack = p.u32("stack id")?;
            let result = p.u32("result code")?;
            let device = p.sv()?;
            let device = i32::try_from(device).map_err(|_| format!("device {device} out of range"))?;
            let addr = if version >= 2 { prev.addr.wrapping_add(p.sv()? as u64) } else { p.uv()? };
            *prev = Prev { time_ns, tid, addr };
            Record::Event(Event {
                api,
                time_ns,
                tid,
                stack,
                result,
                device,
                addr,
                size: p.uv()?,
                stream: p.uv()?,
                extra: p.uv()?,
                // Added after version 1's first writer: absent means none.
                pystack: if p.at_end() { 0 } else { p.u32("python stack id")? },
                // Version 3: trailing fields left out when zero.
                flags: if p.at_end() { 0 } else { p.u32("event flags")? },
                total_allocated: if p.at_end() { 0 } else { p.uv()? },
                total_reserved: if p.at_end() { 0 } else { p.uv()? },
            })
        }
        tag::PY_CODE => Record::PyCode(PyCode {
            id: p.u32("code id")?,
            name: p.string()?,
            qualname: p.string()?,
            filename: p.string()?,
            firstlineno: p.u32("first line")?,
            linetable_format: p.byte()?,
            linetable: p.bytes()?.to_vec(),
        }),
        tag::PY_STACK => {
            let id = p.u32("python stack id")?;
            let n = p.uv()?;
            if n > MAX_FRAMES as u64 || n > b.len() as u64 {
                return Err(format!("python stack with {n} frames exceeds the limit"));
            }
            let mut frames = Vec::with_capacity(n as usize);
            for _ in 0..n {
                frames.push(PyFrame { code: p.u32("code id")?, instr_offset: p.u32("instruction offset")?, flags: p.byte()? });
            }
            Record::PyStack(PyStack { id, frames })
        }
        tag::PHASE => {
            let time_ns = p.uv()?;
            let tid = p.u32("thread id")?;
            let op = match p.byte()? {
                1 => PhaseOp::Push,
                2 => PhaseOp::Pop,
                3 => PhaseOp::Mark,
                o => return Err(format!("unknown phase operation {o}")),
            };
            Record::Phase(Phase { time_ns, tid, op, name: p.string()? })
        }
        tag::THREAD => Record::Thread(Thread { tid: p.u32("thread id")?, name: p.string()?, python: p.byte()? != 0 }),
        tag::NOTICE => Record::Notice(p.string()?),
        tag::STATS => Record::Stats(Stats { events: p.uv()?, dropped: p.uv()?, final_: p.byte()? != 0 }),
        other => return Ok(Record::Unknown(other)),
    };
    // Trailing bytes are allowed: a newer writer may append fields to a record.
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Record> {
        vec![
            Record::Process(Process {
                pid: 42,
                ppid: 1,
                start_monotonic_ns: 123456789,
                start_realtime_ns: 1_700_000_000_000_000_000,
                exe: "/usr/bin/python3".into(),
                args: vec!["python3".into(), "train.py".into()],
                max_frames: 64,
                rank: Some(0),
                local_rank: None,
            }),
            Record::Api(Api { id: 3, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }),
            Record::Module(Module {
                id: 1,
                bias: 0x7f00_0000_0000,
                start: 0x7f00_0000_1000,
                end: 0x7f00_0010_0000,
                path: "/lib/libfoo.so".into(),
                build_id: vec![0xde, 0xad, 0xbe, 0xef],
            }),
            Record::Stack(Stack { id: 1, frames: vec![0x7f00_0000_2000, 0x5555_0000_1000, 0x7f00_0000_1000] }),
            Record::Event(Event {
                api: 3,
                time_ns: 1000,
                tid: 7,
                stack: 1,
                result: 0,
                device: 0,
                addr: 0x7f00_0000_0000,
                size: 1 << 20,
                stream: 0,
                extra: 0,
                pystack: 0,
                flags: 0,
                total_allocated: 0,
                total_reserved: 0,
            }),
            // A block of a caching allocator, with its totals (version 3's trailing fields).
            Record::Event(Event {
                api: 3,
                time_ns: 990,
                addr: 0x7f00_0000_0200,
                size: 512,
                flags: event_flags::PYTHON,
                total_allocated: 1 << 20,
                total_reserved: 20 << 20,
                ..Event::default()
            }),
            // Only the flags set: the totals are left out.
            Record::Event(Event { api: 3, time_ns: 995, flags: event_flags::PYTHON, ..Event::default() }),
            Record::Event(Event { api: 3, time_ns: 900, device: -1, result: 2, size: 1 << 40, ..Event::default() }),
            Record::Notice("hello".into()),
            Record::PyCode(PyCode {
                id: 1,
                name: "forward".into(),
                qualname: "Net.forward".into(),
                filename: "train.py".into(),
                firstlineno: 10,
                linetable_format: line_table_format::PY311,
                linetable: vec![1, 2, 3],
            }),
            Record::PyStack(PyStack {
                id: 1,
                frames: vec![PyFrame { code: 1, instr_offset: 24, flags: 1 }, PyFrame { code: 1, instr_offset: 0, flags: 0 }],
            }),
            Record::Event(Event { api: 3, time_ns: 950, pystack: 1, ..Event::default() }),
            Record::Phase(Phase { time_ns: 960, tid: 7, op: PhaseOp::Push, name: "forward".into() }),
            Record::Thread(Thread { tid: 7, name: "pt_autograd_0".into(), python: false }),
            Record::Stats(Stats { events: 2, dropped: 0, final_: true }),
        ]
    }

    fn encode_all(recs: &[Record]) -> Vec<u8> {
        let mut out = header().to_vec();
        let mut enc = Encoder::new();
        for r in recs {
            enc.encode(r, &mut out);
        }
        out
    }

    #[test]
    fn version_3_fields_cost_nothing_when_zero() {
        let ev = |e: Event| {
            let mut out = Vec::new();
            Encoder::new().encode(&Record::Event(e), &mut out);
            out.len()
        };
        let plain = ev(Event { api: 3, size: 100, ..Event::default() });
        assert_eq!(ev(Event { api: 3, size: 100, flags: 1, ..Event::default() }), plain + 1);
        assert_eq!(ev(Event { api: 3, size: 100, total_reserved: 1, ..Event::default() }), plain + 3);
    }

    #[test]
    fn every_record_survives_a_round_trip() {
        let recs = sample();
        let bytes = encode_all(&recs);
        let back: Vec<Record> = Reader::new(&bytes[..]).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(back, recs);
    }

    #[test]
    fn every_prefix_reads_cleanly_or_reports_truncation() {
        let recs = sample();
        let bytes = encode_all(&recs);
        // Offsets where a record ends: a prefix ending there reads without error.
        let mut ends = vec![HEADER_LEN];
        let mut r = Reader::new(&bytes[..]).unwrap();
        while r.next_record().unwrap().is_some() {
            ends.push(r.offset() as usize);
        }
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            let mut got = 0;
            let outcome = match Reader::new(prefix) {
                Err(ReadError::Truncated { .. }) => {
                    assert!(cut < HEADER_LEN);
                    continue;
                }
                Err(e) => panic!("prefix {cut}: {e}"),
                Ok(mut rd) => loop {
                    match rd.next_record() {
                        Ok(Some(_)) => got += 1,
                        Ok(None) => break Ok(()),
                        Err(e) => break Err(e),
                    }
                },
            };
            let complete = ends.iter().filter(|&&e| e <= cut).count() - 1;
            assert_eq!(got, complete, "prefix {cut}");
            match outcome {
                Ok(()) => assert!(ends.contains(&cut), "prefix {cut} should be reported truncated"),
                Err(ReadError::Truncated { offset }) => assert_eq!(offset as usize, ends[complete]),
                Err(e) => panic!("prefix {cut}: unexpected {e}"),
            }
        }
    }

    #[test]
    fn a_bogus_length_is_an_error_not_an_allocation() {
        let mut bytes = header().to_vec();
        bytes.push(tag::EVENT);
        put_uv(&mut bytes, u64::MAX >> 1);
        let err = Reader::new(&bytes[..]).unwrap().next_record().unwrap_err();
        assert!(matches!(err, ReadError::Corrupt { offset: 12, .. }), "{err}");
    }

    #[test]
    fn events_of_the_first_writer_without_a_python_stack_still_read() {
        // Version 1 events were first written without the trailing `pystack` field, with the
        // thread and address as plain numbers.
        let mut bytes = header().to_vec();
        bytes[8] = 1;
        bytes.extend_from_slice(&[tag::EVENT, 10, 1, 2, 3, 4, 0, 0, 5, 6, 0, 0]);
        let rec = Reader::new(&bytes[..]).unwrap().next_record().unwrap().unwrap();
        let Record::Event(e) = rec else { panic!("{rec:?}") };
        assert_eq!((e.api, e.tid, e.addr, e.size, e.pystack), (1, 3, 5, 6, 0));
    }

    #[test]
    fn unknown_tags_are_skipped() {
        let mut bytes = header().to_vec();
        bytes.extend_from_slice(&[0x7e, 3, 1, 2, 3]);
        let mut enc = Encoder::new();
        enc.encode(&Record::Notice("after".into()), &mut bytes);
        let back: Vec<Record> = Reader::new(&bytes[..]).unwrap().map(|r| r.unwrap()).collect();
        assert_eq!(back, vec![Record::Unknown(0x7e), Record::Notice("after".into())]);
    }

    #[test]
    fn wrong_magic_and_version_are_rejected() {
        assert!(matches!(Reader::new(&b"NOTATRACEFILE..."[..]), Err(ReadError::BadHeader(_))));
        let mut h = header();
        h[8] = 99;
        assert!(matches!(Reader::new(&h[..]), Err(ReadError::BadHeader(_))));
        h[8] = 0;
        assert!(matches!(Reader::new(&h[..]), Err(ReadError::BadHeader(_))));
    }
}
