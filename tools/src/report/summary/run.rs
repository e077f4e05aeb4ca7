//! `summary` over several traces: each summarized, then the processes together.

use std::io::{self, Write};
use std::path::PathBuf;

use serde::Serialize;

use crate::read::input::Input;
use crate::symbolize::Symbolizer;

use super::build::build;
use super::render::render;
use super::report::*;

// The JSON schema (a contract with the integration tests). Fields marked `skip` are only
// for the terminal.

#[derive(Serialize)]
pub(super) struct Json<'a> {
    pub(super) traces: &'a [TraceReport],
    /// With several traces: the processes together (see `merged`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) merged: Option<crate::report::merged::Merged>,
}

/// Summarizes `paths` (trace files) to `out`. Unreadable files are reported on stderr and
/// skipped; returns false when there was one, or a corrupt one (summarized up to the damage,
/// with a warning: the exit status says so too).
pub fn run(paths: &[PathBuf], opts: &Options, out: &mut dyn Write) -> io::Result<bool> {
    let mut all_read = true;
    // Each input is opened once: a pipe (`-`, /dev/stdin) is read into memory then, and both
    // the per-trace replay and the merged one read it from there.
    let mut inputs = Vec::new();
    for path in paths {
        match Input::open(path) {
            Ok(input) => inputs.push(input),
            Err(e) => {
                eprintln!("gpumemtrace: {e}");
                all_read = false;
            }
        }
    }
    Ok(summarize(&inputs, paths.len() > 1, opts, out)? && all_read)
}

/// The summary of inputs already opened (`merge`: and of their processes together); returns
/// false when one could not be read, or only up to damaged bytes.
pub fn summarize(inputs: &[Input], merge: bool, opts: &Options, out: &mut dyn Write) -> io::Result<bool> {
    let mut sym = Symbolizer::new();
    let mut reports = Vec::new();
    let mut all_read = true;
    let filter = crate::model::Filter { device: None, phase: opts.phase.clone(), ..opts.filter.clone() };
    for input in inputs {
        let mut temporary = crate::model::temporary::Temporary::new(opts.temporary_threshold);
        match crate::model::load_input(input, &filter, &mut temporary) {
            Ok(trace) => {
                trace.warn(input.path(), "the summary");
                all_read &= !trace.is_damaged();
                let mut r = build(input.path(), &trace, &mut sym, opts);
                let top = if opts.json { opts.top } else { Some(opts.top.unwrap_or(DEFAULT_TOP)) };
                let wanted = |d: i32| opts.device.is_none_or(|w| w == d);
                r.temporary = super::temporary::build(
                    &trace,
                    temporary.finish(),
                    opts.temporary_threshold,
                    &mut sym,
                    (&wanted, top, opts.frames),
                );
                reports.push(r);
            }
            Err(e) => {
                eprintln!("gpumemtrace: {e}");
                all_read = false;
            }
        }
    }
    let merged = merge.then(|| crate::report::merged::merge(inputs));
    if opts.json {
        serde_json::to_writer_pretty(&mut *out, &Json { traces: &reports, merged })?;
        writeln!(out)?;
    } else {
        for (i, r) in reports.iter().enumerate() {
            if i > 0 {
                writeln!(out)?;
            }
            render(r, opts, out)?;
        }
        if let Some(m) = &merged {
            writeln!(out)?;
            crate::report::merged::render(m, out)?;
        }
    }
    Ok(all_read)
}

