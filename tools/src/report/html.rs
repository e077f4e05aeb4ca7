//! `gpumemtrace report`: one self-contained HTML page (no network: CSS, script and pictures
//! inline) with what a reader looks for first: the summary's figures per device and memory
//! kind, the timeline (allocated and reserved under PyTorch), the flame graph of the peak, the
//! sites that held the peak, the leaks ("cached, not leaked" apart), failed allocations and the
//! summary as the terminal prints it.
//!
//! Everything comes from the reports that compute it: `summary::build` (figures, sites, leaks,
//! failures), `timeline` (the picture, bounded by its width), `flamegraph` (inferno's SVG).
//! The page's size depends on the lists it shows, not on the trace's length.

use std::fmt::Write as _;
use std::path::Path;

use crate::model::timeseries::Series;
use crate::model::Trace;
use crate::report::flamegraph::{self, Level, Of};
use crate::report::sites::Site;
use crate::report::summary::{self, Options, TraceReport};
use crate::report::timeline;
use crate::symbolize::Symbolizer;
use crate::units::{count, group_label, place, seconds, size};

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// What the page shows: sites per list, the device (all when none), the phase filter's name.
pub struct Shown {
    pub top: usize,
    pub device: Option<i32>,
    pub phase: Option<String>,
}

/// The page for `trace` (read from `path`); `reserved`: the allocator's reserved bytes over
/// time per device with blocks (see `timeline::Reserved`).
pub fn render(path: &Path, trace: &Trace, reserved: &std::collections::BTreeMap<i32, Series>, o: &Shown) -> String {
    let mut sym = Symbolizer::new();
    let opts = Options { top: Some(o.top), device: o.device, phase: o.phase.clone(), ..Options::default() };
    let r = summary::build(path, trace, &mut sym, &opts);
    let mut text = Vec::new();
    let _ = summary::render(&r, &Options { frames: 4, ..opts.clone() }, &mut text);

    let pic = timeline::render(trace, o.device, reserved, true);
    let flame = flame_graph(trace, &mut sym, o);

    let mut h = String::new();
    let title = format!("GPU memory report: {} (pid {})", short_exe(&r.exe), r.pid);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\n<style>{}\n{CSS}</style></head>\n<body>\n<h1>{}</h1>\n",
        esc(&title),
        timeline::CSS,
        esc(&title)
    );
    header(&mut h, &r, trace, o);
    nav(&mut h);
    overview(&mut h, &r);
    let _ = write!(
        h,
        "<h2 id=\"timeline\">Timeline</h2>\n<p class=\"hint\">Each pixel column shows the lowest and highest live bytes in it, exactly: no peak is lost however long the trace, and the page does not grow with it.</p>\n{}",
        timeline::embed(&pic)
    );
    let _ = write!(h, "<h2 id=\"flamegraph\">Flame graph of the peak</h2>\n{flame}");
    peak_sites(&mut h, &r);
    leaks(&mut h, &r);
    failures(&mut h, &r);
    let _ = write!(
        h,
        "<h2 id=\"summary\">The summary</h2>\n<details><summary>as <code>gpumemtrace summary --frames 4</code> prints it</summary>\n<pre>{}</pre></details>\n",
        esc(&String::from_utf8_lossy(&text))
    );
    h.push_str("<p class=\"foot\">made by gpumemtrace; self-contained (no network access).</p>\n</body></html>\n");
    h
}

fn short_exe(exe: &str) -> &str {
    exe.rsplit('/').next().unwrap_or(exe)
}

fn header(h: &mut String, r: &TraceReport, trace: &Trace, o: &Shown) {
    let _ = write!(
        h,
        "<p class=\"meta\"><b>{}</b> · {} · {} events over {}",
        esc(&r.path),
        esc(&r.args.join(" ")),
        r.events,
        seconds(trace.end_ns)
    );
    if let Some(d) = o.device {
        let _ = write!(h, " · only {}", esc(&place(d)));
    }
    if let Some(p) = &o.phase {
        let _ = write!(h, " · only allocations in phase <b>{}</b>", esc(p));
    }
    h.push_str("</p>\n");
    if let Some(e) = &r.error {
        let _ = writeln!(h, "<p class=\"warn\">The trace is {}: {}; this report covers the events before it.</p>", r.status, esc(e));
    }
    if r.dropped > 0 {
        let _ = writeln!(h, "<p class=\"warn\">The tracer dropped {} events (its buffer was full): figures may be short.</p>", r.dropped);
    }
}

fn nav(h: &mut String) {
    h.push_str(
        "<p class=\"nav\"><a href=\"#overview\">overview</a> · <a href=\"#timeline\">timeline</a> · <a href=\"#flamegraph\">flame graph</a> · <a href=\"#sites\">top sites</a> · <a href=\"#leaks\">leaks</a> · <a href=\"#failures\">failed allocations</a> · <a href=\"#summary\">summary</a></p>\n",
    );
}

fn overview(h: &mut String, r: &TraceReport) {
    h.push_str("<h2 id=\"overview\">Overview</h2>\n<table><tr><th>memory</th><th>allocations</th><th>allocated</th><th>frees</th><th>failed</th><th>peak</th><th>at</th><th>live at end</th></tr>\n");
    for g in &r.groups {
        let kind = kind_of(g.kind);
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\"><b>{}</b></td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&group_label(g.device, kind)),
            g.allocations,
            size(g.allocated_bytes),
            g.frees,
            g.failed,
            size(g.peak_bytes),
            seconds(g.peak_time_ns),
            size(g.live_bytes)
        );
    }
    h.push_str("</table>\n");
    for p in &r.pools {
        let _ = writeln!(
            h,
            "<p>{}, PyTorch's caching allocator: allocated (blocks) peak <b>{}</b> at {}, reserved (segments) peak <b>{}</b> at {}; at the allocated peak {} reserved, {} of it not allocated (fragmentation).</p>",
            esc(&place(p.device)),
            size(p.allocated_peak_bytes),
            seconds(p.allocated_peak_time_ns),
            size(p.reserved_peak_bytes),
            seconds(p.reserved_peak_time_ns),
            size(p.reserved_at_allocated_peak_bytes),
            size(p.fragmentation_at_peak_bytes)
        );
    }
    if r.groups.is_empty() {
        h.push_str("<p>No allocations in this trace.</p>\n");
    }
}

/// A kind's name back to the kind (the report keeps names).
fn kind_of(name: &str) -> gpumemtrace_format::MemKind {
    use gpumemtrace_format::MemKind;
    MemKind::ALL.into_iter().find(|k| k.name() == name).unwrap_or(MemKind::Device)
}

fn sites_table(h: &mut String, sites: &[Site]) {
    if sites.is_empty() {
        h.push_str("<p class=\"none\">none</p>\n");
        return;
    }
    h.push_str("<table class=\"sites\"><tr><th>bytes</th><th>count</th><th>call site (click for its stack)</th></tr>\n");
    for s in sites {
        let mut site = if s.frames.is_empty() { "(no stack captured)".to_string() } else { s.site.describe() };
        if let Some(op) = &s.op {
            site.push_str(&format!("  [{op}]"));
        }
        if let Some(t) = &s.thread {
            site.push_str(&format!("  [thread {t}{}]", if s.during_backward { ", during backward()" } else { "" }));
        }
        let stack: Vec<String> = s.frames.iter().skip(s.site_index).map(|f| f.describe()).collect();
        let _ = writeln!(
            h,
            "<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td><details><summary>{}</summary><pre>{}</pre></details></td></tr>",
            size(s.bytes),
            s.count,
            esc(&site),
            esc(&stack.join("\n"))
        );
    }
    h.push_str("</table>\n");
}

fn peak_sites(h: &mut String, r: &TraceReport) {
    h.push_str("<h2 id=\"sites\">Top sites at the peak</h2>\n");
    for g in &r.groups {
        let label = group_label(g.device, kind_of(g.kind));
        if !g.growing_sites.is_empty() {
            let _ = writeln!(h, "<h3>{}: growing (live bytes that kept rising over the run)</h3>\n<table class=\"sites\"><tr><th>gained</th><th>call site</th><th>from, to</th></tr>", esc(&label));
            for s in &g.growing_sites {
                let _ = writeln!(
                    h,
                    "<tr><td class=\"n\">+{}</td><td>{}</td><td>{} to {}</td></tr>",
                    size(s.gained_bytes),
                    esc(&s.site.site.describe()),
                    size(s.first_bytes),
                    size(s.last_bytes)
                );
            }
            h.push_str("</table>\n");
        }
        let _ = writeln!(h, "<h3>{}: peak {} at {}</h3>", esc(&label), size(g.peak_bytes), seconds(g.peak_time_ns));
        sites_table(h, &g.peak_sites);
    }
}

fn leaks(h: &mut String, r: &TraceReport) {
    h.push_str("<h2 id=\"leaks\">Leaks</h2>\n");
    for g in r.groups.iter().filter(|g| g.kind != "vmm-reserved") {
        let label = group_label(g.device, kind_of(g.kind));
        let (what, bytes, n) = match (g.live_at_python_exit_bytes, g.live_at_python_exit_count) {
            (Some(b), Some(n)) => ("still allocated when the Python program finished", b, n),
            _ => ("still live at the end of the trace", g.live_bytes, g.live_count),
        };
        if g.kind != "block" && r.pools.iter().any(|p| p.device == g.device) {
            // The driver level under a caching allocator: its segments (the blocks above, and
            // the cache) and direct allocations (below), not leaks of their own.
            let _ = writeln!(
                h,
                "<h3>{}: live {}: {}: the caching allocator's segments and direct driver allocations (see the blocks of {} and the cache)</h3>",
                esc(&label),
                if g.live_at_python_exit_bytes.is_some() { "when the Python program finished" } else { "at the end" },
                size(bytes),
                esc(&place(g.device))
            );
            continue;
        }
        let _ = writeln!(h, "<h3>{}: {what}: {} in {}</h3>", esc(&label), size(bytes), count(n, "allocation"));
        if bytes > 0 {
            sites_table(h, &g.leak_sites);
        }
    }
    for p in &r.pools {
        let _ = writeln!(
            h,
            "<p class=\"cached\"><b>Cached, not leaked</b> ({}): {} reserved by the caching allocator and free {} ({} reserved in {}, {} allocated in {}). PyTorch keeps it for reuse; <code>torch.cuda.empty_cache()</code> returns what is in wholly free segments.</p>",
            esc(&place(p.device)),
            size(p.cached_bytes),
            if p.at == "python-exit" { "when the Python program finished" } else { "at the end of the trace" },
            size(p.reserved_bytes),
            count(p.segments, "segment"),
            size(p.allocated_bytes),
            count(p.blocks, "block")
        );
        if p.direct_bytes > 0 {
            let _ = writeln!(
                h,
                "<h3>{}: direct driver allocations (device memory that never held a block: cuBLAS workspaces, NCCL): {} in {}</h3>",
                esc(&place(p.device)),
                size(p.direct_bytes),
                count(p.direct_count, "allocation")
            );
            sites_table(h, &p.direct_sites);
        }
    }
}

fn failures(h: &mut String, r: &TraceReport) {
    h.push_str("<h2 id=\"failures\">Failed allocations</h2>\n");
    if r.failures.is_empty() {
        h.push_str("<p class=\"none\">none</p>\n");
        return;
    }
    // Out of memory first: what usually ended the run.
    let mut fs: Vec<_> = r.failures.iter().collect();
    fs.sort_by_key(|f| (f.class != "out-of-memory", f.class == "capability-probe", f.time_ns));
    h.push_str("<table><tr><th>what</th><th>call</th><th>size</th><th>result</th><th>at</th><th>live on the device then</th><th>call site</th></tr>\n");
    for f in fs {
        let what = match f.class {
            "out-of-memory" => "<b class=\"oom\">out of memory</b>",
            "capability-probe" => "capability probe (not a failed allocation)",
            _ => "other error",
        };
        let mut live = size(f.live_bytes_on_device);
        if let Some(p) = &f.pool {
            live.push_str(&format!(
                " (caching allocator: {} allocated, {} reserved, {} cached)",
                size(p.allocated_bytes),
                size(p.reserved_bytes),
                size(p.cached_bytes)
            ));
        }
        let _ = writeln!(
            h,
            "<tr><td>{what}</td><td>{} on {}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td><td>{}</td><td>{}</td></tr>",
            esc(&f.api),
            esc(&place(f.device)),
            size(f.size),
            esc(f.error.unwrap_or("")),
            seconds(f.time_ns),
            esc(&live),
            esc(&f.located.site.describe())
        );
    }
    h.push_str("</table>\n");
    for l in &r.last_failure_live {
        let _ = writeln!(
            h,
            "<h3>Live at the last out-of-memory, {}: {} in {}</h3>",
            esc(&group_label(l.device, kind_of(l.kind))),
            size(l.live_bytes),
            count(l.live_count, "allocation")
        );
        sites_table(h, &l.sites);
    }
}

/// inferno's flame graph of the peak, in a frame of its own (its script and style stay there),
/// with the page's data inline (`srcdoc`).
fn flame_graph(trace: &Trace, sym: &mut Symbolizer, o: &Shown) -> String {
    let mut sym = sym.for_trace(&trace.modules);
    let stacks = flamegraph::weighted(trace, &mut sym, Of::Peak, o.device, Level::Blocks);
    let lines = flamegraph::folded(&stacks);
    let memory = if trace.pools.is_empty() { "GPU memory" } else { "Tensors (blocks of the caching allocator)" };
    let exe = trace.process.as_ref().map_or("?", |p| short_exe(&p.exe));
    let (title, sub) = flamegraph::titles(&stacks, memory, "live at the peak", exe, o.phase.as_deref());
    let mut svg = Vec::new();
    if let Err(e) = flamegraph::svg(&lines, &title, &sub, &mut svg) {
        return format!("<p class=\"warn\">no flame graph: {}</p>\n", esc(&e.to_string()));
    }
    let svg = String::from_utf8_lossy(&svg);
    // An HTML document around the SVG: no XML prolog or doctype of its own.
    let body = svg.find("<svg").map_or(&svg[..], |i| &svg[i..]);
    let height = body
        .split_once(" height=\"")
        .and_then(|(_, r)| r.split('"').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(600.0);
    let doc = format!("<!DOCTYPE html><html><head><meta charset=\"utf-8\"></head><body style=\"margin:0\">{body}</body></html>");
    format!(
        "<p class=\"hint\">{} · click a frame to zoom, Ctrl-F or \"Search\" to find one.</p>\n<iframe class=\"flame\" title=\"flame graph\" style=\"height:{}px\" srcdoc=\"{}\"></iframe>\n",
        esc(&sub),
        height.ceil() + 4.0,
        esc(&doc)
    )
}

const CSS: &str = r#"h1{font-size:20px;margin:0 0 6px}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}h3{font-size:14px;margin:14px 0 6px}
.meta,.nav,.hint,.foot{color:#555;font-size:13px}.warn{color:#b00000;font-weight:bold}.none{color:#777}
table{border-collapse:collapse;font-size:13px;margin:4px 0}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f4f4f4}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}details summary{cursor:pointer}pre{font-size:12px;margin:4px 0;white-space:pre-wrap}
iframe.flame{width:1220px;border:0;display:block}.oom{color:#b00000}.cached{background:#f2f7ec;padding:6px 8px;border-left:3px solid #59a14f}"#;
