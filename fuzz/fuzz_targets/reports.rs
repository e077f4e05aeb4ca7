//! Arbitrary bytes, as a trace file, through every report but the summary (`read_trace.rs` has
//! it): the timeline, the HTML report, flame graphs, the three exports, tree, diff, phases and
//! check, each through the command line's own parsing and dispatch. Never a panic, arithmetic
//! overflow included, whatever values the records carry.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    gpumemtrace_cli::fuzz::reports(data);
});
