//! Reports over the [`Trace`] model, and the call-site aggregation they share.

pub mod check;
pub mod diff;
pub mod dump;
pub mod export;
pub mod flamegraph;
pub mod merged;
pub mod pools;
pub mod summary;
pub mod timeline;

use std::collections::HashMap;

use serde::Serialize;

use crate::model::autograd::BORROWED;
use crate::model::growth::{self, StackTrend};
use crate::model::{StackUse, Trace};
use crate::python;
use crate::sites::site_index;
use crate::symbolize::{Frame, TraceSymbolizer};

/// A symbolized stack with its call site picked out.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Located {
    pub site: Frame,
    /// The whole stack, innermost first, inlined frames expanded.
    pub frames: Vec<Frame>,
    /// Where `site` is in `frames`; terminal output shows frames from here.
    #[serde(skip)]
    pub site_index: usize,
    /// In a Python process, the name of a thread without Python frames (a native worker
    /// thread such as PyTorch's autograd engine) that made the allocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The framework op that allocated, from the native frames (`aten::mm`, `MmBackward0`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// The Python frames are those of another thread waiting in `backward()` (see
    /// `autograd`): the allocation was made for that call.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub during_backward: bool,
}

/// Symbolizes the stack with key `stack` (0 or unknown: an empty stack), merged with its
/// Python stack when it has one (see [`crate::python::merge`]).
pub fn locate(trace: &Trace, sym: &mut TraceSymbolizer, stack: u32) -> Located {
    let (native, py) = match trace.combined.get(&stack) {
        Some(&(n, p)) => (n, p),
        None => (stack, 0),
    };
    let during_backward = py & BORROWED != 0;
    let py = py & !BORROWED;
    let mut frames = trace
        .stacks
        .get(&native)
        .map(|a| sym.stack(a))
        .unwrap_or_default();
    let op = crate::sites::op_name(&frames);
    if let Some(pf) = trace.py_stacks.get(&py) {
        let python: Vec<_> = pf.iter().map(|f| python::frame(trace.py_codes.get(&f.code), f)).collect();
        let entry: Vec<bool> = pf.iter().map(|f| f.flags & 1 != 0).collect();
        frames = python::merge(frames, python, &entry);
    }
    let site_index = match frames.iter().position(|f| f.python) {
        Some(first) => frames
            .iter()
            .position(|f| f.python && python::is_user_code(f))
            .unwrap_or(first),
        None => site_index(&frames),
    };
    // A thread of a Python process that allocated outside Python code (PyTorch's autograd
    // threads have a thread state but no frames).
    let thread = match trace.stack_tid.get(&stack).and_then(|t| trace.threads.get(t)) {
        Some(t) if (py == 0 || during_backward) && !trace.py_codes.is_empty() => Some(t.name.clone()),
        _ => None,
    };
    Located {
        site: frames.get(site_index).cloned().unwrap_or_default(),
        frames,
        site_index,
        thread,
        op,
        during_backward,
    }
}

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
        out[i].bytes += u.bytes;
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
    let mut acc: Vec<(Located, Vec<u64>)> = Vec::new();
    for t in trends {
        let located = locate(trace, sym, t.stack);
        let key = site_key(&located, t.stack, frames);
        let i = *index.entry(key).or_insert_with(|| {
            acc.push((located, vec![0; t.mins.len()]));
            acc.len() - 1
        });
        for (a, m) in acc[i].1.iter_mut().zip(&t.mins) {
            *a += m;
        }
    }
    let mut out: Vec<GrowthSite> = acc
        .into_iter()
        .filter_map(|(l, mins)| {
            let (first, last, rises) = growth::growing(&mins)?;
            let Located { site, frames, site_index, thread, op, during_backward } = l;
            Some(GrowthSite {
                gained_bytes: last - first,
                first_bytes: first,
                last_bytes: last,
                rising_windows: rises,
                windows: mins.len(),
                site: Site { bytes: last, count: 0, site, frames, site_index, thread, op, during_backward },
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
