//! `exec*` replaces the process image without running exit handlers: whatever the writer has not
//! written yet would be lost. These wrappers finish the trace (as at exit) before the real call.
//! If the exec fails, tracing goes on, writing synchronously.
//!
//! glibc's variadic `execl`, `execlp` and `execle` call the kernel through internal symbols and
//! cannot be interposed from Rust; after those, the periodic flush bounds the loss to 10 ms.

use std::ffi::{c_char, c_int};

use crate::lazy::LazyFn;
use crate::resolve::next_fn;

type ExecveFn = unsafe extern "C" fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
type ExecvFn = unsafe extern "C" fn(*const c_char, *const *const c_char) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, *const *const c_char, *const *const c_char) -> c_int;

// The real functions, found on first use.
static EXECVE: LazyFn = LazyFn::new();
static EXECV: LazyFn = LazyFn::new();
static EXECVP: LazyFn = LazyFn::new();
static EXECVPE: LazyFn = LazyFn::new();
static FEXECVE: LazyFn = LazyFn::new();

fn enosys() -> c_int {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

fn before_exec() {
    let _ = std::panic::catch_unwind(crate::tracer::finish_before_exec);
}

/// # Safety
/// As `execve(2)`.
#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: the real execve with the caller's arguments.
    unsafe { next_fn::<ExecveFn>(&EXECVE, c"execve").map_or_else(enosys, |f| f(path, argv, envp)) }
}

/// # Safety
/// As `execv(3)`.
#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: as above.
    unsafe { next_fn::<ExecvFn>(&EXECV, c"execv").map_or_else(enosys, |f| f(path, argv)) }
}

/// # Safety
/// As `execvp(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: as above.
    unsafe { next_fn::<ExecvFn>(&EXECVP, c"execvp").map_or_else(enosys, |f| f(file, argv)) }
}

/// # Safety
/// As `execvpe(3)`.
#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: as above.
    unsafe { next_fn::<ExecveFn>(&EXECVPE, c"execvpe").map_or_else(enosys, |f| f(file, argv, envp)) }
}

/// # Safety
/// As `fexecve(3)`.
#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    before_exec();
    // SAFETY: as above.
    unsafe { next_fn::<FexecveFn>(&FEXECVE, c"fexecve").map_or_else(enosys, |f| f(fd, argv, envp)) }
}
