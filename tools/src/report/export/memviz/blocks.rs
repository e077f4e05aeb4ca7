//! The snapshot of a device with blocks, in PyTorch's own structure: segments are the driver
//! allocations the caching allocator placed blocks in (see `pool`), with their live blocks
//! (`active_allocated`, address and size exact) and the free gaps between them (`inactive`),
//! so that each segment's blocks tile it. With expandable segments a segment is a contiguous
//! run of mapped pages of one reservation, as PyTorch reports it (`is_expandable`).
//!
//! The trace: `alloc`, `free_requested` + `free_completed` per block; `segment_alloc` /
//! `segment_free` for device allocations and `segment_map` / `segment_unmap` for mapped
//! pages, emitted when a range becomes a segment (its first block, which is when PyTorch's
//! allocator records it too) and when a segment goes back to the driver; `oom` per failed
//! allocation. Device memory that never holds a block (cuBLAS workspaces, NCCL) is not the
//! allocator's and is not in PyTorch's snapshot either: the summary lists it.

use std::collections::{BTreeMap, BTreeSet};

use gpumemtrace_format::MemKind;

use super::snapshot::{Block, Entry, Segment, Traces};
use crate::model::{Step, StepKind};
use crate::report::export::pool_steps::{Range, StepPools};

struct Live {
    device: i32,
    size: u64,
    stream: u64,
    stack: u32,
    /// It lay in no known driver range, so it got a segment of its own (memory_viz needs one
    /// around every block).
    own_segment: bool,
}

#[derive(Default)]
pub struct Blocks {
    steps: StepPools,
    traces: Traces,
    live: BTreeMap<u64, Live>,
    /// Live address reservations: start -> end.
    reservations: BTreeMap<u64, u64>,
    devices: BTreeSet<i32>,
}

impl Blocks {
    /// Devices that had blocks.
    pub fn devices(&self) -> &BTreeSet<i32> {
        &self.devices
    }

    pub fn observe(&mut self, s: &Step) {
        let d = s.key.device;
        match (s.kind, s.key.kind) {
            (StepKind::Alloc, MemKind::VmmReserved) => {
                self.reservations.insert(s.addr, s.addr.saturating_add(s.size));
            }
            (StepKind::Free, MemKind::VmmReserved) => {
                self.reservations.remove(&s.addr);
            }
            (StepKind::FailedAlloc, MemKind::Device | MemKind::Managed | MemKind::VmmPhysical)
                if crate::units::classify(s.api, s.result) == crate::units::Failed::OutOfMemory =>
            {
                self.traces.push(d, Entry { addr: 0, ..Entry::of("oom", s) });
            }
            (StepKind::Alloc | StepKind::Free, MemKind::Block | MemKind::Device | MemKind::VmmMapped) => {
                let change = self.steps.apply(s);
                for r in &change.claimed {
                    let action = if r.kind == MemKind::VmmMapped { "segment_map" } else { "segment_alloc" };
                    let e = Entry { addr: r.addr, size: r.end - r.addr, stream: r.stream, stack: r.stack, ..Entry::of(action, s) };
                    self.traces.push(r.device, e);
                }
                if let Some(r) = change.released {
                    let action = if r.kind == MemKind::VmmMapped { "segment_unmap" } else { "segment_free" };
                    // The frames of the call that gave it back (empty_cache, an OOM's retry).
                    let e = Entry { addr: r.addr, size: r.end - r.addr, stream: r.stream, ..Entry::of(action, s) };
                    self.traces.push(r.device, e);
                }
                match (s.kind, s.key.kind) {
                    (StepKind::Alloc, MemKind::Block) => self.allocated(s, change.outside),
                    (StepKind::Free, MemKind::Block) => self.freed(s),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    fn allocated(&mut self, s: &Step, outside: bool) {
        let d = s.key.device;
        self.devices.insert(d);
        if outside {
            self.traces.push(d, Entry::of("segment_alloc", s));
        }
        self.traces.push(d, Entry::of("alloc", s));
        let live = Live { device: d, size: s.size, stream: s.stream, stack: s.stack, own_segment: outside };
        self.live.insert(s.addr, live);
    }

    fn freed(&mut self, s: &Step) {
        let d = s.key.device;
        let live = self.live.remove(&s.addr);
        // Block frees are recorded without a stack; the allocation's says which tensor it was.
        let stack = if s.stack != 0 { s.stack } else { s.alloc_stack };
        let stream = live.as_ref().map_or(s.stream, |l| l.stream);
        let mut actions = vec!["free_requested", "free_completed"];
        if live.is_some_and(|l| l.own_segment) {
            actions.push("segment_free");
        }
        for a in actions {
            self.traces.push(d, Entry { stream, stack, ..Entry::of(a, s) });
        }
    }

    /// The reservation holding `addr`, if known.
    fn reservation(&self, addr: u64) -> Option<u64> {
        self.reservations.range(..=addr).next_back().filter(|(_, &end)| end > addr).map(|(&a, _)| a)
    }

    /// Live segments, expandable ones merged into runs of contiguous pages, in address order.
    fn runs(&self) -> Vec<Segment> {
        let mut out: Vec<(Segment, Option<u64>)> = Vec::new();
        for r in self.steps.segments() {
            let expandable = r.kind == MemKind::VmmMapped;
            let reservation = self.reservation(r.addr);
            if let Some((prev, res)) = out.last_mut() {
                let contiguous = prev.address.saturating_add(prev.total_size) == r.addr;
                if expandable && prev.is_expandable && contiguous && *res == reservation && prev.device == r.device && prev.stream == r.stream {
                    prev.total_size += r.end - r.addr;
                    continue;
                }
            }
            out.push((segment(r, expandable), reservation));
        }
        out.into_iter().map(|(s, _)| s).collect()
    }

    // Ends saturate: a corrupt trace may place memory up to the top of the address space.
    pub(super) fn finish(self) -> (Vec<Segment>, Traces) {
        let mut segments = self.runs();
        let mut own = Vec::new();
        for (&addr, l) in &self.live {
            // The last segment starting at or before the block, if the block fits in it.
            let i = segments.partition_point(|s| s.address <= addr);
            let seg = i.checked_sub(1).map(|i| &mut segments[i]).filter(|s| {
                let cursor = s.blocks.last().map_or(s.address, |b| b.address.saturating_add(b.size));
                addr >= cursor && addr.saturating_add(l.size) <= s.address.saturating_add(s.total_size) && s.device == l.device
            });
            match seg {
                Some(s) if !l.own_segment => {
                    let cursor = s.blocks.last().map_or(s.address, |b| b.address.saturating_add(b.size));
                    if addr > cursor {
                        s.blocks.push(Block { address: cursor, size: addr - cursor, state: "inactive", stack: 0 });
                    }
                    s.blocks.push(Block { address: addr, size: l.size, state: "active_allocated", stack: l.stack });
                }
                // A block outside every live segment (or overlapping another: a missed
                // free) stands alone, so that segments still tile.
                _ => {
                    let range = Range { addr, end: addr.saturating_add(l.size), device: l.device, kind: MemKind::Device, stack: l.stack, stream: l.stream };
                    let mut s = segment(&range, false);
                    s.blocks.push(Block { address: addr, size: l.size, state: "active_allocated", stack: l.stack });
                    own.push(s);
                }
            }
        }
        for s in &mut segments {
            let cursor = s.blocks.last().map_or(s.address, |b| b.address.saturating_add(b.size));
            let end = s.address.saturating_add(s.total_size);
            if cursor < end {
                s.blocks.push(Block { address: cursor, size: end - cursor, state: "inactive", stack: 0 });
            }
        }
        segments.extend(own);
        (segments, self.traces)
    }
}

fn segment(r: &Range, expandable: bool) -> Segment {
    Segment {
        device: r.device,
        address: r.addr,
        total_size: r.end - r.addr,
        stream: r.stream,
        is_expandable: expandable,
        stack: r.stack,
        blocks: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use gpumemtrace_format::{Api, Op, Record};

    use super::super::collect::Collector;
    use super::super::snapshot::Snapshot;
    use crate::model::tests::*;
    use crate::model::Trace;
    use crate::symbolize::Symbolizer;

    const BLOCK: u32 = 20;
    const BLOCK_FREE: u32 = 21;

    fn builder() -> TraceBuilder {
        let mut b = TraceBuilder::new();
        for (id, op) in [(BLOCK, Op::Alloc), (BLOCK_FREE, Op::Free)] {
            b.rec(Record::Api(Api { id, name: "block".into(), kind: gpumemtrace_format::MemKind::Block, op }));
        }
        b
    }

    fn snapshot(b: &TraceBuilder) -> Snapshot {
        let mut c = Collector::new(None);
        let t = Trace::load_with(|| Ok(&b.bytes[..]), &Default::default(), &mut c).unwrap();
        let mut sym = Symbolizer::new();
        c.finish(&t, &mut sym.for_trace(&t.modules))
    }

    /// A segment's address, size, expandability and (address, size, state) of its blocks.
    type Tiles = (u64, u64, bool, Vec<(u64, u64, &'static str)>);

    fn tiles(s: &Snapshot) -> Vec<Tiles> {
        s.segments
            .iter()
            .map(|g| (g.address, g.total_size, g.is_expandable, g.blocks.iter().map(|b| (b.address, b.size, b.state)).collect()))
            .collect()
    }

    fn actions(s: &Snapshot) -> Vec<(&'static str, u64, u64)> {
        s.device_traces[0].iter().map(|e| (e.action, e.addr, e.size)).collect()
    }

    #[test]
    fn segments_are_the_allocations_holding_blocks_tiled_by_live_blocks_and_gaps() {
        let mut b = builder();
        b.ok(MALLOC, 1, 0x1000, 0x1000, 1) // becomes a segment with its first block
            .ok(MALLOC, 2, 0x9000, 0x100, 2) // a workspace: never holds a block
            .ok(BLOCK, 3, 0x1200, 0x200, 3)
            .ok(BLOCK, 4, 0x1800, 0x100, 4)
            .ok(BLOCK, 5, 0x5_0000, 0x10, 5) // in no traced allocation
            .ok(BLOCK_FREE, 6, 0x1800, 0, 0)
            .call(MALLOC, 7, 0, 0, 1 << 40, 6, 2);
        let s = snapshot(&b);
        assert_eq!(
            tiles(&s),
            [
                (0x1000, 0x1000, false, vec![(0x1000, 0x200, "inactive"), (0x1200, 0x200, "active_allocated"), (0x1400, 0xc00, "inactive")]),
                (0x5_0000, 0x10, false, vec![(0x5_0000, 0x10, "active_allocated")]),
            ]
        );
        assert_eq!(s.segments[0].active_size(), 0x200);
        assert_eq!(
            actions(&s),
            [
                ("segment_alloc", 0x1000, 0x1000),
                ("alloc", 0x1200, 0x200),
                ("alloc", 0x1800, 0x100),
                ("segment_alloc", 0x5_0000, 0x10),
                ("alloc", 0x5_0000, 0x10),
                ("free_requested", 0x1800, 0x100),
                ("free_completed", 0x1800, 0x100),
                ("oom", 0, 1 << 40),
            ]
        );
        // The segment's frames are its cudaMalloc's; a block free without a stack shows the
        // allocation's.
        assert_eq!(s.segments[0].stack, 1);
        assert_eq!(s.device_traces[0][6].stack, 4);
    }

    #[test]
    fn expandable_segments_are_runs_of_mapped_pages_that_hold_blocks() {
        let mut b = builder();
        b.ok(ADDRESS_RESERVE, 1, 0x10_0000, 0x10_0000, 1);
        for i in 0..3 {
            b.ok(MEM_CREATE, 2, 0x10 + i, 0x1000, 2).rec(Record::Event(gpumemtrace_format::Event {
                api: MEM_MAP,
                time_ns: 3,
                addr: 0x10_0000 + i * 0x1000,
                size: 0x1000,
                extra: 0x10 + i,
                tid: 1,
                ..Default::default()
            }));
        }
        b.ok(BLOCK, 4, 0x10_0800, 0x1000, 3) // pages 0 and 1
            .ok(BLOCK, 5, 0x10_0000, 0x800, 3);
        let s = snapshot(&b);
        // Page 2 never held a block: not reserved by the pool, as the summary counts it.
        assert_eq!(
            tiles(&s),
            [(0x10_0000, 0x2000, true, vec![(0x10_0000, 0x800, "active_allocated"), (0x10_0800, 0x1000, "active_allocated"), (0x10_1800, 0x800, "inactive")])]
        );
        assert_eq!(
            actions(&s),
            [
                ("segment_map", 0x10_0000, 0x1000),
                ("segment_map", 0x10_1000, 0x1000),
                ("alloc", 0x10_0800, 0x1000),
                ("alloc", 0x10_0000, 0x800),
            ]
        );
    }
}
