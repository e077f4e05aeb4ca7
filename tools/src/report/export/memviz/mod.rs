//! PyTorch's memory snapshot pickle, as `torch.cuda.memory._snapshot()` writes it, for
//! https://pytorch.org/memory_viz and `torch.cuda._memory_viz`.
//!
//! Two levels, per device:
//! - **With blocks** (PyTorch's caching allocator reported its tensors), PyTorch's own
//!   structure (see `blocks`): segments are the driver allocations that hold blocks, each
//!   tiled by its live blocks and the free gaps between them.
//! - **Without**, every traced GPU allocation is its own segment holding one block (see
//!   `driver`): nothing stands between the program and CUDA from where we see it.
//!
//! `segments` is the state at the end of the trace, which is where memory_viz starts when it
//! replays `device_traces` backwards.

//!
//! `snapshot` is the data, `collect` the replay's observer that gathers it (from `driver` or
//! `blocks`, per device), `write` the pickle.

mod blocks;
mod collect;
mod driver;
mod snapshot;
mod write;

pub use collect::Collector;
pub use write::write;
