//! `cargo bench --bench summary_speed`: how long `gpumemtrace summary` takes on a 10-million-event
//! trace, and how much memory it needs (it should grow with the live set, not the event count).
//!
//! The trace is synthetic but shaped like a training run: a few hundred distinct stacks, alloc/free
//! pairs with address reuse, a slowly growing set of leaks, and one failed allocation.
//!
//! `LIVE=5000000 cargo bench --bench summary_speed`: instead, a trace of that many allocations
//! never freed, for the reader's memory per live allocation (max RSS over the live count).
//! `GPUMEMTRACE_CLI=path` measures that CLI instead of building the release one.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use gpumemtrace_format::{header, Api, Encoder, Event, MemKind, Op, Process, Record, Stack};

fn write_trace(path: &Path, events: u64) {
    let mut out = Vec::with_capacity(1 << 24);
    out.extend_from_slice(&header());
    let mut enc = Encoder::new();
    let mut put = |rec: &Record, out: &mut Vec<u8>| enc.encode(rec, out);
    put(&Record::Process(Process { pid: 1, max_frames: 64, ..Process::default() }), &mut out);
    put(&Record::Api(Api { id: 0, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }), &mut out);
    put(&Record::Api(Api { id: 1, name: "cudaFree".into(), kind: MemKind::Device, op: Op::Free }), &mut out);
    for id in 1..=300u32 {
        let frames: Vec<u64> = (0..40).map(|i| 0x5555_0000_0000 + (id as u64) * 0x1000 + i * 0x40).collect();
        put(&Record::Stack(Stack { id, frames }), &mut out);
    }
    let mut f = std::fs::File::create(path).unwrap();
    let mut t = 0u64;
    let mut n = 0u64;
    let mut leak = 0u64;
    while n < events {
        // 64 live slots reused round-robin; every 1000th pair leaks instead of freeing.
        let slot = n / 2 % 64;
        let addr = 0x7f00_0000_0000 + slot * (1 << 24);
        let stack = (n / 2 % 300) as u32 + 1;
        let size = (1 + n % 7) << 20;
        t += 1000;
        put(&Record::Event(Event { api: 0, time_ns: t, tid: 1, stack, addr, size, ..Event::default() }), &mut out);
        t += 1000;
        if (n / 2) % 1000 == 999 {
            leak += 1;
            let addr = 0x7e00_0000_0000 + leak * (1 << 24);
            put(&Record::Event(Event { api: 0, time_ns: t, tid: 1, stack, addr, size, ..Event::default() }), &mut out);
        } else {
            put(&Record::Event(Event { api: 1, time_ns: t, tid: 1, stack, addr, ..Event::default() }), &mut out);
        }
        n += 2;
        if out.len() > 1 << 24 {
            f.write_all(&out).unwrap();
            out.clear();
        }
    }
    put(&Record::Event(Event { api: 0, time_ns: t + 1, tid: 1, stack: 1, result: 2, size: 1 << 40, ..Event::default() }), &mut out);
    f.write_all(&out).unwrap();
}

/// `live` allocations from 300 stacks on two devices, none freed: all live at the end.
fn write_live_trace(path: &Path, live: u64) {
    let mut out = Vec::with_capacity(1 << 24);
    out.extend_from_slice(&header());
    let mut enc = Encoder::new();
    let mut put = |rec: &Record, out: &mut Vec<u8>| enc.encode(rec, out);
    put(&Record::Process(Process { pid: 1, max_frames: 64, ..Process::default() }), &mut out);
    put(&Record::Api(Api { id: 0, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }), &mut out);
    for id in 1..=300u32 {
        let frames: Vec<u64> = (0..40).map(|i| 0x5555_0000_0000 + (id as u64) * 0x1000 + i * 0x40).collect();
        put(&Record::Stack(Stack { id, frames }), &mut out);
    }
    let mut f = std::fs::File::create(path).unwrap();
    for n in 0..live {
        let addr = 0x7f00_0000_0000 + n * 512;
        let ev = Event { api: 0, time_ns: n * 100, tid: 1, stack: (n % 300) as u32 + 1, device: (n % 2) as i32, addr, size: 512, ..Event::default() };
        put(&Record::Event(ev), &mut out);
        if out.len() > 1 << 24 {
            f.write_all(&out).unwrap();
            out.clear();
        }
    }
    f.write_all(&out).unwrap();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR").map(Into::into).unwrap_or_else(|| root.join("target"));
    let cli = match std::env::var_os("GPUMEMTRACE_CLI") {
        Some(p) => p.into(),
        None => {
            let status = Command::new("cargo").args(["build", "--release", "-p", "gpumemtrace-cli"]).current_dir(root).status().unwrap();
            assert!(status.success());
            target.join("release/gpumemtrace")
        }
    };
    let dir = target.join("bench-scratch");
    std::fs::create_dir_all(&dir).unwrap();
    let live: Option<u64> = std::env::var("LIVE").ok().and_then(|v| v.parse().ok());
    let events: u64 = live.unwrap_or_else(|| std::env::var("EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000_000));
    let trace = match live {
        Some(n) => dir.join(format!("synthetic-live-{n}.trace")),
        None => dir.join(format!("synthetic-{events}.trace")),
    };
    if !trace.exists() {
        match live {
            Some(n) => write_live_trace(&trace, n),
            None => write_trace(&trace, events),
        }
    }
    let bytes = std::fs::metadata(&trace).unwrap().len();
    println!("| events | trace MiB | bytes/event | run | wall s | max RSS MiB |");
    println!("|---|---|---|---|---|---|");
    for args in [&["summary"][..], &["summary", "--json"][..]] {
        let t0 = Instant::now();
        let child = Command::new(&cli)
            .args(args)
            .arg(&trace)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut status = 0;
        // SAFETY: waiting for our own child with a zeroed rusage we own (this child's alone, not
        // the cargo build's above); `child` is not waited on again.
        let rss_kib = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut ru);
            ru.ru_maxrss
        };
        let wall = t0.elapsed().as_secs_f64();
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
        println!(
            "| {events} | {:.0} | {:.1} | `gpumemtrace {}` | {wall:.2} | {:.0} |",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / events as f64,
            args.join(" "),
            rss_kib as f64 / 1024.0
        );
        if let Some(n) = live {
            println!("max RSS per live allocation: {:.1} bytes", rss_kib as f64 * 1024.0 / n as f64);
        }
    }
    // The reader thread's part alone (decoding, in this process): where a third core is free the
    // replay and the model's observers run beside it, and its pace bounds the summary's.
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let f = std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(&trace).unwrap());
        let mut n = 0u64;
        for rec in gpumemtrace_format::Reader::new(f).unwrap() {
            if let Record::Event(_) = rec.unwrap() {
                n += 1;
            }
        }
        assert!(n >= events, "events decoded: {n}");
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!("| {events} | | | decoding alone (best of 3, in process) | {best:.2} | |");
}
