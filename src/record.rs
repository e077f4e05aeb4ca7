//! What the hooks hand to the writer: events, phase boundaries, and the native and Python
//! stacks they carry, as captured (before interning). The types live in the format crate,
//! because the journal (`journal`) carries them and a reader recovers them from it.

pub use gpumemtrace_format::raw::*;
