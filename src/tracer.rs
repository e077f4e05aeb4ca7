//! The tracer's life: started by the first allocation call (before that, no thread and no
//! file exist), one writer thread fed through the journal's per-thread rings (`ring`), a drain
//! at exit, and a fresh start in a forked child.
//!
//! States: `UNINIT` -> `STARTING` -> `RUNNING` -> `DIRECT` (after exit began: events are written
//! synchronously by the calling thread) or `OFF` (disabled by configuration, or after an error:
//! hooks then only forward calls).

use std::cell::RefCell;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::{Relaxed, SeqCst}};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use crossbeam_utils::CachePadded;

use gpumemtrace_format::journal::{self as jfmt, MsgRef};

use crate::config::Config;
use crate::record::{RawEvent, RawPhase};
use crate::ring::{self, Journal};
use crate::writer::Writer;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const DIRECT: u8 = 3;
const OFF: u8 = 4;

/// How long the writer sleeps when the rings are empty (well under `writer::FLUSH_INTERVAL`);
/// a hook whose ring is half full wakes it at once.
const WRITER_POLL: Duration = Duration::from_micros(500);

struct Tracer {
    journal: &'static Journal,
    /// On lines of its own: every hook reads `journal`, and the writer thread changes its own
    /// fields (and the lock word) all the time. Sharing a line, each of those changes took the
    /// line away from every hook (measured: at eight threads most of a hook's time went to that
    /// one load, and a faster writer made it worse).
    writer: CachePadded<Mutex<Writer>>,
    /// Testing knob: pause per writer batch (back-pressure tests).
    writer_delay: Duration,
    /// Name the trace on stderr at exit (`Config::quiet`; see `to_host_stderr`).
    announce: bool,
}

fn stderr_identity() -> Option<(u64, u64)> {
    crate::output::identity(2)
}

/// The host's stderr when tracing started (device and inode; no inode: none was open). Every
/// line the tracer writes goes there only while descriptor 2 is still that file.
static HOST_STDERR_DEV: AtomicU64 = AtomicU64::new(0);
static HOST_STDERR_INO: AtomicU64 = AtomicU64::new(0);

fn remember_host_stderr() {
    let (dev, ino) = stderr_identity().unwrap_or((0, 0));
    HOST_STDERR_DEV.store(dev, SeqCst);
    HOST_STDERR_INO.store(ino, SeqCst);
}

/// Writes `line` to stderr in one write, if descriptor 2 is still the host's stderr of when
/// tracing started: never into a file the host has put in its place.
fn to_host_stderr(line: &str) {
    let was = (HOST_STDERR_DEV.load(SeqCst), HOST_STDERR_INO.load(SeqCst));
    if was.1 != 0 && Some(was) == stderr_identity() {
        // SAFETY: one write of our own buffer to the host's stderr, checked above.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
}

#[link_section = "gpumemtrace_hot"]
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Leaked on purpose: hooks may run on any thread until the very end of the process.
#[link_section = "gpumemtrace_hot"]
static TRACER: AtomicPtr<Tracer> = AtomicPtr::new(null_mut());
#[link_section = "gpumemtrace_hot"]
static MAX_FRAMES: AtomicUsize = AtomicUsize::new(crate::config::DEFAULT_FRAMES);
static ONCE_PER_IMAGE: AtomicBool = AtomicBool::new(false);
static WARNED: AtomicBool = AtomicBool::new(false);
/// The process the running tracer belongs to.
static TRACER_PID: AtomicU32 = AtomicU32::new(0);
/// Testing knob: the event number whose recording panics (0 = never), and the count so far.
#[link_section = "gpumemtrace_hot"]
static TEST_PANIC_AT: AtomicU64 = AtomicU64::new(0);
static SUBMITTED: AtomicU64 = AtomicU64::new(0);
/// Flush requests from the fatal-signal handler, and how many the writer has completed.
static FLUSH_REQUESTED: AtomicU64 = AtomicU64::new(0);
static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);
static FATAL_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Whether hooks should only forward: tracing is off, or paused (`control`).
// Small accessors every hook calls: inlined (a call for one load otherwise).
#[inline(always)]
pub fn is_off() -> bool {
    STATE.load(SeqCst) == OFF || PAUSED.load(Relaxed)
}

/// `control`'s pause: declared beside `STATE` so that the linker puts the two on one line
/// (every hook reads both).
#[link_section = "gpumemtrace_hot"]
static PAUSED: AtomicBool = AtomicBool::new(false);

/// Pauses (`on`) or resumes. Pauses do not nest; a hook that read "not paused" just before
/// finishes its event.
pub fn set_paused(on: bool) {
    if on {
        if !PAUSED.swap(true, SeqCst) {
            crate::pause::counted();
        }
    } else {
        PAUSED.store(false, SeqCst);
    }
}

#[inline(always)]
pub fn max_frames() -> usize {
    MAX_FRAMES.load(SeqCst)
}

#[link_section = "gpumemtrace_hot"]
static INTERPRETER_FRAMES: AtomicBool = AtomicBool::new(false);

/// See `Config::interpreter_frames`.
#[inline(always)]
pub fn interpreter_frames() -> bool {
    INTERPRETER_FRAMES.load(std::sync::atomic::Ordering::Relaxed)
}

#[inline(always)]
fn tracer() -> Option<&'static Tracer> {
    let p = TRACER.load(SeqCst);
    // SAFETY: TRACER is null or a leaked Box that is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn lock(w: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why tracing was turned off, for the trace's last notice.
static DISABLED_WHY: Mutex<Option<String>> = Mutex::new(None);

/// Tells the user once, on stderr, and stops tracing; the program is unaffected. What was
/// recorded before is still written out (by the writer thread, or at exit).
pub fn disable(why: &str) {
    STATE.store(OFF, SeqCst);
    if !WARNED.swap(true, SeqCst) {
        *DISABLED_WHY.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_owned());
        // One write for the whole line: `eprintln!` writes it in pieces, and a process exiting
        // meanwhile (this may run on the writer thread) would leave half a line.
        to_host_stderr(&format!("gpumemtrace: {why}; tracing is off for the rest of this process\n"));
    }
}

/// Starts the tracer on the process's first allocation call; false if tracing is off.
#[inline(always)]
pub fn ensure_started() -> bool {
    if matches!(STATE.load(SeqCst), UNINIT | STARTING) {
        start();
    }
    !is_off()
}

/// An event's order key and time (`clock::stamp`), taken with the calling thread's ring marked
/// as stamping (`Journal::enter`): the writer writes nothing with a later key until the event is
/// in the ring, which is when the stamp is dropped (the mark is left then, on every path).
pub struct Stamp {
    pub key: u64,
    pub time: u64,
    held: Option<(&'static Journal, usize, ring::Mark)>,
}

impl Drop for Stamp {
    fn drop(&mut self) {
        if let Some((_, _, mark)) = self.held.take() {
            Journal::leave(mark);
        }
    }
}

/// Stamps an event of the calling thread (see `Stamp`). Where the tracer is not running, only
/// the key and time (nothing would be handed over). `guard`: the hook's, through which the
/// thread's ring is found without a thread-local lookup (none for phase records).
#[link_section = ".text.hot.gpumemtrace"]
pub fn stamp(guard: Option<&crate::guard::Guard>) -> Stamp {
    let held = match STATE.load(SeqCst) {
        RUNNING | DIRECT => tracer().map(|t| {
            let (ring, marks) = ring_of(t, guard);
            (t.journal, ring, Journal::enter(marks))
        }),
        _ => None,
    };
    let m = crate::selftime::mark();
    let (key, time) = crate::clock::stamp();
    if let Some((_, _, mark)) = held {
        Journal::note_key(mark, key);
    }
    crate::selftime::add(crate::selftime::Sub::Stamp, m);
    Stamp { key, time, held }
}

/// Hands an event to the writer; `stamp` is the one its key and time came from.
#[inline(always)]
pub fn submit(ev: RawEvent, stamp: &Stamp) {
    // Counted only when a test asks for it (debug builds): no shared counter on the hot path.
    if cfg!(debug_assertions) {
        let panic_at = TEST_PANIC_AT.load(Relaxed);
        if panic_at != 0 && SUBMITTED.fetch_add(1, SeqCst) + 1 == panic_at {
            panic!("GPUMEMTRACE_TEST_PANIC_AT={panic_at}: deliberate panic for testing");
        }
    }
    // Borrowed, not moved into a `Msg`: the event is written from where the hook built it.
    // A warm event owns nothing (no frames, no Python stack, no thread name): dropped only
    // when it does, instead of a call to its drop glue at every event. (Should `send` unwind,
    // which it catches, what the event owns would be leaked, never freed twice.)
    let ev = std::mem::ManuallyDrop::new(ev);
    send(MsgRef::Event(&ev), stamp);
    if ev.owns_memory() {
        drop(std::mem::ManuallyDrop::into_inner(ev));
    }
}

/// Phase records before the tracer started: kept (bounded) so the first events get their phase,
/// but they alone never start the tracer (a process that never allocates stays untouched).
static EARLY_PHASES: Mutex<Vec<RawPhase>> = Mutex::new(Vec::new());
const EARLY_PHASES_MAX: usize = 4096;

/// Hands a phase boundary to the writer; `stamp` is the one its key and time came from.
pub fn submit_phase(p: RawPhase, stamp: &Stamp) {
    match STATE.load(SeqCst) {
        UNINIT | STARTING => {
            let mut early = EARLY_PHASES.lock().unwrap_or_else(|e| e.into_inner());
            if early.len() < EARLY_PHASES_MAX {
                early.push(p);
            }
        }
        OFF => {}
        _ => send(MsgRef::Phase(&p), stamp),
    }
}

/// The calling thread's ring, for the tracer start (`clock::epoch`) it was claimed in; given
/// back when the thread ends.
struct Claim {
    epoch: u64,
    ring: usize,
}

impl Drop for Claim {
    fn drop(&mut self) {
        crate::thread::forget_ring();
        if let Some(t) = tracer() {
            if self.epoch == crate::clock::epoch() {
                t.journal.release(self.ring);
            }
        }
    }
}

thread_local! {
    static CLAIM: RefCell<Claim> = const { RefCell::new(Claim { epoch: u64::MAX, ring: ring::SHARED }) };
    /// The entry being encoded (its capacity stays: the warm path allocates nothing).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's ring and marks, through its hook's guard when there is one (its copy of
/// the claim, kept for the tracer start it was made in; the shared ring is not kept: a thread
/// sent there while its claim was busy or ending gets its own again later).
#[inline(always)]
fn ring_of(t: &Tracer, guard: Option<&crate::guard::Guard>) -> (usize, Option<ring::Marks>) {
    let Some(g) = guard else { return my_ring(t) };
    let epoch = crate::clock::epoch();
    let (made, ring) = g.ring();
    if made == epoch {
        return (ring as usize, t.journal.marks(ring as usize));
    }
    let (ring, marks) = my_ring(t);
    if ring != ring::SHARED {
        g.set_ring((epoch, ring as u32));
    }
    (ring, marks)
}

/// The calling thread's ring, and its marks (none for the shared ring).
#[inline(always)]
fn my_ring(t: &Tracer) -> (usize, Option<ring::Marks>) {
    let epoch = crate::clock::epoch();
    let ring = CLAIM
        .try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else { return ring::SHARED };
            if c.epoch != epoch {
                *c = Claim { epoch, ring: t.journal.claim(crate::thread::thread_id()) };
            }
            c.ring
        })
        .unwrap_or(ring::SHARED); // the thread is ending: its own ring may be given back
    (ring, t.journal.marks(ring))
}

/// Wakes the writer (a futex word: a hook whose ring fills up rings it).
static DOORBELL: AtomicU32 = AtomicU32::new(0);
/// Set when a hook gave up waiting for room: hooks no longer wait until the writer made room.
static STALLED: AtomicBool = AtomicBool::new(false);

fn ring_doorbell() {
    DOORBELL.fetch_add(1, SeqCst);
    // SAFETY: FUTEX_WAKE on a static word; no memory is touched by the kernel.
    unsafe { libc::syscall(libc::SYS_futex, DOORBELL.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1) };
}

/// On the writer: sleeps until a hook rings or `timeout` passes.
fn wait_for_doorbell(seen: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
    // SAFETY: FUTEX_WAIT on a static word with a relative timeout we own.
    unsafe {
        libc::syscall(libc::SYS_futex, DOORBELL.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, &ts as *const libc::timespec)
    };
}

#[link_section = ".text.hot.gpumemtrace"]
fn send(msg: MsgRef, stamp: &Stamp) {
    let Some(t) = tracer() else { return };
    // The ring marked when the event was stamped; an event stamped before the tracer ran marks
    // its ring now. Marked before the state is read: the exit drain, which changes the state
    // first and then waits for marks (once a mark still on its way has had time to arrive, see
    // `write_out`), cannot miss this event.
    let (ring, mark) = match stamp.held {
        Some((journal, ring, _)) if std::ptr::eq(journal, t.journal) => (ring, None),
        _ => {
            let (ring, marks) = my_ring(t);
            (ring, Some(Journal::enter(marks)))
        }
    };
    let state = STATE.load(SeqCst);
    if let RUNNING | DIRECT = state {
        if catch_unwind_silent(|| push(t, ring, msg)).is_none() {
            disable("internal error while handing an event to the writer");
        }
        if state == DIRECT {
            write_direct(t);
        }
    }
    if let Some(mark) = mark {
        Journal::leave(mark);
    }
}

fn catch_unwind_silent<R>(f: impl FnOnce() -> R) -> Option<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok()
}

/// Puts the message into the calling thread's ring, waiting (bounded) while the ring is full.
/// A warm event (no code objects to describe, no frames: its stacks' keys only; the common case)
/// is written straight into the ring, in one pass, the length known at the end: that path is
/// inlined into the hooks, the rest is not.
#[inline(always)]
fn push(t: &Tracer, ring: usize, msg: MsgRef) {
    if let MsgRef::Event(e) = msg {
        if jfmt::is_warm(e) {
            let mut len = 0;
            let after = t.journal.push_in_place(ring, jfmt::WARM_MAX, room_waiter(t), |dst| {
                len = jfmt::write_warm_event(e, dst).unwrap_or(0);
                len
            });
            pushed(after, len);
            return;
        }
    }
    push_other(t, ring, msg);
}

/// `push` of anything but a warm event.
#[link_section = ".text.hot.gpumemtrace"]
#[inline(never)]
fn push_other(t: &Tracer, ring: usize, msg: MsgRef) {
    if let MsgRef::Event(e) = msg {
        if e.py.as_ref().is_none_or(|p| p.new_codes.is_empty()) {
            let plan = jfmt::plan_event(e);
            if plan.bytes() <= ring::IN_PLACE_MAX {
                let after = t.journal.push_in_place(ring, plan.bytes(), room_waiter(t), |dst| {
                    jfmt::write_event(e, &plan, dst);
                    plan.bytes()
                });
                pushed(after, plan.bytes());
                return;
            }
        }
    }
    let put = |payload: &[u8]| pushed(t.journal.push(ring, payload, room_waiter(t)), payload.len());
    let done = SCRATCH
        .try_with(|s| {
            let Ok(mut s) = s.try_borrow_mut() else { return false };
            jfmt::encode_each(msg, &mut s, put);
            true
        })
        .unwrap_or(false);
    if !done {
        jfmt::encode_each(msg, &mut Vec::new(), put);
    }
}

/// How a hook waits for room in its ring (called only once the ring turns out full).
fn room_waiter(t: &Tracer) -> impl FnMut(u32) -> bool + '_ {
    // The clock is read only once the ring turns out full: not on the hot path. The wait is
    // bounded by time without progress: a writer that commits or works through its backlog,
    // however slowly (starved of CPU by the program's own threads), is not a stalled output.
    // But a writer that spent most of a second of waiting inside writes is held by its output
    // (a slow disk, a pipe read slowly): its progress does not count, or the host would run at
    // the output's speed. The writer's counts too are read only then: their lines move often.
    let (mut last_commit, mut seen, mut waiting) = (None, None, None);
    move |tries| {
        let now = Instant::now();
        let c = ring::writer_moves();
        if seen.is_some_and(|s| s != c) {
            last_commit = None;
        }
        seen = Some(c);
        let since = *last_commit.get_or_insert(now);
        let (began, writes_then) = *waiting.get_or_insert_with(|| (now, crate::output::time_in_writes()));
        let waited = now - began;
        let in_writes = crate::output::time_in_writes().saturating_sub(writes_then);
        let output_bound = waited >= Duration::from_millis(ring::MAX_WAIT_MS) && in_writes * 2 >= waited;
        wait_for_room(t, tries, if output_bound { began } else { since })
    }
}

/// After a push of `len` payload bytes: the writer is woken when the ring passes half full;
/// an entry given up is counted.
#[inline(always)]
fn pushed(after: Option<u64>, len: usize) {
    match after {
        Some(fill) => {
            let half = jfmt::RING_BYTES / 2;
            if fill > half && fill - jfmt::entry_bytes(len) <= half {
                ring_doorbell();
            }
        }
        None => {
            ring::GIVEN_UP.fetch_add(1, SeqCst);
        }
    }
}

/// A hook's ring is full: wake the writer and wait for it, at most `ring::MAX_WAIT_MS` (then,
/// and while the output stays stalled, the event is given up and counted). After exit began,
/// the hook writes out itself.
fn wait_for_room(t: &Tracer, tries: u32, since: Instant) -> bool {
    match STATE.load(SeqCst) {
        RUNNING => {}
        DIRECT => {
            if let Ok(mut w) = t.writer.try_lock() {
                let _ = w.drain().and_then(|_| w.flush_now());
            }
        }
        _ => return false,
    }
    if STALLED.load(SeqCst) {
        return false;
    }
    if tries == 0 {
        ring_doorbell();
    }
    if tries < 64 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
    if since.elapsed() > Duration::from_millis(ring::MAX_WAIT_MS) {
        STALLED.store(true, SeqCst);
        return false;
    }
    true
}

fn write_direct(t: &Tracer) {
    let mut w = lock(&t.writer);
    if let Err(e) = w.drain().and_then(|_| w.release(true)).and_then(|_| w.flush_now()) {
        let msg = format!("cannot write {}: {e}", w.path.display());
        drop(w);
        disable(&msg);
    }
}

// Once a process: kept out of `ensure_started`, which every event calls.
#[cold]
#[inline(never)]
fn start() {
    if STATE.compare_exchange(UNINIT, STARTING, SeqCst, SeqCst).is_err() {
        // Another thread is starting the tracer: wait for it (it takes well under a second).
        let t0 = Instant::now();
        while STATE.load(SeqCst) == STARTING && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        return;
    }
    // This library's copy of std has its own panic hook: silence it, so that a panic (caught at
    // the hook) costs the user one line from `disable`, not a backtrace. A Rust host program's
    // own hook, in its own std, is not touched.
    std::panic::set_hook(Box::new(|_| {}));
    remember_host_stderr();
    let config = Config::from_env();
    if config.disabled {
        STATE.store(OFF, SeqCst);
        return;
    }
    match open(&config) {
        Ok(t) => {
            TRACER_PID.store(std::process::id(), SeqCst);
            TRACER.store(Box::into_raw(Box::new(t)), SeqCst);
            if !ONCE_PER_IMAGE.swap(true, SeqCst) {
                // SAFETY: registering plain extern "C" handlers; they never unwind.
                unsafe {
                    libc::atexit(at_exit);
                    at_quick_exit(at_exit);
                    libc::pthread_atfork(None, None, Some(in_forked_child));
                }
                crate::crash::install(flush_for_signal);
            }
            STATE.store(RUNNING, SeqCst);
            if let Err(e) = spawn_writer() {
                disable(&format!("cannot start the writer thread: {e}"));
            }
        }
        Err(msg) => disable(&msg),
    }
}

fn open(config: &Config) -> Result<Tracer, String> {
    MAX_FRAMES.store(config.max_frames, SeqCst);
    INTERPRETER_FRAMES.store(config.interpreter_frames, SeqCst);
    crate::python::set_enabled(config.python);
    crate::unwind::set_backtrace(config.backtrace_unwinder);
    crate::selftime::enable(config.self_time);
    let target = crate::output::target(config.output.as_deref(), std::process::id(), config.rank);
    let (file, path) =
        crate::output::create(&target, config.file_mode).map_err(|e| format!("cannot create trace file {}: {e}", target.display()))?;
    // No journal file beside /dev/null or a FIFO: its rings are anonymous memory then.
    let beside = config.journal && !crate::output::is_special(&file);
    // Every hook reads it: on lines no other heap object shares (see `Tracer::writer`).
    let journal: &'static Journal = Box::leak(Box::new(CachePadded::new(
        Journal::create(&path, config.file_mode, beside)
            .map_err(|e| format!("cannot map the journal for {}: {e}", path.display()))?,
    )));
    let early = std::mem::take(&mut *EARLY_PHASES.lock().unwrap_or_else(|e| e.into_inner()));
    let writer = Writer::create(file, path.clone(), crate::clock::now_ns(), config, early, Some(journal))
        .map_err(|e| format!("cannot write trace file {}: {e}", path.display()))?;
    crate::clock::new_epoch(config.test_numbered_keys);
    TEST_PANIC_AT.store(config.test_panic_at, SeqCst);
    let writer_delay = Duration::from_micros(config.test_writer_delay_us);
    let announce = !config.quiet;
    Ok(Tracer { journal, writer: CachePadded::new(Mutex::new(writer)), writer_delay, announce })
}

/// The writer thread, with every signal blocked so the host's signals go to its own threads.
fn spawn_writer() -> std::io::Result<()> {
    crate::thread::spawn_without_signals("gpumemtrace", writer_loop)
}

fn writer_loop() {
    crate::guard::Guard::forbid_on_this_thread();
    let Some(t) = tracer() else { return };
    // Idle, the poll backs off (a process that stops allocating should not pay for wake-ups);
    // it stays short enough that events reach the file within the flush interval.
    let mut idle_sleep = WRITER_POLL;
    loop {
        match STATE.load(SeqCst) {
            RUNNING => {}
            OFF => {
                // Turned off (a panic, say): keep what was recorded up to here.
                write_out(t, false);
                return;
            }
            _ => return, // the exit drain does the rest
        }
        if !t.writer_delay.is_zero() {
            std::thread::sleep(t.writer_delay);
        }
        let mut w = lock(&t.writer);
        let r = w.drain().and_then(|n| {
            // A ring filling up gets its space back now; else the usual cadence.
            let r = if w.rings_filling() { w.flush_busy() } else { w.flush_if_due() };
            if n > 0 {
                idle_sleep = WRITER_POLL;
                // The output moves again. Stored only when set: hooks read the flag while they
                // wait for room, and a store at every pass would take its line away from them.
                if STALLED.load(Relaxed) {
                    STALLED.store(false, SeqCst);
                }
            }
            r
        });
        let r = r.and_then(|_| serve_flush_request(&mut w));
        drop(w);
        if let Err(e) = r {
            let w = lock(&t.writer);
            let msg = format!("cannot write {}: {e}", w.path.display());
            drop(w);
            // Hooks stop recording; what they put in the journal stays there for a reader.
            disable(&msg);
            return;
        }
        // Sleep rather than block on every event: a hook rings only when its ring is half
        // full (rarely a system call on the hot path). Idle, the sleep backs off.
        let seen = DOORBELL.load(SeqCst);
        wait_for_doorbell(seen, idle_sleep);
        idle_sleep = (idle_sleep * 2).min(crate::writer::FLUSH_INTERVAL / 2);
    }
}

/// Called from the fatal-signal handler (`crash`; async-signal-safe: atomics and nanosleep
/// only): asks the writer thread to write out everything queued, and waits for it at most one
/// second.
fn flush_for_signal(sig: i32) {
    if STATE.load(SeqCst) != RUNNING {
        return; // DIRECT writes synchronously; OFF has nothing to write
    }
    FATAL_SIGNAL.store(sig, SeqCst);
    let want = FLUSH_REQUESTED.fetch_add(1, SeqCst) + 1;
    let ms = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
    for _ in 0..1000 {
        if FLUSH_DONE.load(SeqCst) >= want {
            return;
        }
        // SAFETY: nanosleep is async-signal-safe; a null remainder pointer is allowed.
        unsafe { libc::nanosleep(&ms, null_mut()) };
    }
}

/// On the writer thread: honours a pending flush request from a signal handler.
fn serve_flush_request(w: &mut Writer) -> std::io::Result<()> {
    let want = FLUSH_REQUESTED.load(SeqCst);
    if FLUSH_DONE.load(SeqCst) >= want {
        return Ok(());
    }
    w.drain()?;
    w.release(true)?;
    w.notice(&format!("the process received fatal signal {}", FATAL_SIGNAL.load(SeqCst)));
    w.stats(false);
    let r = w.flush_last();
    FLUSH_DONE.store(want, SeqCst);
    r
}

extern "C" {
    fn at_quick_exit(f: extern "C" fn()) -> libc::c_int;
}

/// At exit: switch hooks to synchronous writes, drain the queue, mark the trace complete.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(finish);
}

/// Before `exec*` (the new image starts a trace of its own) and `_exit`: the same as at exit.
/// Not in a `vfork` child (Python's subprocess uses vfork): it shares the parent's memory, and the
/// parent's tracer must go on untouched.
pub fn finish_before_exec() {
    finish();
}

/// Not in a process other than the tracer's (a `vfork` child; a child made by `_Fork` or
/// `clone`, which runs no fork handlers and has none of the tracer's threads to wait for), and
/// not on the tracer's own threads (a host's crash handler calling `_exit` after a fault on one
/// of them: that thread may hold the writer's lock, or be the one the exit would wait for).
fn finish() {
    let Some(t) = tracer() else { return };
    // SAFETY: getpid has no preconditions.
    if TRACER_PID.load(SeqCst) != unsafe { libc::getpid() } as u32 || crate::thread::is_ours() {
        return;
    }
    crate::output::exiting();
    if STATE.compare_exchange(RUNNING, DIRECT, SeqCst, SeqCst).is_ok() {
        write_out(t, true);
    } else if STATE.load(SeqCst) == OFF {
        write_out(t, true); // the writer thread may not have got to it before the exit
    }
}

/// Drains the queue into the file and writes the counters (`final_`: the trace is complete).
fn write_out(t: &Tracer, final_: bool) {
    let t0 = Instant::now();
    // A hook marks its ring with a plain store, then reads the state: a mark made just before
    // the state changed may reach this thread only a little later (`Journal::enter`). Not done
    // before that long has passed.
    let settled = t0 + Duration::from_nanos(crate::clock::SLACK_NS);
    let mut w = lock(&t.writer);
    loop {
        // Idle marks, seen before the drain (and once the slack has passed): every event handed
        // over before they were read is in a ring, and the drain reads it. Read after the drain,
        // a hook could hand one over in between, unread.
        let idle = Instant::now() >= settled && !t.journal.any_busy();
        let read = w.drain().unwrap_or(0);
        if idle && read == 0 {
            break;
        }
        if t0.elapsed() > Duration::from_secs(2) {
            // A hook is stuck somewhere (a thread stopped inside it): don't hang the exit.
            w.notice("exit drain timed out; events of threads still inside a hook may be missing");
            break;
        }
        drop(w);
        std::thread::yield_now();
        w = lock(&t.writer);
    }
    let _ = w.release(true);
    if let Some(why) = DISABLED_WHY.lock().unwrap_or_else(|e| e.into_inner()).take() {
        w.notice(&format!("tracing stopped early: {why}"));
    }
    w.stats(final_);
    match w.flush_last() {
        // Everything is in the trace: the journal has nothing more to tell.
        Ok(()) if final_ => {
            w.remove_journal();
            if t.announce {
                let lost = ring::GIVEN_UP.load(SeqCst);
                let lost = if lost > 0 { format!(" ({lost} more were lost: the output did not keep up)") } else { String::new() };
                to_host_stderr(&format!("gpumemtrace: {} events traced to {}{lost}\n", w.events, w.path.display()));
            }
        }
        Ok(()) => {}
        Err(e) => {
            // The writer thread may not have met the error yet (a disk that filled at the end).
            // The journal stays: a reader recovers from it what the trace lacks.
            let msg = format!("cannot write {}: {e}", w.path.display());
            drop(w);
            disable(&msg);
        }
    }
}

/// In a forked child only the forking thread exists: abandon the parent's tracer (its lock may
/// be held by a thread that is gone) and start afresh on the child's first allocation call.
extern "C" fn in_forked_child() {
    crate::thread::forget_thread_id();
    crate::python::forget_codes();
    let old = TRACER.swap(null_mut(), SeqCst);
    if !old.is_null() {
        // SAFETY: reading a plain field of the leaked tracer. The journal holds the parent's
        // rings, which the child must not write to; nothing in the child uses them after this
        // (TRACER is null, and thread claims belong to the old epoch). The parent's trace
        // descriptor is left alone: its number may be the host's by now (see
        // `Writer::own_descriptor`), and it closes on exec.
        unsafe { (*old).journal.unmap() };
    }
    ring::Journal::reset_shared_mark();
    crate::clock::reset_seq();
    WARNED.store(false, SeqCst);
    STATE.store(UNINIT, SeqCst);
}
