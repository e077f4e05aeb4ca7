//! The reports beyond `summary` at both levels of PyTorch's caching allocator, on the emulated
//! PyTorch (tests/emucuda/torch; see tests/torch.rs): the memory_viz snapshot in PyTorch's own
//! structure (segments holding blocks), Perfetto's exact allocated/reserved tracks, `check`'s
//! allocated and reserved budgets, `diff` of tensors by Python line, flame graphs of tensors.
//! Figures are checked against the allocator's own counters and against the trace's events.

mod common;
use common::*;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use gpumemtrace_format::{MemKind, Op};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// prog_torch's two gradients still alive at its last checkpoint, freed by libtorch's exit handler.
const GRADS_FREED_AT_EXIT: u64 = 2 * 512 * 1024;

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

/// `key=value` words of the first stdout line starting with `prefix`, as numbers.
fn line(stdout: &str, prefix: &str) -> HashMap<String, u64> {
    let l = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} line in {stdout}"));
    l.split_whitespace().filter_map(|kv| kv.split_once('=')).filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?))).collect()
}

fn torch_run(args: &[&str], env: &[(&str, &str)]) -> (Run, PathBuf) {
    let run = run_traced("prog_torch", args, env);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.traces[0].clone();
    (run, t)
}

fn pool(trace: &Path) -> Value {
    let v: Value = serde_json::from_str(&ok(&["summary", "--json", s(trace)])).unwrap();
    v["traces"][0]["pools"][0].clone()
}

/// Replays the trace's own events: live blocks and live driver ranges (device allocations and
/// mappings) at its end, and every block address ever handed out.
struct Replayed {
    blocks: BTreeMap<u64, u64>,
    ranges: BTreeMap<u64, (u64, MemKind)>,
    ever: Vec<(u64, u64)>,
    reservations: Vec<u64>,
}

fn replay(t: &TraceData) -> Replayed {
    let mut r = Replayed { blocks: BTreeMap::new(), ranges: BTreeMap::new(), ever: vec![], reservations: vec![] };
    for e in t.events.iter().filter(|e| e.result == 0) {
        let api = t.api(e);
        match (api.kind, api.op) {
            (MemKind::Block, Op::Alloc) => {
                r.blocks.insert(e.addr, e.size);
                r.ever.push((e.addr, e.size));
            }
            (MemKind::Block, Op::Free) => {
                r.blocks.remove(&e.addr);
            }
            (MemKind::Device | MemKind::VmmMapped, Op::Alloc) => {
                r.ranges.insert(e.addr, (e.size, api.kind));
            }
            (MemKind::Device | MemKind::VmmMapped, Op::Free) => {
                r.ranges.remove(&e.addr);
            }
            (MemKind::VmmReserved, Op::Alloc) => r.reservations.push(e.addr),
            _ => {}
        }
    }
    r
}

/// Exports memviz and reads it back with tests/memviz_check.py (which fails on anything
/// memory_viz could not draw: blocks that do not tile their segment, a block outside every
/// segment at some point of the history, trace entries that disagree with the final state).
fn memviz(trace: &Path) -> (Value, Vec<u8>) {
    let p = trace.with_extension("pickle");
    ok(&["export", s(trace), "--format", "memviz", "-o", s(&p)]);
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memviz_check.py");
    let o = Command::new("python3").arg(&checker).arg(&p).output().expect("python3 is needed for this test");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    (serde_json::from_slice(&o.stdout).unwrap(), std::fs::read(&p).unwrap())
}

fn pairs(v: &Value) -> Vec<(u64, u64)> {
    v.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_u64().unwrap())).collect()
}

fn count(facts: &Value, action: &str) -> u64 {
    facts["actions"]["0"][action].as_u64().unwrap_or(0)
}

#[test]
fn memviz_snapshot_has_pytorchs_segments_and_exactly_the_live_blocks() {
    let (run, t) = torch_run(&[], &[]);
    let end = line(&run.stdout, "checkpoint=end");
    let (facts, raw) = memviz(&t);
    let r = replay(&run.trace());
    // Active blocks: the live blocks at the end of the trace, address and size.
    assert_eq!(pairs(&facts["active"]["0"]), r.blocks.iter().map(|(&a, &n)| (a, n)).collect::<Vec<_>>());
    let active: u64 = r.blocks.values().sum();
    assert_eq!(active, end["allocated"] - GRADS_FREED_AT_EXIT);
    // Segments: the live device allocations that held a block (the cuBLAS-like workspace
    // never did, and is no segment), summing to what the allocator reserved.
    let held: Vec<(u64, u64)> = r
        .ranges
        .iter()
        .filter(|(&a, &(n, _))| r.ever.iter().any(|&(b, m)| b < a + n && b + m > a))
        .map(|(&a, &(n, _))| (a, n))
        .collect();
    assert_eq!(held.len(), r.ranges.len() - 1);
    assert_eq!(pairs(&facts["segments"]["0"]), held);
    assert_eq!(held.iter().map(|p| p.1).sum::<u64>(), end["reserved"]);
    assert!(facts["segments"]["0"].as_array().unwrap().iter().all(|s| s[2] == false));
    // The history: 32 blocks handed out and 20 taken back; 6 of the 7 cudaMallocs became
    // segments with their first block, 1 went back with empty_cache.
    assert_eq!((count(&facts, "alloc"), count(&facts, "free_requested"), count(&facts, "free_completed")), (32, 20, 20));
    assert_eq!((count(&facts, "segment_alloc"), count(&facts, "segment_free"), count(&facts, "oom")), (6, 1, 0));
    assert_eq!(facts["peak"]["0"].as_u64(), Some(end["max_allocated"]));
    // Compact: each string (a file name here) is in the pickle once, then referred to.
    let once = |needle: &[u8]| raw.windows(needle.len()).filter(|w| *w == needle).count();
    assert_eq!(once(b"prog_torch.c"), 1);
    assert_eq!(once(b"free_requested"), 1);
}

#[test]
fn memviz_snapshot_of_expandable_segments_is_one_run_of_mapped_pages() {
    let (run, t) = torch_run(&[], &[("EMU_TORCH_EXPANDABLE", "1")]);
    let end = line(&run.stdout, "checkpoint=end");
    let (facts, _) = memviz(&t);
    let trace = run.trace();
    let r = replay(&trace);
    assert_eq!(pairs(&facts["active"]["0"]), r.blocks.iter().map(|(&a, &n)| (a, n)).collect::<Vec<_>>());
    // Every page mapped at the end of the one reservation, as PyTorch reports it.
    let segments = facts["segments"]["0"].as_array().unwrap();
    assert_eq!(segments.len(), 1, "{segments:?}");
    assert_eq!(segments[0][0].as_u64(), Some(r.reservations[0]));
    assert_eq!(segments[0][1].as_u64(), Some(end["reserved"]));
    assert_eq!(segments[0][2], true);
    let maps = trace.events.iter().filter(|e| trace.api_name(e) == "cuMemMap").count() as u64;
    assert_eq!((count(&facts, "segment_map"), count(&facts, "segment_alloc")), (maps, 0));
}

#[test]
fn memviz_snapshot_records_the_out_of_memory_at_block_level() {
    let (run, t) = torch_run(&["oom"], &[]);
    let oom = line(&run.stdout, "oom");
    let (facts, _) = memviz(&t);
    // The allocator asked the driver twice (before and after freeing its cache).
    assert_eq!(count(&facts, "oom"), 2);
    let active: u64 = pairs(&facts["active"]["0"]).iter().map(|p| p.1).sum();
    assert_eq!(active, oom["allocated"]);
    let reserved: u64 = pairs(&facts["segments"]["0"]).iter().map(|p| p.1).sum();
    assert_eq!(reserved, oom["reserved"]);
}

/// Counter values of one Perfetto track, in order.
fn track(v: &Value, name: &str) -> Vec<u64> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == name)
        .map(|e| e["args"].as_object().unwrap().values().next().unwrap().as_u64().unwrap())
        .collect()
}

#[test]
fn perfetto_has_exact_allocated_and_reserved_tracks() {
    let (run, t) = torch_run(&[], &[]);
    let end = line(&run.stdout, "checkpoint=end");
    let v: Value = serde_json::from_str(&ok(&["export", s(&t), "--format", "perfetto"])).unwrap();
    let allocated = track(&v, "device 0 allocated (blocks, bytes)");
    let reserved = track(&v, "device 0 reserved (segments, bytes)");
    let trace = run.trace();
    let blocks = trace.events.iter().filter(|e| trace.api(e).kind == MemKind::Block).count();
    // A point at every block handed out or taken back, none resampled away.
    assert_eq!(allocated.len(), blocks);
    assert_eq!(allocated.iter().max().copied(), Some(end["max_allocated"]));
    assert_eq!(allocated.last().copied(), Some(end["allocated"] - GRADS_FREED_AT_EXIT));
    // 6 segments made, 1 given back.
    assert_eq!(reserved.len(), 7);
    assert_eq!(reserved.iter().max().copied(), Some(end["max_reserved"]));
    assert_eq!(reserved.last().copied(), Some(end["reserved"]));
    let p = pool(&t);
    assert_eq!(allocated.iter().max().copied(), p["allocated_peak_bytes"].as_u64());
    assert_eq!(reserved.iter().max().copied(), p["reserved_peak_bytes"].as_u64());
    assert_eq!(allocated.last().copied(), p["allocated_bytes"].as_u64());
    assert_eq!(reserved.last().copied(), p["reserved_bytes"].as_u64());
    // The exact allocated track replaces the sampled one of the blocks.
    assert!(track(&v, "device 0 block memory (bytes)").is_empty());
    assert!(!track(&v, "device 0 device memory (bytes)").is_empty());
}

#[test]
fn check_gates_on_the_allocated_and_reserved_peaks() {
    let (run, t) = torch_run(&[], &[]);
    let end = line(&run.stdout, "checkpoint=end");
    let (max_a, max_r) = (end["max_allocated"].to_string(), end["max_reserved"].to_string());
    let (under_a, under_r) = ((end["max_allocated"] - 1).to_string(), (end["max_reserved"] - MIB).to_string());
    let t = s(&t);
    // At the peaks exactly: within budget.
    let o = gmt(&["check", t, "--max-allocated", &max_a, "--max-reserved", &max_r]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    // A byte under the allocated peak and a MiB under the reserved one: both fail, each said.
    let o = gmt(&["check", t, "--max-allocated", &under_a, "--max-reserved", &under_r, "--device", "0"]);
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("FAIL device 0: allocated peak (blocks) 28.0 MiB exceeds --max-allocated 28.0 MiB by 1 B (reached at"), "{out}");
    assert!(out.contains("FAIL device 0: reserved peak (segments) 48.0 MiB exceeds --max-reserved 47.0 MiB by 1.0 MiB"), "{out}");
    let o = gmt(&["check", t, "--max-allocated", &under_a, "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["traces"][0]["checks"][0];
    assert_eq!((c["check"].as_str(), c["device"].as_i64(), c["actual"].as_u64()), (Some("max-allocated"), Some(0), Some(end["max_allocated"])));
    // Nothing to judge: exit 2 with the reason, never a silent pass.
    let o = gmt(&["check", t, "--max-allocated", "1GiB", "--device", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--max-allocated needs blocks of PyTorch's caching allocator, and there are none on device 1"));
    let plain = run_traced("prog_runtime_dynamic", &[], &[]);
    for flag in ["--max-allocated", "--max-reserved"] {
        let o = gmt(&["check", s(&plain.traces[0]), flag, "1GiB"]);
        assert_eq!(o.status.code(), Some(2), "{flag}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("there are none in this trace"), "{flag}");
    }
}

#[test]
fn flamegraphs_show_the_tensors_unless_asked_for_segments() {
    let (run, t) = torch_run(&[], &[]);
    let folded = ok(&["flamegraph", s(&t), "--of", "leaks", "--folded"]);
    let lines: Vec<&str> = folded.lines().collect();
    assert!(lines.iter().all(|l| l.starts_with("device 0: block;")), "{folded}");
    let keep = lines.iter().filter(|l| l.contains(";keep_history (prog_torch.c:")).collect::<Vec<_>>();
    assert_eq!(keep.len(), 1, "{folded}");
    assert!(keep[0].ends_with(&format!(" {}", 5 * MIB)), "{folded}");
    let total: u64 = lines.iter().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum();
    assert_eq!(total, replay(&run.trace()).blocks.values().sum::<u64>());
    // The driver level: segments and the workspace, no blocks.
    let folded = ok(&["flamegraph", s(&t), "--of", "leaks", "--folded", "--level", "segments"]);
    assert!(!folded.contains("device 0: block"), "{folded}");
    let ws = folded.lines().find(|l| l.contains(";cublas_workspace (prog_torch.c:")).unwrap();
    assert!(ws.starts_with("device 0: device;") && ws.ends_with(&format!(" {}", 3 * MIB)), "{folded}");
}

fn python_run(steps: &str) -> Run {
    let run = run_torch_python("torch_reports_python", steps);
    assert!(run.out.status.success(), "{}", run.stderr);
    run
}

/// torch_train.py's `line name=N line=L` lines.
fn lines_of(run: &Run) -> HashMap<String, u64> {
    run.stdout
        .lines()
        .filter(|l| l.starts_with("line "))
        .map(|l| {
            let kv: HashMap<&str, &str> = l.split_whitespace().filter_map(|w| w.split_once('=')).collect();
            (kv["name"].to_owned(), kv["line"].parse().unwrap())
        })
        .collect()
}

#[test]
fn diff_compares_tensors_by_python_line() {
    let (a, b) = (python_run("8"), python_run("10"));
    let at = |r: &Run| line(&r.stdout, "at name=end");
    let lines = lines_of(&a);
    let v: Value = serde_json::from_str(&ok(&["diff", s(&a.traces[0]), s(&b.traces[0]), "--json"])).unwrap();
    let pool = &v["devices"][0]["pool"];
    assert_eq!(
        pool["allocated_peak_bytes"]["delta"].as_i64(),
        Some(at(&b)["max_allocated"] as i64 - at(&a)["max_allocated"] as i64)
    );
    assert_eq!(pool["allocated_peak_bytes"]["delta"].as_i64(), Some(4 * MIB as i64));
    let block_sites = |list: &str| -> Vec<(String, i64, u64, u64)> {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["kind"] == "block")
            .map(|s| (s["site"].as_str().unwrap().to_owned(), s["delta"].as_i64().unwrap(), s["count_a"].as_u64().unwrap(), s["count_b"].as_u64().unwrap()))
            .collect()
    };
    let site = |line: u64| format!("train_step torch_train.py:{line}");
    let (loss, backward) = (lines["loss"], lines["backward"]);
    let x = loss - 2; // `x = torch.empty(8 * MiB)`, two lines above the loss
    // The leak: the kept loss, 2 MiB a step, two more steps; nothing else leaks more.
    assert_eq!(block_sites("leaks"), [(site(loss), 4 * MIB as i64, 8, 10)]);
    // Two more steps allocate two more of each: x (8 MiB), the loss (2 MiB), and for the line
    // that called backward() two gradients (512 KiB each, made on autograd's thread) and
    // backward()'s own 512-byte grad_output (in torch's code, sited at the caller's line).
    assert_eq!(
        block_sites("allocated"),
        [(site(x), 16 * MIB as i64, 8, 10), (site(loss), 4 * MIB as i64, 8, 10), (site(backward), (2 * MIB + 2 * 512) as i64, 24, 30)]
    );
}

#[test]
fn memviz_snapshot_of_a_python_program_names_its_lines() {
    let run = python_run("8");
    let lines = lines_of(&run);
    let (facts, raw) = memviz(&run.traces[0]);
    // The interpreter's shutdown freed every tensor before the trace ended.
    assert_eq!(facts["active"]["0"].as_array().unwrap().len(), 0);
    assert!(raw.windows(14).any(|w| w == b"torch_train.py"));
    let p = run.traces[0].with_extension("pickle");
    let script = format!(
        "import pickle; d = pickle.load(open({:?}, 'rb'))\n\
         print(sum(1 for e in d['device_traces'][0] if e['action'] == 'alloc' and e['frames'] \
         and e['frames'][0]['filename'].endswith('torch_train.py') and e['frames'][0]['line'] == {} and e['size'] == {}))",
        s(&p),
        lines["loss"],
        2 * MIB
    );
    let o = Command::new("python3").arg("-c").arg(script).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "8", "{}", String::from_utf8_lossy(&o.stderr));
}

/// `summary` (text and JSON) of `trace` with the model's observers on a thread of their own
/// (`on`) or on the replay's.
fn summaries_with_model_thread(trace: &Path, on: bool) -> (String, String) {
    let run = |json: bool| {
        let mut c = Command::new(cli());
        c.arg("summary").arg(trace).env("GPUMEMTRACE_MODEL_THREAD", if on { "1" } else { "0" });
        if json {
            c.arg("--json");
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    (run(false), run(true))
}

#[test]
fn the_model_is_the_same_whether_its_observers_run_beside_the_replay_or_in_it() {
    // A Python program (blocks in segments, growth, the program's end before the interpreter's
    // teardown, autograd's thread) and an out-of-memory failure at block level.
    let python = python_run("8");
    let (_, oom) = torch_run(&["oom"], &[]);
    for t in [&python.traces[0], &oom] {
        let (inline, beside) = (summaries_with_model_thread(t, false), summaries_with_model_thread(t, true));
        assert!(inline.0.contains("allocated peak"), "{}", inline.0);
        assert_eq!(inline, beside);
    }
}
