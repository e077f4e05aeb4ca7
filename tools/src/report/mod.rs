//! Reports over the [`crate::model::Trace`] model: each turns one or more traces into one
//! output. `sites` is the call-site aggregation they share.

pub mod check;
pub mod diff;
pub mod dump;
pub mod export;
pub mod flamegraph;
pub mod html;
pub mod live;
pub mod merged;
pub mod phases;
pub mod pools;
pub mod sites;
pub mod summary;
pub mod timeline;
pub mod tree;
