//! The tracer survives the runs that go wrong: fork, exec, fatal signals, SIGKILL, exit from
//! any thread, load, slow disks, full disks, unwritable directories, its own panics; and the
//! host program's output, exit status and signal behaviour stay exactly what they were.

mod common;
use common::*;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

use gpumemtrace_format::{Reader, Record};

const MIB: u64 = 1 << 20;

fn trace_named(run: &Run, pid: u32) -> PathBuf {
    run.dir.join(format!("gpumemtrace-{pid}.trace"))
}

fn stdout_value(run: &Run, key: &str) -> u32 {
    run.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} not printed: {}", run.stdout))
        .parse()
        .unwrap()
}

#[test]
fn a_forked_child_that_allocates_gets_its_own_trace_and_one_that_does_not_gets_none() {
    let run = run_traced("prog_lifecycle", &["fork"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let parent = read_trace(&trace_named(&run, run.out_pid()));
    assert_eq!(alloc_sizes(&parent), vec![MIB, 4 * MIB], "the parent's trace is intact");
    assert!(parent.stats.unwrap().final_);
    let child = read_trace(&trace_named(&run, stdout_value(&run, "child_cuda_pid")));
    assert_eq!(alloc_sizes(&child), vec![2 * MIB, 3 * MIB]);
    assert_eq!(child.events.len(), 3, "alloc, free, alloc");
    assert!(child.stats.unwrap().final_);
    assert!(!trace_named(&run, stdout_value(&run, "child_nocuda_pid")).exists());
    assert_eq!(run.traces.len(), 2);
}

#[test]
fn exec_of_a_traced_program_yields_one_trace_per_image() {
    let target = emu().join("prog_driver");
    let run = run_traced("prog_lifecycle", &["exec", target.to_str().unwrap()], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(run.traces.len(), 2, "{:?}", run.traces);
    // Same pid: the new image's trace takes the next free name.
    let before = read_trace(&trace_named(&run, run.out_pid()));
    let after = read_trace(&run.dir.join(format!("gpumemtrace-{}.1.trace", run.out_pid())));
    assert_eq!(before.pid, after.pid);
    assert_eq!(alloc_sizes(&before), vec![MIB], "written out before the exec");
    assert!(before.stats.unwrap().final_);
    assert!(alloc_sizes(&after).len() >= 10, "the exec'd program is traced too");
}

#[test]
fn vfork_children_do_not_disturb_the_parents_trace() {
    let run = run_traced("prog_lifecycle", &["vfork"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![MIB, 2 * MIB]);
    let stats: Vec<_> = t.stats.into_iter().collect();
    assert!(stats[0].final_);
}

#[test]
fn a_child_made_without_fork_handlers_leaves_the_parents_trace_alone() {
    // `_Fork` runs no fork handlers: the child has the parent's tracer in memory (its trace's
    // descriptor, its rings) but none of its threads. Its exit must not write, commit or wait
    // for anything of the parent's.
    for env in [&[][..], &[("GPUMEMTRACE_WRITE_THREAD", "1")][..]] {
        let run = run_traced_within(60, "prog_lifecycle", &["_Fork-exit"], env);
        assert!(run.out.status.success(), "{env:?}: {:?} {}", run.out.status, run.stderr);
        let t = run.trace();
        assert_eq!(alloc_sizes(&t), vec![MIB, 2 * MIB], "{env:?}");
        let stats: Vec<_> = t.stats.into_iter().collect();
        assert_eq!(stats.iter().filter(|s| s.final_).count(), 1, "{env:?}: one final record, the parent's");
        assert!(stats.last().unwrap().final_, "{env:?}");
    }
}

/// Every allocation made before a fatal signal is on disk, and the process still dies of it.
fn assert_dies_of(mode: &str, signal: i32) {
    assert_dies_of_with(mode, signal, &[]);
}

fn assert_dies_of_with(mode: &str, signal: i32, env: &[(&str, &str)]) {
    let run = run_traced("prog_lifecycle", &[mode], env);
    assert_eq!(run.out.status.signal(), Some(signal), "{mode}: {:?} {}", run.out.status, run.stderr);
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![8 * MIB, 9 * MIB], "{mode}");
    if signal != libc::SIGKILL {
        assert!(t.notices.iter().any(|n| n == &format!("the process received fatal signal {signal}")), "{mode}: {:?}", t.notices);
    }
    let json = summary_json(&run.traces[0]);
    assert_eq!(json["traces"][0]["groups"][0]["live_bytes"], 17 * MIB, "{mode}");
}

#[test]
fn segfault_keeps_the_trace_and_the_signal() {
    assert_dies_of("segv", libc::SIGSEGV);
}

#[test]
fn abort_keeps_the_trace_and_the_signal() {
    assert_dies_of("abort", libc::SIGABRT);
}

#[test]
fn bus_error_keeps_the_trace_and_the_signal() {
    assert_dies_of("bus", libc::SIGBUS);
}

#[test]
fn sigfpe_and_sigterm_keep_the_trace_and_the_signal() {
    assert_dies_of("fpe", libc::SIGFPE);
    assert_dies_of("term", libc::SIGTERM);
}

#[test]
fn sigkill_loses_nothing_even_right_after_the_allocation() {
    // 100 ms after the last allocation, and at once: the journal holds what the writer had not
    // written yet.
    assert_dies_of("kill", libc::SIGKILL);
    assert_dies_of("kill-now", libc::SIGKILL);
}

#[test]
fn a_library_loaded_late_is_in_the_trace_for_stacks_recovered_after_sigkill() {
    // Before: the writer scanned for modules only when a stack through one reached it; killed
    // first, the recovered stack ran through a library the trace did not name (frames shown as
    // bare addresses).
    let run = run_traced("prog_lifecycle", &["dlopen-kill"], &[]);
    assert_eq!(run.out.status.signal(), Some(libc::SIGKILL), "{}", run.stderr);
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![MIB, 4 * MIB]);
    let lib = t.modules.iter().find(|m| m.path.ends_with("/libunwind_c.so")).unwrap_or_else(|| panic!("{:?}", t.modules));
    let late = t.events.iter().find(|e| e.size == 4 * MIB).unwrap();
    let frames = &t.stacks[&late.stack].frames;
    assert!(frames.iter().any(|&a| a >= lib.start && a < lib.end), "{frames:x?} {lib:?}");
    assert!(!t.notices.iter().any(|n| n.contains("in no module")), "{:?}", t.notices);
    // The summary names the function in it.
    let json = summary_json(&run.traces[0]);
    assert!(json.to_string().contains("uc_descend"), "{json}");
}

#[test]
fn exits_that_skip_exit_handlers_still_finish_the_trace() {
    exits_that_skip_exit_handlers_with(&[]);
}

fn exits_that_skip_exit_handlers_with(env: &[(&str, &str)]) {
    for (mode, code) in [("_exit", 5), ("_Exit", 6), ("quick_exit", 7)] {
        let run = run_traced("prog_lifecycle", &[mode], env);
        assert_eq!(run.out.status.code(), Some(code), "{mode}: {}", run.stderr);
        let t = run.trace();
        assert_eq!(alloc_sizes(&t), vec![8 * MIB, 9 * MIB], "{mode}");
        assert!(t.stats.is_some_and(|s| s.final_), "{mode}: the trace is complete, not recovered");
        assert!(!gpumemtrace_format::journal::path_for(&run.traces[0]).exists(), "{mode}: journal removed");
    }
}

#[test]
fn a_forked_worker_leaving_with_underscore_exit_keeps_its_allocations() {
    forked_worker_with(&[]);
}

fn forked_worker_with(env: &[(&str, &str)]) {
    let run = run_traced("prog_lifecycle", &["fork-_exit"], env);
    assert!(run.out.status.success(), "{}", run.stderr);
    let child = stdout_value(&run, "child_pid");
    let t = read_trace(&trace_named(&run, child));
    assert_eq!(alloc_sizes(&t), vec![MIB, 2 * MIB, 3 * MIB]);
    assert!(t.stats.is_some_and(|s| s.final_));
}

#[test]
fn sigkill_under_load_keeps_every_call_that_returned() {
    // Four threads allocate and free as fast as they can; each counts its completed calls in a
    // shared file mapping, which survives the kill. Every call that returned is in the trace.
    let dir = scratch("kill-load");
    let progress = dir.join("progress");
    let mut child = Command::new(emu().join("prog_threads"))
        .args(["4", "100000000"])
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("GPUMEMTRACE_FRAMES", "4")
        .env("PROGRESS_FILE", &progress)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "running");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    let done: Vec<u64> = std::fs::read(&progress).unwrap().chunks(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(done.len(), 4);
    let trace = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "trace")).unwrap();
    let t = read_trace(&trace);
    let mut by_thread: HashMap<u32, u64> = HashMap::new();
    for e in t.events.iter().filter(|e| e.size != 0 || t.api_name(e) == "cudaFree") {
        *by_thread.entry(e.tid).or_default() += 1;
    }
    let mut traced: Vec<u64> = by_thread.into_values().filter(|&n| n > 1).collect();
    traced.sort();
    let mut done_sorted = done.clone();
    done_sorted.sort();
    assert_eq!(traced.len(), 4, "{traced:?} {done:?}");
    for (got, want) in traced.iter().zip(&done_sorted) {
        // A thread may have finished a call (in the trace) and been killed before counting it.
        assert!(*got == *want || *got == *want + 1, "traced {traced:?}, completed {done:?}");
    }
    assert!(done.iter().sum::<u64>() > 1000, "the threads got going: {done:?}");
    assert!(t.notices.iter().any(|n| n.contains("recovered from")), "{:?}", t.notices);
}

#[test]
fn an_uncaught_cpp_exception_aborts_with_the_trace_on_disk() {
    let run = run_traced("prog_throw", &[], &[]);
    assert_eq!(run.out.status.signal(), Some(libc::SIGABRT));
    assert!(run.stderr.contains("model exploded"), "{}", run.stderr);
    assert_eq!(alloc_sizes(&run.trace()), vec![10 * MIB]);
}

#[test]
fn the_programs_own_signal_handler_still_runs() {
    let run = run_traced("prog_lifecycle", &["handler"], &[]);
    assert_eq!(run.out.status.code(), Some(42), "{:?} {}", run.out.status, run.stderr);
    assert!(run.stdout.contains("own handler ran"));
    assert_eq!(alloc_sizes(&run.trace()), vec![7 * MIB]);
}

#[test]
fn frees_from_exit_handlers_after_ours_are_still_recorded() {
    let run = run_traced("prog_lifecycle", &["atexit"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    let names: Vec<&str> = t.events.iter().map(|e| t.api_name(e)).collect();
    assert_eq!(names, ["cuMemAlloc_v2", "cuMemFree_v2"]);
    assert_eq!(summary_json(&run.traces[0])["traces"][0]["groups"][0]["live_bytes"], 0);
}

#[test]
fn exit_from_another_thread_finishes_the_trace() {
    let run = run_traced("prog_lifecycle", &["thread-exit"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![5 * MIB]);
    assert!(t.stats.unwrap().final_);
}

#[test]
fn sixteen_threads_times_100000_pairs_lose_nothing() {
    threads_lose_nothing(16, 100_000, &[]);
}

/// Threads beyond the 31 rings of their own share the last one (under a lock, noting no keys):
/// nothing is lost there either, and the order holds.
#[test]
fn forty_threads_share_the_last_ring_and_lose_nothing() {
    threads_lose_nothing(40, 20_000, &[]);
}

fn threads_lose_nothing(threads: usize, pairs: usize, env: &[(&str, &str)]) {
    let (n, p) = (threads.to_string(), pairs.to_string());
    let env: Vec<(&str, &str)> = [("GPUMEMTRACE_FRAMES", "4")].into_iter().chain(env.iter().copied()).collect();
    let run = run_traced("prog_threads", &[&n, &p], &env);
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    assert_eq!(t.events.len(), threads * pairs * 2 + threads);
    let allocs = t.events.iter().filter(|e| t.api_name(e) == "cudaMalloc").count();
    assert_eq!(allocs, threads * pairs + threads);
    let stats = t.stats.unwrap();
    assert_eq!((stats.events, stats.dropped, stats.final_), (t.events.len() as u64, 0, true));
    // Each thread leaked exactly one allocation.
    let json = summary_json(&run.traces[0]);
    let live: u64 = json["traces"][0]["groups"].as_array().unwrap().iter().map(|g| g["live_count"].as_u64().unwrap()).sum();
    assert_eq!(live, threads as u64);
    // Addresses are reused across threads all the time here: every free still finds its
    // allocation (calls are written in the order they happened, or resolved by time).
    assert_eq!(json["traces"][0]["unknown_frees"].as_array().unwrap().len(), 0);
    // Written in call order, but for events the writer gave up waiting for (a thread
    // descheduled inside a hook for milliseconds on this crowded host), which it counts.
    let late: usize = t
        .notices
        .iter()
        .find_map(|n| n.split_once(" events reached the writer after later ones were written").map(|(n, _)| n.parse().unwrap()))
        .unwrap_or(0);
    let wrong = out_of_order(&t);
    assert!(wrong <= 2 * late, "{wrong} events out of call order, {late} counted late: {:?}", t.notices);
}

/// Events written out of call order: an allocation of an address that is live at that point of
/// the trace, or a free of one that is not (a free freed before its allocation was written).
fn out_of_order(t: &TraceData) -> usize {
    let mut live = std::collections::HashSet::new();
    let mut wrong = 0;
    for e in t.events.iter().filter(|e| e.result == 0 && e.addr != 0) {
        let ok = match t.api(e).op {
            gpumemtrace_format::Op::Alloc => live.insert(e.addr),
            gpumemtrace_format::Op::Free => live.remove(&e.addr),
        };
        wrong += usize::from(!ok);
    }
    wrong
}

#[test]
fn a_slow_writer_applies_back_pressure_without_dropping() {
    let run = run_traced(
        "prog_threads",
        &["8", "5000"],
        &[("GPUMEMTRACE_FRAMES", "4"), ("GPUMEMTRACE_TEST_WRITER_DELAY_US", "2000")],
    );
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    assert_eq!(t.events.len(), 8 * 5000 * 2 + 8);
    assert_eq!(t.stats.unwrap().dropped, 0);
    let json = summary_json(&run.traces[0]);
    let live: u64 = json["traces"][0]["groups"].as_array().unwrap().iter().map(|g| g["live_count"].as_u64().unwrap()).sum();
    assert_eq!((live, json["traces"][0]["unknown_frees"].as_array().unwrap().len()), (8, 0));
}

#[test]
fn a_writer_working_slowly_through_a_full_ring_is_waited_for_though_it_commits_nothing_for_seconds() {
    // 400 us an event on the writer (a writer starved of CPU, as with 160 busy threads on two
    // cores): a full ring of some 5000 events takes it about 2 s to read before it can give
    // any space back. Hooks waiting for room see it work, so they wait: nothing is given up.
    let pairs = 6000u64;
    let run = run_traced(
        "prog_threads",
        &["1", &pairs.to_string()],
        &[("GPUMEMTRACE_FRAMES", "4"), ("GPUMEMTRACE_TEST_EVENT_DELAY_US", "400")],
    );
    assert!(run.out.status.success(), "{}", run.stderr);
    let t = run.trace();
    let stats = t.stats.unwrap();
    assert_eq!(stats.dropped, 0, "{:?}", t.notices);
    assert_eq!(t.events.len() as u64, 2 * pairs + 1);
    assert!(
        t.notices.iter().any(|n| n.contains("waited for room")),
        "the hook did wait for the writer: {:?}",
        t.notices
    );
}

#[test]
fn a_stalled_output_costs_the_host_a_bounded_wait_and_every_event_given_up_is_counted() {
    // The writer sleeps 3 s before each batch (a disk that takes seconds per write). Hooks wait
    // for room at most 1 s, then give events up (counted) instead of running at disk speed.
    let (threads, pairs) = (4u64, 20_000u64);
    let run = run_traced(
        "prog_threads",
        &[&threads.to_string(), &pairs.to_string()],
        &[("GPUMEMTRACE_FRAMES", "4"), ("GPUMEMTRACE_TEST_WRITER_DELAY_US", "3000000")],
    );
    assert!(run.out.status.success(), "{}", run.stderr);
    assert!(run.stdout.contains(&format!("total_pairs={}", threads * pairs)), "{}", run.stdout);
    let t = run.trace();
    let made = threads * (2 * pairs + 1); // each thread: its pairs and one leak
    let recorded = t.events.len() as u64;
    let stats = t.stats.unwrap();
    assert!(stats.final_);
    let given_up = stats.dropped;
    assert!(given_up > 0 && recorded > 0, "recorded {recorded}, given up {given_up}");
    assert_eq!(recorded + given_up, made, "every event is either in the trace or counted as given up");
    let notice = format!("{given_up} events were lost: the trace's output did not keep up");
    assert!(t.notices.iter().any(|n| n.starts_with(&notice)), "{:?}", t.notices);
    // The summary says so too.
    let json = summary_json(&run.traces[0]);
    assert_eq!(json["traces"][0]["dropped"], given_up, "{json}");
}

/// The program's stdout when run without the tracer (normalized).
fn untraced_stdout(prog: &str) -> String {
    let out = Command::new(emu().join(prog)).env("EMUCUDA_DEVICES", "2").output().unwrap();
    assert!(out.status.success());
    normalized(&String::from_utf8(out.stdout).unwrap())
}

fn tracer_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains("gpumemtrace")).collect()
}

#[test]
fn a_panic_in_the_tracer_turns_tracing_off_with_one_line_and_the_program_goes_on() {
    let run = run_traced("prog_runtime_dynamic", &[], &[("GPUMEMTRACE_TEST_PANIC_AT", "3")]);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(normalized(&run.stdout), untraced_stdout("prog_runtime_dynamic"), "same results as without the tracer");
    let lines = tracer_lines(&run.stderr);
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(lines[0].contains("tracing is off") && lines[0].contains("deliberate panic"), "{}", lines[0]);
    // What was recorded before the panic is kept.
    assert_eq!(run.trace().events.len(), 2);
}

#[test]
fn a_host_that_puts_its_own_file_on_stderr_never_gets_a_line_of_ours_in_it() {
    // The panic turns tracing off after the host replaced descriptor 2: the line saying so, and
    // the exit line, would have gone into the host's file (the exit line was checked; this one
    // was not).
    let run = run_traced("prog_lifecycle", &["stderr-file"], &[("GPUMEMTRACE_TEST_PANIC_AT", "2"), ("GPUMEMTRACE_QUIET", "0")]);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(std::fs::read_to_string(run.dir.join("host-stderr.txt")).unwrap(), "host line\n");
    assert!(tracer_lines(&run.stderr).is_empty(), "{}", run.stderr);
    // The reason is in the trace instead.
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![MIB]);
    assert!(t.notices.iter().any(|n| n.contains("tracing stopped early") && n.contains("deliberate panic")), "{:?}", t.notices);
}

#[test]
fn an_unwritable_output_directory_is_reported_once_and_changes_nothing_else() {
    let dir = scratch("unwritable");
    let out = Command::new(emu().join("prog_runtime_dynamic"))
        .env("LD_PRELOAD", shim())
        .env("EMUCUDA_DEVICES", "2")
        .env("GPUMEMTRACE_OUTPUT", "/proc/gpumemtrace-nonexistent/")
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(normalized(&String::from_utf8(out.stdout).unwrap()), untraced_stdout("prog_runtime_dynamic"));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines = tracer_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("cannot create trace file"), "{stderr}");
}

#[test]
fn a_full_disk_is_reported_once_and_never_kills_the_program() {
    full_disk_with(&[]);
}

fn full_disk_with(env: &[(&str, &str)]) {
    // A 64 KiB file-size limit: the (uncompressed) trace outgrows it; the kernel's SIGXFSZ must
    // not kill the host.
    let mut env = env.to_vec();
    env.push(("GPUMEMTRACE_COMPRESS", "0"));
    let (trace, stdout) = outgrow_a_file_size_limit("4 2000", &env);
    assert!(stdout.contains("total_pairs=8000"));
    // What fitted is readable.
    assert!(std::fs::metadata(&trace).unwrap().len() <= 128 * 512);
    let json = summary_json(&trace);
    assert!(json["traces"][0]["events"].as_u64().unwrap() > 100);
}

/// Runs `prog_threads args` under a 64 KiB file-size limit that its trace outgrows: the host
/// goes on and succeeds, and the tracer says so in one line. The trace and the host's output.
fn outgrow_a_file_size_limit(args: &str, env: &[(&str, &str)]) -> (PathBuf, String) {
    let dir = scratch("disk-full");
    let prog = emu().join("prog_threads");
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -f 128; exec {} {args}", prog.display()))
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?} {stderr}", out.status);
    let lines = tracer_lines(&stderr);
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("cannot write") && lines[0].contains("File too large"), "{stderr}");
    let trace = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).find(|p| p.extension().is_some_and(|e| e == "trace")).unwrap();
    (trace, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_full_disk_leaves_a_compressed_trace_checked_up_to_its_last_whole_write() {
    // The same limit, the trace compressed: the frame the failed write was in ends where the
    // file does (read unchecked, as a killed process's last frame), and no later write follows
    // it (tracing stops at the first failed write), so nothing reads as corrupt or damaged.
    let (trace, _) = outgrow_a_file_size_limit("4 100000", &[]);
    assert_eq!(std::fs::metadata(&trace).unwrap().len(), 128 * 512, "the limit was reached");
    let json = summary_json(&trace);
    let t = &json["traces"][0];
    assert!(t["events"].as_u64().unwrap() > 1000, "{t}");
    // Cut within the frame: at a record's end (complete, without a final stats record) or
    // inside one (truncated), never corrupt or damaged.
    assert!(t["status"] == "complete" || t["status"] == "truncated", "{t}");
}

#[test]
fn trace_files_can_be_made_group_readable() {
    use std::os::unix::fs::PermissionsExt;
    let run = run_traced("prog_driver", &[], &[("GPUMEMTRACE_FILE_MODE", "640")]);
    assert_eq!(std::fs::metadata(&run.traces[0]).unwrap().permissions().mode() & 0o777, 0o640);
}

#[test]
fn ranks_of_a_launcher_name_their_traces() {
    let run = run_traced("prog_driver", &[], &[("RANK", "3"), ("LOCAL_RANK", "1")]);
    let name = run.traces[0].file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(name, format!("gpumemtrace-rank3-{}.trace", run.out_pid()));
}

#[test]
fn records_of_a_real_trace_include_everything_the_summary_needs() {
    let run = run_traced("prog_driver", &[], &[]);
    let bytes = std::fs::read(&run.traces[0]).unwrap();
    let kinds: Vec<&str> = Reader::new(&bytes[..])
        .unwrap()
        .map(|r| match r.unwrap() {
            Record::Process(_) => "process",
            Record::Api(_) => "api",
            Record::Module(_) => "module",
            Record::Stack(_) => "stack",
            Record::Event(_) => "event",
            Record::Stats(_) => "stats",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds[0], "process");
    assert_eq!(*kinds.last().unwrap(), "stats");
    let first_event = kinds.iter().position(|k| *k == "event").unwrap();
    assert!(kinds[..first_event].contains(&"module") && kinds[..first_event].contains(&"stack"));
}

#[test]
fn launcher_ranks_get_one_trace_each_and_a_merged_summary() {
    let dir = scratch("launcher");
    let launcher = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/emucuda/launcher.sh");
    let out = Command::new(cli())
        .args(["run", "--output"])
        .arg(&dir)
        .arg("--")
        .arg(&launcher)
        .arg("3")
        .arg(emu().join("prog_driver"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let mut names: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names.len(), 3, "{names:?}");
    for (rank, name) in names.iter().enumerate() {
        assert!(name.starts_with(&format!("gpumemtrace-rank{rank}-")), "{names:?}");
    }
    assert!(stderr.contains("all 3 processes together:"), "{stderr}");

    let json = summary_json(&dir);
    let traces = json["traces"].as_array().unwrap();
    assert_eq!(traces.len(), 3);
    let merged = &json["merged"];
    let ranks: Vec<u64> = merged["processes"].as_array().unwrap().iter().map(|p| p["rank"].as_u64().unwrap()).collect();
    assert_eq!(ranks, [0, 1, 2]);
    // Each rank alone peaks at the same GPU memory; together they peak between one and three times that.
    let single = merged["processes"][0]["peaks"]["0"].as_u64().unwrap();
    assert!(single > 0);
    let device0 = &merged["devices"][0];
    let combined = device0["peak_bytes"].as_u64().unwrap();
    assert!(combined >= single && combined <= 3 * single, "{merged}");
    let shares: u64 = device0["peak_by_pid"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(shares, combined);
    // Leaks of all ranks add up.
    let leaked: u64 = traces.iter().map(|t| t["devices"][0]["live_bytes"].as_u64().unwrap()).sum();
    assert_eq!(device0["live_bytes_at_end"].as_u64().unwrap(), leaked);
}

#[test]
fn an_allocation_inside_dlopen_starts_the_tracer_without_deadlock() {
    allocation_inside_dlopen_with(&[]);
}

#[test]
fn with_writes_beside_the_writer_an_allocation_inside_dlopen_starts_without_deadlock() {
    // The batch thread cannot start while dlopen() holds the loader lock (std registers a
    // thread-local destructor at a thread's start, which takes it): the first batch, written
    // when the tracer starts inside the constructor, must not wait for that thread.
    allocation_inside_dlopen_with(&[("GPUMEMTRACE_WRITE_THREAD", "1")]);
}

fn allocation_inside_dlopen_with(env: &[(&str, &str)]) {
    // libctor_alloc.so's constructor calls cudaMalloc while dlopen() holds the loader lock; the
    // tracer starts right there (thread, file, module scan).
    let run = run_traced_within(60, "prog_dlopen_ctor", &[], env);
    assert!(run.out.status.success(), "{:?} (killed: still running after 60 s) {}", run.out.status, run.stderr);
    let t = run.trace();
    assert_eq!(alloc_sizes(&t), vec![11 * MIB, 12 * MIB]);
    let json = summary_json(&run.traces[0]);
    let sites = json["traces"][0]["groups"][0]["leak_sites"].as_array().unwrap().clone();
    let names: Vec<&str> = sites.iter().map(|s| s["function"].as_str().unwrap()).collect();
    assert_eq!(names, ["main", "allocate_at_load"], "the library loaded late is symbolized too");
}

#[test]
fn at_exit_the_process_names_its_trace_on_stderr_unless_quiet() {
    let run = run_traced("prog_driver", &[], &[("GPUMEMTRACE_QUIET", "0")]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let lines = tracer_lines(&run.stderr);
    let n = run.trace().events.len();
    assert_eq!(lines, [format!("gpumemtrace: {n} events traced to {}", run.traces[0].display()).as_str()], "{}", run.stderr);
    let quiet = run_traced("prog_driver", &[], &[]);
    assert!(tracer_lines(&quiet.stderr).is_empty(), "{}", quiet.stderr);
}

#[test]
fn a_host_that_closes_our_descriptor_and_reuses_its_number_gets_no_trace_bytes() {
    closed_descriptor_with(&[]);
}

fn closed_descriptor_with(env: &[(&str, &str)]) {
    let run = run_traced("prog_lifecycle", &["closefrom"], env);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(std::fs::read(run.dir.join("host.txt")).unwrap(), b"host data\n", "the host's file is the host's");
    assert!(tracer_lines(&run.stderr).is_empty(), "{}", run.stderr);
    assert_eq!(alloc_sizes(&run.trace()), vec![MIB, 2 * MIB, 3 * MIB]);
    assert!(run.trace().stats.is_some_and(|s| s.final_));
}

// ---------------------------------------------------------------------------------------------
// Compression and writes beside the writer (src/sink.rs): a thread of their own, which a busy
// process gets by itself on a host of four cores or more; forced on here. Every promise above
// still holds.

const BESIDE: (&str, &str) = ("GPUMEMTRACE_WRITE_THREAD", "1");

/// The tracer's threads in a `prog_threads` run (printed with `PRINT_THREADS`).
fn tracer_threads(run: &Run) -> String {
    run.stdout.lines().find_map(|l| l.strip_prefix("other_threads=")).unwrap_or_else(|| panic!("{}", run.stdout)).to_owned()
}

#[test]
fn writes_get_a_thread_of_their_own_when_asked_or_when_busy_on_a_host_with_cores_to_spare() {
    let with = |args: &[&str], env: &[(&str, &str)]| {
        let env: Vec<(&str, &str)> = [("PRINT_THREADS", "1")].into_iter().chain(env.iter().copied()).collect();
        let run = run_traced("prog_threads", args, &env);
        assert!(run.out.status.success(), "{}", run.stderr);
        tracer_threads(&run)
    };
    assert_eq!(with(&["2", "1000"], &[BESIDE]), "gpumemtrace,gpumemtrace-out");
    assert_eq!(with(&["8", "50000"], &[("GPUMEMTRACE_WRITE_THREAD", "0")]), "gpumemtrace");
    // A process that allocates now and then never has a busy writer.
    assert_eq!(with(&["1", "10"], &[]), "gpumemtrace");
    // A busy one has, where there are cores to spare.
    let spare = std::thread::available_parallelism().unwrap().get() >= 4;
    let busy = with(&["8", "50000"], &[]);
    assert_eq!(busy, if spare { "gpumemtrace,gpumemtrace-out" } else { "gpumemtrace" });
    // Uncompressed, writing is cheap: it stays on the writer.
    assert_eq!(with(&["8", "50000"], &[("GPUMEMTRACE_COMPRESS", "0")]), "gpumemtrace");
}

#[test]
fn with_writes_beside_the_writer_many_threads_lose_nothing() {
    threads_lose_nothing(8, 50_000, &[BESIDE]);
}

#[test]
fn with_writes_beside_the_writer_every_way_out_keeps_the_trace() {
    exits_that_skip_exit_handlers_with(&[BESIDE]);
    forked_worker_with(&[BESIDE]);
    assert_dies_of_with("segv", libc::SIGSEGV, &[BESIDE]);
    assert_dies_of_with("kill-now", libc::SIGKILL, &[BESIDE]);
}

#[test]
fn with_writes_beside_the_writer_hostile_outputs_are_handled_as_before() {
    closed_descriptor_with(&[BESIDE]);
    full_disk_with(&[BESIDE]);
}
