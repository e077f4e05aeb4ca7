//! What memray and heaptrack users reach for, on traces of `tests/emucuda/prog_views` (see its
//! header comment: allocations through libviews_a.so in phase "part a", a pause, then through
//! libviews_b.so in phase "part b"): filters by module, phase and time window in every report,
//! temporary allocations, the call tree, and `live` following a growing trace.

mod common;
use common::*;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const MIB: u64 = 1 << 20;

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

/// prog_views traced, and a time in its pause: after part a's last allocation, before part b's
/// first (nanoseconds since tracing started, as `--from`/`--to` take it).
fn views_trace() -> (PathBuf, u64) {
    let r = run_traced("prog_views", &[], &[]);
    assert!(r.out.status.success(), "{}", r.stderr);
    let t = r.trace();
    let mut times: Vec<u64> = t
        .events
        .iter()
        .filter(|e| e.result == 0 && t.api(e).op == gpumemtrace_format::Op::Alloc)
        .map(|e| e.time_ns)
        .collect();
    times.sort_unstable();
    assert_eq!(times.len(), 10, "prog_views makes 10 allocations");
    (r.traces[0].clone(), (times[4] + times[5]) / 2)
}

/// Device memory of device 0 in `summary --json`: allocations, bytes allocated, frees, peak,
/// live at the end.
fn device_figures(v: &Value) -> (u64, u64, u64, u64, u64) {
    let groups = v["traces"][0]["groups"].as_array().unwrap();
    let g = groups.iter().find(|g| g["device"] == 0 && g["kind"] == "device").expect("device 0 device memory");
    let n = |k: &str| g[k].as_u64().unwrap();
    (n("allocations"), n("allocated_bytes"), n("frees"), n("peak_bytes"), n("live_bytes"))
}

fn summary(t: &Path, extra: &[&str]) -> Value {
    let mut args = vec!["summary", "--json", s(t)];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args)).unwrap()
}

const ALL: (u64, u64, u64, u64, u64) = (10, 54 * MIB, 5, 36 * MIB, 16 * MIB);
const PART_A: (u64, u64, u64, u64, u64) = (5, 22 * MIB, 3, 14 * MIB, 4 * MIB);
const PART_B: (u64, u64, u64, u64, u64) = (5, 32 * MIB, 2, 32 * MIB, 12 * MIB);

#[test]
fn summary_counts_only_what_the_module_phase_and_time_filters_admit() {
    let (t, pause) = views_trace();
    let at = format!("{pause}ns");
    assert_eq!(device_figures(&summary(&t, &[])), ALL);
    assert_eq!(device_figures(&summary(&t, &["--module", "libviews_a"])), PART_A);
    assert_eq!(device_figures(&summary(&t, &["--module", "libviews_b"])), PART_B);
    // The executable is on every stack.
    assert_eq!(device_figures(&summary(&t, &["--module", "prog_views"])), ALL);
    assert_eq!(device_figures(&summary(&t, &["--phase", "part a"])), PART_A);
    assert_eq!(device_figures(&summary(&t, &["--phase", "part b"])), PART_B);
    // A window counts the allocations made in it (and their frees, whenever they came); its
    // peak is the peak of those.
    assert_eq!(device_figures(&summary(&t, &["--to", &at])), PART_A);
    assert_eq!(device_figures(&summary(&t, &["--from", &at])), PART_B);
    assert_eq!(device_figures(&summary(&t, &["--from", "0s", "--to", &at])), PART_A);
    // Filters combine: part b's phase holds nothing of libviews_a.
    let v = summary(&t, &["--phase", "part b", "--module", "libviews_a"]);
    assert!(v["traces"][0]["groups"].as_array().unwrap().iter().all(|g| g["allocations"] == 0), "{v}");
    // Bad times are refused.
    let o = gmt(&["summary", s(&t), "--from", "soon"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not a time"), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Sum of the byte counts of folded stacks.
fn folded_total(text: &str) -> u64 {
    text.lines().map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap()).sum()
}

#[test]
fn every_report_takes_the_filters() {
    let (t, pause) = views_trace();
    let t = s(&t);
    let at = format!("{pause}ns");

    // flamegraph: all allocated bytes, then libviews_a's, then those made after the pause.
    assert_eq!(folded_total(&ok(&["flamegraph", t, "--of", "allocated", "--folded"])), 54 * MIB);
    assert_eq!(folded_total(&ok(&["flamegraph", t, "--of", "allocated", "--folded", "--module", "libviews_a"])), 22 * MIB);
    assert_eq!(folded_total(&ok(&["flamegraph", t, "--of", "peak", "--folded", "--from", &at])), 32 * MIB);

    // tree
    let tree = |extra: &[&str]| -> (u64, u64) {
        let mut args = vec!["tree", "--json", "--of", "total", t];
        args.extend_from_slice(extra);
        let v: Value = serde_json::from_str(&ok(&args)).unwrap();
        let r = &v["roots"][0];
        (r["bytes"].as_u64().unwrap(), r["count"].as_u64().unwrap())
    };
    assert_eq!(tree(&[]), (54 * MIB, 10));
    assert_eq!(tree(&["--module", "libviews_b"]), (32 * MIB, 5));
    assert_eq!(tree(&["--phase", "part a"]), (22 * MIB, 5));

    // timeline: the panel's peak and allocations.
    let svg = ok(&["timeline", t]);
    assert!(svg.contains("peak 36.0 MiB · live at end 16.0 MiB · 10 allocations"), "{}", &svg[..svg.len().min(2000)]);
    let svg = ok(&["timeline", t, "--module", "libviews_a"]);
    assert!(svg.contains("peak 14.0 MiB · live at end 4.0 MiB · 5 allocations"), "{}", &svg[..svg.len().min(2000)]);

    // check: libviews_a's peak is within 20 MiB, libviews_b's is not, a module of no stack
    // matches nothing (exit 2, not a pass).
    let o = gmt(&["check", t, "--max-peak", "20MiB"]);
    assert_eq!(o.status.code(), Some(1));
    let o = gmt(&["check", t, "--max-peak", "20MiB", "--module", "libviews_a"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    let o = gmt(&["check", t, "--max-peak", "20MiB", "--module", "libviews_b"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("peak GPU memory 32.0 MiB exceeds --max-peak 20.0 MiB"));
    let o = gmt(&["check", t, "--max-peak", "1GiB", "--module", "libnothing"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--module \"libnothing\" matches nothing"));
    let o = gmt(&["check", t, "--max-peak", "1GiB", "--from", "100s"]);
    assert_eq!(o.status.code(), Some(2));

    // diff of the trace with itself, filtered: the peaks of the filtered allocations.
    let v: Value = serde_json::from_str(&ok(&["diff", "--json", t, t, "--module", "libviews_b"])).unwrap();
    assert_eq!(v["devices"][0]["peak_bytes"]["a"].as_u64(), Some(32 * MIB), "{v}");
    assert_eq!(v["devices"][0]["live_bytes"]["b"].as_u64(), Some(12 * MIB), "{v}");

    // phases: only part b has allocations of libviews_b.
    let v: Value = serde_json::from_str(&ok(&["phases", "--json", t, "--module", "libviews_b"])).unwrap();
    let rows: Vec<(&str, u64, u64)> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["phase"].as_str().unwrap(), r["allocations"].as_u64().unwrap(), r["allocated_bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(rows, [("part b", 5, 32 * MIB)]);

    // exports: speedscope's weights, Perfetto's counter, memory_viz's snapshot.
    let v: Value =
        serde_json::from_str(&ok(&["export", t, "--format", "speedscope", "--of", "allocated", "--module", "libviews_a"])).unwrap();
    let weights: u64 = v["profiles"][0]["weights"].as_array().unwrap().iter().map(|w| w.as_u64().unwrap()).sum();
    assert_eq!(weights, 22 * MIB);
    let v: Value = serde_json::from_str(&ok(&["export", t, "--format", "perfetto", "--to", &at])).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let live_max = events
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "device 0 device memory (bytes)")
        .map(|e| e["args"]["live"].as_u64().unwrap())
        .max();
    assert_eq!(live_max, Some(14 * MIB));
    let dir = scratch("views-memviz");
    let p = dir.join("a.pickle");
    ok(&["export", t, "--format", "memviz", "--module", "libviews_a", "-o", s(&p)]);
    let checker = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/memviz_check.py");
    let o = Command::new("python3").arg(&checker).arg(&p).output().expect("python3 is needed for this test");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let facts: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(facts["peak"]["0"].as_u64(), Some(14 * MIB));
    assert_eq!(facts["actions"]["0"]["alloc"].as_u64(), Some(5));
}

/// Temporary sites of `summary --json`: (function, count, bytes).
fn temporaries(v: &Value) -> Vec<(String, u64, u64)> {
    v["traces"][0]["temporary"]["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["function"].as_str().unwrap().to_string(), s["count"].as_u64().unwrap(), s["bytes"].as_u64().unwrap()))
        .collect()
}

#[test]
fn temporary_allocations_are_those_freed_within_the_threshold_per_site() {
    let (t, _) = views_trace();
    // Threshold 1 (the default), as 0: the scratch buffers, freed before anything else was
    // allocated.
    let scratch = vec![("va_scratch".to_string(), 2, 16 * MIB), ("vb_scratch".to_string(), 1, 16 * MIB)];
    let v = summary(&t, &[]);
    assert_eq!(v["traces"][0]["temporary"]["threshold"], 1);
    assert_eq!(v["traces"][0]["temporary"]["allocations"].as_u64(), Some(3));
    assert_eq!(v["traces"][0]["temporary"]["bytes"].as_u64(), Some(32 * MIB));
    assert_eq!(temporaries(&v), scratch);
    assert_eq!(temporaries(&summary(&t, &["--temporary-threshold", "0"])), scratch);
    // part a's 2 MiB is freed after three other allocations, part b's first 4 MiB after four.
    let mut with_a = scratch.clone();
    with_a.push(("va_alloc".to_string(), 1, 2 * MIB));
    assert_eq!(temporaries(&summary(&t, &["--temporary-threshold", "3"])), with_a);
    let mut with_b = with_a.clone();
    with_b.insert(2, ("vb_alloc".to_string(), 1, 4 * MIB)); // most first, then by bytes
    assert_eq!(temporaries(&summary(&t, &["--temporary-threshold", "4"])), with_b);
    // Filters apply: only libviews_b's.
    assert_eq!(temporaries(&summary(&t, &["--module", "libviews_b"])), [("vb_scratch".to_string(), 1, 16 * MIB)]);

    // In the terminal, a short section after the rest.
    let text = ok(&["summary", s(&t)]);
    let section = text.split_once("temporary allocations (freed with at most 1 other allocation of their thread in between): 3 allocations, 32.0 MiB\n");
    let (_, rest) = section.unwrap_or_else(|| panic!("{text}"));
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].contains("2x") && lines[0].contains("16.0 MiB") && lines[0].contains("va_scratch views_lib.c:"), "{text}");
    assert!(lines[1].contains("1x") && lines[1].contains("vb_scratch views_lib.c:"), "{text}");

    // None at all: no section, no key.
    let v = summary(&t, &["--phase", "part b", "--module", "libviews_a"]);
    assert!(v["traces"][0].get("temporary").is_none(), "{v}");
    let text = ok(&["summary", s(&t), "--phase", "part b", "--module", "libviews_a"]);
    assert!(!text.contains("temporary"), "{text}");
}

#[test]
fn the_tree_runs_from_the_outermost_frame_to_the_sites_and_prunes_small_nodes() {
    let (t, _) = views_trace();
    let t = s(&t);
    let text = ok(&["tree", t]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "device 0, device memory: 36.0 MiB in 7 allocations live at the peak", "{text}");
    // main, then each library function under the line of main that called it.
    let alloc_b = lines.iter().position(|l| l.contains("vb_alloc views_lib.c:")).unwrap_or_else(|| panic!("{text}"));
    assert!(lines[alloc_b].contains("16.0 MiB (44.4%), 4x"), "{text}");
    assert!(lines[alloc_b - 1].contains("main prog_views.c:"), "{text}");
    assert!(lines[alloc_b].find("vb_alloc") > lines[alloc_b - 1].find("main"), "deeper than its caller: {text}");
    assert!(text.contains("vb_scratch views_lib.c:28  16.0 MiB (44.4%), 1x"), "{text}");
    // part a's two allocations left came from two lines of main.
    assert!(text.contains("va_alloc views_lib.c:18  3.0 MiB (8.3%), 1x"), "{text}");
    assert!(text.contains("va_alloc views_lib.c:18  1.0 MiB (2.8%), 1x"), "{text}");
    assert!(!text.contains("pruned"), "nothing below 1%: {text}");

    let end = ok(&["tree", t, "--of", "end"]);
    assert!(end.starts_with("device 0, device memory: 16.0 MiB in 5 allocations live at the end\n"), "{end}");
    // 30% of 54 MiB is 16.2 MiB: the 16 MiB branches (the scratch buffers of each part, part
    // b's allocations) and the 6 MiB of part a's allocations go.
    let pruned = ok(&["tree", t, "--of", "total", "--min-percent", "30"]);
    assert!(pruned.contains("(pruned: "), "{pruned}");
    let v: Value = serde_json::from_str(&ok(&["tree", t, "--of", "total", "--min-percent", "30", "--json"])).unwrap();
    let r = &v["roots"][0];
    assert_eq!((r["bytes"].as_u64(), r["count"].as_u64()), (Some(54 * MIB), Some(10)));
    assert_eq!(v["of"], "total");
    assert_eq!(r["pruned_bytes"].as_u64(), Some(54 * MIB), "every call of main is below 30%: {v}");
    assert_eq!(r["pruned_count"].as_u64(), Some(10));
    let o = gmt(&["tree", t, "--min-percent", "101"]);
    assert_eq!(o.status.code(), Some(2));
}

/// The allocation count of a `live` refresh line: `[live] 0.002 s, 8 events, 5 allocations; ...`.
fn refresh_allocations(line: &str) -> u64 {
    let before = line.split(" allocation").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap_or_else(|_| panic!("{line}"))
}

/// `prog_views step`, traced to `trace`: it waits for a byte on stdin before each of part b's
/// four allocations (its sixth to ninth).
fn stepping_views(dir: &Path, trace: &Path) -> std::process::Child {
    Command::new(emu().join("prog_views"))
        .arg("step")
        .current_dir(dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", trace)
        .env("GPUMEMTRACE_QUIET", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn live_follows_a_growing_trace_and_ends_with_its_summary() {
    let dir = scratch("views-live");
    let trace = dir.join("live.trace");
    // The program waits for a byte on stdin before each of part b's four allocations.
    let mut prog = stepping_views(&dir, &trace);
    let mut feed = prog.stdin.take().unwrap();
    let mut live = Command::new(cli())
        .args(["live", "--interval", "50ms"])
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(live.stdout.take().unwrap());
    let mut seen: Vec<u64> = Vec::new();
    let mut rest = String::new();
    let mut line = String::new();
    let mut fed = 0;
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if !line.starts_with("[live] ") {
            rest.push_str(&line);
            continue;
        }
        if line.starts_with("[live] waiting") {
            continue;
        }
        let n = refresh_allocations(&line);
        assert!(!line.contains('\x1b'), "no escape codes without a terminal: {line:?}");
        if seen.last() != Some(&n) {
            seen.push(n);
        }
        // Each time a refresh has shown the allocations so far, let the program make one more.
        if fed < 4 && n == 5 + fed {
            feed.write_all(b"x").unwrap();
            feed.flush().unwrap();
            fed += 1;
        }
    }
    drop(feed);
    assert!(prog.wait().unwrap().success());
    let status = live.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut live.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    // Every step the program waited at was seen, in order, and the last refresh saw all of it
    // (what ran between two refreshes, part a or part b's last allocations, may be seen at once).
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "refreshes: {seen:?}");
    for n in [5, 6, 7, 8] {
        assert!(seen.contains(&n), "refreshes: {seen:?}");
    }
    assert_eq!(seen.last(), Some(&10), "refreshes: {seen:?}");
    // Then the summary, exactly as `summary` prints the finished trace.
    assert_eq!(rest, ok(&["summary", s(&trace)]));
    assert!(rest.contains("10 allocations, 54.0 MiB allocated"), "{rest}");
}

/// A reader of a trace still being written reads the journal, then the trace: the journal says
/// whether the writer wrote to the trace in between (then what it would add may be in the trace
/// already, and `live` reads both again), and, once the process is done and the journal gone,
/// that it no longer describes the trace.
#[test]
fn the_journal_says_when_the_trace_was_written_after_it_was_read() {
    use std::time::{Duration, Instant};
    let dir = scratch("views-journal-marks");
    let trace = dir.join("marks.trace");
    let mut prog = stepping_views(&dir, &trace);
    let mut feed = prog.stdin.take().unwrap();
    let events_in_trace = || -> usize {
        let Ok(f) = std::fs::File::open(&trace) else { return 0 };
        let Ok(r) = gpumemtrace_format::Reader::new(std::io::BufReader::new(f)) else { return 0 };
        r.map_while(Result::ok).filter(|x| matches!(x, gpumemtrace_format::Record::Event(_))).count()
    };
    let wait_for = |what: &str, ok: &dyn Fn() -> bool| {
        let until = Instant::now() + Duration::from_secs(10);
        while !ok() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // The program waits before its sixth allocation; its writer writes the first five.
    wait_for("the first five allocations in the trace", &|| events_in_trace() >= 5);
    let journal = gpumemtrace_format::recover::Recovery::beside(&trace).unwrap().expect("a journal beside the running trace");
    assert!(journal.still_current(), "nothing was written since it was read");
    feed.write_all(b"x").unwrap();
    feed.flush().unwrap();
    // The sixth allocation reaches the trace within the writer's flush interval.
    wait_for("the sixth allocation in the trace", &|| events_in_trace() >= 6);
    wait_for("the journal to say so", &|| !journal.still_current());
    feed.write_all(b"xxx").unwrap();
    drop(feed);
    assert!(prog.wait().unwrap().success());
    assert!(!gpumemtrace_format::journal::path_for(&trace).exists(), "the process removes its journal with a complete trace");
    assert!(!journal.still_current(), "a journal that is gone describes no trace");
}
