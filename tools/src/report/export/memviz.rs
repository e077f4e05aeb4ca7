//! PyTorch's memory snapshot pickle, as `torch.cuda.memory._snapshot()` writes it, for
//! https://pytorch.org/memory_viz and `torch.cuda._memory_viz`.
//!
//! Every traced GPU allocation is its own segment holding one block (there is no caching
//! allocator between the program and CUDA from where we stand): an allocation is
//! `segment_alloc` + `alloc`, a free `free_requested` + `free_completed` + `segment_free`, a
//! failed allocation `oom`. `segments` is the state at the end of the trace (what was still
//! live), which is where memory_viz starts when it replays the trace backwards.

use std::collections::{HashMap, VecDeque};

use gpumemtrace_format::MemKind;
use serde::Serialize;

use crate::model::{GroupKey, Step, StepKind, Trace};
use crate::symbolize::{Frame, TraceSymbolizer};

/// Trace entries kept per device (the most recent ones), like PyTorch's
/// `trace_alloc_max_entries`.
pub const MAX_ENTRIES: usize = 1_000_000;

#[derive(Clone, Debug, Serialize)]
pub struct VizFrame {
    pub filename: String,
    pub line: u32,
    pub name: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    pub action: &'static str,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub time_us: u64,
    pub frames: Vec<VizFrame>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_free: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Block {
    pub address: u64,
    pub size: u64,
    pub requested_size: u64,
    pub state: &'static str,
    pub frames: Vec<VizFrame>,
}

#[derive(Debug, Serialize)]
pub struct Segment {
    pub device: i32,
    pub address: u64,
    pub total_size: u64,
    pub allocated_size: u64,
    pub active_size: u64,
    pub requested_size: u64,
    pub stream: u64,
    pub segment_type: &'static str,
    pub is_expandable: bool,
    pub frames: Vec<VizFrame>,
    pub blocks: Vec<Block>,
}

#[derive(Debug, Serialize)]
pub struct Snapshot {
    pub segments: Vec<Segment>,
    pub device_traces: Vec<Vec<Entry>>,
}

/// GPU memory only; pinned host memory, reservations and mappings are not in memory_viz's
/// model.
fn wanted(key: &GroupKey, device: Option<i32>) -> bool {
    key.device >= 0
        && matches!(key.kind, MemKind::Device | MemKind::Managed | MemKind::VmmPhysical)
        && device.is_none_or(|d| d == key.device)
}

/// Collects the trace entries while the model replays (pass it as the loader's observer).
#[derive(Default)]
pub struct Collector {
    pub device: Option<i32>,
    pub traces: HashMap<i32, VecDeque<(Entry, u32)>>,
    /// Live allocations: address -> (device, size, stream, stack).
    live: HashMap<(MemKind, u64), (i32, u64, u64, u32)>,
}

impl Collector {
    pub fn new(device: Option<i32>) -> Collector {
        Collector { device, ..Collector::default() }
    }

    fn push(&mut self, device: i32, action: &'static str, s: &Step, size: u64, stream: u64, stack: u32) {
        let q = self.traces.entry(device).or_default();
        if q.len() >= MAX_ENTRIES {
            q.pop_front();
        }
        let entry = Entry {
            action,
            addr: s.addr,
            size,
            stream,
            time_us: s.time_ns / 1000,
            frames: vec![],
            device_free: (action == "oom").then_some(0),
        };
        q.push_back((entry, stack));
    }

    pub fn observe(&mut self, s: &Step) {
        if !wanted(&s.key, self.device) {
            return;
        }
        let d = s.key.device;
        let ns = if s.key.kind == MemKind::VmmPhysical { MemKind::VmmPhysical } else { MemKind::Device };
        match s.kind {
            StepKind::Alloc => {
                self.live.insert((ns, s.addr), (d, s.size, s.stream, s.stack));
                self.push(d, "segment_alloc", s, s.size, s.stream, s.stack);
                self.push(d, "alloc", s, s.size, s.stream, s.stack);
            }
            StepKind::Free => {
                let stream = self.live.remove(&(ns, s.addr)).map_or(s.stream, |l| l.2);
                for a in ["free_requested", "free_completed", "segment_free"] {
                    self.push(d, a, s, s.size, stream, s.stack);
                }
            }
            StepKind::FailedAlloc => self.push(d, "oom", s, s.size, s.stream, s.stack),
            StepKind::BadFree | StepKind::Ignored => {}
        }
    }

    pub fn finish(self, trace: &Trace, sym: &mut TraceSymbolizer) -> Snapshot {
        let mut cache: HashMap<u32, Vec<VizFrame>> = HashMap::new();
        let mut frames_of = |stack: u32, sym: &mut TraceSymbolizer| -> Vec<VizFrame> {
            cache
                .entry(stack)
                .or_insert_with(|| {
                    let loc = crate::report::locate(trace, sym, stack);
                    loc.frames
                        .get(loc.site_index..)
                        .unwrap_or_default()
                        .iter()
                        .filter(|f| f.address != 0 || f.python)
                        .map(viz_frame)
                        .collect()
                })
                .clone()
        };
        let mut live: Vec<_> = self.live.into_iter().collect();
        live.sort_by_key(|((_, addr), (d, ..))| (*d, *addr));
        let segments = live
            .into_iter()
            .map(|((_, addr), (device, size, stream, stack))| {
                let frames = frames_of(stack, sym);
                Segment {
                    device,
                    address: addr,
                    total_size: size,
                    allocated_size: size,
                    active_size: size,
                    requested_size: size,
                    stream,
                    segment_type: if size <= 1 << 20 { "small" } else { "large" },
                    is_expandable: false,
                    frames: frames.clone(),
                    blocks: vec![Block {
                        address: addr,
                        size,
                        requested_size: size,
                        state: "active_allocated",
                        frames,
                    }],
                }
            })
            .collect();
        let ndev = self.traces.keys().copied().max().map_or(0, |m| m as usize + 1);
        let mut device_traces: Vec<Vec<Entry>> = (0..ndev).map(|_| Vec::new()).collect();
        for (d, q) in self.traces {
            device_traces[d as usize] = q
                .into_iter()
                .map(|(mut e, stack)| {
                    e.frames = frames_of(stack, sym);
                    e
                })
                .collect();
        }
        Snapshot { segments, device_traces }
    }
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

pub fn write(snapshot: &Snapshot, mut out: &mut dyn std::io::Write) -> Result<(), String> {
    serde_pickle::to_writer(&mut out, snapshot, serde_pickle::SerOptions::new()).map_err(|e| e.to_string())
}
