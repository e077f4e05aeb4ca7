//! Tests of the summary.

use std::path::Path;

use super::build::build;
use super::render::render;
use super::run::Json;
use super::report::*;
use crate::symbolize::Symbolizer;
use crate::model::tests::*;
use gpumemtrace_format::{Module, Record, Stats};
use serde_json::{json, Value};

fn report(b: &TraceBuilder, opts: &Options) -> TraceReport {
    let trace = b.load();
    build(Path::new("t.trace"), &trace, &mut Symbolizer::new(), opts)
}

fn json_of(b: &TraceBuilder, opts: &Options) -> Value {
    let r = report(
        b,
        &Options {
            json: true,
            ..opts.clone()
        },
    );
    serde_json::to_value(Json { traces: &[r], merged: None }).unwrap()["traces"][0].clone()
}

fn frame(address: u64) -> Value {
    json!({"function": null, "file": null, "line": null, "module": null, "address": address})
}

fn sample() -> TraceBuilder {
    let mut b = TraceBuilder::new();
    b.stack(1, &[0x100, 0x200])
        .stack(2, &[0x300])
        .ok(MALLOC, 1_000, 0x1000, 100, 1)
        .ok(MALLOC, 2_000, 0x2000, 300, 2)
        .ok(MALLOC, 3_000, 0x3000, 100, 1)
        .ok(FREE, 4_000, 0x2000, 0, 0)
        .call(MALLOC, 5_000, 0, 0, 1 << 30, 2, 2)
        .ok(FREE, 6_000, 0xdead, 0, 1)
        .rec(Record::Notice("hello".into()))
        .rec(Record::Stats(Stats {
            events: 7,
            dropped: 4,
            final_: true,
        }));
    b
}

#[test]
fn json_follows_the_schema() {
    let v = json_of(&sample(), &Options::default());
    let site1 = json!({"bytes": 200, "count": 2, "function": null, "file": null, "line": null, "module": null,
                       "address": 0x100, "frames": [frame(0x100), frame(0x200)]});
    let expected = json!({
        "path": "t.trace", "pid": 1234, "exe": "/usr/bin/demo", "args": ["demo", "--fast"],
        "status": "complete", "stopped_at": null, "error": null,
        "events": 6, "dropped": 4, "notices": ["hello"],
        "groups": [{
            "device": 0, "kind": "device", "allocations": 3, "allocated_bytes": 500, "frees": 1, "failed": 1,
            "peak_bytes": 500, "peak_time_ns": 3_000,
            "peak_sites": [
                {"bytes": 300, "count": 1, "function": null, "file": null, "line": null, "module": null,
                 "address": 0x300, "frames": [frame(0x300)]},
                site1,
            ],
            "live_bytes": 200, "live_count": 2, "live_at_python_exit_bytes": null,
            "live_at_python_exit_count": null, "leak_sites": [site1], "growing_sites": [],
        }],
        "devices": [{"device": 0, "peak_bytes": 500, "peak_time_ns": 3_000, "live_bytes": 200}],
        "failures": [{"api": "cudaMalloc", "device": 0, "kind": "device", "size": 1u64 << 30, "result": 2,
                      "error": "cudaErrorMemoryAllocation", "class": "out-of-memory",
                      "time_ns": 5_000, "live_bytes_on_device": 200, "site": frame(0x300), "frames": [frame(0x300)]}],
        "last_failure_live": [{"device": 0, "kind": "device", "live_bytes": 200, "live_count": 2,
                               "sites": [{"bytes": 200, "count": 2, "function": null, "file": null, "line": null,
                                          "module": null, "address": 0x100, "frames": [frame(0x100), frame(0x200)]}]}],
        "unknown_frees": [{"api": "cudaFree", "addr": 0xdead, "result": 0, "time_ns": 6_000,
                           "site": frame(0x100), "frames": [frame(0x100), frame(0x200)]}],
        "pools": [],
    });
    assert_eq!(v, expected);
}

#[test]
fn json_status_of_a_truncated_trace() {
    let mut b = sample();
    let len = b.bytes.len();
    b.bytes.truncate(len - 1);
    let v = json_of(&b, &Options::default());
    assert_eq!(v["status"], "truncated");
    assert!(v["stopped_at"].as_u64().unwrap() > 12);
    assert!(v["error"].as_str().unwrap().contains("byte"));
    assert_eq!(v["dropped"], 0); // the Stats record was the one cut
}

#[test]
fn top_and_device_filter() {
    let mut b = TraceBuilder::new();
    for i in 0..12u64 {
        b.stack(i as u32 + 1, &[0x1000 + i]).ok(
            MALLOC,
            i,
            0x10_000 + i,
            1000 - i,
            i as u32 + 1,
        );
    }
    b.call(MALLOC, 20, 1, 0x9000, 5, 0, 0);
    // JSON lists are complete unless --top is given.
    let v = json_of(&b, &Options::default());
    assert_eq!(v["groups"][0]["leak_sites"].as_array().unwrap().len(), 12);
    assert_eq!(v["groups"].as_array().unwrap().len(), 2);
    let v = json_of(
        &b,
        &Options {
            top: Some(3),
            device: Some(1),
            ..Options::default()
        },
    );
    assert_eq!(v["groups"].as_array().unwrap().len(), 1);
    assert_eq!(v["groups"][0]["device"], 1);
    assert_eq!(v["devices"].as_array().unwrap().len(), 1);
    let v = json_of(
        &b,
        &Options {
            top: Some(3),
            ..Options::default()
        },
    );
    let bytes: Vec<u64> = v["groups"][0]["leak_sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(bytes, [1000, 999, 998]);
    // The terminal shows 10 by default.
    let r = report(&b, &Options::default());
    assert_eq!(
        (r.groups[0].leak_sites.len(), r.groups[0].more_leak_sites),
        (10, 2)
    );
}

#[test]
fn sites_merge_by_symbol_and_skip_cuda_frames() {
    use crate::symbolize::native::tests::{module_containing, probe_target};
    let f = probe_target as *const () as usize as u64;
    let mut exe = module_containing(f);
    exe.id = 2;
    let mut b = TraceBuilder::new();
    b.rec(Record::Module(Module {
        id: 1,
        bias: 0x5000_0000,
        start: 0x5000_0000,
        end: 0x5100_0000,
        path: "/nonexistent/libcudart.so.12".into(),
        build_id: vec![],
    }))
    .rec(Record::Module(exe))
    // Different stacks, different CUDA frames, one call site.
    .stack(1, &[0x5000_1000, f + 1, 0x8000_0000])
    .stack(2, &[0x5000_2000, f + 1, 0x9000_0000])
    // Unsymbolized sites stay apart by stack, even at the same address.
    .stack(3, &[0x5000_3000, 0x7000_0000])
    .stack(4, &[0x7000_0000])
    .ok(MALLOC, 1, 0x1, 10, 1)
    .ok(MALLOC, 2, 0x2, 20, 2)
    .ok(MALLOC, 3, 0x3, 7, 3)
    .ok(MALLOC, 4, 0x4, 5, 4);
    let r = report(&b, &Options::default());
    let leaks = &r.groups[0].leak_sites;
    let got: Vec<_> = leaks
        .iter()
        .map(|s| (s.bytes, s.count, s.site.address, s.site_index))
        .collect();
    assert_eq!(
        got,
        [
            (30, 2, f + 1, 1),
            (7, 1, 0x7000_0000, 1),
            (5, 1, 0x7000_0000, 0)
        ]
    );
    assert!(leaks[0]
        .site
        .function
        .as_deref()
        .unwrap()
        .ends_with("probe_target"));
    // The sample stack is the one that contributed most.
    assert_eq!(leaks[0].frames[0].describe(), "libcudart.so.12+0x2000");
    assert_eq!(leaks[0].frames.last().unwrap().address, 0x9000_0000);
}

/// One allocation function (`alloc_buffer`), two callers: 3 MiB from `caller_a`, 10 MiB from
/// `caller_b` (Python frames: symbolized without debug information).
pub(crate) fn two_callers() -> TraceBuilder {
    use gpumemtrace_format::{Event, PyCode, PyFrame, PyStack};
    let mut b = TraceBuilder::new();
    for (id, name, file, line) in
        [(1, "alloc_buffer", "/src/model.py", 10), (2, "caller_a", "/src/train.py", 5), (3, "caller_b", "/src/train.py", 9)]
    {
        b.rec(Record::PyCode(PyCode {
            id,
            name: name.into(),
            qualname: name.into(),
            filename: file.into(),
            firstlineno: line,
            ..PyCode::default()
        }));
    }
    let frame = |code| PyFrame { code, instr_offset: 0, flags: 0 };
    b.rec(Record::PyStack(PyStack { id: 1, frames: vec![frame(1), frame(2)] }))
        .rec(Record::PyStack(PyStack { id: 2, frames: vec![frame(1), frame(3)] }));
    for (t, addr, size, pystack) in [(1, 0x1000, 3 << 20, 1), (2, 0x2000, 10 << 20, 2)] {
        b.rec(Record::Event(Event {
            api: MALLOC,
            time_ns: t,
            addr,
            size,
            pystack,
            tid: 1,
            ..Event::default()
        }));
    }
    b
}

#[test]
fn sites_are_told_apart_by_the_frames_shown() {
    let b = two_callers();
    let sites = |frames: usize, json: bool| {
        let r = report(&b, &Options { frames, json, ..Options::default() });
        r.groups[0]
            .peak_sites
            .iter()
            .map(|s| {
                let shown: Vec<String> =
                    s.frames[s.site_index..].iter().take(frames).map(|f| f.describe()).collect();
                (s.bytes, shown.join(" <- "))
            })
            .collect::<Vec<_>>()
    };
    // One frame shown: one site, its two callers together.
    assert_eq!(sites(1, false), [(13 << 20, "alloc_buffer model.py:10".to_string())]);
    // Two frames shown: each caller with its own bytes, never 13 MiB "from" caller_b.
    let want = [
        (10 << 20, "alloc_buffer model.py:10 <- caller_b train.py:9".to_string()),
        (3 << 20, "alloc_buffer model.py:10 <- caller_a train.py:5".to_string()),
    ];
    assert_eq!(sites(2, false), want);
    assert_eq!(sites(3, true), want, "JSON groups by the same frames");
    // The terminal says the same.
    let opts = Options { frames: 2, ..Options::default() };
    let mut out = Vec::new();
    render(&report(&b, &opts), &opts, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("    10.0 MiB     1x  alloc_buffer model.py:10\n                     from caller_b train.py:9\n")
            && text.contains("     3.0 MiB     1x  alloc_buffer model.py:10\n                     from caller_a train.py:5\n"),
        "{text}"
    );
}

#[test]
fn a_capability_probe_is_not_a_failed_allocation() {
    // PyTorch asks cuMemCreate for a fabric handle (not permitted here), later runs out of memory.
    let mut b = TraceBuilder::new();
    b.stack(1, &[0x100])
        .stack(2, &[0x200])
        .ok(MALLOC, 1, 0x1000, 100, 1)
        .call(MEM_CREATE, 2, 0, 0, 2 << 20, 2, 800)
        .call(MALLOC, 3, 0, 0, 1 << 30, 1, 2);
    let r = report(&b, &Options::default());
    let mut out = Vec::new();
    render(&r, &Options::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let expected = "\
failed allocations: 1 out of memory; other errors: 1 (CUDA_ERROR_NOT_PERMITTED from cuMemCreate, a capability probe)
  cudaMalloc 1.0 GiB on device 0 -> error 2 (out of memory) at 0.000 s, 100 B live on device 0  at  0x100
  when the last one failed (cudaMalloc of 1.0 GiB), live on device 0:
    device memory: 100 B in 1 allocation
       100 B     1x  0x100
other errors of allocation calls (not out of memory):
  cuMemCreate 2.0 MiB on device 0 -> error 800 (CUDA_ERROR_NOT_PERMITTED: not permitted), a capability probe (asking whether the device supports a kind of memory handle; not a failed allocation) at 0.000 s  at  0x200
";
    assert!(text.ends_with(expected), "{text}");
    assert!(text.contains("device 0, device memory: 1 allocation, 100 B allocated, 0 frees, 1 failed (out of memory)\n"), "{text}");
    assert!(
        text.contains("device 0, vmm-physical memory: 0 allocations, 0 B allocated, 0 frees, failed: 0 out of memory; other errors: 1 (CUDA_ERROR_NOT_PERMITTED from cuMemCreate, a capability probe)\n"),
        "{text}"
    );
    // JSON says which is which, in trace order.
    let v = json_of(&b, &Options::default());
    let got: Vec<(&str, &str)> =
        v["failures"].as_array().unwrap().iter().map(|f| (f["error"].as_str().unwrap(), f["class"].as_str().unwrap())).collect();
    assert_eq!(got, [("CUDA_ERROR_NOT_PERMITTED", "capability-probe"), ("cudaErrorMemoryAllocation", "out-of-memory")]);
    // Several other errors are counted by name.
    let mut b = TraceBuilder::new();
    b.call(MEM_CREATE, 1, 0, 0, 2 << 20, 2, 800).call(MEM_CREATE, 2, 0, 0, 2 << 20, 2, 800).call(MALLOC, 3, 0, 0, 0, 1, 1);
    let r = report(&b, &Options::default());
    let mut out = Vec::new();
    render(&r, &Options::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("failed allocations: 0 out of memory; other errors: 3 (1x cudaErrorInvalidValue from cudaMalloc; 2x CUDA_ERROR_NOT_PERMITTED from cuMemCreate, capability probes)\n"),
        "{text}"
    );
    assert!(!text.contains("when the last one failed"), "{text}");
}

#[test]
fn host_memory_is_called_host_memory_under_its_own_heading() {
    let mut b = TraceBuilder::new();
    b.stack(1, &[0x100])
        .call(MALLOC_HOST, 1, -1, 0x7000, 4, 1, 0)
        .call(ADDRESS_RESERVE, 2, -1, 0x4000_0000, 1 << 30, 1, 0)
        .ok(MALLOC, 3, 0x1000, 100, 1)
        .call(MALLOC_HOST, 4, -1, 0, 1 << 40, 1, 2);
    for opts in [Options::default(), Options { device: Some(-1), ..Options::default() }] {
        let r = report(&b, &opts);
        let mut out = Vec::new();
        render(&r, &opts, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\nhost memory (pinned): 1 allocation, 4 B allocated, 0 frees, 1 failed (out of memory)\n  peak 4 B (1 live) at 0.000 s:\n         4 B     1x  0x100\n"),
            "{text}"
        );
        assert!(text.contains("\nvmm-reserved address space: 1 allocation, 1.0 GiB allocated"), "{text}");
        assert!(text.contains("  cudaMallocHost 1.0 TiB of host memory -> error 2 (out of memory) at 0.000 s  at  0x100\n"), "{text}");
        // Every peak line has a heading right above it.
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate().filter(|(_, l)| l.trim_start().starts_with("peak ")) {
            assert!(i > 0 && !lines[i - 1].starts_with(' '), "no heading above {l:?}:\n{text}");
        }
        for word in ["no device", "device -1", "host,"] {
            assert!(!text.contains(word), "{word:?} in:\n{text}");
        }
    }
}

#[test]
fn vmm_mappings_are_shown_once_backed_by_their_handles() {
    use gpumemtrace_format::Event;
    let map = |t, va, size, handle| {
        Record::Event(Event { api: MEM_MAP, time_ns: t, addr: va, size, extra: handle, stack: 2, tid: 1, ..Event::default() })
    };
    let mut b = TraceBuilder::new();
    b.stack(1, &[0x100])
        .stack(2, &[0x200])
        .ok(MEM_CREATE, 1, 0x10, 2 << 20, 1)
        .ok(MEM_CREATE, 2, 0x20, 2 << 20, 1) // created, never mapped: still GPU memory
        .call(ADDRESS_RESERVE, 3, -1, 0x4000_0000, 8 << 20, 2, 0)
        .rec(map(4, 0x4000_0000, 2 << 20, 0x10));
    let r = report(&b, &Options::default());
    let mut out = Vec::new();
    render(&r, &Options::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let expected = "\
device 0, vmm-mapped memory: 1 allocation, 2.0 MiB allocated, 0 frees, 0 failed
  peak 2.0 MiB (1 live) at 0.000 s:
     2.0 MiB     1x  0x200
  backed by physical memory (the same bytes, not more): 2 cuMemCreate handles, 4.0 MiB created, 0 releases, peak 4.0 MiB; held at the end 4.0 MiB in 2 handles, 2.0 MiB more than is mapped:
     4.0 MiB     2x  0x100
  live at end (leaked) 2.0 MiB in 1 allocation:
     2.0 MiB     1x  0x200
";
    assert!(text.contains(expected), "{text}");
    assert!(!text.contains("vmm-physical memory:"), "physical memory is not a second group of its own: {text}");
    // JSON keeps both groups, for tools.
    let v = json_of(&b, &Options::default());
    let kinds: Vec<&str> = v["groups"].as_array().unwrap().iter().map(|g| g["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["vmm-reserved", "vmm-physical", "vmm-mapped"]);
    // Handles without mappings are shown as what they are.
    let mut b = TraceBuilder::new();
    b.ok(MEM_CREATE, 1, 0x10, 2 << 20, 1);
    let r = report(&b, &Options::default());
    let mut out = Vec::new();
    render(&r, &Options::default(), &mut out).unwrap();
    assert!(String::from_utf8(out).unwrap().contains("device 0, vmm-physical memory: 1 allocation"));
}

#[test]
fn terminal_output() {
    let mut out = Vec::new();
    let r = report(&sample(), &Options::default());
    render(&r, &Options::default(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let expected = "\
t.trace: pid 1234 /usr/bin/demo (demo --fast), 6 events, complete
  warning: the tracer dropped 4 events; the numbers below miss them
  notice: hello
device 0, device memory: 3 allocations, 500 B allocated, 1 free, 1 failed (out of memory)
  peak 500 B (3 live) at 0.000 s:
       300 B     1x  0x300
       200 B     2x  0x100
  live at end (leaked) 200 B in 2 allocations:
       200 B     2x  0x100
failed allocations: 1 out of memory
  cudaMalloc 1.0 GiB on device 0 -> error 2 (out of memory) at 0.000 s, 200 B live on device 0  at  0x300
  when the last one failed (cudaMalloc of 1.0 GiB), live on device 0:
    device memory: 200 B in 2 allocations
       200 B     2x  0x100
frees of unknown pointers, and failed frees:
  cudaFree 0xdead -> not allocated in the trace at 0.000 s  at  0x100
";
    assert_eq!(text, expected);

    let mut out = Vec::new();
    render(
        &r,
        &Options {
            frames: 2,
            ..Options::default()
        },
        &mut out,
    )
    .unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("       200 B     2x  0x100\n                     from 0x200\n"),
        "{text}"
    );
}
