//! Chrome / Perfetto trace-event JSON (opens in ui.perfetto.dev and chrome://tracing): a
//! counter track of live bytes per device and memory kind, an instant event per failed
//! allocation, and phases as complete ("X") events on their threads. On a device with blocks
//! (PyTorch's caching allocator), two exact tracks instead of the blocks' sampled one:
//! `allocated` (live blocks) and `reserved` (segments), a point at every change.

use std::collections::BTreeMap;

use gpumemtrace_format::MemKind;
use serde_json::{json, Value};

use super::pool_steps::StepPools;
use crate::model::{Observer, Step, StepKind, Trace};
use crate::units::{cuda_result, size};

/// Allocated and reserved bytes per device at each change, `(time ns, bytes)`, collected while
/// the model replays (an observer of the loader's replay). They are the
/// model's own pool figures (the same `Pools`), so their peaks and last values are the summary's.
#[derive(Default)]
pub struct PoolCounters {
    steps: StepPools,
    pub allocated: BTreeMap<i32, Vec<(u64, u64)>>,
    pub reserved: BTreeMap<i32, Vec<(u64, u64)>>,
}

impl Observer for PoolCounters {
    fn step(&mut self, s: &Step) {
        if !matches!(s.kind, StepKind::Alloc | StepKind::Free)
            || !matches!(s.key.kind, MemKind::Block | MemKind::Device | MemKind::VmmMapped)
        {
            return;
        }
        self.steps.apply(s);
        // Only the step's own device changes (a free's key is that of what it freed).
        let d = s.key.device;
        let Some(p) = self.steps.pools.by_device.get(&d) else { return };
        for (series, v) in [(&mut self.allocated, p.allocated), (&mut self.reserved, p.reserved)] {
            let points = series.entry(d).or_default();
            if points.last().is_none_or(|&(_, last)| last != v) {
                points.push((s.time_ns, v));
            }
        }
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn render(trace: &Trace, device: Option<i32>, pools: &PoolCounters) -> Value {
    let pid = trace.process.as_ref().map_or(0, |p| p.pid);
    let exe = trace.process.as_ref().map_or("?", |p| p.exe.as_str());
    let mut ev = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": { "name": format!("{exe} (pid {pid})") }
    })];
    for (key, series) in &trace.series {
        if device.is_some_and(|d| d != key.device) || (key.kind == MemKind::Block && pools.allocated.contains_key(&key.device)) {
            continue;
        }
        let name = if key.device < 0 {
            format!("{} (bytes)", crate::units::group_label(key.device, key.kind))
        } else {
            format!("device {} {} memory (bytes)", key.device, key.kind.name())
        };
        for (t, _lo, hi, last) in series.points() {
            ev.push(json!({"name": name, "ph": "C", "ts": us(t), "pid": pid, "tid": 0, "args": {"live": hi}}));
            if last != hi {
                let t2 = t + series.bucket_ns / 2;
                ev.push(json!({"name": name, "ph": "C", "ts": us(t2), "pid": pid, "tid": 0, "args": {"live": last}}));
            }
        }
    }
    let exact = [("allocated", "blocks", &pools.allocated), ("reserved", "segments", &pools.reserved)];
    for (arg, what, series) in exact {
        for (d, points) in series.iter().filter(|(d, _)| device.is_none_or(|w| w == **d)) {
            let name = format!("device {d} {arg} ({what}, bytes)");
            for &(t, v) in points {
                ev.push(json!({"name": name, "ph": "C", "ts": us(t), "pid": pid, "tid": 0, "args": {arg: v}}));
            }
        }
    }
    for f in trace.failures.iter().filter(|f| device.is_none_or(|d| d == f.device)) {
        ev.push(json!({
            "name": format!("{} {} failed", f.api, size(f.size)),
            "ph": "i", "s": "p", "ts": us(f.time_ns), "pid": pid, "tid": 0, "cat": "failure",
            "args": {
                "device": f.device, "kind": f.kind.name(), "size": f.size,
                "result": cuda_result(f.result), "live_bytes_on_device": f.live_bytes_on_device
            }
        }));
    }
    for p in &trace.spans {
        ev.push(json!({
            "name": p.name, "ph": "X", "ts": us(p.start_ns), "dur": us(p.end_ns - p.start_ns),
            "pid": pid, "tid": p.tid, "cat": if p.mark { "mark" } else { "phase" }
        }));
    }
    json!({
        "traceEvents": ev,
        "displayTimeUnit": "ms",
        "otherData": { "producer": "gpumemtrace", "pid": pid, "exe": exe }
    })
}
