//! `gpumemtrace`'s command line as a library: the executable (`main.rs`) calls [`main`], and the
//! fuzz target (`fuzz/fuzz_targets/read_trace.rs`) calls [`fuzz::summary`]. The modules stay
//! private: nothing else is an API.

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
    use crate::read::input::Input;
    use crate::report::summary;

    /// What `gpumemtrace summary` and `summary --json` do with a trace's bytes (the model, its
    /// observers, the report built from them, and the merged view of ranks), written nowhere;
    /// native frames are not looked up in object files.
    pub fn summary(bytes: &[u8]) {
        let input = [Input::Memory { path: "fuzz.trace".into(), bytes: bytes.to_vec() }];
        for json in [false, true] {
            let opts = summary::Options { json, ..Default::default() };
            let mut sym = crate::symbolize::Symbolizer::offline();
            let _ = summary::summarize(&input, json, &opts, &mut sym, &mut std::io::sink());
        }
    }
}

// The rules of docs/architecture.md (layers, no cycle, file sizes) are checked by
// tests/architecture.rs at the workspace root.
