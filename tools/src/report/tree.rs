//! `gpumemtrace tree`: the call tree of a moment's bytes (memray's `tree`, heaptrack's
//! top-down tree): from each group (device and memory kind) through the outermost frame down
//! to the call site, each node with the bytes and allocations below it. Nodes smaller than a
//! share of their group are pruned, and counted as pruned.

use std::collections::HashMap;
use std::io::{self, Write};

use clap::ValueEnum;
use serde::Serialize;

use super::flamegraph::{self, Level, Weighted};
use crate::model::{GroupKey, Trace};
use crate::symbolize::{Frame, TraceSymbolizer};
use crate::units::{count, group_label, size};

/// Which bytes the tree holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Of {
    /// Live at each group's peak
    Peak,
    /// Still live at the end of the trace (leaks)
    End,
    /// Every allocation, freed or not
    Total,
}

impl Of {
    fn weighted(self) -> flamegraph::Of {
        match self {
            Of::Peak => flamegraph::Of::Peak,
            Of::End => flamegraph::Of::Leaks,
            Of::Total => flamegraph::Of::Allocated,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Of::Peak => "peak",
            Of::End => "end",
            Of::Total => "total",
        }
    }

    fn words(self) -> &'static str {
        match self {
            Of::Peak => "live at the peak",
            Of::End => "live at the end",
            Of::Total => "allocated in total",
        }
    }
}

/// A frame of the tree and what lies below it.
#[derive(Debug, Serialize)]
pub struct Node {
    /// `function file:line`, as the summary names frames.
    pub name: String,
    pub bytes: u64,
    pub count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<Frame>,
    pub children: Vec<Node>,
}

/// One group's tree.
#[derive(Debug, Serialize)]
pub struct Root {
    pub device: i32,
    pub kind: &'static str,
    pub bytes: u64,
    pub count: u64,
    /// Nodes left out for being smaller than `min_percent` of the group, and what they held
    /// (their subtrees included, counted once).
    pub pruned_nodes: u64,
    pub pruned_bytes: u64,
    pub pruned_count: u64,
    pub children: Vec<Node>,
    #[serde(skip)]
    key: GroupKey,
}

#[derive(Debug, Serialize)]
pub struct Tree {
    pub of: &'static str,
    pub min_percent: f64,
    pub roots: Vec<Root>,
}

/// The tree of `of` per group shown at `level` (only `device`'s when given).
pub fn tree(
    trace: &Trace,
    sym: &mut TraceSymbolizer,
    of: Of,
    device: Option<i32>,
    level: Level,
    min_percent: f64,
) -> Tree {
    let stacks = flamegraph::weighted(trace, sym, of.weighted(), device, level);
    let mut roots: Vec<Root> = Vec::new();
    let mut by_key: HashMap<GroupKey, usize> = HashMap::new();
    let mut tries: Vec<Trie> = Vec::new();
    for w in &stacks {
        let i = *by_key.entry(w.key).or_insert_with(|| {
            tries.push(Trie::default());
            roots.push(Root {
                device: w.key.device,
                kind: w.key.kind.name(),
                bytes: 0,
                count: 0,
                pruned_nodes: 0,
                pruned_bytes: 0,
                pruned_count: 0,
                children: Vec::new(),
                key: w.key,
            });
            roots.len() - 1
        });
        roots[i].bytes = roots[i].bytes.saturating_add(w.bytes);
        roots[i].count += w.count;
        tries[i].add(w);
    }
    let mut roots: Vec<(Root, Trie)> = roots.into_iter().zip(tries).collect();
    // GPUs first, host memory after them.
    roots.sort_by_key(|(r, _)| (r.key.device < 0, r.key));
    let roots: Vec<Root> = roots
        .into_iter()
        .map(|(mut root, trie)| {
            let floor = root.bytes as f64 * min_percent / 100.0;
            let mut pruned = (0, 0, 0);
            root.children = trie.into_nodes(floor, &mut pruned);
            (root.pruned_nodes, root.pruned_bytes, root.pruned_count) = pruned;
            root
        })
        .collect();
    Tree { of: of.name(), min_percent, roots }
}

/// Frames merged by name, as they are built.
#[derive(Default)]
struct Trie {
    children: Vec<(String, Frame, u64, u64, Trie)>,
    index: HashMap<String, usize>,
}

impl Trie {
    fn add(&mut self, w: &Weighted) {
        let no_stack = [Frame { function: Some("(no stack captured)".into()), ..Frame::default() }];
        let frames: &[Frame] = if w.frames.is_empty() { &no_stack } else { &w.frames };
        let mut at = self;
        for f in frames {
            let name = f.describe();
            let i = match at.index.get(&name) {
                Some(&i) => i,
                None => {
                    at.children.push((name.clone(), f.clone(), 0, 0, Trie::default()));
                    at.index.insert(name, at.children.len() - 1);
                    at.children.len() - 1
                }
            };
            let c = &mut at.children[i];
            c.2 = c.2.saturating_add(w.bytes);
            c.3 += w.count;
            at = &mut c.4;
        }
    }

    /// The nodes of at least `floor` bytes, largest first; the others are added to `pruned`
    /// (nodes, bytes, allocations).
    fn into_nodes(self, floor: f64, pruned: &mut (u64, u64, u64)) -> Vec<Node> {
        let mut out = Vec::new();
        for (name, frame, bytes, n, below) in self.children {
            if (bytes as f64) < floor {
                pruned.0 += 1;
                pruned.1 = pruned.1.saturating_add(bytes);
                pruned.2 += n;
                continue;
            }
            let children = below.into_nodes(floor, pruned);
            let frame = (frame.address != 0 || frame.python).then_some(frame);
            out.push(Node { name, bytes, count: n, frame, children });
        }
        out.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
        out
    }
}

/// The tree for the terminal.
pub fn render(t: &Tree, out: &mut dyn Write) -> io::Result<()> {
    let of = match t.of {
        "peak" => Of::Peak,
        "end" => Of::End,
        _ => Of::Total,
    };
    if t.roots.is_empty() {
        writeln!(out, "no memory {}", of.words())?;
    }
    for (i, r) in t.roots.iter().enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let label = group_label(r.key.device, r.key.kind);
        writeln!(out, "{label}: {} in {} {}", size(r.bytes), count(r.count, "allocation"), of.words())?;
        let total = r.bytes;
        nodes(&r.children, total, "", out)?;
        if r.pruned_nodes > 0 {
            writeln!(
                out,
                "(pruned: {} below {}% of {}, holding {} in {})",
                count(r.pruned_nodes, "node"),
                t.min_percent,
                size(total),
                size(r.pruned_bytes),
                count(r.pruned_count, "allocation")
            )?;
        }
    }
    Ok(())
}

fn nodes(v: &[Node], total: u64, prefix: &str, out: &mut dyn Write) -> io::Result<()> {
    for (i, n) in v.iter().enumerate() {
        let last = i + 1 == v.len();
        let pct = if total > 0 { n.bytes as f64 * 100.0 / total as f64 } else { 0.0 };
        writeln!(
            out,
            "{prefix}{} {}  {} ({pct:.1}%), {}x",
            if last { "└──" } else { "├──" },
            n.name,
            size(n.bytes),
            n.count
        )?;
        let deeper = format!("{prefix}{}", if last { "    " } else { "│   " });
        nodes(&n.children, total, &deeper, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;
    use crate::symbolize::Symbolizer;

    #[test]
    fn the_tree_merges_stacks_from_the_outermost_frame_and_prunes_small_nodes() {
        // Stacks innermost first: 0x100 <- 0x200 <- 0x300 (outermost), 0x110 <- 0x200 <- 0x300,
        // and a small one 0x120 <- 0x300.
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100, 0x200, 0x300])
            .stack(2, &[0x110, 0x200, 0x300])
            .stack(3, &[0x120, 0x300])
            .ok(MALLOC, 1, 0x1000, 600, 1)
            .ok(MALLOC, 2, 0x2000, 300, 2)
            .ok(MALLOC, 3, 0x3000, 100, 2)
            .ok(MALLOC, 4, 0x4000, 5, 3)
            .ok(FREE, 5, 0x1000, 0, 1);
        let t = b.load();
        let mut sym = Symbolizer::new();
        let mut sym = sym.for_trace(&t.modules);
        let peak = tree(&t, &mut sym, Of::Peak, None, Level::Blocks, 1.0);
        assert_eq!(peak.roots.len(), 1);
        let r = &peak.roots[0];
        assert_eq!((r.bytes, r.count), (1005, 4));
        assert_eq!(r.children.len(), 1, "one outermost frame");
        let top = &r.children[0];
        assert_eq!((top.bytes, top.count), (1005, 4));
        assert_eq!(top.children.len(), 1, "the 5-byte branch is below 1%");
        let mid = &top.children[0];
        assert_eq!((mid.bytes, mid.count), (1000, 3));
        let leaves: Vec<(u64, u64)> = mid.children.iter().map(|n| (n.bytes, n.count)).collect();
        assert_eq!(leaves, [(600, 1), (400, 2)]);
        assert_eq!((r.pruned_nodes, r.pruned_bytes, r.pruned_count), (1, 5, 1));

        let end = tree(&t, &mut sym, Of::End, None, Level::Blocks, 0.0);
        assert_eq!((end.roots[0].bytes, end.roots[0].count, end.roots[0].pruned_nodes), (405, 3, 0));
        let total = tree(&t, &mut sym, Of::Total, None, Level::Blocks, 50.0);
        let r = &total.roots[0];
        assert_eq!((r.bytes, r.count), (1005, 4));
        // Only nodes of 502.5 bytes or more stay: the outermost frame, its 1000-byte child, the 600.
        assert_eq!(r.children[0].children[0].children.len(), 1);
        assert_eq!((r.pruned_nodes, r.pruned_bytes, r.pruned_count), (2, 405, 3));
        let mut text = Vec::new();
        render(&peak, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("device 0, device memory: 1005 B in 4 allocations live at the peak\n"), "{text}");
        assert!(text.contains("(pruned: 1 node below 1% of 1005 B, holding 5 B in 1 allocation)"), "{text}");
    }
}
