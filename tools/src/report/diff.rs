//! `gpumemtrace diff A B`: what changed between two runs: peak and live-at-end GPU memory
//! per device (and, under PyTorch's caching allocator, its allocated and reserved peaks),
//! failed allocations, and per call site the bytes allocated, held at the peak and leaked,
//! sorted by the size of the change. Blocks are a group of their own, so tensors are compared
//! by the Python line (or function) that made them.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use super::sites::sites;
use crate::model::{GroupKey, StackUse, Trace};
use crate::symbolize::Symbolizer;
use crate::units::size;

#[derive(Debug, Serialize)]
pub struct Change {
    pub a: u64,
    pub b: u64,
    pub delta: i64,
}

impl Change {
    fn new(a: u64, b: u64) -> Change {
        // Through i128: a corrupt trace's sizes may differ by more than i64 holds.
        let delta = (i128::from(b) - i128::from(a)).clamp(i64::MIN.into(), i64::MAX.into()) as i64;
        Change { a, b, delta }
    }
}

#[derive(Debug, Serialize)]
pub struct DeviceDiff {
    pub device: i32,
    pub peak_bytes: Change,
    pub live_bytes: Change,
    /// When either run had blocks on the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolDiff>,
}

#[derive(Debug, Serialize)]
pub struct PoolDiff {
    /// Peak of live blocks (tensors).
    pub allocated_peak_bytes: Change,
    /// Peak of segments (what the allocator held from the driver).
    pub reserved_peak_bytes: Change,
}

fn pool_diff(a: &Trace, b: &Trace, device: i32) -> Option<PoolDiff> {
    let (x, y) = (a.pools.get(&device), b.pools.get(&device));
    if x.is_none() && y.is_none() {
        return None;
    }
    let (x, y) = (x.cloned().unwrap_or_default(), y.cloned().unwrap_or_default());
    Some(PoolDiff {
        allocated_peak_bytes: Change::new(x.peak_allocated, y.peak_allocated),
        reserved_peak_bytes: Change::new(x.peak_reserved, y.peak_reserved),
    })
}

#[derive(Debug, Serialize)]
pub struct SiteDiff {
    pub device: i32,
    pub kind: &'static str,
    /// `function file:line` (or the module and offset when unsymbolized).
    pub site: String,
    #[serde(flatten)]
    pub change: Change,
    pub count_a: u64,
    pub count_b: u64,
}

#[derive(Debug, Serialize)]
pub struct Diff {
    pub a: String,
    pub b: String,
    pub devices: Vec<DeviceDiff>,
    pub failures: Change,
    /// Sites whose bytes changed, largest change first.
    pub allocated: Vec<SiteDiff>,
    pub peak: Vec<SiteDiff>,
    pub leaks: Vec<SiteDiff>,
}

type Per = BTreeMap<(GroupKey, String), (u64, u64)>;

fn per_site(trace: &Trace, sym: &mut Symbolizer, pick: impl Fn(&GroupKey) -> Vec<StackUse>) -> Per {
    let mut sym = sym.for_trace(&trace.modules);
    let mut out = Per::new();
    for key in trace.groups.keys().chain(trace.allocated.keys()) {
        if out.keys().any(|(k, _)| k == key) {
            continue;
        }
        for s in sites(&pick(key), trace, &mut sym) {
            let name = if s.frames.is_empty() { "(no stack)".to_string() } else { s.site.describe() };
            let e = out.entry((*key, name)).or_default();
            e.0 = e.0.saturating_add(s.bytes);
            e.1 += s.count;
        }
    }
    out
}

fn compare(a: &Per, b: &Per, device: Option<i32>) -> Vec<SiteDiff> {
    let mut keys: Vec<&(GroupKey, String)> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut v: Vec<SiteDiff> = keys
        .into_iter()
        .filter(|(k, _)| device.is_none_or(|d| d == k.device))
        .filter_map(|k| {
            let (ba, ca) = a.get(k).copied().unwrap_or_default();
            let (bb, cb) = b.get(k).copied().unwrap_or_default();
            (ba != bb).then(|| SiteDiff {
                device: k.0.device,
                kind: k.0.kind.name(),
                site: k.1.clone(),
                change: Change::new(ba, bb),
                count_a: ca,
                count_b: cb,
            })
        })
        .collect();
    v.sort_by(|x, y| {
        y.change
            .delta
            .unsigned_abs()
            .cmp(&x.change.delta.unsigned_abs())
            .then(y.change.delta.cmp(&x.change.delta))
            .then(x.site.cmp(&y.site))
    });
    v
}

pub fn diff(pa: &str, a: &Trace, pb: &str, b: &Trace, device: Option<i32>) -> Diff {
    let mut sym = Symbolizer::new();
    let wanted = |d: &i32| device.is_none_or(|w| w == *d);
    let mut devs: Vec<i32> = a.devices.keys().chain(b.devices.keys()).copied().filter(wanted).collect();
    devs.sort();
    devs.dedup();
    let devices = devs
        .into_iter()
        .map(|d| {
            let x = a.devices.get(&d).copied().unwrap_or_default();
            let y = b.devices.get(&d).copied().unwrap_or_default();
            DeviceDiff {
                device: d,
                peak_bytes: Change::new(x.peak_bytes, y.peak_bytes),
                live_bytes: Change::new(x.live_bytes, y.live_bytes),
                pool: pool_diff(a, b, d),
            }
        })
        .collect();
    // Capability probes are not failed allocations (see `units::classify`).
    let nf = |t: &Trace| t.failures.iter().filter(|f| wanted(&f.device) && f.counts()).count() as u64;
    let alloc = |t: &Trace, sym: &mut Symbolizer| {
        per_site(t, sym, |k| t.allocated.get(k).cloned().unwrap_or_default())
    };
    let peak = |t: &Trace, sym: &mut Symbolizer| {
        per_site(t, sym, |k| t.groups.get(k).map(|g| g.peak_stacks.clone()).unwrap_or_default())
    };
    let leaks = |t: &Trace, sym: &mut Symbolizer| {
        per_site(t, sym, |k| t.groups.get(k).map(|g| g.leak_stacks.clone()).unwrap_or_default())
    };
    Diff {
        a: pa.to_string(),
        b: pb.to_string(),
        devices,
        failures: Change::new(nf(a), nf(b)),
        allocated: compare(&alloc(a, &mut sym), &alloc(b, &mut sym), device),
        peak: compare(&peak(a, &mut sym), &peak(b, &mut sym), device),
        leaks: compare(&leaks(a, &mut sym), &leaks(b, &mut sym), device),
    }
}

fn signed(d: i64) -> String {
    match d.cmp(&0) {
        std::cmp::Ordering::Greater => format!("+{}", size(d as u64)),
        std::cmp::Ordering::Less => format!("-{}", size(d.unsigned_abs())),
        std::cmp::Ordering::Equal => "±0 B".into(),
    }
}

pub fn render(d: &mut Diff, top: Option<usize>, json: bool, out: &mut dyn Write) -> io::Result<()> {
    if json {
        if top.is_some() {
            for v in [&mut d.allocated, &mut d.peak, &mut d.leaks] {
                super::sites::cut(v, top);
            }
        }
        serde_json::to_writer_pretty(&mut *out, d)?;
        return writeln!(out);
    }
    writeln!(out, "A: {}\nB: {}", d.a, d.b)?;
    for dev in &d.devices {
        writeln!(
            out,
            "device {}: peak {} -> {} ({}), live at end {} -> {} ({})",
            dev.device,
            size(dev.peak_bytes.a),
            size(dev.peak_bytes.b),
            signed(dev.peak_bytes.delta),
            size(dev.live_bytes.a),
            size(dev.live_bytes.b),
            signed(dev.live_bytes.delta)
        )?;
        if let Some(p) = &dev.pool {
            let (al, re) = (&p.allocated_peak_bytes, &p.reserved_peak_bytes);
            writeln!(
                out,
                "  caching allocator: allocated peak (blocks) {} -> {} ({}), reserved peak (segments) {} -> {} ({})",
                size(al.a),
                size(al.b),
                signed(al.delta),
                size(re.a),
                size(re.b),
                signed(re.delta)
            )?;
        }
    }
    writeln!(out, "failed allocations: {} -> {}", d.failures.a, d.failures.b)?;
    let top = top.unwrap_or(10);
    for (title, v) in [
        ("bytes allocated", &d.allocated),
        ("live at the peak", &d.peak),
        ("leaked (live at end)", &d.leaks),
    ] {
        if v.is_empty() {
            writeln!(out, "{title}, by call site: no change")?;
            continue;
        }
        writeln!(out, "{title}, by call site (largest change first):")?;
        for s in v.iter().take(top) {
            writeln!(
                out,
                "  {:>11}  {:>10} -> {:<10}  {} {:<8} {}",
                signed(s.change.delta),
                size(s.change.a),
                size(s.change.b),
                crate::units::place(s.device),
                s.kind,
                s.site
            )?;
        }
        if v.len() > top {
            writeln!(out, "  ... {} more (--top N)", v.len() - top)?;
        }
    }
    Ok(())
}
