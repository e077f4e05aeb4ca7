//! Chrome / Perfetto trace-event JSON (opens in ui.perfetto.dev and chrome://tracing): a
//! counter track of live bytes per device and memory kind, an instant event per failed
//! allocation, and phases as complete ("X") events on their threads.

use serde_json::{json, Value};

use crate::model::Trace;
use crate::units::{cuda_result, size};

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

pub fn render(trace: &Trace, device: Option<i32>) -> Value {
    let pid = trace.process.as_ref().map_or(0, |p| p.pid);
    let exe = trace.process.as_ref().map_or("?", |p| p.exe.as_str());
    let mut ev = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid, "tid": 0,
        "args": { "name": format!("{exe} (pid {pid})") }
    })];
    for (key, series) in &trace.ext.series {
        if device.is_some_and(|d| d != key.device) {
            continue;
        }
        let name = format!("device {} {} memory (bytes)", key.device, key.kind.name());
        for (t, _lo, hi, last) in series.points() {
            ev.push(json!({"name": name, "ph": "C", "ts": us(t), "pid": pid, "tid": 0, "args": {"live": hi}}));
            if last != hi {
                let t2 = t + series.bucket_ns / 2;
                ev.push(json!({"name": name, "ph": "C", "ts": us(t2), "pid": pid, "tid": 0, "args": {"live": last}}));
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
    for p in &trace.ext.spans {
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
