//! Time and order: the clock every record is stamped with, the order keys that order calls
//! across threads (the timestamps themselves, where the clock can), and the count of tracer
//! starts. Depends on nothing.
//!
//! The clock is CLOCK_MONOTONIC in nanoseconds. Where the CPU's time-stamp counter is invariant
//! and the kernel itself keeps time with it (its clocksource is `tsc`, which it chose only after
//! checking that the counters of all CPUs agree), a hook reads the counter instead of calling
//! `clock_gettime` (about half the cost, on the VM of docs/performance.md) and converts it with
//! a linear map fitted to CLOCK_MONOTONIC: timestamps stay nanoseconds of that clock, so nothing
//! downstream knows the difference. The writer refits the map now and then (`refine`).

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};

use crossbeam_utils::CachePadded;

/// CLOCK_MONOTONIC, in nanoseconds.
#[link_section = ".text.hot.gpumemtrace"]
pub fn now_ns() -> u64 {
    if TSC.load(Relaxed) {
        if let Some(ns) = tsc_ns(ticks()) {
            return ns;
        }
    }
    monotonic_ns()
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The time-stamp counter (0 where there is none).
#[cfg(target_arch = "x86_64")]
pub fn ticks() -> u64 {
    // SAFETY: rdtsc reads a register; it exists on every x86-64 CPU.
    unsafe { core::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
pub fn ticks() -> u64 {
    0
}

/// Whether hooks read the counter (set by `calibrate`).
#[link_section = "gpumemtrace_hot"]
static TSC: AtomicBool = AtomicBool::new(false);

/// How hooks read the time, for self-measurement's notice: the counter, or `clock_gettime`
/// and the kernel's clocksource behind it (a paravirtual one costs more a read).
pub fn describe() -> String {
    if TSC.load(Relaxed) {
        return "the time-stamp counter".to_owned();
    }
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    format!("clock_gettime (clocksource {})", source.as_deref().map_or("unknown", str::trim))
}

/// The map from ticks to nanoseconds, `ns = NS0 + (ticks - T0) * MULT / 2^32`, behind a
/// sequence lock (odd while the writer changes it; readers retry).
#[link_section = "gpumemtrace_hot"]
static MAP_SEQ: AtomicU64 = AtomicU64::new(0);
#[link_section = "gpumemtrace_hot"]
static T0: AtomicU64 = AtomicU64::new(0);
#[link_section = "gpumemtrace_hot"]
static NS0: AtomicU64 = AtomicU64::new(0);
#[link_section = "gpumemtrace_hot"]
static MULT: AtomicU64 = AtomicU64::new(0);
/// The first calibration point and the last refit (ticks, ns): the long baseline the map's
/// slope is measured over.
static FIRST: (AtomicU64, AtomicU64) = (AtomicU64::new(0), AtomicU64::new(0));
static LAST_REFIT_NS: AtomicU64 = AtomicU64::new(0);

#[link_section = ".text.hot.gpumemtrace"]
fn tsc_ns(t: u64) -> Option<u64> {
    for _ in 0..64 {
        let s = MAP_SEQ.load(Acquire);
        if s & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let (t0, ns0, mult) = (T0.load(Relaxed), NS0.load(Relaxed), MULT.load(Relaxed));
        fence(Acquire);
        if MAP_SEQ.load(Relaxed) == s {
            return Some(map(t, t0, ns0, mult));
        }
    }
    None // the writer is (rarely) changing the map right now
}

fn map(t: u64, t0: u64, ns0: u64, mult: u64) -> u64 {
    let d = ((t as i128 - t0 as i128) * mult as i128) >> 32;
    (ns0 as i128 + d).max(0) as u64
}

fn set_map(t0: u64, ns0: u64, mult: u64) {
    MAP_SEQ.fetch_add(1, AcqRel);
    T0.store(t0, Relaxed);
    NS0.store(ns0, Relaxed);
    MULT.store(mult, Relaxed);
    MAP_SEQ.fetch_add(1, Release);
}

/// A (ticks, ns) pair read as close together as this thread can: the tick read between two
/// clock reads, the closest of a few tries.
fn pair() -> (u64, u64) {
    let mut best = (u64::MAX, 0, 0);
    for _ in 0..8 {
        let a = monotonic_ns();
        let t = ticks();
        let b = monotonic_ns();
        if b - a < best.0 {
            best = (b - a, t, a + (b - a) / 2);
        }
    }
    (best.1, best.2)
}

/// Whether the counter can stand in for CLOCK_MONOTONIC here (see the module's comment).
fn tsc_usable() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // Leaf 0x80000007 is read only if the maximum extended leaf says it exists.
        let invariant = {
            use core::arch::x86_64::__cpuid;
            __cpuid(0x8000_0000).eax >= 0x8000_0007 && __cpuid(0x8000_0007).edx & (1 << 8) != 0
        };
        let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
        invariant && source.is_ok_and(|s| s.trim() == "tsc")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// At tracer start: fits the map over a short spin (about 200 µs; `refine` makes it exact
/// over the run) and switches hooks to the counter where it is usable.
fn calibrate() {
    if !tsc_usable() {
        TSC.store(false, SeqCst);
        return;
    }
    let (t1, n1) = pair();
    let (mut t2, mut n2) = pair();
    while n2 < n1 + 200_000 {
        std::hint::spin_loop();
        (t2, n2) = pair();
    }
    if t2 <= t1 {
        TSC.store(false, SeqCst);
        return;
    }
    let mult = (((n2 - n1) as u128) << 32) / (t2 - t1) as u128;
    FIRST.0.store(t1, Relaxed);
    FIRST.1.store(n1, Relaxed);
    LAST_REFIT_NS.store(n2, Relaxed);
    set_map(t2, n2, mult as u64);
    TSC.store(true, SeqCst);
}

/// How often the writer refits the map.
const REFIT_NS: u64 = 100_000_000;

/// On the writer, now and then: the slope measured over the whole run so far, and the map
/// steered back onto CLOCK_MONOTONIC over the next interval (continuous: no timestamp jumps).
pub fn refine() {
    if !TSC.load(Relaxed) {
        return;
    }
    if monotonic_ns() < LAST_REFIT_NS.load(Relaxed) + REFIT_NS {
        return;
    }
    let (t, n) = pair();
    LAST_REFIT_NS.store(n, Relaxed);
    let (tf, nf) = (FIRST.0.load(Relaxed), FIRST.1.load(Relaxed));
    if t <= tf || n <= nf {
        return;
    }
    let slope = (((n - nf) as u128) << 32) / (t - tf) as u128;
    let Some(here) = tsc_ns(t) else { return };
    // Over the next interval, close the gap between the map and the clock.
    let ahead = ((REFIT_NS as u128) << 32) / slope.max(1);
    let gap = n as i128 - here as i128;
    let corrected = slope as i128 + (gap << 32) / ahead.max(1) as i128;
    // At most 0.1 % steering: a clock step (suspend) is not chased.
    let bound = slope as i128 / 1000;
    let mult = corrected.clamp(slope as i128 - bound, slope as i128 + bound).max(1);
    set_map(t, here, mult as u64);
}

/// The order in which calls happened, across threads. Threads hand events over in whatever
/// order they get to their rings, which can differ from the order of the calls: thread A frees X,
/// thread B's allocation gets X back, and B's event may reach the writer first. So each event
/// takes an order key at the moment that orders it (a free before its real call, an allocation
/// after its real call returned) and the writer writes events in key order.
///
/// The key is the event's own timestamp wherever the clock can order calls: the counter above
/// (the kernel checked that all CPUs' counters agree before choosing it) or a CLOCK_MONOTONIC of
/// nanosecond resolution (monotonic across CPUs by the kernel's promise). Two calls ordered by a
/// real call between them are at least tens of nanoseconds apart, so their keys differ and
/// agree with their order; no shared counter is written (a process-wide `fetch_add` was what
/// eight threads waited for: 290 ns an operation on the H100 host, docs/performance.md). Where
/// the clock is coarse (a jiffies clocksource: milliseconds), the key is a process-wide number
/// as before. Either way the key is taken after the thread marked its ring as stamping
/// (`Journal::enter`), which is what lets the writer know when no smaller key can still come
/// (`horizon`).
#[link_section = "gpumemtrace_hot"]
static BY_TIME: AtomicBool = AtomicBool::new(false);
/// The process-wide number where keys are not timestamps; it has cache lines of its own, or each
/// increment would take away from other threads the lines of whatever the linker put beside it.
static SEQ: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

/// An event's order key and timestamp, read after its thread's stamping mark (a plain store:
/// it may reach other CPUs a little after this read, which the writer's `SLACK_NS` covers).
///
/// No fence keeps the counter's read after the mark here (`lfence` cost 20 ns an event on the
/// VM): the read may run ahead of the mark by the pipeline's depth, and the mark may wait in the
/// store buffer, so a key can fall a little below a horizon the writer read meanwhile (well within
/// the slack). An event beyond it is written late and counted (`Writer::stats`); it is never out
/// of order with what it
/// caused: a free's key precedes its real call, whose completion precedes any reuse of the memory
/// and that allocation's key by far more than that.
#[link_section = ".text.hot.gpumemtrace"]
pub fn stamp() -> (u64, u64) {
    if BY_TIME.load(Relaxed) {
        let t = now_ns();
        return (t, t);
    }
    (SEQ.fetch_add(1, SeqCst), now_ns())
}

/// How far the horizon stays behind the writer's clock read: a hook's mark is a plain store
/// (`Journal::enter`), which may reach other CPUs after the hook read the clock, by the time its
/// core takes to drain the stores before it (well under a microsecond; a context switch drains
/// them at once). A mark later than this makes its event late (counted), never lost.
pub const SLACK_NS: u64 = 50_000;

/// On the writer, before it reads the marks: a key that no event stamped from now on is below
/// (the marks are read after this, behind a fence). With numbered keys, the next number.
pub fn horizon() -> u64 {
    if BY_TIME.load(Relaxed) {
        fenced();
        let t = now_ns();
        fenced();
        fence(SeqCst);
        return t.saturating_sub(SLACK_NS);
    }
    let n = SEQ.load(SeqCst);
    fence(SeqCst);
    n
}

/// Keeps the time-stamp counter's read from running ahead of earlier instructions (and, after
/// it, later ones from running ahead of it): `rdtsc` alone is not ordered. `clock_gettime`
/// orders its own read.
#[inline(always)]
fn fenced() {
    #[cfg(target_arch = "x86_64")]
    if TSC.load(Relaxed) {
        // SAFETY: lfence exists on every x86-64 CPU.
        unsafe { core::arch::x86_64::_mm_lfence() };
    }
}

/// Whether keys are timestamps (see `BY_TIME`).
pub fn keys_are_times() -> bool {
    BY_TIME.load(Relaxed)
}

/// Whether CLOCK_MONOTONIC resolves nanoseconds.
fn fine_clock() -> bool {
    let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes into the timespec we own.
    let r = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC, &mut res) };
    r == 0 && res.tv_sec == 0 && res.tv_nsec <= 1
}

/// In a forked child: the child's writer starts its own numbers.
pub fn reset_seq() {
    SEQ.store(0, SeqCst);
}

/// Counts tracer starts (a forked child starts its own): per-thread stack keys are per start.
#[link_section = "gpumemtrace_hot"]
static EPOCH: AtomicU64 = AtomicU64::new(0);

pub fn epoch() -> u64 {
    EPOCH.load(SeqCst)
}

/// A tracer starts: per-thread sets of keys sent to an earlier writer no longer hold; the
/// clock is calibrated.
pub fn new_epoch(numbered_keys: bool) {
    calibrate();
    BY_TIME.store(!numbered_keys && (TSC.load(SeqCst) || fine_clock()), SeqCst);
    EPOCH.fetch_add(1, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_map_is_linear_and_signed_around_its_origin() {
        let one = 1u64 << 32; // one ns per tick
        assert_eq!(map(1_000, 1_000, 5_000, one), 5_000);
        assert_eq!(map(1_500, 1_000, 5_000, one), 5_500);
        assert_eq!(map(900, 1_000, 5_000, one), 4_900);
        assert_eq!(map(1_000 + 3_000, 1_000, 0, one / 4), 750);
    }

    #[test]
    fn the_clock_stays_on_clock_monotonic() {
        calibrate();
        for _ in 0..3 {
            let a = monotonic_ns();
            let t = now_ns();
            let b = monotonic_ns();
            // Within 50 µs of CLOCK_MONOTONIC (calibrated over 200 µs), whichever clock it used.
            assert!(t + 50_000 >= a && t <= b + 50_000, "{a} {t} {b}");
        }
    }
}
