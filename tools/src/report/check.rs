//! `gpumemtrace check`: a CI gate. Compares a trace with budgets (peak GPU memory, bytes
//! leaked, failed allocations; under a caching allocator, the allocated and reserved peaks)
//! and says which were exceeded, by how much, and where.

use std::io::{self, IsTerminal, Write};

use gpumemtrace_format::MemKind;
use serde::Serialize;

use crate::error::Error;
use crate::model::Trace;
use crate::units::{error_label, place, printable, seconds, size};

#[derive(Clone, Debug, Default)]
pub struct Budgets {
    pub max_peak: Option<u64>,
    pub max_leaked: Option<u64>,
    pub max_failed: Option<u64>,
    /// Peak of live blocks (tensors) per device.
    pub max_allocated: Option<u64>,
    /// Peak of segments (what the caching allocator holds from the driver) per device.
    pub max_reserved: Option<u64>,
    pub device: Option<i32>,
}

impl Budgets {
    pub fn any(&self) -> bool {
        [self.max_peak, self.max_leaked, self.max_failed, self.max_allocated, self.max_reserved].iter().any(Option::is_some)
    }
}

/// `10GiB`, `512 MiB`, `1.5G`, `100MB`, `0`: binary units for `K`, `KiB`, `M`, `MiB`...,
/// decimal for `KB`, `MB`, `GB`, `TB`; a bare number is bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 10GiB, 512MiB, 0)"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use B, KiB, MiB, GiB, TiB, KB, MB, GB)")),
    };
    Ok((v * mult).round() as u64)
}

#[derive(Debug, Serialize)]
pub struct CheckResult {
    /// `max-peak`, `max-leaked`, `max-failed`, `max-allocated`, `max-reserved`.
    pub check: &'static str,
    pub device: Option<i32>,
    pub limit: u64,
    pub actual: u64,
    pub ok: bool,
    pub message: String,
}

#[derive(Debug, Serialize)]
pub struct TraceCheck {
    pub path: String,
    pub ok: bool,
    pub checks: Vec<CheckResult>,
}

/// Kinds that are memory someone pays for (reservations are address space, mappings point at
/// physical memory counted already).
fn is_memory(kind: MemKind) -> bool {
    !matches!(kind, MemKind::VmmReserved | MemKind::VmmMapped)
}

/// The checks of one trace; an error when a budget cannot be judged on it (a block-level
/// budget on a trace without blocks: passing it silently would gate nothing).
pub fn check(path: &str, trace: &Trace, b: &Budgets) -> Result<TraceCheck, Error> {
    let mut checks = Vec::new();
    let wanted = |d: i32| b.device.is_none_or(|w| w == d);
    if let Some(limit) = b.max_peak {
        let devices: Vec<_> = trace.devices.iter().filter(|(d, _)| wanted(**d)).collect();
        if devices.is_empty() {
            checks.push(CheckResult {
                check: "max-peak",
                device: b.device,
                limit,
                actual: 0,
                ok: true,
                message: format!("peak GPU memory 0 B (no GPU allocations) within {}", size(limit)),
            });
        }
        for (&d, t) in devices {
            let ok = t.peak_bytes <= limit;
            let message = if ok {
                format!("device {d}: peak GPU memory {} within {}", size(t.peak_bytes), size(limit))
            } else {
                format!(
                    "device {d}: peak GPU memory {} exceeds --max-peak {} by {} (reached at {})",
                    size(t.peak_bytes),
                    size(limit),
                    size(t.peak_bytes - limit),
                    seconds(t.peak_time_ns)
                )
            };
            checks.push(CheckResult { check: "max-peak", device: Some(d), limit, actual: t.peak_bytes, ok, message });
        }
    }
    if let Some(limit) = b.max_leaked {
        let (mut bytes, mut count) = (0u64, 0);
        let mut kinds = Vec::new();
        for (k, g) in &trace.groups {
            if wanted(k.device) && is_memory(k.kind) && g.live_bytes > 0 {
                bytes = bytes.saturating_add(g.live_bytes);
                count += g.live_count;
                let what = if k.device < 0 {
                    crate::units::group_label(k.device, k.kind)
                } else {
                    format!("{} memory on device {}", k.kind.name(), k.device)
                };
                kinds.push(format!("{what}: {}", size(g.live_bytes)));
            }
        }
        let ok = bytes <= limit;
        let message = if ok {
            format!("leaked {} within {}", size(bytes), size(limit))
        } else {
            format!(
                "leaked {} in {} allocation{} exceeds --max-leaked {} ({})",
                size(bytes),
                count,
                if count == 1 { "" } else { "s" },
                size(limit),
                kinds.join(", ")
            )
        };
        checks.push(CheckResult { check: "max-leaked", device: b.device, limit, actual: bytes, ok, message });
    }
    if let Some(limit) = b.max_failed {
        // Capability probes (cuMemCreate asking whether a handle type is supported) are
        // questions the program asked, not allocations that failed.
        let (failed, probes): (Vec<_>, Vec<_>) = trace.failures.iter().filter(|f| wanted(f.device)).partition(|f| f.counts());
        let n = failed.len() as u64;
        let ok = n <= limit;
        let mut message = if ok {
            format!("{n} failed allocation{} within {limit}", if n == 1 { "" } else { "s" })
        } else {
            let first = failed[0];
            format!(
                "{n} failed allocation{} --max-failed {limit} (first: {} of {} on {} at {}, {})",
                if n == 1 { " exceeds" } else { "s exceed" },
                first.api,
                size(first.size),
                place(first.device),
                seconds(first.time_ns),
                error_label(&first.api, first.result)
            )
        };
        if let Some(p) = probes.first() {
            message.push_str(&format!(
                "; not counted: {} (capability probe{}: {} from {})",
                probes.len(),
                if probes.len() == 1 { "" } else { "s" },
                error_label(&p.api, p.result),
                p.api
            ));
        }
        checks.push(CheckResult { check: "max-failed", device: b.device, limit, actual: n, ok, message });
    }
    for (check, limit) in [("max-allocated", b.max_allocated), ("max-reserved", b.max_reserved)] {
        if let Some(limit) = limit {
            pool_budget(trace, check, limit, b.device, &mut checks)?;
        }
    }
    Ok(TraceCheck { path: path.to_string(), ok: checks.iter().all(|c| c.ok), checks })
}

/// `--max-allocated` / `--max-reserved`: the pool's peaks of each device with blocks.
fn pool_budget(trace: &Trace, check: &'static str, limit: u64, device: Option<i32>, out: &mut Vec<CheckResult>) -> Result<(), String> {
    let pools: Vec<_> = trace.pools.iter().filter(|(d, _)| device.is_none_or(|w| w == **d)).collect();
    if pools.is_empty() {
        let place = device.map_or("in this trace".to_string(), |d| if d < 0 { "in host memory".to_string() } else { format!("on device {d}") });
        return Err(format!(
            "--{check} needs blocks of PyTorch's caching allocator, and there are none {place} \
             (the program did not allocate through it, or its blocks were not traced); --max-peak gates driver allocations"
        ));
    }
    for (&d, p) in pools {
        let (what, actual, at) = match check {
            "max-allocated" => ("allocated peak (blocks)", p.peak_allocated, p.peak_allocated_time_ns),
            _ => ("reserved peak (segments)", p.peak_reserved, p.peak_reserved_time_ns),
        };
        let ok = actual <= limit;
        let message = if ok {
            format!("device {d}: {what} {} within {}", size(actual), size(limit))
        } else {
            format!(
                "device {d}: {what} {} exceeds --{check} {} by {} (reached at {})",
                size(actual),
                size(limit),
                size(actual - limit),
                seconds(at)
            )
        };
        out.push(CheckResult { check, device: Some(d), limit, actual, ok, message });
    }
    Ok(())
}

/// Prints the results; colour only when `out` is the terminal and NO_COLOR is unset.
pub fn render(results: &[TraceCheck], json: bool, out: &mut dyn Write) -> io::Result<()> {
    if json {
        let ok = results.iter().all(|r| r.ok);
        serde_json::to_writer_pretty(&mut *out, &serde_json::json!({ "ok": ok, "traces": results }))?;
        return writeln!(out);
    }
    let color = io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let paint = |ok: bool| match (color, ok) {
        (true, true) => "\x1b[32mok\x1b[0m  ",
        (true, false) => "\x1b[1;31mFAIL\x1b[0m",
        (false, true) => "ok  ",
        (false, false) => "FAIL",
    };
    // Not through `units::Printable`, which would escape the colours: names one by one.
    for r in results {
        writeln!(out, "{}:", printable(&r.path))?;
        for c in &r.checks {
            writeln!(out, "  {} {}", paint(c.ok), printable(&c.message))?;
        }
    }
    let failed = results.iter().flat_map(|r| &r.checks).filter(|c| !c.ok).count();
    if failed > 0 {
        writeln!(out, "gpumemtrace check: {failed} budget{} exceeded", if failed == 1 { "" } else { "s" })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;

    #[test]
    fn max_failed_does_not_count_capability_probes() {
        let mut b = TraceBuilder::new();
        b.call(MEM_CREATE, 1, 0, 0, 2 << 20, 0, 800);
        let b0 = Budgets { max_failed: Some(0), ..Budgets::default() };
        let r = check("t", &b.load(), &b0).unwrap();
        assert!(r.ok);
        assert_eq!(
            r.checks[0].message,
            "0 failed allocations within 0; not counted: 1 (capability probe: CUDA_ERROR_NOT_PERMITTED from cuMemCreate)"
        );
        b.call(MALLOC, 2, 0, 0, 1 << 30, 0, 2);
        let r = check("t", &b.load(), &b0).unwrap();
        assert!(!r.ok);
        assert!(r.checks[0].message.starts_with("1 failed allocation exceeds --max-failed 0 (first: cudaMalloc of 1.0 GiB on device 0 at 0.000 s, cudaErrorMemoryAllocation)"), "{}", r.checks[0].message);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("1XB").is_err());
    }
}
