//! Building the summary of one trace from the model: symbolized, aggregated by site, cut.

use std::path::Path;

use gpumemtrace_format::MemKind;

use crate::report::pools::PoolAtFailure;
use crate::report::sites::{cut, growth_sites, sites_by};
use crate::read::input::{self};
use crate::model::{Outcome, Trace};
use crate::symbolize::{locate, Symbolizer};
use crate::units::{cuda_error_name, error_label, Failed};

use super::report::*;

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
    let pools = crate::report::pools::build(trace, &mut sym, wanted, top, opts.frames);
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
                live_bytes: crate::units::total(uses.iter().map(|u| u.bytes)),
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
        // Read to its end, past damaged compressed frames whose records were left out.
        Outcome::Complete if !trace.damaged.is_empty() => {
            let frames: Vec<String> = trace.damaged.iter().map(|(at, why)| format!("the frame from byte {at} ({why})")).collect();
            ("damaged", None, Some(format!("records left out as damaged: {}", frames.join("; "))))
        }
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
        temporary: None,
        finished: trace.stats.is_some_and(|s| s.final_),
        unknown_api_events: trace.unknown_api_events,
        more_failures,
        out_of_memory,
        other_errors,
        more_unknown_frees,
    }
}
