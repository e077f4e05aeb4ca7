//! The snapshot of a device without blocks: every traced GPU allocation is its own segment
//! holding one block (there is no caching allocator between the program and CUDA from where we
//! stand): an allocation is `segment_alloc` + `alloc`, a free `free_requested` +
//! `free_completed` + `segment_free`, a failed allocation `oom`.

use std::collections::{HashMap, HashSet};

use gpumemtrace_format::MemKind;

use super::snapshot::{Block, Entry, Segment, Traces};
use crate::model::{GroupKey, Step, StepKind};

/// GPU memory only; pinned host memory, reservations and mappings are not in memory_viz's
/// model.
fn wanted(key: &GroupKey) -> bool {
    key.device >= 0 && matches!(key.kind, MemKind::Device | MemKind::Managed | MemKind::VmmPhysical)
}

struct Live {
    device: i32,
    size: u64,
    stream: u64,
    stack: u32,
}

#[derive(Default)]
pub struct Driver {
    traces: Traces,
    live: HashMap<(MemKind, u64), Live>,
    /// Devices whose blocks showed up: their snapshot is the block level's, so nothing is kept
    /// for them here (memory stays that of one level).
    with_blocks: HashSet<i32>,
}

impl Driver {
    pub fn observe(&mut self, s: &Step) {
        let d = s.key.device;
        if s.key.kind == MemKind::Block && self.with_blocks.insert(d) {
            self.traces.0.remove(&d);
            self.live.retain(|_, l| l.device != d);
        }
        if !wanted(&s.key) || self.with_blocks.contains(&d) {
            return;
        }
        let ns = if s.key.kind == MemKind::VmmPhysical { MemKind::VmmPhysical } else { MemKind::Device };
        match s.kind {
            StepKind::Alloc => {
                self.live.insert((ns, s.addr), Live { device: d, size: s.size, stream: s.stream, stack: s.stack });
                self.traces.push(d, Entry::of("segment_alloc", s));
                self.traces.push(d, Entry::of("alloc", s));
            }
            StepKind::Free => {
                let stream = self.live.remove(&(ns, s.addr)).map_or(s.stream, |l| l.stream);
                for a in ["free_requested", "free_completed", "segment_free"] {
                    self.traces.push(d, Entry { stream, ..Entry::of(a, s) });
                }
            }
            // memory_viz marks an "oom"; other errors (a capability probe) are not one.
            StepKind::FailedAlloc if crate::units::classify(s.api, s.result) == crate::units::Failed::OutOfMemory => {
                self.traces.push(d, Entry::of("oom", s))
            }
            StepKind::FailedAlloc => {}
            StepKind::BadFree | StepKind::Ignored => {}
        }
    }

    pub(super) fn finish(self) -> (Vec<Segment>, Traces) {
        let segments = self
            .live
            .into_iter()
            .map(|((_, addr), l)| Segment {
                device: l.device,
                address: addr,
                total_size: l.size,
                stream: l.stream,
                is_expandable: false,
                stack: l.stack,
                blocks: vec![Block { address: addr, size: l.size, state: "active_allocated", stack: l.stack }],
            })
            .collect();
        (segments, self.traces)
    }
}
