//! Two levels of GPU memory under a caching allocator (PyTorch's): **segments**, what the
//! allocator got from the driver (reserved: `cudaMalloc`, or VMM pages mapped into its
//! reservation with expandable segments), and **blocks**, what it handed out (allocated:
//! tensors, reported through `c10::reportMemoryUsageToProfiler`).
//!
//! A driver allocation becomes a segment of the pool when the first block is placed inside
//! it; device memory that never holds a block is a direct driver allocation (cuBLAS's
//! workspaces, NCCL, custom kernels). Reserved minus allocated is the cache: memory the
//! allocator keeps for reuse, "cached, not leaked".

use std::collections::BTreeMap;

use gpumemtrace_format::{Event, MemKind};

use crate::read::replay::{Observer, Step, StepKind};

/// A driver range blocks can lie in: a device allocation or a VMM mapping.
#[derive(Clone, Copy, Debug)]
struct Range {
    end: u64,
    device: i32,
    /// A block was placed in it: it belongs to the allocator's pool.
    pool: bool,
    /// A device allocation (not a VMM mapping), and the stack that made it: until it joins the
    /// pool, direct driver memory.
    device_alloc: bool,
    stack: u32,
}

/// A live driver range [`Pools::seed`] learns: a device allocation (with its stack) or a mapping.
pub struct Seed {
    pub addr: u64,
    pub size: u64,
    pub device: i32,
    pub device_alloc: bool,
    pub stack: u32,
}

/// Direct device memory of a stack rose (`true`) or fell by a range: (device, stack, rose, bytes).
pub type DirectChange = (i32, u32, bool, u64);

/// The allocator's own counters as it reported them with its blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reported {
    pub allocated: u64,
    pub reserved: u64,
    pub max_allocated: u64,
    pub max_reserved: u64,
}

/// One device's pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pool {
    /// Live block bytes and count.
    pub allocated: u64,
    pub blocks: u64,
    /// Live bytes and count of the segments (driver ranges holding or having held blocks).
    pub reserved: u64,
    pub segments: u64,
    pub peak_allocated: u64,
    pub peak_allocated_time_ns: u64,
    /// Reserved at the moment of the allocated peak: minus the peak, the fragmentation then.
    pub reserved_at_allocated_peak: u64,
    pub peak_reserved: u64,
    pub peak_reserved_time_ns: u64,
    /// Blocks that lay in no live driver range the trace knows (should be 0).
    pub blocks_outside: u64,
    /// The allocator's counters (torch 1.10+ reports them; older versions do not).
    pub reported: Option<Reported>,
}

/// Segments and blocks of every device, as the replay goes.
#[derive(Default)]
pub struct Pools {
    ranges: BTreeMap<u64, Range>,
    /// Ranges are not followed until `seed` (see `lazy`).
    waiting: bool,
    pub by_device: BTreeMap<i32, Pool>,
    /// What the last step did to direct device memory (see [`Pools::take_direct_changes`]),
    /// kept only when someone takes them.
    direct_changes: Vec<DirectChange>,
    track_direct: bool,
}

impl Pools {
    /// Pools that follow driver ranges only from their `seed` on: a trace without blocks (no
    /// caching allocator) then never keeps a second copy of its live device memory.
    pub fn lazy() -> Pools {
        Pools { waiting: true, ..Pools::default() }
    }

    /// The driver ranges live now, from the live set: from here on ranges are followed as
    /// they come and go.
    pub fn seed(&mut self, live: impl Iterator<Item = Seed>) {
        self.waiting = false;
        for s in live {
            if s.device_alloc {
                self.device_range_added(s.addr, s.size, s.device, s.stack);
            } else {
                self.range_added(s.addr, s.size, s.device);
            }
        }
    }


    /// Follows one step of the replay; false for a block that lay in no known driver range.
    pub fn apply(&mut self, s: &Step) -> bool {
        match (s.kind, s.key.kind) {
            (StepKind::Alloc, MemKind::Device) => self.device_range_added(s.addr, s.size, s.key.device, s.alloc_stack),
            (StepKind::Alloc, MemKind::VmmMapped) => self.range_added(s.addr, s.size, s.key.device),
            (StepKind::Alloc, MemKind::Block) => return self.block_allocated(s.event),
            (StepKind::Free, MemKind::Device | MemKind::VmmMapped) => self.range_removed(s.addr, s.size),
            (StepKind::Free, MemKind::Block) => self.block_freed(s.event, s.key.device, s.size),
            _ => {}
        }
        true
    }

    /// A driver range came to life (a mapping).
    pub fn range_added(&mut self, addr: u64, size: u64, device: i32) {
        self.insert(addr, Range { end: addr.saturating_add(size), device, pool: false, device_alloc: false, stack: 0 });
    }

    /// A device allocation came to life: direct memory until a block lies in it.
    fn device_range_added(&mut self, addr: u64, size: u64, device: i32, stack: u32) {
        if self.insert(addr, Range { end: addr.saturating_add(size), device, pool: false, device_alloc: true, stack }) {
            self.direct((device, stack, true, size));
        }
    }

    fn insert(&mut self, addr: u64, r: Range) -> bool {
        if r.end == addr || self.waiting {
            return false;
        }
        if let Some(old) = self.ranges.insert(addr, r) {
            self.left(addr, old); // displaced: the trace missed its free
        }
        true
    }

    /// The same pools, keeping their direct memory changes for [`Pools::take_direct_changes`].
    pub fn tracking_direct_memory(self) -> Pools {
        Pools { track_direct: true, ..self }
    }

    /// Direct memory changes since the last call (they happen in `apply`).
    pub fn take_direct_changes(&mut self) -> std::vec::Drain<'_, DirectChange> {
        self.direct_changes.drain(..)
    }

    fn direct(&mut self, change: DirectChange) {
        if self.track_direct {
            self.direct_changes.push(change);
        }
    }

    fn left(&mut self, addr: u64, r: Range) {
        if r.device_alloc && !r.pool {
            self.direct((r.device, r.stack, false, r.end - addr));
        }
    }

    /// A driver range went away; a segment's bytes leave the reserved count.
    pub fn range_removed(&mut self, addr: u64, size: u64) {
        if let Some(r) = self.ranges.remove(&addr) {
            self.left(addr, r);
            if r.pool {
                if let Some(p) = self.by_device.get_mut(&r.device) {
                    p.reserved = p.reserved.saturating_sub(size);
                    p.segments = p.segments.saturating_sub(1);
                }
            }
        }
    }

    /// Whether the live driver range starting at `addr` is a pool segment.
    pub fn is_segment(&self, addr: u64) -> bool {
        self.ranges.get(&addr).is_some_and(|r| r.pool)
    }

    /// A block was handed out: place it in its segment(s); true if it lay in known memory.
    pub fn block_allocated(&mut self, e: &Event) -> bool {
        let (start, end) = (e.addr, e.addr.saturating_add(e.size));
        let mut placed = false;
        let mut newly: Vec<(i32, u64)> = Vec::new();
        let mut direct = self.track_direct.then_some(&mut self.direct_changes);
        // The range holding `start`, then any that follow it inside the block (a block of
        // expandable segments may span several mapped pages).
        let first = self.ranges.range(..=start).next_back().map(|(&a, _)| a);
        let mut cursor = match first {
            Some(a) if self.ranges[&a].end > start => a,
            _ => start,
        };
        while let Some((&a, r)) = self.ranges.range_mut(cursor..).next() {
            if a >= end {
                break;
            }
            if r.end <= start {
                cursor = a + 1;
                continue;
            }
            placed = true;
            if !r.pool {
                r.pool = true;
                newly.push((r.device, r.end - a));
                if let Some(d) = direct.as_mut().filter(|_| r.device_alloc) {
                    d.push((r.device, r.stack, false, r.end - a));
                }
            }
            cursor = r.end.max(a.saturating_add(1));
        }
        let pool = self.by_device.entry(e.device).or_default();
        for (_, size) in newly {
            pool.reserved = pool.reserved.saturating_add(size);
            pool.segments += 1;
        }
        pool.allocated = pool.allocated.saturating_add(e.size);
        pool.blocks += 1;
        if !placed {
            pool.blocks_outside += 1;
        }
        if pool.reserved > pool.peak_reserved {
            pool.peak_reserved = pool.reserved;
            pool.peak_reserved_time_ns = e.time_ns;
        }
        if pool.allocated > pool.peak_allocated {
            pool.peak_allocated = pool.allocated;
            pool.peak_allocated_time_ns = e.time_ns;
            pool.reserved_at_allocated_peak = pool.reserved;
        }
        self.reported(e);
        placed
    }

    /// A block was taken back (`size`: the block's size as allocated).
    pub fn block_freed(&mut self, e: &Event, device: i32, size: u64) {
        let pool = self.by_device.entry(device).or_default();
        pool.allocated = pool.allocated.saturating_sub(size);
        pool.blocks = pool.blocks.saturating_sub(1);
        self.reported(e);
    }

    fn reported(&mut self, e: &Event) {
        // Reserved is never 0 once a block exists; 0 means the allocator reports no totals.
        if e.total_reserved == 0 {
            return;
        }
        let Some(pool) = self.by_device.get_mut(&e.device) else { return };
        let r = pool.reported.get_or_insert_with(Reported::default);
        r.allocated = e.total_allocated;
        r.reserved = e.total_reserved;
        r.max_allocated = r.max_allocated.max(e.total_allocated);
        r.max_reserved = r.max_reserved.max(e.total_reserved);
    }
}

impl Observer for Pools {
    fn step(&mut self, s: &Step) {
        self.apply(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(addr: u64, size: u64, t: u64) -> Event {
        Event { addr, size, time_ns: t, ..Event::default() }
    }

    #[test]
    fn segments_count_as_reserved_once_they_hold_a_block() {
        let mut p = Pools::default();
        p.range_added(0x1000, 0x1000, 0); // a segment
        p.range_added(0x8000, 0x100, 0); // a workspace: never holds a block
        assert!(p.block_allocated(&block(0x1000, 0x200, 1)));
        assert!(p.block_allocated(&block(0x1200, 0x200, 2)));
        let d = &p.by_device[&0];
        assert_eq!((d.allocated, d.blocks, d.reserved, d.segments), (0x400, 2, 0x1000, 1));
        assert_eq!((d.peak_allocated, d.reserved_at_allocated_peak, d.peak_reserved), (0x400, 0x1000, 0x1000));
        assert!(p.is_segment(0x1000) && !p.is_segment(0x8000));
        p.block_freed(&block(0x1000, 0, 3), 0, 0x200);
        p.range_removed(0x8000, 0x100);
        p.range_removed(0x1000, 0x1000);
        let d = &p.by_device[&0];
        assert_eq!((d.allocated, d.blocks, d.reserved, d.segments, d.blocks_outside), (0x200, 1, 0, 0, 0));
    }

    #[test]
    fn a_block_across_mapped_pages_claims_each_page_and_one_outside_is_counted() {
        let mut p = Pools::default();
        for i in 0..3 {
            p.range_added(0x10_0000 + i * 0x1000, 0x1000, 0);
        }
        assert!(p.block_allocated(&block(0x10_0800, 0x1000, 1))); // pages 0 and 1
        assert_eq!(p.by_device[&0].reserved, 0x2000);
        assert!(!p.block_allocated(&block(0x90_0000, 0x10, 2)));
        assert_eq!(p.by_device[&0].blocks_outside, 1);
    }
}
