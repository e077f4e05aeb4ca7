//! Chrome / Perfetto trace-event JSON (opens in ui.perfetto.dev and chrome://tracing):
//! - a counter track of live bytes per device and memory kind, exact: a sample at every change,
//!   the replay's own live bytes (the summary's peaks and ends);
//! - on a device with blocks (PyTorch's caching allocator), `allocated` (live blocks) and
//!   `reserved` (segments) tracks instead of the blocks' one, exact too;
//! - an instant event per allocation on its thread, carrying its size, address, call site and
//!   stack (from the site outwards), and one per failed allocation;
//! - phases as complete ("X") events on their threads.
//!
//! Written as it goes (one event at a time), so a long trace needs no tree of JSON values.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use gpumemtrace_format::MemKind;
use serde_json::json;

use super::pool_steps::StepPools;
use crate::model::{GroupKey, Observer, Step, StepKind, Trace};
use crate::symbolize::TraceSymbolizer;
use crate::units::{cuda_result, size};

/// Frames of an allocation's stack its event carries at most (from the call site outwards).
pub const STACK_FRAMES: usize = 16;

/// One allocation, for its instant event.
struct Alloc {
    time_ns: u64,
    key: GroupKey,
    size: u64,
    addr: u64,
    stack: u32,
    tid: u32,
    api: u32,
}

/// Live bytes per group, allocated and reserved per device with blocks, each `(time ns,
/// bytes)` at every change; and the allocations. Collected while the model replays (an
/// observer of the loader's replay): the replay's own live bytes and the model's own pool
/// figures (the same `Pools`), so peaks and last values are the summary's.
#[derive(Default)]
pub struct PoolCounters {
    steps: StepPools,
    pub live: BTreeMap<GroupKey, Vec<(u64, u64)>>,
    pub allocated: BTreeMap<i32, Vec<(u64, u64)>>,
    pub reserved: BTreeMap<i32, Vec<(u64, u64)>>,
    allocs: Vec<Alloc>,
    apis: Vec<String>,
    api_ids: HashMap<String, u32>,
}

fn push(points: &mut Vec<(u64, u64)>, t: u64, v: u64) {
    if points.last().is_none_or(|&(_, last)| last != v) {
        points.push((t, v));
    }
}

impl Observer for PoolCounters {
    fn step(&mut self, s: &Step) {
        if !matches!(s.kind, StepKind::Alloc | StepKind::Free) {
            return;
        }
        push(self.live.entry(s.key).or_default(), s.time_ns, s.group_live);
        if s.kind == StepKind::Alloc {
            let next = self.apis.len() as u32;
            let api = *self.api_ids.entry(s.api.to_string()).or_insert(next);
            if api == next {
                self.apis.push(s.api.to_string());
            }
            self.allocs.push(Alloc { time_ns: s.time_ns, key: s.key, size: s.size, addr: s.addr, stack: s.stack, tid: s.tid, api });
        }
        if !matches!(s.key.kind, MemKind::Block | MemKind::Device | MemKind::VmmMapped) {
            return;
        }
        self.steps.apply(s);
        // Only the step's own device changes (a free's key is that of what it freed).
        let d = s.key.device;
        let Some(p) = self.steps.pools.by_device.get(&d) else { return };
        push(self.allocated.entry(d).or_default(), s.time_ns, p.allocated);
        push(self.reserved.entry(d).or_default(), s.time_ns, p.reserved);
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// The `"site": ..., "stack": [...]` members of a stack's events, as JSON text.
fn stack_args(trace: &Trace, sym: &mut TraceSymbolizer, stack: u32) -> String {
    let loc = crate::symbolize::locate(trace, sym, stack);
    let frames: Vec<String> = loc
        .frames
        .get(loc.site_index..)
        .unwrap_or_default()
        .iter()
        .filter(|f| f.address != 0 || f.python)
        .take(STACK_FRAMES)
        .map(|f| f.describe())
        .collect();
    let site = if frames.is_empty() { "(no stack captured)".to_string() } else { loc.site.describe() };
    format!("\"site\":{},\"stack\":{}", json!(site), json!(frames))
}

/// Writes the trace-event JSON of `trace` (only `device`'s memory when given).
pub fn write(
    trace: &Trace,
    device: Option<i32>,
    c: &PoolCounters,
    sym: &mut TraceSymbolizer,
    out: &mut dyn Write,
) -> io::Result<()> {
    let pid = trace.process.as_ref().map_or(0, |p| p.pid);
    let exe = trace.process.as_ref().map_or("?", |p| p.exe.as_str());
    let wanted = |d: i32| device.is_none_or(|w| w == d);
    out.write_all(b"{\"traceEvents\":[\n")?;
    let meta = json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": { "name": format!("{exe} (pid {pid})") }});
    serde_json::to_writer(&mut *out, &meta)?;
    for (key, points) in c.live.iter().filter(|(k, _)| wanted(k.device)) {
        if key.kind == MemKind::Block && c.allocated.contains_key(&key.device) {
            continue;
        }
        let name = if key.device < 0 {
            format!("{} (bytes)", crate::units::group_label(key.device, key.kind))
        } else {
            format!("device {} {} memory (bytes)", key.device, key.kind.name())
        };
        let name = json!(name).to_string();
        for &(t, v) in points {
            write!(out, ",\n{{\"name\":{name},\"ph\":\"C\",\"ts\":{},\"pid\":{pid},\"tid\":0,\"args\":{{\"live\":{v}}}}}", us(t))?;
        }
    }
    // Devices whose blocks lay in segments: the caching allocator's two levels.
    let with_blocks = |d: &i32| trace.pools.contains_key(d) && wanted(*d);
    for (arg, what, series) in [("allocated", "blocks", &c.allocated), ("reserved", "segments", &c.reserved)] {
        for (d, points) in series.iter().filter(|(d, _)| with_blocks(d)) {
            let name = json!(format!("device {d} {arg} ({what}, bytes)")).to_string();
            for &(t, v) in points {
                write!(out, ",\n{{\"name\":{name},\"ph\":\"C\",\"ts\":{},\"pid\":{pid},\"tid\":0,\"args\":{{\"{arg}\":{v}}}}}", us(t))?;
            }
        }
    }
    let mut stacks: HashMap<u32, String> = HashMap::new();
    for a in c.allocs.iter().filter(|a| wanted(a.key.device)) {
        let args = stacks.entry(a.stack).or_insert_with(|| stack_args(trace, sym, a.stack));
        let name = json!(format!("{} {}", c.apis[a.api as usize], size(a.size))).to_string();
        write!(
            out,
            ",\n{{\"name\":{name},\"ph\":\"i\",\"s\":\"t\",\"ts\":{},\"pid\":{pid},\"tid\":{},\"cat\":\"alloc\",\"args\":{{\"device\":{},\"kind\":\"{}\",\"size\":{},\"addr\":\"{:#x}\",{args}}}}}",
            us(a.time_ns),
            a.tid,
            a.key.device,
            a.key.kind.name(),
            a.size,
            a.addr
        )?;
    }
    for f in trace.failures.iter().filter(|f| wanted(f.device)) {
        let e = json!({
            "name": format!("{} {} failed", f.api, size(f.size)),
            "ph": "i", "s": "p", "ts": us(f.time_ns), "pid": pid, "tid": 0, "cat": "failure",
            "args": {
                "device": f.device, "kind": f.kind.name(), "size": f.size,
                "result": cuda_result(f.result), "live_bytes_on_device": f.live_bytes_on_device
            }
        });
        out.write_all(b",\n")?;
        serde_json::to_writer(&mut *out, &e)?;
    }
    for p in &trace.spans {
        let e = json!({
            "name": p.name, "ph": "X", "ts": us(p.start_ns), "dur": us(p.end_ns.saturating_sub(p.start_ns)),
            "pid": pid, "tid": p.tid, "cat": if p.mark { "mark" } else { "phase" },
            "args": { "spans": p.count }
        });
        out.write_all(b",\n")?;
        serde_json::to_writer(&mut *out, &e)?;
    }
    let other = json!({ "producer": "gpumemtrace", "pid": pid, "exe": exe });
    write!(out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{other}}}\n")
}
