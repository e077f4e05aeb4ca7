//! Encoding records (the preload library's side).

use crate::header::tag;
use crate::records::*;

/// Event timestamps are stored as signed deltas from the previous event, so the encoder keeps
/// that one piece of state.
pub struct Encoder {
    prev: Prev,
    payload: Vec<u8>,
    /// An event's payload while it is built (kept here: not cleared for every event).
    event: [u8; 256],
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder { prev: Prev::default(), payload: Vec::new(), event: [0; 256] }
    }
}

/// The previous event's fields that the next one is stored relative to.
#[derive(Clone, Copy, Default)]
pub(crate) struct Prev {
    pub(crate) time_ns: u64,
    pub(crate) tid: u32,
    pub(crate) addr: u64,
}

/// Where an encoder's event deltas stand: what another encoder needs to go on from the same
/// point of the stream (the preload library encodes events on one thread or another, batch by
/// batch, in order).
#[derive(Clone, Copy, Default)]
pub struct EventState(Prev);

impl EventState {
    /// The state after encoding `e`.
    pub fn after(e: &Event) -> EventState {
        EventState(Prev { time_ns: e.time_ns, tid: e.tid, addr: e.addr })
    }

    /// Appends a Sync record of this state to `out` (docs/format.md): written at the start of
    /// each compressed frame, so that a reader that lost the frame before still decodes the
    /// deltas of the events after it. Readers take it in and hand out no record for it.
    pub fn sync(&self, out: &mut Vec<u8>) {
        let mut p = Vec::with_capacity(32);
        put_uv(&mut p, self.0.time_ns);
        put_uv(&mut p, self.0.tid as u64);
        put_uv(&mut p, self.0.addr);
        out.push(tag::SYNC);
        put_uv(out, p.len() as u64);
        out.extend_from_slice(&p);
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder::default()
    }

    /// Where the event deltas stand now.
    pub fn event_state(&self) -> EventState {
        EventState(self.prev)
    }

    /// Goes on from `s`: the next event is encoded as the one after the event `s` was taken at.
    pub fn set_event_state(&mut self, s: EventState) {
        self.prev = s.0;
    }

    /// Appends `rec` to `out`.
    pub fn encode(&mut self, rec: &Record, out: &mut Vec<u8>) {
        if let Record::Event(e) = rec {
            // Nearly every record is an event: written through a fixed buffer, not the
            // general path's growable payload (a third of the writer thread's time went there).
            return self.encode_event(e, out);
        }
        self.encode_general(rec, out);
    }

    /// Any record through a growable payload (events too in tests: the reference that
    /// `encode_event` must match byte for byte).
    fn encode_general(&mut self, rec: &Record, out: &mut Vec<u8>) {
        let rec: &Record = &crate::fitted(rec);
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
            #[cfg(not(test))]
            Record::Event(_) => unreachable!("events take `encode_event`"),
            // The general path's event, kept to show that `encode_event` writes the same bytes.
            #[cfg(test)]
            Record::Event(e) => {
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
            Record::AggStart(a) => {
                put_uv(p, a.seq);
                put_uv(p, a.time_ns);
                put_uv(p, a.events);
                p.push(a.final_ as u8);
                put_uv(p, a.python_exit_ns.map_or(0, |t| t + 1));
                tag::AGG_START
            }
            Record::AggSite(a) => {
                put_uv(p, a.seq);
                put_sv(p, a.device as i64);
                p.push(a.kind as u8);
                for v in [a.stack as u64, a.pystack as u64, a.allocations, a.allocated_bytes, a.frees] {
                    put_uv(p, v);
                }
                for v in [a.live_bytes, a.live_count, a.peak_bytes, a.peak_count, a.exit_bytes, a.exit_count, a.tid as u64] {
                    put_uv(p, v);
                }
                tag::AGG_SITE
            }
            Record::AggPeak(a) => {
                put_uv(p, a.seq);
                put_sv(p, a.device as i64);
                p.push(a.kind.map_or(0, |k| k as u8));
                put_uv(p, a.bytes);
                put_uv(p, a.time_ns);
                tag::AGG_PEAK
            }
            Record::AggPhase(a) => {
                put_uv(p, a.seq);
                put_sv(p, a.device as i64);
                p.push(a.kind as u8);
                put_str(p, &a.name);
                for v in [a.allocations, a.allocated_bytes, a.failed, a.peak_bytes] {
                    put_uv(p, v);
                }
                tag::AGG_PHASE
            }
            Record::AggEnd(seq) => {
                put_uv(p, *seq);
                tag::AGG_END
            }
            Record::AggFailure(a) => {
                put_sv(p, a.device as i64);
                put_uv(p, a.live_bytes);
                tag::AGG_FAILURE
            }
            Record::Unknown(t) => *t,
        };
        if p.len() as u64 > crate::MAX_RECORD_LEN {
            // Cannot happen after `fitted`; should it, a notice stands in for the record rather
            // than a length every reader rejects (which would end the trace there).
            p.clear();
            put_str(p, &format!("a record (tag {t:#04x}) over the format's bound was left out"));
            out.push(crate::tag::NOTICE);
        } else {
            out.push(t);
        }
        put_uv(out, p.len() as u64);
        out.extend_from_slice(p);
    }
}

impl Encoder {
    /// Appends an event record: tag, length, payload. Deltas: times grow slowly, one thread
    /// calls many times in a row, and a free usually follows its allocation closely (often at
    /// the same address).
    #[inline]
    pub fn encode_event(&mut self, e: &Event, out: &mut Vec<u8>) {
        // The payload starts at 3: its tag and length go in front of it, and the record leaves
        // in one copy.
        let mut p = Fixed { b: &mut self.event, n: 3 };
        p.uv(e.api as u64);
        p.sv(e.time_ns.wrapping_sub(self.prev.time_ns) as i64);
        p.sv((e.tid as i64).wrapping_sub(self.prev.tid as i64));
        p.uv(e.stack as u64);
        p.uv(e.result as u64);
        p.sv(e.device as i64);
        p.sv(e.addr.wrapping_sub(self.prev.addr) as i64);
        self.prev = Prev { time_ns: e.time_ns, tid: e.tid, addr: e.addr };
        p.uv(e.size);
        p.uv(e.stream);
        p.uv(e.extra);
        p.uv(e.pystack as u64);
        // Fields added in version 3, written only when one is set: absent reads as 0 (the last
        // byte of a varint is zero only for the value 0, so trailing zero bytes are exactly the
        // trailing zero fields).
        if e.flags != 0 || e.total_allocated != 0 || e.total_reserved != 0 {
            let base = p.n;
            p.uv(e.flags as u64);
            p.uv(e.total_allocated);
            p.uv(e.total_reserved);
            while p.n > base && p.b[(p.n - 1) & 0xff] == 0 {
                p.n -= 1;
            }
        }
        // At most 14 varints of 10 bytes: the length takes one byte or two.
        let len = p.n - 3;
        let from = if len < 0x80 {
            p.b[2] = len as u8;
            1
        } else {
            p.b[1] = (len as u8) | 0x80;
            p.b[2] = (len >> 7) as u8;
            0
        };
        p.b[from] = tag::EVENT;
        out.extend_from_slice(&p.b[from..p.n]);
    }
}

/// An event's payload being built: 14 varints of at most 10 bytes each. The buffer is 256
/// bytes and indexed modulo 256, so no store needs a bounds check (the payload never comes near
/// 256 bytes, so the modulo never changes an index).
struct Fixed<'a> {
    b: &'a mut [u8; 256],
    n: usize,
}

impl Fixed<'_> {
    #[inline(always)]
    fn uv(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.b[self.n & 0xff] = (v as u8) | 0x80;
            self.n += 1;
            v >>= 7;
        }
        self.b[self.n & 0xff] = v as u8;
        self.n += 1;
    }

    #[inline(always)]
    fn sv(&mut self, v: i64) {
        self.uv(((v << 1) ^ (v >> 63)) as u64);
    }
}

pub(crate) fn put_uv(out: &mut Vec<u8>, mut v: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift): a failure is reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// A value of a random bit width, often zero: varints of every length.
        fn field(&mut self) -> u64 {
            let r = self.next();
            if r % 4 == 0 {
                0
            } else {
                self.next() >> ((r >> 8) % 64)
            }
        }
    }

    #[test]
    fn the_event_fast_path_writes_the_same_bytes_as_the_general_path() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut fast, mut general) = (Encoder::new(), Encoder::new());
        let (mut a, mut b) = (crate::header::header().to_vec(), Vec::new());
        let mut events = Vec::new();
        for i in 0..200_000 {
            let mut f = || rng.field();
            let e = Event {
                api: f() as u32,
                time_ns: f(),
                tid: f() as u32,
                stack: f() as u32,
                result: f() as u32,
                device: f() as i32,
                addr: f(),
                size: f(),
                stream: f(),
                extra: f(),
                pystack: f() as u32,
                flags: f() as u32,
                total_allocated: f(),
                total_reserved: f(),
            };
            // Now and then every field at its widest: the longest payload.
            let m = u64::MAX;
            let (m32, i32m) = (u32::MAX, i32::MIN);
            let widest = Event { api: m32, time_ns: m, tid: m32, stack: m32, result: m32, device: i32m, addr: m, size: m, stream: m, extra: m, pystack: m32, flags: m32, total_allocated: m, total_reserved: m };
            let e = if i % 1000 == 999 { widest } else { e };
            let (from_a, from_b) = (a.len(), b.len());
            fast.encode(&Record::Event(e.clone()), &mut a);
            general.encode_general(&Record::Event(e.clone()), &mut b);
            assert_eq!(a[from_a..], b[from_b..], "event {i}: {e:?}");
            events.push(e);
        }
        let back: Vec<Record> = crate::Reader::new(&a[..]).unwrap().map(|r| r.unwrap()).collect();
        assert!(back.into_iter().eq(events.into_iter().map(Record::Event)));
    }
}
