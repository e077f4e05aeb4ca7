//! `gpumemtrace`: summarizes traces written by the libgpumemtrace.so preload library, and
//! runs programs under it.

mod cli;
mod error;
mod model;
mod read;
mod report;
mod symbolize;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::args::Cli::parse();
    match cli::dispatch::run(cli.command) {
        Ok(status) => ExitCode::from(status),
        Err(e) => ExitCode::from(e.report()),
    }
}

// The rules of docs/architecture.md (layers, no cycle, file sizes) are checked by
// tests/architecture.rs at the workspace root.
