//! Native stack capture: raw return addresses, innermost first, without our own frames.
//! Symbolization happens later, in the CLI.

use once_cell::sync::OnceCell;

/// Address range of this library's segments, to drop the tracer's own frames.
static OURS: OnceCell<Vec<(u64, u64)>> = OnceCell::new();

fn ours() -> &'static [(u64, u64)] {
    OURS.get_or_init(|| {
        let here = capture as fn(usize) -> Vec<u64> as usize as u64;
        crate::modules::loaded_objects()
            .into_iter()
            .find(|o| o.contains(here))
            .map(|o| o.segments)
            .unwrap_or_default()
    })
}

/// Up to `max` caller frames of the current call.
pub fn capture(max: usize) -> Vec<u64> {
    let mut frames = Vec::with_capacity(max);
    if max == 0 {
        return frames;
    }
    let ours = ours();
    let mut in_tracer = true;
    // SAFETY: `trace_unsynchronized` is unsafe only because it takes no lock of its own around
    // the unwinder; libgcc's `_Unwind_Backtrace` is thread-safe (glibc >= 2.35 finds unwind
    // tables via `_dl_find_object`, older ones under the loader lock).
    unsafe {
        backtrace::trace_unsynchronized(|frame| {
            let ip = frame.ip() as u64;
            if in_tracer && ours.iter().any(|&(s, e)| ip >= s && ip < e) {
                return true;
            }
            in_tracer = false;
            frames.push(ip);
            frames.len() < max
        });
    }
    frames
}
