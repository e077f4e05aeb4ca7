//! `gpumemtrace`'s command line as a library: the executable (`main.rs`) calls [`main`], and the
//! fuzz targets (`fuzz/fuzz_targets/`) call [`fuzz::summary`] and [`fuzz::reports`]. The modules
//! stay private: nothing else is an API.

mod cli;
mod error;
mod model;
mod read;
mod report;
mod symbolize;
mod units;

use std::process::ExitCode;

use clap::Parser;

/// Parses the command line and runs the command.
pub fn main() -> ExitCode {
    let cli = cli::args::Cli::parse();
    match cli::dispatch::run(cli.command) {
        Ok(status) => ExitCode::from(status),
        Err(e) => ExitCode::from(e.report()),
    }
}

#[doc(hidden)]
pub mod fuzz {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use clap::Parser;

    use crate::read::input::Input;
    use crate::report::summary;
    use crate::symbolize::Symbolizer;

    /// What `gpumemtrace summary` and `summary --json` do with a trace's bytes (the model, its
    /// observers, the report built from them, and the merged view of ranks), written nowhere;
    /// native frames are not looked up in object files.
    pub fn summary(bytes: &[u8]) {
        Symbolizer::all_offline();
        let input = [Input::Memory { path: "fuzz.trace".into(), bytes: bytes.to_vec() }];
        for json in [false, true] {
            let opts = summary::Options { json, ..Default::default() };
            let _ = summary::summarize(&input, json, &opts, &mut std::io::sink());
        }
    }

    /// Every report but the summary of a trace's bytes, each through the command line's own
    /// parsing and dispatch, from a file in a directory of this process's own; pictures and
    /// exports are written there, the others to standard output. Native frames are not looked up.
    pub fn reports(bytes: &[u8]) {
        static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
        let Some(dir) = DIR.get_or_init(|| {
            let d = std::env::temp_dir().join(format!("gpumemtrace-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&d).ok().map(|_| d)
        }) else {
            return;
        };
        Symbolizer::all_offline();
        let trace = dir.join("input.trace");
        if std::fs::write(&trace, bytes).is_err() {
            return;
        }
        let (t, o) = (trace.to_str().unwrap_or_default(), |name: &str| dir.join(name).display().to_string());
        let commands: [Vec<String>; 11] = [
            vec!["timeline".into(), t.into(), "-o".into(), o("t.svg")],
            vec!["report".into(), t.into(), "-o".into(), o("r.html")],
            vec!["flamegraph".into(), t.into(), "-o".into(), o("f.svg")],
            vec!["flamegraph".into(), "--of".into(), "allocated".into(), "--level".into(), "segments".into(), t.into(), "-o".into(), o("f.svg")],
            vec!["export".into(), "--format".into(), "memviz".into(), t.into(), "-o".into(), o("m.pickle")],
            vec!["export".into(), "--format".into(), "perfetto".into(), t.into(), "-o".into(), o("p.json")],
            vec!["export".into(), "--format".into(), "speedscope".into(), "--of".into(), "leaks".into(), t.into(), "-o".into(), o("s.json")],
            vec!["tree".into(), "--json".into(), t.into()],
            vec!["diff".into(), "--json".into(), t.into(), t.into()],
            vec!["phases".into(), "--json".into(), t.into()],
            vec!["check".into(), "--max-peak".into(), "1".into(), "--max-reserved".into(), "1".into(), t.into()],
        ];
        for args in commands {
            let cli = crate::cli::args::Cli::try_parse_from(std::iter::once("gpumemtrace".to_owned()).chain(args))
                .expect("the fuzz target's commands parse");
            let _ = crate::cli::dispatch::run(cli.command);
        }
    }
}

// The rules of docs/architecture.md (layers, no cycle, file sizes) are checked by
// tests/architecture.rs at the workspace root.
