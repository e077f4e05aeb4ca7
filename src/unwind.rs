//! Native stack capture: raw return addresses, innermost first, without our own frames.
//! Symbolization happens later, in the CLI.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use once_cell::sync::OnceCell;

use crate::record::Stack;
use crate::stackkey::hash;

/// Address range of this library's segments, to drop the tracer's own frames.
#[link_section = "gpumemtrace_hot"]
static OURS: OnceCell<Vec<(u64, u64)>> = OnceCell::new();

fn ours() -> &'static [(u64, u64)] {
    OURS.get_or_init(|| {
        let here = capture as fn(usize, &[(u64, u64)]) -> Stack as usize as u64;
        crate::modules::loaded_objects()
            .into_iter()
            .find(|o| o.contains(here))
            .map(|o| o.segments)
            .unwrap_or_default()
    })
}

/// Whether the fast unwinder (cached DWARF rules, src/fastunwind.rs) takes stacks, else libgcc's
/// (see `Config::backtrace_unwinder`): set when tracing starts.
#[link_section = "gpumemtrace_hot"]
static FAST: AtomicBool = AtomicBool::new(cfg!(target_arch = "x86_64"));

/// Chooses the unwinder (when tracing starts); the fast one exists on x86-64 only.
pub fn set_backtrace(backtrace: bool) {
    FAST.store(cfg!(target_arch = "x86_64") && !backtrace, Relaxed);
}

fn use_fast() -> bool {
    FAST.load(Relaxed)
}

/// Keys this thread has sent: a direct-mapped set (a lost slot only means frames are sent again).
const SEEN: usize = 1024;

struct PerThread {
    scratch: Vec<u64>,
    seen: Box<[u64; SEEN]>,
    /// The tracer start (`clock::epoch`) the set belongs to: a forked child's new writer knows
    /// none of the parent's keys.
    epoch: u64,
}

thread_local! {
    static PER_THREAD: RefCell<Option<PerThread>> = const { RefCell::new(None) };
}

/// Up to `max` caller frames of the current call, ending at the first frame inside `stop`,
/// interned per thread.
#[link_section = ".text.hot.gpumemtrace"]
pub fn capture(max: usize, stop: &[(u64, u64)]) -> Stack {
    if max == 0 {
        return Stack { key: 0, frames: Vec::new() };
    }
    let epoch = crate::clock::epoch();
    let r = PER_THREAD.try_with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else { return None };
        let p = p.get_or_insert_with(|| PerThread { scratch: Vec::with_capacity(max), seen: Box::new([0; SEEN]), epoch });
        if p.epoch != epoch {
            p.seen.fill(0);
            p.epoch = epoch;
        }
        // A walk taken whole from memory is copied out only if this thread has not sent its
        // frames yet (`wanted`): else its key alone is handed over.
        // The fast unwinder gives the key (kept with each walk); libgcc's walk is hashed here.
        let PerThread { scratch, seen, .. } = p;
        let mut decided = None;
        let known = capture_into(scratch, max, stop, |key| *decided.insert(first_use(seen, key)));
        let key = known.unwrap_or_else(|| hash(scratch));
        if key == 0 || !decided.unwrap_or_else(|| first_use(seen, key)) {
            return Some(Stack { key, frames: Vec::new() });
        }
        Some(Stack { key, frames: p.scratch.clone() })
    });
    match r {
        Ok(Some(s)) => s,
        _ => {
            // Thread teardown (or reentry): no per-thread state, send everything.
            let mut frames = Vec::with_capacity(max);
            let known = capture_into(&mut frames, max, stop, |_| true);
            Stack { key: known.unwrap_or_else(|| hash(&frames)), frames }
        }
    }
}

/// Whether this thread uses stack `key` for the first time (since the tracer started); marks it
/// used. Direct-mapped: a key that lost its slot is sent again, which is harmless.
fn first_use(seen: &mut [u64; SEEN], key: u64) -> bool {
    let slot = &mut seen[(key % SEEN as u64) as usize];
    let first = *slot != key;
    *slot = key;
    first
}

/// Stacks the fast unwinder could not take (libgcc's took them): reported in the trace, since
/// a process where this happens often pays libgcc's price per event.
pub static FALLBACKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Fills `frames`; returns their key when the fast unwinder gives it (a walk taken whole from
/// memory then fills `frames` only if `wanted(key)`).
#[link_section = ".text.hot.gpumemtrace"]
fn capture_into(frames: &mut Vec<u64>, max: usize, stop: &[(u64, u64)], wanted: impl FnOnce(u64) -> bool) -> Option<u64> {
    frames.clear();
    let ours = ours();
    #[cfg(target_arch = "x86_64")]
    if use_fast() {
        if let Ok(key) = crate::fastunwind::capture(frames, max, ours, stop, wanted) {
            return Some(key);
        }
        FALLBACKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
            frames.len() < max && !stop.iter().any(|&(s, e)| ip >= s && ip < e)
        });
    }
    None
}
