//! Phases: names for stretches of a run ("forward", "backward", "optimizer"), so reports can say
//! what each phase allocated. Programs mark them through three exported C functions (callable
//! from Python with ctypes); NVTX ranges arrive through `nvtx`.
//!
//! ```python
//! import ctypes
//! gmt = ctypes.CDLL(None)                      # the preloaded library's symbols
//! gmt.gpumemtrace_push(b"forward"); ...; gmt.gpumemtrace_pop()
//! gmt.gpumemtrace_mark(b"epoch 2")
//! ```
//!
//! Each is a no-op returning 0 when tracing is off. None of them starts the tracer by itself.

use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpumemtrace_format::PhaseOp;

use crate::record::RawPhase;
use crate::tracer;

/// Records a phase boundary on the calling thread.
pub fn record(op: PhaseOp, name: &str) {
    if tracer::is_off() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let name = name.to_owned();
        let stamp = tracer::stamp(None);
        tracer::submit_phase(RawPhase { seq: stamp.key, time_ns: stamp.time, tid: crate::thread::thread_id(), op, name }, &stamp)
    }));
}

/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn name_of<'a>(name: *const c_char) -> std::borrow::Cow<'a, str> {
    if name.is_null() {
        return "".into();
    }
    // SAFETY: per this function's contract.
    unsafe { CStr::from_ptr(name) }.to_string_lossy()
}

/// Opens a phase on the calling thread; events on it belong to `name` until the matching pop.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumemtrace_push(name: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    record(PhaseOp::Push, &unsafe { name_of(name) });
    0
}

/// Closes the calling thread's innermost open phase.
#[no_mangle]
pub extern "C" fn gpumemtrace_pop() -> c_int {
    record(PhaseOp::Pop, "");
    0
}

/// Sets the process-wide phase: events on threads without an open range belong to `name`.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumemtrace_mark(name: *const c_char) -> c_int {
    // SAFETY: forwarded contract.
    record(PhaseOp::Mark, &unsafe { name_of(name) });
    0
}
