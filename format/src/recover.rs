//! Completing a trace from its journal (`journal`): what a process recorded and its writer
//! had not written when the process ended. Layout and rules: docs/format.md, "The journal".

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::journal::*;
use crate::raw::Msg;
use crate::{PyCode, PyFrame, Record};

/// A journal as a reader finds it.
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
        let u32_at = |b: &[u8], o: u64| u32::from_le_bytes(b[o as usize..o as usize + 4].try_into().expect("4 bytes"));
        let u64_at = |b: &[u8], o: u64| u64::from_le_bytes(b[o as usize..o as usize + 8].try_into().expect("8 bytes"));
        if u32_at(&h, header::VERSION) != VERSION
            || u32_at(&h, header::RINGS) as usize != RINGS
            || u64_at(&h, header::RING_BYTES) != RING_BYTES
        {
            return Err(bad("a journal of another version"));
        }
        let pid = u32_at(&h, header::PID);
        let events_proposed = u64_at(&h, header::EVENTS_PROPOSED);
        let proposed: Vec<u64> = (0..RINGS).map(|i| u64_at(&h, header::PROPOSED + 8 * i as u64)).collect();
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
                // The entry may wrap around the ring's end.
                let mut off = 0;
                while off < buf.len() {
                    let at = (pos + off as u64) % RING_BYTES;
                    let n = ((RING_BYTES - at) as usize).min(buf.len() - off);
                    if f.read_exact_at(&mut buf[off..off + n], base + RING_CONTROL + at).is_err() {
                        buf[off..off + n].fill(0);
                    }
                    off += n;
                }
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

    /// Entries not yet committed to the trace.
    pub fn pending(&self) -> usize {
        self.entries.len()
    }
}

/// Completes a trace from its journal: feed it every record read from the trace
/// ([`Recovery::observe`]), then [`Recovery::finish`] gives the records the trace lacks.
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
        }
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
            _ => {}
        }
    }

    /// The records the trace lacks, in call order, then a notice saying what was recovered.
    pub fn finish(self) -> Vec<Record> {
        let Recovery { journal, path, events, start_ns, stacks, py_stacks, py_codes, mut threads, mut max_id } = self;
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
        for &d in &journal.dict {
            let slot = match d.0 {
                dict::STACK => 0,
                dict::PY_STACK => 1,
                dict::PY_CODE => 2,
                _ => continue,
            };
            max_id[slot] = max_id[slot].max(d.1);
        }
        // A dictionary id counts only if its record reached the trace.
        let mut stack_ids: HashMap<u64, u32> = HashMap::new();
        let mut py_stack_ids: HashMap<u64, u32> = HashMap::new();
        let mut code_ids: HashMap<(u64, u64), u32> = HashMap::new();
        for &(kind, id, key, sig) in &journal.dict {
            match kind {
                dict::STACK if stacks.contains(&id) => drop(stack_ids.insert(key, id)),
                dict::PY_STACK if py_stacks.contains(&id) => drop(py_stack_ids.insert(key, id)),
                dict::PY_CODE if py_codes.contains(&id) => drop(code_ids.insert((key, sig), id)),
                _ => {}
            }
        }
        let mut out = Vec::new();
        for c in codes {
            if code_ids.contains_key(&(c.code, c.sig)) {
                continue;
            }
            max_id[2] += 1;
            code_ids.insert((c.code, c.sig), max_id[2]);
            out.push(Record::PyCode(PyCode {
                id: max_id[2],
                name: c.name.clone(),
                qualname: c.qualname.clone(),
                filename: c.filename.clone(),
                firstlineno: c.firstlineno,
                linetable_format: c.linetable_format,
                linetable: c.linetable.clone(),
            }));
        }
        let (mut n_events, mut n_phases) = (0u64, 0u64);
        for m in msgs {
            match m {
                Msg::Phase(p) => {
                    n_phases += 1;
                    out.push(Record::Phase(crate::Phase {
                        time_ns: p.time_ns.saturating_sub(start_ns),
                        tid: p.tid,
                        op: p.op,
                        name: p.name.clone(),
                    }));
                }
                Msg::Event(e) => {
                    n_events += 1;
                    if threads.insert(e.tid) {
                        out.push(Record::Thread(crate::Thread {
                            tid: e.tid,
                            name: e.thread_name.clone().unwrap_or_default(),
                            python: e.py_tstate,
                        }));
                    }
                    let mut pystack = 0;
                    if e.py_key != 0 {
                        pystack = match (py_stack_ids.get(&e.py_key), &e.py) {
                            (Some(&id), _) => id,
                            (None, Some(py)) if !py.frames.is_empty() => {
                                let mut frames = Vec::with_capacity(py.frames.len());
                                for f in &py.frames {
                                    let code = match code_ids.get(&(f.code, f.sig)) {
                                        Some(&id) => id,
                                        None => {
                                            max_id[2] += 1;
                                            code_ids.insert((f.code, f.sig), max_id[2]);
                                            out.push(Record::PyCode(PyCode {
                                                id: max_id[2],
                                                name: "<unknown>".into(),
                                                qualname: "<unknown>".into(),
                                                filename: "<unknown>".into(),
                                                ..PyCode::default()
                                            }));
                                            max_id[2]
                                        }
                                    };
                                    frames.push(PyFrame { code, instr_offset: f.instr, flags: f.flags });
                                }
                                max_id[1] += 1;
                                py_stack_ids.insert(e.py_key, max_id[1]);
                                out.push(Record::PyStack(crate::PyStack { id: max_id[1], frames }));
                                max_id[1]
                            }
                            _ => 0,
                        };
                    }
                    let stack = match stack_ids.get(&e.frames.key) {
                        _ if e.frames.key == 0 => 0,
                        Some(&id) => id,
                        None if !e.frames.frames.is_empty() => {
                            max_id[0] += 1;
                            stack_ids.insert(e.frames.key, max_id[0]);
                            out.push(Record::Stack(crate::Stack { id: max_id[0], frames: e.frames.frames.clone() }));
                            max_id[0]
                        }
                        None => 0,
                    };
                    out.push(Record::Event(crate::Event {
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
        out.push(Record::Notice(notice));
        out
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

