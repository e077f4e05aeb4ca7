//! The model of one trace: what every report reads. `load` replays the trace once
//! with the model's observers: `groups` (statistics per device and memory kind, failures, bad
//! frees), `pool` (segments and blocks of a caching allocator), `growth` (stacks whose live bytes
//! keep rising) and `timeseries` (live bytes over time, allocations by stack and phase);
//! `behind` runs those observers on a thread of their own where a core is free for it;
//! `aggregate` reads the summaries of aggregate traces instead; `autograd` attributes allocations of PyTorch's backward threads to the waiting Python stack.
//!
//! The model only records, by stack id; turning stacks into call sites is the reports' job.

pub mod aggregate;
pub mod autograd;
pub mod groups;
pub mod growth;
mod behind;
mod load;
pub mod pool;
pub mod snapshots;
pub mod temporary;
pub mod timeseries;
mod trace;
#[cfg(test)]
pub(crate) mod tests;

pub use crate::read::filter::Filter;
pub use crate::read::live::{GroupKey, StackUse};
pub use crate::read::records::Outcome;
pub use crate::read::replay::{Observer, Step, StepKind};
pub use load::{load, load_input};
pub use pool::Pool;
pub use trace::{Failure, Trace, IMPOSSIBLE_DEVICE};
