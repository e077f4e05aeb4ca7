//! The live set: every allocation not yet freed, by pointer namespace and address.
//!
//! It is the reader's one structure that grows with the trace (with the live allocations, not
//! the events), so it is kept small: 16 bytes a live allocation plus its address (see `Slot`),
//! in hash tables split into shards so that no table's doubling ever holds two copies of the
//! whole set at once. docs/performance.md has the measured bytes per live allocation.

use std::collections::HashMap;

use gpumemtrace_format::{Event, MemKind};
use rustc_hash::FxHashMap;

/// Statistics are kept per device and memory kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    pub device: i32,
    pub kind: MemKind,
}

/// Live allocations made from one stack: bytes and how many.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackUse {
    pub stack: u32,
    pub bytes: u64,
    pub count: u64,
}

/// One live allocation, as the replay hands it over and gets it back.
#[derive(Clone, Copy, Debug)]
pub struct Live {
    pub key: GroupKey,
    pub size: u64,
    pub stack: u32,
    /// When the allocation returned (its event's time). Kept only while its address holds a
    /// displaced allocation (the one comparison that needs it); 0 in what the set hands back
    /// otherwise.
    pub time_ns: u64,
}

/// One live allocation as stored: its group by index (`LiveSet::groups`), no time (kept only
/// where an address holds a displaced allocation, the one case that compares it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    size: u64,
    stack: u32,
    group: u32,
}

/// Shards per namespace: a table doubling holds its old copy beside the new one; split, only a
/// sixty-fourth of the live set is ever held twice.
const SHARDS: usize = 64;

/// One namespace's live allocations by address.
struct Shards(Vec<FxHashMap<u64, Slot>>);

impl Shards {
    fn new() -> Shards {
        Shards((0..SHARDS).map(|_| FxHashMap::default()).collect())
    }

    /// The shard of `addr`: the top bits of a hash other than the tables' own.
    fn of(&mut self, addr: u64) -> &mut FxHashMap<u64, Slot> {
        &mut self.0[(addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize]
    }

    fn get(&self, addr: u64) -> Option<&Slot> {
        self.0[(addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize].get(&addr)
    }
}

/// What an address with displaced allocations holds besides its live one.
#[derive(Default)]
struct Displaced {
    /// The time of the allocation live at the address (if one is).
    live_time_ns: u64,
    /// The displaced allocations, oldest first.
    old: Vec<Slot>,
}

/// Live allocations by (namespace, address) (see [`MemKind::namespace`]).
#[derive(Default)]
pub struct LiveSet {
    /// By namespace.
    live: Vec<Shards>,
    /// The groups slots name, and their indexes.
    groups: Vec<GroupKey>,
    group_ids: FxHashMap<GroupKey, u32>,
    /// The last group looked up, and its index: nearly every event is of the group before it.
    last_group: Option<(GroupKey, u32)>,
    /// Allocations whose address was handed out again before their free reached the trace.
    /// Threads record in parallel: thread A frees X, thread B gets X back, and B's event can be
    /// written before A's (when the writer stopped waiting for A). A free's time is taken before
    /// its call and an allocation's after, so a free older than the live allocation at its
    /// address belongs to the allocation it displaced.
    displaced: FxHashMap<(u8, u64), Displaced>,
}

impl LiveSet {
    pub fn get(&self, ns: u8, addr: u64) -> Option<Live> {
        let slot = self.live.get(ns as usize)?.get(addr)?;
        let time_ns = self.displaced.get(&(ns, addr)).map_or(0, |d| d.live_time_ns);
        Some(self.view(*slot, time_ns))
    }

    /// A new allocation at `addr`; one still live there is displaced, not forgotten (it stays
    /// live until its own free arrives, or is a leak if none does).
    /// Returns the index of the allocation's group (see [`LiveSet::group_id`]).
    pub fn insert(&mut self, ns: u8, addr: u64, l: Live) -> u32 {
        let group = self.group_id(l.key);
        let slot = Slot { size: l.size, stack: l.stack, group };
        while self.live.len() <= ns as usize {
            self.live.push(Shards::new());
        }
        let before = self.live[ns as usize].of(addr).insert(addr, slot);
        if before.is_some() || (!self.displaced.is_empty() && self.displaced.contains_key(&(ns, addr))) {
            let d = self.displaced.entry((ns, addr)).or_default();
            d.old.extend(before);
            d.live_time_ns = l.time_ns;
        }
        group
    }

    /// The allocation a successful free at `e.addr` frees: the live one, or, for a free older
    /// than it, the newest allocation it displaced.
    #[cfg(test)]
    pub fn take_freed(&mut self, ns: u8, e: &Event) -> Option<Live> {
        self.take_freed_in_group(ns, e).map(|(l, _)| l)
    }

    /// [`LiveSet::take_freed`], with the index of the allocation's group.
    pub fn take_freed_in_group(&mut self, ns: u8, e: &Event) -> Option<(Live, u32)> {
        let k = (ns, e.addr);
        let shards = self.live.get_mut(ns as usize)?;
        if let Some(d) = self.displaced.get_mut(&k) {
            let older_than_live = shards.get(e.addr).is_none() || e.time_ns < d.live_time_ns;
            if older_than_live {
                let old = d.old.pop().expect("an entry holds a displaced allocation");
                if d.old.is_empty() {
                    self.displaced.remove(&k);
                }
                return Some((self.view(old, 0), old.group));
            }
        }
        let slot = shards.of(e.addr).remove(&e.addr)?;
        Some((self.view(slot, 0), slot.group))
    }

    /// Live allocations at their address, by (namespace, address); displaced ones apart.
    pub fn at_addresses(&self) -> impl Iterator<Item = ((u8, u64), Live)> + '_ {
        self.live.iter().enumerate().flat_map(move |(ns, shards)| {
            shards.0.iter().flatten().map(move |(&addr, &s)| ((ns as u8, addr), self.view(s, 0)))
        })
    }

    /// Displaced allocations never freed: the trace missed a free.
    pub fn displaced(&self) -> impl Iterator<Item = Live> + '_ {
        self.displaced.values().flat_map(|d| d.old.iter().map(|&s| self.view(s, 0)))
    }

    /// The live allocations of one group, by stack, largest first.
    pub fn by_stack(&self, key: GroupKey) -> Vec<StackUse> {
        let Some(&group) = self.group_ids.get(&key) else { return Vec::new() };
        let at_addresses = self.live.iter().flat_map(|s| s.0.iter().flatten().map(|(_, s)| s));
        let displaced = self.displaced.values().flat_map(|d| d.old.iter());
        tally_slots(at_addresses.chain(displaced).filter(|s| s.group == group).map(|s| (s.stack, s.size)))
    }

    /// The index of group `key`: dense (0, 1, ... in the order groups first came), stable for
    /// the life of the set, so the replay's observers keep their books in vectors.
    pub fn group_id(&mut self, key: GroupKey) -> u32 {
        if let Some((k, id)) = self.last_group {
            if k == key {
                return id;
            }
        }
        let id = match self.group_ids.get(&key) {
            Some(&id) => id,
            None => {
                let id = self.groups.len() as u32;
                self.groups.push(key);
                self.group_ids.insert(key, id);
                id
            }
        };
        self.last_group = Some((key, id));
        id
    }

    /// The group of index `id` (see [`LiveSet::group_id`]).
    pub fn group_key(&self, id: u32) -> GroupKey {
        self.groups[id as usize]
    }

    fn view(&self, s: Slot, time_ns: u64) -> Live {
        Live { key: self.groups[s.group as usize], size: s.size, stack: s.stack, time_ns }
    }
}

/// Live entries by stack, largest first.
pub fn tally(live: impl Iterator<Item = Live>) -> Vec<StackUse> {
    tally_slots(live.map(|l| (l.stack, l.size)))
}

fn tally_slots(live: impl Iterator<Item = (u32, u64)>) -> Vec<StackUse> {
    let mut by: HashMap<u32, StackUse> = HashMap::new();
    for (stack, size) in live {
        let u = by.entry(stack).or_insert(StackUse { stack, bytes: 0, count: 0 });
        u.bytes = u.bytes.saturating_add(size);
        u.count += 1;
    }
    let mut v: Vec<StackUse> = by.into_values().collect();
    largest_first(&mut v);
    v
}

/// The order of every by-stack list: bytes, then count, descending; then stack id.
pub fn largest_first(v: &mut [StackUse]) {
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)).then(a.stack.cmp(&b.stack)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_allocation_costs_16_bytes_and_its_address_8_in_the_table() {
        // Issue 13: at most 64 bytes a live allocation, all told. A hash table bucket holds the
        // address and the slot (24 bytes); at most 2.3 buckets an entry (hashbrown's load
        // factor after doubling), one shard at a time held twice while it doubles.
        assert_eq!(std::mem::size_of::<Slot>(), 16);
        assert_eq!(std::mem::size_of::<(u64, Slot)>(), 24);
    }

    fn ev(addr: u64, time_ns: u64) -> Event {
        Event { addr, time_ns, ..Event::default() }
    }

    #[test]
    fn displaced_allocations_are_freed_by_frees_older_than_the_live_one() {
        let key = GroupKey { device: 0, kind: MemKind::Device };
        let other = GroupKey { device: 1, kind: MemKind::Device };
        let mut s = LiveSet::default();
        s.insert(0, 0x10, Live { key, size: 1, stack: 1, time_ns: 10 });
        s.insert(0, 0x10, Live { key: other, size: 2, stack: 2, time_ns: 30 });
        s.insert(1, 0x10, Live { key, size: 3, stack: 3, time_ns: 40 }); // another namespace
        assert_eq!(s.get(0, 0x10).map(|l| (l.size, l.time_ns)), Some((2, 30)));
        assert_eq!(s.displaced().map(|l| l.size).collect::<Vec<_>>(), vec![1]);
        assert_eq!(s.by_stack(other), vec![StackUse { stack: 2, bytes: 2, count: 1 }]);
        assert_eq!(s.by_stack(key).len(), 2, "the displaced one and the other namespace's");
        // A free from before the live allocation frees the displaced one.
        assert_eq!(s.take_freed(0, &ev(0x10, 20)).map(|l| (l.size, l.key)), Some((1, key)));
        assert_eq!(s.displaced().count(), 0);
        assert_eq!(s.take_freed(0, &ev(0x10, 50)).map(|l| l.size), Some(2));
        assert!(s.take_freed(0, &ev(0x10, 60)).is_none());
        // Freed first, then a new one at the address, then the displaced one's late free.
        s.insert(0, 0x20, Live { key, size: 4, stack: 4, time_ns: 100 });
        s.insert(0, 0x20, Live { key, size: 5, stack: 5, time_ns: 110 });
        assert_eq!(s.take_freed(0, &ev(0x20, 120)).map(|l| l.size), Some(5));
        s.insert(0, 0x20, Live { key, size: 6, stack: 6, time_ns: 130 });
        assert_eq!(s.take_freed(0, &ev(0x20, 105)).map(|l| l.size), Some(4), "older than the live one (130)");
        assert_eq!(s.take_freed(0, &ev(0x20, 140)).map(|l| l.size), Some(6));
        let left: Vec<_> = s.at_addresses().map(|(k, l)| (k, l.size)).collect();
        assert_eq!(left, vec![((1, 0x10), 3)]);
    }
}
