//! Self-measurement (`GPUMEMTRACE_SELF_TIME=1`): the time hooks add on the calling thread, by
//! part, written at the end of the trace as a notice. A training loop's step time varies by
//! ±10-15 % between identical runs on a shared host, far more than the tracer's cost; the
//! tracer's own counts of what it added per event, and per part (Python stack, native stack,
//! hand-off), are exact and need no untraced run beside them. Off by default: on, it reads the
//! time-stamp counter up to seven times an event; the cost of one read is taken off each part.
//!
//! What it cannot see: the writer thread's work (on another core, unless cores are short) and
//! what the hooks' memory traffic costs the host's code afterwards. Benchmarks against an
//! untraced run measure those (docs/performance.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crossbeam_utils::CachePadded;

/// Parts of a hook's added time, in the order a hook passes them: before the real call (a free
/// is stamped first, and the event's fields), the Python stack, the native stack,
/// the hand-off (encoding into the thread's ring, and waiting for room if it came to that), and
/// everything else after the call (guards, device lookup, bookkeeping).
const PARTS: usize = 5;
const NAMES: [&str; PARTS] = ["before the call", "Python stack", "native stack", "hand-off", "other"];

/// Events with a Python and a native stack, with a native stack alone (threads without Python,
/// such as autograd's) and without stacks (frees) apart: their costs differ by design.
#[derive(Clone, Copy)]
pub enum Kind {
    Python = 0,
    Native = 1,
    Bare = 2,
}
const KINDS: usize = 3;

#[link_section = "gpumemtrace_hot"]
static ON: AtomicBool = AtomicBool::new(false);
static START: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));
/// What reading the counter costs (the least of many back-to-back reads): each part is a span
/// between two reads, so one read's cost is taken off each.
static MARK_TICKS: AtomicU64 = AtomicU64::new(0);

/// Log-linear buckets of an event's added ticks: 8 per power of two (within 9 % of the value).
const SUB: usize = 8;
const BUCKETS: usize = 64 * SUB;

struct Totals {
    events: AtomicU64,
    parts: [AtomicU64; PARTS],
    hist: [AtomicU64; BUCKETS],
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NONE_YET: Totals = Totals { events: ZERO, parts: [ZERO; PARTS], hist: [ZERO; BUCKETS] };

/// One stripe of the counts: threads add to the stripe of their id, so that measuring does not
/// make the threads wait for each other's lines (one set of counters for all threads cost each
/// event several hundred nanoseconds at eight threads, inside the spans it measured).
struct Stripe {
    kinds: [Totals; KINDS],
    sub_ticks: [AtomicU64; SUBS],
    sub_counts: [AtomicU64; SUBS],
}
const STRIPES: usize = 16;
/// Padded, so a stripe shares no line with another, nor with what every hook reads.
#[allow(clippy::declare_interior_mutable_const)]
const NEW_STRIPE: CachePadded<Stripe> = CachePadded::new(Stripe { kinds: [NONE_YET; KINDS], sub_ticks: [ZERO; SUBS], sub_counts: [ZERO; SUBS] });
/// On the heap, made when measuring starts: about 200 KiB, which as `.bss` here would put the
/// statics every hook reads (the clock's, the tracer's) on pages of their own.
static STRIPED: once_cell::sync::OnceCell<Box<[CachePadded<Stripe>]>> = once_cell::sync::OnceCell::new();

/// The calling thread's stripe, once measuring has started.
#[inline]
fn stripe() -> Option<&'static Stripe> {
    STRIPED.get().map(|s| &*s[crate::thread::thread_id() as usize % STRIPES])
}

/// Parts of the native stack's time (src/fastunwind.rs): evaluating unwind rules, finding how a
/// frame uses rbp (a second, poisoned evaluation), and checking the memo of the previous walk;
/// and, counted in the parts above, stamping the event (`tracer::stamp`: the clock read and the
/// noted key, after the ring's mark, a plain increment on the thread's own line).
#[derive(Clone, Copy)]
pub enum Sub {
    Rule = 0,
    Classify = 1,
    Memo = 2,
    Stamp = 3,
}
const SUBS: usize = 4;
const NATIVE_SUBS: usize = 3;
const SUB_NAMES: [&str; SUBS] = ["rules", "rbp use", "memo checks", "order stamps"];

/// Adds the time since `since` (a `mark`) to `sub`; returns the mark it took (0 when off).
#[inline]
pub fn add(sub: Sub, since: u64) -> u64 {
    if since == 0 {
        return 0;
    }
    let now = crate::clock::ticks();
    if let Some(s) = stripe() {
        s.sub_ticks[sub as usize].fetch_add(now.saturating_sub(since).saturating_sub(MARK_TICKS.load(Relaxed)), Relaxed);
        s.sub_counts[sub as usize].fetch_add(1, Relaxed);
    }
    now
}

/// When tracing starts (from `Config`).
pub fn enable(on: bool) {
    if on {
        let mut least = u64::MAX;
        for _ in 0..1000 {
            let a = crate::clock::ticks();
            least = least.min(crate::clock::ticks().saturating_sub(a));
        }
        MARK_TICKS.store(least, Relaxed);
        START.0.store(crate::clock::ticks(), Relaxed);
        START.1.store(crate::clock::monotonic_ns(), Relaxed);
        STRIPED.get_or_init(|| (0..STRIPES).map(|_| NEW_STRIPE).collect::<Vec<_>>().into_boxed_slice());
    }
    ON.store(on, Relaxed);
}

/// The counter now, or 0 when self-measurement is off (then nothing is counted).
#[inline]
pub fn mark() -> u64 {
    if ON.load(Relaxed) {
        crate::clock::ticks()
    } else {
        0
    }
}

/// One event's parts (see `PARTS`), in ticks.
pub fn count(kind: Kind, parts: [u64; PARTS]) {
    if !ON.load(Relaxed) {
        return;
    }
    let Some(s) = stripe() else { return };
    let t = &s.kinds[kind as usize];
    let read = MARK_TICKS.load(Relaxed);
    let parts = parts.map(|p| p.saturating_sub(read));
    let total: u64 = parts.iter().sum();
    t.events.fetch_add(1, Relaxed);
    for (slot, v) in t.parts.iter().zip(parts) {
        slot.fetch_add(v, Relaxed);
    }
    t.hist[bucket(total)].fetch_add(1, Relaxed);
}

/// Durations between consecutive marks (0 where a mark was not taken).
pub fn spans<const N: usize>(marks: [u64; N]) -> [u64; N] {
    let mut out = [0; N];
    for i in 1..N {
        out[i - 1] = marks[i].saturating_sub(marks[i - 1]);
    }
    out
}

fn bucket(t: u64) -> usize {
    if t < SUB as u64 {
        return t as usize;
    }
    let log = 63 - t.leading_zeros() as usize; // >= 3
    let sub = ((t >> (log - 3)) & (SUB as u64 - 1)) as usize;
    (log * SUB + sub).min(BUCKETS - 1)
}

/// The smallest value of bucket `b` and the next bucket's: the value reported is their middle.
fn bucket_middle(b: usize) -> f64 {
    if b < SUB {
        return b as f64;
    }
    let (log, sub) = (b / SUB, b % SUB);
    let lo = ((SUB + sub) as f64) * 2f64.powi(log as i32 - 3);
    lo * (1.0 + 0.5 / (SUB + sub) as f64)
}

/// The notice the writer puts at the end of the trace; `None` when off or nothing was counted.
pub fn report() -> Option<String> {
    if !ON.load(Relaxed) {
        return None;
    }
    let (t1, n1) = (crate::clock::ticks(), crate::clock::monotonic_ns());
    let (t0, n0) = (START.0.load(Relaxed), START.1.load(Relaxed));
    if t1 <= t0 || n1 <= n0 {
        return None;
    }
    let ns_per_tick = (n1 - n0) as f64 / (t1 - t0) as f64;
    let mut lines = Vec::new();
    for (kind, label) in [
        (Kind::Python, "with Python and native stacks"),
        (Kind::Native, "with a native stack only"),
        (Kind::Bare, "without stacks (frees)"),
    ] {
        let Some(stripes) = STRIPED.get() else { break };
        let of_kind = || stripes.iter().map(|s| &s.kinds[kind as usize]);
        let n: u64 = of_kind().map(|t| t.events.load(Relaxed)).sum();
        if n == 0 {
            continue;
        }
        let hist: Vec<u64> = (0..BUCKETS).map(|b| of_kind().map(|t| t.hist[b].load(Relaxed)).sum()).collect();
        let quantile = |q: f64| {
            let want = ((n as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (b, &c) in hist.iter().enumerate() {
                seen += c;
                if seen >= want {
                    return bucket_middle(b) * ns_per_tick;
                }
            }
            0.0
        };
        let parts: Vec<f64> =
            (0..PARTS).map(|p| of_kind().map(|t| t.parts[p].load(Relaxed)).sum::<u64>() as f64 * ns_per_tick / n as f64).collect();
        let mean: f64 = parts.iter().sum();
        let split = NAMES.iter().zip(&parts).map(|(name, v)| format!("{name} {v:.0}")).collect::<Vec<_>>().join(", ");
        lines.push(format!(
            "{n} events {label}: added per event median {:.0} ns, p90 {:.0}, p99 {:.0}, mean {mean:.0} ({split}); {:.3} ms in all",
            quantile(0.5),
            quantile(0.9),
            quantile(0.99),
            mean * n as f64 / 1e6
        ));
    }
    let stripes = STRIPED.get().map_or(&[][..], |s| &s[..]);
    let sub = |i: usize| {
        let t: u64 = stripes.iter().map(|s| s.sub_ticks[i].load(Relaxed)).sum();
        let n: u64 = stripes.iter().map(|s| s.sub_counts[i].load(Relaxed)).sum();
        (n > 0).then(|| format!("{} {:.3} ms in {n} ({:.0} ns each)", SUB_NAMES[i], t as f64 * ns_per_tick / 1e6, t as f64 * ns_per_tick / n as f64))
    };
    let subs: Vec<String> = (0..NATIVE_SUBS).filter_map(sub).collect();
    if !subs.is_empty() {
        lines.push(format!("native stacks: {}", subs.join(", ")));
    }
    if let Some(stamps) = sub(Sub::Stamp as usize) {
        lines.push(format!("of all parts: {stamps}"));
    }
    if !lines.is_empty() {
        let keys = if crate::clock::keys_are_times() { "timestamps" } else { "process-wide numbers" };
        lines.push(format!("hooks read the time with {}, and order events by {keys}", crate::clock::describe()));
    }
    (!lines.is_empty()).then(|| format!("self time (GPUMEMTRACE_SELF_TIME): {}", lines.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_within_a_ninth_of_their_values() {
        let mut last = 0;
        for t in [0u64, 1, 7, 8, 9, 15, 16, 100, 1000, 12345, 1 << 40] {
            let b = bucket(t);
            assert!(b >= last, "{t}");
            last = b;
            if t >= 8 {
                let mid = bucket_middle(b);
                assert!((mid - t as f64).abs() <= t as f64 / 9.0, "{t} -> {mid}");
            }
        }
    }

    #[test]
    fn spans_are_the_gaps_between_marks() {
        assert_eq!(spans([10, 15, 15, 40]), [5, 0, 25, 0]);
    }
}
