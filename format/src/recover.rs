//! Completing a trace from its journal (`journal`): what a process recorded and its writer
//! had not written when the process ended. Layout and rules: docs/format.md, "The journal".

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::journal::*;
use crate::raw::{Msg, RawEvent};
use crate::{PyCode, PyFrame, Record};

fn u32_at(b: &[u8], o: u64) -> u32 {
    u32::from_le_bytes(b[o as usize..o as usize + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], o: u64) -> u64 {
    u64::from_le_bytes(b[o as usize..o as usize + 8].try_into().expect("8 bytes"))
}

/// The proposal in a journal header `h`: the event count and ring positions the trace will have
/// once the write in progress completes.
fn proposal(h: &[u8]) -> (u64, Vec<u64>) {
    (u64_at(h, header::EVENTS_PROPOSED), (0..RINGS).map(|i| u64_at(h, header::PROPOSED + 8 * i as u64)).collect())
}

/// A journal as a reader finds it.
#[derive(Clone)]
pub struct Journal {
    pub pid: u32,
    events_proposed: u64,
    proposed: Vec<u64>,
    committed: Vec<u64>,
    /// Entries from each ring's committed position on: (ring, position, entry).
    entries: Vec<(usize, u64, Entry)>,
    dict: Vec<(u32, u32, u64, u64)>,
    /// Malformed entries met (the rest of that ring is not read).
    pub damaged: bool,
}

impl Journal {
    /// Reads the journal file at `path`.
    pub fn read(path: &Path) -> io::Result<Journal> {
        let f = File::open(path)?;
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()));
        let mut h = vec![0u8; HEADER_BYTES as usize];
        f.read_exact_at(&mut h, 0).map_err(|_| bad("not a journal (too short)"))?;
        if &h[..8] != MAGIC {
            return Err(bad("not a gpumemtrace journal"));
        }
        if u32_at(&h, header::VERSION) != VERSION
            || u32_at(&h, header::RINGS) as usize != RINGS
            || u64_at(&h, header::RING_BYTES) != RING_BYTES
        {
            return Err(bad("a journal of another version"));
        }
        let pid = u32_at(&h, header::PID);
        let (events_proposed, proposed) = proposal(&h);
        let mut committed = Vec::with_capacity(RINGS);
        let mut entries = Vec::new();
        let mut damaged = false;
        let mut control = vec![0u8; 256];
        for i in 0..RINGS {
            let base = ring_offset(i);
            f.read_exact_at(&mut control, base).map_err(|_| bad("cut short"))?;
            let (head, done) = (u64_at(&control, ring::HEAD), u64_at(&control, ring::COMMITTED));
            committed.push(done);
            if head <= done {
                continue;
            }
            if head - done > RING_BYTES {
                damaged = true;
                continue;
            }
            let data = |pos: u64, buf: &mut [u8]| {
                pieces(pos, buf.len(), |at, r| {
                    if f.read_exact_at(&mut buf[r.clone()], base + RING_CONTROL + at).is_err() {
                        buf[r].fill(0);
                    }
                })
            };
            let mut end = done;
            for_each_entry(&data, done, head, |pos, payload| match decode(payload) {
                Ok(m) => {
                    entries.push((i, pos, m));
                    end = pos + entry_bytes(payload.len());
                }
                Err(_) => damaged = true,
            });
            if end < head {
                damaged = true;
            }
        }
        let n = u64_at(&h, header::DICT_LEN).min(DICT_ENTRIES);
        let mut d = vec![0u8; (n * DICT_ENTRY_BYTES) as usize];
        f.read_exact_at(&mut d, dict_offset()).map_err(|_| bad("dictionary cut short"))?;
        let dict = d
            .chunks_exact(DICT_ENTRY_BYTES as usize)
            .map(|e| (u32_at(e, 0), u32_at(e, 4), u64_at(e, 8), u64_at(e, 16)))
            .collect();
        Ok(Journal { pid, events_proposed, proposed, committed, entries, dict, damaged })
    }

    /// The writer's marks as the journal at `path` holds them now: the proposed event count,
    /// the proposed and the committed positions (what [`Journal::read`] took them to be).
    fn marks(path: &Path) -> io::Result<(u64, Vec<u64>, Vec<u64>)> {
        let f = File::open(path)?;
        let mut h = vec![0u8; HEADER_BYTES as usize];
        f.read_exact_at(&mut h, 0)?;
        let (events_proposed, proposed) = proposal(&h);
        let mut word = [0u8; 8];
        let mut committed = Vec::with_capacity(RINGS);
        for i in 0..RINGS {
            f.read_exact_at(&mut word, ring_offset(i) + ring::COMMITTED)?;
            committed.push(u64_at(&word, 0));
        }
        Ok((events_proposed, proposed, committed))
    }

    /// Entries not yet committed to the trace.
    pub fn pending(&self) -> usize {
        self.entries.len()
    }
}

/// Completes a trace from its journal: feed it every record read from the trace
/// ([`Recovery::observe`]), then [`Recovery::finish`] gives the records the trace lacks.
#[derive(Clone)]
pub struct Recovery {
    journal: Journal,
    path: PathBuf,
    events: u64,
    start_ns: u64,
    stacks: HashSet<u32>,
    py_stacks: HashSet<u32>,
    py_codes: HashSet<u32>,
    threads: HashSet<u32>,
    max_id: [u32; 3],
    /// Address ranges of the trace's modules, to say when recovered frames lie in none.
    modules: Vec<(u64, u64)>,
}

impl Recovery {
    /// The recovery for the trace at `trace`, if a journal lies beside it.
    pub fn beside(trace: &Path) -> io::Result<Option<Recovery>> {
        let path = path_for(trace);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(_) => return Ok(None), // never read a FIFO or device named like a journal
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        }
        let journal = Journal::read(&path)?;
        Ok(Some(Recovery::new(journal, path)))
    }

    pub fn new(journal: Journal, path: PathBuf) -> Recovery {
        Recovery {
            journal,
            path,
            events: 0,
            start_ns: 0,
            stacks: HashSet::new(),
            py_stacks: HashSet::new(),
            py_codes: HashSet::new(),
            threads: HashSet::new(),
            max_id: [0; 3],
            modules: Vec::new(),
        }
    }

    /// Whether the journal still holds the writer's marks it held when it was read: then no
    /// write to the trace began or ended since, and a trace read meanwhile is the one these
    /// marks describe. A reader of a trace that is still being written (`live`) reads the
    /// journal, then the trace, then asks this: otherwise entries the writer wrote to the trace
    /// after the journal was read would be recovered too, and counted twice. `false` when the
    /// journal is gone (its process completed the trace and removed it).
    pub fn still_current(&self) -> bool {
        let j = &self.journal;
        Journal::marks(&self.path).is_ok_and(|(n, p, c)| n == j.events_proposed && p == j.proposed && c == j.committed)
    }

    pub fn observe(&mut self, rec: &Record) {
        match rec {
            Record::Process(p) => self.start_ns = p.start_monotonic_ns,
            Record::Event(_) => self.events += 1,
            Record::Stack(s) => {
                self.stacks.insert(s.id);
                self.max_id[0] = self.max_id[0].max(s.id);
            }
            Record::PyStack(s) => {
                self.py_stacks.insert(s.id);
                self.max_id[1] = self.max_id[1].max(s.id);
            }
            Record::PyCode(c) => {
                self.py_codes.insert(c.id);
                self.max_id[2] = self.max_id[2].max(c.id);
            }
            Record::Thread(t) => {
                self.threads.insert(t.tid);
            }
            Record::Module(m) => self.modules.push((m.start, m.end)),
            _ => {}
        }
    }

    /// The records the trace lacks, in call order, then a notice saying what was recovered.
    pub fn finish(self) -> Vec<Record> {
        let Recovery { journal, path, events, start_ns, stacks, py_stacks, py_codes, mut threads, max_id, modules } = self;
        // The write in progress when the process ended completed if the trace has its events.
        let start = if events >= journal.events_proposed { &journal.proposed } else { &journal.committed };
        let fresh = journal.entries.iter().filter(|(r, pos, _)| *pos >= start[*r]).map(|(_, _, e)| e);
        let mut msgs = Vec::new();
        let mut codes = Vec::new();
        for e in fresh {
            match e {
                Entry::Msg(m) => msgs.push(m),
                Entry::Codes(c) => codes.extend(c),
            }
        }
        msgs.sort_by_key(|m| m.seq());
        let mut ids = Ids { last: max_id, ..Ids::default() };
        for &(kind, id, key, sig) in &journal.dict {
            // New ids come after every id the writer gave, written or not.
            if let Some(slot) = [dict::STACK, dict::PY_STACK, dict::PY_CODE].iter().position(|&k| k == kind) {
                ids.last[slot] = ids.last[slot].max(id);
            }
            // A dictionary id counts only if its record reached the trace.
            match kind {
                dict::STACK if stacks.contains(&id) => drop(ids.stacks.insert(key, id)),
                dict::PY_STACK if py_stacks.contains(&id) => drop(ids.py_stacks.insert(key, id)),
                dict::PY_CODE if py_codes.contains(&id) => drop(ids.codes.insert((key, sig), id)),
                _ => {}
            }
        }
        for c in codes {
            if !ids.codes.contains_key(&(c.code, c.sig)) {
                let id = ids.next(2);
                ids.codes.insert((c.code, c.sig), id);
                ids.out.push(Record::PyCode(c.clone().into_record(id)));
            }
        }
        let (mut n_events, mut n_phases) = (0u64, 0u64);
        for m in msgs {
            match m {
                Msg::Phase(p) => {
                    n_phases += 1;
                    ids.out.push(Record::Phase(crate::Phase {
                        time_ns: p.time_ns.saturating_sub(start_ns),
                        tid: p.tid,
                        op: p.op,
                        name: p.name.clone(),
                    }));
                }
                Msg::Event(e) => {
                    n_events += 1;
                    if threads.insert(e.tid) {
                        ids.out.push(Record::Thread(crate::Thread {
                            tid: e.tid,
                            name: e.thread_name.clone().unwrap_or_default(),
                            python: e.py_tstate,
                        }));
                    }
                    let pystack = ids.py_stack(e);
                    let stack = ids.stack(e);
                    ids.out.push(Record::Event(crate::Event {
                        api: e.api,
                        time_ns: e.time_ns.saturating_sub(start_ns),
                        tid: e.tid,
                        stack,
                        result: e.result,
                        device: e.device,
                        addr: e.addr,
                        size: e.size,
                        stream: e.stream,
                        extra: e.extra,
                        pystack,
                        flags: e.flags,
                        total_allocated: e.total_allocated,
                        total_reserved: e.total_reserved,
                    }));
                }
            }
        }
        let mut notice = format!(
            "{n_events} events and {n_phases} phase records recovered from {}: the process ended before its writer wrote them",
            path.display()
        );
        if journal.damaged {
            notice.push_str(" (part of the journal was damaged and could not be read)");
        }
        // The writer names a library as soon as it is loaded; one loaded just before the end
        // (or allocating in its constructor) may not have made it.
        let outside = ids
            .out
            .iter()
            .filter_map(|r| match r {
                Record::Stack(s) => Some(s.frames.iter().filter(|&&a| !modules.iter().any(|&(lo, hi)| a >= lo && a < hi)).count()),
                _ => None,
            })
            .sum::<usize>();
        if outside > 0 {
            notice.push_str(&format!(
                "; {outside} frames of the recovered stacks lie in no module the trace names (a library loaded just before the end?)"
            ));
        }
        ids.out.push(Record::Notice(notice));
        ids.out
    }
}

/// Record ids for keys during a recovery, and the records it makes.
#[derive(Default)]
struct Ids {
    stacks: HashMap<u64, u32>,
    py_stacks: HashMap<u64, u32>,
    codes: HashMap<(u64, u64), u32>,
    /// The last id given, for stacks, Python stacks and code objects.
    last: [u32; 3],
    out: Vec<Record>,
}

impl Ids {
    fn next(&mut self, slot: usize) -> u32 {
        self.last[slot] += 1;
        self.last[slot]
    }

    /// The event's native stack: the id its key has, else a new Stack record from the frames
    /// its thread's first event with that key carries; 0 when neither is there.
    fn stack(&mut self, e: &RawEvent) -> u32 {
        if e.frames.key == 0 {
            return 0;
        }
        if let Some(&id) = self.stacks.get(&e.frames.key) {
            return id;
        }
        if e.frames.frames.is_empty() {
            return 0;
        }
        let id = self.next(0);
        self.stacks.insert(e.frames.key, id);
        self.out.push(Record::Stack(crate::Stack { id, frames: e.frames.frames.clone() }));
        id
    }

    /// The event's Python stack, likewise; a code object never described gets a nameless record.
    fn py_stack(&mut self, e: &RawEvent) -> u32 {
        if e.py_key == 0 {
            return 0;
        }
        if let Some(&id) = self.py_stacks.get(&e.py_key) {
            return id;
        }
        let Some(py) = e.py.as_ref().filter(|py| !py.frames.is_empty()) else { return 0 };
        let mut frames = Vec::with_capacity(py.frames.len());
        for f in &py.frames {
            let code = match self.codes.get(&(f.code, f.sig)) {
                Some(&id) => id,
                None => {
                    let id = self.next(2);
                    self.codes.insert((f.code, f.sig), id);
                    self.out.push(Record::PyCode(PyCode::unknown(id)));
                    id
                }
            };
            frames.push(PyFrame { code, instr_offset: f.instr, flags: f.flags });
        }
        let id = self.next(1);
        self.py_stacks.insert(e.py_key, id);
        self.out.push(Record::PyStack(crate::PyStack { id, frames }));
        id
    }
}

/// A trace's records followed by what its journal recovers: a [`crate::Reader`] for traces
/// whose process may have died before finishing them. A read error (a cut last record) comes
/// after the recovered records.
pub struct Recovering<R: io::Read> {
    reader: crate::Reader<R>,
    recovery: Option<Recovery>,
    tail: Option<std::vec::IntoIter<Record>>,
    error: Option<crate::ReadError>,
}

impl<R: io::Read> Recovering<R> {
    pub fn new(reader: crate::Reader<R>, recovery: Option<Recovery>) -> Recovering<R> {
        Recovering { reader, recovery, tail: None, error: None }
    }

    /// Bytes of the trace read so far.
    pub fn offset(&self) -> u64 {
        self.reader.offset()
    }

    /// The trace's damaged frames left out so far (`Reader::damaged`).
    pub fn damaged(&self) -> &[(u64, String)] {
        self.reader.damaged()
    }

    pub fn next_record(&mut self) -> Result<Option<Record>, crate::ReadError> {
        if let Some(tail) = &mut self.tail {
            return match tail.next() {
                Some(r) => Ok(Some(r)),
                None => self.error.take().map_or(Ok(None), Err),
            };
        }
        let r = self.reader.next_record();
        match (&r, &mut self.recovery) {
            (Ok(Some(rec)), Some(rc)) => rc.observe(rec),
            (Ok(Some(_)), None) => {}
            (_, None) => {}
            (end, Some(_)) => {
                if let Err(e) = r {
                    self.error = Some(e);
                } else {
                    debug_assert!(matches!(end, Ok(None)));
                }
                let rc = self.recovery.take().expect("checked");
                self.tail = Some(rc.finish().into_iter());
                return self.next_record();
            }
        }
        r
    }
}

impl<R: io::Read> Iterator for Recovering<R> {
    type Item = Result<Record, crate::ReadError>;
    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

