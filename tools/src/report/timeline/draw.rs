//! The timeline as SVG: a band of phase lanes, then one panel per device and memory kind.
//! Everything drawn is bounded by the picture's width, not by the trace's length: series per
//! pixel column (see `envelope`), phases as at most about a bar per pixel per lane (see
//! `lanes`); the picture says what it reduced.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpumemtrace_format::MemKind;
use serde::Serialize;

use super::envelope::{columns, Column};
use super::lanes::{lanes, Bar, Lanes, MAX_DEPTH_LANES};
use crate::model::timeseries::Series;
use crate::model::{GroupKey, Trace};
use crate::read::phases::MAX_SPANS;
use crate::units::{seconds, size};

pub const WIDTH: f64 = 1200.0;
pub const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const PANEL_H: f64 = 200.0;
const GAP: f64 = 50.0;
const LANE_H: f64 = 16.0;
pub const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const RESERVED_COLOR: &str = "#444444";
/// Phase names the legend lists (the others are counted).
const LEGEND_NAMES: usize = 40;

pub fn kind_color(kind: MemKind) -> &'static str {
    match kind {
        MemKind::Device => "#4e79a7",
        MemKind::Managed => "#f28e2b",
        MemKind::HostPinned => "#59a14f",
        MemKind::VmmPhysical => "#76b7b2",
        MemKind::VmmReserved => "#9c9c9c",
        MemKind::VmmMapped => "#af7aa1",
        MemKind::Block => "#e15759",
    }
}

const PHASE_COLORS: [&str; 12] = [
    "#fde2b8", "#cfe8d5", "#d6e0f5", "#f3d1dc", "#e4dcf1", "#f1ecc8", "#d3eef0", "#f6d8c4", "#dcebc2", "#e2d4c8",
    "#cad9e8", "#efd2ee",
];
/// Bars standing for several phase names.
const MIXED_COLOR: &str = "#c8c8c8";

pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" step for about 4 ticks over `max` bytes: a power of two.
fn byte_step(max: u64) -> u64 {
    let target = (max / 4).max(1);
    let mut step = 1u64;
    while step < target {
        step *= 2;
    }
    step
}

fn time_step(span_s: f64) -> f64 {
    let raw = span_s / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if raw <= m * mag {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_time(s: f64, step: f64) -> String {
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    format!("{s:.decimals$} s")
}

/// The data behind one panel, embedded in the HTML page for hover read-outs.
#[derive(Serialize)]
struct PanelData {
    title: String,
    /// (time ns, min, max, last), flat stretches collapsed.
    points: Vec<(u64, u64, u64, u64)>,
    /// The allocator's reserved bytes, on a panel of blocks.
    reserved: Vec<(u64, u64, u64, u64)>,
    ymax: u64,
}

/// The timeline: the SVG, and the data the HTML page reads.
pub struct Picture {
    pub svg: String,
    pub data: serde_json::Value,
    /// The traced program's name.
    pub exe: String,
}

fn collapsed(series: &Series) -> Vec<(u64, u64, u64, u64)> {
    let mut points: Vec<(u64, u64, u64, u64)> = Vec::new();
    for p in series.points() {
        let flat = p.1 == p.3 && p.2 == p.3;
        if flat && points.last().is_some_and(|q| q.3 == p.3) {
            continue;
        }
        points.push(p);
    }
    points
}

/// A step path along `value` of each column, `x` scaling columns to pixels.
fn steps(cols: &[Column], x: impl Fn(u32) -> f64, y: impl Fn(u64) -> f64, value: impl Fn(&Column) -> u64) -> String {
    let mut d = String::new();
    for (i, c) in cols.iter().enumerate() {
        let (x0, x1, yv) = (x(c.x0), x(c.x1), y(value(c)));
        let _ = write!(d, "{}{x0:.2},{yv:.2} L{x1:.2},{yv:.2}", if i == 0 { "M" } else { " L" });
    }
    d
}

/// The area under a step path, closed along the bottom.
fn area(line: &str, bottom: f64) -> String {
    if line.is_empty() {
        return String::new();
    }
    format!("M0,{bottom} L{} L{PLOT_W:.2},{bottom} Z", &line[1..])
}

/// Colours of phase names by first appearance, so that neighbours differ.
struct PhaseColors(Vec<String>);

impl PhaseColors {
    fn of(&self, name: &str) -> &'static str {
        let i = self.0.iter().position(|n| n == name).unwrap_or(0);
        PHASE_COLORS[i % PHASE_COLORS.len()]
    }
    fn bar(&self, b: &Bar) -> &'static str {
        if b.mixed {
            MIXED_COLOR
        } else {
            self.of(&b.names[0])
        }
    }
}

/// Renders the timeline. `fine`: four columns per pixel (the HTML page, which zooms).
pub fn render(trace: &Trace, device: Option<i32>, reserved: &BTreeMap<i32, Series>, fine: bool) -> Picture {
    let mut groups: Vec<(&GroupKey, _)> = trace
        .groups
        .iter()
        .filter(|(k, _)| device.is_none_or(|d| d == k.device))
        .filter(|(k, _)| trace.series.contains_key(k))
        .collect();
    // Per device, its blocks (tensors) first, as in the summary: what the program asked for.
    groups.sort_by_key(|(k, _)| (k.device, k.kind != MemKind::Block));
    let end_ns = trace.end_ns.max(1);
    let ncols = PLOT_W as u32 * if fine { 4 } else { 1 };
    let x_of = |t: u64| t as f64 / end_ns as f64 * PLOT_W;
    let x_col = |c: u32| f64::from(c) / f64::from(ncols) * PLOT_W;

    let lanes = lanes(&trace.spans, end_ns, PLOT_W);
    let mut names: Vec<String> = Vec::new();
    for s in &trace.spans {
        if !names.contains(&s.name) {
            names.push(s.name.clone());
        }
    }
    let colors = PhaseColors(names);
    let band_top = 62.0;
    let band_h = lanes.kinds.len() as f64 * LANE_H;
    let top = band_top + band_h + if lanes.kinds.is_empty() { 20.0 } else { 34.0 };

    let (exe, pid) = trace.process.as_ref().map_or(("?".to_string(), 0), |p| {
        (p.exe.rsplit('/').next().unwrap_or(&p.exe).to_string(), p.pid)
    });
    let mut s = String::new();
    let memory = if groups.iter().any(|(k, _)| k.kind == MemKind::HostPinned) { "GPU and host memory" } else { "GPU memory" };
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="24" font-size="17" font-weight="bold">{memory} over time: {} (pid {pid})</text>"##,
        esc(&exe)
    );
    let failures_n = trace.failures.iter().filter(|f| device.is_none_or(|d| d == f.device) && f.counts()).count();
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="44" fill="#555">{} events over {}; {} failed allocation{}</text>"##,
        trace.events,
        seconds(trace.end_ns),
        failures_n,
        if failures_n == 1 { "" } else { "s" }
    );
    band(&mut s, &lanes, &colors, band_top, x_of);
    if groups.is_empty() {
        let _ = writeln!(s, r##"<text x="{LEFT}" y="{}" fill="#555">no allocations in this trace</text>"##, top + 40.0);
    }

    let mut panels = Vec::new();
    let mut kinds_drawn: Vec<MemKind> = Vec::new();
    let mut any_reserved = false;
    for (i, (key, g)) in groups.iter().enumerate() {
        let series = &trace.series[*key];
        let points = series.points();
        let cols = columns(&points, series.bucket_ns, end_ns, ncols);
        let res = (key.kind == MemKind::Block && trace.pools.contains_key(&key.device))
            .then(|| reserved.get(&key.device))
            .flatten();
        let res_cols = res.map(|r| columns(&r.points(), r.bucket_ns, end_ns, ncols)).unwrap_or_default();
        let res_peak = res_cols.iter().map(|c| c.max).max().unwrap_or(0);
        let ymax_data = cols.iter().map(|c| c.max).max().unwrap_or(0).max(g.peak_bytes).max(res_peak).max(1);
        let step = byte_step(ymax_data);
        let ymax = ymax_data.div_ceil(step).max(1).saturating_mul(step);
        let y_of = |v: u64| PANEL_H - v as f64 / ymax as f64 * PANEL_H;
        let ptop = top + i as f64 * (PANEL_H + GAP);
        let title = crate::units::group_label(key.device, key.kind).replacen(", ", " · ", 1);
        if !kinds_drawn.contains(&key.kind) {
            kinds_drawn.push(key.kind);
        }
        let _ = writeln!(
            s,
            r##"<g class="panel" data-device="{}" data-kind="{}" transform="translate({LEFT},{ptop})">"##,
            key.device,
            key.kind.name()
        );
        let peaks = match res {
            Some(_) => format!("allocated peak {} · reserved peak {}", size(g.peak_bytes), size(res_peak)),
            None => format!("peak {}", size(g.peak_bytes)),
        };
        let _ = writeln!(
            s,
            r##"<text x="0" y="-8" font-weight="bold">{}</text><text x="{PLOT_W}" y="-8" text-anchor="end" fill="#555">{peaks} · live at end {} · {}</text>"##,
            esc(&title),
            size(g.live_bytes),
            crate::units::count(g.allocations, "allocation")
        );
        let mut v = 0;
        while v <= ymax {
            let y = y_of(v);
            let _ = writeln!(
                s,
                r##"<line x1="0" x2="{PLOT_W}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="-6" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                y + 4.0,
                size(v)
            );
            // At the top of the range the next tick is past u64::MAX (a corrupt trace's sizes).
            let Some(next) = v.checked_add(step) else { break };
            v = next;
        }
        // The plot proper: a nested SVG that the HTML page zooms by its viewBox.
        let _ = writeln!(
            s,
            r##"<svg class="plot" x="0" y="0" width="{PLOT_W}" height="{PANEL_H}" viewBox="0 0 {PLOT_W} {PANEL_H}" preserveAspectRatio="none" overflow="hidden">"##
        );
        shading(&mut s, &lanes, &colors, x_of);
        let color = kind_color(key.kind);
        let hi = steps(&cols, x_col, y_of, |c| c.max);
        let lo = steps(&cols, x_col, y_of, |c| c.min);
        // Under the minimum: always live. Between minimum and maximum (lighter): the range
        // live bytes took within the pixel. The line: the maximum, so every peak shows.
        let _ = writeln!(
            s,
            r##"<path class="envelope" d="{}" fill="{color}" fill-opacity="0.22" stroke="none"/><path class="area" d="{}" fill="{color}" fill-opacity="0.3" stroke="none"/>"##,
            area(&hi, PANEL_H),
            area(&lo, PANEL_H)
        );
        let _ = writeln!(
            s,
            r##"<path class="line" d="{hi}" fill="none" stroke="{color}" stroke-width="1.5" vector-effect="non-scaling-stroke"/>"##
        );
        if res.is_some() {
            any_reserved = true;
            let r = steps(&res_cols, x_col, y_of, |c| c.max);
            let _ = writeln!(
                s,
                r##"<path class="reserved" d="{r}" fill="none" stroke="{RESERVED_COLOR}" stroke-width="1.2" stroke-dasharray="5,3" vector-effect="non-scaling-stroke"/>"##
            );
        }
        s.push_str("</svg>\n");
        let _ = writeln!(s, r##"<rect x="0" y="0" width="{PLOT_W}" height="{PANEL_H}" fill="none" stroke="#888"/>"##);
        marks(&mut s, trace, key, g.peak_bytes, g.peak_time_ns, x_of, y_of);
        x_axis(&mut s, end_ns);
        s.push_str("</g>\n");
        panels.push(PanelData {
            title,
            points: collapsed(series),
            reserved: res.map(collapsed).unwrap_or_default(),
            ymax,
        });
    }

    let mut y = top + groups.len().max(1) as f64 * (PANEL_H + GAP) - GAP + 44.0;
    y = legend(&mut s, y, &kinds_drawn, any_reserved, failures_n > 0, &colors);
    let notes = notes(trace, &lanes, groups.iter().map(|(k, _)| &trace.series[*k]), ncols);
    for (n, warn) in &notes {
        let _ = writeln!(
            s,
            r##"<text class="note" x="{LEFT}" y="{y}" fill="{}" font-size="11">{}</text>"##,
            if *warn { "#b00000" } else { "#555" },
            esc(n)
        );
        y += 16.0;
    }
    let height = (y + 10.0).ceil();
    let svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"gmt\" width=\"{WIDTH}\" height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" data-end-ns=\"{end_ns}\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n{s}</svg>\n"
    );
    let data = serde_json::json!({
        "end_ns": end_ns,
        "plot_w": PLOT_W,
        "panel_h": PANEL_H,
        "left": LEFT,
        "panels": panels,
    });
    Picture { svg, data, exe }
}

/// The phase lanes above the panels: marks, then ranges by depth, each bar labelled where it
/// is wide enough (the HTML page moves labels when zooming).
fn band(s: &mut String, lanes: &Lanes, colors: &PhaseColors, top: f64, x_of: impl Fn(u64) -> f64) {
    if lanes.kinds.is_empty() {
        return;
    }
    let h = lanes.kinds.len() as f64 * LANE_H;
    let _ = writeln!(s, r##"<g class="phases" transform="translate({LEFT},{top})">"##);
    for (i, k) in lanes.kinds.iter().enumerate() {
        let name = match k {
            None => "marks".to_string(),
            Some(0) => "ranges".to_string(),
            Some(d) if *d == MAX_DEPTH_LANES - 1 && lanes.folded > 0 => format!("nested {d}+"),
            Some(d) => format!("nested {d}"),
        };
        let _ = writeln!(
            s,
            r##"<text x="-6" y="{:.1}" text-anchor="end" fill="#555" font-size="11">{name}</text>"##,
            i as f64 * LANE_H + 12.0
        );
    }
    let _ = writeln!(
        s,
        r##"<svg class="plot" x="0" y="0" width="{PLOT_W}" height="{h}" viewBox="0 0 {PLOT_W} {h}" preserveAspectRatio="none" overflow="hidden">"##
    );
    for b in &lanes.bars {
        let x0 = x_of(b.start_ns);
        let w = (x_of(b.end_ns) - x0).max(0.5);
        let _ = writeln!(
            s,
            r##"<rect class="phase-bar" data-name="{}" data-lane="{}" data-spans="{}" x="{x0:.2}" y="{:.1}" width="{w:.2}" height="{:.1}" fill="{}" stroke="#fff" stroke-width="0.5" vector-effect="non-scaling-stroke"><title>{} ({} to {})</title></rect>"##,
            esc(&b.names.join(" / ")),
            b.lane,
            b.spans,
            b.lane as f64 * LANE_H + 1.0,
            LANE_H - 2.0,
            colors.bar(b),
            esc(&bar_title(b)),
            seconds(b.start_ns),
            seconds(b.end_ns)
        );
    }
    s.push_str("</svg>\n<g class=\"marks\">\n");
    for b in &lanes.bars {
        let (x0, x1) = (x_of(b.start_ns), x_of(b.end_ns));
        let label = b.label();
        if x1 - x0 >= label.chars().count() as f64 * 6.5 + 6.0 {
            let _ = writeln!(
                s,
                r##"<text class="phase-label" data-t0="{}" data-t1="{}" x="{:.2}" y="{:.1}" fill="#333" font-size="11"{}>{}</text>"##,
                b.start_ns,
                b.end_ns,
                x0 + 3.0,
                b.lane as f64 * LANE_H + 12.0,
                if b.mark { r#" font-style="italic""# } else { "" },
                esc(&label)
            );
        }
    }
    s.push_str("</g>\n</g>\n");
}

fn bar_title(b: &Bar) -> String {
    if b.mixed {
        let more = if b.spans as usize > b.names.len() { ", ..." } else { "" };
        format!("{} phases narrower than a pixel: {}{more}", b.spans, b.names.join(", "))
    } else {
        b.label()
    }
}

/// Behind each plot: marks as a strip along the top, outermost ranges shaded below.
fn shading(s: &mut String, lanes: &Lanes, colors: &PhaseColors, x_of: impl Fn(u64) -> f64) {
    for b in lanes.bars.iter().filter(|b| lanes.kinds[b.lane].is_none_or(|d| d == 0)) {
        let x0 = x_of(b.start_ns);
        let w = (x_of(b.end_ns) - x0).max(0.5);
        let _ = writeln!(
            s,
            r##"<rect class="phase" data-name="{}" data-mark="{}" x="{x0:.2}" y="{}" width="{w:.2}" height="{}" fill="{}" fill-opacity="{}"/>"##,
            esc(&b.names.join(" / ")),
            b.mark,
            if b.mark { 0.0 } else { 8.0 },
            if b.mark { 8.0 } else { PANEL_H - 8.0 },
            colors.bar(b),
            if b.mark { 0.95 } else { 0.55 },
        );
    }
}

/// The peak and failed allocations over a plot, positioned by time (the HTML page moves them).
fn marks(s: &mut String, trace: &Trace, key: &GroupKey, peak: u64, peak_ns: u64, x_of: impl Fn(u64) -> f64, y_of: impl Fn(u64) -> f64) {
    let _ = writeln!(s, r##"<g class="marks">"##);
    let (px, py) = (x_of(peak_ns), y_of(peak));
    let anchor = if px > PLOT_W * 0.75 { "end" } else { "start" };
    let dx = if anchor == "end" { -8.0 } else { 8.0 };
    let _ = writeln!(
        s,
        r##"<g class="peak" data-bytes="{peak}" data-time-ns="{peak_ns}" data-t="{peak_ns}" transform="translate({px:.2},{py:.2})"><circle r="5" fill="#d62728" stroke="#fff" stroke-width="1.5"/><text x="{dx}" y="{}" text-anchor="{anchor}" fill="#d62728" font-weight="bold" stroke="#fff" stroke-width="3" paint-order="stroke">peak {} at {}</text></g>"##,
        if py < 20.0 { 16.0 } else { -8.0 },
        size(peak),
        seconds(peak_ns)
    );
    for f in trace.failures.iter().filter(|f| f.device == key.device && f.kind == key.kind && f.counts()) {
        let x = x_of(f.time_ns);
        let _ = writeln!(
            s,
            r##"<g class="failure" data-size="{}" data-time-ns="{}" data-t="{}" transform="translate({x:.2},0)"><line y1="0" y2="{PANEL_H}" stroke="#d62728" stroke-dasharray="4,3"/><path d="M-5,{y1} l10,10 m0,-10 l-10,10" stroke="#d62728" stroke-width="2.5"/><text x="-8" y="{ty}" text-anchor="end" fill="#d62728">{} {} failed</text><title>{} of {} failed at {} with {} live on {}</title></g>"##,
            f.size,
            f.time_ns,
            f.time_ns,
            esc(&f.api),
            size(f.size),
            esc(&f.api),
            size(f.size),
            seconds(f.time_ns),
            size(f.live_bytes_on_device),
            crate::units::place(f.device),
            y1 = PANEL_H - 16.0,
            ty = PANEL_H - 6.0,
        );
    }
    s.push_str("</g>\n");
}

fn x_axis(s: &mut String, end_ns: u64) {
    let span_s = end_ns as f64 / 1e9;
    let ts = time_step(span_s);
    let _ = writeln!(s, r##"<g class="xaxis" transform="translate(0,{PANEL_H})">"##);
    let mut k = 0.0;
    while k <= span_s + ts * 1e-9 {
        let x = k / span_s * PLOT_W;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.2}" x2="{x:.2}" y1="0" y2="5" stroke="#444"/><text x="{x:.2}" y="18" text-anchor="middle" fill="#444">{}</text>"##,
            fmt_time(k, ts)
        );
        k += ts;
    }
    s.push_str("</g>\n");
}

/// The legend under the panels, wrapped at the picture's width; returns the next free y.
fn legend(s: &mut String, mut y: f64, kinds: &[MemKind], reserved: bool, failures: bool, colors: &PhaseColors) -> f64 {
    let mut items: Vec<(String, String)> = Vec::new();
    for &k in kinds {
        let c = kind_color(k);
        let label = match k {
            MemKind::Block => "allocated (blocks)".to_string(),
            k => format!("{} memory", k.name()),
        };
        items.push((format!(r##"<rect y="-9" width="18" height="10" fill="{c}" fill-opacity="0.5" stroke="{c}"/>"##), label));
    }
    if !kinds.is_empty() {
        items.push((
            r##"<rect y="-9" width="18" height="10" fill="#888" fill-opacity="0.22"/><rect y="-4" width="18" height="5" fill="#888" fill-opacity="0.52"/>"##.into(),
            "lighter: range within a pixel (min to max)".into(),
        ));
    }
    if reserved {
        items.push((
            format!(r##"<line x1="0" x2="18" y1="-4" y2="-4" stroke="{RESERVED_COLOR}" stroke-width="1.5" stroke-dasharray="5,3"/>"##),
            "reserved (segments of the caching allocator)".into(),
        ));
    }
    items.push((r##"<circle cx="9" cy="-4" r="4.5" fill="#d62728"/>"##.into(), "peak".into()));
    if failures {
        items.push((r##"<path d="M4,-9 l10,10 m0,-10 l-10,10" stroke="#d62728" stroke-width="2.5"/>"##.into(), "failed allocation".into()));
    }
    y = legend_row(s, y, "legend", &items);
    if !colors.0.is_empty() {
        let mut items: Vec<(String, String)> = colors
            .0
            .iter()
            .take(LEGEND_NAMES)
            .map(|n| (format!(r##"<rect y="-9" width="18" height="10" fill="{}" stroke="#999" stroke-width="0.5"/>"##, colors.of(n)), n.clone()))
            .collect();
        if colors.0.len() > LEGEND_NAMES {
            items.push((String::new(), format!("and {} more", colors.0.len() - LEGEND_NAMES)));
        }
        y = legend_row(s, y, "phases", &items);
    }
    y
}

fn legend_row(s: &mut String, mut y: f64, title: &str, items: &[(String, String)]) -> f64 {
    let _ = writeln!(s, r##"<g class="legend" data-title="{title}">"##);
    let _ = writeln!(s, r##"<text x="{}" y="{y}" text-anchor="end" fill="#555" font-size="11">{title}</text>"##, LEFT - 6.0);
    let mut x = LEFT;
    for (swatch, label) in items {
        let w = 26.0 + label.chars().count() as f64 * 6.6 + 16.0;
        if x + w > WIDTH - RIGHT && x > LEFT {
            x = LEFT;
            y += 18.0;
        }
        let _ = writeln!(
            s,
            r##"<g transform="translate({x:.1},{y})">{swatch}<text x="24" y="0" font-size="11" fill="#333">{}</text></g>"##,
            esc(label)
        );
        x += w;
    }
    s.push_str("</g>\n");
    y + 22.0
}

/// What the picture reduced, in words (`true`: something is missing, not merely merged).
fn notes<'a>(trace: &Trace, lanes: &Lanes, series: impl Iterator<Item = &'a Series>, ncols: u32) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let widest = series.map(|s| s.bucket_ns).max();
    if let Some(bucket) = widest.filter(|_| trace.events > u64::from(ncols)) {
        out.push((
            format!(
                "{} events drawn in {ncols} columns: each shows the lowest and highest live bytes in it, exactly (buckets of {}), so no peak is lost",
                trace.events,
                duration(bucket)
            ),
            false,
        ));
    }
    if lanes.merged > 0 {
        out.push((
            format!(
                "{} phase spans drawn as {} bars: {} spans narrower than a pixel merged with their neighbours{}",
                lanes.spans,
                lanes.bars.len(),
                lanes.merged,
                if lanes.bars.iter().any(|b| b.mixed) { " (grey: several names)" } else { "" }
            ),
            false,
        ));
    }
    if lanes.folded > 0 {
        out.push((format!("{} ranges nested deeper than {} levels drawn in the last lane", lanes.folded, MAX_DEPTH_LANES - 1), false));
    }
    if trace.spans_merged_within_ns > 0 {
        let merged: u64 = trace.spans.iter().map(|s| s.count - 1).sum();
        out.push((
            format!(
                "{merged} phase spans merged into their neighbours of the same name (at most {} apart): the reader keeps {MAX_SPANS} spans at most",
                duration(trace.spans_merged_within_ns)
            ),
            false,
        ));
    }
    out
}

fn duration(ns: u64) -> String {
    if ns < 1_000_000 {
        format!("{} µs", ns as f64 / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{} ms", ns as f64 / 1e6)
    } else {
        format!("{} s", ns as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;

    #[test]
    fn host_memory_panels_say_host_memory() {
        let mut b = TraceBuilder::new();
        b.call(MALLOC_HOST, 1, -1, 0x7000, 4, 0, 0).ok(MALLOC, 2, 0x1000, 100, 0);
        let svg = render(&b.load(), None, &BTreeMap::new(), false).svg;
        assert!(svg.contains(">GPU and host memory over time: demo (pid 1234)</text>"), "{svg}");
        assert!(svg.contains(r#"font-weight="bold">host memory (pinned)</text>"#), "{svg}");
        assert!(svg.contains(r#"font-weight="bold">device 0 · device memory</text>"#), "{svg}");
        assert!(svg.contains("peak 4 B · live at end 4 B · 1 allocation</text>"), "{svg}");
        assert!(!svg.contains("device -1"), "{svg}");
        // Nothing was reduced: no note says so.
        assert!(!svg.contains("class=\"note\""), "{svg}");
    }
}
