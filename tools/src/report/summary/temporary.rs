//! The summary's temporary allocations (see `model::temporary`): sites by how many of their
//! allocations were freed again at once, in the terminal and in JSON.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;

use crate::model::{GroupKey, StackUse, Trace};
use crate::report::sites::{cut, sites_by, Site};
use crate::symbolize::Symbolizer;
use crate::units::{count, size};

#[derive(Debug, Serialize)]
pub struct TemporaryReport {
    /// At most this many other allocations of the thread between allocation and free.
    pub threshold: usize,
    pub allocations: u64,
    pub bytes: u64,
    pub sites: Vec<TemporarySite>,
    #[serde(skip)]
    more_sites: usize,
}

#[derive(Debug, Serialize)]
pub struct TemporarySite {
    pub device: i32,
    pub kind: &'static str,
    #[serde(skip)]
    mem_kind: gpumemtrace_format::MemKind,
    #[serde(flatten)]
    pub site: Site,
}

/// The report of `found` (per group, by stack), only groups of `wanted` devices; none when no
/// allocation was temporary.
pub fn build(
    trace: &Trace,
    found: BTreeMap<GroupKey, Vec<StackUse>>,
    threshold: usize,
    sym: &mut Symbolizer,
    (wanted, top, frames): (&dyn Fn(i32) -> bool, Option<usize>, usize),
) -> Option<TemporaryReport> {
    let mut sym = sym.for_trace(&trace.modules);
    let mut sites = Vec::new();
    for (key, uses) in found.iter().filter(|(k, _)| wanted(k.device)) {
        for site in sites_by(uses, trace, &mut sym, frames) {
            sites.push(TemporarySite { device: key.device, kind: key.kind.name(), mem_kind: key.kind, site });
        }
    }
    if sites.is_empty() {
        return None;
    }
    sites.sort_by(|a, b| b.site.count.cmp(&a.site.count).then(b.site.bytes.cmp(&a.site.bytes)));
    let allocations = sites.iter().map(|s| s.site.count).sum();
    let bytes = crate::units::total(sites.iter().map(|s| s.site.bytes));
    let more_sites = cut(&mut sites, top);
    Some(TemporaryReport { threshold, allocations, bytes, sites, more_sites })
}

pub fn render(t: &TemporaryReport, out: &mut dyn Write) -> io::Result<()> {
    let within = match t.threshold {
        0 => "before their thread allocated again".to_string(),
        1 => "with at most 1 other allocation of their thread in between".to_string(),
        n => format!("with at most {n} other allocations of their thread in between"),
    };
    writeln!(
        out,
        "temporary allocations (freed {within}): {}, {}",
        count(t.allocations, "allocation"),
        size(t.bytes)
    )?;
    for s in &t.sites {
        writeln!(
            out,
            "  {:>5}x {:>10}  {}  {}",
            s.site.count,
            size(s.site.bytes),
            crate::units::group_label(s.device, s.mem_kind),
            s.site.site.describe()
        )?;
    }
    if t.more_sites > 0 {
        writeln!(out, "  ... and {} more (see --top)", count(t.more_sites as u64, "site"))?;
    }
    Ok(())
}
