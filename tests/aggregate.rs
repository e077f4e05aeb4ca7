//! Aggregate mode (`GPUMEMTRACE_AGGREGATE=1`, `gpumemtrace run --aggregate`): the trace holds
//! per-site totals, peaks and the live set instead of every event. The same program traced both
//! ways gives the same summary; the aggregate trace stays small however long the loop; reports
//! that need the events in time order refuse it.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::*;
use serde_json::Value;

const AGG: (&str, &str) = ("GPUMEMTRACE_AGGREGATE", "1");
const MIB: u64 = 1 << 20;

/// What a summary says that an aggregate trace must say alike: per group its totals, peak, live
/// set and sites, per device its peak and live bytes, the failures.
fn comparable(json: &Value) -> Value {
    let t = &json["traces"][0];
    let sites = |v: &Value| -> Value {
        let mut v = v.clone();
        strip(&mut v);
        v
    };
    let groups: Vec<Value> = t["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            serde_json::json!({
                "device": g["device"], "kind": g["kind"], "allocations": g["allocations"],
                "allocated_bytes": g["allocated_bytes"], "frees": g["frees"], "failed": g["failed"],
                "peak_bytes": g["peak_bytes"], "peak_sites": sites(&g["peak_sites"]),
                "live_bytes": g["live_bytes"], "live_count": g["live_count"], "leak_sites": sites(&g["leak_sites"]),
                "live_at_python_exit_bytes": g["live_at_python_exit_bytes"],
            })
        })
        .collect();
    let devices: Vec<Value> = t["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| serde_json::json!({"device": d["device"], "peak_bytes": d["peak_bytes"], "live_bytes": d["live_bytes"]}))
        .collect();
    let failures: Vec<Value> = t["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            serde_json::json!({"api": f["api"], "device": f["device"], "size": f["size"], "result": f["result"],
                "live_bytes_on_device": f["live_bytes_on_device"]})
        })
        .collect();
    serde_json::json!({"groups": groups, "devices": devices, "failures": failures, "events": t["events"]})
}

/// Leaves out of a site what differs between two runs: return addresses (the program loads at
/// a random address).
fn strip(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("address");
            m.values_mut().for_each(strip);
        }
        Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

/// `prog args` traced in full and in aggregate mode: both summaries, both traces' sizes.
fn both_ways(prog: &str, args: &[&str]) -> ((Value, u64), (Value, u64)) {
    let one = |env: &[(&str, &str)]| {
        let run = run_traced(prog, args, env);
        assert!(run.out.status.success(), "{prog}: {}", run.stderr);
        assert_eq!(run.traces.len(), 1, "{}", run.stderr);
        let size = std::fs::metadata(&run.traces[0]).unwrap().len();
        (summary_json(&run.traces[0]), size)
    };
    (one(&[]), one(&[AGG]))
}

fn cli_on(args: &[&str], trace: &Path) -> std::process::Output {
    Command::new(cli()).args(args).arg(trace).output().unwrap()
}

#[test]
fn the_demo_summarized_from_an_aggregate_trace_is_the_full_traces_summary() {
    let ((full, _), (agg, _)) = both_ways("demo", &[]);
    let (f, a) = (comparable(&full), comparable(&agg));
    assert_eq!(a, f);
    // Not trivially equal: the demo's peak, leaks, pinned memory and failure are all there.
    let dev = f["groups"].as_array().unwrap().iter().find(|g| g["kind"] == "device").unwrap();
    assert_eq!(dev["failed"], 1);
    assert_eq!(dev["leak_sites"][0]["bytes"], 20 * MIB, "five 4 MiB batch caches leak");
    assert!(dev["peak_bytes"].as_u64().unwrap() >= 64 * MIB + 48 * MIB);
    assert_eq!(f["failures"][0]["size"], 4096 * MIB);
    // What was live on the device as it failed: the writer says it (an AggFailure record),
    // the reader of an aggregate trace replays no live set that could.
    assert_eq!(f["failures"][0]["live_bytes_on_device"], 84 * MIB);
    assert!(agg["traces"][0]["notices"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().starts_with("aggregate trace")));
}

#[test]
fn four_threads_summarized_from_an_aggregate_trace_match_the_full_trace() {
    // Enough pairs that the emulated driver hands a freed address to another thread before the
    // free is numbered: the free then comes after that allocation in call order.
    let ((full, _), (agg, _)) = both_ways("prog_threads", &["4", "20000"]);
    let (f, a) = (comparable(&full), comparable(&agg));
    assert_eq!(a, f);
    let g = &f["groups"][0];
    assert_eq!(agg["traces"][0]["unknown_frees"], serde_json::json!([]));
    assert_eq!((g["allocations"].as_u64(), g["frees"].as_u64(), g["live_count"].as_u64()), (Some(80004), Some(80000), Some(4)));
}

#[test]
fn an_aggregate_trace_of_a_long_loop_is_a_small_fraction_of_the_full_one() {
    let ((full, full_size), (agg, agg_size)) = both_ways("prog_threads", &["1", "100000"]);
    assert_eq!(comparable(&agg), comparable(&full));
    assert_eq!(agg["traces"][0]["groups"][0]["allocations"], 100_001);
    eprintln!("100000 pairs: full trace {full_size} bytes, aggregate {agg_size} bytes");
    assert!(agg_size * 20 < full_size, "aggregate {agg_size} bytes, full {full_size} bytes");
}

#[test]
fn reports_that_need_the_time_order_refuse_an_aggregate_trace_with_status_2() {
    let run = run_traced("demo", &[], &[AGG]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let trace = &run.traces[0];
    for args in [&["timeline", "-o", "/dev/null"][..], &["export", "--format", "perfetto", "-o", "/dev/null"], &["export", "--format", "memviz", "-o", "/dev/null"]] {
        let out = cli_on(args, trace);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("this trace is aggregate (GPUMEMTRACE_AGGREGATE=1)"), "{args:?}: {err}");
    }
    // A filter on phases or time cannot apply either.
    let out = cli_on(&["summary", "--phase", "train"], trace);
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--phase, --module, --from and --to cannot apply"));
    // What the summaries hold works.
    for args in [&["flamegraph", "--folded"][..], &["tree"], &["check", "--max-leaked", "1GiB"], &["summary"], &["phases"]] {
        let out = cli_on(args, trace);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!out.stdout.is_empty(), "{args:?}");
    }
    let out = cli_on(&["check", "--max-leaked", "1MiB"], trace);
    assert_eq!(out.status.code(), Some(1), "20 MiB leaked is over a 1 MiB budget");
}

#[test]
fn run_aggregate_traces_in_aggregate_mode() {
    let dir = scratch("run-aggregate");
    let out = Command::new(cli())
        .args(["run", "--aggregate", "--json", "--output"])
        .arg(&dir)
        .arg("--")
        .arg(emu().join("demo"))
        .env("GPUMEMTRACE_LIB", shim())
        .env("EMUCUDA_DEVICES", "2")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run = finish(out, dir, 0);
    let t = run.trace();
    assert!(t.events.iter().all(|e| e.result != 0), "only the failure is an event: {:?}", t.events);
    let dump = Command::new(cli()).arg("dump").arg(&run.traces[0]).output().unwrap();
    let dump = String::from_utf8_lossy(&dump.stdout);
    assert!(dump.lines().any(|l| l.contains("\"aggregate_start\"") && l.contains("\"final\":true")), "{dump}");
}

#[test]
fn a_fatal_signal_leaves_a_summary_of_what_was_live() {
    let run = run_traced("prog_lifecycle", &["segv"], &[AGG]);
    assert_eq!(run.out.status.signal(), Some(libc::SIGSEGV), "{}", run.stderr);
    let json = summary_json(&run.traces[0]);
    assert_eq!(json["traces"][0]["groups"][0]["live_bytes"], 17 * MIB);
    assert_eq!(json["traces"][0]["groups"][0]["allocations"], 2);
}

#[test]
fn a_process_killed_mid_run_leaves_its_last_periodic_summary() {
    // The first periodic summary comes 2 s after the start: wait for it in the file, then kill.
    let dir = scratch("agg-kill");
    let mut child = Command::new(emu().join("prog_threads"))
        .args(["1", "100000000"])
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("GPUMEMTRACE_AGGREGATE", "1")
        .env("GPUMEMTRACE_QUIET", "1")
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let trace = || std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "trace"));
    let mut summarized = false;
    for _ in 0..600 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        if let Some(t) = trace() {
            let dump = Command::new(cli()).arg("dump").arg(&t).output().unwrap();
            if String::from_utf8_lossy(&dump.stdout).contains("\"aggregate_end\":{\"seq\":1}") {
                summarized = true;
                break;
            }
        }
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(summarized, "no periodic summary within 30 s");
    let json = summary_json(&trace().unwrap());
    let t = &json["traces"][0];
    let g = &t["groups"][0];
    let (allocs, frees) = (g["allocations"].as_u64().unwrap(), g["frees"].as_u64().unwrap());
    assert!(allocs > 0, "{json}");
    // One pair in flight at most: its allocation may be summarized before its free.
    assert!(allocs == frees || allocs == frees + 1, "{allocs} allocations, {frees} frees");
    assert_eq!(g["live_count"].as_u64().unwrap(), allocs - frees);
    assert!(t["notices"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("before the process finished its trace")), "{json}");
}

/// `tests/python/torch_train.py 3` on the emulated PyTorch, as `common::run_torch_python` runs
/// it, with GPUMEMTRACE_AGGREGATE set for it alone (not in this process: tests run in parallel).
fn torch_python(name: &str, aggregate: &str) -> Run {
    let dir = scratch(name);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/torch_train.py");
    let child = Command::new("python3")
        .arg(script)
        .arg("3")
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("GPUMEMTRACE_AGGREGATE", aggregate)
        .env("EMUCUDA_DEVICES", "1")
        .env("EMU_TORCH_LIB", emu().join("libtorch_cuda.so"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id();
    finish(child.wait_with_output().unwrap(), dir, pid)
}

#[test]
fn a_pytorch_program_summarized_from_an_aggregate_trace_matches_the_full_trace() {
    // Blocks with Python stacks, backward threads borrowing the waiting Python stack, and the
    // Python program's end (its leaks are what was live then, before the interpreter's shutdown).
    let full = torch_python("agg-torch-full", "0");
    let agg = torch_python("agg-torch-agg", "1");
    assert!(full.out.status.success() && agg.out.status.success(), "{}\n{}", full.stderr, agg.stderr);
    let (full, agg) = (summary_json(&full.traces[0]), summary_json(&agg.traces[0]));
    let (f, a) = (comparable(&full), comparable(&agg));
    assert_eq!(a, f);
    let blocks = f["groups"].as_array().unwrap().iter().find(|g| g["kind"] == "block").unwrap();
    assert!(!blocks["leak_sites"].as_array().unwrap().is_empty(), "the program's leaks at its end: {blocks}");
    let borrowed = |j: &Value| j.to_string().contains("\"during_backward\":true");
    assert!(borrowed(&full) && borrowed(&agg), "a site allocated by a backward thread is named by the backward() line");
    let g = agg["traces"][0]["groups"].as_array().unwrap().iter().find(|g| g["kind"] == "block").unwrap().clone();
    assert_eq!(g["live_at_python_exit_bytes"], blocks["live_at_python_exit_bytes"]);
}

/// `phases --json` rows: phase, device, kind, allocations, bytes, failed, and the peak when given.
fn phase_rows(trace: &Path) -> Vec<(String, u64, u64, u64, Option<u64>)> {
    let out = cli_on(&["phases", "--json"], trace);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut rows: Vec<_> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (r["phase"].as_str().unwrap().to_owned(), n("allocations"), n("allocated_bytes"), n("failed"), r["peak_bytes"].as_u64())
        })
        .collect();
    rows.sort();
    rows
}

#[test]
fn an_aggregate_trace_has_the_allocations_of_each_phase_and_its_peak() {
    let shim = shim();
    let nvtx = ("NVTX_INJECTION64_PATH", shim.to_str().unwrap());
    let full = run_traced("prog_phases", &[], &[nvtx]);
    let agg = run_traced("prog_phases", &[], &[nvtx, AGG]);
    assert!(full.out.status.success() && agg.out.status.success(), "{}\n{}", full.stderr, agg.stderr);
    let (f, a) = (phase_rows(&full.traces[0]), phase_rows(&agg.traces[0]));
    let without_peaks: Vec<_> = a.iter().map(|r| (r.0.clone(), r.1, r.2, r.3, None)).collect();
    assert_eq!(without_peaks, f, "the same allocations per phase as the full trace");
    // Weights of 64 MiB in "setup"; per epoch, 3 x 16 MiB activations in "forward", 8 MiB in
    // "attention" on top, a 32 MiB gradient in "backward" once they are freed, 4 MiB of
    // optimizer state that stays: the second epoch peaks 4 MiB higher than the first.
    let peak = |name: &str| a.iter().find(|r| r.0 == name).unwrap_or_else(|| panic!("{name}: {a:?}")).4;
    assert_eq!(peak("setup"), Some(64 * MIB));
    assert_eq!(peak("forward"), Some((64 + 4 + 48) * MIB));
    assert_eq!(peak("attention"), Some((64 + 4 + 48 + 8) * MIB));
    assert_eq!(peak("backward"), Some((64 + 4 + 32) * MIB));
    assert_eq!(peak("optimizer"), Some((64 + 8) * MIB));
    // The text report shows the peaks too.
    let text = String::from_utf8_lossy(&cli_on(&["phases"], &agg.traces[0]).stdout).into_owned();
    assert!(text.contains("group peak") && text.contains("124.0 MiB"), "{text}");
}
