//! PyTorch's memory snapshot pickle, as `torch.cuda.memory._snapshot()` writes it, for
//! https://pytorch.org/memory_viz and `torch.cuda._memory_viz`.
//!
//! Two levels, per device:
//! - **With blocks** (PyTorch's caching allocator reported its tensors), PyTorch's own
//!   structure (see `blocks`): segments are the driver allocations that hold blocks, each
//!   tiled by its live blocks and the free gaps between them.
//! - **Without**, every traced GPU allocation is its own segment holding one block (see
//!   `driver`): nothing stands between the program and CUDA from where we see it.
//!
//! `segments` is the state at the end of the trace, which is where memory_viz starts when it
//! replays `device_traces` backwards.

mod blocks;
mod driver;

use std::collections::{HashMap, VecDeque};

use crate::model::{Observer, Step, Trace};
use crate::symbolize::{Frame, TraceSymbolizer};

use super::pickle::Pickler;

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
    fn of(action: &'static str, s: &Step) -> Entry {
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
        self.blocks.iter().filter(|b| b.state == "active_allocated").map(|b| b.size).sum()
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
struct Traces(HashMap<i32, VecDeque<Entry>>);

impl Traces {
    fn push(&mut self, device: i32, entry: Entry) {
        let q = self.0.entry(device).or_default();
        if q.len() >= MAX_ENTRIES {
            q.pop_front();
        }
        q.push_back(entry);
    }
}

/// Collects the trace entries while the model replays: an observer of the loader's replay.
pub struct Collector {
    device: Option<i32>,
    driver: driver::Driver,
    blocks: blocks::Blocks,
}

impl Observer for Collector {
    fn step(&mut self, s: &Step) {
        self.driver.observe(s);
        self.blocks.observe(s);
    }
}

impl Collector {
    pub fn new(device: Option<i32>) -> Collector {
        Collector { device, driver: driver::Driver::default(), blocks: blocks::Blocks::default() }
    }

    pub fn finish(self, trace: &Trace, sym: &mut TraceSymbolizer) -> Snapshot {
        let with_blocks = self.blocks.devices().clone();
        let (mut segments, mut traces) = self.driver.finish();
        segments.retain(|s| !with_blocks.contains(&s.device));
        traces.0.retain(|d, _| !with_blocks.contains(d));
        let (seg, tr) = self.blocks.finish();
        segments.extend(seg);
        traces.0.extend(tr.0.into_iter().filter(|(d, _)| with_blocks.contains(d)));

        let wanted = |d: i32| d >= 0 && self.device.is_none_or(|w| w == d);
        segments.retain(|s| wanted(s.device));
        segments.sort_by_key(|s| (s.device, s.address));
        traces.0.retain(|d, _| wanted(*d));
        let ndev = traces.0.keys().copied().max().map_or(0, |m| m as usize + 1);
        let mut device_traces: Vec<Vec<Entry>> = (0..ndev).map(|_| Vec::new()).collect();
        for (d, q) in traces.0 {
            device_traces[d as usize] = q.into();
        }

        let mut frames = HashMap::new();
        let stacks = segments
            .iter()
            .flat_map(|s| std::iter::once(s.stack).chain(s.blocks.iter().map(|b| b.stack)))
            .chain(device_traces.iter().flatten().map(|e| e.stack));
        for stack in stacks {
            frames.entry(stack).or_insert_with(|| viz_frames(trace, sym, stack));
        }
        Snapshot { segments, device_traces, frames }
    }
}

/// The frames memory_viz shows for a stack: from the call site outwards.
fn viz_frames(trace: &Trace, sym: &mut TraceSymbolizer, stack: u32) -> Vec<VizFrame> {
    if stack == 0 {
        return Vec::new();
    }
    let loc = crate::symbolize::locate(trace, sym, stack);
    loc.frames
        .get(loc.site_index..)
        .unwrap_or_default()
        .iter()
        .filter(|f| f.address != 0 || f.python)
        .map(viz_frame)
        .collect()
}

fn viz_frame(f: &Frame) -> VizFrame {
    VizFrame {
        filename: f
            .file
            .clone()
            .or_else(|| f.module.clone())
            .unwrap_or_else(|| "??".into()),
        line: f.line.unwrap_or(0),
        name: f
            .function
            .clone()
            .unwrap_or_else(|| match (f.module_name(), f.offset) {
                (Some(m), Some(o)) => format!("{m}+{o:#x}"),
                _ => format!("{:#x}", f.address),
            }),
    }
}

/// Small segments come from PyTorch's small pool, which hands out 2 MiB segments.
fn segment_type(s: &Segment) -> &'static str {
    if !s.is_expandable && s.total_size <= 2 << 20 {
        "small"
    } else {
        "large"
    }
}

/// The pickle, with the keys `torch.cuda.memory._snapshot()` gives each dict.
pub fn write(snapshot: &Snapshot, out: &mut dyn std::io::Write) -> Result<(), String> {
    let mut p = Pickler::default();
    let frames = |p: &mut Pickler, stack: u32| {
        let empty = Vec::new();
        let v = snapshot.frames.get(&stack).unwrap_or(&empty);
        p.shared(stack.into(), |p| {
            p.list(v, |p, f| {
                p.dict(|d| {
                    d.item("filename", |p| p.str(&f.filename));
                    d.item("line", |p| p.int(f.line.into()));
                    d.item("name", |p| p.str(&f.name));
                })
            })
        })
    };
    p.dict(|d| {
        d.item("segments", |p| {
            p.list(&snapshot.segments, |p, s| {
                let active = s.active_size();
                p.dict(|d| {
                    d.item("device", |p| p.int(s.device as u64));
                    d.item("address", |p| p.int(s.address));
                    d.item("total_size", |p| p.int(s.total_size));
                    d.item("allocated_size", |p| p.int(active));
                    d.item("active_size", |p| p.int(active));
                    d.item("requested_size", |p| p.int(active));
                    d.item("stream", |p| p.int(s.stream));
                    d.item("segment_type", |p| p.str(segment_type(s)));
                    d.item("is_expandable", |p| p.bool(s.is_expandable));
                    d.item("frames", |p| frames(p, s.stack));
                    d.item("blocks", |p| {
                        p.list(&s.blocks, |p, b| {
                            p.dict(|d| {
                                d.item("address", |p| p.int(b.address));
                                d.item("size", |p| p.int(b.size));
                                let requested = if b.state == "inactive" { 0 } else { b.size };
                                d.item("requested_size", |p| p.int(requested));
                                d.item("state", |p| p.str(b.state));
                                d.item("frames", |p| frames(p, b.stack));
                            })
                        })
                    });
                })
            })
        });
        d.item("device_traces", |p| {
            p.list(&snapshot.device_traces, |p, trace| {
                p.list(trace, |p, e| {
                    p.dict(|d| {
                        d.item("action", |p| p.str(e.action));
                        d.item("addr", |p| p.int(e.addr));
                        d.item("frames", |p| frames(p, e.stack));
                        d.item("size", |p| p.int(e.size));
                        d.item("stream", |p| p.int(e.stream));
                        d.item("time_us", |p| p.int(e.time_us));
                        if e.action == "oom" {
                            // Free device memory then: not known from the calls we see.
                            d.item("device_free", |p| p.int(0));
                        }
                    })
                })
            })
        });
    });
    out.write_all(&p.finish()).map_err(|e| e.to_string())
}
