//! The pause switch (`control`'s `gpumemtrace_pause`/`gpumemtrace_resume`): read by every hook
//! through `tracer::is_off`, counted for the writer's notice.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};

static PAUSED: AtomicBool = AtomicBool::new(false);
static PAUSES: AtomicU64 = AtomicU64::new(0);

/// Pauses (`on`) or resumes. Pauses do not nest; a hook that read "not paused" just before
/// finishes its event.
pub fn set(on: bool) {
    if on {
        if !PAUSED.swap(true, SeqCst) {
            PAUSES.fetch_add(1, Relaxed);
        }
    } else {
        PAUSED.store(false, SeqCst);
    }
}

#[inline]
pub fn paused() -> bool {
    PAUSED.load(Relaxed)
}

/// Pauses so far.
pub fn count() -> u64 {
    PAUSES.load(Relaxed)
}
