//! Pictures and exports people look at: the HTML report, the timeline (bounded, nested phases,
//! a legend, saying what it reduced), output formats refused by name, memory_viz pickles no
//! larger than PyTorch's own, and exact Perfetto counters with allocation events carrying their
//! site. On hand-built traces (where every byte is known) and on the emulated programs.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpumemtrace_format::{header, Api, Encoder, Event, MemKind, Op, Phase, PhaseOp, Process, Record, Stack};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const MALLOC: u32 = 1;
const FREE: u32 = 2;
const MALLOC_HOST: u32 = 3;
const FREE_HOST: u32 = 4;

fn gmt(args: &[&str]) -> Output {
    Command::new(cli()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = gmt(args);
    assert!(o.status.success(), "gpumemtrace {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A trace in memory: header, Process, Api table, then what is added.
struct Trace {
    bytes: Vec<u8>,
    enc: Encoder,
    events: u64,
}

impl Trace {
    fn new() -> Trace {
        let mut t = Trace { bytes: header().to_vec(), enc: Encoder::new(), events: 0 };
        t.rec(Record::Process(Process {
            pid: 777,
            ppid: 1,
            exe: "/usr/bin/trainer".into(),
            args: vec!["trainer".into()],
            max_frames: 64,
            ..Process::default()
        }));
        for (id, name, kind, op) in [
            (MALLOC, "cudaMalloc", MemKind::Device, Op::Alloc),
            (FREE, "cudaFree", MemKind::Device, Op::Free),
            (MALLOC_HOST, "cudaMallocHost", MemKind::HostPinned, Op::Alloc),
            (FREE_HOST, "cudaFreeHost", MemKind::HostPinned, Op::Free),
        ] {
            t.rec(Record::Api(Api { id, name: name.into(), kind, op }));
        }
        t
    }

    fn rec(&mut self, r: Record) -> &mut Self {
        self.enc.encode(&r, &mut self.bytes);
        self
    }

    fn event(&mut self, api: u32, t: u64, device: i32, addr: u64, size: u64, stack: u32) -> &mut Self {
        self.events += 1;
        self.rec(Record::Event(Event { api, time_ns: t, device, addr, size, stack, tid: 1, ..Event::default() }))
    }

    fn phase(&mut self, t: u64, op: PhaseOp, name: &str) -> &mut Self {
        self.rec(Record::Phase(Phase { time_ns: t, tid: 1, op, name: name.into() }))
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.bytes).unwrap();
        p
    }
}

/// A deterministic pseudo-random sequence (no dependency for it).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// `n` allocate/free pairs of up to `slots` live buffers on device 0, with `stacks` distinct
/// stacks of `depth` frames that share all frames but the innermost; a 1-byte-wide spike of
/// `spike` bytes at event `n`; phases: `steps` ranges "step", each with a nested "forward".
fn long_run(n: u64, stacks: u32, depth: usize, spike: u64, steps: u64) -> Trace {
    let mut t = Trace::new();
    for id in 1..=stacks {
        let mut frames = vec![0x10_0000 + u64::from(id) * 0x10];
        frames.extend((1..depth as u64).map(|i| 0x20_0000 + i * 0x40));
        t.rec(Record::Stack(Stack { id, frames }));
    }
    let mut rng = Lcg(7);
    let mut live: Vec<Option<u64>> = vec![None; 64];
    let mut time = 1_000u64;
    let per_step = (2 * n / steps.max(1)).max(4);
    for i in 0..2 * n {
        if steps > 0 && i % per_step == 0 {
            t.phase(time, PhaseOp::Push, "step");
            t.phase(time + 1, PhaseOp::Push, "forward");
        }
        let slot = rng.next(64) as usize;
        let addr = 0x7f00_0000_0000 + slot as u64 * 0x1000_0000;
        match live[slot].take() {
            Some(_) => {
                t.event(FREE, time, 0, addr, 0, 1 + rng.next(u64::from(stacks)) as u32);
            }
            None => {
                let size = (1 + rng.next(16)) * MIB;
                live[slot] = Some(size);
                t.event(MALLOC, time, 0, addr, size, 1 + rng.next(u64::from(stacks)) as u32);
            }
        }
        if i == n {
            // Allocated and freed within a nanosecond: narrower than any pixel.
            t.event(MALLOC, time + 1, 0, 0x1, spike, 1).event(FREE, time + 2, 0, 0x1, 0, 1);
        }
        time += 10;
        if steps > 0 && i % per_step == per_step - 1 {
            t.phase(time, PhaseOp::Pop, "");
            t.phase(time + 1, PhaseOp::Pop, "");
        }
    }
    t
}

/// The smallest y (the highest point) of a path's coordinates.
fn top_of(d: &str) -> f64 {
    d.split(['M', 'L', ' '])
        .filter_map(|p| p.split_once(','))
        .map(|(_, y)| y.parse::<f64>().unwrap())
        .fold(f64::MAX, f64::min)
}

/// Asserts the page needs nothing from the network.
fn self_contained(page: &str) {
    // (Addresses in comments and messages, such as inferno's credits, fetch nothing.)
    for needle in ["src=\"http", "href=\"http", "src='http", "url(http", "url(&quot;http", "@import", "fetch(", "XMLHttpRequest", "<link"] {
        assert!(!page.contains(needle), "the page refers to {needle}");
    }
    // The same inside the flame graph's frame, whose document is an escaped attribute.
    for needle in ["src=&quot;http", "href=&quot;http", "xlink:href=\"http", "xlink:href=&quot;http", "<script src", "&lt;script src"] {
        assert!(!page.contains(needle), "the page refers to {needle}");
    }
}

#[test]
fn the_timeline_of_a_long_run_is_bounded_keeps_its_peak_and_says_what_it_reduced() {
    let dir = scratch("timeline-long");
    // 200,000 events, a 1-byte-wide spike of 3 GiB, 10,527 steps (one every 19 events) with
    // a nested range each: 21,054 spans, more than the reader keeps (the first 20,000 that close).
    let spike = 3 << 30;
    let t = long_run(100_000, 8, 4, spike, 10_001).write(&dir, "long.trace");
    let svg_path = dir.join("t.svg");
    ok(&["timeline", s(&t), "-o", s(&svg_path)]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.len() < 400_000, "the SVG is {} bytes", svg.len());

    // The peak is the spike, and the drawn line reaches it: the line's highest point is the
    // peak mark's height.
    let peak = tags(&svg, "peak")[0];
    let summary: Value = serde_json::from_str(&ok(&["summary", "--json", s(&t)])).unwrap();
    let g = &summary["traces"][0]["groups"][0];
    assert_eq!(attr(peak, "data-bytes").parse::<u64>().unwrap(), g["peak_bytes"].as_u64().unwrap());
    assert!(g["peak_bytes"].as_u64().unwrap() > spike);
    let py: f64 = attr(peak, "transform").split(',').nth(1).unwrap().trim_end_matches(')').parse().unwrap();
    let line = tags(&svg, "line")[0];
    assert!((top_of(attr(line, "d")) - py).abs() < 0.01, "line top {} vs peak {py}", top_of(attr(line, "d")));
    // ... for the spike's pixel or two only: the rest of the run is drawn at its own height.
    let pts: Vec<(f64, f64)> = attr(line, "d")
        .split(['M', 'L', ' '])
        .filter_map(|p| p.split_once(','))
        .map(|(x, y)| (x.parse().unwrap(), y.parse().unwrap()))
        .collect();
    let at_peak: f64 = pts.windows(2).filter(|w| (w[0].1 - py).abs() < 0.01 && (w[1].1 - py).abs() < 0.01).map(|w| w[1].0 - w[0].0).sum();
    assert!(at_peak <= 2.0, "the line is at the peak for {at_peak} pixels");

    // Phases: two lanes (ranges and the nested forward), a legend naming both, and bars
    // bounded by the width (1080 pixels), not by the spans.
    let bars = tags(&svg, "phase-bar");
    assert!(!bars.is_empty() && bars.len() <= 2 * 1081, "{} bars", bars.len());
    let lanes: std::collections::BTreeSet<&str> = bars.iter().map(|b| attr(b, "data-lane")).collect();
    assert_eq!(lanes.into_iter().collect::<Vec<_>>(), ["0", "1"]);
    assert!(svg.contains(">ranges</text>") && svg.contains(">nested 1</text>"));
    let legend = &svg[svg.find("data-title=\"phases\"").unwrap()..];
    assert!(legend.contains(">step</text>") && legend.contains(">forward</text>"));
    let drawn: u64 = bars.iter().map(|b| attr(b, "data-spans").parse::<u64>().unwrap()).sum();
    assert_eq!(drawn, 21_054, "every span of the run is in a bar, none dropped");

    // The picture says what it reduced (nothing is missing: past the reader's 20000 spans,
    // neighbours of one name merge).
    let notes: Vec<&str> = svg.lines().filter(|l| l.contains("class=\"note\"")).collect();
    assert_eq!(notes.len(), 3, "{notes:#?}");
    assert!(notes[0].contains("200002 events drawn in 1080 columns") && notes[0].contains("no peak is lost"), "{}", notes[0]);
    assert!(notes[1].contains("21054 phase spans drawn as") && notes[1].contains("narrower than a pixel merged"), "{}", notes[1]);
    assert!(notes[2].contains("phase spans merged into their neighbours of the same name"), "{}", notes[2]);

    // The HTML page: the same, self-contained, bounded.
    let html_path = dir.join("t.html");
    ok(&["timeline", s(&t), "-o", s(&html_path)]);
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<script>"));
    assert!(html.len() < 1_500_000, "the page is {} bytes", html.len());
    self_contained(&html);

    // The report: bounded too, with the same peak.
    let report = ok(&["report", s(&t)]);
    assert!(report.len() < 1_500_000, "the report is {} bytes", report.len());
    assert!(report.contains(&format!("data-bytes=\"{}\"", g["peak_bytes"])));
    self_contained(&report);
}

#[test]
fn nested_phases_get_lanes_and_the_legend_names_every_phase() {
    let r = run_traced("prog_phases", &["4"], &[("NVTX_INJECTION64_PATH", shim().to_str().unwrap())]);
    assert!(r.out.status.success(), "{}", r.stderr);
    let svg = ok(&["timeline", s(&r.traces[0])]);
    let bars = tags(&svg, "phase-bar");
    let by_lane = |lane: &str| -> Vec<&str> {
        let mut v: Vec<&str> = bars.iter().filter(|b| attr(b, "data-lane") == lane).map(|b| attr(b, "data-name")).collect();
        v.sort();
        v.dedup();
        v
    };
    // Marks, then ranges, then the range nested in forward.
    assert_eq!(by_lane("0"), ["epoch 1", "epoch 2", "eval", "setup"]);
    assert_eq!(by_lane("1"), ["backward", "forward", "optimizer"]);
    assert_eq!(by_lane("2"), ["attention"]);
    assert_eq!(bars.len(), 4 + 6 + 2, "4 marks, 6 ranges, attention twice");
    let legend = &svg[svg.find("data-title=\"phases\"").unwrap()..];
    for name in ["setup", "epoch 1", "epoch 2", "forward", "attention", "backward", "optimizer", "eval"] {
        assert!(legend.contains(&format!(">{name}</text>")), "{name} is in the legend");
    }
    let legend = &svg[svg.find("data-title=\"legend\"").unwrap()..];
    assert!(legend.contains(">device memory</text>") && legend.contains(">peak</text>") && legend.contains(">failed allocation</text>"));
    // Nothing was reduced: no note.
    assert!(!svg.contains("class=\"note\""));
}

#[test]
fn the_html_report_has_allocated_and_reserved_the_flame_graph_sites_leaks_and_the_cache() {
    let r = run_torch_python("report-torch", "20");
    assert!(r.out.status.success(), "{}", r.stderr);
    let dir = scratch("report");
    let p = dir.join("report.html");
    ok(&["report", s(&r.traces[0]), "-o", s(&p)]);
    let page = std::fs::read_to_string(&p).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    self_contained(&page);
    for section in ["overview", "timeline", "flamegraph", "sites", "leaks", "failures", "summary"] {
        assert!(page.contains(&format!("<h2 id=\"{section}\">")), "section {section}");
    }
    // Allocated (blocks) and reserved (segments) on one panel, both peaks named.
    let panels = tags(&page, "panel");
    assert_eq!(panels.iter().map(|p| attr(p, "data-kind")).collect::<Vec<_>>(), ["block", "device"]);
    assert_eq!(tags(&page, "reserved").len(), 1);
    assert!(page.contains("allocated peak 61.0 MiB · reserved peak 62.0 MiB"), "the blocks' panel names both peaks");
    // The flame graph of the peak: inferno's SVG in a frame of its own, its total the peak.
    assert!(page.contains("<iframe class=\"flame\""));
    let summary: Value = serde_json::from_str(&ok(&["summary", "--json", s(&r.traces[0])])).unwrap();
    let blocks = &summary["traces"][0]["groups"][0];
    assert_eq!(blocks["kind"], "block");
    let peak = blocks["peak_bytes"].as_u64().unwrap();
    assert_eq!(peak, 61 * MIB + 512);
    assert!(page.contains(&format!("61.0 MiB in total ({peak} bytes)")));
    // Sites, leaks and the cache, as the summary has them.
    assert!(page.contains("train_step torch_train.py:36"));
    assert!(page.contains("still allocated when the Python program finished: 52.0 MiB in 23 allocations"));
    assert!(page.contains("<b>Cached, not leaked</b> (device 0): 10.0 MiB reserved by the caching allocator and free"));
    assert!(page.contains("the caching allocator's segments and direct driver allocations"), "segments are not listed as leaks");
    assert!(page.contains("<h2 id=\"failures\">Failed allocations</h2>\n<p class=\"none\">none</p>"));
}

#[test]
fn the_html_report_lists_out_of_memory_with_its_site_and_what_was_live() {
    let r = run_traced("demo", &[], &[]);
    let page = ok(&["report", s(&r.traces[0])]);
    let failures = &page[page.find("<h2 id=\"failures\">").unwrap()..];
    assert!(failures.contains("<b class=\"oom\">out of memory</b>"));
    assert!(failures.contains("<td>cudaMalloc on device 0</td><td class=\"n\">4.0 GiB</td>"));
    assert!(failures.contains("try_huge_allocation demo.c:73"));
    assert!(failures.contains("Live at the last out-of-memory, device 0, device memory: 84.0 MiB"));
    let leaks = &page[page.find("<h2 id=\"leaks\">").unwrap()..];
    assert!(leaks.contains("still live at the end of the trace: 20.0 MiB in 5 allocations"));
    assert!(leaks.contains("cache_batch demo.c:59"));
}

#[test]
fn pictures_refuse_formats_they_do_not_write() {
    let r = run_traced("demo", &[], &[]);
    let t = s(&r.traces[0]).to_string();
    let dir = scratch("formats");
    for (cmd, file, want) in [
        ("timeline", "t.png", "timeline writes .svg, .html or .htm only, not .png; for a PNG"),
        ("timeline", "t.pdf", "timeline writes .svg, .html or .htm only, not .pdf"),
        ("timeline", "t", "timeline writes .svg, .html or .htm only, not a file without an extension"),
        ("flamegraph", "f.png", "flamegraph (without --folded) writes .svg only, not .png"),
        ("report", "r.svg", "report writes .html or .htm only, not .svg"),
    ] {
        let out = dir.join(file);
        let o = gmt(&[cmd, &t, "-o", s(&out)]);
        assert_eq!(o.status.code(), Some(2), "{cmd} -o {file}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(want), "{cmd} -o {file}: {err}");
        assert!(!out.exists(), "{cmd} -o {file} wrote nothing");
    }
    // Upper case is the same format; folded stacks go anywhere.
    ok(&["timeline", &t, "-o", s(&dir.join("T.SVG"))]);
    ok(&["flamegraph", &t, "--folded", "-o", s(&dir.join("f.txt"))]);
}

/// Python's pickle: loads the snapshot, and measures the pickle of the same objects shaped
/// as PyTorch's `_snapshot()` gives them (one dict per distinct frame, shared by every stack
/// holding it, as torch's py_symbolize makes them; a fresh list of frames per entry), dumped
/// as `torch.cuda.memory._dump_snapshot` does (`pickle.dump`, default protocol).
const TORCH_SIZE: &str = r#"
import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
canon = {}
def frames(fs):
    return [canon.setdefault((f["filename"], f["line"], f["name"]), dict(f)) for f in fs]
n = 0
for s in d["segments"]:
    s["frames"] = frames(s["frames"])
    for b in s["blocks"]:
        b["frames"] = frames(b["frames"])
for t in d["device_traces"]:
    for e in t:
        e["frames"] = frames(e["frames"])
        n += 1
print(len(pickle.dumps(d)), n, len(canon))
"#;

#[test]
fn memviz_pickles_of_repeated_stacks_are_no_larger_than_torch_s_own() {
    let dir = scratch("memviz-size");
    // 20,000 allocations and frees through 50 stacks of 40 frames sharing 39.
    let t = long_run(20_000, 50, 40, 1 << 30, 0).write(&dir, "r.trace");
    let p = dir.join("snapshot.pickle");
    ok(&["export", s(&t), "--format", "memviz", "-o", s(&p)]);
    let ours = std::fs::metadata(&p).unwrap().len();

    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memviz_check.py");
    let o = Command::new("python3").arg(&checker).arg(&p).output().expect("python3 is needed for this test");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let facts: Value = serde_json::from_slice(&o.stdout).unwrap();
    let entries = facts["entries"]["0"].as_u64().unwrap();
    // Each allocation is segment_alloc + alloc, each free free_requested + free_completed +
    // segment_free: 2 + 3 entries per pair, and the spike's pair.
    assert!(entries > 40_000, "{entries} entries");

    let o = Command::new("python3").arg("-c").arg(TORCH_SIZE).arg(&p).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let v: Vec<u64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (torch, n, distinct_frames) = (v[0], v[1], v[2]);
    assert_eq!(n, entries);
    assert_eq!(distinct_frames, 50 + 39, "50 innermost frames and the 39 shared ones");
    assert!(ours <= torch, "ours {ours} bytes, torch's shape {torch} bytes");
    // Without sharing each entry would carry its 40 frames (3 keys, 2 strings, a line: over
    // 25 bytes each even with every string memoized): 1,000 bytes an entry.
    assert!(ours < entries * 40 * 25 / 20, "{ours} bytes for {entries} entries");
    println!("memviz pickle: {ours} bytes, torch's shape {torch} bytes, {entries} entries");
}

/// Live bytes per group after each event, replayed here from the trace's own events, as the
/// sequence of distinct values a counter track shows.
fn replayed_live(t: &TraceData) -> std::collections::BTreeMap<(i32, MemKind), Vec<u64>> {
    let mut live: std::collections::HashMap<u64, (i32, MemKind, u64)> = Default::default();
    let mut now: std::collections::BTreeMap<(i32, MemKind), u64> = Default::default();
    let mut tracks: std::collections::BTreeMap<(i32, MemKind), Vec<u64>> = Default::default();
    for e in &t.events {
        let api = t.api(e);
        let key = match api.op {
            Op::Alloc => {
                let key = (e.device, api.kind);
                live.insert(e.addr, (e.device, api.kind, e.size));
                *now.entry(key).or_default() += e.size;
                key
            }
            _ => {
                let Some((d, k, size)) = live.remove(&e.addr) else { continue };
                *now.get_mut(&(d, k)).unwrap() -= size;
                (d, k)
            }
        };
        let track = tracks.entry(key).or_default();
        if track.last() != Some(&now[&key]) {
            track.push(now[&key]);
        }
    }
    tracks
}

#[test]
fn perfetto_counters_are_exact_and_allocations_carry_their_site() {
    let dir = scratch("perfetto");
    let mut tr = long_run(2_000, 3, 5, 64 * MIB, 40);
    // Host memory too: its own track.
    tr.event(MALLOC_HOST, 10_000_000, -1, 0x5000, 4096, 2).event(FREE_HOST, 10_000_100, -1, 0x5000, 0, 2);
    let t = tr.write(&dir, "p.trace");
    let out = ok(&["export", s(&t), "--format", "perfetto"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let events = v["traceEvents"].as_array().unwrap();

    let mut tracks: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    let mut allocs = Vec::new();
    for e in events {
        match (e["ph"].as_str().unwrap(), e["cat"].as_str()) {
            ("C", _) => tracks.entry(e["name"].as_str().unwrap().to_string()).or_default().push(e["args"]["live"].as_u64().unwrap()),
            ("i", Some("alloc")) => allocs.push(e),
            _ => {}
        }
    }
    let want = replayed_live(&read_trace(&t));
    assert_eq!(tracks.len(), 2);
    assert_eq!(tracks["device 0 device memory (bytes)"], want[&(0, MemKind::Device)], "a sample at every change, exact");
    assert_eq!(tracks["host memory (pinned) (bytes)"], [4096, 0]);
    assert!(tracks["device 0 device memory (bytes)"].len() > 2_000);

    // The peak counter value is the summary's peak.
    let summary: Value = serde_json::from_str(&ok(&["summary", "--json", s(&t)])).unwrap();
    let peak = summary["traces"][0]["groups"].as_array().unwrap().iter().find(|g| g["kind"] == "device").unwrap()["peak_bytes"].as_u64();
    assert_eq!(tracks["device 0 device memory (bytes)"].iter().max().copied(), peak);

    // One instant event per allocation, on its thread, with its size and site.
    let n_allocs = read_trace(&t).events.iter().filter(|e| e.api == MALLOC || e.api == MALLOC_HOST).count();
    assert_eq!(allocs.len(), n_allocs);
    for a in &allocs {
        assert_eq!((a["s"].as_str(), a["tid"].as_u64()), (Some("t"), Some(1)));
        let stack = a["args"]["stack"].as_array().unwrap();
        assert_eq!(stack.len(), 5, "the five frames of its stack");
        assert_eq!(a["args"]["site"], stack[0]);
        assert!(a["args"]["size"].as_u64().unwrap() > 0 && a["args"]["addr"].as_str().unwrap().starts_with("0x"));
    }
}
