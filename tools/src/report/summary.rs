//! The `summary` report: per device and memory kind, what was allocated, the peak and who
//! held it, what was still live at the end; then failed allocations and bad frees.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use gpumemtrace_format::MemKind;
use serde::Serialize;

use super::pools::{PoolAtFailure, PoolReport};
use super::sites::{cut, growth_sites, sites_by, GrowthSite, Site};
use crate::read::input::{self, Input};
use crate::model::{Outcome, Trace};
use crate::symbolize::{locate, Frame, Located, Symbolizer};
use crate::units::{count, cuda_error_name, cuda_result, error_label, seconds, size, Failed};

#[derive(Clone, Debug)]
pub struct Options {
    pub json: bool,
    /// Items per list; `None`: 10 in the terminal, all in JSON.
    pub top: Option<usize>,
    /// Frames shown per site in the terminal, starting at the site.
    pub frames: usize,
    pub device: Option<i32>,
    /// Only allocations made in this phase (see docs/format.md, "Phases").
    pub phase: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            json: false,
            top: None,
            frames: 1,
            device: None,
            phase: None,
        }
    }
}

const DEFAULT_TOP: usize = 10;

// The JSON schema (a contract with the integration tests). Fields marked `skip` are only
// for the terminal.

#[derive(Serialize)]
struct Json<'a> {
    traces: &'a [TraceReport],
    /// With several traces: the processes together (see `merged`).
    #[serde(skip_serializing_if = "Option::is_none")]
    merged: Option<super::merged::Merged>,
}

#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub path: String,
    pub pid: u32,
    pub exe: String,
    pub args: Vec<String>,
    pub status: &'static str,
    pub stopped_at: Option<u64>,
    pub error: Option<String>,
    pub events: u64,
    pub dropped: u64,
    pub notices: Vec<String>,
    pub groups: Vec<GroupReport>,
    pub devices: Vec<DeviceReport>,
    pub failures: Vec<FailureReport>,
    /// Post-mortem of the last failed allocation: live memory on its device at that moment.
    pub last_failure_live: Vec<LiveGroupReport>,
    pub unknown_frees: Vec<FreeReport>,
    /// Per device with blocks (PyTorch's caching allocator): segments and blocks.
    pub pools: Vec<PoolReport>,
    /// A final Stats record was read: the tracer shut down cleanly.
    #[serde(skip)]
    finished: bool,
    #[serde(skip)]
    unknown_api_events: u64,
    #[serde(skip)]
    more_failures: usize,
    /// Out-of-memory failures, and the other errors by name (see `units::classify`).
    #[serde(skip)]
    out_of_memory: u64,
    #[serde(skip)]
    other_errors: Vec<ErrorTally>,
    /// Includes bad frees the model only counted.
    #[serde(skip)]
    more_unknown_frees: u64,
}

#[derive(Debug, Serialize)]
pub struct GroupReport {
    pub device: i32,
    pub kind: &'static str,
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub frees: u64,
    pub failed: u64,
    pub peak_bytes: u64,
    pub peak_time_ns: u64,
    pub peak_sites: Vec<Site>,
    pub live_bytes: u64,
    pub live_count: u64,
    /// For Python programs: live when the program finished, before the interpreter's shutdown
    /// freed its objects; `leak_sites` then describe this live set.
    pub live_at_python_exit_bytes: Option<u64>,
    pub live_at_python_exit_count: Option<u64>,
    pub leak_sites: Vec<Site>,
    /// Sites whose live bytes kept rising over the run, most gained first.
    pub growing_sites: Vec<GrowthSite>,
    #[serde(skip)]
    more_growing_sites: usize,
    #[serde(skip)]
    mem_kind: MemKind,
    #[serde(skip)]
    double_allocs: u64,
    #[serde(skip)]
    out_of_memory: u64,
    #[serde(skip)]
    other_errors: Vec<ErrorTally>,
    /// Live allocations at the peak.
    #[serde(skip)]
    peak_count: u64,
    #[serde(skip)]
    more_peak_sites: usize,
    #[serde(skip)]
    more_leak_sites: usize,
    #[serde(skip)]
    occupies_gpu: bool,
}

#[derive(Debug, Serialize)]
pub struct DeviceReport {
    pub device: i32,
    pub peak_bytes: u64,
    pub peak_time_ns: u64,
    pub live_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct FailureReport {
    pub api: String,
    pub device: i32,
    pub kind: &'static str,
    pub size: u64,
    pub result: u32,
    /// The result's name as the API calls it (`CUDA_ERROR_OUT_OF_MEMORY`, `cudaErrorMemoryAllocation`).
    pub error: Option<&'static str>,
    /// `out-of-memory`, `capability-probe` (cuMemCreate asking whether a handle type is
    /// supported: not a failed allocation) or `other`.
    pub class: &'static str,
    pub time_ns: u64,
    pub live_bytes_on_device: u64,
    /// The caching allocator's state on the device then (with blocks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolAtFailure>,
    #[serde(flatten)]
    pub located: Located,
}

/// Failed calls of one API with one result that were not out of memory.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ErrorTally {
    pub probe: bool,
    pub label: String,
    pub api: String,
    pub n: u64,
}

/// Out-of-memory failures, and the others by API and result.
fn tally<'a>(failures: impl Iterator<Item = &'a crate::model::Failure>) -> (u64, Vec<ErrorTally>) {
    let mut oom = 0;
    let mut other: std::collections::BTreeMap<(bool, String, String), u64> = Default::default();
    for f in failures {
        match f.class() {
            Failed::OutOfMemory => oom += 1,
            c => *other.entry((c == Failed::Probe, error_label(&f.api, f.result), f.api.clone())).or_default() += 1,
        }
    }
    let other = other.into_iter().map(|((probe, label, api), n)| ErrorTally { probe, label, api, n }).collect();
    (oom, other)
}

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

#[derive(Debug, Serialize)]
pub struct LiveGroupReport {
    pub device: i32,
    pub kind: &'static str,
    pub live_bytes: u64,
    pub live_count: u64,
    pub sites: Vec<Site>,
    #[serde(skip)]
    more_sites: usize,
}

#[derive(Debug, Serialize)]
pub struct FreeReport {
    pub api: String,
    pub addr: u64,
    pub result: u32,
    pub time_ns: u64,
    #[serde(flatten)]
    pub located: Located,
}

/// Summarizes `paths` (trace files) to `out`. Unreadable files are reported on stderr and
/// skipped; returns false when there was one.
pub fn run(paths: &[PathBuf], opts: &Options, out: &mut dyn Write) -> io::Result<bool> {
    let mut sym = Symbolizer::new();
    let mut reports = Vec::new();
    let mut all_read = true;
    let filter = crate::model::Filter { device: None, phase: opts.phase.clone() };
    // Each input is opened once: a pipe (`-`, /dev/stdin) is read into memory then, and both
    // the per-trace replay and the merged one read it from there.
    let mut inputs = Vec::new();
    for path in paths {
        match Input::open(path) {
            Ok(input) => inputs.push(input),
            Err(e) => {
                eprintln!("gpumemtrace: {e}");
                all_read = false;
            }
        }
    }
    for input in &inputs {
        match crate::model::load_input(input, &filter, &mut ()) {
            Ok(trace) => {
                warn_outcome(input.path(), &trace.outcome);
                reports.push(build(input.path(), &trace, &mut sym, opts));
            }
            Err(e) => {
                eprintln!("gpumemtrace: {e}");
                all_read = false;
            }
        }
    }
    let merged = (paths.len() > 1).then(|| super::merged::merge(&inputs));
    if opts.json {
        serde_json::to_writer_pretty(&mut *out, &Json { traces: &reports, merged })?;
        writeln!(out)?;
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            render(r, opts, out)?;
        }
        if let Some(m) = &merged {
            writeln!(out)?;
            super::merged::render(m, out)?;
        }
    }
    Ok(all_read)
}

fn warn_outcome(path: &Path, outcome: &Outcome) {
    let p = input::display(path);
    match outcome {
        Outcome::Complete => {}
        Outcome::Truncated { offset } => eprintln!(
            "warning: {p}: the trace is truncated at byte {offset} (the process may have been killed); \
             the summary covers the events before it"
        ),
        Outcome::Corrupt { offset, message } => eprintln!(
            "warning: {p}: the trace is corrupt at byte {offset} ({message}); the summary covers the events before it"
        ),
    }
}

/// Builds the report of one trace: symbolizes, aggregates by site, filters, cuts.
pub fn build(path: &Path, trace: &Trace, sym: &mut Symbolizer, opts: &Options) -> TraceReport {
    // The terminal is for reading, JSON for tools: only the terminal cuts lists by default.
    let top = if opts.json {
        opts.top
    } else {
        Some(opts.top.unwrap_or(DEFAULT_TOP))
    };
    let wanted = |device: i32| opts.device.is_none_or(|d| d == device);
    let mut sym = sym.for_trace(&trace.modules);

    let mut groups = Vec::new();
    for (key, g) in trace.groups.iter().filter(|(k, _)| wanted(k.device)) {
        // Sites are told apart by the frames shown of them (--frames).
        let n = opts.frames;
        let mut peak_sites = sites_by(&g.peak_stacks, trace, &mut sym, n);
        let mut leak_sites = sites_by(&g.leak_stacks, trace, &mut sym, n);
        let mut growing = trace.growth.get(key).map(|t| growth_sites(t, trace, &mut sym, n)).unwrap_or_default();
        let (out_of_memory, other_errors) = tally(trace.failures.iter().filter(|f| f.device == key.device && f.kind == key.kind));
        groups.push(GroupReport {
            mem_kind: key.kind,
            out_of_memory,
            other_errors,
            device: key.device,
            kind: key.kind.name(),
            allocations: g.allocations,
            allocated_bytes: g.allocated_bytes,
            frees: g.frees,
            failed: g.failed,
            peak_bytes: g.peak_bytes,
            peak_time_ns: g.peak_time_ns,
            peak_count: g.peak_stacks.iter().map(|u| u.count).sum(),
            more_peak_sites: cut(&mut peak_sites, top),
            peak_sites,
            live_bytes: g.live_bytes,
            live_count: g.live_count,
            live_at_python_exit_bytes: g.live_at_python_exit.map(|l| l.0),
            live_at_python_exit_count: g.live_at_python_exit.map(|l| l.1),
            more_leak_sites: cut(&mut leak_sites, top),
            leak_sites,
            more_growing_sites: cut(&mut growing, top),
            growing_sites: growing,
            double_allocs: g.double_allocs,
            occupies_gpu: key.kind.occupies_gpu(),
        });
    }
    // Per device, its blocks (tensors) first: they are what the program asked for.
    groups.sort_by_key(|g| (g.device, g.kind != MemKind::Block.name()));
    let pools = super::pools::build(trace, &mut sym, wanted, top, opts.frames);
    let devices = trace
        .devices
        .iter()
        .filter(|(d, _)| wanted(**d))
        .map(|(&device, t)| DeviceReport {
            device,
            peak_bytes: t.peak_bytes,
            peak_time_ns: t.peak_time_ns,
            live_bytes: t.live_bytes,
        })
        .collect();

    let mut failures: Vec<FailureReport> = trace
        .failures
        .iter()
        .filter(|f| wanted(f.device))
        .map(|f| FailureReport {
            api: f.api.clone(),
            device: f.device,
            kind: f.kind.name(),
            size: f.size,
            result: f.result,
            error: cuda_error_name(&f.api, f.result),
            class: f.class().name(),
            time_ns: f.time_ns,
            live_bytes_on_device: f.live_bytes_on_device,
            pool: f.pool.as_ref().map(PoolAtFailure::of),
            located: locate(trace, &mut sym, f.stack),
        })
        .collect();
    let (out_of_memory, other_errors) = tally(trace.failures.iter().filter(|f| wanted(f.device)));
    // The terminal lists out-of-memory failures and other errors apart, each cut to --top.
    let more_failures = if opts.json { cut(&mut failures, top) } else { 0 };
    let last_failure_live = trace
        .last_failure_live
        .iter()
        .filter(|(k, _)| wanted(k.device))
        .map(|(key, uses)| {
            let mut sites = sites_by(uses, trace, &mut sym, opts.frames);
            LiveGroupReport {
                device: key.device,
                kind: key.kind.name(),
                live_bytes: uses.iter().map(|u| u.bytes).sum(),
                live_count: uses.iter().map(|u| u.count).sum(),
                more_sites: cut(&mut sites, top),
                sites,
            }
        })
        .collect();
    let mut unknown_frees: Vec<FreeReport> = trace
        .bad_frees
        .iter()
        .filter(|f| wanted(f.device))
        .map(|f| FreeReport {
            api: f.api.clone(),
            addr: f.addr,
            result: f.result,
            time_ns: f.time_ns,
            located: locate(trace, &mut sym, f.stack),
        })
        .collect();
    let more_unknown_frees = cut(&mut unknown_frees, top) as u64 + trace.bad_frees_omitted;

    let process = trace.process.clone().unwrap_or_default();
    let (status, stopped_at, error) = match &trace.outcome {
        Outcome::Complete => ("complete", None, None),
        Outcome::Truncated { offset } => (
            "truncated",
            Some(*offset),
            Some(format!("the trace ends inside the record at byte {offset}")),
        ),
        Outcome::Corrupt { offset, message } => (
            "corrupt",
            Some(*offset),
            Some(format!("the record at byte {offset} is corrupt: {message}")),
        ),
    };
    TraceReport {
        path: input::display(path),
        pid: process.pid,
        exe: process.exe,
        args: process.args,
        status,
        stopped_at,
        error,
        events: trace.events,
        dropped: trace.stats.map_or(0, |s| s.dropped),
        notices: trace.notices.clone(),
        groups,
        devices,
        failures,
        last_failure_live,
        unknown_frees,
        pools,
        finished: trace.stats.is_some_and(|s| s.final_),
        unknown_api_events: trace.unknown_api_events,
        more_failures,
        out_of_memory,
        other_errors,
        more_unknown_frees,
    }
}

// ---------------------------------------------------------------------------------------------
// Terminal output

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
            super::pools::render(p, &|s, more, out| render_sites(s, more, opts, out), out)?;
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;
    use gpumemtrace_format::{Module, Record, Stats};
    use serde_json::{json, Value};

    fn report(b: &TraceBuilder, opts: &Options) -> TraceReport {
        let trace = b.load();
        build(Path::new("t.trace"), &trace, &mut Symbolizer::new(), opts)
    }

    fn json_of(b: &TraceBuilder, opts: &Options) -> Value {
        let r = report(
            b,
            &Options {
                json: true,
                ..opts.clone()
            },
        );
        serde_json::to_value(Json { traces: &[r], merged: None }).unwrap()["traces"][0].clone()
    }

    fn frame(address: u64) -> Value {
        json!({"function": null, "file": null, "line": null, "module": null, "address": address})
    }

    fn sample() -> TraceBuilder {
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100, 0x200])
            .stack(2, &[0x300])
            .ok(MALLOC, 1_000, 0x1000, 100, 1)
            .ok(MALLOC, 2_000, 0x2000, 300, 2)
            .ok(MALLOC, 3_000, 0x3000, 100, 1)
            .ok(FREE, 4_000, 0x2000, 0, 0)
            .call(MALLOC, 5_000, 0, 0, 1 << 30, 2, 2)
            .ok(FREE, 6_000, 0xdead, 0, 1)
            .rec(Record::Notice("hello".into()))
            .rec(Record::Stats(Stats {
                events: 7,
                dropped: 4,
                final_: true,
            }));
        b
    }

    #[test]
    fn json_follows_the_schema() {
        let v = json_of(&sample(), &Options::default());
        let site1 = json!({"bytes": 200, "count": 2, "function": null, "file": null, "line": null, "module": null,
                           "address": 0x100, "frames": [frame(0x100), frame(0x200)]});
        let expected = json!({
            "path": "t.trace", "pid": 1234, "exe": "/usr/bin/demo", "args": ["demo", "--fast"],
            "status": "complete", "stopped_at": null, "error": null,
            "events": 6, "dropped": 4, "notices": ["hello"],
            "groups": [{
                "device": 0, "kind": "device", "allocations": 3, "allocated_bytes": 500, "frees": 1, "failed": 1,
                "peak_bytes": 500, "peak_time_ns": 3_000,
                "peak_sites": [
                    {"bytes": 300, "count": 1, "function": null, "file": null, "line": null, "module": null,
                     "address": 0x300, "frames": [frame(0x300)]},
                    site1,
                ],
                "live_bytes": 200, "live_count": 2, "live_at_python_exit_bytes": null,
                "live_at_python_exit_count": null, "leak_sites": [site1], "growing_sites": [],
            }],
            "devices": [{"device": 0, "peak_bytes": 500, "peak_time_ns": 3_000, "live_bytes": 200}],
            "failures": [{"api": "cudaMalloc", "device": 0, "kind": "device", "size": 1u64 << 30, "result": 2,
                          "error": "cudaErrorMemoryAllocation", "class": "out-of-memory",
                          "time_ns": 5_000, "live_bytes_on_device": 200, "site": frame(0x300), "frames": [frame(0x300)]}],
            "last_failure_live": [{"device": 0, "kind": "device", "live_bytes": 200, "live_count": 2,
                                   "sites": [{"bytes": 200, "count": 2, "function": null, "file": null, "line": null,
                                              "module": null, "address": 0x100, "frames": [frame(0x100), frame(0x200)]}]}],
            "unknown_frees": [{"api": "cudaFree", "addr": 0xdead, "result": 0, "time_ns": 6_000,
                               "site": frame(0x100), "frames": [frame(0x100), frame(0x200)]}],
            "pools": [],
        });
        assert_eq!(v, expected);
    }

    #[test]
    fn json_status_of_a_truncated_trace() {
        let mut b = sample();
        let len = b.bytes.len();
        b.bytes.truncate(len - 1);
        let v = json_of(&b, &Options::default());
        assert_eq!(v["status"], "truncated");
        assert!(v["stopped_at"].as_u64().unwrap() > 12);
        assert!(v["error"].as_str().unwrap().contains("byte"));
        assert_eq!(v["dropped"], 0); // the Stats record was the one cut
    }

    #[test]
    fn top_and_device_filter() {
        let mut b = TraceBuilder::new();
        for i in 0..12u64 {
            b.stack(i as u32 + 1, &[0x1000 + i]).ok(
                MALLOC,
                i,
                0x10_000 + i,
                1000 - i,
                i as u32 + 1,
            );
        }
        b.call(MALLOC, 20, 1, 0x9000, 5, 0, 0);
        // JSON lists are complete unless --top is given.
        let v = json_of(&b, &Options::default());
        assert_eq!(v["groups"][0]["leak_sites"].as_array().unwrap().len(), 12);
        assert_eq!(v["groups"].as_array().unwrap().len(), 2);
        let v = json_of(
            &b,
            &Options {
                top: Some(3),
                device: Some(1),
                ..Options::default()
            },
        );
        assert_eq!(v["groups"].as_array().unwrap().len(), 1);
        assert_eq!(v["groups"][0]["device"], 1);
        assert_eq!(v["devices"].as_array().unwrap().len(), 1);
        let v = json_of(
            &b,
            &Options {
                top: Some(3),
                ..Options::default()
            },
        );
        let bytes: Vec<u64> = v["groups"][0]["leak_sites"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(bytes, [1000, 999, 998]);
        // The terminal shows 10 by default.
        let r = report(&b, &Options::default());
        assert_eq!(
            (r.groups[0].leak_sites.len(), r.groups[0].more_leak_sites),
            (10, 2)
        );
    }

    #[test]
    fn sites_merge_by_symbol_and_skip_cuda_frames() {
        use crate::symbolize::native::tests::{module_containing, probe_target};
        let f = probe_target as *const () as usize as u64;
        let mut exe = module_containing(f);
        exe.id = 2;
        let mut b = TraceBuilder::new();
        b.rec(Record::Module(Module {
            id: 1,
            bias: 0x5000_0000,
            start: 0x5000_0000,
            end: 0x5100_0000,
            path: "/nonexistent/libcudart.so.12".into(),
            build_id: vec![],
        }))
        .rec(Record::Module(exe))
        // Different stacks, different CUDA frames, one call site.
        .stack(1, &[0x5000_1000, f + 1, 0x8000_0000])
        .stack(2, &[0x5000_2000, f + 1, 0x9000_0000])
        // Unsymbolized sites stay apart by stack, even at the same address.
        .stack(3, &[0x5000_3000, 0x7000_0000])
        .stack(4, &[0x7000_0000])
        .ok(MALLOC, 1, 0x1, 10, 1)
        .ok(MALLOC, 2, 0x2, 20, 2)
        .ok(MALLOC, 3, 0x3, 7, 3)
        .ok(MALLOC, 4, 0x4, 5, 4);
        let r = report(&b, &Options::default());
        let leaks = &r.groups[0].leak_sites;
        let got: Vec<_> = leaks
            .iter()
            .map(|s| (s.bytes, s.count, s.site.address, s.site_index))
            .collect();
        assert_eq!(
            got,
            [
                (30, 2, f + 1, 1),
                (7, 1, 0x7000_0000, 1),
                (5, 1, 0x7000_0000, 0)
            ]
        );
        assert!(leaks[0]
            .site
            .function
            .as_deref()
            .unwrap()
            .ends_with("probe_target"));
        // The sample stack is the one that contributed most.
        assert_eq!(leaks[0].frames[0].describe(), "libcudart.so.12+0x2000");
        assert_eq!(leaks[0].frames.last().unwrap().address, 0x9000_0000);
    }

    /// One allocation function (`alloc_buffer`), two callers: 3 MiB from `caller_a`, 10 MiB from
    /// `caller_b` (Python frames: symbolized without debug information).
    pub(crate) fn two_callers() -> TraceBuilder {
        use gpumemtrace_format::{Event, PyCode, PyFrame, PyStack};
        let mut b = TraceBuilder::new();
        for (id, name, file, line) in
            [(1, "alloc_buffer", "/src/model.py", 10), (2, "caller_a", "/src/train.py", 5), (3, "caller_b", "/src/train.py", 9)]
        {
            b.rec(Record::PyCode(PyCode {
                id,
                name: name.into(),
                qualname: name.into(),
                filename: file.into(),
                firstlineno: line,
                ..PyCode::default()
            }));
        }
        let frame = |code| PyFrame { code, instr_offset: 0, flags: 0 };
        b.rec(Record::PyStack(PyStack { id: 1, frames: vec![frame(1), frame(2)] }))
            .rec(Record::PyStack(PyStack { id: 2, frames: vec![frame(1), frame(3)] }));
        for (t, addr, size, pystack) in [(1, 0x1000, 3 << 20, 1), (2, 0x2000, 10 << 20, 2)] {
            b.rec(Record::Event(Event {
                api: MALLOC,
                time_ns: t,
                addr,
                size,
                pystack,
                tid: 1,
                ..Event::default()
            }));
        }
        b
    }

    #[test]
    fn sites_are_told_apart_by_the_frames_shown() {
        let b = two_callers();
        let sites = |frames: usize, json: bool| {
            let r = report(&b, &Options { frames, json, ..Options::default() });
            r.groups[0]
                .peak_sites
                .iter()
                .map(|s| {
                    let shown: Vec<String> =
                        s.frames[s.site_index..].iter().take(frames).map(|f| f.describe()).collect();
                    (s.bytes, shown.join(" <- "))
                })
                .collect::<Vec<_>>()
        };
        // One frame shown: one site, its two callers together.
        assert_eq!(sites(1, false), [(13 << 20, "alloc_buffer model.py:10".to_string())]);
        // Two frames shown: each caller with its own bytes, never 13 MiB "from" caller_b.
        let want = [
            (10 << 20, "alloc_buffer model.py:10 <- caller_b train.py:9".to_string()),
            (3 << 20, "alloc_buffer model.py:10 <- caller_a train.py:5".to_string()),
        ];
        assert_eq!(sites(2, false), want);
        assert_eq!(sites(3, true), want, "JSON groups by the same frames");
        // The terminal says the same.
        let opts = Options { frames: 2, ..Options::default() };
        let mut out = Vec::new();
        render(&report(&b, &opts), &opts, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("    10.0 MiB     1x  alloc_buffer model.py:10\n                     from caller_b train.py:9\n")
                && text.contains("     3.0 MiB     1x  alloc_buffer model.py:10\n                     from caller_a train.py:5\n"),
            "{text}"
        );
    }

    #[test]
    fn a_capability_probe_is_not_a_failed_allocation() {
        // PyTorch asks cuMemCreate for a fabric handle (not permitted here), later runs out of memory.
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100])
            .stack(2, &[0x200])
            .ok(MALLOC, 1, 0x1000, 100, 1)
            .call(MEM_CREATE, 2, 0, 0, 2 << 20, 2, 800)
            .call(MALLOC, 3, 0, 0, 1 << 30, 1, 2);
        let r = report(&b, &Options::default());
        let mut out = Vec::new();
        render(&r, &Options::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected = "\
failed allocations: 1 out of memory; other errors: 1 (CUDA_ERROR_NOT_PERMITTED from cuMemCreate, a capability probe)
  cudaMalloc 1.0 GiB on device 0 -> error 2 (out of memory) at 0.000 s, 100 B live on device 0  at  0x100
  when the last one failed (cudaMalloc of 1.0 GiB), live on device 0:
    device memory: 100 B in 1 allocation
       100 B     1x  0x100
other errors of allocation calls (not out of memory):
  cuMemCreate 2.0 MiB on device 0 -> error 800 (CUDA_ERROR_NOT_PERMITTED: not permitted), a capability probe (asking whether the device supports a kind of memory handle; not a failed allocation) at 0.000 s  at  0x200
";
        assert!(text.ends_with(expected), "{text}");
        assert!(text.contains("device 0, device memory: 1 allocation, 100 B allocated, 0 frees, 1 failed (out of memory)\n"), "{text}");
        assert!(
            text.contains("device 0, vmm-physical memory: 0 allocations, 0 B allocated, 0 frees, failed: 0 out of memory; other errors: 1 (CUDA_ERROR_NOT_PERMITTED from cuMemCreate, a capability probe)\n"),
            "{text}"
        );
        // JSON says which is which, in trace order.
        let v = json_of(&b, &Options::default());
        let got: Vec<(&str, &str)> =
            v["failures"].as_array().unwrap().iter().map(|f| (f["error"].as_str().unwrap(), f["class"].as_str().unwrap())).collect();
        assert_eq!(got, [("CUDA_ERROR_NOT_PERMITTED", "capability-probe"), ("cudaErrorMemoryAllocation", "out-of-memory")]);
        // Several other errors are counted by name.
        let mut b = TraceBuilder::new();
        b.call(MEM_CREATE, 1, 0, 0, 2 << 20, 2, 800).call(MEM_CREATE, 2, 0, 0, 2 << 20, 2, 800).call(MALLOC, 3, 0, 0, 0, 1, 1);
        let r = report(&b, &Options::default());
        let mut out = Vec::new();
        render(&r, &Options::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("failed allocations: 0 out of memory; other errors: 3 (1x cudaErrorInvalidValue from cudaMalloc; 2x CUDA_ERROR_NOT_PERMITTED from cuMemCreate, capability probes)\n"),
            "{text}"
        );
        assert!(!text.contains("when the last one failed"), "{text}");
    }

    #[test]
    fn host_memory_is_called_host_memory_under_its_own_heading() {
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100])
            .call(MALLOC_HOST, 1, -1, 0x7000, 4, 1, 0)
            .call(ADDRESS_RESERVE, 2, -1, 0x4000_0000, 1 << 30, 1, 0)
            .ok(MALLOC, 3, 0x1000, 100, 1)
            .call(MALLOC_HOST, 4, -1, 0, 1 << 40, 1, 2);
        for opts in [Options::default(), Options { device: Some(-1), ..Options::default() }] {
            let r = report(&b, &opts);
            let mut out = Vec::new();
            render(&r, &opts, &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(
                text.contains("\nhost memory (pinned): 1 allocation, 4 B allocated, 0 frees, 1 failed (out of memory)\n  peak 4 B (1 live) at 0.000 s:\n         4 B     1x  0x100\n"),
                "{text}"
            );
            assert!(text.contains("\nvmm-reserved address space: 1 allocation, 1.0 GiB allocated"), "{text}");
            assert!(text.contains("  cudaMallocHost 1.0 TiB of host memory -> error 2 (out of memory) at 0.000 s  at  0x100\n"), "{text}");
            // Every peak line has a heading right above it.
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate().filter(|(_, l)| l.trim_start().starts_with("peak ")) {
                assert!(i > 0 && !lines[i - 1].starts_with(' '), "no heading above {l:?}:\n{text}");
            }
            for word in ["no device", "device -1", "host,"] {
                assert!(!text.contains(word), "{word:?} in:\n{text}");
            }
        }
    }

    #[test]
    fn vmm_mappings_are_shown_once_backed_by_their_handles() {
        use gpumemtrace_format::Event;
        let map = |t, va, size, handle| {
            Record::Event(Event { api: MEM_MAP, time_ns: t, addr: va, size, extra: handle, stack: 2, tid: 1, ..Event::default() })
        };
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100])
            .stack(2, &[0x200])
            .ok(MEM_CREATE, 1, 0x10, 2 << 20, 1)
            .ok(MEM_CREATE, 2, 0x20, 2 << 20, 1) // created, never mapped: still GPU memory
            .call(ADDRESS_RESERVE, 3, -1, 0x4000_0000, 8 << 20, 2, 0)
            .rec(map(4, 0x4000_0000, 2 << 20, 0x10));
        let r = report(&b, &Options::default());
        let mut out = Vec::new();
        render(&r, &Options::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected = "\
device 0, vmm-mapped memory: 1 allocation, 2.0 MiB allocated, 0 frees, 0 failed
  peak 2.0 MiB (1 live) at 0.000 s:
     2.0 MiB     1x  0x200
  backed by physical memory (the same bytes, not more): 2 cuMemCreate handles, 4.0 MiB created, 0 releases, peak 4.0 MiB; held at the end 4.0 MiB in 2 handles, 2.0 MiB more than is mapped:
     4.0 MiB     2x  0x100
  live at end (leaked) 2.0 MiB in 1 allocation:
     2.0 MiB     1x  0x200
";
        assert!(text.contains(expected), "{text}");
        assert!(!text.contains("vmm-physical memory:"), "physical memory is not a second group of its own: {text}");
        // JSON keeps both groups, for tools.
        let v = json_of(&b, &Options::default());
        let kinds: Vec<&str> = v["groups"].as_array().unwrap().iter().map(|g| g["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["vmm-reserved", "vmm-physical", "vmm-mapped"]);
        // Handles without mappings are shown as what they are.
        let mut b = TraceBuilder::new();
        b.ok(MEM_CREATE, 1, 0x10, 2 << 20, 1);
        let r = report(&b, &Options::default());
        let mut out = Vec::new();
        render(&r, &Options::default(), &mut out).unwrap();
        assert!(String::from_utf8(out).unwrap().contains("device 0, vmm-physical memory: 1 allocation"));
    }

    #[test]
    fn terminal_output() {
        let mut out = Vec::new();
        let r = report(&sample(), &Options::default());
        render(&r, &Options::default(), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let expected = "\
t.trace: pid 1234 /usr/bin/demo (demo --fast), 6 events, complete
  warning: the tracer dropped 4 events; the numbers below miss them
  notice: hello
device 0, device memory: 3 allocations, 500 B allocated, 1 free, 1 failed (out of memory)
  peak 500 B (3 live) at 0.000 s:
       300 B     1x  0x300
       200 B     2x  0x100
  live at end (leaked) 200 B in 2 allocations:
       200 B     2x  0x100
failed allocations: 1 out of memory
  cudaMalloc 1.0 GiB on device 0 -> error 2 (out of memory) at 0.000 s, 200 B live on device 0  at  0x300
  when the last one failed (cudaMalloc of 1.0 GiB), live on device 0:
    device memory: 200 B in 2 allocations
       200 B     2x  0x100
frees of unknown pointers, and failed frees:
  cudaFree 0xdead -> not allocated in the trace at 0.000 s  at  0x100
";
        assert_eq!(text, expected);

        let mut out = Vec::new();
        render(
            &r,
            &Options {
                frames: 2,
                ..Options::default()
            },
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("       200 B     2x  0x100\n                     from 0x200\n"),
            "{text}"
        );
    }
}
