//! Pausing: `gpumemtrace_pause()` / `gpumemtrace_resume()`, exported C functions (callable from
//! Python with ctypes, like the phase marks). While paused every hook only forwards its call, as
//! if the library were not there; nothing is recorded, so a trace with pauses cannot balance
//! allocations against frees: the writer says so in a notice, with the number of pauses.
//!
//! What it is for: measuring what tracing costs inside one process, in windows of steps traced
//! and paused in turn (examples/gpu/perf_blocks.py `alternate`), where separate runs of the same
//! loop differ by more than the cost being measured. Also usable to leave a phase out of a trace.

use std::ffi::c_int;

use crate::tracer;

/// Stops recording until `gpumemtrace_resume`. Returns 0. Pauses do not nest.
#[no_mangle]
pub extern "C" fn gpumemtrace_pause() -> c_int {
    tracer::set_paused(true);
    0
}

/// Records again after `gpumemtrace_pause`. Returns 0.
#[no_mangle]
pub extern "C" fn gpumemtrace_resume() -> c_int {
    tracer::set_paused(false);
    0
}
