//! The pause count (`control`'s `gpumemtrace_pause`): how many times tracing was paused, for the
//! writer's notice. The switch itself is `tracer`'s, beside the state every hook reads.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

static PAUSES: AtomicU64 = AtomicU64::new(0);

/// One more pause.
pub fn counted() {
    PAUSES.fetch_add(1, Relaxed);
}

/// Pauses so far.
pub fn count() -> u64 {
    PAUSES.load(Relaxed)
}
