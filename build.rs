//! Link options of the preload library.
fn main() {
    // The hooks' hot path is marked `#[link_section = ".text.hot.gpumemtrace"]`; this keeps those
    // functions together in one `.text.hot` output section (GNU ld and lld alike), so an event
    // touches a few pages of code, not pages spread over the library: in a host that runs
    // megabytes of its own code between two events (a PyTorch step), the tracer's code is cold,
    // and its cost is then mostly how many lines and pages of it an event touches.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,keep-text-section-prefix");
    println!("cargo:rerun-if-changed=build.rs");
}
