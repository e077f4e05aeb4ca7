//! Temporary allocations, as memray counts them (`--temporary-allocation-threshold N`): an
//! allocation freed by the thread that made it with at most N of that thread's other
//! allocations in between (N = 0: freed before the thread allocated again, heaptrack's
//! "temporary"). Counted per group and stack, during the one replay.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use crate::read::live::{GroupKey, StackUse};
use crate::read::replay::{Observer, Step, StepKind};

/// A recent allocation of a thread.
#[derive(Clone, Copy)]
struct Recent {
    key: GroupKey,
    addr: u64,
    stack: u32,
    size: u64,
}

/// A thread's last `threshold + 1` allocations, in a ring: an allocation overwrites the one
/// `threshold + 1` before it, which can no longer be temporary.
struct Recents {
    /// `None`: freed (or never used).
    ring: Vec<Option<Recent>>,
    /// Where the thread's next allocation goes.
    next: usize,
}

pub struct Temporary {
    threshold: usize,
    /// Each thread's recent allocations; `by_tid` finds them, and `last` is the thread of the
    /// last event (most events come from the thread before).
    recent: Vec<Recents>,
    by_tid: FxHashMap<u32, usize>,
    last: Option<(u32, usize)>,
    /// Temporary bytes and count per group and stack.
    found: FxHashMap<(GroupKey, u32), (u64, u64)>,
}

impl Temporary {
    pub fn new(threshold: usize) -> Temporary {
        Temporary { threshold, recent: Vec::new(), by_tid: FxHashMap::default(), last: None, found: FxHashMap::default() }
    }

    /// Thread `tid`'s recent allocations (made empty when `create`, else none if it has none).
    fn recent(&mut self, tid: u32, create: bool) -> Option<&mut Recents> {
        let i = match self.last {
            Some((t, i)) if t == tid => i,
            _ => {
                let i = match self.by_tid.get(&tid) {
                    Some(&i) => i,
                    None if create => {
                        // A threshold too large for memory is as good as "any".
                        let keep = self.threshold.saturating_add(1).min(1 << 16);
                        self.recent.push(Recents { ring: vec![None; keep], next: 0 });
                        self.by_tid.insert(tid, self.recent.len() - 1);
                        self.recent.len() - 1
                    }
                    None => return None,
                };
                self.last = Some((tid, i));
                i
            }
        };
        Some(&mut self.recent[i])
    }

    /// Temporary allocations per group, by stack, most first (then by bytes).
    pub fn finish(self) -> BTreeMap<GroupKey, Vec<StackUse>> {
        let mut out: BTreeMap<GroupKey, Vec<StackUse>> = BTreeMap::new();
        for ((key, stack), (bytes, count)) in self.found {
            out.entry(key).or_default().push(StackUse { stack, bytes, count });
        }
        for v in out.values_mut() {
            v.sort_by(|a, b| b.count.cmp(&a.count).then(b.bytes.cmp(&a.bytes)).then(a.stack.cmp(&b.stack)));
        }
        out
    }
}

impl Observer for Temporary {
    fn step(&mut self, s: &Step) {
        match s.kind {
            StepKind::Alloc => {
                let q = self.recent(s.tid, true).expect("made when missing");
                let at = q.next;
                q.ring[at] = Some(Recent { key: s.key, addr: s.addr, stack: s.alloc_stack, size: s.size });
                q.next = if at + 1 == q.ring.len() { 0 } else { at + 1 };
            }
            StepKind::Free => {
                let Some(q) = self.recent(s.tid, false) else { return };
                // Every slot holds one of the last `threshold + 1` allocations (or a freed one):
                // the others in between are those made after it.
                let Some(r) = q.ring.iter_mut().find_map(|slot| slot.take_if(|r| r.addr == s.addr && r.key == s.key)) else { return };
                let f = self.found.entry((r.key, r.stack)).or_default();
                f.0 = f.0.saturating_add(r.size);
                f.1 += 1;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;
    use crate::model::Trace;

    fn temporaries(b: &TraceBuilder, threshold: usize) -> Vec<(u32, u64, u64)> {
        let mut t = Temporary::new(threshold);
        Trace::load_with(|| Ok(&b.bytes[..]), &crate::model::Filter::default(), &mut t).unwrap();
        t.finish().values().flatten().map(|u| (u.stack, u.bytes, u.count)).collect()
    }

    fn on(tid: u32, api: u32, t: u64, addr: u64, size: u64, stack: u32) -> Record {
        Record::Event(Event { api, time_ns: t, addr, size, stack, tid, ..Event::default() })
    }

    #[test]
    fn temporary_means_freed_within_n_other_allocations_of_the_same_thread() {
        let mut b = TraceBuilder::new();
        // Stack 1: freed at once, twice. Stack 2: one other allocation (stack 3) in between.
        // Stack 3: two in between. Stack 4: never freed. Stack 5: freed by another thread.
        b.ok(MALLOC, 1, 0x100, 10, 1).ok(FREE, 2, 0x100, 0, 9);
        b.ok(MALLOC, 3, 0x100, 10, 1).ok(FREE, 4, 0x100, 0, 9);
        b.ok(MALLOC, 5, 0x200, 20, 2).ok(MALLOC, 6, 0x300, 30, 3).ok(FREE, 7, 0x200, 0, 9);
        b.ok(MALLOC, 8, 0x400, 40, 4).ok(MALLOC, 9, 0x500, 1, 6).ok(FREE, 10, 0x300, 0, 9);
        b.rec(on(1, MALLOC, 11, 0x600, 50, 5)).rec(on(2, FREE, 12, 0x600, 0, 9));
        assert_eq!(temporaries(&b, 0), vec![(1, 20, 2)]);
        assert_eq!(temporaries(&b, 1), vec![(1, 20, 2), (2, 20, 1)]);
        assert_eq!(temporaries(&b, 2), vec![(1, 20, 2), (3, 30, 1), (2, 20, 1)], "most first, then by bytes");
    }

    #[test]
    fn allocations_freed_in_between_still_count_as_in_between() {
        // Stack 1 at 0x100, then stack 2 made and freed, then stack 3 made, then 0x100 freed: two
        // other allocations in between, though one of them is gone by then.
        let mut b = TraceBuilder::new();
        b.ok(MALLOC, 1, 0x100, 10, 1).ok(MALLOC, 2, 0x200, 20, 2).ok(FREE, 3, 0x200, 0, 9);
        b.ok(MALLOC, 4, 0x300, 30, 3).ok(FREE, 5, 0x100, 0, 9);
        assert_eq!(temporaries(&b, 0), vec![(2, 20, 1)]);
        assert_eq!(temporaries(&b, 1), vec![(2, 20, 1)]);
        assert_eq!(temporaries(&b, 2), vec![(2, 20, 1), (1, 10, 1)]);
    }
}
