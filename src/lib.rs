//! libgpumemtrace.so: records every CUDA memory allocation of the process it is preloaded into.
//!
//! How a call travels (each step is one module):
//! - [`table`]: the one declarative list of hooked functions. It generates the exported hooks and
//!   drives the `dlsym` and `cuGetProcAddress` routing.
//! - [`hotpath`]: what every hook does around the real call: reentrancy guard, event fields,
//!   native stack, hand-off to the channel. Readable top-down.
//! - [`routing`]: `dlsym`, `cuGetProcAddress(_v2)` and `cudaGetDriverEntryPoint(ByVersion)`:
//!   hand hooks back instead of the real functions (static cudart, JAX and PyTorch reach the
//!   driver this way, never through the PLT).
//! - [`tracer`]: lazy start on the first allocation call, the writer thread, exit and fork.
//! - [`python`]: the calling thread's CPython frames, read from interpreter memory without the GIL.
//! - [`writer`]: interns stacks, keeps the module map, encodes records (format crate), writes.
//! - [`resolve`], [`modules`], [`unwind`], [`output`], [`config`]: small helpers named for what
//!   they hold. `unsafe` lives in the FFI-facing modules, each use with a `// SAFETY:` note.

mod clock;
mod config;
mod crash;
mod exec;
#[cfg(target_arch = "x86_64")]
mod fastunwind;
mod cuda;
mod guard;
mod hooks;
mod hotpath;
mod modules;
mod nvtx;
mod output;
mod phases;
mod python;
mod record;
mod resolve;
mod routing;
mod table;
mod thread;
mod tracer;
mod unwind;
mod writer;

pub use gpumemtrace_format as format;
