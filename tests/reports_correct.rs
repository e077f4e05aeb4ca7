//! Reports that never mislead: the CLI on hand-built traces where an answer could be wrong in a
//! way a reader would not notice (a pipe read twice, a filter that matches nothing, an empty
//! file passing a CI gate, output on the wrong stream).

mod common;
use common::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use gpumemtrace_format::{header, Api, Encoder, Event, MemKind, Op, Phase, PhaseOp, Process, Record, Stack};
use serde_json::Value;

const MIB: u64 = 1 << 20;
const MALLOC: u32 = 1;
const FREE: u32 = 2;
const MALLOC_HOST: u32 = 3;

/// A trace in memory: header, Process, Api table, then what is added.
struct Trace {
    bytes: Vec<u8>,
    enc: Encoder,
}

impl Trace {
    fn new() -> Trace {
        let mut t = Trace { bytes: header().to_vec(), enc: Encoder::new() };
        t.rec(Record::Process(Process {
            pid: 4321,
            ppid: 1,
            exe: "/usr/bin/app".into(),
            args: vec!["app".into()],
            max_frames: 32,
            ..Process::default()
        }));
        for (id, name, kind, op) in [
            (MALLOC, "cudaMalloc", MemKind::Device, Op::Alloc),
            (FREE, "cudaFree", MemKind::Device, Op::Free),
            (MALLOC_HOST, "cudaMallocHost", MemKind::HostPinned, Op::Alloc),
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
        self.rec(Record::Event(Event { api, time_ns: t, device, addr, size, stack, tid: 1, ..Event::default() }))
    }

    fn phase(&mut self, t: u64, op: PhaseOp, name: &str) -> &mut Self {
        self.rec(Record::Phase(Phase { time_ns: t, tid: 1, op, name: name.into() }))
    }

    fn write(&self, path: &Path) {
        std::fs::write(path, &self.bytes).unwrap();
    }
}

/// Device 0 peaks in the middle of the run (the second pass snapshots it there), then frees
/// most of it; host memory too; a "train" phase.
fn sample() -> Trace {
    let mut t = Trace::new();
    t.rec(Record::Stack(Stack { id: 1, frames: vec![0x1000, 0x2000] }))
        .rec(Record::Stack(Stack { id: 2, frames: vec![0x3000] }))
        .event(MALLOC, 10, 0, 0xa000, 64 * MIB, 1)
        .phase(20, PhaseOp::Push, "train")
        .event(MALLOC, 30, 0, 0xb000, 32 * MIB, 2)
        .event(MALLOC, 40, 0, 0xc000, 16 * MIB, 2)
        .event(FREE, 50, 0, 0xb000, 0, 2)
        .event(FREE, 60, 0, 0xc000, 0, 2)
        .phase(70, PhaseOp::Pop, "")
        .event(MALLOC_HOST, 80, -1, 0x7000, 4, 1);
    t
}

fn gmt(args: &[&str]) -> Output {
    Command::new(cli()).args(args).output().unwrap()
}

/// `gpumemtrace ARGS` with `input` on its standard input.
fn gmt_stdin(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(cli())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // Written from another thread: a pipe holds 64 KiB, and the CLI reads while we write.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

fn without_path(mut v: Value) -> Value {
    for t in v["traces"].as_array_mut().unwrap() {
        t["path"] = Value::Null;
    }
    v
}

#[test]
fn summary_of_a_pipe_equals_summary_of_the_file() {
    let dir = scratch("stdin");
    let t = sample();
    let file = dir.join("app.trace");
    t.write(&file);
    let from_file = json(&gmt(&["summary", "--json", s(&file)]));
    assert_eq!(from_file["traces"][0]["groups"][1]["peak_bytes"], 112 * MIB, "{from_file}");
    for name in ["-", "/dev/stdin"] {
        let from_pipe = json(&gmt_stdin(&["summary", "--json", name], &t.bytes));
        assert_eq!(without_path(from_pipe.clone()), without_path(from_file.clone()), "{name}");
        let text = gmt_stdin(&["summary", "--frames", "2", name], &t.bytes);
        let file_text = gmt(&["summary", "--frames", "2", s(&file)]);
        let body = |o: &Output| String::from_utf8_lossy(&o.stdout).lines().skip(1).collect::<Vec<_>>().join("\n");
        assert_eq!(body(&text), body(&file_text), "{name}");
        assert!(body(&text).contains("peak 112.0 MiB (3 live)"), "{}", body(&text));
    }
    // The other reports read a pipe once too.
    let folded_file = gmt(&["flamegraph", "--folded", s(&file)]);
    let folded_pipe = gmt_stdin(&["flamegraph", "--folded", "-"], &t.bytes);
    assert!(folded_file.status.success() && !folded_file.stdout.is_empty(), "{}", stderr(&folded_file));
    assert_eq!(folded_pipe.stdout, folded_file.stdout, "{}", stderr(&folded_pipe));
    // Several inputs, one of them a pipe: the processes together as well.
    let other = dir.join("other.trace");
    sample().write(&other);
    let both = json(&gmt_stdin(&["summary", "--json", "-", s(&other)], &t.bytes));
    assert_eq!(both["merged"]["processes"].as_array().unwrap().len(), 2, "{both}");
    assert_eq!(both["merged"]["devices"][0]["peak_bytes"], 224 * MIB, "{both}");
}

/// `check` with one budget that `sample()` keeps.
fn check(args: &[&str]) -> Output {
    let mut v = vec!["check", "--max-peak", "1GiB"];
    v.extend_from_slice(args);
    gmt(&v)
}

#[test]
fn check_refuses_traces_it_cannot_read_and_filters_that_match_nothing() {
    let dir = scratch("check-unreadable");
    let good = dir.join("good.trace");
    sample().write(&good);
    assert_eq!(check(&[s(&good)]).status.code(), Some(0), "{}", stderr(&check(&[s(&good)])));

    let cases: [(&str, &[u8], &str); 3] = [
        ("empty.trace", b"", "the file is empty"),
        ("short.trace", &header()[..7], "ends inside the trace header (7 of 12 bytes)"),
        ("script.trace", b"#!/bin/sh\necho hello, not a trace\n", "not a gpumemtrace trace"),
    ];
    for (name, bytes, why) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        let o = check(&[s(&p)]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", String::from_utf8_lossy(&o.stdout));
        assert!(stderr(&o).contains(why), "{name}: {}", stderr(&o));
        assert!(!String::from_utf8_lossy(&o.stdout).contains("ok"), "{name}");
        // Among readable traces, too.
        assert_eq!(check(&[s(&good), s(&p)]).status.code(), Some(2), "{name}");
    }

    let o = check(&[s(&good), "--phase", "trian"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--phase \"trian\" matches nothing") && stderr(&o).contains("\"train\""), "{}", stderr(&o));
    let o = check(&[s(&good), "--device", "3"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no allocation on device 3") && stderr(&o).contains("device 0, host memory"), "{}", stderr(&o));
    let no_host = dir.join("no-host.trace");
    let mut t = Trace::new();
    t.event(MALLOC, 1, 0, 0x1000, 10, 0);
    t.write(&no_host);
    let o = check(&[s(&no_host), "--device", "-1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no allocation of host memory (device -1)"), "{}", stderr(&o));

    // Filters that match: judged as usual, a failed check still exits 1.
    assert_eq!(check(&[s(&good), "--phase", "train", "--device", "0"]).status.code(), Some(0));
    assert_eq!(check(&[s(&good), "--device", "-1"]).status.code(), Some(0));
    let o = gmt(&["check", s(&good), "--phase", "train", "--max-peak", "40MiB"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("peak GPU memory 48.0 MiB exceeds --max-peak 40.0 MiB"));
}

fn trace_file(name: &str) -> PathBuf {
    let p = scratch(name).join("src.trace");
    sample().write(&p);
    p
}

#[test]
fn run_json_prints_to_stdout() {
    let src = trace_file("run-json-src");
    let out_dir = scratch("run-json");
    // A stand-in for the traced program: it writes a trace where the library would.
    let script = |pid: u32| format!(r#"cp {} "${{GPUMEMTRACE_OUTPUT}}gpumemtrace-{pid}.trace"; echo program output"#, src.display());
    let o = Command::new(cli())
        .args(["run", "--json", "--output", s(&out_dir), "--", "sh", "-c", &script(77)])
        .env("GPUMEMTRACE_LIB", "/dev/null")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let (program, report) = stdout.split_once('\n').unwrap();
    assert_eq!(program, "program output");
    let v: Value = serde_json::from_str(report).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(v["traces"][0]["pid"], 4321);
    assert!(!stderr(&o).contains("\"traces\""), "{}", stderr(&o));

    // Text stays on stderr: stdout is the program's.
    let o = Command::new(cli())
        .args(["run", "--output", s(&out_dir), "--", "sh", "-c", &script(78)])
        .env("GPUMEMTRACE_LIB", "/dev/null")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "program output\n");
    assert!(stderr(&o).contains("gpumemtrace-78.trace: pid 4321"), "{}", stderr(&o));
}

#[test]
fn diff_offers_only_options_it_has() {
    let help = String::from_utf8(gmt(&["diff", "--help"]).stdout).unwrap();
    assert!(!help.contains("--pid"), "{help}");
    assert!(gmt(&["diff", "--pid", "1", "a", "b"]).status.code() == Some(2));
    // A directory of several traces names its files, not an option diff lacks.
    let dir = scratch("diff-dir");
    sample().write(&dir.join("gpumemtrace-1.trace"));
    sample().write(&dir.join("gpumemtrace-2.trace"));
    let o = gmt(&["diff", s(&dir), s(&dir.join("gpumemtrace-1.trace"))]);
    assert!(!o.status.success());
    assert!(!stderr(&o).contains("--pid") && stderr(&o).contains("gpumemtrace-2.trace"), "{}", stderr(&o));
}

/// What a corrupt or hostile trace may carry and still decode: a time delta that wraps to the
/// top of the clock, sizes whose sum passes 2^64, time running backwards, a free of what was
/// never allocated, a phase popped at the last nanosecond. Every report reads it without a
/// panic (debug builds check every add), and the summary still counts each event.
#[test]
fn extreme_times_and_sizes_reach_every_report_without_a_panic() {
    const HALF: u64 = 1 << 63;
    let mut t = Trace::new();
    t.rec(Record::Stack(Stack { id: 1, frames: vec![0x1000] }))
        .event(MALLOC, 10, 0, 0xa000, HALF, 1)
        .phase(u64::MAX - 1, PhaseOp::Push, "late")
        .event(MALLOC, u64::MAX - 3, 0, 0xb000, HALF, 1)
        .event(MALLOC, 5, 0, 0xc000, u64::MAX, 1)
        .event(FREE, u64::MAX, 0, 0xa000, 0, 1)
        .event(FREE, 0, 0, 0xdead, 0, 1)
        .phase(u64::MAX, PhaseOp::Pop, "")
        .phase(u64::MAX, PhaseOp::Push, "backwards")
        .phase(2, PhaseOp::Pop, "")
        .event(MALLOC_HOST, u64::MAX, -1, u64::MAX, u64::MAX, 1)
        .event(MALLOC_HOST, u64::MAX, -1, 0x10, u64::MAX, 1)
        // A caching allocator's blocks in a segment that ends past the top of the address space.
        .rec(Record::Api(Api { id: 8, name: "block alloc".into(), kind: MemKind::Block, op: Op::Alloc }))
        .rec(Record::Api(Api { id: 9, name: "block free".into(), kind: MemKind::Block, op: Op::Free }))
        .event(MALLOC, 7, 1, u64::MAX - 100, 1000, 1)
        .event(8, 8, 1, u64::MAX - 50, u64::MAX, 1)
        .event(8, 9, 1, u64::MAX, HALF, 1)
        .event(9, 10, 1, u64::MAX - 50, 0, 1)
        // Device numbers no machine has.
        .event(MALLOC, 11, 2_000_000_000, 0x1000, 4096, 1)
        .event(MALLOC, 12, -7, 0x2000, 4096, 1);
    let dir = scratch("extreme");
    let p = dir.join("extreme.trace");
    t.write(&p);
    // Two ranks of a launcher, each starting at the top of the wall clock: a merged summary.
    let ranks = dir.join("ranks");
    std::fs::create_dir(&ranks).unwrap();
    for rank in 0..2 {
        let mut r = Trace { bytes: header().to_vec(), enc: Encoder::new() };
        r.rec(Record::Process(Process {
            pid: 100 + rank,
            start_realtime_ns: u64::MAX - rank as u64,
            rank: Some(rank),
            local_rank: Some(rank),
            ..Process::default()
        }));
        r.rec(Record::Api(Api { id: MALLOC, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }));
        r.event(MALLOC, u64::MAX, 0, 0xa000, HALF, 0).event(MALLOC, u64::MAX, 0, 0xb000, HALF, 0);
        r.write(&ranks.join(format!("rank{rank}.trace")));
    }
    let ranks = ranks.to_str().unwrap();
    let plain = dir.join("plain.trace");
    sample().write(&plain);
    let o = |name: &str| dir.join(name).to_str().unwrap().to_owned();
    let runs: Vec<Vec<String>> = [
        vec!["summary", s(&p)],
        vec!["summary", "--json", "--temporary-threshold", "1", s(&p)],
        vec!["summary", "--phase", "late", "--from", "1s", s(&p)],
        vec!["dump", s(&p)],
        vec!["timeline", s(&p), "-o", &o("t.svg")],
        vec!["timeline", s(&p), "-o", &o("t.html")],
        vec!["report", s(&p), "-o", &o("r.html")],
        vec!["flamegraph", s(&p), "-o", &o("f.svg")],
        vec!["flamegraph", "--of", "allocated", "--folded", s(&p), "-o", &o("f.txt")],
        vec!["tree", s(&p)],
        vec!["tree", "--json", "--of", "leaks", s(&p)],
        vec!["export", "--format", "memviz", s(&p), "-o", &o("m.pickle")],
        vec!["export", "--format", "perfetto", s(&p), "-o", &o("p.json")],
        vec!["export", "--format", "speedscope", s(&p), "-o", &o("s.json")],
        vec!["check", "--max-peak", "1", s(&p)],
        vec!["diff", s(&p), s(&p)],
        vec!["diff", "--json", s(&p), s(&p)],
        vec!["diff", "--json", s(&p), s(&plain)],
        vec!["diff", s(&plain), s(&p)],
        vec!["flamegraph", "--level", "blocks", s(&p), "-o", &o("fb.svg")],
        vec!["export", "--format", "memviz", "--level", "blocks", s(&p), "-o", &o("mb.pickle")],
        vec!["phases", s(&p)],
        vec!["phases", "--json", s(&p)],
        vec!["summary", ranks],
        vec!["summary", "--json", ranks],
        vec!["check", "--max-peak", "1", ranks],
        vec!["timeline", ranks, "--pid", "100", "-o", &o("r.svg")],
    ]
    .iter()
    .map(|a| a.iter().map(|x| x.to_string()).collect())
    .collect();
    let mut panicked = Vec::new();
    for args in &runs {
        let out = gmt(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let err = stderr(&out);
        if err.contains("panicked") || out.status.code() == Some(101) {
            panicked.push(format!("{args:?}: {}", err.lines().find(|l| l.contains("panicked")).unwrap_or(&err)));
        }
    }
    assert!(panicked.is_empty(), "{}", panicked.join("\n"));
    let out = gmt(&["summary", "--json", s(&p)]);
    assert_eq!(json(&out)["traces"][0]["events"], 13);
    // Such values are not findings: the reader is told the trace is likely corrupt, by
    // the summary and by the other reports; a plain trace gets no such warning.
    let corrupt = "more than any address space: no process does this; the trace is likely corrupt";
    assert!(stderr(&out).contains(corrupt), "{}", stderr(&out));
    assert!(stderr(&gmt(&["timeline", s(&p), "-o", &o("w.svg")])).contains(corrupt));
    // `check` judges budgets on such figures: it warns too.
    assert!(stderr(&gmt(&["check", s(&p), "--max-peak", "1TiB"])).contains(corrupt));
    assert!(!stderr(&gmt(&["summary", s(&plain)])).contains("likely corrupt"));
}
