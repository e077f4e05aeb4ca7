//! Hostile hosts change nothing (issue 13): a malloc wrapper preloaded before us, `dlerror`
//! after a failed `dlsym`, the program's own signal handlers of every flavour of flags, a
//! runtime that handles faults as a mechanism, a huge argument list. Each program is run with
//! and without the tracer: output, exit status and signal must be the same, and the trace right.

mod common;
use common::*;

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// What one run of a program did.
struct Outcome {
    stdout: String,
    stderr: String,
    status: Option<ExitStatus>,
    elapsed: Duration,
    dir: PathBuf,
}

impl Outcome {
    /// Exit code or signal, for comparisons and messages.
    fn ended(&self) -> String {
        match self.status {
            None => "still running at the time limit (killed)".into(),
            Some(s) => match (s.code(), s.signal()) {
                (Some(c), _) => format!("exit {c}"),
                (_, Some(sig)) => format!("signal {sig}"),
                _ => format!("{s:?}"),
            },
        }
    }

    fn traces(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "trace"))
            .collect();
        v.sort();
        v
    }

    fn trace(&self) -> TraceData {
        let t = self.traces();
        assert_eq!(t.len(), 1, "expected one trace, got {t:?}\nstderr: {}", self.stderr);
        read_trace(&t[0])
    }
}

/// Runs an emulated-CUDA program, `preload` as LD_PRELOAD (none: nothing preloaded), output
/// into files (a program printing in a loop must not block on a pipe), killed after `limit`.
fn run(prog: &str, args: &[OsString], preload: &[&Path], env: &[(&str, &str)], limit: Duration) -> Outcome {
    let dir = scratch(prog);
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = Command::new(emu().join(prog));
    cmd.args(args)
        .current_dir(&dir)
        .env_remove("LD_PRELOAD")
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("EMUCUDA_DEVICES", "2")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    if !preload.is_empty() {
        let list: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
        cmd.env("LD_PRELOAD", list.join(":"));
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let elapsed = t0.elapsed();
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Outcome { stdout: read(&out), stderr: read(&err), status, elapsed, dir }
}

fn args(a: &[&str]) -> Vec<OsString> {
    a.iter().map(OsString::from).collect()
}

/// Runs `prog args` without and with the tracer (after the `before` libraries in LD_PRELOAD
/// both times) and checks the traced run behaves exactly as the untraced one.
fn same_with_and_without(prog: &str, a: &[OsString], before: &[&Path], limit: Duration) -> (Outcome, Outcome) {
    let plain = run(prog, a, before, &[], limit);
    assert!(plain.status.is_some(), "{prog} {a:?} without the tracer did not finish: {}", plain.stdout);
    let shim = shim();
    let mut preload: Vec<&Path> = before.to_vec();
    preload.push(&shim);
    let traced = run(prog, a, &preload, &[], limit);
    let show = |o: &Outcome| format!("{}\n--- stdout:\n{}\n--- stderr:\n{}", o.ended(), tail(&o.stdout), tail(&o.stderr));
    assert_eq!(traced.ended(), plain.ended(), "{prog} {a:?}: traced {}\nuntraced {}", show(&traced), show(&plain));
    assert_eq!(normalized(&traced.stdout), normalized(&plain.stdout), "{prog} {a:?}: output differs; traced {}", show(&traced));
    (plain, traced)
}

/// The last lines of a long output (a loop of crash reports runs to megabytes).
fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    let n = lines.len();
    if n > 20 {
        format!("[{} lines before]\n{}", n - 20, lines[n - 20..].join("\n"))
    } else {
        s.to_owned()
    }
}

fn fatal_notices(t: &TraceData) -> usize {
    t.notices.iter().filter(|n| n.contains("fatal signal")).count()
}

// ---------------------------------------------------------------------------------------------
// Case 1: a malloc wrapper preloaded before us, resolving malloc through dlsym(RTLD_NEXT).

#[test]
fn a_malloc_wrapper_preloaded_before_us_that_resolves_malloc_with_dlsym_runs_as_without_us() {
    // Before the fix: SIGSEGV (our dlsym allocated, the wrapper's malloc called dlsym again...).
    let wrapper = emu().join("libmalloc_wrapper.so");
    for prog in ["prog_driver", "prog_runtime_dynamic", "prog_dlsym"] {
        let (plain, traced) = same_with_and_without(prog, &[], &[&wrapper], Duration::from_secs(60));
        assert!(plain.stderr.contains("malloc-wrapper: active"), "{prog}: the wrapper was not in use: {}", plain.stderr);
        assert!(traced.stderr.contains("malloc-wrapper: active"), "{prog}: {}", traced.stderr);
        // The trace has every allocation the program made, as it logged them.
        let mut logged: Vec<u64> = parse_log(&traced.stdout)
            .iter()
            .filter(|l| (l.op == "alloc" || l.op == "map") && l.result == 0)
            .map(|l| l.size.unwrap())
            .collect();
        assert!(logged.len() >= 3, "{prog}: {}", traced.stdout);
        let t = traced.trace();
        let mut sizes = alloc_sizes(&t);
        sizes.sort();
        logged.sort();
        assert_eq!(sizes, logged, "{prog}");
        assert!(t.stats.unwrap().final_, "{prog}");
    }
    // Threads racing to their first malloc (and the tracer's writer thread with them).
    let shim = shim();
    let o = run("prog_threads", &args(&["4", "200"]), &[&wrapper, &shim], &[], Duration::from_secs(60));
    assert_eq!(o.ended(), "exit 0", "{}", o.stderr);
    assert!(o.stdout.contains("total_pairs=800"), "{}", o.stdout);
    assert_eq!(o.trace().events.len(), 4 * 200 * 2 + 4);
}

// ---------------------------------------------------------------------------------------------
// Case 2: dlerror after dlsym through us, and after the hooks' own lookups.

#[test]
fn dlerror_after_dlsym_through_us_says_what_it_says_without_us() {
    let (_, traced) = same_with_and_without("prog_dlerror", &[], &[], Duration::from_secs(30));
    assert!(traced.stdout.contains("case=next-missing found=0 error=") && traced.stdout.contains("undefined symbol"), "{}", traced.stdout);
    assert_eq!(alloc_sizes(&traced.trace()), vec![3 * MIB], "the allocation through a dlsym'd pointer is traced");
    // The tracer's own lookups inside the hooks (the interpreter's symbols, which a C program
    // lacks) leave the program no dlerror() message: a runtime that checks dlerror() after its
    // own dlsym would take it for its failure.
    for case in ["after-allocation", "after-free"] {
        assert!(traced.stdout.contains(&format!("case={case} found=0 error=(null)")), "{}", traced.stdout);
    }
}

// ---------------------------------------------------------------------------------------------
// Case 3: the program's own signal handlers, every flag honoured; handled faults cost nothing.

/// One mode of prog_signals, run with and without the tracer; the traced run's trace.
fn signals(mode: &[&str]) -> (Outcome, TraceData) {
    let (_, traced) = same_with_and_without("prog_signals", &args(mode), &[], Duration::from_secs(20));
    let t = traced.trace();
    assert_eq!(alloc_sizes(&t), vec![8 * MIB], "{mode:?}: the allocation before the signal is in the trace");
    (traced, t)
}

/// A mode in which the program dies of SIGSEGV: once, with the trace flushed.
fn dies_of_segv(mode: &str) {
    let (o, t) = signals(&[mode]);
    assert_eq!(o.status.unwrap().signal(), Some(libc::SIGSEGV), "{mode}");
    let n = fatal_notices(&t);
    assert!((1..=2).contains(&n), "{mode}: {:?}", t.notices);
}

#[test]
fn a_one_shot_handler_that_returns_from_a_fault_runs_once_and_the_fault_kills() {
    // SA_RESETHAND: the handler runs once; the fault, not fixed, comes again and kills. Before
    // the fix the handler ran forever (11000 crash reports in 60 s), each with a flush.
    dies_of_segv("oneshot-return");
    dies_of_segv("oneshot-siginfo-return");
}

#[test]
fn handlers_that_raise_the_signal_again_die_of_it_as_without_us() {
    dies_of_segv("reraise"); // SIG_DFL back, raise
    dies_of_segv("oneshot-reraise"); // raised while blocked: delivered when the handler returns
    dies_of_segv("nodefer-reraise"); // SA_NODEFER: the raise kills inside the handler
    dies_of_segv("chain-later"); // installed after ours, chaining to it (faulthandler, JVMs)
}

#[test]
fn sa_nodefer_nests_deliveries_as_without_us() {
    let (o, _) = signals(&["nodefer-nest"]);
    assert!(o.stdout.contains("enter 1\nenter 2\nenter 3\nleave 3\nleave 2\nleave 1\nmain goes on"), "{}", o.stdout);
}

#[test]
fn the_handlers_signal_mask_is_the_one_the_program_asked_for() {
    let (o, _) = signals(&["mask"]);
    assert!(o.stdout.contains("usr1_blocked=1 segv_blocked=1 term_blocked=0"), "{}", o.stdout);
    let (o, _) = signals(&["mask-nodefer"]);
    assert!(o.stdout.contains("usr1_blocked=1 segv_blocked=0 term_blocked=0"), "{}", o.stdout);
}

#[test]
fn the_handler_runs_on_the_alternate_stack_exactly_when_the_program_asked_for_it() {
    let (o, _) = signals(&["onstack"]);
    assert!(o.stdout.contains("on_altstack=1"), "{}", o.stdout);
    let (o, _) = signals(&["offstack"]);
    assert!(o.stdout.contains("on_altstack=0"), "{}", o.stdout);
    // A stack overflow reaches the program's handler on its alternate stack.
    let (o, _) = signals(&["overflow"]);
    assert_eq!(o.status.unwrap().code(), Some(9));
}

#[test]
fn a_system_call_interrupted_by_a_handled_signal_restarts_exactly_when_the_program_asked_for_it() {
    // Without SA_RESTART the read() returns EINTR; before the fix ours restarted it.
    let (o, t) = signals(&["norestart"]);
    assert!(o.stdout.contains("read returned -1 EINTR"), "{}", o.stdout);
    assert!(t.stats.unwrap().final_);
    let (o, _) = signals(&["restart"]);
    assert!(o.stdout.contains("read returned 1"), "{}", o.stdout);
}

#[test]
fn a_runtime_handling_2000_faults_pays_nothing_for_them() {
    // A language runtime's guard page: each fault fixed with mprotect, the handler returns.
    // Before the fix each fault waited for a flush: 10.2 s instead of 0.004 s.
    let (o, t) = signals(&["runtime", "2000"]);
    assert!(o.stdout.contains("faults fixed=2000"), "{}", o.stdout);
    assert!(o.elapsed < Duration::from_secs(2), "2000 handled faults took {:?}", o.elapsed);
    assert!(t.stats.unwrap().final_, "the process went on and finished its trace");
    assert!(fatal_notices(&t) <= 1, "at most the one flush before the first handled signal: {:?}", t.notices);
}

// ---------------------------------------------------------------------------------------------
// Case 5: every record within the format's bounds.

#[test]
fn a_huge_argument_list_is_cut_and_marked_and_the_trace_reads() {
    // 1.2 MB of arguments (10 of 120 000 bytes; the kernel takes at most 128 KiB each), and,
    // separately, 150 000 small ones: both over the format's 1 MiB bound for one record.
    for (n, len) in [(10usize, 120_000usize), (150_000, 3)] {
        let a: Vec<OsString> = (0..n).map(|i| OsString::from("x".repeat(len - 1) + &(i % 10).to_string())).collect();
        let (_, traced) = same_with_and_without("prog_bigargs", &a, &[], Duration::from_secs(60));
        assert!(traced.stdout.starts_with(&format!("argc={}", n + 1)), "{}", traced.stdout);
        let path = &traced.traces()[0];
        // The reader reads every record (read_trace panics on an error), the summary works.
        let t = traced.trace();
        assert_eq!(alloc_sizes(&t), vec![5 * MIB]);
        assert!(t.stats.unwrap().final_);
        let json = summary_json(path);
        assert_eq!(json["traces"][0]["status"], "complete", "{json}");
        let out = Command::new(cli()).arg("summary").arg(path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // The arguments are cut and say so.
        let bytes = std::fs::read(path).unwrap();
        let process = gpumemtrace_format::Reader::new(&bytes[..])
            .unwrap()
            .find_map(|r| match r.unwrap() {
                gpumemtrace_format::Record::Process(p) => Some(p),
                _ => None,
            })
            .unwrap();
        assert!(process.args.len() < n + 1, "{n} arguments: some are left out");
        let last = process.args.last().unwrap();
        assert!(last.starts_with("…[cut ") && last.contains(" arguments, "), "{last}");
        let kept: usize = process.args.iter().map(|a| a.len()).sum();
        assert!(kept <= gpumemtrace_format::MAX_ARGS_LEN, "{kept}");
        if len > gpumemtrace_format::MAX_FIELD_LEN {
            assert!(process.args[1].ends_with(" bytes]") && process.args[1].len() <= gpumemtrace_format::MAX_FIELD_LEN, "each long argument is cut and marked");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Case 6: output to something that is not a regular file: /dev/null, a FIFO, a Unix socket.

/// `prog args` without and with the tracer writing to `output`; the traced run must finish as
/// the untraced one did (same exit, same result line: prog_threads's threads print in any order).
fn same_with_output(prog: &str, a: &[&str], output: &Path) -> (Outcome, Outcome) {
    let out = output.display().to_string();
    let env = [("GPUMEMTRACE_OUTPUT", out.as_str())];
    let plain = run(prog, &args(a), &[], &env, Duration::from_secs(60));
    let traced = run(prog, &args(a), &[&shim()], &env, Duration::from_secs(60));
    assert_eq!(traced.ended(), plain.ended(), "{prog} {a:?} -> {out}: {}", traced.stderr);
    assert_eq!(traced.stdout.lines().last(), plain.stdout.lines().last(), "{prog} {a:?} -> {out}");
    (plain, traced)
}

/// What the tracer said on stderr.
fn tracer_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("gpumemtrace:")).collect()
}

/// Files the run left in its directory besides its stdout and stderr.
fn left_over(o: &Outcome) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&o.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "stdout" && n != "stderr")
        .collect();
    v.sort();
    v
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

#[test]
fn output_to_dev_null_works_and_changes_nothing() {
    // Before: "cannot create trace file /dev/null" (O_EXCL refuses an existing path), and as root
    // a regular file /dev/null.1 was created in /dev instead.
    let (_, traced) = same_with_output("prog_threads", &["2", "500"], Path::new("/dev/null"));
    assert_eq!(tracer_lines(&traced.stderr), vec![format!("gpumemtrace: {} events traced to /dev/null", 2 * 500 * 2 + 2)]);
    assert!(left_over(&traced).is_empty(), "{:?}", left_over(&traced));
    for beside in ["/dev/null.journal", "/dev/null.1", "/dev/null.1.trace"] {
        assert!(!Path::new(beside).exists(), "{beside} was created");
    }
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
}

#[test]
fn a_fifo_or_socket_that_nobody_reads_never_hangs_the_host() {
    // Before: the host hung at exit, forever.
    let dir = scratch("unread-outputs");
    // A FIFO that no process opens: the tracer waits a second for a reader, then turns off.
    let fifo = dir.join("none.fifo");
    mkfifo(&fifo);
    let (_, traced) = same_with_output("prog_threads", &["4", "2000"], &fifo);
    let lines = tracer_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{}", traced.stderr);
    assert!(lines[0].contains("no process opened for reading") && lines[0].contains("tracing is off"), "{}", lines[0]);

    // A FIFO with a reader that never reads: what the pipe takes is written, then the tracer
    // gives up after a second without progress, and says how many events were not written.
    let fifo = dir.join("unread.fifo");
    mkfifo(&fifo);
    use std::os::unix::fs::OpenOptionsExt;
    let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).unwrap();
    let (_, traced) = same_with_output("prog_threads", &["4", "20000"], &fifo);
    let lines = tracer_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{}", traced.stderr);
    assert!(lines[0].contains("took nothing for 1 s") && lines[0].contains("events recorded so far were not"), "{}", lines[0]);
    drop(reader);

    // A Unix socket whose listener never accepts, nor reads.
    let sock = dir.join("unread.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let (_, traced) = same_with_output("prog_threads", &["4", "20000"], &sock);
    let lines = tracer_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{}", traced.stderr);
    assert!(lines[0].contains("took nothing for 1 s"), "{}", lines[0]);
    drop(listener);
    // No journal beside any of them, and no trace file instead of them.
    let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    assert_eq!(names, ["none.fifo", "unread.fifo", "unread.sock"]);
}

#[test]
fn a_fifo_that_is_read_gets_the_complete_trace() {
    let dir = scratch("read-fifo");
    let fifo = dir.join("trace.fifo");
    mkfifo(&fifo);
    let path = fifo.clone();
    // Opening for reading waits for the writer; reading ends when the writer closes.
    let reader = std::thread::spawn(move || std::fs::read(&path).unwrap());
    let (_, traced) = same_with_output("prog_threads", &["4", "20000"], &fifo);
    // Should the tracer never have opened it, this lets the reader go (it then reads nothing).
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
    let bytes = reader.join().unwrap();
    let copy = dir.join("copy.trace");
    std::fs::write(&copy, &bytes).unwrap();
    let t = read_trace(&copy);
    assert_eq!(t.events.len(), 4 * 20000 * 2 + 4);
    assert_eq!(t.stats.unwrap().dropped, 0);
    assert!(t.stats.unwrap().final_);
    assert_eq!(summary_json(&copy)["traces"][0]["status"], "complete");
    assert_eq!(tracer_lines(&traced.stderr), vec![format!("gpumemtrace: {} events traced to {}", 4 * 20000 * 2 + 4, fifo.display())]);
    assert!(!left_over(&traced).iter().any(|n| n.ends_with(".journal")));
    assert!(!dir.join("trace.fifo.journal").exists());
}

#[test]
fn an_output_read_slowly_bounds_the_host_and_says_what_it_gave_up() {
    // Before: a writer that kept committing, however slowly, held every hook, so the host ran at
    // the reader's speed (here 40 KB/s for about 8 MB of trace: more than three minutes), and
    // at exit it waited for the last byte. Now waiting that is mostly the writer's time in
    // writes ends after a second (the events given up are counted), and the exit stops writing
    // after 10 s.
    let dir = scratch("slow-fifo");
    let fifo = dir.join("slow.fifo");
    mkfifo(&fifo);
    let path = fifo.clone();
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut f = std::fs::File::open(&path).unwrap();
        let (mut buf, mut total) = (vec![0u8; 4096], 0usize);
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            std::thread::sleep(Duration::from_millis(100));
        }
        total
    });
    let env = [("GPUMEMTRACE_OUTPUT", fifo.to_str().unwrap()), ("GPUMEMTRACE_COMPRESS", "0")];
    let traced = run("prog_threads", &args(&["4", "50000"]), &[&shim()], &env, Duration::from_secs(120));
    assert_eq!(traced.ended(), "exit 0", "{}", traced.stderr);
    // Generous: the point is the class of time (seconds, not the reader's minutes).
    assert!(traced.elapsed < Duration::from_secs(60), "the host took {:?}", traced.elapsed);
    // The exit line says how many were lost; the reader got a trace whose stats count them.
    let lines = tracer_lines(&traced.stderr);
    assert_eq!(lines.len(), 1, "{}", traced.stderr);
    assert!(lines[0].contains("more were lost: the output did not keep up"), "{}", lines[0]);
    let read = reader.join().unwrap();
    assert!(read > 0 && read < 8 << 20, "the reader got {read} bytes");
}

// ---------------------------------------------------------------------------------------------
// Case 7: what a trace names (module paths, program and function names) cannot hurt its reader.

/// A hand-built trace: a process called `args`, one module at `module` holding both frames of
/// stack 1, one 1 MiB allocation from it, and what `more` adds before the event.
fn hand_built(args: &[&str], module: &str, more: &[gpumemtrace_format::Record]) -> Vec<u8> {
    use gpumemtrace_format::{header, Api, Encoder, Event, MemKind, Module, Op, Process, Record, Stack, Stats};
    let mut bytes = header().to_vec();
    let mut enc = Encoder::new();
    let mut recs = vec![
        Record::Process(Process {
            pid: 4321,
            ppid: 1,
            exe: args[0].into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            max_frames: 32,
            ..Process::default()
        }),
        Record::Api(Api { id: 1, name: "cudaMalloc".into(), kind: MemKind::Device, op: Op::Alloc }),
        Record::Module(Module { id: 1, bias: 0x10_0000, start: 0x10_0000, end: 0x20_0000, path: module.into(), build_id: vec![] }),
        Record::Stack(Stack { id: 1, frames: vec![0x10_1234, 0x10_5678] }),
    ];
    recs.extend(more.iter().cloned());
    recs.push(Record::Event(Event { api: 1, time_ns: 10, tid: 1, stack: 1, addr: 0xa000, size: MIB, pystack: 1, ..Event::default() }));
    recs.push(Record::Stats(Stats { events: 1, dropped: 0, final_: true }));
    for r in &recs {
        enc.encode(r, &mut bytes);
    }
    bytes
}

/// `gpumemtrace ARGS`, killed if it runs longer than a minute (None then).
fn cli_within_a_minute(args: &[&OsString]) -> Option<std::process::Output> {
    let mut child = Command::new(cli()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(child.wait_with_output().unwrap())
}

#[test]
fn a_module_path_that_is_a_fifo_never_hangs_the_cli() {
    // Before: `summary` opened the module to symbolize its frames and waited for a writer forever.
    let dir = scratch("module-fifo");
    let fifo = dir.join("libfifo.so");
    mkfifo(&fifo);
    let trace = dir.join("t.trace");
    std::fs::write(&trace, hand_built(&["app"], fifo.to_str().unwrap(), &[])).unwrap();
    for report in ["summary", "flamegraph"] {
        let out = cli_within_a_minute(&[&report.into(), &trace.clone().into_os_string()])
            .unwrap_or_else(|| panic!("`gpumemtrace {report}` on a trace naming a FIFO as a module did not finish"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{report}: {stderr}");
        assert!(stderr.contains(&format!("cannot open {}: not a regular file", fifo.display())), "{report}: {stderr}");
        // The frames are shown by module and offset.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("libfifo.so+0x1233") || stdout.contains("libfifo.so+0x1234"), "{report}: {stdout}");
    }
}

#[test]
fn terminal_escapes_in_names_from_a_trace_are_shown_escaped_in_text_and_kept_in_json() {
    // Before: the summary printed them raw: a trace could clear the screen (ESC [2J), set the
    // terminal's title (ESC ]0;...BEL) or overwrite a line with a carriage return.
    use gpumemtrace_format::{Phase, PhaseOp, PyCode, PyFrame, PyStack, Record, Thread};
    let dir = scratch("escapes");
    let evil_arg = "--x\x1b]0;owned\x07\rFAKE";
    let evil_module = format!("{}/lib\x1b[2Jevil.so", dir.display());
    let evil_file = "/srv/\x1b[31mtrain.py";
    let evil_function = "step\u{9b}2J";
    let more = [
        Record::Thread(Thread { tid: 1, name: "main".into(), python: true }),
        Record::PyCode(PyCode {
            id: 1,
            name: evil_function.into(),
            qualname: evil_function.into(),
            filename: evil_file.into(),
            firstlineno: 7,
            ..PyCode::default()
        }),
        Record::PyStack(PyStack { id: 1, frames: vec![PyFrame { code: 1, instr_offset: 0, flags: 1 }] }),
        Record::Notice("a notice\x1b[1A".into()),
        Record::Phase(Phase { time_ns: 1, tid: 1, op: PhaseOp::Mark, name: "\x1b[2Kwarmup".into() }),
    ];
    let trace = dir.join("t.trace");
    std::fs::write(&trace, hand_built(&["/usr/bin/app\x1b[8m", evil_arg], &evil_module, &more)).unwrap();
    let out = cli_within_a_minute(&[&"summary".into(), &"--frames".into(), &"8".into(), &trace.clone().into_os_string()]).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for raw in ['\x1b', '\r', '\x07', '\u{9b}'] {
        assert!(!text.contains(raw), "{raw:?} printed raw:\n{text}");
    }
    for shown in [
        "/usr/bin/app\\x1b[8m",
        "--x\\x1b]0;owned\\x07\\x0dFAKE",
        "step\\x9b2J \\x1b[31mtrain.py:7",
        "a notice\\x1b[1A",
    ] {
        assert!(text.contains(shown), "{shown} not in:\n{text}");
    }
    // The module's warning on stderr is escaped too.
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!stderr.contains('\x1b') && stderr.contains("lib\\x1b[2Jevil.so"), "{stderr}");
    // The phases report too.
    let out = cli_within_a_minute(&[&"phases".into(), &trace.clone().into_os_string()]).unwrap();
    let phases = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success() && !phases.contains('\x1b') && phases.contains("\\x1b[2Kwarmup"), "{phases}");
    // JSON keeps the names as they are (its own escapes make them safe).
    let json = summary_json(&trace);
    assert_eq!(json["traces"][0]["args"][1], evil_arg, "{json}");
    assert!(json.to_string().contains("\\u001b[31mtrain.py"), "{json}");
}

#[test]
fn a_forked_child_never_writes_into_its_parents_fifo() {
    // Two processes writing one FIFO would interleave their records into one unreadable stream:
    // the first one to open it keeps it; the child says so and does not trace.
    let dir = scratch("fifo-fork");
    let fifo = dir.join("trace.fifo");
    mkfifo(&fifo);
    let path = fifo.clone();
    let reader = std::thread::spawn(move || std::fs::read(&path).unwrap());
    let (_, traced) = same_with_output("prog_lifecycle", &["fork"], &fifo);
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
    let copy = dir.join("copy.trace");
    std::fs::write(&copy, reader.join().unwrap()).unwrap();
    let t = read_trace(&copy);
    assert_eq!(alloc_sizes(&t), vec![MIB, 4 * MIB], "the parent's allocations, complete");
    assert!(t.stats.unwrap().final_);
    let refused: Vec<&str> = tracer_lines(&traced.stderr).into_iter().filter(|l| l.contains("another process is writing its trace into this FIFO")).collect();
    assert_eq!(refused.len(), 1, "{}", traced.stderr);
}
