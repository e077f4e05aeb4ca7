//! Symbolization, offline: return addresses to functions, files and lines (`native`: DWARF,
//! symbol tables, build-ids), Python frames from their code objects (`python`), which frame of a
//! stack is its call site (`sites`), and a trace's stack put together (`locate`); `files` opens
//! only regular files, never waiting on a FIFO a trace names.

mod files;
mod locate;
pub mod native;
pub mod python;
pub mod sites;

pub use locate::{locate, Located};
pub use native::{Frame, Symbolizer, TraceSymbolizer};
