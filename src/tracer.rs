//! The tracer's life: started by the first allocation call (before that, no thread and no
//! file exist), one writer thread fed through a bounded lock-free channel, a drain at exit,
//! and a fresh start in a forked child.
//!
//! States: `UNINIT` -> `STARTING` -> `RUNNING` -> `DIRECT` (after exit began: events are written
//! synchronously by the calling thread) or `OFF` (disabled by configuration, or after an error:
//! hooks then only forward calls).

use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender};

use crate::config::Config;
use crate::writer::{Writer, FLUSH_INTERVAL};

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const RUNNING: u8 = 2;
const DIRECT: u8 = 3;
const OFF: u8 = 4;

/// Queue length between the hooks and the writer. When full, hooks wait (back-pressure):
/// dropping events would corrupt live-memory accounting.
const QUEUE: usize = 4096;

/// What the hooks hand to the writer, in order.
pub enum Msg {
    Event(RawEvent),
    Phase(RawPhase),
}

/// A phase boundary (`gpumemtrace_push` / `_pop` / `_mark`, NVTX ranges).
pub struct RawPhase {
    /// CLOCK_MONOTONIC, absolute.
    pub time_ns: u64,
    pub tid: u32,
    pub op: gpumemtrace_format::PhaseOp,
    pub name: String,
}

/// An event as the hot path captured it, before interning.
pub struct RawEvent {
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
    pub frames: Vec<u64>,
    /// The calling thread's Python stack; `None` when no supported interpreter runs.
    pub py: Option<Box<crate::python::PyCapture>>,
    /// The thread's name, on its first event.
    pub thread_name: Option<String>,
}

struct Tracer {
    tx: Sender<Msg>,
    rx: Receiver<Msg>,
    writer: Mutex<Writer>,
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

pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn is_off() -> bool {
    STATE.load(SeqCst) == OFF
}

pub fn max_frames() -> usize {
    MAX_FRAMES.load(SeqCst)
}

fn tracer() -> Option<&'static Tracer> {
    let p = TRACER.load(SeqCst);
    // SAFETY: TRACER is null or a leaked Box that is never freed.
    (!p.is_null()).then(|| unsafe { &*p })
}

fn lock(w: &Mutex<Writer>) -> MutexGuard<'_, Writer> {
    w.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tells the user once, on stderr, and stops tracing; the program is unaffected.
pub fn disable(why: &str) {
    STATE.store(OFF, SeqCst);
    if !WARNED.swap(true, SeqCst) {
        eprintln!("gpumemtrace: {why}; tracing is off for the rest of this process");
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
    if let Err(e) = w.message(msg).and_then(|_| w.flush()) {
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
    let config = Config::from_env();
    if config.disabled {
        STATE.store(OFF, SeqCst);
        return;
    }
    match open(&config) {
        Ok(t) => {
            TRACER.store(Box::into_raw(Box::new(t)), SeqCst);
            if !ONCE_PER_IMAGE.swap(true, SeqCst) {
                // SAFETY: registering plain extern "C" handlers; they never unwind.
                unsafe {
                    libc::atexit(at_exit);
                    libc::pthread_atfork(None, None, Some(in_forked_child));
                }
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
    crate::python::set_enabled(config.python);
    let target = crate::output::target(config.output.as_deref(), std::process::id());
    let (file, path) =
        crate::output::create(&target).map_err(|e| format!("cannot create trace file {}: {e}", target.display()))?;
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let early = std::mem::take(&mut *EARLY_PHASES.lock().unwrap_or_else(|e| e.into_inner()));
    let writer = Writer::create(file, path.clone(), now_ns(), config.max_frames, early)
        .map_err(|e| format!("cannot write trace file {}: {e}", path.display()))?;
    let (tx, rx) = bounded(QUEUE);
    Ok(Tracer { tx, rx, writer: Mutex::new(writer), fd })
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
    loop {
        if STATE.load(SeqCst) != RUNNING {
            return; // exit drain or error: the rest is done by whoever changed the state
        }
        let mut w = lock(&t.writer);
        let r = match t.rx.recv_timeout(FLUSH_INTERVAL) {
            Ok(msg) => {
                let mut r = w.message(msg);
                // Batch whatever else is queued, under the same lock.
                for msg in t.rx.try_iter().take(QUEUE) {
                    r = r.and_then(|_| w.message(msg));
                }
                r.and_then(|_| w.flush_if_due())
            }
            Err(RecvTimeoutError::Timeout) => w.flush_if_due(),
            Err(RecvTimeoutError::Disconnected) => return,
        };
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

/// At exit: switch hooks to synchronous writes, drain the queue, mark the trace complete.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(finish);
}

fn finish() {
    let Some(t) = tracer() else { return };
    if STATE.compare_exchange(RUNNING, DIRECT, SeqCst, SeqCst).is_err() {
        return;
    }
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
    w.stats(true);
    let _ = w.flush();
}

/// In a forked child only the forking thread exists: abandon the parent's tracer (its lock may
/// be held by a thread that is gone) and start afresh on the child's first allocation call.
extern "C" fn in_forked_child() {
    crate::hotpath::forget_thread_id();
    crate::python::forget_codes();
    let old = TRACER.swap(null_mut(), SeqCst);
    if !old.is_null() {
        // SAFETY: reading a plain field of the leaked tracer; the fd is the parent's trace, which
        // the child must not write to.
        unsafe { libc::close((*old).fd) };
    }
    IN_FLIGHT.store(0, SeqCst);
    WARNED.store(false, SeqCst);
    STATE.store(UNINIT, SeqCst);
}
