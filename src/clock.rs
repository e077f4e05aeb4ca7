//! Time and order: the clock every record is stamped with, the process-wide sequence number
//! that orders calls across threads, and the count of tracer starts. Depends on nothing.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// CLOCK_MONOTONIC, in nanoseconds.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The order in which calls happened, across threads. Threads hand events over in whatever
/// order they get to the channel, which can differ: thread A frees X, thread B's allocation gets
/// X back, and B's event may reach the channel first. So each event takes a number at the moment
/// that orders it — a free before its real call, an allocation after its real call returned —
/// and the writer writes events in that order.
static SEQ: AtomicU64 = AtomicU64::new(0);

pub fn next_seq() -> u64 {
    SEQ.fetch_add(1, SeqCst)
}

/// In a forked child: the child's writer expects its numbers from 0.
pub fn reset_seq() {
    SEQ.store(0, SeqCst);
}

/// Counts tracer starts (a forked child starts its own): per-thread stack keys are per start.
static EPOCH: AtomicU64 = AtomicU64::new(0);

pub fn epoch() -> u64 {
    EPOCH.load(SeqCst)
}

/// A tracer starts: per-thread sets of keys sent to an earlier writer no longer hold.
pub fn new_epoch() {
    EPOCH.fetch_add(1, SeqCst);
}
