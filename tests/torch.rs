//! Tensor-level PyTorch memory on the emulated PyTorch (tests/emucuda/torch): libc10.so defines
//! `c10::reportMemoryUsageToProfiler`, libc10_cuda.so is a caching allocator that reports every
//! block to it through the PLT, libtorch_cuda.so has ops and an autograd thread; programs open
//! libtorch_cuda.so with dlopen(RTLD_LOCAL) or ctypes, as Python imports torch. The report must
//! agree with the allocator's own counters to the byte, and the allocator's profiler must see
//! exactly what it sees without the tracer.

mod common;
use common::*;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use gpumemtrace_format::MemKind;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn summary(trace: &Path) -> Value {
    let out = Command::new(cli()).arg("summary").arg("--json").arg(trace).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["traces"][0].clone()
}

fn summary_text(trace: &Path) -> String {
    let out = Command::new(cli()).arg("summary").arg(trace).output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `key=value` words of the first stdout line starting with `prefix`.
fn line(stdout: &str, prefix: &str) -> HashMap<String, String> {
    let l = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix} line in {stdout}"));
    l.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    m[k].parse().unwrap()
}

fn untraced(prog: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(emu().join(prog));
    cmd.args(args).env("EMUCUDA_DEVICES", "2");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn group<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["groups"].as_array().unwrap().iter().find(|g| g["kind"] == kind).unwrap_or_else(|| panic!("no {kind} group"))
}

fn site<'a>(sites: &'a Value, function: &str) -> &'a Value {
    sites
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["function"] == function)
        .unwrap_or_else(|| panic!("no site {function} in {sites:#}"))
}

/// prog_torch's basic run, in each allocator mode: blocks, segments and counters agree.
fn check_basic(env: &[(&str, &str)], expandable: bool, totals: bool) {
    let run = run_traced("prog_torch", &[], env);
    assert!(run.out.status.success(), "{}", run.stderr);
    // The allocator's profiler saw the very same calls and arguments with the tracer.
    let plain = untraced("prog_torch", &[], env);
    assert_eq!(line(&run.stdout, "profiler"), line(&plain, "profiler"), "forwarding must be exact");
    let tally = line(&run.stdout, "profiler");
    assert_eq!(num(&tally, "cpu_calls"), 2, "the CPU allocator's reports reach the profiler");

    let end = line(&run.stdout, "checkpoint=end");
    let r = summary(&run.traces[0]);
    let blocks = group(&r, "block");
    // CPU blocks are not GPU memory: every block is on device 0.
    assert!(r["groups"].as_array().unwrap().iter().all(|g| g["kind"] != "block" || g["device"] == 0));
    assert_eq!(blocks["peak_bytes"].as_u64().unwrap(), num(&end, "max_allocated"));
    // The two gradients still alive at the checkpoint are freed by libtorch's exit handler.
    assert_eq!(blocks["live_bytes"].as_u64().unwrap(), num(&end, "allocated") - 2 * 512 * 1024);
    assert_eq!(blocks["allocations"].as_u64().unwrap(), 32);
    assert_eq!(blocks["frees"].as_u64().unwrap(), 20);

    let pool = &r["pools"][0];
    assert_eq!(pool["device"], 0);
    assert_eq!(pool["allocated_peak_bytes"].as_u64().unwrap(), num(&end, "max_allocated"));
    assert_eq!(pool["reserved_peak_bytes"].as_u64().unwrap(), num(&end, "max_reserved"));
    assert_eq!(pool["reserved_bytes"].as_u64().unwrap(), num(&end, "reserved"));
    assert_eq!(pool["allocated_bytes"].as_u64().unwrap(), num(&end, "allocated") - MIB);
    assert_eq!(
        pool["cached_bytes"].as_u64().unwrap(),
        pool["reserved_bytes"].as_u64().unwrap() - pool["allocated_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        pool["fragmentation_at_peak_bytes"].as_u64().unwrap(),
        pool["reserved_at_allocated_peak_bytes"].as_u64().unwrap() - pool["allocated_peak_bytes"].as_u64().unwrap()
    );
    assert_eq!(pool["blocks_outside_segments"], 0, "every block lies in a traced segment");
    if totals {
        assert_eq!(pool["reported"]["max_allocated"].as_u64().unwrap(), num(&end, "max_allocated"));
        assert_eq!(pool["reported"]["reserved"].as_u64().unwrap(), num(&end, "reserved"));
    } else {
        assert!(pool["reported"].is_null(), "the old signature carries no totals");
    }
    // The workspace taken straight from the driver is named as such, never as a tensor.
    assert_eq!(pool["direct_bytes"].as_u64().unwrap(), 3 * MIB);
    assert_eq!(site(&pool["direct_sites"], "cublas_workspace")["bytes"].as_u64().unwrap(), 3 * MIB);

    // Leaks by the program's own functions: blocks it still held.
    let leaks = &blocks["leak_sites"];
    assert_eq!(site(leaks, "keep_history")["bytes"].as_u64().unwrap(), 5 * MIB);
    assert_eq!(site(leaks, "load_weights")["bytes"].as_u64().unwrap(), 8 * MIB);
    assert_eq!(site(leaks, "small_buffers")["count"].as_u64().unwrap(), 5);
    // The one line that gained bytes every step comes first, and only it.
    let growing = blocks["growing_sites"].as_array().unwrap();
    assert_eq!(growing.len(), 1, "{growing:#?}");
    assert_eq!(growing[0]["function"], "keep_history");
    assert_eq!(growing[0]["gained_bytes"].as_u64().unwrap(), 5 * MIB);
    // The op called through torch is sited at the program's function.
    assert_eq!(site(&blocks["peak_sites"], "matmul")["bytes"].as_u64().unwrap(), 3 * MIB);

    let text = summary_text(&run.traces[0]);
    assert!(text.contains("cached, not leaked:"), "{text}");
    assert!(text.contains("direct driver allocations"), "{text}");
    if expandable {
        // The reservation is address space: never reported as leaked bytes.
        assert!(group(&r, "vmm-reserved")["live_bytes"].as_u64().unwrap() > 0);
        assert!(text.contains("(address space, not memory)"), "{text}");
        assert!(!text.contains("live at end (leaked) 8.0 GiB"), "{text}");
    }
}

#[test]
fn blocks_and_segments_equal_the_allocators_own_counters() {
    check_basic(&[], false, true);
}

#[test]
fn expandable_segments_place_blocks_in_mapped_pages() {
    check_basic(&[("EMU_TORCH_EXPANDABLE", "1")], true, true);
}

#[test]
fn the_old_report_signature_is_traced_and_forwarded_too() {
    check_basic(&[("EMU_TORCH_OLD_API", "1")], false, false);
}

#[test]
fn an_out_of_memory_is_explained_at_block_level() {
    let run = run_traced("prog_torch", &["oom"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let oom = line(&run.stdout, "oom");
    assert_eq!(oom["got"], "0");
    let r = summary(&run.traces[0]);
    let failures = r["failures"].as_array().unwrap();
    // The allocator asks twice (it frees its free segments and retries) before giving up.
    assert_eq!(failures.len(), 2, "{failures:#?}");
    let last = &failures[1];
    assert_eq!((last["api"].as_str().unwrap(), last["result"].as_u64().unwrap()), ("cudaMalloc", 2));
    assert_eq!(last["size"].as_u64().unwrap(), 500 * MIB);
    let pool = &last["pool"];
    assert_eq!(pool["allocated_bytes"].as_u64().unwrap(), num(&oom, "allocated"));
    assert_eq!(pool["reserved_bytes"].as_u64().unwrap(), num(&oom, "reserved"));
    assert_eq!(pool["cached_bytes"].as_u64().unwrap(), 16 * MIB);
    // What was live then: blocks first, by the functions that hold them.
    let live = &r["last_failure_live"][0];
    assert_eq!(live["kind"], "block");
    assert_eq!(live["live_bytes"].as_u64().unwrap(), num(&oom, "allocated"));
    assert_eq!(site(&live["sites"], "big_activation")["bytes"].as_u64().unwrap(), 600 * MIB);
    assert_eq!(site(&live["sites"], "load_weights")["bytes"].as_u64().unwrap(), 4 * MIB);
}

#[test]
fn a_process_that_never_loads_torch_has_no_block_level() {
    let run = run_traced("prog_runtime_dynamic", &[], &[]);
    assert!(run.out.status.success());
    let t = run.trace();
    assert!(t.events.iter().all(|e| t.api(e).kind != MemKind::Block));
    let r = summary(&run.traces[0]);
    assert!(r["pools"].as_array().unwrap().is_empty());
}

fn python_run(steps: &str) -> Run {
    run_torch_python("torch_python", steps)
}

#[test]
fn the_classic_python_leak_is_named_by_its_line_growing_and_leaked() {
    let run = python_run("8");
    assert!(run.out.status.success(), "{}", run.stderr);
    let lines: HashMap<String, u64> =
        run.stdout.lines().filter(|l| l.starts_with("line ")).map(|l| line(l, "line")).map(|m| (m["name"].clone(), num(&m, "line"))).collect();
    let end = line(&run.stdout, "at name=end");
    let r = summary(&run.traces[0]);
    let blocks = group(&r, "block");
    // Before the interpreter's shutdown freed them: exactly what torch said was allocated.
    assert_eq!(blocks["live_at_python_exit_bytes"].as_u64().unwrap(), num(&end, "allocated"));
    assert_eq!(blocks["peak_bytes"].as_u64().unwrap(), num(&end, "max_allocated"));
    let pool = &r["pools"][0];
    assert_eq!(pool["at"], "python-exit");
    assert_eq!(pool["reserved_bytes"].as_u64().unwrap(), num(&end, "reserved"));
    assert_eq!(pool["allocated_bytes"].as_u64().unwrap(), num(&end, "allocated"));

    let by_line = |sites: &Value, l: u64| -> Value {
        sites
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["line"] == l && s["file"].as_str().unwrap().ends_with("torch_train.py"))
            .cloned()
            .unwrap_or_else(|| panic!("no site at torch_train.py:{l} in {sites:#}"))
    };
    let loss = lines["loss"];
    let leak = by_line(&blocks["leak_sites"], loss);
    assert_eq!((leak["bytes"].as_u64().unwrap(), leak["count"].as_u64().unwrap()), (16 * MIB, 8));
    assert_eq!(by_line(&blocks["leak_sites"], lines["weights"])["bytes"].as_u64().unwrap(), 12 * MIB);
    let growing = blocks["growing_sites"].as_array().unwrap();
    assert_eq!(growing.len(), 1, "{growing:#?}");
    assert_eq!((growing[0]["line"].as_u64().unwrap(), growing[0]["gained_bytes"].as_u64().unwrap()), (loss, 16 * MIB));
    // Gradients made on autograd's thread: the op, the thread, and the line that called
    // backward() on the waiting Python thread.
    let grads = by_line(&blocks["peak_sites"], lines["backward"]);
    let grads = if grads["thread"].is_null() {
        blocks["peak_sites"].as_array().unwrap().iter().find(|s| s["thread"] == "pt_autograd_0").unwrap().clone()
    } else {
        grads
    };
    assert_eq!(grads["line"].as_u64().unwrap(), lines["backward"]);
    assert_eq!(grads["during_backward"], true);
    assert_eq!(grads["op"], "aten::mm in MmBackward0");
    let text = summary_text(&run.traces[0]);
    assert!(text.contains("cached, not leaked"), "{text}");
}
