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
/// Host memory is driver level. Memory is drawn once: VMM mappings point at the physical
/// memory drawn already (`cuMemCreate`'s stacks), and address reservations are no memory at all.
pub fn shown(trace: &Trace, key: &GroupKey, level: Level) -> bool {
    if matches!(key.kind, MemKind::VmmMapped | MemKind::VmmReserved) {
        return false;
    }
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
            Of::Allocated => trace.allocated.get(key).map_or(&[], |v| &v[..]),
        };
        for u in uses.iter().filter(|u| u.bytes > 0) {
            let located = crate::symbolize::locate(trace, sym, u.stack);
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

/// The root of a group's stacks: `device 0: device`, `host memory: host-pinned`.
pub fn group_name(key: &GroupKey) -> String {
    format!("{}: {}", crate::units::place(key.device), key.kind.name())
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
        let b = merged.entry(line).or_default();
        *b = b.saturating_add(w.bytes);
    }
    // inferno adds the lines up unchecked: a corrupt trace's sizes, whose sum passes 2^64,
    // are cut to what keeps the total below it.
    let mut room = u64::MAX;
    merged
        .into_iter()
        .map(|(l, b)| {
            let b = b.min(room);
            room -= b;
            format!("{l} {b}")
        })
        .collect()
}

/// The picture's title and subtitle. The subtitle's total is the sum of the stacks' bytes (the
/// width of the whole picture), in bytes exactly, and per device and host memory when there
/// are several: the title calls GPU memory GPU memory, and host memory is said apart.
pub fn titles(stacks: &[Weighted], memory: &str, what: &str, exe: &str, phase: Option<&str>) -> (String, String) {
    let mut by_place: std::collections::BTreeMap<(bool, i32), u64> = Default::default();
    for w in stacks {
        let b = by_place.entry((w.key.device < 0, w.key.device)).or_default();
        *b = b.saturating_add(w.bytes);
    }
    let total = crate::units::total(by_place.values().copied());
    let host = crate::units::total(by_place.iter().filter(|((h, _), _)| *h).map(|(_, &b)| b));
    let mut title = if host > 0 && host == total {
        format!("Host memory {what}: {exe}")
    } else {
        format!("{memory} {what}: {exe}")
    };
    if let Some(p) = phase {
        title.push_str(&format!(", phase {p}"));
    }
    if host > 0 && host < total {
        title.push_str(&format!(" (and {} of host memory)", size(host)));
    }
    let mut sub = format!("{} in total ({} bytes)", size(total), total);
    if by_place.len() > 1 {
        let parts: Vec<String> = by_place.iter().map(|(&(_, d), &b)| format!("{} {}", crate::units::place(d), size(b))).collect();
        sub.push_str(&format!(": {}", parts.join(" + ")));
    }
    sub.push_str("; width = bytes");
    (title, sub)
}

/// Writes the flame graph SVG.
pub fn svg(lines: &[String], title: &str, subtitle: &str, out: &mut dyn Write) -> io::Result<()> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title.to_string();
    opts.count_name = "bytes".to_string();
    opts.name_type = "Stack:".to_string();
    opts.subtitle = Some(subtitle.to_string());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;
    use crate::symbolize::Symbolizer;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_title_totals_exactly_the_bytes_drawn_and_says_host_memory_apart() {
        // 128 MiB on device 0 at its peak, 2 MiB of pinned host memory, and 4 MiB of VMM
        // physical memory mapped once into a 1 GiB reservation.
        let mut b = TraceBuilder::new();
        b.stack(1, &[0x100])
            .stack(2, &[0x200])
            .ok(MALLOC, 1, 0x1000, 64 * MIB, 1)
            .ok(MALLOC, 2, 0x2000, 64 * MIB, 2)
            .call(MALLOC_HOST, 3, -1, 0x3000, 2 * MIB, 1, 0)
            .ok(MEM_CREATE, 4, 0x10, 4 * MIB, 2)
            .call(ADDRESS_RESERVE, 5, -1, 0x4000_0000, 1 << 30, 2, 0)
            .rec(gpumemtrace_format::Record::Event(gpumemtrace_format::Event {
                api: MEM_MAP,
                time_ns: 6,
                addr: 0x4000_0000,
                size: 4 * MIB,
                extra: 0x10,
                stack: 2,
                tid: 1,
                ..Default::default()
            }));
        let t = b.load();
        let mut sym = Symbolizer::new();
        let mut sym = sym.for_trace(&t.modules);
        let stacks = weighted(&t, &mut sym, Of::Peak, None, Level::Blocks);
        let lines = folded(&stacks);
        let roots: Vec<&str> = lines.iter().map(|l| l.split(';').next().unwrap()).collect();
        // The mapping is the physical memory again, the reservation no memory: neither is drawn.
        assert_eq!(roots, ["device 0: device", "device 0: device", "device 0: vmm-physical", "host memory: host-pinned"]);
        let drawn: u64 = lines.iter().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
        assert_eq!(drawn, 134 * MIB);

        let (title, sub) = titles(&stacks, "GPU memory", "live at the peak", "demo", None);
        assert_eq!(title, "GPU memory live at the peak: demo (and 2.0 MiB of host memory)");
        assert_eq!(sub, format!("134.0 MiB in total ({} bytes): device 0 132.0 MiB + host memory 2.0 MiB; width = bytes", 134 * MIB));
        let mut svg_out = Vec::new();
        svg(&lines, &title, &sub, &mut svg_out).unwrap();
        let text = String::from_utf8(svg_out).unwrap();
        assert!(text.contains(&sub), "the subtitle is drawn");
        // inferno's root frame, the picture's width, says the same total.
        assert!(text.contains("all (140,509,184 bytes, 100%)"), "{}", &text[..text.len().min(3000)]);

        // Host memory alone is not called GPU memory; one place needs no breakdown.
        let host: Vec<Weighted> = stacks.into_iter().filter(|w| w.key.device < 0).collect();
        let (title, sub) = titles(&host, "GPU memory", "live at the peak", "demo", Some("train"));
        assert_eq!(title, "Host memory live at the peak: demo, phase train");
        assert_eq!(sub, format!("2.0 MiB in total ({} bytes); width = bytes", 2 * MIB));
    }
}
