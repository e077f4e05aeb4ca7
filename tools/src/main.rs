//! `gpumemtrace`: summarizes traces written by the libgpumemtrace.so preload library, and
//! runs programs under it.

mod args;
mod commands;
mod error;
mod model;
mod python;
mod read;
mod report;
mod run;
mod sites;
mod symbolize;
mod units;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match commands::run(cli.command) {
        Ok(status) => ExitCode::from(status),
        Err(e) => ExitCode::from(e.report()),
    }
}
