//! Messages the writer has read from the rings but not written yet, waiting for their turn in
//! call order (their order keys, see `clock::stamp`): one queue a ring, each in key order,
//! merged by their fronts (`Writer::release`).
//!
//! With many busy threads nearly every event passes through here, so the merge is kept to a few
//! instructions: each queue is a vector read from its head (no ring buffer arithmetic), and the
//! queues' front keys sit side by side in one array, scanned by the bits of the non-empty ones.

use gpumemtrace_format::journal::RINGS;

/// A message read from a ring and not written yet: its order key and where it lies in the ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Queued {
    pub key: u64,
    pub pos: u64,
}

/// One ring's waiting messages, `items[head..]`, in key order.
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
    /// Each queue's front key; `u64::MAX` when it is empty.
    fronts: [u64; RINGS],
    /// Which queues hold any (bit `i`: ring `i`), and which got one ahead of their back (threads
    /// sharing the last ring): then their front is not their earliest position in the ring.
    nonempty: u64,
    unordered: u64,
    len: usize,
    /// The ring `next_below` takes from, and the (key, ring) its front must stay below.
    run: Option<(usize, (u64, usize))>,
}

impl Default for Waiting {
    fn default() -> Self {
        Waiting { queues: (0..RINGS).map(|_| Queue::default()).collect(), fronts: [u64::MAX; RINGS], nonempty: 0, unordered: 0, len: 0, run: None }
    }
}

impl Waiting {
    pub fn is_empty(&self) -> bool {
        self.nonempty == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Queues message `key` of `ring`, at `pos` there. A ring's own messages come in key order,
    /// so this is almost always the back; equal keys keep their arrival order.
    #[inline]
    pub fn push(&mut self, ring: usize, pos: u64, key: u64) {
        self.run = None;
        let q = &mut self.queues[ring];
        let m = Queued { key, pos };
        if q.items.last().is_none_or(|b| b.key <= key) {
            q.items.push(m);
        } else {
            self.unordered |= 1 << ring;
            let at = q.head + q.items[q.head..].partition_point(|w| w.key <= key);
            q.items.insert(at, m);
        }
        self.fronts[ring] = q.items[q.head].key;
        self.len += 1;
        self.nonempty |= 1 << ring;
    }

    /// The ring whose front has the lowest key, and that key (the lowest-numbered ring among
    /// equal keys).
    #[cfg(test)]
    pub fn lowest(&self) -> Option<(usize, u64)> {
        let mut bits = self.nonempty;
        let (mut ring, mut key) = (usize::MAX, u64::MAX);
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let k = self.fronts[i];
            if k < key || ring == usize::MAX {
                (ring, key) = (i, k);
            }
        }
        (ring != usize::MAX).then_some((ring, key))
    }

    /// Takes the next message in key order (the lowest-numbered ring among equal keys) if its key
    /// is below `limit` (`None`: whatever its key), with its ring.
    ///
    /// One scan of the fronts finds the lowest and the runner-up; the lowest ring's queue is then
    /// taken from without another scan until its front passes the runner-up (a push ends that
    /// run). A busy thread's run of events costs one scan, interleaved threads one an event.
    #[inline]
    pub fn next_below(&mut self, limit: Option<u64>) -> Option<(usize, Queued)> {
        let (ring, runner_up) = match self.run {
            Some(run) => run,
            None => self.lowest_two()?,
        };
        if limit.is_some_and(|l| self.fronts[ring] >= l) {
            self.run = Some((ring, runner_up));
            return None;
        }
        let m = self.pop(ring)?;
        // `pop` ended the run; it goes on while this queue's new front still comes first.
        if self.nonempty & (1 << ring) != 0 && (self.fronts[ring], ring) < runner_up {
            self.run = Some((ring, runner_up));
        }
        Some((ring, m))
    }

    /// The ring whose front comes first, and the (key, ring) of the front that comes second
    /// (`(u64::MAX, usize::MAX)` when there is none).
    #[inline]
    fn lowest_two(&self) -> Option<(usize, (u64, usize))> {
        let mut bits = self.nonempty;
        let (mut best, mut second) = ((u64::MAX, usize::MAX), (u64::MAX, usize::MAX));
        while bits != 0 {
            let i = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let c = (self.fronts[i], i);
            if c < best {
                second = best;
                best = c;
            } else if c < second {
                second = c;
            }
        }
        (best.1 != usize::MAX).then_some((best.1, second))
    }

    /// Takes the front of `ring`'s queue (one `lowest` named).
    #[inline]
    pub fn pop(&mut self, ring: usize) -> Option<Queued> {
        self.run = None;
        let q = &mut self.queues[ring];
        let m = *q.items.get(q.head)?;
        q.head += 1;
        self.len -= 1;
        if q.head == q.items.len() {
            q.items.clear();
            q.head = 0;
            self.fronts[ring] = u64::MAX;
            self.nonempty &= !(1 << ring);
            self.unordered &= !(1 << ring);
        } else {
            self.fronts[ring] = q.items[q.head].key;
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

    /// Messages come out lowest key first across rings, and each ring's earliest waiting
    /// position holds its space back.
    #[test]
    fn the_lowest_key_comes_out_first_and_holds_its_ring_back() {
        let mut w = Waiting::default();
        assert_eq!(w.lowest(), None);
        w.push(3, 800, 7);
        w.push(0, 100, 5);
        w.push(3, 816, 9);
        w.push(0, 120, 8);
        assert_eq!(w.len(), 4);
        let mut read = [0; RINGS];
        read[0] = 200;
        read[3] = 900;
        let at = w.committable(read);
        assert_eq!((at[0], at[3]), (100, 800));
        let mut out = Vec::new();
        while let Some((ring, key)) = w.lowest() {
            let m = w.pop(ring).unwrap();
            assert_eq!(m.key, key);
            out.push((ring, key, m.pos));
        }
        assert_eq!(out, [(0, 5, 100), (3, 7, 800), (0, 8, 120), (3, 9, 816)]);
        assert!(w.is_empty());
        assert_eq!(w.committable(read), read);
    }

    /// Threads sharing a ring interleave: a message may arrive ahead of the queue's back. It
    /// takes its place by key (after any of an equal key), and the ring is held back by its
    /// earliest position.
    #[test]
    fn a_message_ahead_of_its_rings_back_takes_its_place_by_key() {
        let mut w = Waiting::default();
        w.push(31, 40, 10);
        w.push(31, 64, 12);
        w.push(31, 88, 11);
        w.push(31, 112, 11);
        assert_eq!(w.committable([1000; RINGS])[31], 40);
        w.pop(31).unwrap();
        assert_eq!(w.committable([1000; RINGS])[31], 64, "the earliest position still waiting, not the front's");
        assert_eq!(w.pop(31).map(|m| (m.key, m.pos)), Some((11, 88)));
        assert_eq!(w.pop(31).map(|m| (m.key, m.pos)), Some((11, 112)), "equal keys in arrival order");
        assert_eq!(w.pop(31).map(|m| m.key), Some(12));
        assert_eq!(w.pop(31), None);
    }

    /// Against a plain sort, on random interleavings of eight rings (each ring's own keys rising,
    /// some rings shared, keys that collide across rings): whatever the writer takes out up to
    /// a horizon is every message below it, lowest first, each once.
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
            let mut clock = 0u64;
            let mut last = [0u64; RINGS];
            let mut out = Vec::new();
            let mut n = 0u64;
            for _ in 0..500 {
                match rand(10) {
                    // A hook stamps its call and hands it over.
                    0..=6 => {
                        let ring = if round % 3 == 0 { 31 } else { rand(8) as usize };
                        clock += rand(3); // equal keys happen
                        let key = if ring == 31 { clock.saturating_sub(rand(4)) } else { clock.max(last[ring]) };
                        last[ring] = key;
                        w.push(ring, n * 8, key);
                        reference.insert((key, n));
                        n += 1;
                    }
                    // The writer writes what is below its horizon.
                    _ => {
                        let horizon = clock.saturating_sub(rand(5));
                        if round % 2 == 1 {
                            // The writer's way: runs taken without a scan of the fronts each.
                            while let Some((_, m)) = w.next_below(Some(horizon + 1)) {
                                assert_eq!(Some(m.key), reference.first().map(|r| r.0), "round {round}: the lowest waiting key");
                                let r = *reference.iter().find(|r| r.0 == m.key && r.1 * 8 == m.pos).expect("a message that was queued");
                                reference.remove(&r);
                                out.push(r.1);
                            }
                            assert!(reference.first().is_none_or(|r| r.0 > horizon), "round {round}: stopped below the horizon");
                            assert_eq!(w.len(), reference.len());
                            continue;
                        }
                        while let Some((ring, key)) = w.lowest() {
                            assert_eq!(Some(key), reference.first().map(|r| r.0), "round {round}: the lowest waiting key");
                            if key > horizon {
                                break;
                            }
                            let m = w.pop(ring).unwrap();
                            assert_eq!(m.key, key);
                            let r = *reference.iter().find(|r| r.0 == key && r.1 * 8 == m.pos).expect("a message that was queued");
                            reference.remove(&r);
                            out.push(r.1);
                        }
                    }
                }
                assert_eq!(w.len(), reference.len());
            }
            while let Some((ring, _)) = w.lowest() {
                let m = w.pop(ring).unwrap();
                out.push(m.pos / 8);
            }
            assert!(w.is_empty());
            let mut sorted = out.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "round {round}: every message once");
        }
    }

    /// Taking runs (`next_below`) gives exactly the order of taking the lowest front one by one,
    /// ties between rings included, also when pushes come between the takes.
    #[test]
    fn runs_come_out_as_one_by_one_would() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut rand = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..100 {
            let (mut one, mut runs) = (Waiting::default(), Waiting::default());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut last = [0u64; RINGS];
            for n in 0..400u64 {
                // Ring 31 is shared: its messages may come ahead of its queue's back.
                let ring = if rand(5) == 0 { 31 } else { rand(6) as usize };
                last[ring] += rand(3);
                let key = if ring == 31 { last[ring].saturating_sub(rand(4)) } else { last[ring] };
                one.push(ring, n, key);
                runs.push(ring, n, key);
                if rand(8) == 0 {
                    // Limits that rise and fall with no push between: a run kept at a refused
                    // limit is taken up again.
                    for _ in 0..1 + rand(3) {
                        let limit = rand(2 * n + 1);
                        while let Some((ring, key)) = one.lowest().filter(|&(_, k)| k < limit) {
                            a.push((ring, key, one.pop(ring).unwrap().pos));
                        }
                        while let Some((ring, m)) = runs.next_below(Some(limit)) {
                            b.push((ring, m.key, m.pos));
                        }
                        assert_eq!(a, b, "round {round}");
                        assert_eq!(one.len(), runs.len());
                    }
                }
            }
            while let Some((ring, key)) = one.lowest() {
                a.push((ring, key, one.pop(ring).unwrap().pos));
            }
            while let Some((ring, m)) = runs.next_below(None) {
                b.push((ring, m.key, m.pos));
            }
            assert_eq!(a, b, "round {round}");
            assert!(runs.is_empty());
        }
    }

    /// A queue that never runs dry does not grow with what was already written.
    #[test]
    fn a_queue_that_never_empties_stays_bounded() {
        let mut w = Waiting::default();
        w.push(1, 0, 0);
        for key in 1..100_000u64 {
            w.push(1, key * 8, key);
            assert_eq!(w.pop(1).map(|m| m.key), Some(key - 1));
        }
        assert_eq!(w.len(), 1);
        assert!(w.queues[1].items.len() <= 2 * COMPACT_AT + 1, "{}", w.queues[1].items.len());
        assert_eq!(w.lowest(), Some((1, 99_999)));
    }
}
