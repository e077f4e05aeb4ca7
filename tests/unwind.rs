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

/// The number in the trace's "native unwinding: N frames walked by rule" notice (0 without it).
fn frames_walked_by_rule(run: &Run) -> u64 {
    let t = run.trace();
    t.notices
        .iter()
        .find_map(|n| n.strip_prefix("native unwinding: ")?.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[test]
fn fast_unwinder_matches_libgcc_where_only_some_frames_use_rbp() {
    // prog_unwind_bp: a frame like libffi's ffi_call_unix64 (CFA = rbp + 32, a rule framehop
    // evaluates every time), a frame-pointer frame whose inner frames are at the same stack
    // addresses at two depths (only the rbp saved further in tells the stacks apart), and a loop
    // keeping a changing value in rbp that no frame uses as a frame pointer.
    let fast_run = run_traced("prog_unwind_bp", &[], &[("GPUMEMTRACE_UNWINDER", "fast")]);
    let fast = stacks(&fast_run);
    let slow = stacks(&run_traced("prog_unwind_bp", &[], &[("GPUMEMTRACE_UNWINDER", "backtrace")]));
    assert_eq!(fast.len(), slow.len());
    assert_eq!(fast.iter().filter(|s| !s.is_empty()).count(), 3060, "one stack per allocation");
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        assert_eq!(f, s, "event {i}: fast unwinder differs from libgcc");
    }
    // Both variants of each of the first three loops are there (in_big's and in_small's too).
    let distinct: std::collections::HashSet<_> = fast.iter().filter(|s| !s.is_empty()).collect();
    assert_eq!(distinct.len(), 7, "{distinct:#x?}");
    // The 3000 calls of the last loop differ only in rbp: the memo of the previous walk takes
    // them, so fewer frames are walked by rule in the whole run than there are calls in that loop
    // (without it, each call walks its innermost frames again: 45884 frames measured).
    let walked = frames_walked_by_rule(&fast_run);
    assert!(walked < 3000, "{walked} frames walked by rule");
}

#[test]
fn places_visited_in_turn_are_unwound_by_rule_only_the_first_time() {
    // A training step allocates from tens of places in turn; each native stack differs from the
    // previous one. The thread's recent walks are kept (not only the previous one), so once
    // every place was seen, a round of them walks no frame by rule, and the stacks stay libgcc's.
    let run = |rounds: &str, unwinder: &str| {
        run_traced("prog_unwind_nofp", &[rounds], &[("GPUMEMTRACE_UNWINDER", unwinder), ("GPUMEMTRACE_FRAMES", "64")])
    };
    let (one, many) = (run("1", "fast"), run("201", "fast"));
    let fast = stacks(&many);
    let slow = stacks(&run("201", "backtrace"));
    assert_eq!(fast.len(), slow.len());
    assert!(fast.iter().filter(|s| !s.is_empty()).count() >= 1000, "200 rounds of 5 places");
    for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
        assert_eq!(f, s, "event {i}: fast unwinder differs from libgcc");
    }
    // With only the previous walk kept, the 200 extra rounds walked 34709 more frames by rule
    // (measured). Now none: the counts are added in batches of 256, so that is the slack.
    let (w1, w201) = (frames_walked_by_rule(&one), frames_walked_by_rule(&many));
    assert!(w201 < w1 + 256, "{w1} frames by rule for 1 round, {w201} for 201");
}

#[test]
fn self_time_counts_every_event_by_kind_and_splits_its_time_into_parts() {
    let run = run_traced("prog_unwind_nofp", &["20"], &[("GPUMEMTRACE_SELF_TIME", "1")]);
    let t = run.trace();
    let note = t.notices.iter().find_map(|n| n.strip_prefix("self time (GPUMEMTRACE_SELF_TIME): ")).expect("a self-time notice");
    let count = |label: &str| -> u64 {
        let at = note.find(&format!(" events {label}:")).unwrap_or_else(|| panic!("no {label:?} in {note}"));
        note[..at].rsplit(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let stacked = t.events.iter().filter(|e| e.stack != 0).count() as u64;
    let bare = t.events.iter().filter(|e| e.stack == 0 && t.api(e).op == gpumemtrace_format::Op::Free).count() as u64;
    assert!(stacked >= 100 && bare >= 100, "{stacked} {bare}");
    // The call that started the tracer was not timed (the clock was not set up when it began).
    assert_eq!(count("with a native stack only"), stacked - 1, "{note}");
    assert_eq!(count("without stacks (frees)"), bare, "{note}");
    for part in ["before the call", "Python stack", "native stack", "hand-off", "other"] {
        assert!(note.contains(&format!("{part} ")), "{part} missing: {note}");
    }
    assert!(note.contains("native stacks: ") && note.contains("memo checks"), "{note}");
    // Every event was stamped once (its order key and time, its ring marked), timed on its own:
    // the first too (it is stamped after its stacks, once the tracer has started).
    let numbers = note.split("order stamps ").nth(1).unwrap_or_else(|| panic!("no order stamps in {note}"));
    let taken: u64 = numbers.split(" in ").nth(1).and_then(|s| s.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    assert_eq!(taken, stacked + bare, "{note}");
    // And how the hooks read the time (the counter, or clock_gettime and the clocksource behind it).
    assert!(note.contains("hooks read the time with ") && note.contains("order events by timestamps"), "{note}");
    // Without the switch, no notice (and no clock reads on the hot path).
    let plain = run_traced("prog_unwind_nofp", &["20"], &[]).trace();
    assert!(!plain.notices.iter().any(|n| n.starts_with("self time")));
}
