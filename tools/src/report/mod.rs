//! Reports over the [`Trace`] model, and the call-site aggregation they share.

pub mod check;
pub mod diff;
pub mod dump;
pub mod export;
pub mod flamegraph;
pub mod summary;
pub mod timeline;

use std::collections::HashMap;

use serde::Serialize;

use crate::model::{StackUse, Trace};
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
}

/// Symbolizes the stack with id `stack` (0 or unknown: an empty stack).
pub fn locate(trace: &Trace, sym: &mut TraceSymbolizer, stack: u32) -> Located {
    let frames = trace
        .stacks
        .get(&stack)
        .map(|a| sym.stack(a))
        .unwrap_or_default();
    let site_index = site_index(&frames);
    Located {
        site: frames.get(site_index).cloned().unwrap_or_default(),
        frames,
        site_index,
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
}

/// Site identity: the symbolized function and line. Unsymbolized stacks cannot be told
/// apart any better than by their id.
#[derive(Clone, PartialEq, Eq, Hash)]
enum SiteKey {
    Symbol(String, Option<String>, Option<u32>),
    Stack(u32),
}

/// Merges per-stack usage into per-site usage, largest first.
pub fn sites(uses: &[StackUse], trace: &Trace, sym: &mut TraceSymbolizer) -> Vec<Site> {
    let mut index: HashMap<SiteKey, usize> = HashMap::new();
    let mut out: Vec<Site> = Vec::new();
    // `uses` come largest first, so the first stack seen for a site is its biggest.
    for u in uses {
        let located = locate(trace, sym, u.stack);
        let key = match &located.site.function {
            Some(f) => SiteKey::Symbol(f.clone(), located.site.file.clone(), located.site.line),
            None => SiteKey::Stack(u.stack),
        };
        let i = *index.entry(key).or_insert_with(|| {
            let Located {
                site,
                frames,
                site_index,
            } = located;
            out.push(Site {
                bytes: 0,
                count: 0,
                site,
                frames,
                site_index,
            });
            out.len() - 1
        });
        out[i].bytes += u.bytes;
        out[i].count += u.count;
    }
    // Stable: ties keep the order of their biggest stack.
    out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
    out
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
