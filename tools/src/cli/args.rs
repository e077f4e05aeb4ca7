//! The command line: commands, their arguments and help texts (clap).

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::report::{self, summary};

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
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
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
    /// Picture of live GPU memory over time (SVG, or interactive HTML)
    ///
    /// One panel per device and memory kind: live bytes over time (downsampled to min/max
    /// per pixel bucket, so huge traces stay small), the peak marked with its value, failed
    /// allocations marked in red, phases (gpumemtrace_push/mark, NVTX ranges) shaded.
    /// The .html page is self-contained: hover for values, wheel to zoom, drag to pan.
    #[command(after_help = "\
Examples:
  gpumemtrace timeline app.trace -o mem.svg
  gpumemtrace timeline app.trace -o mem.html        interactive, no network needed
  gpumemtrace timeline traces/ --pid 1234 --device 0 -o gpu0.svg
  gpumemtrace timeline app.trace --phase backward -o backward.svg")]
    Timeline {
        #[command(flatten)]
        sel: Select,
        /// Output file: .svg or .html (no other format) [default: SVG on stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// One self-contained HTML report: timeline, flame graph of the peak, top sites, leaks, failures
    #[command(after_help = "\
Examples:
  gpumemtrace report app.trace -o report.html      open it in a browser; no network needed
  gpumemtrace report traces/ --pid 1234 --device 0 -o gpu0.html")]
    Report {
        #[command(flatten)]
        sel: Select,
        /// Output file: .html [default: stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Call sites per list
        #[arg(long, value_name = "N", default_value_t = 10)]
        top: usize,
    },
    /// Flame graph of bytes by call stack (inferno), or folded stacks
    #[command(after_help = "\
Examples:
  gpumemtrace flamegraph app.trace --of peak -o peak.svg       who held memory at the peak
  gpumemtrace flamegraph app.trace --of leaks -o leaks.svg     what was never freed
  gpumemtrace flamegraph app.trace --of allocated --folded > alloc.folded
      folded stacks (frame;frame;frame bytes) for flamegraph.pl, speedscope, inferno...
  gpumemtrace flamegraph train.trace --of peak --level segments -o reserved.svg
      under PyTorch: what its caching allocator reserved from the driver, not the tensors")]
    Flamegraph {
        #[command(flatten)]
        sel: Select,
        /// Which bytes: live at each peak, leaked at the end, or everything allocated
        #[arg(long, value_enum, default_value = "peak")]
        of: report::flamegraph::Of,
        /// On devices with PyTorch blocks: the blocks (tensors), or what the driver handed out
        #[arg(long, value_enum, default_value = "blocks")]
        level: report::flamegraph::Level,
        /// Print folded stacks instead of an SVG
        #[arg(long)]
        folded: bool,
        /// Output file [default: stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Follow the trace of a running process: live bytes, peaks and top sites, refreshed
    ///
    /// Redrawn in place on a terminal, one line per refresh otherwise (--json: on stderr). When
    /// the process finishes its trace (or is gone), prints the summary, as `summary` does.
    #[command(after_help = "\
Examples:
  GPUMEMTRACE_OUTPUT=/tmp/app.trace LD_PRELOAD=.../libgpumemtrace.so ./app &
  gpumemtrace live /tmp/app.trace
  gpumemtrace live --interval 250ms --top 5 /tmp/app.trace")]
    Live {
        /// The trace file the process writes
        #[arg(value_name = "TRACE")]
        trace: PathBuf,
        /// Time between refreshes (1s, 250ms)
        #[arg(long, value_name = "TIME", default_value = "1s", value_parser = crate::read::filter::parse_time)]
        interval: u64,
        #[command(flatten)]
        report: ReportArgs,
    },
    /// Call tree of bytes: from the outermost frame down to each call site, with bytes and counts
    #[command(after_help = "\
Examples:
  gpumemtrace tree app.trace                      who held the peak, top-down
  gpumemtrace tree app.trace --of end             what was never freed
  gpumemtrace tree app.trace --of total --min-percent 5 --json")]
    Tree {
        #[command(flatten)]
        sel: Select,
        /// Which bytes: live at each group's peak, live at the end (leaks), or all allocated
        #[arg(long, value_enum, default_value = "peak")]
        of: report::tree::Of,
        /// Leave out nodes holding less than this share of their group, in percent
        #[arg(long, value_name = "PERCENT", default_value_t = 1.0)]
        min_percent: f64,
        /// On devices with PyTorch blocks: the blocks (tensors), or what the driver handed out
        #[arg(long, value_enum, default_value = "blocks")]
        level: report::flamegraph::Level,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Export to PyTorch memory_viz (pickle), Perfetto/Chrome (JSON) or speedscope (JSON)
    #[command(after_help = "\
Examples:
  gpumemtrace export app.trace --format memviz -o snapshot.pickle
      drag into https://pytorch.org/memory_viz (Active Memory Timeline, Allocator State History)
  gpumemtrace export app.trace --format perfetto -o app.json      open in ui.perfetto.dev
  gpumemtrace export app.trace --format speedscope --of leaks -o leaks.speedscope.json")]
    Export {
        #[command(flatten)]
        sel: Select,
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// For speedscope: which bytes the profiles weigh
        #[arg(long, value_enum, default_value = "peak")]
        of: report::flamegraph::Of,
        /// For speedscope, on devices with PyTorch blocks: the blocks (tensors), or the driver level
        #[arg(long, value_enum, default_value = "blocks")]
        level: report::flamegraph::Level,
        /// Output file [default: stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// CI gate: exit 1 when a trace exceeds a memory budget
    ///
    /// Exit status: 0 within every budget, 1 when one is exceeded (each reason printed),
    /// 2 when a trace cannot be read or a budget cannot be judged (--max-allocated on a trace
    /// without PyTorch blocks). Sizes take KiB/MiB/GiB (binary) or KB/MB/GB.
    #[command(after_help = "\
Examples:
  gpumemtrace check app.trace --max-peak 10GiB --max-leaked 0
  gpumemtrace check traces/ --device 0 --max-peak 70GiB --max-failed 0 --json
  gpumemtrace check train.trace --max-allocated 40GiB --max-reserved 48GiB   tensors, and PyTorch's cache")]
    Check {
        /// Trace files, or directories of *.trace files
        #[arg(required = true, value_name = "TRACE")]
        traces: Vec<PathBuf>,
        /// Largest allowed peak of GPU memory per device
        #[arg(long, value_name = "SIZE", value_parser = report::check::parse_size)]
        max_peak: Option<u64>,
        /// Largest allowed memory still live at the end (device, managed, pinned, VMM physical)
        #[arg(long, value_name = "SIZE", value_parser = report::check::parse_size)]
        max_leaked: Option<u64>,
        /// Most failed allocations allowed
        #[arg(long, value_name = "N")]
        max_failed: Option<u64>,
        /// Largest allowed peak of live blocks (tensors) of PyTorch's caching allocator per device
        #[arg(long, value_name = "SIZE", value_parser = report::check::parse_size)]
        max_allocated: Option<u64>,
        /// Largest allowed peak of what the caching allocator reserved from the driver per device
        #[arg(long, value_name = "SIZE", value_parser = report::check::parse_size)]
        max_reserved: Option<u64>,
        /// Only this device (-1: host memory)
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        device: Option<i32>,
        /// Only allocations made in this phase
        #[arg(long, value_name = "NAME")]
        phase: Option<String>,
        /// Only traces of this process id
        #[arg(long, value_name = "PID")]
        pid: Option<u32>,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        scope: Scope,
    },
    /// What changed between two runs: peaks, leaks, bytes per call site
    ///
    /// A and B are trace files, or directories holding one trace each.
    #[command(after_help = "\
Examples:
  gpumemtrace diff before.trace after.trace
  gpumemtrace diff --device 0 --top 20 old/ new/        (directories of one trace each)
  gpumemtrace diff a.trace b.trace --json | jq '.allocated[0]'")]
    Diff {
        #[arg(value_name = "A")]
        a: PathBuf,
        #[arg(value_name = "B")]
        b: PathBuf,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
        /// Sites per list [default: 10]
        #[arg(long, value_name = "N")]
        top: Option<usize>,
        /// Only this device (-1: host memory)
        #[arg(long, value_name = "N", allow_negative_numbers = true)]
        device: Option<i32>,
        /// Only allocations made in this phase
        #[arg(long, value_name = "NAME")]
        phase: Option<String>,
        #[command(flatten)]
        scope: Scope,
    },
    /// Allocations per phase (gpumemtrace_push/mark, NVTX ranges) and memory group
    #[command(after_help = "\
Examples:
  gpumemtrace phases app.trace
  gpumemtrace phases --json app.trace")]
    Phases {
        #[command(flatten)]
        sel: Select,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// Print every record of a trace as JSON lines (for scripts)
    #[command(after_help = "\
Example:
  gpumemtrace dump app.trace | grep '\"event\"' | head")]
    Dump {
        #[arg(value_name = "TRACE")]
        trace: PathBuf,
    },
    /// Run a command with the tracer preloaded, then summarize its traces on stderr (--json: stdout)
    #[command(after_help = "\
The tracer, libgpumemtrace.so, is looked for next to this executable, then in
../lib/gpumemtrace/ (pip's layout), else the copy built into this executable (cargo install)
is used from ~/.cache/gpumemtrace/; set GPUMEMTRACE_LIB to use another. Each traced process writes DIR/gpumemtrace-<pid>.trace. The exit code is
the command's (128+N when it was killed by signal N).

Examples:
  gpumemtrace run -- python3 train.py
  gpumemtrace run --output /tmp/traces --frames 3 -- ./app --size 4096
  gpumemtrace run --aggregate -- python3 train.py   (a day-long run: a trace of megabytes)")]
    Run {
        /// Directory for the traces [default: the current directory]
        #[arg(short, long, value_name = "DIR")]
        output: Option<PathBuf>,
        /// Aggregate mode (GPUMEMTRACE_AGGREGATE=1): the traces hold per-site totals, peaks
        /// and the live set, not every event; timeline, report and the memviz and perfetto
        /// exports cannot read them
        #[arg(long)]
        aggregate: bool,
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

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    /// PyTorch memory snapshot pickle (memory_viz)
    Memviz,
    /// Chrome / Perfetto trace-event JSON
    Perfetto,
    /// speedscope JSON
    Speedscope,
}

/// Picking one trace and the events that count, shared by the picture and export commands.
#[derive(Args)]
pub struct Select {
    /// A trace file, or a directory of *.trace files (with --pid when it holds several)
    #[arg(value_name = "TRACE")]
    pub trace: PathBuf,
    /// The trace of this process id (in a directory)
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// Only this device (-1: host memory)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub device: Option<i32>,
    /// Only allocations made in this phase (and their frees)
    #[arg(long, value_name = "NAME")]
    pub phase: Option<String>,
    #[command(flatten)]
    pub scope: Scope,
}

/// `--module`, `--from`, `--to`: the filters every report that reads a trace takes.
#[derive(Args, Clone, Default)]
pub struct Scope {
    /// Only allocations whose stack has a frame in a module (shared object, executable or
    /// Python file) whose file name contains NAME
    #[arg(long, value_name = "NAME")]
    pub module: Option<String>,
    /// Only allocations made at or after this time since tracing started (1.5s, 300ms)
    #[arg(long, value_name = "TIME", value_parser = crate::read::filter::parse_time)]
    pub from: Option<u64>,
    /// Only allocations made before this time since tracing started
    #[arg(long, value_name = "TIME", value_parser = crate::read::filter::parse_time)]
    pub to: Option<u64>,
}

impl Scope {
    /// The filter of these options and `device`, `phase`.
    pub fn filter(&self, device: Option<i32>, phase: Option<String>) -> crate::read::filter::Filter {
        crate::read::filter::Filter { device, phase, module: self.module.clone(), from_ns: self.from, to_ns: self.to }
    }
}

#[derive(Args)]
pub struct ReportArgs {
    /// Print JSON instead of text
    #[arg(long)]
    pub json: bool,
    /// Call sites (and failures) per list [default: 10; all in JSON]
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Frames to show per call site, starting at the site
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub frames: usize,
    /// Only this device (-1: host memory)
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub device: Option<i32>,
    /// Only allocations made in this phase (NVTX range or gpumemtrace_push/mark name)
    #[arg(long, value_name = "NAME")]
    pub phase: Option<String>,
    #[command(flatten)]
    pub scope: Scope,
    /// Temporary allocations: freed by the thread that made them with at most N of its other
    /// allocations in between (memray's --temporary-allocation-threshold)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub temporary_threshold: usize,
}

impl From<ReportArgs> for summary::Options {
    fn from(a: ReportArgs) -> Self {
        summary::Options {
            json: a.json,
            top: a.top,
            frames: a.frames.max(1),
            filter: a.scope.filter(a.device, a.phase.clone()),
            temporary_threshold: a.temporary_threshold,
            device: a.device,
            phase: a.phase,
        }
    }
}
