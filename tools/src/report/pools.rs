//! The caching allocator's two levels in the summary: per device with blocks, the allocated
//! (blocks) and reserved (segments) peaks, the fragmentation at the allocated peak, what the
//! cache holds ("cached, not leaked"), device memory that never held a block (direct driver
//! allocations such as cuBLAS workspaces) and whether the allocator's own counters agree.

use std::io::{self, Write};

use serde::Serialize;

use super::sites::{cut, sites_by, Site};
use crate::model::{Pool, Trace};
use crate::model::pool::Reported;
use crate::symbolize::TraceSymbolizer;
use crate::units::{count, seconds, size};

#[derive(Debug, Serialize)]
pub struct PoolReport {
    pub device: i32,
    pub allocated_peak_bytes: u64,
    pub allocated_peak_time_ns: u64,
    pub reserved_at_allocated_peak_bytes: u64,
    /// Reserved minus allocated at the allocated peak.
    pub fragmentation_at_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    pub reserved_peak_time_ns: u64,
    /// Where the figures below are taken: "python-exit" (before the interpreter's shutdown
    /// freed the program's tensors) or "end" (of the trace).
    pub at: &'static str,
    pub allocated_bytes: u64,
    pub blocks: u64,
    pub reserved_bytes: u64,
    pub segments: u64,
    /// Reserved but not allocated: held by the cache, not leaked.
    pub cached_bytes: u64,
    /// Blocks that lay in no driver allocation the trace knows (0 unless events were missed).
    pub blocks_outside_segments: u64,
    /// The allocator's own counters (absent for torch before 1.10), as last reported.
    pub reported: Option<Reported>,
    /// Device memory that never held a block, still live then.
    pub direct_bytes: u64,
    pub direct_count: u64,
    pub direct_sites: Vec<Site>,
    #[serde(skip)]
    pub more_direct_sites: usize,
}

/// What the allocator held when an allocation failed.
#[derive(Debug, Serialize)]
pub struct PoolAtFailure {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub cached_bytes: u64,
}

impl PoolAtFailure {
    pub fn of(p: &Pool) -> PoolAtFailure {
        PoolAtFailure {
            allocated_bytes: p.allocated,
            reserved_bytes: p.reserved,
            cached_bytes: p.reserved.saturating_sub(p.allocated),
        }
    }
}

/// `frames`: frames shown per site, which tell sites apart (see `sites_by`).
pub fn build(trace: &Trace, sym: &mut TraceSymbolizer, wanted: impl Fn(i32) -> bool, top: Option<usize>, frames: usize) -> Vec<PoolReport> {
    let (now, at) = if trace.python_exit_ns.is_some() {
        (&trace.pools_at_python_exit, "python-exit")
    } else {
        (&trace.pools, "end")
    };
    let mut out = Vec::new();
    for (&device, p) in trace.pools.iter().filter(|(d, _)| wanted(**d)) {
        let n = now.get(&device).cloned().unwrap_or_default();
        let direct = trace.direct_leak_stacks.get(&device).map(Vec::as_slice).unwrap_or_default();
        let mut direct_sites = sites_by(direct, trace, sym, frames);
        out.push(PoolReport {
            device,
            allocated_peak_bytes: p.peak_allocated,
            allocated_peak_time_ns: p.peak_allocated_time_ns,
            reserved_at_allocated_peak_bytes: p.reserved_at_allocated_peak,
            fragmentation_at_peak_bytes: p.reserved_at_allocated_peak.saturating_sub(p.peak_allocated),
            reserved_peak_bytes: p.peak_reserved,
            reserved_peak_time_ns: p.peak_reserved_time_ns,
            at,
            allocated_bytes: n.allocated,
            blocks: n.blocks,
            reserved_bytes: n.reserved,
            segments: n.segments,
            cached_bytes: n.reserved.saturating_sub(n.allocated),
            blocks_outside_segments: p.blocks_outside,
            reported: p.reported,
            direct_bytes: crate::units::total(direct.iter().map(|u| u.bytes)),
            direct_count: direct.iter().map(|u| u.count).sum(),
            more_direct_sites: cut(&mut direct_sites, top),
            direct_sites,
        });
    }
    out
}

/// Prints a list of sites (and how many more were cut), as the summary does.
pub type RenderSites<'a> = &'a dyn Fn(&[Site], usize, &mut dyn Write) -> io::Result<()>;

/// The pool lines of one device, printed under its blocks.
pub fn render(
    p: &PoolReport,
    render_sites: RenderSites,
    out: &mut dyn Write,
) -> io::Result<()> {
    writeln!(
        out,
        "  reserved (segments from the driver): peak {} at {}; at the allocated peak {} reserved, {} of it not allocated (fragmentation)",
        size(p.reserved_peak_bytes),
        seconds(p.reserved_peak_time_ns),
        size(p.reserved_at_allocated_peak_bytes),
        size(p.fragmentation_at_peak_bytes)
    )?;
    let when = if p.at == "python-exit" { "when the Python program finished" } else { "at the end" };
    if p.cached_bytes > 0 {
        writeln!(
            out,
            "  cached, not leaked: {} reserved by the caching allocator and free {when} ({} reserved in {}; torch.cuda.empty_cache() returns what is in wholly free segments)",
            size(p.cached_bytes),
            size(p.reserved_bytes),
            count(p.segments, "segment")
        )?;
    }
    if let Some(r) = p.reported {
        writeln!(
            out,
            "  the allocator's own counters: peak allocated {}, peak reserved {}{}",
            size(r.max_allocated),
            size(r.max_reserved),
            if r.max_allocated == p.allocated_peak_bytes && r.max_reserved == p.reserved_peak_bytes {
                " (equal to the trace's)".to_string()
            } else {
                format!(" (the trace says {} and {}: events were missed)", size(p.allocated_peak_bytes), size(p.reserved_peak_bytes))
            }
        )?;
    }
    if p.blocks_outside_segments > 0 {
        writeln!(
            out,
            "  warning: {} lay in no driver allocation the trace knows (its start was not traced)",
            count(p.blocks_outside_segments, "block")
        )?;
    }
    if p.direct_count > 0 {
        writeln!(
            out,
            "  direct driver allocations (not the caching allocator's: cuBLAS workspaces, NCCL, custom code) live {when}: {} in {}:",
            size(p.direct_bytes),
            count(p.direct_count, "allocation")
        )?;
        render_sites(&p.direct_sites, p.more_direct_sites, out)?;
    }
    Ok(())
}
