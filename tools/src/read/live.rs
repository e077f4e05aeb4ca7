//! The live set: every allocation not yet freed, by pointer namespace and address.

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

/// One live allocation.
#[derive(Clone, Debug)]
pub struct Live {
    pub key: GroupKey,
    pub size: u64,
    pub stack: u32,
    /// When the allocation returned (its event's time).
    pub time_ns: u64,
}

/// Live allocations by (namespace, address) (see [`MemKind::namespace`]).
#[derive(Default)]
pub struct LiveSet {
    live: FxHashMap<(u8, u64), Live>,
    /// Allocations whose address was handed out again before their free reached the trace.
    /// Threads record in parallel: thread A frees X, thread B gets X back, and B's event can be
    /// written before A's (when the writer stopped waiting for A). A free's time is taken before
    /// its call and an allocation's after, so a free older than the live allocation at its
    /// address belongs to the allocation it displaced.
    displaced: FxHashMap<(u8, u64), Vec<Live>>,
}

impl LiveSet {
    pub fn get(&self, ns: u8, addr: u64) -> Option<&Live> {
        self.live.get(&(ns, addr))
    }

    /// A new allocation at `addr`; one still live there is displaced, not forgotten (it stays
    /// live until its own free arrives, or is a leak if none does).
    pub fn insert(&mut self, ns: u8, addr: u64, l: Live) {
        if let Some(old) = self.live.insert((ns, addr), l) {
            self.displaced.entry((ns, addr)).or_default().push(old);
        }
    }

    /// The allocation a successful free at `e.addr` frees: the live one, or, for a free older
    /// than it, the newest allocation it displaced.
    pub fn take_freed(&mut self, ns: u8, e: &Event) -> Option<Live> {
        let k = (ns, e.addr);
        let older_than_live = self.live.get(&k).is_none_or(|l| e.time_ns < l.time_ns);
        if older_than_live {
            if let Some(v) = self.displaced.get_mut(&k) {
                let old = v.pop();
                if v.is_empty() {
                    self.displaced.remove(&k);
                }
                if old.is_some() {
                    return old;
                }
            }
        }
        self.live.remove(&k)
    }

    /// Live allocations at their address, by (namespace, address); displaced ones apart.
    pub fn at_addresses(&self) -> impl Iterator<Item = (&(u8, u64), &Live)> {
        self.live.iter()
    }

    /// Displaced allocations never freed: the trace missed a free.
    pub fn displaced(&self) -> impl Iterator<Item = &Live> {
        self.displaced.values().flatten()
    }

    /// The live allocations of one group, by stack, largest first.
    pub fn by_stack(&self, key: GroupKey) -> Vec<StackUse> {
        tally(self.live.values().chain(self.displaced()).filter(|l| l.key == key))
    }
}

/// Live entries by stack, largest first.
pub fn tally<'a>(live: impl Iterator<Item = &'a Live>) -> Vec<StackUse> {
    let mut by: HashMap<u32, StackUse> = HashMap::new();
    for l in live {
        let u = by.entry(l.stack).or_insert(StackUse { stack: l.stack, bytes: 0, count: 0 });
        u.bytes += l.size;
        u.count += 1;
    }
    let mut v: Vec<StackUse> = by.into_values().collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)).then(a.stack.cmp(&b.stack)));
    v
}
