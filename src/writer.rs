//! Turns events into trace records: interns stacks (each distinct stack is written once), keeps
//! the module map current, encodes with the format crate and writes the file. Runs on the
//! writer thread, or on the exiting thread once the writer thread is done.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpumemtrace_format::{self as fmt, Encoder, Record};
use rustc_hash::FxHashSet;

use crate::aggregate::{Aggregate, Call};
use crate::backward::Backward;
use crate::waiting::Waiting;
use crate::config::Config;
use crate::modules::{loaded_objects, Object};
use crate::table::{ALL, HOOKS};
use crate::record::{CodeInfo, Msg, PyCapture, RawEvent, RawPhase, RawPyFrame, Stack};
use crate::horizon::Horizon;
use crate::ring::{Journal, RINGS};
use crate::sink::{Batch, Body, Sink};
use gpumemtrace_format::journal::{self as jfmt, dict};

/// The identity hash, for keys that are hashes already.
#[derive(Default)]
struct KeyHasher(u64);
impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// How long records may wait in memory before they are written (the journal keeps them safe
/// meanwhile; this keeps the trace itself fresh for readers that follow it).
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(10);

pub struct Writer {
    /// Where batches are compressed, written and committed (see `sink`).
    sink: Sink,
    pub path: PathBuf,
    enc: Encoder,
    /// What the next write takes: encoded records, or, once the sink encodes events beside the
    /// writer, records in order with the events left as they are (see `batch`).
    body: Body,
    /// Where the event deltas stood when `body` began (`Batch::start`).
    body_start: fmt::EventState,
    start_ns: u64,
    /// Stack ids by the hot path's key (`record::Stack`): already a hash, not hashed again.
    stacks: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    /// Python code objects written, by (address, signature): see `src/python/mod.rs`.
    py_codes: HashMap<(u64, u64), u32>,
    py_stacks: HashMap<Vec<fmt::PyFrame>, u32>,
    /// Python stack ids by the hot path's key (`python::stack_key`).
    py_by_key: HashMap<u64, u32, BuildHasherDefault<KeyHasher>>,
    /// Threads a Thread record was written for.
    threads: FxHashSet<u32>,
    /// Threads seen lately, by `tid % 64` (no set lookup for them: with many busy threads the
    /// thread changes at nearly every event).
    recent_tids: [u32; 64],
    /// Objects written to the trace, by (path, bias).
    modules: Vec<Object>,
    /// Addresses found in no loaded object even after a rescan (JIT code...): don't rescan.
    unmapped: HashSet<u64>,
    /// The loader's count of loaded objects at the last scan (`modules::load_count`).
    loads: u64,
    pub events: u64,
    pub dropped: u64,
    last_flush: Instant,
    /// Messages read and not written yet, waiting for their turn (`release`).
    waiting: Waiting,
    /// A queued entry's payload, read again to be written.
    entry: Vec<u8>,
    /// The journal the hooks write to, and how far the writer has read each ring.
    journal: Option<&'static Journal>,
    read_pos: [u64; RINGS],
    /// Where the rings will stand once the batches handed to the sink are written.
    handed: [u64; RINGS],
    /// Messages with keys below this are all read (or given up on): they are written.
    horizon: Horizon,
    /// Keys below this have been written.
    released: u64,
    /// Messages read with a key already below what was written (written late: out of call order).
    late: u64,
    /// Aggregate mode (`Config::aggregate`): successful calls go into summaries, not records.
    agg: Option<Aggregate>,
    backward: Backward,
    /// Test knob (`GPUMEMTRACE_TEST_EVENT_DELAY_US`, debug builds): a writer this much slower
    /// per event, like one starved of CPU working through a backlog.
    event_delay: Duration,
}

/// Messages waiting for the horizon beyond which the thread holding it is given up on at once
/// (`Horizon::advance`).
const MAX_PENDING: usize = 65536;
/// How many queued messages `release` writes between two chances to give ring space back.
const RELEASE_COMMIT_EVERY: usize = 4096;
/// How often a backlog's writing tells waiting hooks that the writer still moves (`ring::note_work`).
const NOTE_WORK_EVERY: usize = 512;
/// Passes a drain makes at most, and the messages a pass reads that call for another.
const PASSES: usize = 4;
const BUSY_PASS: usize = 512;

impl Writer {
    /// Writes the header, the process, the hook table and the current module map.
    pub fn create(
        file: File,
        path: PathBuf,
        start_ns: u64,
        config: &Config,
        early_phases: Vec<RawPhase>,
        journal: Option<&'static Journal>,
    ) -> io::Result<Writer> {
        // Compression is an economy, not a requirement: without a compressor, plain records.
        let zstd = if config.compress { fmt::Compressor::new().ok() } else { None };
        let flags = if zstd.is_some() { fmt::flags::ZSTD } else { 0 };
        crate::output::write_all(&file, &fmt::header_with(flags))?;
        let identity = crate::sink::identity(&file).ok_or_else(io::Error::last_os_error)?;
        let sink = Sink::new(file, identity, path.clone(), zstd, journal, config.write_thread);
        let mut w = Writer {
            sink,
            path,
            enc: Encoder::new(),
            body: Body::Bytes(Vec::new()),
            body_start: fmt::EventState::default(),
            start_ns,
            stacks: HashMap::default(),
            py_codes: HashMap::new(),
            py_stacks: HashMap::new(),
            py_by_key: HashMap::default(),
            threads: FxHashSet::default(),
            recent_tids: [0; 64],
            modules: Vec::new(),
            unmapped: HashSet::new(),
            loads: 0,
            events: 0,
            dropped: 0,
            last_flush: Instant::now(),
            waiting: Waiting::default(),
            entry: Vec::new(),
            horizon: Horizon::default(),
            released: 0,
            late: 0,
            journal,
            read_pos: [0; RINGS],
            handed: [0; RINGS],
            agg: None,
            backward: Backward::default(),
            event_delay: Duration::from_micros(config.test_event_delay_us),
        };
        w.put(&Record::Process(process_info(start_ns, config)));
        for (&id, hook) in ALL.iter().zip(HOOKS) {
            if let Some((kind, op)) = hook.event {
                w.put(&Record::Api(fmt::Api { id: id as u32, name: hook.name().to_owned(), kind, op }));
            }
        }
        w.rescan_modules();
        if config.aggregate {
            let apis = ALL.iter().zip(HOOKS).filter_map(|(&id, h)| h.event.map(|(k, o)| (id as u32, k, o)));
            w.agg = Some(Aggregate::new(std::process::id(), apis));
            // The empty summary: tells a reader from the start that this trace is aggregate.
            w.summary(false);
        }
        for p in early_phases {
            w.phase(p);
        }
        w.flush_now()?;
        Ok(w)
    }

    /// Reads every ring of the journal up to what the hooks published, and writes in call order
    /// as far as it is known (see `release`); returns how many entries were read.
    pub fn drain(&mut self) -> io::Result<usize> {
        let Some(jn) = self.journal else { return Ok(0) };
        self.watch_modules()?;
        crate::clock::refine();
        crate::python::look_again();
        // Messages read in a pass wait for the next pass's horizon: a few passes while much
        // comes in keep that wait (and the ring space it holds) short.
        let mut n = 0;
        for _ in 0..PASSES {
            // How far keys are complete, found before the rings are read (`horizon`).
            let now = crate::clock::horizon();
            self.horizon.advance(jn, now, self.waiting.len() >= MAX_PENDING);
            let read = self.read_pass(jn)?;
            self.release(false)?;
            n += read;
            if read < BUSY_PASS {
                break;
            }
        }
        Ok(n)
    }

    /// Reads every ring up to what the hooks published: messages below the horizon are written
    /// now where nothing can come between them, the others queue (`release`).
    fn read_pass(&mut self, jn: &'static Journal) -> io::Result<usize> {
        // One ring with news and nothing waiting (one busy thread): its messages up to the
        // horizon are written as they are read, without queueing.
        let with_news = (0..RINGS).filter(|&i| jn.head(i) > self.read_pos[i]).count();
        let (mut n, mut r) = (0, Ok(()));
        for i in 0..RINGS {
            self.read_pos[i] = jn.take(i, self.read_pos[i], |pos, payload| {
                n += 1;
                if n % NOTE_WORK_EVERY == 0 {
                    crate::ring::note_work();
                }
                // A message waits for its turn as a key and a place in the ring (decoded when
                // written: its space is not committed meanwhile).
                let key = jfmt::seq_of(payload);
                self.late += u64::from(key.is_some_and(|k| k < self.released));
                if let Some(key) = key.filter(|&k| !(with_news == 1 && self.waiting.is_empty() && k < self.horizon.key() && r.is_ok())) {
                    self.waiting.push(i, pos, key);
                    return;
                }
                if let Some(k) = key {
                    self.released = self.released.max(k + 1);
                }
                match jfmt::decode(payload) {
                    Ok(jfmt::Entry::Msg(msg)) => {
                        if r.is_ok() {
                            r = self.write_msg(msg);
                        }
                    }
                    // Code objects are described in arrival order, not call order: a
                    // later-keyed event that arrived earlier may be the one that brought the
                    // description an earlier-keyed one uses.
                    Ok(jfmt::Entry::Codes(codes)) => self.write_codes(codes),
                    Err(_) => self.dropped += 1, // not expected: the hooks wrote it whole
                }
            });
        }
        r?;
        Ok(n)
    }

    /// Whether a ring is filling up: then the writer writes out now, so its space returns. What
    /// was handed to the sink counts as on its way back (it returns when its batch is written).
    pub fn rings_filling(&self) -> bool {
        self.journal.is_some_and(|jn| (0..RINGS).any(|i| jn.head(i).saturating_sub(self.handed[i]) > jfmt::RING_BYTES / 4))
    }

    /// Where each ring stands once the buffer is written: what was read, except messages still
    /// waiting for their turn (see `release`).
    fn committable(&self) -> [u64; RINGS] {
        self.waiting.committable(self.read_pos)
    }

    /// Writes queued messages in call order: the lowest key at the front of a queue, as long as
    /// it is below the horizon (`Horizon::advance`). A message that arrives below it after the writer
    /// gave up waiting is written when read: late, but not lost. `all`: also past the horizon
    /// (exit, fatal signal).
    pub fn release(&mut self, all: bool) -> io::Result<()> {
        let limit = (!all).then(|| self.horizon.key());
        let mut written = 0usize;
        while let Some((ring, m)) = self.waiting.next_below(limit) {
            self.released = self.released.max(m.key + 1);
            let Some(jn) = self.journal else { continue };
            // Nearly every entry is a warm event: read as such without the general decoder.
            let decoded = jn.reread(ring, m.pos, &mut self.entry, |p| jfmt::decode_warm_event(p).ok_or_else(|| jfmt::decode(p)));
            match decoded {
                Ok(ev) => self.event(ev)?,
                Err(Ok(jfmt::Entry::Msg(msg))) => self.write_msg(msg)?,
                Err(_) => self.dropped += 1, // not expected: the hooks wrote it whole
            }
            // A long backlog (a horizon that moved after a long hold, a writer starved of CPU)
            // gives ring space back as it goes: hooks waiting for room see commits, not a
            // writer that looks stalled for the whole backlog (then they give events up). Only
            // once the message taken from its queue is written: it no longer holds its space
            // there, so a flush before would commit it unwritten.
            written += 1;
            if written.is_multiple_of(NOTE_WORK_EVERY) {
                crate::ring::note_work();
            }
            if written.is_multiple_of(RELEASE_COMMIT_EVERY) && self.rings_filling() {
                self.flush_busy()?;
            }
        }
        Ok(())
    }

    fn write_msg(&mut self, msg: Msg) -> io::Result<()> {
        match msg {
            Msg::Event(ev) => self.event(ev),
            Msg::Phase(p) => {
                self.phase(p);
                Ok(())
            }
        }
    }

    fn phase(&mut self, p: RawPhase) {
        if let Some(agg) = self.agg.as_mut() {
            // One record per push and pop grows with the run: aggregate traces have totals by
            // phase instead.
            agg.phase(p.tid, p.op, &p.name);
            return;
        }
        let time_ns = p.time_ns.saturating_sub(self.start_ns);
        self.put(&Record::Phase(fmt::Phase { time_ns, tid: p.tid, op: p.op, name: p.name }));
    }

    fn put(&mut self, rec: &Record) {
        self.body.put(&mut self.enc, rec);
    }

    /// Encodes one event (and its stack and modules, the first time they are seen).
    pub fn event(&mut self, ev: RawEvent) -> io::Result<()> {
        if !self.event_delay.is_zero() {
            std::thread::sleep(self.event_delay);
        }
        if let Some(n) = crate::python::take_notice() {
            self.notice(&n);
        }
        let slot = ev.tid as usize % 64;
        if self.recent_tids[slot] != ev.tid {
            self.recent_tids[slot] = ev.tid;
            if self.threads.insert(ev.tid) {
                self.thread(ev.tid, ev.thread_name, ev.py_tstate);
            }
        }
        let pystack = match ev.py {
            Some(py) => self.intern_py(*py, ev.py_key),
            // A stack the thread sent before: its key is enough.
            None if ev.py_key != 0 => self.py_by_key.get(&ev.py_key).copied().unwrap_or(0),
            None => 0,
        };
        let stack = self.intern(ev.frames);
        let time_ns = ev.time_ns.saturating_sub(self.start_ns);
        let mut failure_live = None;
        if let Some(agg) = self.agg.as_mut() {
            let python = ev.flags & fmt::event_flags::PYTHON != 0;
            agg.seen(ev.tid, pystack != 0 || python, time_ns);
            // Successful calls go into the summary, with the Python stack a reader would give them.
            let attributed = self.backward.attribute(ev.tid, pystack, python, agg.is_alloc(ev.api));
            let c = Call { api: ev.api, tid: ev.tid, time_ns, device: ev.device, addr: ev.addr, size: ev.size, extra: ev.extra, stack, pystack: attributed };
            if ev.result == 0 && agg.absorb(&c) {
                self.events += 1;
                return Ok(());
            }
            if ev.result != 0 {
                failure_live = agg.failed(ev.api, ev.tid, ev.device);
            }
        }
        // Straight to the event encoder: no `Record` around it to build and drop.
        let event = fmt::Event {
            api: ev.api,
            time_ns,
            tid: ev.tid,
            stack,
            result: ev.result,
            device: ev.device,
            addr: ev.addr,
            size: ev.size,
            stream: ev.stream,
            extra: ev.extra,
            pystack,
            flags: ev.flags,
            total_allocated: ev.total_allocated,
            total_reserved: ev.total_reserved,
        };
        self.body.put_event(&mut self.enc, event);
        if let Some(live_bytes) = failure_live {
            self.put(&Record::AggFailure(fmt::AggFailure { device: ev.device, live_bytes }));
        }
        self.events += 1;
        if self.body.is_full() {
            self.flush_busy()?;
        }
        Ok(())
    }

    fn intern(&mut self, stack: Stack) -> u32 {
        if stack.key == 0 {
            return 0;
        }
        if let Some(&id) = self.stacks.get(&stack.key) {
            return id;
        }
        let frames = stack.frames;
        if frames.is_empty() {
            return 0; // its first event was lost (counted as dropped)
        }
        // A new stack may run through a library loaded since the last scan.
        if frames.iter().any(|&a| !self.mapped(a)) {
            self.rescan_modules();
            for &a in &frames {
                if !self.mapped(a) {
                    self.unmapped.insert(a);
                }
            }
        }
        let id = self.stacks.len() as u32 + 1;
        self.put(&Record::Stack(fmt::Stack { id, frames }));
        self.stacks.insert(stack.key, id);
        self.remember(dict::STACK, id, stack.key, 0);
        id
    }

    /// A Thread record: the thread's name as the hook read it, else as /proc tells (a thread
    /// that has exited since: empty).
    fn thread(&mut self, tid: u32, name: Option<String>, python: bool) {
        let name = name.unwrap_or_else(|| {
            std::fs::read_to_string(format!("/proc/self/task/{tid}/comm"))
                .map(|s| s.trim_end().to_owned())
                .unwrap_or_default()
        });
        self.put(&Record::Thread(fmt::Thread { tid, name, python }));
    }

    /// The id of a Python stack the hook sent with its frames, keyed by the hook's hash (the
    /// code objects were written when the message arrived, see `message`).
    fn intern_py(&mut self, py: PyCapture, key: u64) -> u32 {
        if py.frames.is_empty() {
            return 0;
        }
        if let Some(&id) = self.py_by_key.get(&key) {
            return id;
        }
        let id = self.py_stack_id(&py.frames);
        self.py_by_key.insert(key, id);
        self.remember(dict::PY_STACK, id, key, 0);
        id
    }

    /// PyCode records for code objects not described yet.
    fn write_codes(&mut self, codes: Vec<CodeInfo>) {
        for c in codes {
            if self.py_codes.contains_key(&(c.code, c.sig)) {
                continue;
            }
            let id = self.py_codes.len() as u32 + 1;
            self.py_codes.insert((c.code, c.sig), id);
            self.remember(dict::PY_CODE, id, c.code, c.sig);
            if self.agg.is_some() {
                self.backward.code(id, &c.name, &c.filename);
            }
            self.put(&Record::PyCode(c.into_record(id)));
        }
    }

    fn py_stack_id(&mut self, raw: &[RawPyFrame]) -> u32 {
        let mut frames = Vec::with_capacity(raw.len());
        for f in raw {
            let code = match self.py_codes.get(&(f.code, f.sig)) {
                Some(&id) => id,
                None => {
                    // Not expected (the hook marks code objects known only after handing them
                    // over); keep the frame, nameless.
                    let id = self.py_codes.len() as u32 + 1;
                    self.py_codes.insert((f.code, f.sig), id);
                    self.put(&Record::PyCode(fmt::PyCode::unknown(id)));
                    id
                }
            };
            frames.push(fmt::PyFrame { code, instr_offset: f.instr, flags: f.flags });
        }
        if let Some(&id) = self.py_stacks.get(&frames) {
            return id;
        }
        let id = self.py_stacks.len() as u32 + 1;
        if self.agg.is_some() {
            self.backward.stack(id, frames.iter().map(|f| f.code));
        }
        self.put(&Record::PyStack(fmt::PyStack { id, frames: frames.clone() }));
        self.py_stacks.insert(frames, id);
        id
    }

    /// Tells the journal the id a key got, for a reader that recovers later events naming it.
    fn remember(&self, kind: u32, id: u32, key: u64, sig: u64) {
        if let Some(jn) = self.journal {
            jn.remember(kind, id, key, sig);
        }
    }

    fn mapped(&self, addr: u64) -> bool {
        self.unmapped.contains(&addr) || self.modules.iter().any(|m| m.contains(addr))
    }

    /// A library loaded since the last scan (a late `dlopen`) is written to the trace now, not
    /// when the first stack through it reaches the writer: a process killed before that still
    /// leaves the module that its recovered stacks (from the journal) run through.
    fn watch_modules(&mut self) -> io::Result<()> {
        if crate::modules::load_count() == self.loads {
            return Ok(());
        }
        let known = self.modules.len();
        self.rescan_modules();
        if self.modules.len() > known {
            self.flush_now()?;
        }
        Ok(())
    }

    fn rescan_modules(&mut self) {
        self.loads = crate::modules::load_count();
        for obj in loaded_objects() {
            if self.modules.iter().any(|m| m.path == obj.path && m.bias == obj.bias) {
                continue;
            }
            let rec = fmt::Module {
                id: self.modules.len() as u32 + 1,
                bias: obj.bias,
                start: obj.start(),
                end: obj.end(),
                path: obj.path.clone(),
                build_id: obj.build_id.clone(),
            };
            self.put(&Record::Module(rec));
            self.modules.push(obj);
        }
    }

    pub fn notice(&mut self, msg: &str) {
        self.put(&Record::Notice(msg.to_owned()));
    }

    /// Counters; `final_` marks a cleanly finished trace.
    pub fn stats(&mut self, final_: bool) {
        if self.late > 0 {
            let (late, gave_up) = (self.late, self.horizon.gave_up);
            self.notice(&format!(
                "{late} events reached the writer after later ones were written (out of call order): {gave_up} times it stopped waiting for a thread held inside a hook for more than 2 ms"
            ));
        }
        let fallbacks = crate::unwind::FALLBACKS.load(std::sync::atomic::Ordering::Relaxed);
        if fallbacks > 0 {
            self.notice(&format!(
                "the fast unwinder could not take {fallbacks} of {} native stacks; libgcc's unwinder did",
                self.events
            ));
        }
        #[cfg(target_arch = "x86_64")]
        {
            use crate::fastunwind::{MISSED, WALKED};
            let (walked, missed) = (WALKED.load(std::sync::atomic::Ordering::Relaxed), MISSED.load(std::sync::atomic::Ordering::Relaxed));
            if walked > 0 {
                self.notice(&format!(
                    "native unwinding: {walked} frames walked by rule (the rest reused), {missed} of them missed the rule cache"
                ));
            }
        }
        if let Some(line) = crate::selftime::report() {
            self.notice(&line);
            if let Some(how) = crate::python::lookups() {
                self.notice(&how);
            }
        }
        let pauses = crate::pause::count();
        if pauses > 0 {
            self.notice(&format!(
                "tracing was paused {pauses} times (gpumemtrace_pause): calls made while paused are not in the trace, so live memory and leaks are not exact"
            ));
        }
        if let Some((n, apart)) = crate::clock::late_switches() {
            self.notice(&format!(
                "the clock's map was refitted late {n} times (the writer was descheduled while publishing it): events stamped then may be out of order by up to {apart} ns"
            ));
        }
        let waited = crate::ring::WAITED.load(std::sync::atomic::Ordering::Relaxed);
        if waited > 0 {
            self.notice(&format!("{waited} events waited for room in their thread's ring (the writer had fallen behind)"));
        }
        let given_up = crate::ring::GIVEN_UP.load(std::sync::atomic::Ordering::Relaxed);
        if given_up > 0 {
            self.notice(&format!(
                "{given_up} events were lost: the trace's output did not keep up (a hook waits for room until the writer makes no progress, or spends most of the wait writing, for {} ms)",
                crate::ring::MAX_WAIT_MS
            ));
        }
        self.summary(final_);
        let s = fmt::Stats { events: self.events, dropped: self.dropped + given_up, final_ };
        self.put(&Record::Stats(s));
    }

    /// Hands the buffer to the sink, which compresses and writes it, then tells the journal
    /// that what it held is in the trace (see `journal` in the format crate: propose, write,
    /// commit). Written by the time this returns, unless the sink writes beside the writer
    /// (then see `flush_now`).
    pub fn flush(&mut self) -> io::Result<()> {
        self.flush_with(false, false, false)
    }

    /// Flushes before the flush interval is up: the hooks fill the rings faster (a full batch, a
    /// ring filling up).
    pub fn flush_busy(&mut self) -> io::Result<()> {
        self.flush_with(false, true, false)
    }

    /// Flushes, and waits until everything handed to the sink is in the trace (exit, a fatal
    /// signal, synchronous writes).
    pub fn flush_now(&mut self) -> io::Result<()> {
        self.flush_with(true, false, false)
    }

    /// `flush_now` for the trace's last write (exit, a fatal signal): the compressed frame ends
    /// with it. Anything written after (a later exit handler's calls) starts a new frame.
    pub fn flush_last(&mut self) -> io::Result<()> {
        self.flush_with(true, false, true)
    }

    fn flush_with(&mut self, wait: bool, busy: bool, last: bool) -> io::Result<()> {
        self.last_flush = Instant::now();
        let at = self.committable();
        self.handed = at;
        let body = std::mem::replace(&mut self.body, Body::Bytes(Vec::new()));
        // The writer's encoder says where the event stream stands (`Body::put_event`): the next
        // body goes on from there, whichever end encodes it (after a failed write, the writer).
        let start = std::mem::replace(&mut self.body_start, self.enc.event_state());
        match self.sink.write(Batch { body, at, events: self.events, last, start }, wait, busy) {
            Ok(body) => {
                self.body = body;
                self.body.start_items(self.enc.event_state());
                Ok(())
            }
            Err(e) => Err(self.lost(e)),
        }
    }

    /// A write error, with what it cost: the events recorded but not written (a journal beside
    /// a regular trace still holds them for a reader).
    fn lost(&self, e: io::Error) -> io::Error {
        let what = if self.journal_file() { "; the journal beside it keeps them" } else { "" };
        io::Error::new(
            e.kind(),
            format!(
                "{e}; {} of the {} events recorded so far were not (or not wholly) written{what}",
                self.events.saturating_sub(self.sink.written()),
                self.events
            ),
        )
    }

    fn journal_file(&self) -> bool {
        self.journal.is_some_and(|jn| jn.path.is_some())
    }

    /// The trace is complete and written: the journal can go.
    pub fn remove_journal(&self) {
        if let Some(jn) = self.journal {
            jn.remove_file();
        }
    }

    /// In aggregate mode, a summary of the run so far (the last complete one is the trace's).
    fn summary(&mut self, final_: bool) {
        let time_ns = crate::clock::now_ns().saturating_sub(self.start_ns);
        if let Some(agg) = self.agg.as_mut() {
            for r in agg.summary(time_ns, self.events, final_) {
                self.body.put(&mut self.enc, &r);
            }
        }
    }

    pub fn flush_if_due(&mut self) -> io::Result<()> {
        self.release(false)?; // a gap that has lasted long enough is given up on here
        if self.agg.as_mut().is_some_and(|a| a.due()) {
            self.summary(false);
        }
        if !self.body.is_empty() && self.last_flush.elapsed() >= FLUSH_INTERVAL {
            self.flush()
        } else {
            Ok(())
        }
    }
}

fn process_info(start_ns: u64, config: &Config) -> fmt::Process {
    let args = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
        })
        .unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let realtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let monotonic = crate::clock::now_ns();
    fmt::Process {
        pid: std::process::id(),
        // SAFETY: getppid has no preconditions.
        ppid: unsafe { libc::getppid() } as u32,
        start_monotonic_ns: start_ns,
        // Realtime at the moment tracing started (monotonic start shifted to realtime).
        start_realtime_ns: realtime.saturating_sub(monotonic.saturating_sub(start_ns)),
        exe,
        args,
        max_frames: config.max_frames as u32,
        rank: config.rank,
        local_rank: config.local_rank,
    }
}
