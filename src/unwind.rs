//! Native stack capture: raw return addresses, innermost first, without our own frames.
//! Symbolization happens later, in the CLI.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

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

/// Which unwinder: `GPUMEMTRACE_UNWINDER=fast` (default; cached DWARF rules, src/fastunwind.rs)
/// or `backtrace` (libgcc through the `backtrace` crate: the reference, ~100 ns a frame).
fn use_fast() -> bool {
    // 0: not read yet, 1: fast, 2: backtrace.
    static MODE: AtomicU8 = AtomicU8::new(0);
    match MODE.load(Relaxed) {
        1 => true,
        2 => false,
        _ => {
            let slow = std::env::var_os("GPUMEMTRACE_UNWINDER").is_some_and(|v| v == "backtrace");
            let fast = cfg!(target_arch = "x86_64") && !slow;
            MODE.store(if fast { 1 } else { 2 }, Relaxed);
            fast
        }
    }
}

/// Up to `max` caller frames of the current call.
pub fn capture(max: usize) -> Vec<u64> {
    let mut frames = Vec::with_capacity(max);
    if max == 0 {
        return frames;
    }
    let ours = ours();
    #[cfg(target_arch = "x86_64")]
    if use_fast() && crate::fastunwind::capture(&mut frames, max, ours).is_ok() {
        return frames;
    }
    frames.clear();
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
            if ip == 0 {
                return false; // libgcc's end of a thread's stack: nothing to record
            }
            in_tracer = false;
            frames.push(ip);
            frames.len() < max
        });
    }
    frames
}
