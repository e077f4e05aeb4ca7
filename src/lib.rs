//! libgpumemtrace.so: records every CUDA memory allocation of the process it is preloaded into.
//!
//! The modules form layers; each depends only on layers below it (a test below keeps it so;
//! docs/architecture.md has the picture and an event's path through them):
//!
//! - Entry points, what the loader and the program reach:
//!   [`hooks`] (the exported hooks and lookup entry points, generated from the table, and
//!   `dlsym`), [`phases`] and [`nvtx`] (phase marks), [`control`] (pause and resume), [`exec`] (finish the trace before `exec*`).
//! - Decisions at the entry: [`routing`] (which hook stands for a function that `dlsym` or
//!   `cuGetProcAddress` returned), [`hotpath`] (what every hook does around the real call:
//!   reentrancy guard, event fields, stacks, hand-off; readable top-down).
//! - The tracer's life: [`tracer`] (lazy start on the first allocation call, the channel, the
//!   writer thread, exit, fork, fatal signals through [`crash`]), [`writer`] (interns stacks,
//!   keeps the module map, encodes records with the format crate, writes the file).
//! - Capture: [`python`] (the calling thread's CPython frames, read from interpreter memory
//!   without the GIL) with [`pylayout`] (CPython's offsets per version), [`unwind`] and
//!   [`fastunwind`] (native return addresses) with [`walkmemo`] (the thread's recent walks).
//! - Self-measurement: [`selftime`] (`GPUMEMTRACE_SELF_TIME=1`: what the hooks add, by part).
//! - Data and small services, depending on nothing above: [`table`] (the one declarative list of
//!   hooked functions, and their real functions), [`record`] (what the hooks hand to the writer),
//!   [`clock`] (time, call order, tracer starts), [`thread`] (thread id and name), [`config`]
//!   (every environment variable), [`resolve`], [`modules`], [`phdr`] (the one walk over the
//!   loaded objects), [`lazy`] (the one slot type for a function found on first use), [`guard`],
//!   [`output`], [`cuda`], [`stackkey`] (a stack's key), [`prefetch`] (cache hints), [`pause`] (the pause count), [`aggregate`] (the summaries of aggregate mode) [`backward`]
//!   (its attribution of PyTorch's backward threads) and [`phase_totals`] (its totals by phase).
//!
//! `unsafe` lives in the FFI-facing modules, each use with a `// SAFETY:` note.

mod aggregate;
mod backward;
mod batch;
mod phase_totals;
mod clock;
mod config;
mod control;
mod crash;
mod exec;
mod exits;
#[cfg(target_arch = "x86_64")]
mod fastunwind;
mod cuda;
mod guard;
mod hooks;
mod horizon;
mod hotpath;
mod lazy;
mod modules;
mod nvtx;
mod output;
mod phdr;
mod pause;
mod phases;
mod prefetch;
mod pylayout;
mod python;
mod record;
mod resolve;
mod ring;
mod routing;
mod selftime;
mod sink;
mod stackkey;
mod table;
mod thread;
mod tracer;
mod unwind;
mod waiting;
#[cfg(target_arch = "x86_64")]
mod walkmemo;
mod writer;

pub use gpumemtrace_format as format;

// The architecture rules (no dependency cycle, the bottom layer, one loader walk) are checked
// for all three crates by tests/architecture.rs.
