//! Python stacks: Python programs call the emulated driver through ctypes (which releases the
//! GIL, as PyTorch's bindings do) and the summary must name the exact `file:line function` of
//! every call. Interpreters: `python3`, or the colon-separated list in `GPUMEMTRACE_TEST_PYTHONS`
//! (e.g. python3.10:python3.11:python3.12:python3.13).

mod common;
use common::*;

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use gpumemtrace_format::{Reader, Record};

fn pythons() -> Vec<String> {
    std::env::var("GPUMEMTRACE_TEST_PYTHONS")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| v.split(':').map(str::to_owned).collect())
        .unwrap_or_else(|| vec!["python3".to_owned()])
}

fn script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/alloc.py").display().to_string()
}

fn run_python(python: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let dir = scratch("python");
    let mut cmd = Command::new(python);
    cmd.arg(script())
        .arg(emu().join("libcuda.so.1"))
        .args(args)
        .current_dir(&dir)
        .env("LD_PRELOAD", shim())
        .env("GPUMEMTRACE_OUTPUT", format!("{}/", dir.display()))
        .env("EMUCUDA_DEVICES", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e} (CI needs CPython 3.11)"));
    let pid = child.id();
    finish(child.wait_with_output().unwrap(), dir, pid)
}

/// `py_alloc size=N line=L func=Q thread=T` lines of alloc.py.
fn logged_calls(stdout: &str) -> Vec<HashMap<String, String>> {
    stdout
        .lines()
        .filter(|l| l.starts_with("py_alloc"))
        .map(|l| l.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect())
        .collect()
}

fn records(trace: &Path) -> Vec<Record> {
    let f = std::fs::File::open(trace).unwrap();
    Reader::new(std::io::BufReader::new(f)).unwrap().map(|r| r.unwrap()).collect()
}

#[test]
fn python_sites_name_the_exact_line_and_function_of_each_call() {
    for python in pythons() {
        let run = run_python(&python, &[], &[]);
        assert!(run.out.status.success(), "{python}: {}", run.stderr);
        let calls = logged_calls(&run.stdout);
        assert_eq!(calls.len(), 9, "{python}: {}", run.stdout);
        // Expected leak bytes per (line, function): every allocation leaks.
        let mut expected: HashMap<(u64, String), u64> = HashMap::new();
        for c in &calls {
            *expected.entry((c["line"].parse().unwrap(), c["func"].clone())).or_default() += c["size"].parse::<u64>().unwrap();
        }
        let s = summary_json(&run.traces[0]);
        let g = &s["traces"][0]["groups"][0];
        let sites = g["leak_sites"].as_array().unwrap();
        assert_eq!(sites.len(), expected.len(), "{python}: {sites:#?}");
        for ((line, func), bytes) in &expected {
            let site = sites
                .iter()
                .find(|s| s["line"].as_u64() == Some(*line) && s["function"].as_str() == Some(func))
                .unwrap_or_else(|| panic!("{python}: no site {func} alloc.py:{line} in {sites:#?}"));
            assert!(site["file"].as_str().unwrap().ends_with("tests/python/alloc.py"), "{site}");
            assert_eq!(site["python"], true);
            assert_eq!(site["bytes"].as_u64(), Some(*bytes), "{python}: {func}:{line}");
            // The merged stack: native frames of the call (libffi, _ctypes) inside the Python
            // frames, the interpreter's own native frames gone.
            let frames = site["frames"].as_array().unwrap();
            assert!(frames[0].get("python").is_none(), "{frames:#?}");
            let ctypes = frames.iter().position(|f| f["module"].as_str().is_some_and(|m| m.contains("_ctypes"))).unwrap();
            assert!(ctypes < frames.iter().position(|f| f["python"] == true).unwrap(), "{frames:#?}");
            assert!(
                !frames.iter().any(|f| f["function"].as_str().is_some_and(|n| n.starts_with("_PyEval_EvalFrameDefault"))),
                "{frames:#?}"
            );
        }
        // The stdlib frame (sched.py's run, which made the call) is in the stack but is not the site.
        let stdlib = sites.iter().find(|s| s["function"] == "through_stdlib").unwrap();
        let frames = stdlib["frames"].as_array().unwrap();
        let run_frame = frames.iter().position(|f| f["file"].as_str().is_some_and(|p| p.ends_with("/sched.py"))).unwrap();
        let site_frame = frames.iter().position(|f| f["function"] == "through_stdlib").unwrap();
        assert!(run_frame < site_frame, "{frames:#?}");
        // Nested calls: the caller chain is there, innermost first.
        let inner = sites.iter().find(|s| s["function"] == "innermost").unwrap();
        let names: Vec<&str> =
            inner["frames"].as_array().unwrap().iter().filter(|f| f["python"] == true).map(|f| f["function"].as_str().unwrap()).collect();
        assert_eq!(names, ["innermost", "middle", "outer", "main", "<module>"], "{python}");

        // One Thread record per thread, all with Python.
        let recs = records(&run.traces[0]);
        let threads: Vec<_> = recs.iter().filter_map(|r| if let Record::Thread(t) = r { Some(t) } else { None }).collect();
        assert_eq!(threads.len(), 4, "{threads:?}");
        assert!(threads.iter().all(|t| t.python && !t.name.is_empty()), "{threads:?}");
        assert!(!recs.iter().any(|r| matches!(r, Record::Notice(_))), "{python}: {recs:?}");
    }
}

#[test]
fn a_code_object_at_a_freed_ones_address_is_named_as_itself() {
    for python in pythons() {
        let run = run_python(&python, &["--reuse"], &[]);
        assert!(run.out.status.success(), "{python}: {}", run.stderr);
        let calls = logged_calls(&run.stdout);
        assert_eq!(calls.len(), 24, "{python}: {}", run.stdout);
        // The test means something only if addresses were reused.
        let mut codes: Vec<&str> = calls.iter().map(|c| c["code"].as_str()).collect();
        codes.sort();
        codes.dedup();
        assert!(codes.len() < calls.len(), "{python}: no code object address was reused: {codes:?}");
        let s = summary_json(&run.traces[0]);
        let sites = s["traces"][0]["groups"][0]["leak_sites"].as_array().unwrap().clone();
        assert_eq!(sites.len(), calls.len(), "{python}: one site a function: {sites:#?}");
        for c in &calls {
            let (func, line, size) = (c["func"].as_str(), c["line"].parse::<u64>().unwrap(), c["size"].parse::<u64>().unwrap());
            let site = sites
                .iter()
                .find(|s| s["function"].as_str() == Some(func))
                .unwrap_or_else(|| panic!("{python}: no site {func} in {sites:#?}"));
            assert_eq!(site["line"].as_u64(), Some(line), "{python}: {func}");
            assert_eq!(site["bytes"].as_u64(), Some(size), "{python}: {func}");
        }
    }
}

/// The thread state is read through the interpreter's pthread key and the initialized flag where
/// `Py_IsInitialized` reads it (two calls into libpython less per event), and the frames found
/// that way are the right ones (the test above, and this one's sites).
#[test]
fn the_interpreter_is_read_without_calling_into_it() {
    for python in pythons() {
        let run = run_python(&python, &[], &[("GPUMEMTRACE_SELF_TIME", "1")]);
        assert!(run.out.status.success(), "{python}: {}", run.stderr);
        let notices: Vec<String> =
            records(&run.traces[0]).into_iter().filter_map(|r| if let Record::Notice(n) = r { Some(n) } else { None }).collect();
        let how = notices.iter().find(|n| n.starts_with("Python lookups")).unwrap_or_else(|| panic!("{python}: {notices:?}"));
        assert!(how.contains("thread state by pthread key"), "{python}: {how}");
        assert!(how.contains("initialized by its flag, read directly"), "{python}: {how}");
        let s = summary_json(&run.traces[0]);
        let sites = s["traces"][0]["groups"][0]["leak_sites"].as_array().unwrap();
        assert!(sites.iter().any(|s| s["function"] == "innermost" && s["python"] == true), "{python}: {sites:#?}");
    }
}

/// While paused (`gpumemtrace_pause`) the hooks only forward: those calls succeed and are not in
/// the trace, and the trace says it was paused (its leaks cannot be exact).
#[test]
fn calls_made_while_paused_are_forwarded_and_not_recorded() {
    let run = run_python("python3", &["--pause"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(logged_calls(&run.stdout).len(), 3, "{}", run.stdout);
    let recs = records(&run.traces[0]);
    let events: Vec<_> = recs.iter().filter_map(|r| if let Record::Event(e) = r { Some(e) } else { None }).collect();
    let sizes: Vec<u64> = events.iter().map(|e| e.size).collect();
    assert_eq!(sizes, [1 << 20, 3 << 20], "the allocation and free made while paused are left out: {events:?}");
    let notices: Vec<&String> = recs.iter().filter_map(|r| if let Record::Notice(n) = r { Some(n) } else { None }).collect();
    assert!(notices.iter().any(|n| n.starts_with("tracing was paused 1 times")), "{notices:?}");
}

#[test]
fn python_capture_can_be_turned_off() {
    let run = run_python("python3", &[], &[("GPUMEMTRACE_PYTHON", "0")]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let recs = records(&run.traces[0]);
    assert!(!recs.iter().any(|r| matches!(r, Record::PyStack(_) | Record::PyCode(_))));
    let s = summary_json(&run.traces[0]);
    let text = s.to_string();
    assert!(!text.contains("\"python\":true"), "{text}");
}

#[test]
fn a_python_process_without_cuda_calls_is_untouched() {
    let run = run_python("python3", &["--no-calls"], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    assert_eq!(run.stdout, "no calls made\n");
    assert!(run.stderr.is_empty(), "{}", run.stderr);
    assert!(run.traces.is_empty(), "{:?}", run.traces);
}

#[test]
fn a_native_process_gets_no_python_records() {
    let run = run_traced("prog_driver", &[], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let recs = records(&run.traces[0]);
    // No Python records, and no notice about Python (the unwinder's counters may be noted).
    assert!(!recs.iter().any(|r| matches!(r, Record::PyStack(_) | Record::PyCode(_))), "{recs:?}");
    assert!(!recs.iter().any(|r| matches!(r, Record::Notice(n) if n.to_lowercase().contains("python"))), "{recs:?}");
    assert!(recs.iter().any(|r| matches!(r, Record::Thread(t) if !t.python)));
    let events: Vec<_> = recs.iter().filter_map(|r| if let Record::Event(e) = r { Some(e) } else { None }).collect();
    assert!(!events.is_empty() && events.iter().all(|e| e.pystack == 0));
}

#[test]
fn reports_keep_the_python_frames() {
    // Flame graphs, speedscope and memory_viz exports show the merged stacks: Python frames have
    // no address, and must not be dropped with the null "frames" that end native stacks.
    let run = run_python("python3", &[], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let out = Command::new(cli()).args(["flamegraph", "--of", "allocated", "--folded"]).arg(&run.traces[0]).output().unwrap();
    let folded = String::from_utf8(out.stdout).unwrap();
    assert!(
        folded.lines().any(|l| l.contains(";<module> (alloc.py:") && l.contains(";innermost (alloc.py:")),
        "{folded}"
    );
}

/// A free carries no stack, only a flag saying the program's Python code made it (not the
/// interpreter's shutdown). Only the main thread's events tell the program's end, so the flag
/// is looked up there only: a worker thread's free, even from Python, leaves it 0.
#[test]
fn a_free_says_python_made_it_on_the_main_thread_only() {
    for python in pythons() {
        let run = run_python(&python, &["--frees"], &[]);
        assert!(run.out.status.success(), "{python}: {}", run.stderr);
        let freed: HashMap<u64, String> = run
            .stdout
            .lines()
            .filter(|l| l.starts_with("py_free"))
            .map(|l| {
                let kv: HashMap<&str, &str> = l.split_whitespace().filter_map(|kv| kv.split_once('=')).collect();
                (kv["addr"].parse().unwrap(), kv["thread"].to_owned())
            })
            .collect();
        assert_eq!(freed.len(), 2, "{python}: {}", run.stdout);
        let recs = records(&run.traces[0]);
        let free_api: Vec<u32> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Api(a) if a.name == "cuMemFree_v2" => Some(a.id),
                _ => None,
            })
            .collect();
        let mut flags: HashMap<String, (u32, bool)> = HashMap::new();
        for r in &recs {
            if let Record::Event(e) = r {
                if free_api.contains(&e.api) {
                    let thread = freed.get(&e.addr).unwrap_or_else(|| panic!("{python}: unlogged free of {:#x}", e.addr));
                    flags.insert(thread.clone(), (e.flags, e.tid == run.out_pid()));
                }
            }
        }
        assert_eq!(flags["MainThread"], (gpumemtrace_format::event_flags::PYTHON, true), "{python}");
        assert_eq!(flags["freer"], (0, false), "{python}");
    }
}
