//! `gpumemtrace`: summarizes traces written by the libgpumemtrace.so preload library, and
//! runs programs under it.

mod model;
mod report;
mod run;
mod sites;
mod symbolize;
mod timeseries;
mod units;

use std::ffi::OsString;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use report::summary;

#[derive(Parser)]
#[command(
    name = "gpumemtrace",
    version,
    about = "Find GPU memory leaks, peaks and failed allocations of CUDA programs",
    after_help = "\
Examples:
  gpumemtrace run -- python3 train.py --epochs 1
      run a program traced; its traces land in the current directory and are summarized
      when it exits
  gpumemtrace run --output traces/ -- ./app
  gpumemtrace summary gpumemtrace-1234.trace
  gpumemtrace summary --frames 4 --top 5 traces/
  gpumemtrace summary --json --device 0 traces/ > summary.json"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Summarize traces: peaks, leaks, failed allocations, bad frees
    ///
    /// Per device and memory kind: how much was allocated, the peak and which call sites
    /// held it, what was still live at the end (leaks); then failed allocations and frees
    /// of pointers the trace never saw allocated.
    #[command(after_help = "\
Examples:
  gpumemtrace summary gpumemtrace-1234.trace
  gpumemtrace summary traces/                  every *.trace file in the directory
  gpumemtrace summary --frames 3 app.trace     show 3 frames of each call site
  gpumemtrace summary --json app.trace | jq '.traces[0].groups'")]
    Summary {
        #[command(flatten)]
        report: ReportArgs,
        /// Trace files, or directories of *.trace files
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
    },
    /// Print every record of a trace as JSON lines (for scripts)
    #[command(after_help = "\
Example:
  gpumemtrace dump app.trace | grep '\"event\"' | head")]
    Dump {
        #[arg(value_name = "TRACE")]
        trace: PathBuf,
    },
    /// Run a command with the tracer preloaded, then summarize its traces on stderr
    #[command(after_help = "\
The tracer, libgpumemtrace.so, is looked for next to this executable; set GPUMEMTRACE_LIB
to use another. Each traced process writes DIR/gpumemtrace-<pid>.trace. The exit code is
the command's (128+N when it was killed by signal N).

Examples:
  gpumemtrace run -- python3 train.py
  gpumemtrace run --output /tmp/traces --frames 3 -- ./app --size 4096")]
    Run {
        /// Directory for the traces [default: the current directory]
        #[arg(short, long, value_name = "DIR")]
        output: Option<PathBuf>,
        #[command(flatten)]
        report: ReportArgs,
        /// The command and its arguments
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<OsString>,
    },
}

#[derive(Args)]
struct ReportArgs {
    /// Print JSON instead of text
    #[arg(long)]
    json: bool,
    /// Call sites (and failures) per list [default: 10; all in JSON]
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Frames to show per call site, starting at the site
    #[arg(long, value_name = "N", default_value_t = 1)]
    frames: usize,
    /// Only this device (-1: host memory)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    device: Option<i32>,
}

impl From<ReportArgs> for summary::Options {
    fn from(a: ReportArgs) -> Self {
        summary::Options {
            json: a.json,
            top: a.top,
            frames: a.frames.max(1),
            device: a.device,
        }
    }
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Cmd::Summary { report, traces } => {
            let opts = report.into();
            let result = summary::expand(&traces).and_then(|paths| {
                let mut out = io::stdout().lock();
                match summary::run(&paths, &opts, &mut out).and_then(|ok| out.flush().map(|_| ok)) {
                    // `gpumemtrace summary ... | head` is not an error.
                    Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(true),
                    r => r.map_err(|e| e.to_string()),
                }
            });
            match result {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("gpumemtrace: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Dump { trace } => {
            let mut out = io::stdout().lock();
            match report::dump::run(&trace, &mut out).and_then(|ok| out.flush().map(|_| ok)) {
                Ok(true) => ExitCode::SUCCESS,
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("gpumemtrace: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Run {
            output,
            report,
            command,
        } => {
            let result = run::find_lib().and_then(|lib| {
                let l = run::Launch {
                    lib,
                    output: output.unwrap_or_else(|| PathBuf::from(".")),
                    command,
                };
                run::launch(&l, &report.into(), &mut io::stderr().lock())
            });
            match result {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("gpumemtrace: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
