//! Overhead benchmark: the same allocation loop (tests/emucuda/bench_alloc.c, emulated driver)
//! run untraced and traced, interleaved in one run, so the ratios compare like with like.
//!
//! `cargo bench --bench overhead` (builds the release library first). Prints markdown tables:
//! per-call latency (p50, p99, added, ratio) of allocations and frees at native stacks of 0, 32
//! and 64 frames; 8 threads' events/s, drops and waits; Python (20 frames on top of the native
//! stack); with `BENCH_ONLY=peers`, heaptrack and memray beside ours. `BENCH_REPS` (default 5)
//! sets the repetitions; every figure is the median over them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpumemtrace_format::{Reader, Record};

/// What a traced run's trace says: events, drops, and the notices about waiting.
#[derive(Default, Clone)]
struct TraceCounts {
    events: u64,
    dropped: u64,
    waited: u64,
    bytes: u64,
}

fn read_trace(dir: &Path) -> TraceCounts {
    let mut c = TraceCounts::default();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        c.bytes += std::fs::metadata(&path).unwrap().len();
        if path.extension().is_some_and(|x| x == "trace") {
            let f = std::io::BufReader::new(std::fs::File::open(&path).unwrap());
            for rec in Reader::new(f).unwrap() {
                match rec.unwrap() {
                    Record::Event(_) => c.events += 1,
                    Record::Stats(s) => c.dropped = s.dropped,
                    Record::Notice(n) if n.contains("waited for room") => {
                        c.waited = n.split_whitespace().next().and_then(|w| w.parse().ok()).unwrap_or(0)
                    }
                    _ => {}
                }
            }
        }
        std::fs::remove_file(&path).unwrap();
    }
    c
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    // BENCH_ROOT: run from a copy of the built tree elsewhere (no cargo, no compiler there).
    let root = std::env::var_os("BENCH_ROOT").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = root.as_path();
    let prebuilt = std::env::var_os("BENCH_ROOT").is_some();
    if !prebuilt {
        let status = Command::new("cargo")
            .args(["build", "--release", "-p", "gpumemtrace"])
            .current_dir(root)
            .status()
            .expect("cargo");
        assert!(status.success());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let shim = target.join("release/libgpumemtrace.so");
    let emu = target.join("emucuda");
    if !prebuilt {
        let ok = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(root.join("tests/emucuda"))
            .arg(format!("OUT={}", emu.display()))
            .status()
            .expect("make");
        assert!(ok.success());
    }
    let scratch = target.join("bench-scratch");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();

    // One run of bench_alloc; `frames` None = untraced, Some(None) = the default frame limit.
    let run_once = |threads: u32, pairs: u32, depth: u32, frames: Option<Option<u32>>| -> (HashMap<String, f64>, TraceCounts) {
        let mut cmd = Command::new(emu.join("bench_alloc"));
        cmd.args([threads.to_string(), pairs.to_string(), depth.to_string()]);
        if let Some(f) = frames {
            cmd.env("LD_PRELOAD", &shim)
                .env("GPUMEMTRACE_OUTPUT", format!("{}/", scratch.display()))
                .env("GPUMEMTRACE_QUIET", "1");
            if let Some(f) = f {
                cmd.env("GPUMEMTRACE_FRAMES", f.to_string());
            }
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let m = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
            .collect();
        (m, read_trace(&scratch))
    };
    // Untraced and traced runs interleaved, `reps` of each: the median of each field.
    let paired = |threads: u32, pairs: u32, depth: u32, frames: Option<u32>| {
        let mut base: Vec<HashMap<String, f64>> = Vec::new();
        let mut traced: Vec<(HashMap<String, f64>, TraceCounts)> = Vec::new();
        for _ in 0..reps {
            base.push(run_once(threads, pairs, depth, None).0);
            traced.push(run_once(threads, pairs, depth, Some(frames)));
        }
        let med = |runs: &[HashMap<String, f64>], k: &str| median(runs.iter().map(|m| m[k]).collect());
        let t: Vec<_> = traced.iter().map(|t| t.0.clone()).collect();
        let keys = ["wall_ns", "alloc_p50_ns", "alloc_p99_ns", "free_p50_ns", "free_p99_ns"];
        let b: HashMap<&str, f64> = keys.iter().map(|&k| (k, med(&base, k))).collect();
        let tr: HashMap<&str, f64> = keys.iter().map(|&k| (k, med(&t, k))).collect();
        let counts: Vec<TraceCounts> = traced.into_iter().map(|t| t.1).collect();
        (b, tr, counts)
    };

    if only.is_empty() || only == "native" {
        println!("## Per call, 1 thread, 200000 cuMemAlloc_v2 + cuMemFree_v2 pairs ({reps} interleaved runs each, medians)\n");
        println!("Added = traced minus untraced of the same run; ratio = traced / untraced.\n");
        println!("| native stack | call | untraced p50 / p99 ns | traced p50 / p99 ns | added p50 ns | added p99 ns | p50 ratio | wall ratio |");
        println!("|---|---|---|---|---|---|---|---|");
        // bench_alloc's own frames (worker, thread start) come on top of `depth`: the stacks
        // recorded are 4, 32 and 64 frames deep (the default limit, 128, cuts none of them).
        for (label, depth, frames) in [
            ("none (GPUMEMTRACE_FRAMES=0)", 0u32, Some(0u32)),
            ("4 frames (caller at depth 0)", 0, None),
            ("32 frames", 28, None),
            ("64 frames", 60, None),
        ] {
            let (b, t, _) = paired(1, 200_000, depth, frames);
            for call in ["alloc", "free"] {
                let (p50, p99) = (format!("{call}_p50_ns"), format!("{call}_p99_ns"));
                println!(
                    "| {label} | {call} | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
                    b[p50.as_str()],
                    b[p99.as_str()],
                    t[p50.as_str()],
                    t[p99.as_str()],
                    t[p50.as_str()] - b[p50.as_str()],
                    t[p99.as_str()] - b[p99.as_str()],
                    t[p50.as_str()] / b[p50.as_str()],
                    t["wall_ns"] / b["wall_ns"]
                );
            }
        }
    }

    if only.is_empty() || only == "threads" {
        println!("\n## Throughput: 8 threads x 50000 pairs, 4-frame stacks ({reps} interleaved runs each, medians)\n");
        println!("| run | wall ms | events/s | events in trace | dropped | hand-overs that waited | trace bytes/event |");
        println!("|---|---|---|---|---|---|---|");
        let events = 8.0 * 50_000.0 * 2.0;
        let (b, t, counts) = paired(8, 50_000, 0, None);
        println!("| untraced | {:.1} | {:.0} | - | - | - | - |", b["wall_ns"] / 1e6, events / (b["wall_ns"] / 1e9));
        let worst = |f: fn(&TraceCounts) -> u64| counts.iter().map(f).max().unwrap_or(0);
        println!(
            "| traced | {:.1} | {:.0} | {} (all runs: {}) | {} (worst run) | {} (worst run) | {:.1} |",
            t["wall_ns"] / 1e6,
            events / (t["wall_ns"] / 1e9),
            events as u64,
            if counts.iter().all(|c| c.events == events as u64) { "all" } else { "NOT all" },
            worst(|c| c.dropped),
            worst(|c| c.waited),
            median(counts.iter().map(|c| c.bytes as f64 / events).collect())
        );
    }

    // Python: 20 frames of Python on top of the native stack, through ctypes (GIL released).
    if only.is_empty() || only == "python" {
        let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
        let script = root.join("benches/py_alloc.py");
        let libcuda = emu.join("libcuda.so.1");
        let pairs = 100_000u64;
        let py_run = |depth: u32, env: Option<&[(&str, &str)]>| -> f64 {
            let mut cmd = Command::new(&python);
            cmd.arg(&script).arg(&libcuda).arg(pairs.to_string()).arg(depth.to_string());
            if let Some(env) = env {
                cmd.env("LD_PRELOAD", &shim).env("GPUMEMTRACE_OUTPUT", format!("{}/", scratch.display())).env("GPUMEMTRACE_QUIET", "1");
                for (k, v) in env {
                    cmd.env(k, v);
                }
            }
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            read_trace(&scratch);
            let line = String::from_utf8_lossy(&out.stdout).into_owned();
            line.split_whitespace().find_map(|kv| kv.strip_prefix("wall_ns=")).unwrap().parse::<f64>().unwrap() / pairs as f64
        };
        let version = Command::new(&python).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        println!(
            "\n## Python: ctypes cuMemAlloc_v2 + cuMemFree_v2 pairs from 20 Python frames, {} ({pairs} pairs, {reps} interleaved runs, medians)\n",
            version.unwrap_or_default()
        );
        println!("Per pair; \"added per allocation\" counts the pair's cost against its one allocation (a free records no stack).\n");
        println!("| variant | ns/pair | added per allocation ns | ratio |");
        println!("|---|---|---|---|");
        let (mut base, mut native, mut both) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            base.push(py_run(20, None));
            native.push(py_run(20, Some(&[("GPUMEMTRACE_PYTHON", "0")])));
            both.push(py_run(20, Some(&[("GPUMEMTRACE_PYTHON", "1")])));
        }
        let b = median(base);
        println!("| untraced | {b:.0} | - | 1.00 |");
        for (name, v) in [("traced, native stack only (GPUMEMTRACE_PYTHON=0)", native), ("traced, Python + native stacks", both)] {
            let m = median(v);
            println!("| {name} | {m:.0} | {:.0} | {:.2} |", m - b, m / b);
        }
    }

    // Peers: heaptrack on the same kind of loop (malloc), against its own untraced runs.
    if only == "peers" {
        let field = |out: &[u8], key: &str| -> f64 {
            String::from_utf8_lossy(out)
                .split_whitespace()
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(|v| v.parse::<f64>().unwrap()))
                .unwrap_or_else(|| panic!("no {key}= in {}", String::from_utf8_lossy(out)))
        };
        let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
        println!("\n## Peers: added p50 latency per traced allocation call, native ({reps} runs, medians)\n");
        println!("| caller depth | ours: cuMemAlloc_v2 | heaptrack: malloc |");
        println!("|---|---|---|");
        let heaptrack = have("heaptrack");
        for depth in [0u32, 30, 60] {
            let (b, t, _) = paired(1, 200_000, depth, None);
            let mut theirs = Vec::new();
            for _ in 0..reps {
                if heaptrack {
                    let args = ["1".to_string(), "200000".into(), depth.to_string()];
                    let base = Command::new(emu.join("bench_malloc")).args(&args).output().unwrap();
                    let out = Command::new("heaptrack")
                        .arg("-o")
                        .arg(scratch.join("heaptrack"))
                        .arg(emu.join("bench_malloc"))
                        .args(&args)
                        .output()
                        .unwrap();
                    theirs.push(field(&out.stdout, "alloc_p50_ns") - field(&base.stdout, "alloc_p50_ns"));
                    for e in std::fs::read_dir(&scratch).unwrap() {
                        let _ = std::fs::remove_file(e.unwrap().path());
                    }
                }
            }
            let theirs = if theirs.is_empty() { "not installed".to_string() } else { format!("{:.0} ns", median(theirs)) };
            println!("| {depth} | {:.0} ns | {theirs} |", t["alloc_p50_ns"] - b["alloc_p50_ns"]);
        }
    }
}
