//! Decoding records (the CLI's side).

use std::fmt;
use std::io::{self, Read};

use crate::compress::Body;
use crate::encode::Prev;
use crate::header::{flags, tag, HEADER_LEN, MAGIC, MAX_FRAMES, MAX_RECORD_LEN, MIN_VERSION, VERSION};
use crate::records::*;

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

    /// Byte offset just past the last record returned. In a compressed trace records have no
    /// position of their own in the file: there it is how far the file has been read.
    pub fn offset(&self) -> u64 {
        self.in_file(self.offset)
    }

    /// `stream`, a position in the records, as a position in the file.
    fn in_file(&self, stream: u64) -> u64 {
        self.inner.consumed().map_or(stream, |n| HEADER_LEN as u64 + n)
    }

    /// The next record; `Ok(None)` at a clean end of file.
    pub fn next_record(&mut self) -> Result<Option<Record>, ReadError> {
        loop {
            match self.next_any() {
                Ok(Some(Next::Sync)) => {}
                Ok(Some(Next::Record(r))) => return Ok(Some(r)),
                Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    }

    /// The compressed frames left out of what was read so far because they were damaged: each
    /// the byte its frame started at and why.
    pub fn damaged(&self) -> &[(u64, String)] {
        self.inner.damaged()
    }

    /// The next record, or a Sync record taken in.
    fn next_any(&mut self) -> Result<Option<Next>, ReadError> {
        if self.done {
            return Ok(None);
        }
        let start = self.offset;
        // Tag and length (a varint of at most 10 bytes), parsed from the buffer.
        if let Err(e) = self.fill(11) {
            return Err(self.fail(read_error(e, start)));
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
            return Err(self.fail(read_error(e, start)));
        }
        if self.end - self.pos < total {
            return Err(self.fail(ReadError::Truncated { offset: start }));
        }
        let payload = &self.buf[self.pos + header..self.pos + total];
        let rec = if tag == crate::header::tag::SYNC {
            sync(payload).map(|p| {
                self.prev = p;
                Next::Sync
            })
        } else {
            decode(tag, payload, self.version, &mut self.prev).map(Next::Record)
        };
        let rec = match rec {
            Ok(r) => r,
            Err(what) => return Err(self.fail(ReadError::Corrupt { offset: start, what })),
        };
        self.pos += total;
        self.offset = start + total as u64;
        Ok(Some(rec))
    }

    /// Makes at least `want` unread bytes available in `buf[pos..end]`, or all that remain.
    #[inline(always)]
    fn fill(&mut self, want: usize) -> io::Result<()> {
        if self.end - self.pos >= want || self.eof {
            return Ok(());
        }
        self.refill(want)
    }

    #[inline(never)]
    fn refill(&mut self, want: usize) -> io::Result<()> {
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

    /// Ends reading with `e`, its offset a position in the file (see [`Reader::offset`]).
    fn fail(&mut self, e: ReadError) -> ReadError {
        self.done = true;
        match e {
            ReadError::Truncated { offset } => ReadError::Truncated { offset: self.in_file(offset) },
            ReadError::Corrupt { offset, what } => ReadError::Corrupt { offset: self.in_file(offset), what },
            e => e,
        }
    }
}

/// What `Reader::next_any` read.
enum Next {
    Record(Record),
    Sync,
}

/// A Sync record's event state (see `EventState::sync`).
fn sync(b: &[u8]) -> Result<Prev, String> {
    let mut p = Payload { b, pos: 0 };
    Ok(Prev { time_ns: p.uv()?, tid: p.u32("thread id")?, addr: p.uv()? })
}

/// A body that could not be read at `offset`: corrupt where the body's decoder refused its bytes
/// (`compress::Body`), else the file's own error.
fn read_error(e: io::Error, offset: u64) -> ReadError {
    if e.kind() == io::ErrorKind::InvalidData {
        ReadError::Corrupt { offset, what: e.to_string() }
    } else {
        ReadError::Io(e)
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

#[cold]
#[inline(never)]
fn too_wide(what: &str, v: u64) -> String {
    format!("{what} {v} does not fit in 32 bits")
}

/// A cursor over one record's payload.
struct Payload<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Payload<'a> {
    /// Most numbers fit in one byte: that case is inlined at every field, the rest is not.
    #[inline(always)]
    fn uv(&mut self) -> Result<u64, String> {
        if let Some(&b) = self.b.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(b as u64);
            }
        }
        self.uv_long()
    }
    #[inline(never)]
    fn uv_long(&mut self) -> Result<u64, String> {
        // Up to 9 bytes in one go when the payload holds them (a number of 10 bytes, or one at
        // the payload's end, takes the byte-by-byte way below).
        if let Some(w) = self.b.get(self.pos..self.pos + 9) {
            let mut v = 0u64;
            for (i, &b) in w.iter().enumerate() {
                v |= ((b & 0x7f) as u64) << (7 * i);
                if b & 0x80 == 0 {
                    self.pos += i + 1;
                    return Ok(v);
                }
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
    #[inline(always)]
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let v = self.uv()?;
        match u32::try_from(v) {
            Ok(v) => Ok(v),
            Err(_) => Err(too_wide(what, v)),
        }
    }
    #[inline(always)]
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
        tag::AGG_START => Record::AggStart(AggStart {
            seq: p.uv()?,
            time_ns: p.uv()?,
            events: p.uv()?,
            final_: p.byte()? != 0,
            python_exit_ns: p.uv()?.checked_sub(1),
        }),
        tag::AGG_SITE => {
            let seq = p.uv()?;
            let device = p.sv()?;
            let device = i32::try_from(device).map_err(|_| format!("device {device} out of range"))?;
            let k = p.byte()?;
            let kind = MemKind::from_u8(k).ok_or_else(|| format!("unknown memory kind {k}"))?;
            Record::AggSite(AggSite {
                seq,
                device,
                kind,
                stack: p.u32("stack id")?,
                pystack: p.u32("python stack id")?,
                allocations: p.uv()?,
                allocated_bytes: p.uv()?,
                frees: p.uv()?,
                live_bytes: p.uv()?,
                live_count: p.uv()?,
                peak_bytes: p.uv()?,
                peak_count: p.uv()?,
                exit_bytes: p.uv()?,
                exit_count: p.uv()?,
                tid: p.u32("thread id")?,
            })
        }
        tag::AGG_PEAK => {
            let seq = p.uv()?;
            let device = p.sv()?;
            let device = i32::try_from(device).map_err(|_| format!("device {device} out of range"))?;
            let kind = match p.byte()? {
                0 => None,
                k => Some(MemKind::from_u8(k).ok_or_else(|| format!("unknown memory kind {k}"))?),
            };
            Record::AggPeak(AggPeak { seq, device, kind, bytes: p.uv()?, time_ns: p.uv()? })
        }
        tag::AGG_PHASE => {
            let seq = p.uv()?;
            let device = p.sv()?;
            let device = i32::try_from(device).map_err(|_| format!("device {device} out of range"))?;
            let k = p.byte()?;
            let kind = MemKind::from_u8(k).ok_or_else(|| format!("unknown memory kind {k}"))?;
            Record::AggPhase(AggPhase {
                seq,
                device,
                kind,
                name: p.string()?,
                allocations: p.uv()?,
                allocated_bytes: p.uv()?,
                failed: p.uv()?,
                peak_bytes: p.uv()?,
            })
        }
        tag::AGG_END => Record::AggEnd(p.uv()?),
        tag::AGG_FAILURE => {
            let device = p.sv()?;
            let device = i32::try_from(device).map_err(|_| format!("device {device} out of range"))?;
            Record::AggFailure(AggFailure { device, live_bytes: p.uv()? })
        }
        other => return Ok(Record::Unknown(other)),
    };
    // Trailing bytes are allowed: a newer writer may append fields to a record.
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers() -> Vec<u64> {
        let mut v: Vec<u64> = (0..64).flat_map(|k| [(1u64 << k) - 1, 1u64 << k, (1u64 << k) + 1]).collect();
        v.push(u64::MAX);
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(x >> (x % 64));
        }
        v
    }

    /// Every number reads back whatever follows it: the payload's end right after it (the
    /// byte-by-byte way), a few bytes (the same), or enough for the whole-window way.
    #[test]
    fn a_number_reads_back_wherever_it_ends_in_its_payload() {
        for n in numbers() {
            for tail in [0usize, 1, 5, 9, 16] {
                let mut b = Vec::new();
                crate::encode::put_uv(&mut b, n);
                let len = b.len();
                b.extend(std::iter::repeat_n(0xff, tail));
                let mut p = Payload { b: &b, pos: 0 };
                assert_eq!(p.uv(), Ok(n), "{n} with {tail} bytes after it");
                assert_eq!(p.pos, len, "{n}: the cursor moves past the number only");
            }
        }
    }

    #[test]
    fn a_number_cut_by_its_payloads_end_or_over_ten_bytes_is_an_error() {
        for n in numbers().into_iter().filter(|&n| n >= 0x80) {
            let mut b = Vec::new();
            crate::encode::put_uv(&mut b, n);
            b.pop();
            assert_eq!(Payload { b: &b, pos: 0 }.uv(), Err("record payload ends inside a number".into()), "{n}");
        }
        for len in [11usize, 12, 20] {
            let mut b = vec![0x80u8; len];
            b[len - 1] = 0x01;
            assert_eq!(Payload { b: &b, pos: 0 }.uv(), Err("number is longer than 10 bytes".into()), "{len} bytes");
        }
    }

    #[test]
    fn a_32_bit_field_over_32_bits_names_the_field() {
        let mut b = Vec::new();
        crate::encode::put_uv(&mut b, 1 << 32);
        assert_eq!(Payload { b: &b, pos: 0 }.u32("stack id"), Err("stack id 4294967296 does not fit in 32 bits".into()));
        let mut b = Vec::new();
        crate::encode::put_uv(&mut b, u32::MAX as u64);
        assert_eq!(Payload { b: &b, pos: 0 }.u32("stack id"), Ok(u32::MAX));
    }
}
