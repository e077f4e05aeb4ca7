//! Every path a real program takes to the allocation functions is seen, exactly once per call,
//! with the pointers, sizes, devices and result codes the program itself got.
//!
//! The programs (tests/emucuda) print one `op=...` line per call they make; the trace must hold
//! one event per line, in the same order, with the same values.

mod common;
use common::*;

/// With cudart linked statically, exported-symbol hooks see nothing: the calls are visible
/// only where the runtime reaches the driver (through cuGetProcAddress).
fn driver_level(api: &str) -> &str {
    match api {
        "cudaMalloc" => "cuMemAlloc_v2",
        "cudaFree" => "cuMemFree_v2",
        "cudaMallocPitch" | "cudaMalloc3D" => "cuMemAllocPitch_v2",
        "cudaMallocManaged" => "cuMemAllocManaged",
        "cudaMallocHost" => "cuMemAllocHost_v2",
        "cudaHostAlloc" => "cuMemHostAlloc",
        "cudaFreeHost" => "cuMemFreeHost",
        "cudaMallocAsync" => "cuMemAllocAsync",
        "cudaMallocAsync_ptsz" => "cuMemAllocAsync_ptsz",
        "cudaFreeAsync" => "cuMemFreeAsync",
        "cudaFreeAsync_ptsz" => "cuMemFreeAsync_ptsz",
        "cudaMallocFromPoolAsync" => "cuMemAllocFromPoolAsync",
        "cudaMallocFromPoolAsync_ptsz" => "cuMemAllocFromPoolAsync_ptsz",
        other => other,
    }
}

/// Runs `prog` and checks the trace against its own log, call by call.
fn assert_trace_matches_log(prog: &str, expected_api: impl Fn(&str) -> &str) -> (Run, TraceData) {
    let run = run_traced(prog, &[], &[]);
    assert!(run.out.status.success(), "{prog} failed:\n{}\n{}", run.stdout, run.stderr);
    assert!(run.logged.len() >= 15, "{prog} logged too little: {}", run.stdout);
    let t = run.trace();
    let names: Vec<String> = t.events.iter().map(|e| t.api_name(e).to_owned()).collect();
    assert_eq!(
        t.events.len(),
        run.logged.len(),
        "{prog}: one event per call expected\nlogged: {:#?}\ntraced: {names:?}",
        run.logged.iter().map(|l| &l.api).collect::<Vec<_>>()
    );
    for (i, (l, e)) in run.logged.iter().zip(&t.events).enumerate() {
        let ctx = format!("{prog} call #{i} (line {}): {l:?} vs {e:?}", l.line);
        let api = t.api(e);
        assert_eq!(api.name, expected_api(&l.api), "{ctx}");
        assert_eq!(e.addr, l.ptr, "{ctx}");
        assert_eq!(e.result, l.result, "{ctx}");
        if let Some(size) = l.size {
            assert_eq!(e.size, size, "{ctx}");
        }
        match l.op.as_str() {
            "alloc" => {
                assert_eq!(kind_name(api.kind), l.kind, "{ctx}");
                let logged_dev = l.device.unwrap();
                match l.kind.as_str() {
                    "host" | "vmm_reserved" => assert_eq!(e.device, -1, "{ctx}"),
                    _ => assert_eq!(e.device, logged_dev, "{ctx}"),
                }
            }
            "map" => assert_eq!(Some(e.extra), l.handle, "{ctx}"),
            _ => {}
        }
        if api.op == gpumemtrace_format::Op::Free && e.result == 0 {
            // A free needs no stack (the allocation's says what the memory was); a failed one
            // keeps its stack, for the report of bad frees.
            assert_eq!((e.stack, e.pystack), (0, 0), "{ctx}: a free records no stack");
        } else {
            assert!(e.stack != 0 && t.stacks.contains_key(&e.stack), "{ctx}: no stack");
        }
    }
    let stats = t.stats.expect("a finished trace ends with its counters");
    assert!(stats.final_);
    assert_eq!((stats.events, stats.dropped), (t.events.len() as u64, 0));
    (run, t)
}

#[test]
fn shared_runtime_calls_through_the_plt_are_one_event_each() {
    // The runtime calls the driver inside each call: those nested calls are folded away.
    let (_, t) = assert_trace_matches_log("prog_runtime_dynamic", |a| a);
    assert!(t.events.iter().any(|e| e.device == 1), "allocations on device 1 are attributed to it");
}

#[test]
fn static_runtime_is_seen_through_cu_get_proc_address() {
    assert_trace_matches_log("prog_runtime_static", driver_level);
}

#[test]
fn programs_linked_to_the_driver_are_seen() {
    assert_trace_matches_log("prog_driver", |a| a);
}

#[test]
fn dlsym_lookups_of_the_driver_are_seen() {
    assert_trace_matches_log("prog_dlsym", |a| a);
}

#[test]
fn dlsym_bound_to_the_old_glibc_version_is_seen_too() {
    let elf = std::fs::read(emu().join("prog_dlsym_old")).unwrap();
    assert!(elf.windows(11).any(|w| w == b"GLIBC_2.2.5"), "the program must bind dlsym@GLIBC_2.2.5");
    assert_trace_matches_log("prog_dlsym_old", |a| a);
}

#[test]
fn runtime_driver_entry_points_are_seen() {
    assert_trace_matches_log("prog_entry_point", |a| a);
}

#[test]
fn stream_ordered_calls_record_their_stream() {
    let (run, t) = assert_trace_matches_log("prog_driver", |a| a);
    let async_events: Vec<_> = t.events.iter().filter(|e| t.api_name(e).contains("Async")).collect();
    assert!(!async_events.is_empty(), "{}", run.stdout);
    assert!(async_events.iter().all(|e| e.stream != 0), "{async_events:?}");
}

#[test]
fn stacks_are_raw_return_addresses_inside_the_program() {
    let (run, t) = assert_trace_matches_log("prog_driver", |a| a);
    let prog = std::fs::canonicalize(emu().join("prog_driver")).unwrap();
    let m = t.modules.iter().find(|m| std::path::Path::new(&m.path) == prog).expect("the program is in the module map");
    assert!(!m.build_id.is_empty(), "build-id recorded");
    for e in t.events.iter().filter(|e| e.stack != 0) {
        let frames = &t.stacks[&e.stack].frames;
        assert!(frames.len() <= 64);
        assert!(frames.iter().any(|&a| a >= m.start && a < m.end), "{}: no frame in the program", run.stdout);
        // The tracer's own frames are not recorded.
        let ours = t.modules.iter().find(|m| m.path.ends_with("libgpumemtrace.so")).unwrap();
        assert!(frames.iter().all(|&a| a < ours.start || a >= ours.end));
    }
}

#[test]
fn stack_depth_is_configurable() {
    let run = run_traced("prog_driver", &[], &[("GPUMEMTRACE_FRAMES", "2")]);
    let t = run.trace();
    assert!(t.stacks.values().all(|s| s.frames.len() <= 2));
    let run = run_traced("prog_driver", &[], &[("GPUMEMTRACE_FRAMES", "0")]);
    assert!(run.trace().events.iter().all(|e| e.stack == 0));
}

#[test]
fn many_threads_lose_nothing() {
    let run = run_traced("prog_threads", &["16", "2000"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    // 16 x 2000 malloc/free pairs, and each thread leaks one more allocation.
    assert_eq!(t.events.len(), 16 * 2000 * 2 + 16);
    let allocs = t.events.iter().filter(|e| t.api_name(e) == "cudaMalloc").count();
    assert_eq!(allocs, 16 * 2000 + 16);
    let tids: std::collections::HashSet<u32> = t.events.iter().map(|e| e.tid).collect();
    assert_eq!(tids.len(), 16);
    assert_eq!(t.stats.unwrap().dropped, 0);
}

#[test]
fn rtld_next_keeps_its_meaning_for_other_libraries() {
    // libnext_a's probe() finds libnext_b's through dlsym(RTLD_NEXT): 1 + 10.
    let run = run_traced("prog_rtld_next", &[], &[]);
    assert_eq!(run.stdout.trim(), "probe=11", "{}", run.stderr);
}

#[test]
fn a_process_that_never_allocates_gets_no_file_and_no_thread() {
    let run = run_traced("prog_rtld_next", &[], &[]);
    assert!(run.traces.is_empty());
    let dir = scratch("no-cuda");
    let out = std::process::Command::new("cat")
        .arg("/proc/self/status")
        .env("LD_PRELOAD", shim())
        .current_dir(&dir)
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(status.lines().any(|l| l == "Threads:\t1"), "{status}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert!(out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn default_trace_name_is_by_pid_in_the_working_directory_and_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("default-name");
    let child = std::process::Command::new(emu().join("prog_driver"))
        .env("LD_PRELOAD", shim())
        .env_remove("GPUMEMTRACE_OUTPUT")
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    assert!(child.wait_with_output().unwrap().status.success());
    let path = dir.join(format!("gpumemtrace-{pid}.trace"));
    assert_eq!(read_trace(&path).pid, pid);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
}

#[test]
fn an_existing_file_is_never_overwritten() {
    let dir = scratch("no-overwrite");
    let target = dir.join("fixed.trace");
    std::fs::write(&target, b"someone else's data").unwrap();
    let out = std::process::Command::new(emu().join("prog_driver"))
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", &target)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read(&target).unwrap(), b"someone else's data");
    assert!(!read_trace(&dir.join("fixed.1.trace")).events.is_empty());
}

#[test]
fn disabled_tracing_forwards_calls_and_writes_nothing() {
    let run = run_traced("prog_runtime_dynamic", &[], &[("GPUMEMTRACE_DISABLE", "1")]);
    assert!(run.out.status.success());
    assert!(run.traces.is_empty());
}
