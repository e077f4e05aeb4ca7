//! The snapshot written as PyTorch's pickle.

use std::collections::HashMap;

use super::snapshot::{Segment, Snapshot};
use crate::report::export::pickle::Pickler;

/// Small segments come from PyTorch's small pool, which hands out 2 MiB segments.
fn segment_type(s: &Segment) -> &'static str {
    if !s.is_expandable && s.total_size <= 2 << 20 {
        "small"
    } else {
        "large"
    }
}

/// Ids of shared objects: stacks by key, distinct frames by number.
const STACKS: u64 = 1 << 40;
const FRAMES: u64 = 2 << 40;

/// The pickle, with the keys `torch.cuda.memory._snapshot()` gives each dict.
pub fn write(snapshot: &Snapshot, out: &mut dyn std::io::Write) -> Result<(), String> {
    let mut p = Pickler::default();
    // Two levels of sharing, as PyTorch's own snapshot has (one dict per distinct frame, see
    // torch's py_symbolize): each distinct frame is one memoized dict, and each stack's list
    // of them one memoized list, so an entry costs a reference, whatever its depth.
    let mut frame_ids: HashMap<(&str, u32, &str), u64> = HashMap::new();
    for f in snapshot.frames.values().flatten() {
        let next = frame_ids.len() as u64;
        frame_ids.entry((&f.filename, f.line, &f.name)).or_insert(next);
    }
    let frames = |p: &mut Pickler, stack: u32| {
        let empty = Vec::new();
        let v = snapshot.frames.get(&stack).unwrap_or(&empty);
        p.shared(STACKS | u64::from(stack), |p| {
            p.list(v, |p, f| {
                let id = frame_ids[&(f.filename.as_str(), f.line, f.name.as_str())];
                p.shared(FRAMES | id, |p| {
                    p.dict(|d| {
                        d.item("filename", |p| p.str(&f.filename));
                        d.item("line", |p| p.int(f.line.into()));
                        d.item("name", |p| p.str(&f.name));
                    })
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
