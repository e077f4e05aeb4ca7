//! The one dispatch from arguments to reports: each command loads its trace(s) once through
//! the model and writes one output.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::args::{Cmd, ExportFormat, Scope, Select};
use super::run;
use crate::error::{json_error, Error, Result};
use crate::read::input::{self, one_trace, only_trace, traces_of};
use crate::model::{Filter, Observer, Trace};
use crate::report::{check, diff, dump, export, flamegraph, phases, summary, timeline};
use crate::report::html;
use crate::symbolize::Symbolizer;
use crate::units::Printable;

/// Runs the command; returns the exit status (0: success, 1: a trace failed its budget or could
/// not be read, `run`: the command's own).
pub fn run(cmd: Cmd) -> Result<u8> {
    match cmd {
        Cmd::Summary { report, traces } => {
            let opts: summary::Options = report.into();
            let paths = input::expand(&traces)?;
            // Text reports through `Printable`: names from a trace never drive the terminal.
            let mut out = Printable::unless_json(opts.json, io::stdout().lock());
            let all_read = summary::run(&paths, &opts, &mut out)?;
            out.flush()?;
            Ok(if all_read { 0 } else { 1 })
        }
        Cmd::Dump { trace } => {
            let mut out = io::stdout().lock();
            let complete = dump::run(&trace, &mut out)?;
            out.flush()?;
            Ok(if complete { 0 } else { 1 })
        }
        Cmd::Run { output, aggregate, report, command } => {
            let opts: summary::Options = report.into();
            let lib = run::find_lib().map_err(|e| e.status(2))?;
            let l = run::Launch { lib, output: output.unwrap_or_else(|| PathBuf::from(".")), command, aggregate };
            // JSON is for a pipe (`run --json -- cmd | jq`), after the command's own output;
            // text goes to stderr, beside it.
            let code = if opts.json {
                run::launch(&l, &opts, &mut io::stdout().lock())
            } else {
                run::launch(&l, &opts, &mut Printable::new(io::stderr().lock()))
            };
            code.map_err(|e| e.status(2))
        }
        Cmd::Timeline { sel, output } => timeline_cmd(&sel, output.as_deref()).map(|_| 0),
        Cmd::Flamegraph { sel, of, level, folded, output } => {
            flamegraph_cmd(&sel, of, level, folded, output.as_deref()).map(|_| 0)
        }
        Cmd::Export { sel, format, of, level, output } => export_cmd(&sel, format, (of, level), output.as_deref()).map(|_| 0),
        Cmd::Phases { sel, json } => phases_cmd(&sel, json).map(|_| 0),
        Cmd::Live { trace, interval, report } => live_cmd(&trace, interval, report),
        Cmd::Tree { sel, of, min_percent, level, json } => tree_cmd(&sel, of, min_percent, level, json).map(|_| 0),
        Cmd::Report { sel, output, top } => report_cmd(&sel, output.as_deref(), top).map(|_| 0),
        Cmd::Check { traces, max_peak, max_leaked, max_failed, max_allocated, max_reserved, device, phase, pid, json, scope } => {
            let b = check::Budgets { max_peak, max_leaked, max_failed, max_allocated, max_reserved, device };
            check_cmd(&traces, &b, phase, pid, json, &scope)
        }
        Cmd::Diff { a, b, json, top, device, phase, scope } => diff_cmd(&a, &b, json, top, device, phase, &scope).map(|_| 0),
    }
}

fn filter(sel: &Select) -> Filter {
    sel.scope.filter(sel.device, sel.phase.clone())
}

fn load(path: &Path, f: &Filter, observe: &mut (dyn Observer + Send)) -> Result<Trace> {
    let t = crate::model::load(path, f, observe)?;
    let p = input::display(path);
    t.warn(path, "this report");
    if let Some(ph) = &f.phase {
        if !t.has_phase(ph) {
            eprintln!("warning: {p}: no phase named {ph:?} in this trace");
        }
    }
    if let Some(d) = f.device {
        if !t.alloc_devices.contains(&d) {
            eprintln!("warning: {p}: no allocation {} in this trace", on(d));
        }
    }
    if let Some(s) = scope_words(f).filter(|_| admitted_nothing(&t)) {
        eprintln!("warning: {p}: no allocation matches {s}");
    }
    Ok(t)
}

/// Reports that need the events in time order refuse an aggregate trace (exit status 2).
fn time_ordered(t: &Trace, what: &str) -> Result<()> {
    match t.aggregate {
        Some(_) => Err(Error::new(crate::model::aggregate::refusal(what)).status(2)),
        None => Ok(()),
    }
}

/// `--module`, `--from`, `--to` as given, when any is.
fn scope_words(f: &Filter) -> Option<String> {
    let mut v = Vec::new();
    if let Some(m) = &f.module {
        v.push(format!("--module {m:?}"));
    }
    if let Some(t) = f.from_ns {
        v.push(format!("--from {}", crate::units::seconds(t)));
    }
    if let Some(t) = f.to_ns {
        v.push(format!("--to {}", crate::units::seconds(t)));
    }
    (!v.is_empty()).then(|| v.join(" "))
}

/// No allocation call, successful or failed, passed the filter.
fn admitted_nothing(t: &Trace) -> bool {
    t.groups.values().all(|g| g.allocations == 0 && g.failed == 0)
}

/// `on device 0`, `of host memory (device -1)`.
fn on(device: i32) -> String {
    if device < 0 {
        format!("of host memory (device {device})")
    } else {
        format!("on device {device}")
    }
}

/// Writes to the file, or stdout when none.
fn output(path: Option<&Path>, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> Result<()> {
    match path {
        Some(p) => {
            let mut f = BufWriter::new(File::create(p).map_err(|e| format!("{}: {e}", p.display()))?);
            write(&mut f).and_then(|_| f.flush()).map_err(|e| Error::new(format!("{}: {e}", p.display())))
        }
        None => {
            let mut out = io::stdout().lock();
            Ok(write(&mut out).and_then(|_| out.flush())?)
        }
    }
}

fn timeline_cmd(sel: &Select, out: Option<&Path>) -> Result<()> {
    let html = picture_format(out, &["svg", "html", "htm"], "timeline")?.is_some_and(|e| e != "svg");
    let path = one_trace(&sel.trace, sel.pid)?;
    let mut reserved = timeline::Reserved::default();
    let t = load(&path, &filter(sel), &mut reserved)?;
    time_ordered(&t, "timeline")?;
    let pic = timeline::render(&t, sel.device, &reserved.series, html);
    let page = if html { timeline::page(&pic) } else { pic.svg };
    output(out, |w| w.write_all(page.as_bytes()))
}

/// The extension of a picture's output file when it is one of `allowed`; an error naming them
/// otherwise (`-o x.png` must not write SVG under a PNG name). A path without an extension
/// that is no regular file (`/dev/stdout`, a pipe) takes the first format.
fn picture_format(out: Option<&Path>, allowed: &[&str], what: &str) -> Result<Option<String>> {
    let Some(p) = out else { return Ok(None) };
    let ext = p.extension().map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext {
        Some(e) if allowed.contains(&e.as_str()) => Ok(Some(e)),
        None if std::fs::metadata(p).is_ok_and(|m| !m.is_file()) => Ok(Some(allowed[0].to_string())),
        _ => {
            let mut list: Vec<String> = allowed.iter().map(|a| format!(".{a}")).collect();
            let last = list.pop().unwrap_or_default();
            let list = if list.is_empty() { last } else { format!("{} or {last}", list.join(", ")) };
            let got = ext.map_or("a file without an extension".to_string(), |e| format!(".{e}"));
            let hint = if got == ".png" { "; for a PNG, open the .svg or .html in a browser and save a screenshot" } else { "" };
            Err(Error::new(format!("{}: {what} writes {list} only, not {got}{hint}", p.display())).status(2))
        }
    }
}

fn report_cmd(sel: &Select, out: Option<&Path>, top: usize) -> Result<()> {
    picture_format(out, &["html", "htm"], "report")?;
    let path = one_trace(&sel.trace, sel.pid)?;
    let mut reserved = timeline::Reserved::default();
    let t = load(&path, &filter(sel), &mut reserved)?;
    time_ordered(&t, "report (its timeline)")?;
    let shown = html::Shown { top, device: sel.device, phase: sel.phase.clone() };
    let page = html::render(&path, &t, &reserved.series, &shown);
    output(out, |w| w.write_all(page.as_bytes()))
}

fn flamegraph_cmd(sel: &Select, of: flamegraph::Of, level: flamegraph::Level, folded: bool, out: Option<&Path>) -> Result<()> {
    if !folded {
        picture_format(out, &["svg"], "flamegraph (without --folded)")?;
    }
    let path = one_trace(&sel.trace, sel.pid)?;
    let t = load(&path, &filter(sel), &mut ())?;
    let mut sym = Symbolizer::new();
    let mut sym = sym.for_trace(&t.modules);
    let stacks = flamegraph::weighted(&t, &mut sym, of, sel.device, level);
    let lines = flamegraph::folded(&stacks);
    if folded {
        return output(out, |w| lines.iter().try_for_each(|l| writeln!(w, "{l}")));
    }
    let exe = t.process.as_ref().map_or("?".into(), |p| p.exe.rsplit('/').next().unwrap_or("?").to_string());
    let what = match of {
        flamegraph::Of::Peak => "live at the peak",
        flamegraph::Of::Leaks => "leaked (live at the end)",
        flamegraph::Of::Allocated => "allocated",
    };
    let memory = if !t.pools.is_empty() && level == flamegraph::Level::Blocks {
        "Tensors (blocks of the caching allocator)"
    } else {
        "GPU memory"
    };
    let (title, subtitle) = flamegraph::titles(&stacks, memory, what, &exe, sel.phase.as_deref());
    output(out, |w| flamegraph::svg(&lines, &title, &subtitle, w))
}

fn export_cmd(
    sel: &Select,
    format: ExportFormat,
    (of, level): (flamegraph::Of, flamegraph::Level),
    out: Option<&Path>,
) -> Result<()> {
    let path = one_trace(&sel.trace, sel.pid)?;
    let f = filter(sel);
    match format {
        ExportFormat::Memviz => {
            let mut c = export::memviz::Collector::new(sel.device);
            let t = load(&path, &f, &mut c)?;
            time_ordered(&t, "export --format memviz")?;
            let mut sym = Symbolizer::new();
            let mut sym = sym.for_trace(&t.modules);
            let snap = c.finish(&t, &mut sym);
            let mut buf = Vec::new();
            export::memviz::write(&snap, &mut buf)?;
            output(out, |w| w.write_all(&buf))
        }
        ExportFormat::Perfetto => {
            let mut pools = export::perfetto::PoolCounters::default();
            let t = load(&path, &f, &mut pools)?;
            time_ordered(&t, "export --format perfetto")?;
            let mut sym = Symbolizer::new();
            let mut sym = sym.for_trace(&t.modules);
            output(out, |w| export::perfetto::write(&t, sel.device, &pools, &mut sym, w))
        }
        ExportFormat::Speedscope => {
            let t = load(&path, &f, &mut ())?;
            let mut sym = Symbolizer::new();
            let mut sym = sym.for_trace(&t.modules);
            let stacks = flamegraph::weighted(&t, &mut sym, of, sel.device, level);
            let name = format!("gpumemtrace {}", path.file_name().unwrap_or_default().to_string_lossy());
            let v = export::speedscope::render(&stacks, of, &name);
            output(out, |w| serde_json::to_writer(&mut *w, &v).map_err(json_error))
        }
    }
}

fn live_cmd(trace: &Path, interval: u64, report: super::args::ReportArgs) -> Result<u8> {
    let opts: summary::Options = report.into();
    let interval = std::time::Duration::from_nanos(interval.max(1_000_000));
    let mut out = io::stdout().lock();
    let read = if opts.json {
        crate::report::live::run(trace, interval, &opts, &mut io::stderr(), false, &mut out)
    } else {
        let tty = crate::report::live::on_terminal();
        let mut view = io::stdout();
        crate::report::live::run(trace, interval, &opts, &mut view, tty, &mut out)
    };
    let read = read?;
    out.flush()?;
    Ok(if read { 0 } else { 1 })
}

fn tree_cmd(sel: &Select, of: crate::report::tree::Of, min_percent: f64, level: flamegraph::Level, json: bool) -> Result<()> {
    if !(0.0..=100.0).contains(&min_percent) {
        return Err(Error::new(format!("--min-percent {min_percent}: want a share from 0 to 100")).status(2));
    }
    let path = one_trace(&sel.trace, sel.pid)?;
    let t = load(&path, &filter(sel), &mut ())?;
    let mut sym = Symbolizer::new();
    let mut sym = sym.for_trace(&t.modules);
    let tree = crate::report::tree::tree(&t, &mut sym, of, sel.device, level, min_percent);
    if json {
        return output(None, |w| serde_json::to_writer_pretty(&mut *w, &tree).map_err(json_error).and_then(|_| writeln!(w)));
    }
    output(None, |w| crate::report::tree::render(&tree, w))
}

fn phases_cmd(sel: &Select, json: bool) -> Result<()> {
    let path = one_trace(&sel.trace, sel.pid)?;
    let t = load(&path, &filter(sel), &mut ())?;
    output(None, |w| phases::render(&t, json, &mut Printable::unless_json(json, w)))
}

fn check_cmd(paths: &[PathBuf], b: &check::Budgets, phase: Option<String>, pid: Option<u32>, json: bool, scope: &Scope) -> Result<u8> {
    if !b.any() {
        let e = "no budget given (--max-peak, --max-leaked, --max-failed, --max-allocated, --max-reserved)";
        return Err(Error::new(e).of("check").status(2));
    }
    let files = traces_of(paths, pid).map_err(|e| Error::new(e).status(2))?;
    let f = scope.filter(b.device, phase.clone());
    let mut traces = Vec::new();
    for p in &files {
        let t = crate::model::load(p, &f, &mut ()).map_err(|e| e.of("check").status(2))?;
        // Damaged records are not a trace a gate may pass (the figures before the damage are a
        // part of the run, and a frame whose checksum failed was left out): not judged.
        if let Some(why) = t.damage("the check").first() {
            let e = format!("{}: {why}: its budgets cannot be judged", input::display(p));
            return Err(Error::new(e).of("check").status(2));
        }
        t.warn(p, "the check");
        traces.push((p, t));
    }
    // Budgets that cannot be judged first (their reason is the more specific one).
    let mut results = Vec::new();
    for (p, t) in &traces {
        let p = input::display(p);
        let r = check::check(&p, t, b).map_err(|e| Error::new(format!("{p}: {e}")).of("check").status(2))?;
        results.push(r);
    }
    // A filter that matches nothing would pass every budget and gate nothing.
    let place = if traces.len() == 1 { "the trace".to_string() } else { format!("any of the {} traces", traces.len()) };
    if let Some(ph) = &phase {
        if !traces.iter().any(|(_, t)| t.has_phase(ph)) {
            let mut names: Vec<&str> = traces.iter().flat_map(|(_, t)| t.phase_names.iter().map(String::as_str)).collect();
            names.sort_unstable();
            names.dedup();
            let known = if names.is_empty() {
                "it has no phases".to_string()
            } else {
                let mut v: Vec<String> = names.iter().take(12).map(|n| format!("{n:?}")).collect();
                if names.len() > 12 {
                    v.push(format!("and {} more", names.len() - 12));
                }
                format!("phases: {}", v.join(", "))
            };
            let e = format!("--phase {ph:?} matches nothing: no phase of that name in {place} ({known})");
            return Err(Error::new(e).of("check").status(2));
        }
    }
    if let Some(d) = b.device {
        if !traces.iter().any(|(_, t)| t.alloc_devices.contains(&d)) {
            let mut devs: Vec<i32> = traces.iter().flat_map(|(_, t)| t.alloc_devices.iter().copied()).collect();
            devs.sort_unstable_by_key(|&d| (d < 0, d));
            devs.dedup();
            let known = if devs.is_empty() {
                "it has no allocations".to_string()
            } else {
                format!("allocations: {}", devs.iter().map(|&d| crate::units::place(d)).collect::<Vec<_>>().join(", "))
            };
            let e = format!("--device {d} matches nothing: no allocation {} in {place} ({known})", on(d));
            return Err(Error::new(e).of("check").status(2));
        }
    }
    if let Some(s) = scope_words(&f).filter(|_| traces.iter().all(|(_, t)| admitted_nothing(t))) {
        let e = format!("{s} matches nothing: no allocation in {place} passes it");
        return Err(Error::new(e).of("check").status(2));
    }
    let mut out = io::stdout().lock();
    let _ = check::render(&results, json, &mut out).and_then(|_| out.flush());
    Ok(if results.iter().all(|r| r.ok) { 0 } else { 1 })
}

fn diff_cmd(a: &Path, b: &Path, json: bool, top: Option<usize>, device: Option<i32>, phase: Option<String>, scope: &Scope) -> Result<()> {
    let f = scope.filter(device, phase);
    let pa = only_trace(a)?;
    let pb = only_trace(b)?;
    let ta = load(&pa, &f, &mut ())?;
    let tb = load(&pb, &f, &mut ())?;
    let mut d = diff::diff(&input::display(&pa), &ta, &input::display(&pb), &tb, device);
    output(None, |w| diff::render(&mut d, top, json, &mut Printable::unless_json(json, w)))
}
