//! The `summary` report: per device and memory kind, what was allocated, the peak and who
//! held it, what was still live at the end; then failed allocations and bad frees.
//!
//! `report` is the summary as data (the JSON schema), `build` makes it from the model, `render`
//! writes it for the terminal, `run` summarizes several traces and the processes together.

mod build;
mod render;
mod report;
mod run;
mod temporary;
#[cfg(test)]
mod tests;

pub use report::Options;
// The HTML report shows the summary as it is built and rendered here.
pub use build::build;
pub use render::render;
pub use report::TraceReport;
pub use run::{run, summarize};
