//! Call sites: per-stack usage merged into per-site usage, as the reports list it.

use std::collections::HashMap;

use serde::Serialize;

use crate::model::growth::{self, StackTrend};
use crate::model::StackUse;
use crate::model::Trace;
use crate::symbolize::{locate, Frame, Located, TraceSymbolizer};

/// Live memory attributed to one call site.
#[derive(Clone, Debug, Serialize)]
pub struct Site {
    pub bytes: u64,
    pub count: u64,
    /// The site frame, and as a sample the stack that contributed most.
    #[serde(flatten)]
    pub site: Frame,
    pub frames: Vec<Frame>,
    #[serde(skip)]
    pub site_index: usize,
    /// See [`Located::thread`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// See [`Located::op`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// See [`Located::during_backward`].
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub during_backward: bool,
}

/// Site identity: the frames a report shows of it (`--frames N`: the site and its N-1
/// callers), each by symbolized function and line, so that two lines that read the same are one
/// site and one site never hides callers it does not show. Unsymbolized sites cannot be told
/// apart any better than by their stack id.
#[derive(Clone, PartialEq, Eq, Hash)]
enum SiteKey {
    /// The frames shown; for allocations outside the caller's own Python code (autograd
    /// threads), also the op, which tells them apart.
    Symbol(Vec<FrameKey>, Option<String>),
    Stack(u32),
}

/// One shown frame: function, file, line; or, unsymbolized, its address.
#[derive(Clone, PartialEq, Eq, Hash)]
enum FrameKey {
    Symbol(String, Option<String>, Option<u32>),
    Address(u64),
}

/// Merges per-stack usage into per-site usage, largest first: one site per call site frame.
pub fn sites(uses: &[StackUse], trace: &Trace, sym: &mut TraceSymbolizer) -> Vec<Site> {
    sites_by(uses, trace, sym, 1)
}

/// Merges per-stack usage into per-site usage, largest first, a site being the `frames` frames
/// shown from the call site outwards (see [`SiteKey`]).
pub fn sites_by(uses: &[StackUse], trace: &Trace, sym: &mut TraceSymbolizer, frames: usize) -> Vec<Site> {
    let mut index: HashMap<SiteKey, usize> = HashMap::new();
    let mut out: Vec<Site> = Vec::new();
    // `uses` come largest first, so the first stack seen for a site is its biggest.
    for u in uses {
        let located = locate(trace, sym, u.stack);
        let key = site_key(&located, u.stack, frames);
        let i = *index.entry(key).or_insert_with(|| {
            let Located { site, frames, site_index, thread, op, during_backward } = located;
            out.push(Site { bytes: 0, count: 0, site, frames, site_index, thread, op, during_backward });
            out.len() - 1
        });
        out[i].bytes = out[i].bytes.saturating_add(u.bytes);
        out[i].count += u.count;
    }
    // Stable: ties keep the order of their biggest stack.
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
    out
}

/// A call site whose live bytes kept rising over the run (see `growth`).
#[derive(Clone, Debug, Serialize)]
pub struct GrowthSite {
    /// Rise of the site's lowest live bytes from the first window of the run to the last.
    pub gained_bytes: u64,
    pub first_bytes: u64,
    pub last_bytes: u64,
    /// Windows (of `windows`) in which it rose; it never fell.
    pub rising_windows: usize,
    pub windows: usize,
    #[serde(flatten)]
    pub site: Site,
}

/// Sites whose live bytes kept rising, most gained first: the stacks' per-window minimums
/// summed per site (`frames` frames shown, as in [`sites_by`]), then judged by [`growth::growing`].
pub fn growth_sites(trends: &[StackTrend], trace: &Trace, sym: &mut TraceSymbolizer, frames: usize) -> Vec<GrowthSite> {
    let mut index: HashMap<SiteKey, usize> = HashMap::new();
    // Per site: where, the summed minimums, live allocations at the end.
    let mut acc: Vec<(Located, Vec<u64>, u64)> = Vec::new();
    for t in trends {
        let located = locate(trace, sym, t.stack);
        let key = site_key(&located, t.stack, frames);
        let i = *index.entry(key).or_insert_with(|| {
            acc.push((located, vec![0; t.mins.len()], 0));
            acc.len() - 1
        });
        for (a, m) in acc[i].1.iter_mut().zip(&t.mins) {
            *a += m;
        }
        acc[i].2 += t.live_count;
    }
    let mut out: Vec<GrowthSite> = acc
        .into_iter()
        .filter_map(|(l, mins, count)| {
            let (first, last, rises) = growth::growing(&mins)?;
            let Located { site, frames, site_index, thread, op, during_backward } = l;
            Some(GrowthSite {
                gained_bytes: last - first,
                first_bytes: first,
                last_bytes: last,
                rising_windows: rises,
                windows: mins.len(),
                site: Site { bytes: last, count, site, frames, site_index, thread, op, during_backward },
            })
        })
        .collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.gained_bytes));
    out
}

fn site_key(located: &Located, stack: u32, frames: usize) -> SiteKey {
    let op = located.thread.as_ref().and(located.op.clone());
    if located.site.function.is_none() {
        return SiteKey::Stack(stack);
    }
    let shown = located
        .frames
        .iter()
        .skip(located.site_index)
        .take(frames.max(1))
        .map(|f| match &f.function {
            Some(func) => FrameKey::Symbol(func.clone(), f.file.clone(), f.line),
            None => FrameKey::Address(f.address),
        })
        .collect();
    SiteKey::Symbol(shown, op)
}

/// Keeps the first `top` items; returns how many were cut.
pub fn cut<T>(v: &mut Vec<T>, top: Option<usize>) -> usize {
    match top {
        Some(n) if v.len() > n => {
            let more = v.len() - n;
            v.truncate(n);
            more
        }
        _ => 0,
    }
}
