//! Messages the writer has read from the rings but not written yet, waiting for their turn in
//! call order (see `clock::next_seq`): one queue a ring, each in sequence-number order, merged by
//! their fronts (`Writer::release`).
//!
//! With many busy threads nearly every event passes through here, so the merge is kept to a few
//! instructions: each queue is a vector read from its head (no ring buffer arithmetic), the
//! queues' front numbers sit side by side in one array, scanned by the bits of the non-empty ones,
//! and the number expected next is usually found without a scan: a small table says which ring
//! got it.

use gpumemtrace_format::journal::RINGS;

/// A message read from a ring and not written yet: its number and where it lies in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub seq: u64,
    pub pos: u64,
}

/// One ring's waiting messages, `items[head..]`, in sequence order.
#[derive(Default)]
struct Queue {
    items: Vec<Queued>,
    head: usize,
}

/// A queue's written front is dropped from its vector once this many have piled up there (and
/// they are at least half of it): memory stays bounded by what waits, at O(1) a message.
const COMPACT_AT: usize = 1024;

pub struct Waiting {
    queues: Vec<Queue>,
    /// Each queue's front number; `u64::MAX` when it is empty.
    fronts: [u64; RINGS],
    /// Which queues hold any (bit `i`: ring `i`), and which got one ahead of their back (threads
    /// sharing the last ring): then their front is not their earliest position in the ring.
    nonempty: u64,
    unordered: u64,
    len: usize,
    /// The ring each number was queued in, by the number's low bits (overwritten freely: a
    /// stale entry only costs a scan).
    ring_of: [u8; SLOTS],
    /// Messages queued after the writer had given up waiting for them (numbered below the one
    /// expected then): while any waits, the lowest number is found by a scan.
    late: usize,
}

const SLOTS: usize = 8192;

impl Default for Waiting {
    fn default() -> Self {
        Waiting {
            queues: (0..RINGS).map(|_| Queue::default()).collect(),
            fronts: [u64::MAX; RINGS],
            nonempty: 0,
            unordered: 0,
            len: 0,
            ring_of: [0; SLOTS],
            late: 0,
        }
    }
}

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.nonempty == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues message `seq` of `ring`, at `pos` there, while number `expected` is the next to
    /// write. A ring's own messages come in number order, so this is almost always the back.
    #[inline]
    pub fn push(&mut self, ring: usize, pos: u64, seq: u64, expected: u64) {
        let q = &mut self.queues[ring];
        let m = Queued { seq, pos };
        if q.items.last().is_none_or(|b| b.seq < seq) {
            q.items.push(m);
        } else {
            self.unordered |= 1 << ring;
            let at = q.head + q.items[q.head..].partition_point(|w| w.seq < seq);
            q.items.insert(at, m);
        }
        self.fronts[ring] = q.items[q.head].seq;
        self.len += 1;
        self.nonempty |= 1 << ring;
        self.ring_of[seq as usize % SLOTS] = ring as u8;
        self.late += usize::from(seq < expected);
    }

    /// The ring whose front has the lowest number, and that number; `expected` is the number
    /// to write next.
    #[inline]
    pub fn lowest(&self, expected: u64) -> Option<(usize, u64)> {
        // Numbers are unique and, with none late, none waiting is below `expected`: a front
        // holding it is the lowest.
        let r = self.ring_of[expected as usize % SLOTS] as usize;
        if self.late == 0 && self.fronts[r] == expected {
            return Some((r, expected));
        }
        let mut bits = self.nonempty;
        let (mut ring, mut seq) = (usize::MAX, u64::MAX);
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let s = self.fronts[i];
            if s < seq {
                (ring, seq) = (i, s);
            }
        }
        (ring != usize::MAX).then_some((ring, seq))
    }

    /// Takes the front of `ring`'s queue (one `lowest` named), while `expected` is the number to
    /// write next.
    #[inline]
    pub fn pop(&mut self, ring: usize, expected: u64) -> Option<Queued> {
        let q = &mut self.queues[ring];
        let m = *q.items.get(q.head)?;
        q.head += 1;
        self.len -= 1;
        // A message is late from its arrival on (the expected number only passes a waiting one
        // by writing it), so this counts down exactly what `push` counted up.
        debug_assert!(self.late >= usize::from(m.seq < expected), "a message late at its pop was late at its push");
        self.late = self.late.saturating_sub(usize::from(m.seq < expected));
        if q.head == q.items.len() {
            q.items.clear();
            q.head = 0;
            self.fronts[ring] = u64::MAX;
            self.nonempty &= !(1 << ring);
            self.unordered &= !(1 << ring);
        } else {
            self.fronts[ring] = q.items[q.head].seq;
            if q.head >= COMPACT_AT && q.head * 2 >= q.items.len() {
                q.items.drain(..q.head);
                q.head = 0;
            }
        }
        Some(m)
    }

    /// Where each ring may be released up to, given how far it was read (`read`): not past a
    /// message still waiting.
    pub fn committable(&self, read: [u64; RINGS]) -> [u64; RINGS] {
        let mut at = read;
        let mut bits = self.nonempty;
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let waiting = &self.queues[i].items[self.queues[i].head..];
            let min = if self.unordered & (1 << i) == 0 { waiting.first().map(|m| m.pos) } else { waiting.iter().map(|m| m.pos).min() };
            if let Some(min) = min {
                at[i] = at[i].min(min);
            }
        }
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages come out lowest number first across rings, and each ring's earliest waiting
    /// position holds its space back.
    #[test]
    fn the_lowest_number_comes_out_first_and_holds_its_ring_back() {
        let mut w = Waiting::default();
        assert_eq!(w.lowest(0), None);
        w.push(3, 800, 7, 0);
        w.push(0, 100, 5, 0);
        w.push(3, 816, 9, 0);
        w.push(0, 120, 8, 0);
        assert_eq!(w.len(), 4);
        let mut read = [0; RINGS];
        read[0] = 200;
        read[3] = 900;
        let at = w.committable(read);
        assert_eq!((at[0], at[3]), (100, 800));
        let (mut out, mut expected) = (Vec::new(), 5);
        while let Some((ring, seq)) = w.lowest(expected) {
            let m = w.pop(ring, expected).unwrap();
            assert_eq!(m.seq, seq);
            out.push((ring, seq, m.pos));
            expected = seq + 1; // 6 is missing: the writer gave up on it
        }
        assert_eq!(out, [(0, 5, 100), (3, 7, 800), (0, 8, 120), (3, 9, 816)]);
        assert!(w.is_empty());
        assert_eq!(w.committable(read), read);
    }

    /// A message that arrives after the writer gave up waiting for it (numbered below the one
    /// expected) is written first, before the expected one: late, but in number order.
    #[test]
    fn a_late_message_comes_out_before_the_expected_one() {
        let mut w = Waiting::default();
        w.push(2, 0, 20, 20);
        w.push(5, 0, 21, 20);
        w.push(4, 0, 6, 20); // late
        let (mut out, mut expected) = (Vec::new(), 20);
        while let Some((ring, seq)) = w.lowest(expected) {
            w.pop(ring, expected).unwrap();
            out.push(seq);
            expected = expected.max(seq + 1);
        }
        assert_eq!(out, [6, 20, 21]);
        // The count of late ones went back to zero: the expected number is found directly again.
        w.push(7, 0, 22, 22);
        assert_eq!(w.late, 0);
        assert_eq!(w.lowest(22), Some((7, 22)));
    }

    /// Threads sharing a ring interleave: a message may arrive ahead of the queue's back. It
    /// takes its place by number, and the ring is held back by its earliest position.
    #[test]
    fn a_message_ahead_of_its_rings_back_takes_its_place_by_number() {
        let mut w = Waiting::default();
        w.push(31, 40, 10, 0);
        w.push(31, 64, 12, 0);
        w.push(31, 88, 11, 0);
        assert_eq!(w.committable([1000; RINGS])[31], 40);
        w.pop(31, 0).unwrap();
        assert_eq!(w.committable([1000; RINGS])[31], 64, "the earliest position still waiting, not the front's");
        assert_eq!(w.pop(31, 0).map(|m| m.seq), Some(11));
        assert_eq!(w.pop(31, 0).map(|m| m.seq), Some(12));
        assert_eq!(w.pop(31, 0), None);
    }

    /// Against a plain sort, on random interleavings of eight rings (each ring's own numbers
    /// rising, some messages arriving after the writer gave up on them, some rings shared): what
    /// comes out is every message once, lowest first among what waits, exactly as the writer's
    /// rule says (the expected number goes past a missing one only by writing a later one).
    #[test]
    fn random_interleavings_come_out_as_a_sort_would_give_them() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..200 {
            let mut w = Waiting::default();
            let mut reference = std::collections::BTreeSet::new();
            let mut expected = 0u64;
            let mut next_number = 0u64;
            let mut held_back: Vec<(usize, u64)> = Vec::new();
            let mut out = Vec::new();
            for _ in 0..500 {
                match rand(10) {
                    // A hook numbers its call and hands it over now, or later (a gap).
                    0..=5 => {
                        let ring = if round % 3 == 0 { 31 } else { rand(8) as usize };
                        if rand(6) == 0 {
                            held_back.push((ring, next_number));
                        } else {
                            w.push(ring, next_number * 8, next_number, expected);
                            reference.insert(next_number);
                        }
                        next_number += 1;
                    }
                    // A held-back message arrives (perhaps after the writer gave up on it).
                    6 if !held_back.is_empty() => {
                        let (ring, seq) = held_back.swap_remove(rand(held_back.len() as u64) as usize);
                        w.push(ring, seq * 8, seq, expected);
                        reference.insert(seq);
                    }
                    // The writer writes what is due, giving up on a gap now and then.
                    _ => {
                        let give_up = rand(2) == 0;
                        while let Some((ring, seq)) = w.lowest(expected) {
                            assert_eq!(Some(&seq), reference.first(), "round {round}: the lowest waiting number");
                            if seq > expected && !give_up {
                                break;
                            }
                            let m = w.pop(ring, expected).unwrap();
                            assert_eq!(m, Queued { seq, pos: seq * 8 });
                            reference.remove(&seq);
                            expected = expected.max(seq + 1);
                            out.push(seq);
                        }
                    }
                }
                assert_eq!(w.len(), reference.len());
            }
            for (ring, seq) in held_back.drain(..) {
                w.push(ring, seq * 8, seq, expected);
                reference.insert(seq);
            }
            while let Some((ring, seq)) = w.lowest(expected) {
                assert_eq!(Some(&seq), reference.first());
                w.pop(ring, expected).unwrap();
                reference.remove(&seq);
                expected = expected.max(seq + 1);
                out.push(seq);
            }
            assert!(w.is_empty() && reference.is_empty());
            let mut sorted = out.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted, (0..next_number).collect::<Vec<_>>(), "round {round}: every message once");
        }
    }

    /// A queue that never runs dry does not grow with what was already written.
    #[test]
    fn a_queue_that_never_empties_stays_bounded() {
        let mut w = Waiting::default();
        w.push(1, 0, 0, 0);
        for seq in 1..100_000u64 {
            w.push(1, seq * 8, seq, 0);
            assert_eq!(w.pop(1, 0).map(|m| m.seq), Some(seq - 1));
        }
        assert_eq!(w.len(), 1);
        assert!(w.queues[1].items.len() <= 2 * COMPACT_AT + 1, "{}", w.queues[1].items.len());
        assert_eq!(w.lowest(0), Some((1, 99_999)));
    }
}
