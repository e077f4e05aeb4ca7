//! The journal: a file beside the trace (`<trace>.journal`) that the traced process maps shared,
//! through which its hooks hand events to its writer thread, one ring per thread. A shared file
//! mapping belongs to the kernel's page cache, not to the process: whatever a hook put there
//! survives the process's end by any cause, `SIGKILL` and `_exit` included. The writer deletes
//! the journal when it finishes the trace; a journal that is still there holds the events the
//! writer had not written yet, and [`Recovery`] turns them into the records the trace lacks.
//! Layout and protocol: `docs/format.md`, "The journal".

use std::path::{Path, PathBuf};

use crate::raw::{CodeInfo, Msg, PyCapture, RawEvent, RawPhase, RawPyFrame, Stack};
use crate::{line_table_format, PhaseOp};

pub const MAGIC: &[u8; 8] = b"GPUMJRN\0";
/// 2: event entries carry only the fields that are not zero (`present`).
pub const VERSION: u32 = 2;
/// Rings in one journal: one a thread, the last shared (under a lock) by threads beyond.
pub const RINGS: usize = 32;
pub const RING_BYTES: u64 = 256 << 10;
/// The page before each ring's data: its positions and owner.
pub const RING_CONTROL: u64 = 4096;
pub const HEADER_BYTES: u64 = 4096;
/// Dictionary entries (ids the writer gave to keys), 24 bytes each.
pub const DICT_ENTRIES: u64 = 1 << 16;
pub const DICT_ENTRY_BYTES: u64 = 24;
/// An entry (framing included) never exceeds this: long fields are cut to fit (see [`encode`]).
pub const MAX_ENTRY: usize = 64 << 10;
/// Bytes before each entry's payload: `len u32`, `!len u32`.
pub const FRAME: u64 = 8;

/// Byte offsets in the header page.
pub mod header {
    pub const MAGIC: u64 = 0;
    pub const VERSION: u64 = 8;
    pub const RINGS: u64 = 12;
    pub const RING_BYTES: u64 = 16;
    pub const PID: u64 = 24;
    /// Dictionary entries written so far (u64).
    pub const DICT_LEN: u64 = 32;
    /// Event records the trace holds once the write in progress completes (u64).
    pub const EVENTS_PROPOSED: u64 = 64;
    /// Each ring's position once that write completes (u64 each).
    pub const PROPOSED: u64 = 128;
}

/// Byte offsets in a ring's control page.
/// The producer's words (head, busy, seen, its key in progress) share one line, which it alone writes at every event;
/// the writer's (committed) is two lines away (x86's prefetcher fetches lines in pairs).
pub mod ring {
    /// Where the producer writes next (bytes since the ring began; only grows).
    pub const HEAD: u64 = 0;
    /// The owner's stamping generation (u32): odd from just before it takes an order key until
    /// its entry is in the ring (the writer's horizon and the exit drain wait for it).
    pub const BUSY: u64 = 8;
    /// The generation (u32) whose order key `STAMP_KEY` holds, once the owner has taken it.
    pub const STAMP_GEN: u64 = 12;
    /// The order key of the owner's entry in progress (u64).
    pub const STAMP_KEY: u64 = 24;
    /// The committed position as the producer last read it (its own copy; readers ignore it).
    pub const SEEN: u64 = 16;
    /// Everything before this is in the trace file: the producer may reuse that space.
    pub const COMMITTED: u64 = 128;
    /// Thread id of the producer that owns the ring (0: free).
    pub const OWNER: u64 = 256;
    /// Lock word of the shared ring.
    pub const LOCK: u64 = 384;
}

/// Dictionary entry kinds.
pub mod dict {
    /// `key` = the hot path's stack key, `id` = Stack record id.
    pub const STACK: u32 = 1;
    /// `key` = the hot path's Python stack key, `id` = PyStack record id.
    pub const PY_STACK: u32 = 2;
    /// `key` = code object address, `sig` = its signature, `id` = PyCode record id.
    pub const PY_CODE: u32 = 3;
}

pub fn ring_offset(i: usize) -> u64 {
    HEADER_BYTES + i as u64 * (RING_CONTROL + RING_BYTES)
}

pub fn dict_offset() -> u64 {
    ring_offset(RINGS)
}

pub fn file_len() -> u64 {
    dict_offset() + DICT_ENTRIES * DICT_ENTRY_BYTES
}

/// The journal of the trace at `trace`.
pub fn path_for(trace: &Path) -> PathBuf {
    let mut s = trace.as_os_str().to_owned();
    s.push(".journal");
    PathBuf::from(s)
}

/// Where `len` bytes at ring position `pos` lie: `each(offset in the ring's data, range of the
/// bytes)`, twice when they wrap around the ring's end.
#[link_section = ".text.hot.gpumemtrace"]
pub fn pieces(pos: u64, len: usize, mut each: impl FnMut(u64, std::ops::Range<usize>)) {
    let mut off = 0;
    while off < len {
        let at = (pos + off as u64) % RING_BYTES;
        let n = ((RING_BYTES - at) as usize).min(len - off);
        each(at, off..off + n);
        off += n;
    }
}

/// An entry's whole size in the ring: framing, payload, padding to 8 bytes.
pub fn entry_bytes(payload: usize) -> u64 {
    FRAME + (payload as u64).div_ceil(8) * 8
}

// ---------------------------------------------------------------------------------------------
// Entries: a message as bytes. Fixed-width little-endian fields (the hot path writes them; no
// varints to compute), strings and lists length-prefixed with u32.

const EVENT: u8 = 1;
const PHASE: u8 = 2;
const CODES: u8 = 3;
/// Strings are cut to this many bytes when an entry would exceed [`MAX_ENTRY`].
const CUT_STRING: usize = 4096;
/// Room kept for an entry's fixed fields when sizing its lists.
const SLACK: usize = 1024;

/// What an entry holds: a message, or descriptions of code objects that later events use
/// (sent as entries of their own, before the event, so no entry outgrows a ring).
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Msg(Msg),
    Codes(Vec<CodeInfo>),
}

/// Largest payload an entry may carry.
pub const MAX_PAYLOAD: usize = MAX_ENTRY - FRAME as usize;

/// Calls `each` with the payload of every entry `msg` needs, in order: its code descriptions
/// (if any, in as many entries as they need), then the message itself (without them). Fields
/// too long for an entry are cut: a thread or phase name to 4 KiB (marked as cut), a code object's line table
/// left out (its lines then read as its first line), a Python stack to the frames that fit.
#[link_section = ".text.hot.gpumemtrace"]
pub fn encode_each<'a>(msg: impl Into<MsgRef<'a>>, buf: &mut Vec<u8>, mut each: impl FnMut(&[u8])) {
    let msg = msg.into();
    if let MsgRef::Event(RawEvent { py: Some(py), .. }) = msg {
        let mut i = 0;
        while i < py.new_codes.len() {
            buf.clear();
            buf.push(CODES);
            let at = buf.len();
            u32_(buf, 0);
            let mut n = 0u32;
            while i < py.new_codes.len() {
                let c = &py.new_codes[i];
                let mark = buf.len();
                put_code(buf, c, false);
                if buf.len() > MAX_PAYLOAD {
                    buf.truncate(mark);
                    if n > 0 {
                        break; // the next entry takes it
                    }
                    put_code(buf, c, true);
                }
                n += 1;
                i += 1;
            }
            buf[at..at + 4].copy_from_slice(&n.to_le_bytes());
            each(buf);
        }
    }
    buf.clear();
    put_msg(msg, buf);
    each(buf);
}

/// A message borrowed: what a hook hands over without moving its event into a [`Msg`].
#[derive(Clone, Copy)]
pub enum MsgRef<'a> {
    Event(&'a RawEvent),
    Phase(&'a RawPhase),
}

impl<'a> From<&'a Msg> for MsgRef<'a> {
    fn from(m: &'a Msg) -> Self {
        match m {
            Msg::Event(e) => MsgRef::Event(e),
            Msg::Phase(p) => MsgRef::Phase(p),
        }
    }
}

/// The order key (`seq`) of an event's or a phase's entry, read without decoding it.
pub fn seq_of(payload: &[u8]) -> Option<u64> {
    match payload.first() {
        Some(&EVENT | &PHASE) => Some(u64::from_le_bytes(payload.get(1..9)?.try_into().ok()?)),
        _ => None,
    }
}

/// The message's own entry (code descriptions left out: see [`encode_each`]).
pub fn encode(msg: &Msg, out: &mut Vec<u8>) {
    out.clear();
    put_msg(msg.into(), out);
}

fn put_code(o: &mut Vec<u8>, c: &CodeInfo, cut: bool) {
    u64_(o, c.code);
    u64_(o, c.sig);
    str_(o, &c.name, cut);
    str_(o, &c.qualname, cut);
    str_(o, &c.filename, cut);
    u32_(o, c.firstlineno);
    if cut {
        o.push(line_table_format::NONE);
        u32_(o, 0);
    } else {
        o.push(c.linetable_format);
        bytes_(o, &c.linetable);
    }
}

/// Which optional fields an event entry carries (its `present u16`): a field left out is zero
/// (`false`, empty, `None` for the Python stack and the thread name). Most events carry few:
/// a free is about 40 bytes, a warm allocation about 70, a cache line or two to hand over.
pub mod present {
    pub const RESULT: u16 = 1 << 0;
    pub const DEVICE: u16 = 1 << 1;
    pub const SIZE: u16 = 1 << 2;
    pub const STREAM: u16 = 1 << 3;
    pub const EXTRA: u16 = 1 << 4;
    pub const TOTAL_ALLOCATED: u16 = 1 << 5;
    pub const TOTAL_RESERVED: u16 = 1 << 6;
    pub const FLAGS: u16 = 1 << 7;
    pub const STACK_KEY: u16 = 1 << 8;
    pub const PY_KEY: u16 = 1 << 9;
    /// No bytes: the thread had a Python thread state.
    pub const PY_TSTATE: u16 = 1 << 10;
    pub const FRAMES: u16 = 1 << 11;
    pub const PY_FRAMES: u16 = 1 << 12;
    pub const THREAD_NAME: u16 = 1 << 13;
    pub const ALL: u16 = (1 << 14) - 1;
}

/// An event's fixed part: type, seq, present, api, tid, time, addr.
const EVENT_FIXED: usize = 1 + 8 + 2 + 4 + 4 + 8 + 8;

/// Writes fields at a position of a buffer sized beforehand: one resize per entry, not one
/// capacity check per field (this runs in every hook).
struct Put<'a> {
    b: &'a mut [u8],
    at: usize,
}

impl Put<'_> {
    #[inline(always)]
    fn raw(&mut self, v: &[u8]) {
        self.b[self.at..self.at + v.len()].copy_from_slice(v);
        self.at += v.len();
    }
    #[inline(always)]
    fn u32(&mut self, v: u32) {
        self.raw(&v.to_le_bytes());
    }
    #[inline(always)]
    fn u64(&mut self, v: u64) {
        self.raw(&v.to_le_bytes());
    }
}

/// An event entry's layout, worked out once: which optional fields it carries and its size.
/// The hook sizes the ring space with it, then writes the entry there (`write_event`).
pub struct EventPlan<'a> {
    mask: u16,
    len: usize,
    frames: &'a [u64],
    py_frames: Option<&'a [RawPyFrame]>,
    name: Option<std::borrow::Cow<'a, str>>,
}

impl EventPlan<'_> {
    /// The entry's payload bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }
}

#[link_section = ".text.hot.gpumemtrace"]
pub fn plan_event(e: &RawEvent) -> EventPlan<'_> {
    use present as p;
    // Native stacks are bounded by the format (MAX_FRAMES: 8 KiB).
    let frames = &e.frames.frames[..e.frames.frames.len().min(crate::MAX_FRAMES)];
    let name = e.thread_name.as_deref().map(|n| crate::cut(n, CUT_STRING));
    let (mut mask, mut len) = (0u16, EVENT_FIXED);
    let mut opt = |bit: u16, on: bool, bytes: usize| {
        if on {
            mask |= bit;
            len += bytes;
        }
        len
    };
    opt(p::RESULT, e.result != 0, 4);
    opt(p::DEVICE, e.device != 0, 4);
    opt(p::SIZE, e.size != 0, 8);
    opt(p::STREAM, e.stream != 0, 8);
    opt(p::EXTRA, e.extra != 0, 8);
    opt(p::TOTAL_ALLOCATED, e.total_allocated != 0, 8);
    opt(p::TOTAL_RESERVED, e.total_reserved != 0, 8);
    opt(p::FLAGS, e.flags != 0, 4);
    opt(p::STACK_KEY, e.frames.key != 0, 8);
    opt(p::PY_KEY, e.py_key != 0, 8);
    opt(p::PY_TSTATE, e.py_tstate, 0);
    opt(p::FRAMES, !frames.is_empty(), 4 + 8 * frames.len());
    // A Python stack is cut to what fits the entry beside the longest thread name.
    let so_far = opt(0, false, 0);
    let py_frames = e.py.as_ref().map(|py| {
        let room = (MAX_PAYLOAD - SLACK - CUT_STRING - so_far) / 21;
        &py.frames[..py.frames.len().min(room)]
    });
    opt(p::PY_FRAMES, py_frames.is_some(), py_frames.map_or(0, |f| 4 + 21 * f.len()));
    opt(p::THREAD_NAME, name.is_some(), name.as_ref().map_or(0, |n| 4 + n.len()));
    EventPlan { mask, len, frames, py_frames, name }
}

/// Writes event `e` as `plan` (made from it) lays it out; `out` is `plan.bytes()` long.
#[link_section = ".text.hot.gpumemtrace"]
pub fn write_event(e: &RawEvent, plan: &EventPlan, out: &mut [u8]) {
    use present as p;
    let mask = plan.mask;
    let mut w = Put { b: out, at: 0 };
    let scalars = put_scalars(e, &mut w);
    debug_assert_eq!(scalars, mask & !(p::FRAMES | p::PY_FRAMES | p::THREAD_NAME));
    w.b[MASK_AT..MASK_AT + 2].copy_from_slice(&mask.to_le_bytes());
    let has = |bit: u16| mask & bit != 0;
    if has(p::FRAMES) {
        w.u32(plan.frames.len() as u32);
        for &f in plan.frames {
            w.u64(f);
        }
    }
    if let Some(frames) = plan.py_frames {
        w.u32(frames.len() as u32);
        for f in frames {
            w.u64(f.code);
            w.u64(f.sig);
            w.u32(f.instr);
            w.raw(&[f.flags]);
        }
    }
    if let Some(n) = &plan.name {
        w.u32(n.len() as u32);
        w.raw(n.as_bytes());
    }
    debug_assert_eq!(w.at, plan.len);
}

/// Largest warm event entry (`write_warm_event`): the fixed part and every optional scalar.
pub const WARM_MAX: usize = EVENT_FIXED + 4 + 4 + 5 * 8 + 4 + 8 + 8;

/// Writes a warm event (no frames, no Python frames, no thread name: keys only) into `out` in
/// one pass, laid out as `write_event` lays it out, and returns its length; `None` (nothing
/// written) for any other event. One pass instead of `plan_event` then `write_event`: the
/// present mask is filled in last. `out` holds at least [`WARM_MAX`] bytes.
// Inlined into the hook that hands the event over (across crates: `#[inline]`).
#[inline]
pub fn write_warm_event(e: &RawEvent, out: &mut [u8]) -> Option<usize> {
    if !is_warm(e) || out.len() < WARM_MAX {
        return None;
    }
    let mut w = Put { b: &mut out[..WARM_MAX], at: 0 };
    let mask = put_scalars(e, &mut w);
    let len = w.at;
    out[MASK_AT..MASK_AT + 2].copy_from_slice(&mask.to_le_bytes());
    Some(len)
}

/// A warm event: keys only, no frames, no Python frames, no thread name (`write_warm_event`).
#[inline(always)]
pub fn is_warm(e: &RawEvent) -> bool {
    e.frames.frames.is_empty() && e.py.is_none() && e.thread_name.is_none()
}

/// Where an event entry's `present` mask lies: after its type byte and `seq`.
const MASK_AT: usize = 1 + 8;

/// Writes an event entry's fixed part (its mask left for the caller to fill in, at
/// [`MASK_AT`]) and every optional scalar that is not zero; returns their `present` bits. The
/// lists (frames, Python frames, thread name) follow.
#[inline(always)]
fn put_scalars(e: &RawEvent, w: &mut Put) -> u16 {
    use present as p;
    w.raw(&[EVENT]);
    w.u64(e.seq);
    w.at += 2;
    w.u32(e.api);
    w.u32(e.tid);
    w.u64(e.time_ns);
    w.u64(e.addr);
    let mut mask = 0;
    if e.result != 0 {
        mask |= p::RESULT;
        w.u32(e.result);
    }
    if e.device != 0 {
        mask |= p::DEVICE;
        w.u32(e.device as u32);
    }
    for (bit, v) in [
        (p::SIZE, e.size),
        (p::STREAM, e.stream),
        (p::EXTRA, e.extra),
        (p::TOTAL_ALLOCATED, e.total_allocated),
        (p::TOTAL_RESERVED, e.total_reserved),
    ] {
        if v != 0 {
            mask |= bit;
            w.u64(v);
        }
    }
    if e.flags != 0 {
        mask |= p::FLAGS;
        w.u32(e.flags);
    }
    if e.frames.key != 0 {
        mask |= p::STACK_KEY;
        w.u64(e.frames.key);
    }
    if e.py_key != 0 {
        mask |= p::PY_KEY;
        w.u64(e.py_key);
    }
    if e.py_tstate {
        mask |= p::PY_TSTATE;
    }
    mask
}

fn put_event(e: &RawEvent, o: &mut Vec<u8>) {
    let plan = plan_event(e);
    let start = o.len();
    o.resize(start + plan.len, 0);
    write_event(e, &plan, &mut o[start..]);
}

#[link_section = ".text.hot.gpumemtrace"]
fn put_msg(msg: MsgRef, o: &mut Vec<u8>) {
    match msg {
        MsgRef::Event(e) => put_event(e, o),
        MsgRef::Phase(p) => {
            o.push(PHASE);
            u64_(o, p.seq);
            u64_(o, p.time_ns);
            u32_(o, p.tid);
            o.push(p.op as u8);
            str_(o, &p.name, true);
        }
    }
}

fn u32_(o: &mut Vec<u8>, v: u32) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn u64_(o: &mut Vec<u8>, v: u64) {
    o.extend_from_slice(&v.to_le_bytes());
}
fn bytes_(o: &mut Vec<u8>, b: &[u8]) {
    u32_(o, b.len() as u32);
    o.extend_from_slice(b);
}
/// `cut`: a string longer than [`CUT_STRING`] is cut and marked, as the trace's own fields are
/// ([`crate::cut`]).
fn str_(o: &mut Vec<u8>, s: &str, cut: bool) {
    if cut {
        bytes_(o, crate::cut(s, CUT_STRING).as_bytes());
    } else {
        bytes_(o, s.as_bytes());
    }
}

/// The event of a warm event entry, `None` for any other entry (which [`decode`] reads): the
/// writer's way for nearly every event, without the general decoder's wrapping.
#[inline]
pub fn decode_warm_event(b: &[u8]) -> Option<RawEvent> {
    if b.first() != Some(&EVENT) {
        return None;
    }
    decode_warm(b)
}

/// A warm event entry (scalars only, as `write_warm_event` writes it) read after one length
/// check: the writer thread decodes one of these for nearly every event. `None` for any other
/// entry, which the general decoder then reads (and names what is wrong with it).
#[inline]
fn decode_warm(b: &[u8]) -> Option<RawEvent> {
    use present as p;
    const FOURS: u16 = p::RESULT | p::DEVICE | p::FLAGS;
    const EIGHTS: u16 =
        p::SIZE | p::STREAM | p::EXTRA | p::TOTAL_ALLOCATED | p::TOTAL_RESERVED | p::STACK_KEY | p::PY_KEY;
    let mask = u16::from_le_bytes(b.get(MASK_AT..MASK_AT + 2)?.try_into().ok()?);
    if mask & !(FOURS | EIGHTS | p::PY_TSTATE) != 0 {
        return None;
    }
    let len = EVENT_FIXED + 4 * (mask & FOURS).count_ones() as usize + 8 * (mask & EIGHTS).count_ones() as usize;
    if b.len() != len {
        return None;
    }
    // In bounds from here on: the length matches the fields the mask names.
    let mut at = MASK_AT + 2;
    let mut next = |n: usize| {
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(&b[at..at + n]);
        at += n;
        u64::from_le_bytes(v)
    };
    let (api, tid, time_ns, addr) = (next(4) as u32, next(4) as u32, next(8), next(8));
    let mut opt = |bit: u16, n: usize| if mask & bit != 0 { next(n) } else { 0 };
    let result = opt(p::RESULT, 4) as u32;
    let device = opt(p::DEVICE, 4) as u32 as i32;
    let size = opt(p::SIZE, 8);
    let stream = opt(p::STREAM, 8);
    let extra = opt(p::EXTRA, 8);
    let total_allocated = opt(p::TOTAL_ALLOCATED, 8);
    let total_reserved = opt(p::TOTAL_RESERVED, 8);
    let flags = opt(p::FLAGS, 4) as u32;
    let key = opt(p::STACK_KEY, 8);
    let py_key = opt(p::PY_KEY, 8);
    Some(RawEvent {
        seq: u64::from_le_bytes(b[1..9].try_into().ok()?),
        api,
        time_ns,
        tid,
        result,
        device,
        addr,
        size,
        stream,
        extra,
        total_allocated,
        total_reserved,
        flags,
        frames: Stack { key, frames: Vec::new() },
        py: None,
        py_key,
        py_tstate: mask & p::PY_TSTATE != 0,
        thread_name: None,
    })
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.b.len()).ok_or("entry ends early")?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    /// A count of items at least `each` bytes long: bounded by what is left.
    fn count(&mut self, each: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.b.len() - self.pos {
            return Err(format!("count {n} exceeds the entry"));
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.count(1)?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
}

fn decode_code(c: &mut Cursor) -> Result<CodeInfo, String> {
    Ok(CodeInfo {
        code: c.u64()?,
        sig: c.u64()?,
        name: c.string()?,
        qualname: c.string()?,
        filename: c.string()?,
        firstlineno: c.u32()?,
        linetable_format: c.u8()?,
        linetable: c.bytes()?.to_vec(),
    })
}

/// What an entry's payload holds.
pub fn decode(b: &[u8]) -> Result<Entry, String> {
    let mut c = Cursor { b, pos: 0 };
    match c.u8()? {
        CODES => {
            let n = c.count(37)?;
            (0..n).map(|_| decode_code(&mut c)).collect::<Result<Vec<_>, _>>().map(Entry::Codes)
        }
        EVENT => {
            if let Some(e) = decode_warm(b) {
                return Ok(Entry::Msg(Msg::Event(e)));
            }
            use present as p;
            let seq = c.u64()?;
            let mask = u16::from_le_bytes(c.take(2)?.try_into().expect("2 bytes"));
            if mask & !p::ALL != 0 {
                return Err(format!("unknown event fields {mask:#x}"));
            }
            let has = |bit: u16| mask & bit != 0;
            let (api, tid, time_ns, addr) = (c.u32()?, c.u32()?, c.u64()?, c.u64()?);
            let u32_if = |c: &mut Cursor, bit: u16| if has(bit) { c.u32() } else { Ok(0) };
            let result = u32_if(&mut c, p::RESULT)?;
            let device = u32_if(&mut c, p::DEVICE)? as i32;
            let u64_if = |c: &mut Cursor, bit: u16| if has(bit) { c.u64() } else { Ok(0) };
            let size = u64_if(&mut c, p::SIZE)?;
            let stream = u64_if(&mut c, p::STREAM)?;
            let extra = u64_if(&mut c, p::EXTRA)?;
            let total_allocated = u64_if(&mut c, p::TOTAL_ALLOCATED)?;
            let total_reserved = u64_if(&mut c, p::TOTAL_RESERVED)?;
            let flags = u32_if(&mut c, p::FLAGS)?;
            let key = u64_if(&mut c, p::STACK_KEY)?;
            let py_key = u64_if(&mut c, p::PY_KEY)?;
            let frames = if has(p::FRAMES) {
                let n = c.count(8)?;
                (0..n).map(|_| c.u64()).collect::<Result<Vec<_>, _>>()?
            } else {
                Vec::new()
            };
            let py = if has(p::PY_FRAMES) {
                let n = c.count(21)?;
                let mut frames = Vec::with_capacity(n);
                for _ in 0..n {
                    frames.push(RawPyFrame { code: c.u64()?, sig: c.u64()?, instr: c.u32()?, flags: c.u8()? });
                }
                Some(Box::new(PyCapture { frames, new_codes: Vec::new() }))
            } else {
                None
            };
            let thread_name = if has(p::THREAD_NAME) { Some(c.string()?) } else { None };
            if c.pos != c.b.len() {
                return Err("event entry has bytes past its fields".into());
            }
            Ok(Entry::Msg(Msg::Event(RawEvent {
                seq,
                api,
                time_ns,
                tid,
                result,
                device,
                addr,
                size,
                stream,
                extra,
                total_allocated,
                total_reserved,
                flags,
                frames: Stack { key, frames },
                py,
                py_key,
                py_tstate: has(p::PY_TSTATE),
                thread_name,
            })))
        }
        PHASE => {
            let seq = c.u64()?;
            let time_ns = c.u64()?;
            let tid = c.u32()?;
            let op = match c.u8()? {
                1 => PhaseOp::Push,
                2 => PhaseOp::Pop,
                3 => PhaseOp::Mark,
                o => return Err(format!("unknown phase operation {o}")),
            };
            Ok(Entry::Msg(Msg::Phase(RawPhase { seq, time_ns, tid, op, name: c.string()? })))
        }
        t => Err(format!("unknown entry type {t}")),
    }
}

/// Reads the entries of ring data `data` (the ring's bytes, in ring order) from byte position
/// `from` up to `to`, calling `each(position, payload)`; stops at the first malformed frame.
pub fn for_each_entry(data: &dyn Fn(u64, &mut [u8]), from: u64, to: u64, mut each: impl FnMut(u64, &[u8])) {
    let mut pos = from;
    let mut frame = [0u8; FRAME as usize];
    let mut payload = Vec::new();
    while pos + FRAME <= to {
        data(pos, &mut frame);
        let Some(len) = frame_len(frame, to - pos) else { return };
        payload.resize(len, 0);
        data(pos + FRAME, &mut payload);
        each(pos, &payload);
        pos += entry_bytes(len);
    }
}

/// The payload length an entry's frame (`len u32`, `!len u32`) announces, if the frame is sound
/// and the whole entry fits in the `room` bytes published after its position.
#[inline]
pub fn frame_len(frame: [u8; FRAME as usize], room: u64) -> Option<usize> {
    let len = u32::from_le_bytes(frame[..4].try_into().expect("4 bytes"));
    let check = u32::from_le_bytes(frame[4..].try_into().expect("4 bytes"));
    (check == !len && entry_bytes(len as usize) <= room && len as usize <= MAX_ENTRY).then_some(len as usize)
}

#[cfg(test)]
mod tests;
