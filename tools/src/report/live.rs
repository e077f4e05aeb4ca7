//! `gpumemtrace live`: follows the trace of a process still running. Every interval it reads
//! the trace as it is (completed by the journal beside it, as every reader does) and shows the
//! live bytes per device, the peaks so far and the top live sites: redrawn in place on a
//! terminal, one line per refresh otherwise. When the trace is complete (the final Stats
//! record) or its process is gone, it prints the trace's summary, as `summary` would.

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::model::{Filter, Trace};
use crate::read::input::{display, Input};
use crate::report::sites::sites;
use crate::report::summary;
use crate::symbolize::Symbolizer;
use crate::units::{count, place, seconds, size};

/// How long to wait for a trace that does not exist yet, or has no readable record yet.
const WAIT_FOR_START: Duration = Duration::from_secs(30);
/// Top live sites a refresh shows.
const TOP: usize = 5;

/// What the last look at the trace found.
enum Look {
    /// Not readable yet (no file, or not a record in it yet), and why.
    NotYet(String),
    Trace(Box<Trace>),
}

/// Follows `path` until its trace is complete or its process is gone, refreshing every
/// `interval` to `view` (`tty`: redraw in place), then writes the summary (`opts`) to `out`.
/// Returns whether the final trace was read (as `summary::run`).
pub fn run(
    path: &Path,
    interval: Duration,
    opts: &summary::Options,
    view: &mut dyn Write,
    tty: bool,
    out: &mut dyn Write,
) -> crate::error::Result<bool> {
    let filter = Filter {
        device: None,
        phase: opts.phase.clone(),
        ..opts.filter.clone()
    };
    let mut sym = Symbolizer::new();
    let started = Instant::now();
    loop {
        let look = look(path, &filter);
        let done = match &look {
            Look::NotYet(why) => {
                if started.elapsed() > WAIT_FOR_START {
                    let e = format!(
                        "{}: {why}, after waiting {} s",
                        display(path),
                        WAIT_FOR_START.as_secs()
                    );
                    return Err(crate::error::Error::new(e).of("live").status(2));
                }
                write_waiting(path, why, view, tty).and_then(|_| view.flush())?;
                false
            }
            Look::Trace(t) => {
                let done = finished(t);
                let text = if tty {
                    screen(path, t, &mut sym, opts.device, done)
                } else {
                    line(t, &mut sym, opts.device, done)
                };
                let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
                write!(view, "{clear}{text}").and_then(|_| view.flush())?;
                done
            }
        };
        if done {
            break;
        }
        std::thread::sleep(interval);
    }
    // The process deletes the journal once the trace is complete: wait for that (briefly), so
    // the summary reads the trace alone, as a later `summary` will.
    let journal = gpumemtrace_format::journal::path_for(path);
    let until = Instant::now() + Duration::from_secs(2);
    while journal.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    if tty {
        writeln!(view)?;
    }
    Ok(summary::run(&[PathBuf::from(path)], opts, out)?)
}

fn look(path: &Path, filter: &Filter) -> Look {
    // Until the first records are written, the journal beside the trace may be half made too:
    // do not read either.
    match std::fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Look::NotYet("not created yet".into())
        }
        Ok(m) if m.is_file() && m.len() <= gpumemtrace_format::HEADER_LEN as u64 => {
            return Look::NotYet("no record written yet".into())
        }
        _ => {}
    }
    // The journal is read before the trace: if the writer wrote to the trace meanwhile, the
    // journal's marks are older than the trace read, and what it completes the trace with would
    // count some events twice. Then both are read again; a writer that keeps writing through
    // three reads leaves the trace alone shown (what it has written, none of it twice), to be
    // completed at a later refresh.
    for _ in 0..3 {
        let (look, stale) = look_once(path, filter, true);
        if !stale {
            return look;
        }
    }
    look_once(path, filter, false).0
}

/// The trace read once (completed by the journal beside it if `with_journal`), and whether the
/// writer wrote to the trace after the journal was read.
fn look_once(path: &Path, filter: &Filter, with_journal: bool) -> (Look, bool) {
    let not_yet = |e: String| Look::NotYet(e.split_once(": ").map_or(e.clone(), |(_, why)| why.to_string()));
    let input = match Input::open(path) {
        Ok(Input::File { path, len, .. }) if !with_journal => Input::File { path, len, recovery: None },
        Ok(i) => i,
        Err(e) => return (not_yet(e.to_string()), false),
    };
    match crate::model::load_input(&input, filter, &mut ()) {
        Ok(t) => {
            let stale = matches!(&input, Input::File { recovery: Some(j), .. } if !j.still_current());
            (Look::Trace(Box::new(t)), stale)
        }
        Err(e) => (not_yet(e.to_string()), false),
    }
}

/// The trace is complete (its process wrote the final Stats record), or its process is gone.
fn finished(t: &Trace) -> bool {
    if t.stats.is_some_and(|s| s.final_) {
        return true;
    }
    match t.process.as_ref() {
        Some(p) if p.pid != 0 => !running(p.pid),
        _ => false,
    }
}

/// Whether process `pid` runs (exists and is not a zombie).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last parenthesis (comm may hold any).
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
        Err(_) => false,
    }
}

fn write_waiting(path: &Path, why: &str, view: &mut dyn Write, tty: bool) -> io::Result<()> {
    if tty {
        write!(
            view,
            "\x1b[H\x1b[2Jlive: {}: waiting for the trace ({why})\n",
            display(path)
        )
    } else {
        writeln!(view, "[live] waiting for {} ({why})", display(path))
    }
}

/// Allocations (successful allocation calls) the trace holds so far.
fn allocations(t: &Trace) -> u64 {
    t.groups.values().map(|g| g.allocations).sum()
}

/// Per device with GPU memory, and host memory: live bytes now, peak so far.
fn places(t: &Trace, device: Option<i32>) -> Vec<(String, u64, u64, u64)> {
    let mut v: Vec<(String, u64, u64, u64)> = t
        .devices
        .iter()
        .filter(|(d, _)| device.is_none_or(|w| w == **d))
        .map(|(d, total)| {
            (
                place(*d),
                total.live_bytes,
                total.peak_bytes,
                total.peak_time_ns,
            )
        })
        .collect();
    for (k, g) in &t.groups {
        if k.device < 0
            && k.kind == gpumemtrace_format::MemKind::HostPinned
            && device.is_none_or(|w| w == k.device)
        {
            v.push((place(k.device), g.live_bytes, g.peak_bytes, g.peak_time_ns));
        }
    }
    v
}

/// Live sites now, largest first, over the GPU memory and host memory groups.
fn top_sites(
    t: &Trace,
    sym: &mut Symbolizer,
    device: Option<i32>,
) -> Vec<crate::report::sites::Site> {
    let mut sym = sym.for_trace(&t.modules);
    let uses: Vec<crate::model::StackUse> = t
        .groups
        .iter()
        .filter(|(k, _)| device.is_none_or(|w| w == k.device))
        .filter(|(k, _)| k.kind.occupies_gpu() || k.kind == gpumemtrace_format::MemKind::HostPinned)
        .flat_map(|(_, g)| g.leak_stacks.iter().copied())
        .collect();
    let mut v = sites(&uses, t, &mut sym);
    v.truncate(TOP);
    v
}

/// One refresh as one line (no terminal).
fn line(t: &Trace, sym: &mut Symbolizer, device: Option<i32>, done: bool) -> String {
    let mut s = format!(
        "[live] {}, {}, {}",
        seconds(t.end_ns),
        count(t.events, "event"),
        count(allocations(t), "allocation")
    );
    for (p, live, peak, _) in places(t, device) {
        s.push_str(&format!("; {p}: {} live, peak {}", size(live), size(peak)));
    }
    let top = top_sites(t, sym, device);
    if let Some(first) = top.first() {
        s.push_str(&format!(
            "; top: {} {}",
            size(first.bytes),
            first.site.describe()
        ));
    }
    if done {
        s.push_str("; finished");
    }
    s.push('\n');
    s
}

/// One refresh as a screen (a terminal).
fn screen(path: &Path, t: &Trace, sym: &mut Symbolizer, device: Option<i32>, done: bool) -> String {
    let pid = t.process.as_ref().map_or(0, |p| p.pid);
    let state = if done { "finished" } else { "running" };
    let mut s = format!(
        "live: {} (pid {pid}, {state}) at {}: {}, {}\n",
        display(path),
        seconds(t.end_ns),
        count(t.events, "event"),
        count(allocations(t), "allocation")
    );
    for (p, live, peak, at) in places(t, device) {
        s.push_str(&format!(
            "  {p}: {} live, peak {} at {}\n",
            size(live),
            size(peak),
            seconds(at)
        ));
    }
    let top = top_sites(t, sym, device);
    if !top.is_empty() {
        s.push_str("  top live sites:\n");
        for site in top {
            s.push_str(&format!(
                "  {:>10} {:>5}x  {}\n",
                size(site.bytes),
                site.count,
                site.site.describe()
            ));
        }
    }
    s
}

/// Whether refreshes are drawn in place.
pub fn on_terminal() -> bool {
    io::stdout().is_terminal()
}
