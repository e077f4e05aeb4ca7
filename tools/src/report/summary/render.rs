//! The summary in the terminal.

use std::io::{self, Write};


use crate::report::sites::Site;
use crate::symbolize::Frame;
use crate::units::{count, cuda_result, seconds, size, Failed};

use super::report::*;

/// `1 (CUDA_ERROR_NOT_PERMITTED from cuMemCreate, a capability probe)`,
/// `3 (2x CUDA_ERROR_NOT_PERMITTED from cuMemCreate, capability probes; 1x cudaErrorInvalidValue from cudaMalloc)`.
fn describe_other(v: &[ErrorTally]) -> String {
    let total: u64 = v.iter().map(|t| t.n).sum();
    let parts: Vec<String> = v
        .iter()
        .map(|t| {
            let n = if v.len() > 1 || t.n > 1 { format!("{}x ", t.n) } else { String::new() };
            let probe = match (t.probe, t.n) {
                (false, _) => "",
                (true, 1) => ", a capability probe",
                (true, _) => ", capability probes",
            };
            format!("{n}{} from {}{probe}", t.label, t.api)
        })
        .collect();
    format!("{total} ({})", parts.join("; "))
}

/// The failures of a group heading: `0 failed`, `1 failed (out of memory)`, or
/// `failed: 1 out of memory; other errors: 1 (...)`.
fn describe_failed(out_of_memory: u64, other: &[ErrorTally]) -> String {
    match (out_of_memory, other.is_empty()) {
        (0, true) => "0 failed".to_string(),
        (n, true) => format!("{n} failed (out of memory)"),
        (n, false) => format!("failed: {n} out of memory; other errors: {}", describe_other(other)),
    }
}

fn device_name(device: i32) -> String {
    crate::units::place(device)
}

/// The site line and, with `--frames N`, its callers: N frames starting at the site.
fn site_lines(site: &Frame, frames: &[Frame], site_index: usize, n: usize) -> Vec<String> {
    if frames.is_empty() {
        return vec!["(no stack captured)".to_string()];
    }
    let mut v = vec![site.describe()];
    v.extend(
        frames
            .iter()
            .skip(site_index + 1)
            .take(n.saturating_sub(1))
            .map(|f| format!("from {}", f.describe())),
    );
    v
}

fn render_sites(
    sites: &[Site],
    more: usize,
    opts: &Options,
    out: &mut dyn Write,
) -> io::Result<()> {
    for s in sites {
        let mut lines = site_lines(&s.site, &s.frames, s.site_index, opts.frames);
        match (&s.thread, s.during_backward) {
            (Some(t), true) => lines[0].push_str(&format!("  [{}thread {t}, during backward()]", op_prefix(s))),
            (Some(t), false) => lines[0].push_str(&format!("  [{}thread {t}, no Python stack]", op_prefix(s))),
            _ => {}
        }
        writeln!(out, "  {:>10} {:>5}x  {}", size(s.bytes), s.count, lines[0])?;
        for l in &lines[1..] {
            writeln!(out, "  {:>10} {:>5}   {l}", "", "")?;
        }
    }
    if more > 0 {
        writeln!(
            out,
            "  ... and {} more (see --top)",
            count(more as u64, "site")
        )?;
    }
    Ok(())
}

fn op_prefix(s: &Site) -> String {
    s.op.as_ref().map(|o| format!("{o} on ")).unwrap_or_default()
}

fn render_growth(g: &GroupReport, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    if g.growing_sites.is_empty() {
        return Ok(());
    }
    writeln!(out, "  growing: live bytes that kept rising over the run (the usual shape of a leak):")?;
    for s in &g.growing_sites {
        let lines = site_lines(&s.site.site, &s.site.frames, s.site.site_index, opts.frames);
        writeln!(
            out,
            "  {:>10}         {}  ({} -> {}, rising in {} of {} windows, never falling)",
            format!("+{}", size(s.gained_bytes)),
            lines[0],
            size(s.first_bytes),
            size(s.last_bytes),
            s.rising_windows,
            s.windows
        )?;
        for l in &lines[1..] {
            writeln!(out, "  {:>10} {:>5}   {l}", "", "")?;
        }
    }
    if g.more_growing_sites > 0 {
        writeln!(out, "  ... and {} more (see --top)", count(g.more_growing_sites as u64, "site"))?;
    }
    Ok(())
}

/// The physical memory (cuMemCreate handles) under the mappings `mapped` of its device: the
/// same bytes, so one line, and the handles still held beyond what is mapped.
fn render_backing(ph: &GroupReport, mapped: &GroupReport, live_label: &str, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let live = ph.live_at_python_exit_bytes.unwrap_or(ph.live_bytes);
    let live_n = ph.live_at_python_exit_count.unwrap_or(ph.live_count);
    let mapped_live = mapped.live_at_python_exit_bytes.unwrap_or(mapped.live_bytes);
    let mut line = format!(
        "  backed by physical memory (the same bytes, not more): {}, {} created, {}, peak {}",
        count(ph.allocations, "cuMemCreate handle"),
        size(ph.allocated_bytes),
        count(ph.frees, "release"),
        size(ph.peak_bytes)
    );
    if ph.out_of_memory > 0 || !ph.other_errors.is_empty() {
        line.push_str(&format!("; cuMemCreate {}", describe_failed(ph.out_of_memory, &ph.other_errors)));
    }
    if live > mapped_live {
        // Handles held and not (all) mapped: GPU memory all the same.
        writeln!(
            out,
            "{line}; {} {} in {}, {} more than is mapped:",
            if live_label.starts_with("live at end") { "held at the end" } else { live_label },
            size(live),
            count(live_n, "handle"),
            size(live - mapped_live)
        )?;
        render_sites(&ph.leak_sites, ph.more_leak_sites, opts, out)
    } else {
        writeln!(out, "{line}")
    }
}

/// One failed allocation call: out of memory with what was live on its device then, other
/// errors by name.
fn render_failure(f: &FailureReport, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let lines = site_lines(&f.located.site, &f.located.frames, f.located.site_index, opts.frames);
    let place = device_name(f.device);
    if f.class == Failed::OutOfMemory.name() && f.device < 0 {
        // Host memory: the GPU memory live "on it" means nothing.
        writeln!(out, "  {} {} of {place} -> {} at {}  at  {}", f.api, size(f.size), cuda_result(f.result), seconds(f.time_ns), lines[0])?;
    } else if f.class == Failed::OutOfMemory.name() {
        writeln!(
            out,
            "  {} {} on {place} -> {} at {}, {} live on {place}  at  {}",
            f.api,
            size(f.size),
            cuda_result(f.result),
            seconds(f.time_ns),
            size(f.live_bytes_on_device),
            lines[0]
        )?;
    } else {
        let name = f.error.map_or_else(|| cuda_result(f.result), |n| {
            let what = crate::units::cuda_result_name(f.result).map(|w| format!(": {w}")).unwrap_or_default();
            format!("error {} ({n}{what})", f.result)
        });
        let probe = if f.class == Failed::Probe.name() {
            ", a capability probe (asking whether the device supports a kind of memory handle; not a failed allocation)"
        } else {
            ""
        };
        let on = if f.device < 0 { "of" } else { "on" };
        writeln!(out, "  {} {} {on} {place} -> {name}{probe} at {}  at  {}", f.api, size(f.size), seconds(f.time_ns), lines[0])?;
    }
    for l in &lines[1..] {
        writeln!(out, "      {l}")?;
    }
    if let Some(p) = &f.pool {
        writeln!(
            out,
            "      the caching allocator then: {} allocated in blocks, {} reserved, {} of it cached and free",
            size(p.allocated_bytes),
            size(p.reserved_bytes),
            size(p.cached_bytes)
        )?;
    }
    Ok(())
}

/// Writes one trace's report for people.
pub fn render(r: &TraceReport, opts: &Options, out: &mut dyn Write) -> io::Result<()> {
    let complete = r.status == "complete";
    let mut status = match (r.status, r.stopped_at) {
        ("complete", _) => "complete".to_string(),
        (s, Some(at)) => format!("{} at byte {at}", s.to_uppercase()),
        (s, None) => s.to_uppercase(),
    };
    if complete && !r.finished {
        status.push_str(" (no final stats record: the process may not have exited normally)");
    }
    let mut cmd = match (r.pid, r.exe.is_empty()) {
        (0, true) => "no process record".to_string(),
        (pid, _) => format!("pid {pid} {}", r.exe),
    };
    if !r.args.is_empty() {
        cmd.push_str(&format!(" ({})", r.args.join(" ")));
    }
    writeln!(
        out,
        "{}: {cmd}, {}, {status}",
        r.path,
        count(r.events, "event")
    )?;
    if r.dropped > 0 {
        writeln!(
            out,
            "  warning: the tracer dropped {} events; the numbers below miss them",
            r.dropped
        )?;
    }
    if r.unknown_api_events > 0 {
        writeln!(
            out,
            "  warning: {} events name an API the trace does not describe; they were skipped",
            r.unknown_api_events
        )?;
    }
    for n in &r.notices {
        writeln!(out, "  notice: {n}")?;
    }
    if r.groups.is_empty() && r.failures.is_empty() && r.unknown_frees.is_empty() {
        writeln!(out, "no allocations")?;
    }

    let live_label = if complete {
        "live at end (leaked)"
    } else {
        "live when the trace stops"
    };
    // VMM: a mapping (cuMemMap) is physical memory (cuMemCreate) given addresses, the same
    // bytes. Where both are there, the mapped memory is shown once, backed by its handles.
    let backing = |g: &GroupReport| {
        (g.kind == "vmm-mapped" && g.allocations > 0)
            .then(|| r.groups.iter().find(|p| p.device == g.device && p.kind == "vmm-physical" && p.allocations > 0))
            .flatten()
    };
    let backs: Vec<i32> = r.groups.iter().filter_map(|g| backing(g).map(|p| p.device)).collect();
    for g in &r.groups {
        if g.kind == "vmm-physical" && g.allocations > 0 && backs.contains(&g.device) {
            continue; // under its mappings
        }
        let pool = r.pools.iter().find(|p| p.device == g.device);
        let mut head = format!(
            "{}: {}, {} allocated, {}, {}",
            crate::units::group_label(g.device, g.mem_kind),
            count(g.allocations, "allocation"),
            size(g.allocated_bytes),
            count(g.frees, "free"),
            describe_failed(g.out_of_memory, &g.other_errors)
        );
        if g.double_allocs > 0 {
            head.push_str(&format!(
                ", {} allocations at addresses already live (missed frees)",
                g.double_allocs
            ));
        }
        writeln!(out, "{head}")?;
        if g.allocations == 0 {
            continue;
        }
        render_growth(g, opts, out)?;
        writeln!(
            out,
            "  {}peak {} ({} live) at {}:",
            if g.kind == "block" { "allocated " } else { "" },
            size(g.peak_bytes),
            g.peak_count,
            seconds(g.peak_time_ns)
        )?;
        render_sites(&g.peak_sites, g.more_peak_sites, opts, out)?;
        if let Some(ph) = backing(g) {
            render_backing(ph, g, live_label, opts, out)?;
        }
        if g.kind == "vmm-reserved" {
            // Address space is not memory: never a leak of bytes.
            if g.live_count > 0 {
                writeln!(
                    out,
                    "  still reserved at the end: {} of address space in {} (address space, not memory)",
                    size(g.live_bytes),
                    count(g.live_count, "reservation")
                )?;
            }
            continue;
        }
        if let (Some(p), "device" | "vmm-physical" | "vmm-mapped") = (pool, g.kind) {
            // Under a caching allocator, this memory is its segments (their blocks are listed
            // above) or direct driver allocations (listed with the pool).
            let live = g.live_at_python_exit_bytes.unwrap_or(g.live_bytes);
            writeln!(
                out,
                "  live {}: {} (the caching allocator's segments and direct driver allocations: see the blocks of device {} above)",
                if p.at == "python-exit" { "when the Python program finished" } else { "at the end" },
                size(live),
                g.device
            )?;
            continue;
        }
        if let (Some(bytes), Some(n)) = (g.live_at_python_exit_bytes, g.live_at_python_exit_count) {
            // Python frees its objects at shutdown: the leaks are what was live just before.
            if n == 0 {
                writeln!(out, "  all freed when the Python program finished")?;
            } else {
                writeln!(
                    out,
                    "  {} when the Python program finished (leaked) {} in {}:",
                    if g.kind == "block" { "still allocated" } else { "live" },
                    size(bytes),
                    count(n, if g.kind == "block" { "block" } else { "allocation" })
                )?;
                render_sites(&g.leak_sites, g.more_leak_sites, opts, out)?;
            }
            if bytes > g.live_bytes {
                writeln!(
                    out,
                    "  (the interpreter's shutdown then freed {}; {} live at the end of the trace)",
                    size(bytes - g.live_bytes),
                    size(g.live_bytes)
                )?;
            }
        } else if g.live_count == 0 {
            writeln!(out, "  all freed by the end")?;
        } else {
            writeln!(
                out,
                "  {live_label} {} in {}:",
                size(g.live_bytes),
                count(g.live_count, if g.kind == "block" { "block" } else { "allocation" })
            )?;
            render_sites(&g.leak_sites, g.more_leak_sites, opts, out)?;
        }
        if let (Some(p), "block") = (pool, g.kind) {
            crate::report::pools::render(p, &|s, more, out| render_sites(s, more, opts, out), out)?;
        }
    }
    // The per-device total only adds information when several kinds share the device.
    for d in &r.devices {
        let kinds: Vec<&str> = r
            .groups
            .iter()
            .filter(|g| g.device == d.device && g.occupies_gpu)
            .map(|g| g.kind)
            .collect();
        if kinds.len() > 1 {
            writeln!(
                out,
                "{} total ({}): peak {} at {}, {} live at end",
                device_name(d.device),
                kinds.join(" + "),
                size(d.peak_bytes),
                seconds(d.peak_time_ns),
                size(d.live_bytes)
            )?;
        }
    }

    if !r.failures.is_empty() {
        // Out of memory first: the failures that matter. Other errors (a capability probe such
        // as PyTorch's cuMemCreate of a fabric handle) are said apart, never counted with them.
        let mut head = format!("failed allocations: {} out of memory", r.out_of_memory);
        if !r.other_errors.is_empty() {
            head.push_str(&format!("; other errors: {}", describe_other(&r.other_errors)));
        }
        writeln!(out, "{head}")?;
        let top = if opts.json { usize::MAX } else { opts.top.unwrap_or(DEFAULT_TOP) };
        let oom: Vec<&FailureReport> = r.failures.iter().filter(|f| f.class == Failed::OutOfMemory.name()).collect();
        let other: Vec<&FailureReport> = r.failures.iter().filter(|f| f.class != Failed::OutOfMemory.name()).collect();
        for f in oom.iter().take(top) {
            render_failure(f, opts, out)?;
        }
        if oom.len() > top {
            writeln!(out, "  ... and {} more (see --top)", oom.len() - top)?;
        }
        if let Some(last) = oom.last() {
            if !r.last_failure_live.is_empty() {
                writeln!(
                    out,
                    "  when the last one failed ({} of {}), live on {}:",
                    last.api,
                    size(last.size),
                    device_name(last.device)
                )?;
            }
            for g in &r.last_failure_live {
                if g.kind == "block" {
                    writeln!(out, "    blocks (tensors): {} in {}", size(g.live_bytes), count(g.live_count, "block"))?;
                } else {
                    writeln!(out, "    {} memory: {} in {}", g.kind, size(g.live_bytes), count(g.live_count, "allocation"))?;
                }
                render_sites(&g.sites, g.more_sites, opts, out)?;
            }
        }
        if !other.is_empty() {
            writeln!(out, "other errors of allocation calls (not out of memory):")?;
            for f in other.iter().take(top) {
                render_failure(f, opts, out)?;
            }
            if other.len() > top {
                writeln!(out, "  ... and {} more (see --top)", other.len() - top)?;
            }
        }
        if r.more_failures > 0 {
            writeln!(out, "  ... and {} more", r.more_failures)?;
        }
    }
    if !r.unknown_frees.is_empty() {
        writeln!(out, "frees of unknown pointers, and failed frees:")?;
        for f in &r.unknown_frees {
            let lines = site_lines(
                &f.located.site,
                &f.located.frames,
                f.located.site_index,
                opts.frames,
            );
            let result = if f.result == 0 {
                "not allocated in the trace".to_string()
            } else {
                cuda_result(f.result)
            };
            writeln!(
                out,
                "  {} {:#x} -> {result} at {}  at  {}",
                f.api,
                f.addr,
                seconds(f.time_ns),
                lines[0]
            )?;
            for l in &lines[1..] {
                writeln!(out, "      {l}")?;
            }
        }
    }
    if r.more_unknown_frees > 0 {
        writeln!(out, "  ... and {} more", r.more_unknown_frees)?;
    }
    if let Some(t) = &r.temporary {
        super::temporary::render(t, out)?;
    }
    Ok(())
}
