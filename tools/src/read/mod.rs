//! Reading and replay: where traces come from (`input`), their records (`records`), and the one
//! replay of their events (`replay`, with the live set, the phases and the filter) that every
//! report's figures come from. Depends on the format crate only.

pub mod byid;
pub mod filter;
pub mod input;
pub mod live;
pub mod phases;
pub mod records;
pub mod replay;
mod stackmatch;
