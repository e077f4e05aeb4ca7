//! Per-thread reentrancy guard.
//!
//! While a hook runs on a thread, hooks entered again on that thread (the runtime calling the
//! driver inside `cudaMalloc`, or the tracer's own code) pass straight through: one event per
//! allocation, and no recursion into the tracer.

use std::cell::Cell;

thread_local! {
    // const-initialised and Drop-free: no lazy init and no destructor registration, so it is
    // usable at any point of a thread's life, teardown included.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Proof that this is the outermost hook on the thread. Dropping it leaves the hook. It keeps
/// where the thread's depth is (each thread-local lookup of this library is a call into the
/// loader), and is not `Send`: it is dropped on the thread that made it.
pub struct Guard(*const Cell<u32>);

impl Guard {
    /// `None` when the thread is already inside a hook (or is the tracer's own writer thread).
    #[link_section = ".text.hot.gpumemtrace"]
    pub fn enter() -> Option<Guard> {
        DEPTH
            .try_with(|d| {
                if d.get() == 0 {
                    d.set(1);
                    Some(Guard(d as *const Cell<u32>))
                } else {
                    None
                }
            })
            .ok()
            .flatten()
    }

    /// Marks the current thread as tracer-internal for good (the writer thread).
    pub fn forbid_on_this_thread() {
        let _ = DEPTH.try_with(|d| d.set(1));
    }
}

impl Drop for Guard {
    #[link_section = ".text.hot.gpumemtrace"]
    fn drop(&mut self) {
        // SAFETY: this thread's own `DEPTH` (the guard is not `Send`), which has no destructor
        // and so stays valid for as long as the thread runs, the hook's whole call included.
        unsafe { (*self.0).set(0) };
    }
}
