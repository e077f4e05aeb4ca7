//! Per-thread reentrancy guard.
//!
//! While a hook runs on a thread, hooks entered again on that thread (the runtime calling the
//! driver inside `cudaMalloc`, or the tracer's own code) pass straight through: one event per
//! allocation, and no recursion into the tracer.

use crate::thread::{self, Me};

/// Proof that this is the outermost hook on the thread. Dropping it leaves the hook. It keeps
/// where the thread's state is (each thread-local lookup of this library is a call into the
/// loader), and is not `Send`: it is dropped on the thread that made it.
pub struct Guard(*const Me);

impl Guard {
    /// `None` when the thread is already inside a hook (or is the tracer's own writer thread).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn enter() -> Option<Guard> {
        thread::with_me(|m| {
            if m.depth.get() == 0 {
                m.depth.set(1);
                Some(Guard(m as *const Me))
            } else {
                None
            }
        })
        .flatten()
    }

    /// Marks the current thread as tracer-internal for good (the writer thread).
    pub fn forbid_on_this_thread() {
        thread::with_me(|m| m.depth.set(1));
    }

    /// The thread's id, and its name on its first event (`thread::Me::identity`), without a
    /// thread-local lookup.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn identity(&self) -> (u32, Option<String>) {
        // SAFETY: this thread's own state (the guard is not `Send`), which has no destructor and
        // so stays valid for as long as the thread runs, the hook's whole call included.
        unsafe { (*self.0).identity() }
    }

    /// The thread's ring as last claimed: (tracer start, ring), without a thread-local lookup.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn ring(&self) -> (u64, u32) {
        // SAFETY: as in `identity`.
        unsafe { (*self.0).ring.get() }
    }

    pub fn set_ring(&self, claim: (u64, u32)) {
        // SAFETY: as in `identity`.
        unsafe { (*self.0).ring.set(claim) }
    }

    /// Whether this is the process's main thread, without a thread-local lookup.
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn is_main_thread(&self) -> bool {
        // SAFETY: as in `identity`.
        unsafe { (*self.0).is_main() }
    }
}

impl Drop for Guard {
    #[link_section = ".text.hot.gpumemtrace"]
    fn drop(&mut self) {
        // SAFETY: as in `identity`.
        unsafe { (*self.0).depth.set(0) };
    }
}
