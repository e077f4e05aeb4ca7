//! How far the call order is complete: the writer's horizon, the order key below which every
//! event is in a ring already (keys: `clock::stamp`; marks: `Journal::enter`). Uses `ring`.
//!
//! The writer reads its own clock (`clock::horizon`), then every ring's mark. A ring idle then can
//! only stamp later keys from now on, and its earlier events are published. A ring stamping then
//! may still hand over one event: below its noted key (`Journal::note_key`) everything is
//! complete; before the key is noted (a few instructions), or for the shared ring (whose threads
//! note none), the horizon stays where it is until the ring's generation moves on. The thread
//! that holds the horizon back is given up on once it has done so for `GAP_WAIT` (or at once when
//! the writer holds too much), one at a time, each with its own `GAP_WAIT`: on a crowded host
//! many threads are descheduled inside a hook at once, and most come back in time. A thread given
//! up on (stopped inside a hook, or a free whose real call takes that long) has its event, if it
//! ever comes, written late.

use std::time::{Duration, Instant};

use crate::ring::{Journal, Seen, RINGS, SHARED};

/// How long a thread may hold the horizon back.
pub const GAP_WAIT: Duration = Duration::from_millis(2);
/// How long the writer spins for a stamping ring that has not noted its key yet, before leaving
/// it to a later pass: the key comes a few instructions after the mark.
const SPIN_WAIT: Duration = Duration::from_micros(20);

pub struct Horizon {
    key: u64,
    /// The ring (and its generation) that holds the horizon back, since when.
    binding: Option<(usize, u32, Instant)>,
    /// A ring's generation given up on: not waited for again.
    abandoned: [Option<u32>; RINGS],
    /// Since when the horizon has been held back without moving, whichever threads held it: a
    /// writer starved of CPU sees the holder only now and then, and by then it is often another
    /// thread (or another generation), so a wait per holder alone never ran out while every
    /// thread waited for ring space behind it (4 processes of 40 threads on 2 vCPUs: no commit
    /// for a second, most events lost).
    held_since: Option<Instant>,
    /// Threads given up on.
    pub gave_up: u64,
}

impl Default for Horizon {
    fn default() -> Self {
        Horizon { key: 0, binding: None, abandoned: [None; RINGS], held_since: None, gave_up: 0 }
    }
}

impl Horizon {
    /// Keys below this are complete.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Moves the horizon. `now` is `clock::horizon()`, read just before; `crowded`: the writer
    /// holds so much waiting for the horizon that it gives up on the thread holding it at once.
    pub fn advance(&mut self, jn: &Journal, now: u64, crowded: bool) {
        let mut holding: Vec<(usize, u32, Option<u64>)> = Vec::new();
        for i in 0..RINGS {
            let Seen::Busy(v) = jn.stamping(i) else { continue };
            if self.abandoned[i] == Some(v) && i != SHARED {
                continue;
            }
            let spin = if i == SHARED { Duration::ZERO } else { SPIN_WAIT };
            let t0 = Instant::now();
            let key = loop {
                if jn.moved_on(i, v) {
                    break Some(u64::MAX);
                }
                if let Some(k) = jn.stamped_key(i, v) {
                    break Some(k);
                }
                if t0.elapsed() >= spin {
                    break None;
                }
                std::hint::spin_loop();
            };
            if key != Some(u64::MAX) {
                holding.push((i, v, key));
            }
        }
        self.rise(now, &holding);
        // The thread that holds it back (a key not noted yet holds it where it is).
        let Some(at) = holding.iter().position(|&(_, _, k)| k.is_none_or(|k| k <= self.key)) else {
            self.binding = None;
            self.held_since = None;
            return;
        };
        let held = *self.held_since.get_or_insert_with(Instant::now);
        let (i, v, _) = holding[at];
        // The shared ring's count changes as its threads come and go: it binds as one.
        let v = if i == SHARED { 0 } else { v };
        let since = match self.binding {
            Some((j, g, since)) if (j, g) == (i, v) => since,
            _ => self.binding.insert((i, v, Instant::now())).2,
        };
        if !crowded && since.elapsed() < GAP_WAIT && held.elapsed() < GAP_WAIT {
            return;
        }
        self.abandoned[i] = Some(v);
        self.binding = None;
        self.gave_up += 1;
        holding.swap_remove(at);
        // One at a time: what waited behind it is written before the next is judged.
        self.rise(now, &holding);
    }

    fn rise(&mut self, now: u64, holding: &[(usize, u32, Option<u64>)]) {
        let bound = holding.iter().fold(now, |b, &(_, _, k)| b.min(k.unwrap_or(self.key)));
        if bound > self.key {
            self.key = bound;
            // A horizon that moves gives whoever holds it next a wait of its own.
            self.held_since = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn journal() -> &'static Journal {
        let path = std::env::temp_dir().join("gpumemtrace-horizon-test.trace");
        Box::leak(Box::new(Journal::create(&path, 0o600, false).expect("an anonymous journal")))
    }

    /// With no thread stamping, the horizon is the writer's clock read.
    #[test]
    fn idle_rings_let_the_horizon_reach_the_writers_clock() {
        let jn = journal();
        let mut h = Horizon::default();
        h.advance(jn, 1000, false);
        assert_eq!(h.key(), 1000);
        h.advance(jn, 900, false);
        assert_eq!(h.key(), 1000, "it never goes back");
    }

    /// A thread stamping holds the horizon at its noted key until it hands its event over.
    #[test]
    fn a_stamping_thread_holds_the_horizon_at_its_key_until_it_leaves() {
        let jn = journal();
        let mut h = Horizon::default();
        let mark = Journal::enter(jn.marks(3));
        Journal::note_key(mark, 700);
        h.advance(jn, 1000, false);
        assert_eq!(h.key(), 700);
        Journal::leave(mark);
        h.advance(jn, 1100, false);
        assert_eq!(h.key(), 1100);
        assert_eq!(h.gave_up, 0);
    }

    /// Before its key is noted, a stamping thread holds the horizon where it is; one that holds
    /// it for `GAP_WAIT` is given up on, and that generation is not waited for again (the next
    /// one is).
    #[test]
    fn a_thread_stuck_before_its_key_is_given_up_on_after_the_gap_wait() {
        let jn = journal();
        let mut h = Horizon::default();
        h.advance(jn, 500, false);
        let stuck = Journal::enter(jn.marks(5));
        h.advance(jn, 1000, false);
        assert_eq!(h.key(), 500);
        std::thread::sleep(GAP_WAIT + Duration::from_millis(1));
        h.advance(jn, 1200, false);
        assert_eq!((h.key(), h.gave_up), (1200, 1));
        h.advance(jn, 1300, false);
        assert_eq!(h.key(), 1300, "the same generation is not waited for again");
        Journal::leave(stuck);
        let next = Journal::enter(jn.marks(5));
        Journal::note_key(next, 1350);
        h.advance(jn, 1400, false);
        assert_eq!(h.key(), 1350, "its next event is");
        Journal::leave(next);
    }

    /// Several threads held at once are given up on one at a time, each after its own wait.
    #[test]
    fn stuck_threads_are_given_up_on_one_at_a_time() {
        let jn = journal();
        let mut h = Horizon::default();
        let a = Journal::enter(jn.marks(1));
        Journal::note_key(a, 100);
        let b = Journal::enter(jn.marks(2));
        Journal::note_key(b, 200);
        h.advance(jn, 1000, false);
        assert_eq!(h.key(), 100);
        std::thread::sleep(GAP_WAIT + Duration::from_millis(1));
        h.advance(jn, 1000, false);
        assert_eq!((h.key(), h.gave_up), (200, 1), "the first one only");
        h.advance(jn, 1000, false);
        assert_eq!((h.key(), h.gave_up), (200, 1), "the second gets its own wait");
        std::thread::sleep(GAP_WAIT + Duration::from_millis(1));
        h.advance(jn, 1000, false);
        assert_eq!((h.key(), h.gave_up), (1000, 2));
        Journal::leave(a);
        Journal::leave(b);
    }

    /// A writer that sees the horizon only now and then (starved of CPU) finds another thread
    /// holding it each time: what counts is how long the horizon has not moved.
    #[test]
    fn a_horizon_held_by_one_thread_after_another_is_given_up_on_after_the_gap_wait() {
        let jn = journal();
        let mut h = Horizon::default();
        h.advance(jn, 500, false);
        let a = Journal::enter(jn.marks(9)); // no key noted yet: holds the horizon where it is
        h.advance(jn, 1000, false);
        assert_eq!((h.key(), h.gave_up), (500, 0));
        std::thread::sleep(GAP_WAIT + Duration::from_millis(1));
        Journal::leave(a);
        let b = Journal::enter(jn.marks(10)); // another thread, the next time the writer looks
        h.advance(jn, 1200, false);
        assert_eq!((h.key(), h.gave_up), (1200, 1), "held for the gap wait, by whichever thread");
        Journal::leave(b);
        // Once it moved, the next holder gets a wait of its own.
        let c = Journal::enter(jn.marks(11));
        h.advance(jn, 1300, false);
        assert_eq!((h.key(), h.gave_up), (1200, 1));
        Journal::leave(c);
        h.advance(jn, 1400, false);
        assert_eq!(h.key(), 1400);
    }

    /// When the writer holds too much, the thread holding the horizon is given up on at once.
    #[test]
    fn a_crowded_writer_gives_up_at_once() {
        let jn = journal();
        let mut h = Horizon::default();
        let a = Journal::enter(jn.marks(7));
        Journal::note_key(a, 300);
        h.advance(jn, 1000, true);
        assert_eq!((h.key(), h.gave_up), (1000, 1));
        Journal::leave(a);
    }
}
