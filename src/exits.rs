//! `_exit` and `_Exit` end the process without exit handlers (multiprocessing workers leave
//! with `os._exit`, crash handlers with `_exit`): these wrappers finish the trace first, as at
//! exit, then make the real call. `quick_exit` runs `at_quick_exit` handlers, where the tracer
//! registers its exit handler too. A process that calls the `exit_group` system call directly
//! (or is killed) leaves its last events in the journal, where readers find them.

use std::ffi::c_int;

use crate::lazy::LazyFn;
use crate::resolve::next_fn;

type ExitFn = unsafe extern "C" fn(c_int) -> !;

static EXIT: LazyFn = LazyFn::new();
static EXIT_UPPER: LazyFn = LazyFn::new();

fn finish_then(slot: &LazyFn, name: &std::ffi::CStr, status: c_int) -> ! {
    let _ = std::panic::catch_unwind(crate::tracer::finish_before_exec);
    // SAFETY: `_exit` and `_Exit` have type `ExitFn`; each slot holds one of them.
    if let Some(real) = unsafe { next_fn::<ExitFn>(slot, name) } {
        // SAFETY: the program's own call, forwarded.
        unsafe { real(status) }
    }
    // SAFETY: the system call `_exit` makes; it does not return.
    unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    unreachable!("exit_group returned")
}

/// # Safety
/// As `_exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    finish_then(&EXIT, c"_exit", status)
}

/// # Safety
/// As `_Exit(3)`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    finish_then(&EXIT_UPPER, c"_Exit", status)
}
