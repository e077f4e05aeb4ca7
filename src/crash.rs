//! Fatal signals: get what was recorded onto disk, then let the signal do exactly what it would
//! have done without us (the previous handler runs, or the default action: death by the same
//! signal, with a core dump where the default makes one).
//!
//! The handler is async-signal-safe: atomics, `sigaction`, `raise`, and the callback given to
//! [`install`] (the tracer's, which asks the writer thread, still running while this thread
//! handles the signal, to flush, and waits for it a bounded time with `nanosleep`). It never
//! takes a lock or allocates. Depends on nothing else in the crate.

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// Signals whose default action kills the process. SIGTERM is how batch schedulers stop jobs.
const SIGNALS: [c_int; 6] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT, libc::SIGILL, libc::SIGFPE, libc::SIGTERM];

/// The dispositions we replaced, by signal number (written once, before our handler is live).
static mut PREVIOUS: [MaybeUninit<libc::sigaction>; 65] = [const { MaybeUninit::uninit() }; 65];
static INSTALLED: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];
static HANDLING: AtomicBool = AtomicBool::new(false);
/// What the first fatal signal runs before the program's disposition (an `fn(i32)`; 0: none).
static ON_FATAL: AtomicUsize = AtomicUsize::new(0);

/// Installs the handlers (once per process image): `on_fatal(signal)` runs on the first fatal
/// signal, in the handler, so it must be async-signal-safe. Signals the program ignores stay
/// ignored.
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
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_signal as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(sig, &new, std::ptr::null_mut()) == 0 {
                INSTALLED[sig as usize].store(true, SeqCst);
            }
        }
    }
}

extern "C" fn on_signal(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // Only the first fatal signal flushes; one raised while flushing goes straight on.
    if !HANDLING.swap(true, SeqCst) {
        let f = ON_FATAL.load(SeqCst);
        if f != 0 {
            // SAFETY: ON_FATAL holds 0 or an `fn(i32)` stored by `install`.
            let f: fn(i32) = unsafe { std::mem::transmute::<usize, fn(i32)>(f) };
            f(sig);
        }
    }
    let i = sig as usize;
    if i >= INSTALLED.len() || !INSTALLED[i].load(SeqCst) {
        return;
    }
    // SAFETY: PREVIOUS[i] was initialised before INSTALLED[i] was set.
    let old = unsafe { (*std::ptr::addr_of!(PREVIOUS))[i].assume_init_ref() };
    if old.sa_sigaction == libc::SIG_DFL {
        // Restore the default and re-raise: the signal is blocked while we run, so it is
        // delivered as we return, and the process dies of it as it would have.
        // SAFETY: async-signal-safe calls.
        unsafe {
            libc::sigaction(sig, old, std::ptr::null_mut());
            libc::raise(sig);
        }
    } else if old.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the program's own handler, called as the kernel would have called it.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void) = unsafe { std::mem::transmute(old.sa_sigaction) };
        HANDLING.store(false, SeqCst);
        f(sig, info, ctx);
    } else {
        // SAFETY: as above, the one-argument form.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(old.sa_sigaction) };
        HANDLING.store(false, SeqCst);
        f(sig);
    }
}
