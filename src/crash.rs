//! Fatal signals: get what was recorded onto disk, then let the signal do exactly what it would
//! have done without us (the previous handler runs, or the default action: death by the same
//! signal, with a core dump where the default makes one).
//!
//! The host's disposition is honoured as the kernel would have honoured it:
//! - our handler is installed with the host's `sa_mask`, `SA_NODEFER`, `SA_ONSTACK` and
//!   `SA_RESTART`, so the kernel blocks the same signals, delivers on the same stack and restarts
//!   (or interrupts) the same system calls as for the host's handler;
//! - `SA_RESETHAND` is emulated: the host's handler runs once, and the next delivery takes the
//!   default action (a one-shot handler that returns without fixing the fault dies of it, as
//!   without us, instead of running forever);
//! - the host's handler is called with the kernel's `siginfo_t` and context (what it changes in
//!   the context, say the instruction pointer, takes effect on return), whether or not it asked
//!   for `SA_SIGINFO` (the kernel passes them either way on x86-64).
//!
//! Only a signal that is about to kill the process gets the flush: the default action, or a
//! host handler that set the default back and left the signal pending. A fault the host handles
//! (a language runtime's guard page, fixed with `mprotect`) costs a few system calls, no wait.
//! A host handler that ends the process with `_exit` finishes the trace there (`exits`).
//!
//! The handler is async-signal-safe: atomics, `sigaction`, `sigpending`, `raise`, and the
//! callback given to [`install`] (the tracer's, which asks the writer thread, still running
//! while this thread handles the signal, to flush, and waits for it a bounded time with
//! `nanosleep`). It never takes a lock or allocates. Depends on nothing else in the crate.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// Signals whose default action kills the process. SIGTERM is how batch schedulers stop jobs.
const SIGNALS: [c_int; 6] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL, libc::SIGFPE, libc::SIGTERM];

/// The dispositions we replaced, by signal number (written once, before our handler is live).
static mut PREVIOUS: [MaybeUninit<libc::sigaction>; 65] = [const { MaybeUninit::uninit() }; 65];
static INSTALLED: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
/// The host's handler had `SA_RESETHAND` and has run: the signal's action is the default now.
static RESET: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
/// The flush for a signal that kills the process has been done (once: the process is dying).
static FATAL_FLUSHED: AtomicBool = AtomicBool::new(false);
/// What a fatal signal runs before the program's disposition (an `fn(i32)`; 0: none).
static ON_FATAL: AtomicUsize = AtomicUsize::new(0);

/// The `sa_flags` that change how the kernel delivers to a handler, taken over from the host's.
const DELIVERY_FLAGS: c_int = libc::SA_NODEFER | libc::SA_ONSTACK | libc::SA_RESTART;

/// Installs the handlers (once per process image): `on_fatal(signal)` runs, in the handler,
/// when a signal is about to kill the process, so it must be async-signal-safe. Signals the
/// program ignores stay ignored.
pub fn install(on_fatal: fn(i32)) {
    ON_FATAL.store(on_fatal as usize, SeqCst);
    for sig in SIGNALS {
        // SAFETY: plain sigaction calls on a zeroed struct; PREVIOUS[sig] is written before our
        // handler is installed and never again, so the handler reads initialised memory.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 || old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            (*std::ptr::addr_of_mut!(PREVIOUS))[sig as usize] = MaybeUninit::new(old);
            let new = our_action(&old);
            if libc::sigaction(sig, &new, std::ptr::null_mut()) == 0 {
                INSTALLED[sig as usize].store(true, SeqCst);
            }
        }
    }
}

/// Our handler's disposition standing in for `old`: delivered as `old` would have been.
fn our_action(old: &libc::sigaction) -> libc::sigaction {
    // SAFETY: a zeroed sigaction is a valid value; sigemptyset on a local set.
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = on_signal as *const () as usize;
    if old.sa_sigaction == libc::SIG_DFL {
        // The process dies of it: any stack the host set up for signals is the safer one.
        new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: initialises a local sigset.
        unsafe { libc::sigemptyset(&mut new.sa_mask) };
    } else {
        new.sa_flags = libc::SA_SIGINFO | (old.sa_flags & DELIVERY_FLAGS);
        new.sa_mask = old.sa_mask;
    }
    new
}

/// The flush for a signal that kills the process (first time only).
fn flush_for_death(sig: c_int) {
    if !FATAL_FLUSHED.swap(true, SeqCst) {
        call_on_fatal(sig);
    }
}

fn call_on_fatal(sig: c_int) {
    let f = ON_FATAL.load(SeqCst);
    if f != 0 {
        // SAFETY: ON_FATAL holds 0 or an `fn(i32)` stored by `install`.
        let f: fn(i32) = unsafe { std::mem::transmute::<usize, fn(i32)>(f) };
        f(sig);
    }
}

/// Whether `sig`, pending now, will kill the process when this handler returns: its action is
/// the default (the host's handler set it back) and it waits for delivery.
fn pending_and_default(sig: c_int) -> bool {
    // SAFETY: sigaction (query only) and sigpending on local out-structs: async-signal-safe.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut cur) != 0 || cur.sa_sigaction != libc::SIG_DFL {
            return false;
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigpending(&mut set) == 0 && libc::sigismember(&set, sig) == 1
    }
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    if i >= INSTALLED.len() || !INSTALLED[i].load(SeqCst) {
        return;
    }
    // SAFETY: PREVIOUS[i] was initialised before INSTALLED[i] was set.
    let old = unsafe { (*std::ptr::addr_of!(PREVIOUS))[i].assume_init_ref() };
    let mut host = old.sa_sigaction != libc::SIG_DFL;
    if host && old.sa_flags & libc::SA_RESETHAND != 0 && RESET[i].swap(true, SeqCst) {
        host = false; // the one-shot handler has run: the default action now
    }
    if !host {
        flush_for_death(sig);
        // Restore the default and re-raise: the signal is blocked while we run (unless the host
        // asked for SA_NODEFER, then it kills right here), so it is delivered as we return, and
        // the process dies of it as it would have.
        // SAFETY: async-signal-safe calls on a zeroed (SIG_DFL) action.
        unsafe {
            let mut dfl: libc::sigaction = std::mem::zeroed();
            libc::sigemptyset(&mut dfl.sa_mask);
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
            libc::raise(sig);
        }
        return;
    }
    // SAFETY: the program's own handler, called with what the kernel gave us. Both handler
    // forms take the signal number first; the one-argument form ignores the other two.
    let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(old.sa_sigaction) };
    f(sig, info, ctx);
    if pending_and_default(sig) {
        flush_for_death(sig);
    }
}
