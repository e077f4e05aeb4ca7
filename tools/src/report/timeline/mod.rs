//! `gpumemtrace timeline`: live bytes over time, one panel per device and memory kind, with
//! the peak marked, failed allocations marked, phases nested in lanes with a legend, and, on
//! devices with PyTorch blocks, the allocator's reserved bytes beside its allocated ones.
//!
//! `envelope` draws a series per pixel column (exact minimum and maximum), `lanes` reduces
//! phase spans to bars, `reserved` follows the allocator's segments, `draw` makes the SVG and
//! `page` the self-contained HTML page around it.

mod draw;
mod envelope;
mod lanes;
mod page;
mod reserved;

pub use draw::render;
pub use page::{embed, page, CSS};
pub use reserved::Reserved;
