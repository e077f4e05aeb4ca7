//! The caching allocator's two levels followed step by step, for exporters that need every
//! change rather than the model's end state: the same [`Pools`] the model keeps, applied to the
//! same steps (so the figures agree with the summary to the byte), plus which driver range
//! became, or stopped being, a segment at each step.

use std::collections::BTreeMap;

use gpumemtrace_format::MemKind;

use crate::model::{Step, StepKind};
use crate::model::pool::Pools;

/// A live driver range blocks can lie in: a device allocation or a VMM mapping.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub addr: u64,
    pub end: u64,
    pub device: i32,
    /// `VmmMapped` (expandable segments) or `Device`.
    pub kind: MemKind,
    /// The allocating stack key.
    pub stack: u32,
    pub stream: u64,
}

/// What one step did at the segment level.
#[derive(Debug, Default)]
pub struct Change {
    /// Ranges that became segments (a first block was placed in them), in address order.
    pub claimed: Vec<Range>,
    /// A segment given back to the driver.
    pub released: Option<Range>,
    /// A block that lay in no live driver range.
    pub outside: bool,
}

#[derive(Default)]
pub struct StepPools {
    pub pools: Pools,
    ranges: BTreeMap<u64, Range>,
}

impl StepPools {
    pub fn apply(&mut self, s: &Step) -> Change {
        let mut change = Change::default();
        match (s.kind, s.key.kind) {
            (StepKind::Alloc, MemKind::Device | MemKind::VmmMapped) => {
                self.pools.apply(s);
                if s.size > 0 {
                    let r = Range {
                        addr: s.addr,
                        end: s.addr.saturating_add(s.size),
                        device: s.key.device,
                        kind: s.key.kind,
                        stack: s.stack,
                        stream: s.stream,
                    };
                    self.ranges.insert(s.addr, r);
                }
            }
            (StepKind::Free, MemKind::Device | MemKind::VmmMapped) => {
                let was_segment = self.pools.is_segment(s.addr);
                self.pools.apply(s);
                let r = self.ranges.remove(&s.addr);
                change.released = r.filter(|_| was_segment);
            }
            (StepKind::Alloc, MemKind::Block) => {
                let end = s.addr.saturating_add(s.size);
                // Ranges do not overlap: those that end after the block starts, walking down
                // from the last one that starts before it ends.
                let candidates: Vec<u64> = self
                    .ranges
                    .range(..end)
                    .rev()
                    .take_while(|(_, r)| r.end > s.addr)
                    .map(|(&a, _)| a)
                    .filter(|&a| !self.pools.is_segment(a))
                    .collect();
                change.outside = !self.pools.apply(s);
                change.claimed =
                    candidates.into_iter().rev().filter(|&a| self.pools.is_segment(a)).map(|a| self.ranges[&a]).collect();
            }
            _ => {
                self.pools.apply(s);
            }
        }
        change
    }

    /// The live driver ranges that are segments, in address order.
    pub fn segments(&self) -> impl Iterator<Item = &Range> {
        self.ranges.values().filter(|r| self.pools.is_segment(r.addr))
    }
}
