//! `gpumemtrace timeline`: live bytes over time, one panel per device and memory kind, with
//! the peak marked, failed allocations marked and phases shaded. Writes SVG, or a
//! self-contained HTML page (the same SVG plus a small script: hover read-out, wheel zoom,
//! drag to pan, double-click to reset; no network access).

use std::fmt::Write as _;

use gpumemtrace_format::MemKind;
use serde::Serialize;

use crate::model::{GroupKey, Trace};
use crate::units::{seconds, size};

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
const TOP: f64 = 70.0;
const PANEL_H: f64 = 200.0;
const GAP: f64 = 50.0;
const BOTTOM: f64 = 45.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;

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

const PHASE_COLORS: [&str; 8] = [
    "#fde2b8", "#cfe8d5", "#d6e0f5", "#f3d1dc", "#e4dcf1", "#f1ecc8", "#d3eef0", "#e9e9e9",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" step for `n` ticks over `max` bytes: a power of two times 1, 2 or 5... kept binary.
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

/// The data behind one panel, also embedded in the HTML for hover read-outs.
#[derive(Serialize)]
struct PanelData {
    title: String,
    /// (time ns, min, max, last)
    points: Vec<(u64, u64, u64, u64)>,
    ymax: u64,
}

/// Renders the timeline as SVG. `html`: the interactive page instead.
pub fn render(trace: &Trace, device: Option<i32>, html: bool) -> String {
    let groups: Vec<(&GroupKey, _)> = trace
        .groups
        .iter()
        .filter(|(k, _)| device.is_none_or(|d| d == k.device))
        .filter(|(k, _)| trace.series.contains_key(k))
        .collect();
    let end_ns = trace.end_ns.max(1);
    let n = groups.len().max(1) as f64;
    let height = TOP + n * PANEL_H + (n - 1.0) * GAP + BOTTOM;
    let x_of = |t: u64| t as f64 / end_ns as f64 * PLOT_W;

    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" id="gmt" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12" data-end-ns="{end_ns}">
<rect width="100%" height="100%" fill="#ffffff"/>
"##
    );
    let (exe, pid) = trace.process.as_ref().map_or(("?".to_string(), 0), |p| {
        (
            p.exe.rsplit('/').next().unwrap_or(&p.exe).to_string(),
            p.pid,
        )
    });
    let memory = if groups.iter().any(|(k, _)| k.kind == gpumemtrace_format::MemKind::HostPinned) {
        "GPU and host memory"
    } else {
        "GPU memory"
    };
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="24" font-size="17" font-weight="bold">{memory} over time: {} (pid {pid})</text>"##,
        esc(&exe)
    );
    let failures_n = trace
        .failures
        .iter()
        .filter(|f| device.is_none_or(|d| d == f.device) && f.counts())
        .count();
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="44" fill="#555">{} events over {}; {} failed allocation{}; shaded: phases</text>"##,
        trace.events,
        seconds(trace.end_ns),
        failures_n,
        if failures_n == 1 { "" } else { "s" }
    );
    if groups.is_empty() {
        let _ = writeln!(
            s,
            r##"<text x="{LEFT}" y="{}" fill="#555">no allocations in this trace</text>"##,
            TOP + 40.0
        );
    }

    // Phases to shade: marks and outermost ranges.
    let shaded: Vec<_> = trace.spans.iter().filter(|p| p.depth == 0).collect();
    // Colours by order of first appearance, so that neighbours differ.
    let mut phase_names: Vec<&str> = Vec::new();
    for p in &shaded {
        if !phase_names.contains(&p.name.as_str()) {
            phase_names.push(&p.name);
        }
    }
    let color_of = |name: &str| {
        let i = phase_names.iter().position(|n| *n == name).unwrap_or(0);
        PHASE_COLORS[i % PHASE_COLORS.len()]
    };

    let mut panels = Vec::new();
    for (i, (key, g)) in groups.iter().enumerate() {
        let series = &trace.series[*key];
        // Flat stretches (empty buckets carry the value forward) collapse into one point.
        let mut points: Vec<(u64, u64, u64, u64)> = Vec::new();
        for p in series.points() {
            let flat = p.1 == p.3 && p.2 == p.3;
            if flat && points.last().is_some_and(|q| q.3 == p.3) {
                continue;
            }
            points.push(p);
        }
        let ymax_data = points.iter().map(|p| p.2).max().unwrap_or(0).max(g.peak_bytes).max(1);
        let step = byte_step(ymax_data);
        let ymax = ymax_data.div_ceil(step).max(1) * step;
        let y_of = |v: u64| PANEL_H - v as f64 / ymax as f64 * PANEL_H;
        let top = TOP + i as f64 * (PANEL_H + GAP);
        let title = crate::units::group_label(key.device, key.kind).replacen(", ", " · ", 1);
        let _ = writeln!(
            s,
            r##"<g class="panel" data-device="{}" data-kind="{}" transform="translate({LEFT},{top})">"##,
            key.device,
            key.kind.name()
        );
        let _ = writeln!(
            s,
            r##"<text x="0" y="-8" font-weight="bold">{}</text><text x="{PLOT_W}" y="-8" text-anchor="end" fill="#555">peak {} · live at end {} · {}</text>"##,
            esc(&title),
            size(g.peak_bytes),
            size(g.live_bytes),
            crate::units::count(g.allocations, "allocation")
        );
        // Y grid and labels.
        let mut v = 0;
        while v <= ymax {
            let y = y_of(v);
            let _ = writeln!(
                s,
                r##"<line x1="0" x2="{PLOT_W}" y1="{y:.1}" y2="{y:.1}" stroke="#e5e5e5"/><text x="-6" y="{:.1}" text-anchor="end" fill="#444">{}</text>"##,
                y + 4.0,
                size(v)
            );
            v += step;
        }
        // The plot proper: a nested SVG that the HTML zooms by its viewBox.
        let _ = writeln!(
            s,
            r##"<svg class="plot" x="0" y="0" width="{PLOT_W}" height="{PANEL_H}" viewBox="0 0 {PLOT_W} {PANEL_H}" preserveAspectRatio="none" overflow="hidden">"##
        );
        for p in &shaded {
            let x0 = x_of(p.start_ns);
            let w = (x_of(p.end_ns) - x0).max(0.5);
            let _ = writeln!(
                s,
                r##"<rect class="phase" data-name="{}" data-mark="{}" x="{x0:.2}" y="{}" width="{w:.2}" height="{}" fill="{}" fill-opacity="{}"><title>{} ({} to {})</title></rect>"##,
                esc(&p.name),
                p.mark,
                if p.mark { 0.0 } else { 18.0 },
                if p.mark { 18.0 } else { PANEL_H - 18.0 },
                color_of(&p.name),
                if p.mark { 0.95 } else { 0.6 },
                esc(&p.name),
                seconds(p.start_ns),
                seconds(p.end_ns)
            );
        }
        // Area under the max envelope (a step chart), then the line through it.
        let mut area = format!("M0,{PANEL_H}");
        let mut line = String::new();
        for (j, &(t, _lo, hi, last)) in points.iter().enumerate() {
            let x = x_of(t);
            let xn = points
                .get(j + 1)
                .map_or(x_of(t + series.bucket_ns).min(PLOT_W), |q| x_of(q.0));
            let _ = write!(area, " L{x:.2},{:.2} L{xn:.2},{:.2}", y_of(hi), y_of(hi));
            let _ = write!(
                line,
                "{}{x:.2},{:.2} L{x:.2},{:.2} L{xn:.2},{:.2}",
                if j == 0 { "M" } else { " L" },
                y_of(hi),
                y_of(last),
                y_of(last)
            );
        }
        // The last value holds until the end of the trace.
        if let Some(&(_, _, _, last)) = points.last() {
            let _ = write!(area, " L{PLOT_W:.2},{:.2}", y_of(last));
            let _ = write!(line, " L{PLOT_W:.2},{:.2}", y_of(last));
        }
        let _ = write!(area, " L{PLOT_W:.2},{PANEL_H} L0,{PANEL_H} Z");
        let color = kind_color(key.kind);
        let _ = writeln!(
            s,
            r##"<path class="area" d="{area}" fill="{color}" fill-opacity="0.35" stroke="none"/>"##
        );
        let _ = writeln!(
            s,
            r##"<path class="line" d="{line}" fill="none" stroke="{color}" stroke-width="1.5" vector-effect="non-scaling-stroke"/>"##
        );
        s.push_str("</svg>\n");
        let _ = writeln!(
            s,
            r##"<rect x="0" y="0" width="{PLOT_W}" height="{PANEL_H}" fill="none" stroke="#888"/>"##
        );

        // Overlay marks, positioned by time (the HTML moves them when zooming).
        let _ = writeln!(s, r##"<g class="marks">"##);
        let label_w = 6.5;
        for p in &shaded {
            let x0 = x_of(p.start_ns);
            let w = x_of(p.end_ns) - x0;
            if i == 0 && w >= p.name.chars().count() as f64 * label_w + 6.0 {
                let _ = writeln!(
                    s,
                    r##"<text class="phase-label" data-t0="{}" data-t1="{}" x="{:.2}" y="{}" fill="#333" font-size="11"{}>{}</text>"##,
                    p.start_ns,
                    p.end_ns,
                    x0 + 3.0,
                    if p.mark { 13 } else { 31 },
                    if p.mark { r#" font-style="italic""# } else { "" },
                    esc(&p.name)
                );
            }
        }
        let (px, py) = (x_of(g.peak_time_ns), y_of(g.peak_bytes));
        let anchor = if px > PLOT_W * 0.75 { "end" } else { "start" };
        let dx = if anchor == "end" { -8.0 } else { 8.0 };
        let _ = writeln!(
            s,
            r##"<g class="peak" data-bytes="{}" data-time-ns="{}" data-t="{}" transform="translate({px:.2},{py:.2})"><circle r="5" fill="#d62728" stroke="#fff" stroke-width="1.5"/><text x="{dx}" y="{}" text-anchor="{anchor}" fill="#d62728" font-weight="bold">peak {} at {}</text></g>"##,
            g.peak_bytes,
            g.peak_time_ns,
            g.peak_time_ns,
            if py < 20.0 { 16.0 } else { -8.0 },
            size(g.peak_bytes),
            seconds(g.peak_time_ns)
        );
        for f in trace
            .failures
            .iter()
            .filter(|f| f.device == key.device && f.kind == key.kind && f.counts())
        {
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
        // X axis.
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
        s.push_str("</g>\n</g>\n");
        panels.push(PanelData {
            title,
            points,
            ymax,
        });
    }
    s.push_str("</svg>\n");
    if !html {
        return s;
    }
    let data = serde_json::json!({
        "end_ns": end_ns,
        "plot_w": PLOT_W,
        "panel_h": PANEL_H,
        "panels": panels,
    });
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>gpumemtrace timeline: {}</title>\n<style>{CSS}</style></head>\n<body>\n<div id=\"help\">wheel: zoom · drag: pan · double-click: reset · hover: values</div>\n<div id=\"wrap\">{s}<div id=\"tip\"></div></div>\n<script>const DATA = {};\n{JS}</script>\n</body></html>\n",
        esc(&exe),
        data.to_string().replace("</", "<\\/")
    )
}

const CSS: &str = r#"body{margin:12px;font-family:DejaVu Sans,Helvetica,Arial,sans-serif;background:#fff}
#help{color:#666;font-size:12px;margin-bottom:4px}#wrap{position:relative;display:inline-block}
#tip{position:absolute;pointer-events:none;background:rgba(255,255,255,.95);border:1px solid #999;padding:4px 6px;font-size:12px;display:none;white-space:pre}
.cursor{stroke:#333;stroke-dasharray:2,2;pointer-events:none}"#;

/// Zoom and pan by the plots' viewBox; overlay marks, phase labels and the time axis
/// follow. Hover reads the embedded data.
const JS: &str = r##"(function(){
const svg=document.getElementById('gmt'),tip=document.getElementById('tip');
const W=DATA.plot_w,H=DATA.panel_h,END=DATA.end_ns,LEFT=90;
let t0=0,t1=END;
const X=t=>(t-t0)/(t1-t0)*W;
const fmtB=b=>{const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(b>=1024&&i<4){b/=1024;i++}return i?b.toFixed(1)+' '+u[i]:b+' B'};
function niceStep(span){const raw=span/8,m=Math.pow(10,Math.floor(Math.log10(raw)));for(const k of [1,2,5,10])if(raw<=k*m)return k*m;return 10*m}
function redraw(){
  const vx=t0/END*W,vw=(t1-t0)/END*W;
  svg.querySelectorAll('svg.plot').forEach(p=>p.setAttribute('viewBox',vx+' 0 '+vw+' '+H));
  svg.querySelectorAll('g.peak,g.failure').forEach(g=>{const t=+g.dataset.t,x=X(t);
    const m=/translate\([^,]+,([^)]+)\)/.exec(g.getAttribute('transform'));
    g.setAttribute('transform','translate('+x+','+m[1]+')');g.style.display=(x<0||x>W)?'none':''});
  svg.querySelectorAll('text.phase-label').forEach(l=>{const a=X(+l.dataset.t0),b=X(+l.dataset.t1);
    l.setAttribute('x',Math.max(a,0)+3);l.style.display=(b<0||a>W||(Math.min(b,W)-Math.max(a,0))<l.textContent.length*7+6)?'none':''});
  svg.querySelectorAll('g.xaxis').forEach(ax=>{
    const s0=t0/1e9,s1=t1/1e9,st=niceStep(s1-s0),dec=st>=1?0:Math.ceil(-Math.log10(st)-1e-9);
    let h='';for(let k=Math.ceil(s0/st)*st;k<=s1+st*1e-9;k+=st){const x=(k-s0)/(s1-s0)*W;
      h+='<line x1="'+x+'" x2="'+x+'" y1="0" y2="5" stroke="#444"/><text x="'+x+'" y="18" text-anchor="middle" fill="#444">'+k.toFixed(dec)+' s</text>'}
    ax.innerHTML=h});
}
function tAt(ev){const r=svg.getBoundingClientRect(),x=(ev.clientX-r.left)*(svg.viewBox.baseVal.width/r.width)-LEFT;return {x,t:t0+x/W*(t1-t0)}}
svg.addEventListener('wheel',ev=>{const {x,t}=tAt(ev);if(x<0||x>W)return;ev.preventDefault();
  const f=ev.deltaY<0?0.8:1.25;let n0=t-(t-t0)*f,n1=t+(t1-t)*f;if(n1-n0>=END){n0=0;n1=END}
  if(n1-n0<1000)return;if(n0<0){n1-=n0;n0=0}if(n1>END){n0-=n1-END;n1=END}t0=n0;t1=n1;redraw()},{passive:false});
let drag=null;
svg.addEventListener('mousedown',ev=>{drag={x:ev.clientX,t0,t1}});
window.addEventListener('mouseup',()=>{drag=null});
svg.addEventListener('dblclick',()=>{t0=0;t1=END;redraw()});
const cursor=document.createElementNS('http://www.w3.org/2000/svg','line');cursor.setAttribute('class','cursor');svg.appendChild(cursor);
svg.addEventListener('mousemove',ev=>{
  if(drag){const r=svg.getBoundingClientRect(),dt=(ev.clientX-drag.x)*(svg.viewBox.baseVal.width/r.width)/W*(drag.t1-drag.t0);
    let n0=drag.t0-dt,n1=drag.t1-dt;if(n0<0){n1-=n0;n0=0}if(n1>END){n0-=n1-END;n1=END}t0=n0;t1=n1;redraw();}
  const {x,t}=tAt(ev);if(x<0||x>W){tip.style.display='none';cursor.setAttribute('x1',-10);cursor.setAttribute('x2',-10);return}
  let lines=['t = '+(t/1e9).toFixed(6)+' s'];
  for(const p of DATA.panels){let v=null;for(const q of p.points){if(q[0]<=t)v=q;else break}
    lines.push(p.title+': '+(v?(v[1]==v[2]?fmtB(v[3]):fmtB(v[3])+' (range '+fmtB(v[1])+' to '+fmtB(v[2])+')'):'0 B'))}
  const ph=[];for(const r of svg.querySelectorAll('rect.phase')){const a=+r.getAttribute('x'),b=a+ +r.getAttribute('width'),px=t/END*W;
    if(px>=a&&px<=b&&!ph.includes(r.dataset.name))ph.push(r.dataset.name)}
  if(ph.length)lines.push('phase: '+ph.join(' / '));
  tip.textContent=lines.join('\n');tip.style.display='block';
  const wr=document.getElementById('wrap').getBoundingClientRect();
  tip.style.left=(ev.clientX-wr.left+14)+'px';tip.style.top=(ev.clientY-wr.top+14)+'px';
  const sx=LEFT+x;cursor.setAttribute('x1',sx);cursor.setAttribute('x2',sx);cursor.setAttribute('y1',60);cursor.setAttribute('y2',svg.viewBox.baseVal.height-30)});
svg.addEventListener('mouseleave',()=>{tip.style.display='none'});
})();"##;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::*;

    #[test]
    fn host_memory_panels_say_host_memory() {
        let mut b = TraceBuilder::new();
        b.call(MALLOC_HOST, 1, -1, 0x7000, 4, 0, 0).ok(MALLOC, 2, 0x1000, 100, 0);
        let svg = render(&b.load(), None, false);
        assert!(svg.contains(">GPU and host memory over time: demo (pid 1234)</text>"), "{svg}");
        assert!(svg.contains(r#"font-weight="bold">host memory (pinned)</text>"#), "{svg}");
        assert!(svg.contains(r#"font-weight="bold">device 0 · device memory</text>"#), "{svg}");
        assert!(svg.contains("peak 4 B · live at end 4 B · 1 allocation</text>"), "{svg}");
        assert!(!svg.contains("device -1"), "{svg}");
    }
}
