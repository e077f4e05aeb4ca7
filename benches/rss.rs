//! `cargo bench --bench rss`: memory the tracer adds to a traced process on a long run: the
//! same allocation loop (tests/emucuda/bench_alloc.c) untraced and traced, peak RSS of each
//! (from `wait4`), and the difference.

use std::process::Command;

/// Runs `cmd` and returns its peak RSS in KiB.
fn peak_rss_kib(cmd: &mut Command) -> i64 {
    let child = cmd.stdout(std::process::Stdio::null()).spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: waiting for our own child with a zeroed rusage we own; `child` is not waited on
    // again (it is dropped, which does not wait).
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::wait4(pid, &mut status, 0, &mut ru);
        ru
    };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "status {status}");
    ru.ru_maxrss
}

fn main() {
    // BENCH_ROOT: run from a copy of the built tree elsewhere (no cargo, no compiler there).
    let root = std::env::var_os("BENCH_ROOT").map(std::path::PathBuf::from).unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into());
    let root = root.as_path();
    let prebuilt = std::env::var_os("BENCH_ROOT").is_some();
    if !prebuilt {
        assert!(Command::new("cargo").args(["build", "--release", "-p", "gpumemtrace"]).current_dir(root).status().unwrap().success());
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map(Into::into).unwrap_or_else(|| root.join("target"));
    let emu = target.join("emucuda");
    if !prebuilt {
        assert!(Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(root.join("tests/emucuda"))
            .arg(format!("OUT={}", emu.display()))
            .status()
            .unwrap()
            .success());
    }
    let shim = target.join("release/libgpumemtrace.so");
    let scratch = target.join("bench-scratch/rss");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    println!("| run | threads x pairs | caller depth | peak RSS untraced MiB | peak RSS traced MiB | added MiB |");
    println!("|---|---|---|---|---|---|");
    for (threads, pairs, depth) in [(1u32, 2_000_000u32, 30u32), (8, 500_000, 30)] {
        let args = [threads.to_string(), pairs.to_string(), depth.to_string()];
        let base = peak_rss_kib(Command::new(emu.join("bench_alloc")).args(&args));
        let traced = peak_rss_kib(
            Command::new(emu.join("bench_alloc"))
                .args(&args)
                .env("LD_PRELOAD", &shim)
                .env("GPUMEMTRACE_OUTPUT", format!("{}/", scratch.display())),
        );
        for e in std::fs::read_dir(&scratch).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        println!(
            "| bench_alloc | {threads} x {pairs} | {depth} | {:.1} | {:.1} | {:.1} |",
            base as f64 / 1024.0,
            traced as f64 / 1024.0,
            (traced - base) as f64 / 1024.0
        );
    }
}
