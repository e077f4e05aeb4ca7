//! `gpumemtrace flamegraph`: bytes by stack as a flame graph (inferno) or as folded stacks
//! (`frame;frame;frame bytes`, outermost first) for other tools.
//!
//! The root of each stack is its device and memory kind; the leaf is the call site (frames
//! inside CUDA's libraries and the tracer are left out). On a device with blocks (PyTorch's
//! caching allocator), one level at a time: its blocks (tensors, by default: what the program
//! asked for) or what the driver handed out (segments and direct allocations); the same bytes
//! counted at both levels would make one picture of two.

use std::io::{self, Write};

use clap::ValueEnum;
use gpumemtrace_format::MemKind;

use crate::model::{GroupKey, StackUse, Trace};
use crate::symbolize::{Frame, TraceSymbolizer};
use crate::units::size;

/// Which bytes a flame graph shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Of {
    /// Live at each group's peak.
    Peak,
    /// Still live at the end of the trace.
    Leaks,
    /// Every allocation, freed or not.
    Allocated,
}

impl Of {
    pub fn name(self) -> &'static str {
        match self {
            Of::Peak => "peak",
            Of::Leaks => "leaks",
            Of::Allocated => "allocated",
        }
    }
}

/// Which level of a device with blocks to show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Level {
    /// Blocks (tensors) of PyTorch's caching allocator
    #[default]
    Blocks,
    /// What the driver handed out: the allocator's segments, direct allocations, host memory
    Segments,
}

/// Whether `key`'s group is drawn at `level`. Without blocks there is one level: all of it.
/// Memory of no device (pinned host memory, address reservations) is driver level.
pub fn shown(trace: &Trace, key: &GroupKey, level: Level) -> bool {
    if trace.pools.is_empty() {
        return true;
    }
    let block = key.kind == MemKind::Block;
    match level {
        Level::Blocks => block || (key.device >= 0 && !trace.pools.contains_key(&key.device)),
        Level::Segments => !block,
    }
}

/// A stack, outermost frame first, ending at the call site; and the bytes and allocations it
/// accounts for.
#[allow(dead_code)]
pub struct Weighted {
    pub key: GroupKey,
    pub frames: Vec<Frame>,
    pub bytes: u64,
    pub count: u64,
}

/// The stacks of `of` per group shown at `level` (only `device`'s when given), largest first
/// within a group.
pub fn weighted(
    trace: &Trace,
    sym: &mut TraceSymbolizer,
    of: Of,
    device: Option<i32>,
    level: Level,
) -> Vec<Weighted> {
    let mut out = Vec::new();
    for (key, g) in &trace.groups {
        if device.is_some_and(|d| d != key.device) || !shown(trace, key, level) {
            continue;
        }
        let uses: &[StackUse] = match of {
            Of::Peak => &g.peak_stacks,
            Of::Leaks => &g.leak_stacks,
            Of::Allocated => trace.ext.allocated.get(key).map_or(&[], |v| &v[..]),
        };
        for u in uses.iter().filter(|u| u.bytes > 0) {
            let located = super::locate(trace, sym, u.stack);
            let mut frames: Vec<Frame> = located
                .frames
                .get(located.site_index..)
                .unwrap_or_default()
                .to_vec();
            // The outermost "frame" of a stack is often a null return address (Python frames
            // have no address at all: keep them).
            frames.retain(|f| f.address != 0 || f.python);
            frames.reverse();
            out.push(Weighted {
                key: *key,
                frames,
                bytes: u.bytes,
                count: u.count,
            });
        }
    }
    out
}

/// A frame's name in folded stacks: `function (file.c:12)`, without `;`.
pub fn frame_name(f: &Frame) -> String {
    let mut s = match (&f.function, f.module_name(), f.offset) {
        (Some(func), _, _) => func.clone(),
        (None, Some(m), Some(off)) => format!("{m}+{off:#x}"),
        _ => format!("{:#x}", f.address),
    };
    if let (Some(file), Some(line)) = (&f.file, f.line) {
        let file = file.rsplit('/').next().unwrap_or(file);
        s.push_str(&format!(" ({file}:{line})"));
    }
    s.replace(';', ":").replace('\n', " ")
}

pub fn group_name(key: &GroupKey) -> String {
    format!("device {}: {}", key.device, key.kind.name())
}

/// Folded stacks: one line per stack, `root;outer;...;site bytes`, merged when equal.
pub fn folded(stacks: &[Weighted]) -> Vec<String> {
    let mut merged: std::collections::BTreeMap<String, u64> = Default::default();
    for w in stacks {
        let mut line = group_name(&w.key);
        if w.frames.is_empty() {
            line.push_str(";(no stack)");
        }
        for f in &w.frames {
            line.push(';');
            line.push_str(&frame_name(f));
        }
        *merged.entry(line).or_default() += w.bytes;
    }
    merged.into_iter().map(|(l, b)| format!("{l} {b}")).collect()
}

/// Writes the flame graph SVG.
pub fn svg(lines: &[String], title: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "bytes".to_string();
    opts.name_type = "Stack:".to_string();
    let total: u64 = lines
        .iter()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    opts.subtitle = Some(format!("{} in total; width = bytes", size(total)));
    if lines.is_empty() {
        // inferno refuses empty input; an empty picture says more than an error.
        opts.subtitle = Some("no bytes to show".into());
        let one = ["(nothing) 1".to_string()];
        return inferno::flamegraph::from_lines(&mut opts, one.iter().map(String::as_str), out)
            .map_err(io::Error::other);
    }
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)
        .map_err(io::Error::other)
}
