//! `gpumemtrace run`: runs a command with the preload library and summarizes its traces.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::io::{self, ErrorKind, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Error;
use crate::read::input::trace_files;
use crate::report::summary::{self, Options};

pub struct Launch {
    pub lib: PathBuf,
    /// Where traces go; created if missing.
    pub output: PathBuf,
    pub command: Vec<OsString>,
    /// `--aggregate`: sets GPUMEMTRACE_AGGREGATE=1 for the command.
    pub aggregate: bool,
}

/// The preload library: `$GPUMEMTRACE_LIB`, else where installs put it (crate::shim).
pub fn find_lib() -> Result<PathBuf, Error> {
    super::shim::find()
}

/// Runs the command traced, summarizes new traces to `report` (stderr for text: stdout belongs
/// to the command; stdout for JSON, after the command's output), and returns the exit code to exit with: the command's own, or 128+N when
/// signal N killed it.
pub fn launch(l: &Launch, opts: &Options, report: &mut dyn Write) -> Result<u8, Error> {
    let (program, args) = l.command.split_first().ok_or("no command to run")?;
    std::fs::create_dir_all(&l.output)
        .map_err(|e| format!("cannot create {}: {e}", l.output.display()))?;
    // Absolute paths: the command may change directory before the library reads them.
    let dir = l
        .output
        .canonicalize()
        .map_err(|e| format!("{}: {e}", l.output.display()))?;
    let lib = l.lib.canonicalize().unwrap_or_else(|_| l.lib.clone());
    let before = names(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;

    let mut preload = lib.clone().into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    // The trailing slash tells the library this is a directory to create traces in.
    let mut out_dir = dir.clone().into_os_string();
    out_dir.push("/");

    // Ctrl-C reaches the whole foreground process group: let the command decide what it
    // means, and survive to summarize what it did.
    let _guard = InterruptGuard::new();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env("GPUMEMTRACE_OUTPUT", out_dir);
    // The summary below names the traces; the processes need not each say so too.
    if std::env::var_os("GPUMEMTRACE_QUIET").is_none() {
        cmd.env("GPUMEMTRACE_QUIET", "1");
    }
    if l.aggregate {
        cmd.env("GPUMEMTRACE_AGGREGATE", "1");
    }
    // NVTX ranges become phases (src/nvtx.rs); NVTX takes one injection library, so one
    // already chosen (a profiler's) is kept.
    if std::env::var_os("NVTX_INJECTION64_PATH").is_none_or(|v| v.is_empty()) {
        cmd.env("NVTX_INJECTION64_PATH", &lib);
    }
    let status = cmd.status();
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let name = program.to_string_lossy();
            // The shell's codes for "not found" and "cannot execute".
            return match e.kind() {
                ErrorKind::NotFound => {
                    eprintln!("gpumemtrace: {name}: command not found");
                    Ok(127)
                }
                _ => {
                    eprintln!("gpumemtrace: cannot run {name}: {e}");
                    Ok(126)
                }
            };
        }
    };
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c as u8,
        (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
        (None, None) => 1,
    };

    let after = names(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let mut new: Vec<&OsString> = after.difference(&before).collect();
    new.sort();
    if new.is_empty() {
        let msg = format!(
            "gpumemtrace: no trace appeared in {}: no CUDA allocation calls were seen",
            dir.display()
        );
        if opts.json {
            // The report stays JSON; the reason goes beside it.
            eprintln!("{msg}");
            writeln!(report, "{{\"traces\": []}}").map_err(|e| e.to_string())?;
        } else {
            writeln!(report, "{msg}").map_err(|e| e.to_string())?;
        }
    } else {
        let paths: Vec<PathBuf> = new.iter().map(|n| dir.join(n)).collect();
        // Set the summary apart from whatever the command printed last (JSON stays parseable).
        if !opts.json {
            writeln!(report).map_err(|e| e.to_string())?;
        }
        summary::run(&paths, opts, report).map_err(|e| e.to_string())?;
    }
    report.flush().map_err(|e| e.to_string())?;
    Ok(code)
}

fn names(dir: &Path) -> io::Result<HashSet<OsString>> {
    Ok(trace_files(dir)?
        .into_iter()
        .filter_map(|p| p.file_name().map(OsStr::to_owned))
        .collect())
}

/// Catches SIGINT and SIGQUIT with a handler that does nothing, while alive. A handler,
/// not SIG_IGN: ignored signals stay ignored in the child, caught ones are reset by exec.
struct InterruptGuard {
    old: [libc::sighandler_t; 2],
}

const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGQUIT];

extern "C" fn ignore(_: libc::c_int) {}

impl InterruptGuard {
    fn new() -> InterruptGuard {
        let handler = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: installs an async-signal-safe (empty) handler.
        InterruptGuard {
            old: SIGNALS.map(|s| unsafe { libc::signal(s, handler) }),
        }
    }
}

impl Drop for InterruptGuard {
    fn drop(&mut self) {
        for (s, old) in SIGNALS.iter().zip(self.old) {
            // SAFETY: restores what was there before.
            unsafe { libc::signal(*s, old) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `sh -c script` in a fresh output directory; returns the exit code and the report.
    fn launch_sh(name: &str, script: &str) -> (u8, String) {
        let dir =
            std::env::temp_dir().join(format!("gpumemtrace-run-{name}-{}", std::process::id()));
        let l = Launch {
            // Not loadable: the loader warns and the command runs untraced.
            lib: PathBuf::from("/dev/null"),
            output: dir.clone(),
            command: vec!["sh".into(), "-c".into(), script.into()],
            aggregate: false,
        };
        let mut report = Vec::new();
        let code = launch(&l, &Options::default(), &mut report).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        (code, String::from_utf8(report).unwrap())
    }

    #[test]
    fn forwards_exit_codes() {
        let (code, report) = launch_sh("exit0", "exit 0");
        assert_eq!(code, 0);
        assert!(
            report.contains("no CUDA allocation calls were seen"),
            "{report}"
        );
        assert_eq!(launch_sh("exit3", "exit 3").0, 3);
        assert_eq!(launch_sh("signal", "kill -TERM $$").0, 128 + 15);
    }

    #[test]
    fn summarizes_the_traces_that_appear() {
        let mut b = crate::model::tests::TraceBuilder::new();
        b.ok(crate::model::tests::MALLOC, 1, 0x1000, 3 << 20, 0);
        let src =
            std::env::temp_dir().join(format!("gpumemtrace-run-src-{}.bin", std::process::id()));
        std::fs::write(&src, &b.bytes).unwrap();
        // Stand in for the library: write where GPUMEMTRACE_OUTPUT says, check LD_PRELOAD.
        let script = format!(
            r#"case "$LD_PRELOAD" in /dev/null*) ;; *) exit 9;; esac; cp {} "${{GPUMEMTRACE_OUTPUT}}gpumemtrace-77.trace"; exit 5"#,
            src.display()
        );
        let (code, report) = launch_sh("appear", &script);
        let _ = std::fs::remove_file(&src);
        assert_eq!(code, 5);
        assert!(
            report.contains("gpumemtrace-77.trace: pid 1234 /usr/bin/demo"),
            "{report}"
        );
        assert!(
            report.contains("live at end (leaked) 3.0 MiB in 1 allocation:"),
            "{report}"
        );
    }

    #[test]
    fn missing_command() {
        let l = Launch {
            lib: PathBuf::from("/dev/null"),
            output: std::env::temp_dir(),
            command: vec!["/nonexistent/gpumemtrace-no-such-command".into()],
            aggregate: false,
        };
        assert_eq!(
            launch(&l, &Options::default(), &mut io::sink()).unwrap(),
            127
        );
    }
}
