//! The fast unwinder (src/fastunwind.rs) must give the same stacks as libgcc's (the `backtrace`
//! crate, `GPUMEMTRACE_UNWINDER=backtrace`): same return addresses, frame for frame, on programs
//! and libraries built with and without frame pointers, through the emulated runtime and driver (libc, the program),
//! a library opened with dlopen (and reopened after dlclose), and a second thread.

mod common;
use common::*;

/// Each event's stack as (object path, offset in it): comparable across runs (ASLR).
fn stacks(run: &Run) -> Vec<Vec<(String, u64)>> {
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout.trim(), "ok", "{}", run.stderr);
    let t = run.trace();
    t.events
        .iter()
        .map(|e| {
            let frames = if e.stack == 0 { &[][..] } else { &t.stacks[&e.stack].frames[..] };
            frames
                .iter()
                .map(|&a| match t.modules.iter().find(|m| a >= m.start && a < m.end) {
                    Some(m) => (m.path.rsplit('/').next().unwrap().to_owned(), a - m.bias),
                    None => ("?".to_owned(), a),
                })
                .collect()
        })
        .collect()
}

fn compare(prog: &str) {
    // At a limit of 64 frames, so that some walks end at the limit (the memo's cut walks).
    let fast = stacks(&run_traced(prog, &[], &[("GPUMEMTRACE_UNWINDER", "fast"), ("GPUMEMTRACE_FRAMES", "64")]));
    let slow = stacks(&run_traced(prog, &[], &[("GPUMEMTRACE_UNWINDER", "backtrace"), ("GPUMEMTRACE_FRAMES", "64")]));
    assert_eq!(fast.len(), slow.len());
    assert!(fast.len() >= 40, "{} events", fast.len());
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        // The writer reads the module map when it first sees a stack, asynchronously: a library
        // dlclosed in between is missing from it ("?"). Then compare what ASLR keeps: the
        // offset in the page.
        let same = f.len() == s.len()
            && f.iter().zip(s).all(|(a, b)| a == b || ((a.0 == "?" || b.0 == "?") && a.1 & 0xfff == b.1 & 0xfff));
        assert!(same, "{prog}: event {i}: fast unwinder differs from libgcc\nfast   {f:x?}\nlibgcc {s:x?}");
    }
    // The stacks really go through every kind of object.
    let all: Vec<&str> = fast.iter().flatten().map(|(m, _)| m.as_str()).collect();
    // (libunwind_c.so, opened with dlopen, may be "?" for the writer's race described above.)
    for m in [prog, "libunwind_a.so", "libunwind_b.so", "libc.so.6"] {
        assert!(all.contains(&m), "no frame in {m}");
    }
    assert!(fast.iter().any(|s| s.len() == 64), "some stacks are cut at 64 frames");
}

#[test]
fn fast_unwinder_matches_libgcc_without_frame_pointers() {
    compare("prog_unwind_nofp");
}

#[test]
fn fast_unwinder_matches_libgcc_with_frame_pointers() {
    compare("prog_unwind_fp");
}
