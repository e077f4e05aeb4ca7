//! Shared test harness: builds the emulated CUDA, runs programs under the preload library and
//! reads what they logged and what the trace recorded.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use gpumemtrace_format::{Api, Event, MemKind, Module, Reader, Record, Stack, Stats};

/// target/debug (or wherever cargo put this test binary's parent).
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// The preload library under test; `cargo build --workspace` makes it.
pub fn shim() -> PathBuf {
    let p = target_dir().join("libgpumemtrace.so");
    assert!(p.exists(), "{} is missing: run `cargo build --workspace` before the tests", p.display());
    p
}

/// The CLI binary.
pub fn cli() -> PathBuf {
    let p = target_dir().join("gpumemtrace");
    assert!(p.exists(), "{} is missing: run `cargo build --workspace` before the tests", p.display());
    p
}

/// Directory holding the emulated libcuda/libcudart and the test programs (built once).
pub fn emu() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = target_dir().join("emucuda");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emucuda");
        let st = Command::new("make").arg("-s").arg("-C").arg(&src).arg(format!("OUT={}", out.display())).status();
        assert!(st.map(|s| s.success()).unwrap_or(false), "building the emulated CUDA failed (needs gcc and make)");
        out
    })
}

/// A fresh, empty scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let d = target_dir().join("test-scratch").join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One line a test program printed about a call it made.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub op: String,
    pub api: String,
    pub kind: String,
    pub ptr: u64,
    pub size: Option<u64>,
    pub result: u32,
    pub line: u32,
    pub device: Option<i32>,
    pub handle: Option<u64>,
}

pub fn parse_log(stdout: &str) -> Vec<Logged> {
    stdout
        .lines()
        .filter(|l| l.starts_with("op="))
        .map(|l| {
            let kv: HashMap<&str, &str> = l.split_whitespace().filter_map(|f| f.split_once('=')).collect();
            let hex = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).unwrap();
            Logged {
                op: kv["op"].into(),
                api: kv["api"].into(),
                kind: kv["kind"].into(),
                ptr: hex(kv["ptr"]),
                size: kv.get("size").map(|v| v.parse().unwrap()),
                result: kv["result"].parse::<i64>().unwrap() as u32,
                line: kv["line"].parse().unwrap(),
                device: kv.get("device").map(|v| v.parse().unwrap()),
                handle: kv.get("handle").map(|v| hex(v)),
            }
        })
        .collect()
}

/// What a trace file holds, decoded.
#[derive(Default, Debug)]
pub struct TraceData {
    pub apis: HashMap<u32, Api>,
    pub events: Vec<Event>,
    pub stacks: HashMap<u32, Stack>,
    pub modules: Vec<Module>,
    pub stats: Option<Stats>,
    pub notices: Vec<String>,
    pub pid: u32,
}

impl TraceData {
    pub fn api(&self, e: &Event) -> &Api {
        &self.apis[&e.api]
    }
    pub fn api_name(&self, e: &Event) -> &str {
        &self.api(e).name
    }
}

pub fn read_trace(path: &Path) -> TraceData {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut t = TraceData::default();
    // A journal left beside the trace holds what the process did not get to write (as the CLI
    // reads it too).
    let mut recovery = gpumemtrace_format::recover::Recovery::beside(path).unwrap();
    let mut recs: Vec<Record> = Reader::new(std::io::BufReader::new(f))
        .unwrap()
        .map(|rec| rec.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        .inspect(|r| {
            if let Some(rc) = &mut recovery {
                rc.observe(r)
            }
        })
        .collect();
    if let Some(rc) = recovery {
        recs.extend(rc.finish());
    }
    for rec in recs {
        match rec {
            Record::Process(p) => t.pid = p.pid,
            Record::Api(a) => {
                t.apis.insert(a.id, a);
            }
            Record::Event(e) => t.events.push(e),
            Record::Stack(s) => {
                t.stacks.insert(s.id, s);
            }
            Record::Module(m) => t.modules.push(m),
            Record::Stats(s) => t.stats = Some(s),
            Record::Notice(n) => t.notices.push(n),
            Record::PyCode(_) | Record::PyStack(_) | Record::Phase(_) | Record::Thread(_) | Record::Unknown(_) => {}
            Record::AggStart(_) | Record::AggSite(_) | Record::AggPeak(_) | Record::AggPhase(_) | Record::AggFailure(_) | Record::AggEnd(_) => {}
        }
    }
    t
}

pub struct Run {
    pub out: Output,
    /// The process id of the program run.
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
    pub dir: PathBuf,
    pub logged: Vec<Logged>,
    /// Trace files the run produced.
    pub traces: Vec<PathBuf>,
}

impl Run {
    pub fn out_pid(&self) -> u32 {
        self.pid
    }

    /// The one trace of the run.
    pub fn trace(&self) -> TraceData {
        assert_eq!(self.traces.len(), 1, "expected one trace, got {:?}\nstderr: {}", self.traces, self.stderr);
        read_trace(&self.traces[0])
    }
}

/// Runs an emulated-CUDA program with the preload library, traces going to a fresh directory.
pub fn run_traced(prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_traced_cmd(Command::new(emu().join(prog)), prog, args, env)
}

/// As `run_traced`, killed after `secs` seconds (a deadlock then fails the test, with status
/// 137, instead of hanging it). The program runs under `timeout(1)`, which the preloaded
/// library leaves alone (it makes no CUDA call).
pub fn run_traced_within(secs: u32, prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", &secs.to_string()]).arg(emu().join(prog));
    run_traced_cmd(cmd, prog, args, env)
}

fn run_traced_cmd(mut cmd: Command, prog: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = scratch(prog);
    cmd.args(args)
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("EMUCUDA_DEVICES", "2")
        // The line naming the trace at exit has a test of its own.
        .env("GPUMEMTRACE_QUIET", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    finish(child.wait_with_output().unwrap(), dir, pid)
}

/// Runs `tests/python/torch_train.py STEPS` traced, on the emulated PyTorch (its fake `torch`
/// package loads `libtorch_cuda.so` through ctypes, RTLD_LOCAL, as Python imports torch).
pub fn run_torch_python(scratch_name: &str, steps: &str) -> Run {
    let dir = scratch(scratch_name);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/torch_train.py");
    let child = Command::new("python3")
        .arg(script)
        .arg(steps)
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("EMUCUDA_DEVICES", "1")
        .env("EMU_TORCH_LIB", emu().join("libtorch_cuda.so"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id();
    finish(child.wait_with_output().unwrap(), dir, pid)
}

pub fn finish(out: Output, dir: PathBuf, pid: u32) -> Run {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let mut traces: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    traces.sort();
    Run { logged: parse_log(&stdout), out, pid, stdout, stderr, dir, traces }
}

pub fn kind_name(k: MemKind) -> &'static str {
    match k {
        MemKind::Device => "device",
        MemKind::Managed => "managed",
        MemKind::HostPinned => "host",
        MemKind::VmmPhysical => "vmm_physical",
        MemKind::VmmReserved => "vmm_reserved",
        MemKind::VmmMapped => "vmm_mapped",
        MemKind::Block => "block",
    }
}

/// `gpumemtrace summary --json` of a trace (or folder), which must succeed.
pub fn summary_json(path: &Path) -> serde_json::Value {
    let out = Command::new(cli()).arg("summary").arg("--json").arg(path).output().unwrap();
    assert!(out.status.success(), "summary: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Sizes of the successful allocations in a trace, in order.
pub fn alloc_sizes(t: &TraceData) -> Vec<u64> {
    t.events
        .iter()
        .filter(|e| e.result == 0 && t.api(e).op == gpumemtrace_format::Op::Alloc)
        .map(|e| e.size)
        .collect()
}

/// A program's output with host pointers (which vary with address-space randomisation)
/// blanked out; emulated device pointers are deterministic and stay.
pub fn normalized(stdout: &str) -> String {
    stdout
        .lines()
        .map(|l| {
            if l.contains("kind=host") || l.contains("kind=managed") {
                l.split_whitespace().map(|f| if f.starts_with("ptr=") { "ptr=HOST" } else { f }).collect::<Vec<_>>().join(" ")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of attribute `name` in an SVG/HTML start tag.
pub fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let k = format!(" {name}=\"");
    let i = tag.find(&k).unwrap_or_else(|| panic!("no {name} in {tag}")) + k.len();
    &tag[i..i + tag[i..].find('"').unwrap()]
}

/// The start tags of elements with class `class`.
pub fn tags<'a>(svg: &'a str, class: &str) -> Vec<&'a str> {
    let k = format!("class=\"{class}\"");
    svg.match_indices(&k)
        .map(|(i, _)| {
            let start = svg[..i].rfind('<').unwrap();
            &svg[start..start + svg[start..].find('>').unwrap()]
        })
        .collect()
}
