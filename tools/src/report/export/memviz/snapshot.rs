//! The snapshot as memory_viz reads it: segments with their blocks, device traces, frames.

use std::collections::{HashMap, VecDeque};

use crate::model::Step;

/// Trace entries kept per device (the most recent ones), like PyTorch's
/// `trace_alloc_max_entries`.
pub const MAX_ENTRIES: usize = 1_000_000;

#[derive(Clone, Debug)]
pub struct VizFrame {
    pub filename: String,
    pub line: u32,
    pub name: String,
}

/// One entry of a device trace; `stack` keys the frames (0: none).
#[derive(Clone, Debug)]
pub struct Entry {
    pub action: &'static str,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: u64,
    pub stack: u32,
}

impl Entry {
    /// The entry `action` of a step, with the step's address, size, stream and stack.
    pub fn of(action: &'static str, s: &Step) -> Entry {
        Entry { action, addr: s.addr, size: s.size, stream: s.stream, time_us: s.time_ns / 1000, stack: s.stack }
    }
}

#[derive(Debug)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    /// `active_allocated` (live) or `inactive` (free space of the segment).
    pub state: &'static str,
    pub stack: u32,
}

#[derive(Debug)]
pub struct Segment {
    pub device: i32,
    pub address: u64,
    pub total_size: u64,
    pub stream: u64,
    pub is_expandable: bool,
    pub stack: u32,
    /// Tile the segment, in address order.
    pub blocks: Vec<Block>,
}

impl Segment {
    /// Bytes of its live blocks (PyTorch's `allocated_size`, `active_size`, `requested_size`:
    /// we know blocks as the allocator rounded them, not what was asked for).
    pub fn active_size(&self) -> u64 {
        crate::units::total(self.blocks.iter().filter(|b| b.state == "active_allocated").map(|b| b.size))
    }
}

#[derive(Debug, Default)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    pub device_traces: Vec<Vec<Entry>>,
    /// The frames of every stack key used above.
    pub frames: HashMap<u32, Vec<VizFrame>>,
}

/// Device traces as they are collected, each bounded to [`MAX_ENTRIES`].
#[derive(Default)]
pub struct Traces(pub HashMap<i32, VecDeque<Entry>>);

impl Traces {
    pub fn push(&mut self, device: i32, entry: Entry) {
        let q = self.0.entry(device).or_default();
        if q.len() >= MAX_ENTRIES {
            q.pop_front();
        }
        q.push_back(entry);
    }
}
