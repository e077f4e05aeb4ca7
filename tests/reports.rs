//! The report commands (timeline, flamegraph, export, check, diff, phases) on traces of the
//! emulated-CUDA programs, against what the programs did: `prog_phases` (NVTX ranges and
//! gpumemtrace_mark phases, see its header comment) and the demo.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const MIB: u64 = 1 << 20;

fn gmt(args: &[&str]) -> Output {
    Command::new(cli()).args(args).output().unwrap()
}

fn ok(args: &[&str]) -> String {
    let o = gmt(args);
    assert!(o.status.success(), "gpumemtrace {args:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// prog_phases traced with NVTX injection; `state_mib`: its optimizer's leaked state.
fn phases_trace(state_mib: &str) -> PathBuf {
    let shim = shim();
    let r = run_traced("prog_phases", &[state_mib], &[("NVTX_INJECTION64_PATH", shim.to_str().unwrap())]);
    assert!(r.out.status.success(), "{}", r.stderr);
    assert_eq!(r.traces.len(), 1);
    r.traces[0].clone()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn phases_come_from_nvtx_and_marks() {
    let t = phases_trace("4");
    let v: Value = serde_json::from_str(&ok(&["phases", "--json", s(&t)])).unwrap();
    let mut got: Vec<(String, u64, u64, u64)> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!((r["device"].as_i64(), r["kind"].as_str()), (Some(0), Some("device")));
            (
                r["phase"].as_str().unwrap().to_string(),
                r["allocations"].as_u64().unwrap(),
                r["allocated_bytes"].as_u64().unwrap(),
                r["failed"].as_u64().unwrap(),
            )
        })
        .collect();
    got.sort();
    let want = [
        ("attention", 2, 16 * MIB, 0), // nested in forward: its own innermost phase
        ("backward", 2, 64 * MIB, 0),  // nvtxDomainRangePushEx with a registered string
        ("eval", 0, 0, 1),             // nvtxMarkA
        ("forward", 6, 96 * MIB, 0),
        ("optimizer", 2, 8 * MIB, 0),
        ("setup", 1, 64 * MIB, 0), // gpumemtrace_mark
    ];
    let want: Vec<_> = want.iter().map(|&(n, a, b, f)| (n.to_string(), a, b, f)).collect();
    assert_eq!(got, want);
    // Spans: marks and ranges, nested depth.
    let spans = v["spans"].as_array().unwrap();
    let names = |pred: &dyn Fn(&Value) -> bool| -> Vec<&str> {
        spans.iter().filter(|s| pred(s)).map(|s| s["name"].as_str().unwrap()).collect()
    };
    assert_eq!(names(&|s| s["mark"] == true), ["setup", "epoch 1", "epoch 2", "eval"]);
    assert_eq!(names(&|s| s["depth"] == 1), ["attention", "attention"]);
    assert_eq!(names(&|s| s["mark"] == false && s["depth"] == 0), ["forward", "backward", "optimizer", "forward", "backward", "optimizer"]);

    // Without NVTX injection only the marks remain.
    let r = run_traced("prog_phases", &[], &[]);
    let v: Value = serde_json::from_str(&ok(&["phases", "--json", s(&r.traces[0])])).unwrap();
    let mut phases: Vec<&str> = v["phases"].as_array().unwrap().iter().map(|r| r["phase"].as_str().unwrap()).collect();
    phases.sort();
    assert_eq!(phases, ["epoch 1", "epoch 2", "setup"]);
}

#[test]
fn run_sets_up_nvtx_injection() {
    let dir = scratch("run-nvtx");
    let o = Command::new(cli())
        .args(["run", "--output", s(&dir), "--"])
        .arg(emu().join("prog_phases"))
        .env_remove("NVTX_INJECTION64_PATH")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let t = std::fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
    let out = ok(&["phases", s(&t)]);
    assert!(out.contains("forward") && out.contains("backward"), "{out}");
}

fn folded_total(text: &str) -> u64 {
    text.lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum()
}

#[test]
fn flamegraph_totals_equal_the_summary() {
    let r = run_traced("demo", &[], &[]);
    let t = &r.traces[0];
    let sum: Value = serde_json::from_str(&ok(&["summary", "--json", s(t)])).unwrap();
    let groups = sum["traces"][0]["groups"].as_array().unwrap();
    let total = |f: &str| groups.iter().map(|g| g[f].as_u64().unwrap()).sum::<u64>();
    let allocated = ok(&["flamegraph", s(t), "--of", "allocated", "--folded"]);
    assert_eq!(folded_total(&allocated), total("allocated_bytes"));
    assert_eq!(folded_total(&ok(&["flamegraph", s(t), "--of", "peak", "--folded"])), total("peak_bytes"));
    assert_eq!(folded_total(&ok(&["flamegraph", s(t), "--of", "leaks", "--folded"])), total("live_bytes"));
    // Stacks go from the root (group) outward-in to the call site, which the summary names.
    let line = allocated.lines().find(|l| l.contains("cache_batch")).unwrap();
    assert!(line.starts_with("device 0: device;"), "{line}");
    assert!(line.ends_with(&format!("cache_batch (demo.c:59) {}", 20 * MIB)), "{line}");
    assert!(line.contains(";main (demo.c:"), "{line}");
    // Device filter.
    let d0 = ok(&["flamegraph", s(t), "--of", "allocated", "--folded", "--device", "0"]);
    assert!(d0.lines().all(|l| l.starts_with("device 0: ")));
    // The SVG (inferno) names the sites.
    let dir = scratch("flame");
    let svg = dir.join("f.svg");
    ok(&["flamegraph", s(t), "--of", "peak", "-o", s(&svg)]);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<?xml") && text.contains("<svg"), "not an SVG");
    assert!(text.contains("load_weights (demo.c:36)") && text.contains("GPU memory live at the peak"));
}

#[test]
fn phase_filter_answers_what_a_phase_allocated() {
    let t = phases_trace("4");
    let backward = ok(&["flamegraph", s(&t), "--of", "allocated", "--folded", "--phase", "backward"]);
    assert_eq!(folded_total(&backward), 64 * MIB);
    assert!(backward.lines().all(|l| l.contains(";backward (prog_phases.c:")), "{backward}");
    // forward includes the nested attention range.
    let forward = ok(&["flamegraph", s(&t), "--of", "allocated", "--folded", "--phase", "forward"]);
    assert_eq!(folded_total(&forward), 96 * MIB + 16 * MIB);
    let opt = ok(&["flamegraph", s(&t), "--of", "leaks", "--folded", "--phase", "optimizer"]);
    assert_eq!(folded_total(&opt), 8 * MIB);
    let o = gmt(&["flamegraph", s(&t), "--folded", "--phase", "nosuch"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("no phase named \"nosuch\""));
    // summary answers the same question.
    let json: serde_json::Value = serde_json::from_str(&ok(&["summary", "--json", "--phase", "backward", s(&t)])).unwrap();
    let allocated: u64 =
        json["traces"][0]["groups"].as_array().unwrap().iter().map(|g| g["allocated_bytes"].as_u64().unwrap()).sum();
    assert_eq!(allocated, 64 * MIB);
}

#[test]
fn timeline_marks_peak_failure_and_phases() {
    let t = phases_trace("4");
    let dir = scratch("timeline");
    let (svg_path, html_path) = (dir.join("t.svg"), dir.join("t.html"));
    ok(&["timeline", s(&t), "-o", s(&svg_path)]);
    ok(&["timeline", s(&t), "-o", s(&html_path)]);
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(tags(&svg, "panel").len(), 1);
    // Peak: weights 64 + epoch 1's optimizer state 4 + activations 48 + attention 8 MiB.
    let peaks = tags(&svg, "peak");
    assert_eq!(peaks.len(), 1);
    assert_eq!(attr(peaks[0], "data-bytes"), (124 * MIB).to_string());
    assert!(svg.contains("peak 124.0 MiB at"));
    let failures = tags(&svg, "failure");
    assert_eq!(failures.len(), 1);
    assert_eq!(attr(failures[0], "data-size"), (4096 * MIB).to_string());
    assert!(svg.contains("cudaMalloc 4.0 GiB failed"));
    // The failure happens in the eval mark, after the peak.
    let (tf, tp): (u64, u64) = (attr(failures[0], "data-time-ns").parse().unwrap(), attr(peaks[0], "data-time-ns").parse().unwrap());
    assert!(tf > tp);
    let mut shaded: Vec<&str> = tags(&svg, "phase").iter().map(|t| attr(t, "data-name")).collect();
    shaded.sort();
    shaded.dedup();
    assert_eq!(shaded, ["backward", "epoch 1", "epoch 2", "eval", "forward", "optimizer", "setup"]);
    // The line never exceeds the peak and reaches it: its y values are within the panel.
    let line = tags(&svg, "line")[0];
    assert!(attr(line, "d").starts_with('M'));

    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<script>") && html.contains(&svg[..200]));
    // Self-contained: nothing to fetch.
    for needle in ["src=\"http", "href=\"http", "import ", "fetch(", "https://"] {
        assert!(!html.contains(needle), "the page refers to {needle}");
    }
    // --device filters panels.
    let none = ok(&["timeline", s(&t), "--device", "1"]);
    assert!(none.contains("no allocations in this trace"));
}

fn export(t: &Path, format: &str, extra: &[&str]) -> Vec<u8> {
    let mut args = vec!["export", s(t), "--format", format];
    args.extend_from_slice(extra);
    let o = gmt(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    o.stdout
}

#[test]
fn perfetto_export_is_valid_trace_event_json() {
    let t = phases_trace("4");
    let v: Value = serde_json::from_slice(&export(&t, "perfetto", &[])).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let (mut counters, mut instants, mut complete, mut max_live, mut allocs) = (0, 0, 0, 0, 0);
    for e in events {
        // The trace-event format: name, ph, pid, tid; ts in microseconds (not for metadata).
        assert!(e["name"].is_string() && e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
        match e["ph"].as_str().unwrap() {
            "M" => assert_eq!(e["name"], "process_name"),
            "C" => {
                counters += 1;
                assert!(e["ts"].as_f64().unwrap() >= 0.0);
                let args = e["args"].as_object().unwrap();
                assert!(!args.is_empty() && args.values().all(Value::is_u64), "{e}");
                max_live = max_live.max(args["live"].as_u64().unwrap());
            }
            "i" if e["cat"] == "alloc" => {
                // Every allocation, on its thread, with its site (tests/pictures.rs has more).
                allocs += 1;
                assert_eq!(e["s"], "t");
                assert!(e["args"]["site"].as_str().unwrap().contains("prog_phases.c:"), "{e}");
            }
            "i" => {
                instants += 1;
                assert!(matches!(e["s"].as_str(), Some("g" | "p" | "t")));
                assert_eq!(e["args"]["size"].as_u64(), Some(4096 * MIB));
                assert_eq!(e["args"]["result"], "error 2 (out of memory)");
            }
            "X" => {
                complete += 1;
                assert!(e["dur"].as_f64().unwrap() >= 0.0 && e["ts"].as_f64().unwrap() >= 0.0);
            }
            ph => panic!("unexpected phase {ph}"),
        }
    }
    assert!(counters > 10);
    assert_eq!(max_live, 124 * MIB);
    assert_eq!(instants, 1);
    assert_eq!(allocs, 13);
    assert_eq!(complete, 4 + 6 + 2); // marks, ranges, nested ranges
    assert_eq!(v["displayTimeUnit"], "ms");
}

#[test]
fn speedscope_export_follows_the_schema() {
    let r = run_traced("demo", &[], &[]);
    let t = &r.traces[0];
    for of in ["peak", "leaks", "allocated"] {
        let v: Value = serde_json::from_slice(&export(t, "speedscope", &["--of", of])).unwrap();
        assert_eq!(v["$schema"], "https://www.speedscope.app/file-format-schema.json");
        let frames = v["shared"]["frames"].as_array().unwrap();
        assert!(frames.iter().all(|f| f["name"].is_string()));
        let profiles = v["profiles"].as_array().unwrap();
        assert!(!profiles.is_empty());
        for p in profiles {
            assert_eq!((p["type"].as_str(), p["unit"].as_str()), (Some("sampled"), Some("bytes")));
            let samples = p["samples"].as_array().unwrap();
            let weights = p["weights"].as_array().unwrap();
            assert_eq!(samples.len(), weights.len());
            for smp in samples {
                assert!(smp.as_array().unwrap().iter().all(|i| (i.as_u64().unwrap() as usize) < frames.len()));
            }
            let total: u64 = weights.iter().map(|w| w.as_u64().unwrap()).sum();
            assert_eq!(p["endValue"].as_u64(), Some(total));
            assert_eq!(p["startValue"].as_u64(), Some(0));
        }
        let dev0 = profiles.iter().find(|p| p["name"].as_str().unwrap().starts_with("device 0: device")).unwrap();
        let total: u64 = dev0["weights"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).sum();
        let want = match of {
            "peak" => 128 * MIB,
            "leaks" => 20 * MIB,
            _ => 492 * MIB,
        };
        assert_eq!(total, want, "{of}");
    }
}

#[test]
fn memviz_export_loads_in_python_as_memory_viz_expects() {
    let t = phases_trace("4");
    let dir = scratch("memviz");
    let p = dir.join("snapshot.pickle");
    ok(&["export", s(&t), "--format", "memviz", "-o", s(&p)]);
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memviz_check.py");
    let o = Command::new("python3").arg(&checker).arg(&p).output().expect("python3 is needed for this test");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let facts: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(facts["peak"]["0"].as_u64(), Some(124 * MIB));
    assert_eq!(facts["live_end"]["0"].as_u64(), Some(72 * MIB)); // weights + 2 optimizer states
    assert_eq!(facts["oom"]["0"].as_u64(), Some(1));
    // 13 allocations (2 entries each), 10 frees (3 each), 1 oom.
    assert_eq!(facts["entries"]["0"].as_u64(), Some(13 * 2 + 10 * 3 + 1));
    // Frames name the program's own lines.
    let raw = std::fs::read(&p).unwrap();
    assert!(raw.windows(9).any(|w| w == b"optimizer"));
}

#[test]
fn check_gates_on_budgets() {
    let r = run_traced("demo", &[], &[]);
    let t = s(&r.traces[0]);
    // Within budget: exit 0.
    let o = gmt(&["check", t, "--max-peak", "128MiB", "--max-failed", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    // Over: exit 1, each reason readable.
    let o = gmt(&["check", t, "--max-peak", "100MiB", "--max-leaked", "0", "--max-failed", "0"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAIL device 0: peak GPU memory 128.0 MiB exceeds --max-peak 100.0 MiB by 28.0 MiB"), "{out}");
    assert!(out.contains("FAIL leaked 20.0 MiB in 5 allocations exceeds --max-leaked 0 B (device memory on device 0: 20.0 MiB)"), "{out}");
    assert!(out.contains("FAIL 1 failed allocation exceeds --max-failed 0 (first: cudaMalloc of 4.0 GiB on device 0"), "{out}");
    assert!(!out.contains('\x1b'), "colour when not a terminal");
    // A device the trace never had matches nothing: that is an error (2), not a pass.
    let o = gmt(&["check", t, "--max-leaked", "0", "--max-peak", "0", "--device", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stdout));
    // JSON for scripts.
    let o = gmt(&["check", t, "--max-peak", "100MiB", "--json"]);
    assert_eq!(o.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let c = &v["traces"][0]["checks"][0];
    assert_eq!((c["check"].as_str(), c["actual"].as_u64(), c["limit"].as_u64(), c["ok"].as_bool()), (Some("max-peak"), Some(128 * MIB), Some(100 * MIB), Some(false)));
    // No budget, or an unreadable trace: exit 2.
    assert_eq!(gmt(&["check", t]).status.code(), Some(2));
    assert_eq!(gmt(&["check", "/nonexistent.trace", "--max-peak", "1GiB"]).status.code(), Some(2));
    assert_eq!(gmt(&["check", t, "--max-peak", "lots"]).status.code(), Some(2));
}

#[test]
fn diff_shows_exactly_the_changed_site() {
    let (a, b) = (phases_trace("4"), phases_trace("6"));
    let v: Value = serde_json::from_str(&ok(&["diff", s(&a), s(&b), "--json"])).unwrap();
    let dev = &v["devices"][0];
    // The peak (epoch 2's forward) holds epoch 1's optimizer state: +2 MiB. Two states leak.
    assert_eq!(dev["peak_bytes"]["delta"].as_i64(), Some(2 * MIB as i64));
    assert_eq!(dev["live_bytes"]["delta"].as_i64(), Some(4 * MIB as i64));
    for (list, delta) in [("allocated", 4 * MIB), ("leaks", 4 * MIB), ("peak", 2 * MIB)] {
        let sites = v[list].as_array().unwrap();
        assert_eq!(sites.len(), 1, "{list}: {sites:?}");
        assert!(sites[0]["site"].as_str().unwrap().starts_with("optimizer prog_phases.c:"), "{list}: {sites:?}");
        assert_eq!(sites[0]["delta"].as_i64(), Some(delta as i64), "{list}");
    }
    let text = ok(&["diff", s(&a), s(&b)]);
    assert!(text.contains("device 0: peak 124.0 MiB -> 126.0 MiB (+2.0 MiB)"), "{text}");
    assert!(text.contains("+4.0 MiB     8.0 MiB -> 12.0 MiB"), "{text}");
    // Reversed: negative changes.
    let v: Value = serde_json::from_str(&ok(&["diff", s(&b), s(&a), "--json"])).unwrap();
    assert_eq!(v["allocated"][0]["delta"].as_i64(), Some(-(4 * MIB as i64)));
}

#[test]
fn pid_picks_a_trace_in_a_directory() {
    let r = run_traced("demo", &[], &[]);
    let dir = r.traces[0].parent().unwrap().to_path_buf();
    // A second trace in the same directory makes the choice ambiguous.
    std::fs::copy(&r.traces[0], dir.join("gpumemtrace-1.trace")).unwrap();
    let o = gmt(&["timeline", s(&dir)]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("pick one with --pid"));
    let out = ok(&["flamegraph", s(&dir), "--pid", "1", "--folded"]);
    assert!(out.contains("cache_batch"));
}
