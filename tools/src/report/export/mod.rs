//! `gpumemtrace export --format memviz|perfetto|speedscope`: the trace in other tools' formats.

pub mod memviz;
pub mod perfetto;
pub(crate) mod pickle;
mod pool_steps;
pub mod speedscope;
