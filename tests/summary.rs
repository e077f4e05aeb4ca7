//! `gpumemtrace summary` and `gpumemtrace run` on real traces of the emulated-CUDA programs:
//! peaks, leaks and failures equal what the programs did, and call sites name the programs' own
//! source lines.

mod common;
use common::*;

use std::collections::HashMap;
use std::process::Command;

use serde_json::Value;

fn json_kind(log_kind: &str) -> &'static str {
    match log_kind {
        "device" => "device",
        "managed" => "managed",
        "host" => "host-pinned",
        "vmm_physical" => "vmm-physical",
        "vmm_reserved" => "vmm-reserved",
        "vmm_mapped" => "vmm-mapped",
        k => panic!("unknown kind {k}"),
    }
}

fn namespace(kind: &str) -> &str {
    match kind {
        "device" | "managed" | "host-pinned" => "pointer",
        k => k,
    }
}

/// What the program's own log says about each (device, kind) group.
#[derive(Default, Debug)]
struct Expected {
    peak: u64,
    live: u64,
    allocations: u64,
    /// Leaked bytes per source line.
    leaks: HashMap<u32, u64>,
}

struct LiveAlloc {
    group: (i32, &'static str),
    size: u64,
    line: u32,
}

/// GPU memory live per source line on the device of the last failed allocation, as it failed.
fn live_at_last_failure(log: &[Logged]) -> HashMap<u32, u64> {
    let Some(last) = log.iter().rposition(|l| l.op == "alloc" && l.result != 0) else { return HashMap::new() };
    let device = log[last].device.unwrap();
    let mut live: HashMap<u64, (u32, u64)> = HashMap::new();
    for l in &log[..last] {
        let gpu = matches!(l.kind.as_str(), "device" | "managed" | "vmm_physical") && l.device == Some(device);
        match l.op.as_str() {
            "alloc" if l.result == 0 && gpu => {
                live.insert(l.ptr, (l.line, l.size.unwrap()));
            }
            "free" if l.result == 0 => {
                live.remove(&l.ptr);
            }
            _ => {}
        }
    }
    let mut by_line = HashMap::new();
    for (line, size) in live.into_values() {
        *by_line.entry(line).or_default() += size;
    }
    by_line
}

fn replay(log: &[Logged]) -> (HashMap<(i32, &'static str), Expected>, Vec<&Logged>, Vec<&Logged>) {
    let mut groups: HashMap<(i32, &'static str), Expected> = HashMap::new();
    let mut live: HashMap<(&str, u64), LiveAlloc> = HashMap::new();
    let mut handle_device: HashMap<u64, i32> = HashMap::new();
    let (mut failures, mut bad_frees) = (vec![], vec![]);
    for l in log {
        let kind = json_kind(&l.kind);
        match l.op.as_str() {
            "alloc" | "map" if l.result != 0 => failures.push(l),
            "alloc" | "map" => {
                let device = match kind {
                    "host-pinned" | "vmm-reserved" => -1,
                    "vmm-mapped" => handle_device[&l.handle.unwrap()],
                    _ => l.device.unwrap(),
                };
                if kind == "vmm-physical" {
                    handle_device.insert(l.ptr, device);
                }
                let g = groups.entry((device, kind)).or_default();
                g.allocations += 1;
                g.live += l.size.unwrap();
                g.peak = g.peak.max(g.live);
                live.insert((namespace(kind), l.ptr), LiveAlloc { group: (device, kind), size: l.size.unwrap(), line: l.line });
            }
            _ if l.result != 0 => bad_frees.push(l),
            _ => {
                let a = live.remove(&(namespace(kind), l.ptr)).unwrap_or_else(|| panic!("log frees unknown {l:?}"));
                groups.get_mut(&a.group).unwrap().live -= a.size;
            }
        }
    }
    for a in live.values() {
        *groups.get_mut(&a.group).unwrap().leaks.entry(a.line).or_default() += a.size;
    }
    (groups, failures, bad_frees)
}

fn site_is(site: &Value, source: &str, line: u32) -> bool {
    site["file"].as_str().is_some_and(|f| f.ends_with(source)) && site["line"].as_u64() == Some(line as u64)
}

/// Runs `prog` traced and checks every number of its summary against the program's own log.
fn assert_summary_matches_log(prog: &str, source: &str) {
    let run = run_traced(prog, &[], &[]);
    assert!(run.out.status.success(), "{}", run.stderr);
    let (expected, failures, bad_frees) = replay(&run.logged);
    let s = summary_json(&run.traces[0]);
    let t = &s["traces"][0];
    assert_eq!(t["status"], "complete");
    assert_eq!(t["events"].as_u64().unwrap() as usize, run.logged.len());
    let groups = t["groups"].as_array().unwrap();
    assert_eq!(groups.len(), expected.len(), "{prog}: groups {groups:#?} vs {expected:#?}");
    for g in groups {
        let key = (g["device"].as_i64().unwrap() as i32, g["kind"].as_str().unwrap());
        let e = expected.get(&key).unwrap_or_else(|| panic!("{prog}: unexpected group {key:?}"));
        let ctx = format!("{prog} {key:?}");
        assert_eq!(g["allocations"].as_u64().unwrap(), e.allocations, "{ctx}");
        assert_eq!(g["peak_bytes"].as_u64().unwrap(), e.peak, "{ctx}");
        assert_eq!(g["live_bytes"].as_u64().unwrap(), e.live, "{ctx}");
        // Every leak is attributed to the source line that allocated it.
        let sites = g["leak_sites"].as_array().unwrap();
        assert_eq!(sites.len(), e.leaks.len(), "{ctx}: {sites:#?}");
        for (&line, &bytes) in &e.leaks {
            let site = sites.iter().find(|s| site_is(s, source, line)).unwrap_or_else(|| {
                panic!("{ctx}: no leak site at {source}:{line} in {sites:#?}")
            });
            assert_eq!(site["bytes"].as_u64().unwrap(), bytes, "{ctx}");
            assert!(site["function"].as_str().is_some_and(|f| !f.starts_with("cu")), "{ctx}: {site}");
        }
        // The peak's sites add up to the peak.
        let peak_sum: u64 = g["peak_sites"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
        assert_eq!(peak_sum, e.peak, "{ctx}");
    }
    let fails = t["failures"].as_array().unwrap();
    assert_eq!(fails.len(), failures.len(), "{prog}: {fails:#?}");
    for l in &failures {
        assert!(
            fails.iter().any(|f| site_is(&f["site"], source, l.line)
                && f["size"].as_u64() == l.size
                && f["result"].as_u64() == Some(l.result as u64)),
            "{prog}: failure at line {} not reported: {fails:#?}",
            l.line
        );
    }
    // Post-mortem of the last failure: the live set on its device, by the line that allocated it.
    let expected_live = live_at_last_failure(&run.logged);
    let mut got_live: HashMap<u32, u64> = HashMap::new();
    for g in t["last_failure_live"].as_array().unwrap() {
        for site in g["sites"].as_array().unwrap() {
            assert!(site["file"].as_str().is_some_and(|f| f.ends_with(source)), "{prog}: {site}");
            *got_live.entry(site["line"].as_u64().unwrap() as u32).or_default() += site["bytes"].as_u64().unwrap();
        }
    }
    assert_eq!(got_live, expected_live, "{prog}: live set at the last failure");
    let frees = t["unknown_frees"].as_array().unwrap();
    assert_eq!(frees.len(), bad_frees.len(), "{prog}: {frees:#?}");
    for l in &bad_frees {
        assert!(frees.iter().any(|f| site_is(&f["site"], source, l.line) && f["addr"].as_u64() == Some(l.ptr)));
    }
}

#[test]
fn shared_runtime_summary_matches_the_program() {
    assert_summary_matches_log("prog_runtime_dynamic", "prog_runtime.c");
}

#[test]
fn static_runtime_summary_matches_the_program() {
    // The calls are seen inside the runtime's code, which is linked into the program: the call
    // site still has to be the program's own line, not the runtime's.
    assert_summary_matches_log("prog_runtime_static", "prog_runtime.c");
}

#[test]
fn driver_summary_matches_the_program() {
    assert_summary_matches_log("prog_driver", "prog_driver.c");
}

#[test]
fn dlsym_summary_matches_the_program() {
    assert_summary_matches_log("prog_dlsym", "prog_dlsym.c");
}

#[test]
fn entry_point_summary_matches_the_program() {
    assert_summary_matches_log("prog_entry_point", "prog_entry_point.c");
}

#[test]
fn two_devices_are_kept_apart() {
    // cudaSetDevice switches, a free of device 1's memory while device 0 is current, one thread
    // per device, peer access, and VMM memory created on device 1 while device 0 is current.
    assert_summary_matches_log("prog_multi_device", "prog_multi_device.c");
}

#[test]
fn the_summary_reads_well_in_a_terminal() {
    let run = run_traced("prog_runtime_dynamic", &[], &[]);
    let out = Command::new(cli()).arg("summary").arg(&run.traces[0]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for expected in [
        "device 0, device memory:",
        "live at end (leaked) 8.0 MiB in 2 allocations:",
        "3.0 MiB     1x  alloc_weights prog_runtime.c:",
        "failed allocations:",
        "2.0 GiB on device 0 -> error 2 (out of memory)",
        "cudaFree 0x1234 -> error 1 (invalid value)",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn run_preloads_the_tracer_forwards_the_exit_code_and_summarizes() {
    let dir = scratch("cli-run");
    let out = Command::new(cli())
        .args(["run", "--output"])
        .arg(&dir)
        .arg("--")
        .arg(emu().join("prog_driver"))
        .env("EMUCUDA_DEVICES", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("op=alloc"), "the program's own output stays on stdout");
    assert!(stderr.contains("live at end (leaked)") && stderr.contains("prog_driver.c:"), "{stderr}");
    let traces: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(traces.len(), 1);

    let out = Command::new(cli()).args(["run", "--output"]).arg(&dir).args(["--", "sh", "-c", "exit 3"]).output().unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no CUDA allocation calls were seen"));
}

#[test]
fn run_keeps_an_existing_ld_preload() {
    let dir = scratch("cli-run-preload");
    let out = Command::new(cli())
        .args(["run", "--output"])
        .arg(&dir)
        .args(["--", "sh", "-c", "echo $LD_PRELOAD"])
        .env("LD_PRELOAD", "libc.so.6")
        .output()
        .unwrap();
    let preload = String::from_utf8_lossy(&out.stdout);
    assert!(preload.trim().starts_with(shim().to_str().unwrap()) && preload.trim().ends_with(":libc.so.6"), "{preload}");
}
