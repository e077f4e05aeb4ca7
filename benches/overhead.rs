//! Overhead benchmark: the same allocation loop (tests/emucuda/bench_alloc.c, emulated driver)
//! run untraced and traced in one run, so the ratios compare like with like.
//!
//! `cargo bench --bench overhead` (builds the release library first). Prints a markdown table.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new("cargo")
        .args(["build", "--release", "-p", "gpumemtrace"])
        .current_dir(root)
        .status()
        .expect("cargo");
    assert!(status.success());
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| root.join("target"));
    let shim = target.join("release/libgpumemtrace.so");
    let emu = target.join("emucuda");
    let ok = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(root.join("tests/emucuda"))
        .arg(format!("OUT={}", emu.display()))
        .status()
        .expect("make");
    assert!(ok.success());
    let scratch = target.join("bench-scratch");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    let reps: usize = std::env::var("BENCH_REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let run_with = |threads: u32, pairs: u32, depth: u32, frames: Option<u32>, unwinder: &str| -> HashMap<String, u64> {
        // Median of `reps` runs, by wall time.
        let mut results: Vec<HashMap<String, u64>> = (0..reps)
            .map(|_| {
                let mut cmd = Command::new(emu.join("bench_alloc"));
                cmd.args([threads.to_string(), pairs.to_string(), depth.to_string()]);
                if let Some(f) = frames {
                    cmd.env("LD_PRELOAD", &shim)
                        .env("GPUMEMTRACE_OUTPUT", format!("{}/", scratch.display()))
                        .env("GPUMEMTRACE_FRAMES", f.to_string())
                        .env("GPUMEMTRACE_UNWINDER", unwinder);
                }
                let out = cmd.output().unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                let line = String::from_utf8_lossy(&out.stdout).into_owned();
                let mut m: HashMap<String, u64> = line
                    .split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
                    .collect();
                let bytes: u64 = std::fs::read_dir(&scratch).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum();
                m.insert("trace_bytes".into(), bytes);
                for e in std::fs::read_dir(&scratch).unwrap() {
                    std::fs::remove_file(e.unwrap().path()).unwrap();
                }
                m
            })
            .collect();
        results.sort_by_key(|m| m["wall_ns"]);
        results.swap_remove(reps / 2)
    };

    let run = |threads: u32, pairs: u32, depth: u32, frames: Option<u32>| run_with(threads, pairs, depth, frames, "fast");

    let only_python = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "python");
    if !only_python {
    println!("## Per call: cuMemAlloc_v2 latency, 1 thread, 200000 alloc/free pairs (median of {reps} runs)\n");
    println!("| stack depth of the caller | frames recorded | unwinder | p50 ns | p99 ns | added p50 ns | wall ratio |");
    println!("|---|---|---|---|---|---|---|");
    for depth in [0u32, 30, 60] {
        let base = run(1, 200_000, depth, None);
        println!("| {depth} | untraced | - | {} | {} | - | 1.00 |", base["alloc_p50_ns"], base["alloc_p99_ns"]);
        for (frames, unwinder) in [(0u32, "-"), (32, "fast"), (64, "fast"), (64, "backtrace")] {
            let t = run_with(1, 200_000, depth, Some(frames), if unwinder == "-" { "fast" } else { unwinder });
            println!(
                "| {depth} | {frames} | {unwinder} | {} | {} | {} | {:.2} |",
                t["alloc_p50_ns"],
                t["alloc_p99_ns"],
                t["alloc_p50_ns"] as i64 - base["alloc_p50_ns"] as i64,
                t["wall_ns"] as f64 / base["wall_ns"] as f64
            );
        }
    }

    println!("\n## Throughput: 8 threads x 50000 pairs, 64 frames max (median of {reps} runs)\n");
    println!("| run | wall ms | events/s | trace bytes/event |");
    println!("|---|---|---|---|");
    let events = 8.0 * 50_000.0 * 2.0;
    let base = run(8, 50_000, 0, None);
    println!("| untraced | {:.1} | {:.0} | - |", base["wall_ns"] as f64 / 1e6, events / (base["wall_ns"] as f64 / 1e9));
    let t = run(8, 50_000, 0, Some(64));
    println!(
        "| traced | {:.1} | {:.0} | {:.1} |",
        t["wall_ns"] as f64 / 1e6,
        events / (t["wall_ns"] as f64 / 1e9),
        t["trace_bytes"] as f64 / events
    );
    }

    // Python: the cost of capturing Python frames, from a ctypes loop (GIL released).
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = root.join("benches/py_alloc.py");
    let libcuda = emu.join("libcuda.so.1");
    let pairs = 100_000u64;
    // ns per alloc+free pair, median of `reps` runs; `env` None = untraced.
    let py_run = |depth: u32, env: Option<&[(&str, &str)]>| -> f64 {
        let mut walls: Vec<u64> = (0..reps)
            .map(|_| {
                let mut cmd = Command::new(&python);
                cmd.arg(&script).arg(&libcuda).arg(pairs.to_string()).arg(depth.to_string());
                if let Some(env) = env {
                    cmd.env("LD_PRELOAD", &shim).env("GPUMEMTRACE_OUTPUT", format!("{}/", scratch.display()));
                    for (k, v) in env {
                        cmd.env(k, v);
                    }
                }
                let out = cmd.output().unwrap();
                assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
                for e in std::fs::read_dir(&scratch).unwrap() {
                    std::fs::remove_file(e.unwrap().path()).unwrap();
                }
                let line = String::from_utf8_lossy(&out.stdout).into_owned();
                line.split_whitespace().find_map(|kv| kv.strip_prefix("wall_ns=")).unwrap().parse().unwrap()
            })
            .collect();
        walls.sort();
        walls[reps / 2] as f64 / pairs as f64
    };
    let version = Command::new(&python).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    println!(
        "\n## Python capture: ctypes cuMemAlloc_v2 + cuMemFree_v2 pairs, {} ({pairs} pairs, median of {reps} runs)\n",
        version.unwrap_or_default()
    );
    println!("| Python depth | native frames | untraced ns/pair | Python off ns/pair | Python on ns/pair | added by Python capture ns/event | on/off ratio | on/untraced ratio |");
    println!("|---|---|---|---|---|---|---|---|");
    for depth in [0u32, 10, 50, 200] {
        for frames in ["0", "64"] {
            let base = py_run(depth, None);
            let off = py_run(depth, Some(&[("GPUMEMTRACE_FRAMES", frames), ("GPUMEMTRACE_PYTHON", "0")]));
            let on = py_run(depth, Some(&[("GPUMEMTRACE_FRAMES", frames), ("GPUMEMTRACE_PYTHON", "1")]));
            println!(
                "| {depth} | {frames} | {base:.0} | {off:.0} | {on:.0} | {:.0} | {:.2} | {:.2} |",
                (on - off) / 2.0,
                on / off,
                on / base
            );
        }
    }

    // Peers: heaptrack (native malloc tracer) and memray (Python + native) on equivalent loops,
    // against their own untraced runs, next to ours on our loop: added cost per traced event.
    if std::env::var("BENCH_ONLY").is_ok_and(|v| v != "peers") {
        return;
    }
    let median_of = |mut v: Vec<f64>| -> f64 {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let field = |out: &[u8], key: &str| -> f64 {
        String::from_utf8_lossy(out)
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")).map(|v| v.parse::<f64>().unwrap()))
            .unwrap_or_else(|| panic!("no {key}= in {}", String::from_utf8_lossy(out)))
    };
    let have = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    println!("\n## Peers: added p50 latency per traced allocation call, native (median of {reps} runs)\n");
    println!("| caller depth | ours: cuMemAlloc_v2, 64 frames | heaptrack: malloc |");
    println!("|---|---|---|");
    let heaptrack = have("heaptrack");
    for depth in [0u32, 30, 60] {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..reps {
            let base = run_with(1, 200_000, depth, None, "fast");
            let t = run_with(1, 200_000, depth, Some(64), "fast");
            ours.push(t["alloc_p50_ns"] as f64 - base["alloc_p50_ns"] as f64);
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
        let theirs = if theirs.is_empty() { "not installed".to_string() } else { format!("{:.0} ns", median_of(theirs)) };
        println!("| {depth} | {:.0} ns | {theirs} |", median_of(ours));
    }

    println!("\n## Peers: added wall time per traced event, Python (100000 pairs, median of {reps} runs)\n");
    println!("| Python depth | ours: ctypes cuMemAlloc_v2, Python + 64 native frames | memray: bytearray(4096), Python stacks | memray --native |");
    println!("|---|---|---|---|");
    let memray = have("memray");
    let py_script = root.join("benches/py_malloc.py");
    let py_wall = |script: &Path, depth: u32, prefix: &[&str], env: &[(&str, &str)]| -> f64 {
        let mut cmd = if prefix.is_empty() { Command::new(&python) } else { Command::new(prefix[0]) };
        if !prefix.is_empty() {
            cmd.args(&prefix[1..]);
        }
        cmd.arg(script).arg(&libcuda).arg(pairs.to_string()).arg(depth.to_string());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for e in std::fs::read_dir(&scratch).unwrap() {
            let _ = std::fs::remove_file(e.unwrap().path());
        }
        field(&out.stdout, "wall_ns")
    };
    let mr_out = scratch.join("memray.bin");
    let mr_out = mr_out.to_str().unwrap();
    let shim_s = shim.to_str().unwrap().to_string();
    let out_s = format!("{}/", scratch.display());
    for depth in [10u32, 50] {
        let (mut ours, mut mr, mut mrn) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..reps {
            let events = 2.0 * pairs as f64;
            let base = py_wall(&script, depth, &[], &[]);
            let t = py_wall(&script, depth, &[], &[("LD_PRELOAD", shim_s.as_str()), ("GPUMEMTRACE_OUTPUT", out_s.as_str())]);
            ours.push((t - base) / events);
            if memray {
                let base = py_wall(&py_script, depth, &[], &[]);
                let t = py_wall(&py_script, depth, &["memray", "run", "-q", "-f", "-o", mr_out], &[]);
                mr.push((t - base) / events);
                let t = py_wall(&py_script, depth, &["memray", "run", "-q", "-f", "--native", "-o", mr_out], &[]);
                mrn.push((t - base) / events);
            }
        }
        let fmt = |v: Vec<f64>| if v.is_empty() { "not installed".to_string() } else { format!("{:.0} ns", median_of(v)) };
        println!("| {depth} | {} | {} | {} |", fmt(ours), fmt(mr), fmt(mrn));
    }
}
