//! The observer that collects a snapshot while the model replays.

use std::collections::HashMap;

use super::snapshot::{Entry, Snapshot, VizFrame};
use super::{blocks, driver};
use crate::model::{Observer, Step, Trace};
use crate::symbolize::{Frame, TraceSymbolizer};

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

        // memory_viz lists devices by index, 0 to the highest: an index no machine has (a
        // corrupt trace's) is left out rather than given a billion empty lists.
        let plausible = |d: i32| d < crate::model::IMPOSSIBLE_DEVICE;
        let implausible: Vec<i32> = traces.0.keys().chain(segments.iter().map(|s| &s.device)).copied().filter(|&d| !plausible(d)).collect();
        if let Some(d) = implausible.first() {
            eprintln!("warning: device {d} is not a device index a machine can have; left out of the snapshot");
        }
        let wanted = |d: i32| d >= 0 && plausible(d) && self.device.is_none_or(|w| w == d);
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
