//! `gpumemtrace export --format memviz|perfetto|speedscope`: the trace in other tools' formats.

pub mod memviz;
pub mod perfetto;
mod pickle;
mod pool_steps;
pub mod speedscope;
