//! The tracer's life: started by the first allocation call (before that, no thread and no
//! file exist), one writer thread fed through a bounded lock-free channel, a drain at exit,
//! and a fresh start in a forked child.
//!
//! States: `UNINIT` -> `STARTING` -> `RUNNING` -> `DIRECT` (after exit began: events are written
//! synchronously by the calling thread) or `OFF` (disabled by configuration, or after an error:
//! hooks then only forward calls).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TryRecvError};

use crate::config::Config;
use crate::record::{Msg, RawEvent, RawPhase};
use crate::writer::Writer;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const DIRECT: u8 = 3;
const OFF: u8 = 4;

/// Queue length between the hooks and the writer. When full, hooks wait (back-pressure):
/// dropping events would corrupt live-memory accounting.
const QUEUE: usize = 4096;
/// How long the writer sleeps when the queue is empty (well under `writer::FLUSH_INTERVAL`).
const WRITER_POLL: Duration = Duration::from_micros(500);

struct Tracer {
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    writer: Mutex<Writer>,
    /// Testing knob: pause per writer batch (back-pressure tests).
    writer_delay: Duration,
    /// The trace's file descriptor, to close it in a forked child without touching the lock.
    fd: i32,
}

static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Leaked on purpose: hooks may run on any thread until the very end of the process.
static TRACER: AtomicPtr<Tracer> = AtomicPtr::new(null_mut());
/// Hooks between "checked the state" and "handed the event over": the exit drain waits for them.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static MAX_FRAMES: AtomicUsize = AtomicUsize::new(crate::config::DEFAULT_FRAMES);
static ONCE_PER_IMAGE: AtomicBool = AtomicBool::new(false);
static WARNED: AtomicBool = AtomicBool::new(false);
/// The process the running tracer belongs to.
static TRACER_PID: AtomicU32 = AtomicU32::new(0);
/// Testing knob: the event number whose recording panics (0 = never), and the count so far.
static TEST_PANIC_AT: AtomicU64 = AtomicU64::new(0);
static SUBMITTED: AtomicU64 = AtomicU64::new(0);
/// Flush requests from the fatal-signal handler, and how many the writer has completed.
static FLUSH_REQUESTED: AtomicU64 = AtomicU64::new(0);
static FLUSH_DONE: AtomicU64 = AtomicU64::new(0);
static FATAL_SIGNAL: AtomicI32 = AtomicI32::new(0);

pub fn is_off() -> bool {
    STATE.load(SeqCst) == OFF
}

pub fn max_frames() -> usize {
    MAX_FRAMES.load(SeqCst)
}

static INTERPRETER_FRAMES: AtomicBool = AtomicBool::new(false);

/// See `Config::interpreter_frames`.
pub fn interpreter_frames() -> bool {
    INTERPRETER_FRAMES.load(std::sync::atomic::Ordering::Relaxed)
}

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
        let line = format!("gpumemtrace: {why}; tracing is off for the rest of this process\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
}

/// Starts the tracer on the process's first allocation call; false if tracing is off.
pub fn ensure_started() -> bool {
    if matches!(STATE.load(SeqCst), UNINIT | STARTING) {
        start();
    }
    !is_off()
}

/// Hands an event to the writer.
pub fn submit(ev: RawEvent) {
    let n = SUBMITTED.fetch_add(1, SeqCst) + 1;
    if n == TEST_PANIC_AT.load(SeqCst) {
        panic!("GPUMEMTRACE_TEST_PANIC_AT={n}: deliberate panic for testing");
    }
    send(Msg::Event(ev));
}

/// Phase records before the tracer started: kept (bounded) so the first events get their phase,
/// but they alone never start the tracer (a process that never allocates stays untouched).
static EARLY_PHASES: Mutex<Vec<RawPhase>> = Mutex::new(Vec::new());
const EARLY_PHASES_MAX: usize = 4096;

/// Hands a phase boundary to the writer.
pub fn submit_phase(p: RawPhase) {
    match STATE.load(SeqCst) {
        UNINIT | STARTING => {
            let mut early = EARLY_PHASES.lock().unwrap_or_else(|e| e.into_inner());
            if early.len() < EARLY_PHASES_MAX {
                early.push(p);
            }
        }
        OFF => {}
        _ => send(Msg::Phase(p)),
    }
}

fn send(msg: Msg) {
    IN_FLIGHT.fetch_add(1, SeqCst);
    match (STATE.load(SeqCst), tracer()) {
        (RUNNING, Some(t)) => {
            if let Err(e) = t.tx.send(msg) {
                write_direct(t, e.into_inner());
            }
        }
        (DIRECT, Some(t)) => write_direct(t, msg),
        _ => {}
    }
    IN_FLIGHT.fetch_sub(1, SeqCst);
}

fn write_direct(t: &Tracer, msg: Msg) {
    let mut w = lock(&t.writer);
    if let Err(e) = w.message(msg).and_then(|_| w.release(true)).and_then(|_| w.flush()) {
        let msg = format!("cannot write {}: {e}", w.path.display());
        drop(w);
        disable(&msg);
    }
}

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
    let target = crate::output::target(config.output.as_deref(), std::process::id(), config.rank);
    let (file, path) =
        crate::output::create(&target, config.file_mode).map_err(|e| format!("cannot create trace file {}: {e}", target.display()))?;
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let early = std::mem::take(&mut *EARLY_PHASES.lock().unwrap_or_else(|e| e.into_inner()));
    let writer = Writer::create(file, path.clone(), crate::clock::now_ns(), config, early)
        .map_err(|e| format!("cannot write trace file {}: {e}", path.display()))?;
    let (tx, rx) = bounded(QUEUE);
    crate::clock::new_epoch();
    TEST_PANIC_AT.store(config.test_panic_at, SeqCst);
    let writer_delay = Duration::from_micros(config.test_writer_delay_us);
    Ok(Tracer { tx, rx, writer: Mutex::new(writer), writer_delay, fd })
}

/// The writer thread, with every signal blocked so the host's signals go to its own threads.
fn spawn_writer() -> std::io::Result<()> {
    // SAFETY: sigset manipulation on local values; the old mask is restored right after.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = std::thread::Builder::new().name("gpumemtrace".into()).spawn(writer_loop);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, null_mut());
        r.map(|_| ())
    }
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
        // Poll rather than block: a receiver parked in the channel makes every send a futex
        // wake-up (microseconds on the hook's thread); a sleeping poller costs the hooks nothing.
        if t.rx.is_empty() {
            std::thread::sleep(idle_sleep);
            idle_sleep = (idle_sleep * 2).min(crate::writer::FLUSH_INTERVAL / 2);
        } else {
            idle_sleep = WRITER_POLL;
        }
        let mut w = lock(&t.writer);
        let r = match t.rx.try_recv() {
            Ok(msg) => {
                let mut r = w.message(msg);
                // Batch whatever else is queued, under the same lock.
                for msg in t.rx.try_iter().take(QUEUE) {
                    r = r.and_then(|_| w.message(msg));
                }
                r.and_then(|_| w.flush_if_due())
            }
            Err(TryRecvError::Empty) => w.flush_if_due(),
            Err(TryRecvError::Disconnected) => return,
        };
        let r = r.and_then(|_| serve_flush_request(t, &mut w));
        if let Err(e) = r {
            let msg = format!("cannot write {}: {e}", w.path.display());
            drop(w);
            disable(&msg);
            // Keep the queue moving so no hook waits on it; count what is lost.
            while let Ok(_ev) = t.rx.recv_timeout(Duration::from_millis(100)) {
                lock(&t.writer).dropped += 1;
            }
            return;
        }
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
fn serve_flush_request(t: &Tracer, w: &mut Writer) -> std::io::Result<()> {
    let want = FLUSH_REQUESTED.load(SeqCst);
    if FLUSH_DONE.load(SeqCst) >= want {
        return Ok(());
    }
    for msg in t.rx.try_iter() {
        w.message(msg)?;
    }
    w.release(true)?;
    w.notice(&format!("the process received fatal signal {}", FATAL_SIGNAL.load(SeqCst)));
    w.stats(false);
    let r = w.flush();
    FLUSH_DONE.store(want, SeqCst);
    r
}

/// At exit: switch hooks to synchronous writes, drain the queue, mark the trace complete.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(finish);
}

/// Before `exec*`: the same as at exit (the new image starts a trace of its own). Not in a
/// `vfork` child (Python's subprocess uses vfork): it shares the parent's memory, and the
/// parent's tracer must go on untouched.
pub fn finish_before_exec() {
    // SAFETY: getpid has no preconditions.
    if TRACER_PID.load(SeqCst) == unsafe { libc::getpid() } as u32 {
        finish();
    }
}

fn finish() {
    let Some(t) = tracer() else { return };
    if STATE.compare_exchange(RUNNING, DIRECT, SeqCst, SeqCst).is_ok() {
        write_out(t, true);
    } else if STATE.load(SeqCst) == OFF {
        write_out(t, true); // the writer thread may not have got to it before the exit
    }
}

/// Drains the queue into the file and writes the counters (`final_`: the trace is complete).
fn write_out(t: &Tracer, final_: bool) {
    let t0 = Instant::now();
    let mut w = lock(&t.writer);
    loop {
        for msg in t.rx.try_iter() {
            if w.message(msg).is_err() {
                w.dropped += 1;
            }
        }
        if IN_FLIGHT.load(SeqCst) == 0 && t.rx.is_empty() {
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
    if let Err(e) = w.flush() {
        // The writer thread may not have met the error yet (a disk that filled at the end).
        let msg = format!("cannot write {}: {e}", w.path.display());
        drop(w);
        disable(&msg);
    }
}

/// In a forked child only the forking thread exists: abandon the parent's tracer (its lock may
/// be held by a thread that is gone) and start afresh on the child's first allocation call.
extern "C" fn in_forked_child() {
    crate::thread::forget_thread_id();
    crate::python::forget_codes();
    let old = TRACER.swap(null_mut(), SeqCst);
    if !old.is_null() {
        // SAFETY: reading a plain field of the leaked tracer; the fd is the parent's trace, which
        // the child must not write to.
        unsafe { libc::close((*old).fd) };
    }
    IN_FLIGHT.store(0, SeqCst);
    crate::clock::reset_seq();
    WARNED.store(false, SeqCst);
    STATE.store(UNINIT, SeqCst);
}
