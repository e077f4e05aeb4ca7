//! Handing our hooks out where programs look functions up instead of linking them:
//! - `dlsym(libcuda, "cuMemCreate")` (JAX/XLA), `dlsym(h, "cuGetProcAddress_v2")` (cudart);
//! - `cuGetProcAddress(_v2)`: cudart, static or shared, asks it for every driver function, and
//!   first for "cuGetProcAddress" itself, so it must hand back itself;
//! - `cudaGetDriverEntryPoint(ByVersion)`: PyTorch's expandable segments reach the VMM API so.
//!
//! The lookup functions (exported by `hooks`) run the real lookup, then ask here which hook
//! stands for what it returned. Which hook is decided by the returned *pointer*: each real
//! variant (`_v2`, `_ptsz`) is resolved by its exported name and compared, which gets versions
//! and per-thread-stream flags right without guessing from the requested name.
//!
//! Routing answers "which hook" and nothing more: it is given where our hooks are (`hook_addr`,
//! from `hooks`) and reads the table and the real functions' slots.

use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::cuda::PER_THREAD_DEFAULT_STREAM;
use crate::resolve;
use crate::table::{known_real, learn_real, Id, Layer, ALL};

// ---------------------------------------------------------------------------------------------
// dlsym

/// Whether `dlsym` of `name` may have to answer with one of our hooks (a CUDA function we hook).
/// Allocates nothing: `dlsym` asks it for every name.
pub fn routes_name(name: &[u8]) -> bool {
    name.starts_with(b"cu") && Id::by_name(name).is_some()
}

/// `p` is what `dlsym` of `name` resolved to: our hook if `name` is one we hook, else `p`.
/// Allocates nothing and takes no lock.
pub fn route_by_name(hook_addr: impl Fn(Id) -> *mut c_void, name: &CStr, p: *mut c_void) -> *mut c_void {
    let bytes = name.to_bytes();
    if p.is_null() || !routes_name(bytes) {
        return p;
    }
    let Some(id) = Id::by_name(bytes) else { return p };
    if resolve::is_ours(p) {
        return p; // found our own export
    }
    if learn_real(id, p) {
        hook_addr(id)
    } else {
        p
    }
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress and the runtime's entry-point API

/// Swaps the function a lookup returned through `pfn` for our hook, if we hook it.
///
/// # Safety
/// `symbol` is null or a C string; `pfn` is null or the out-pointer of a successful lookup.
pub unsafe fn route_out(
    hook_addr: impl Fn(Id) -> *mut c_void + Copy,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: u64,
    version: i64,
) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: per this function's contract.
    let (name, p) = unsafe { (CStr::from_ptr(symbol), *pfn) };
    if let Ok(q) = catch_unwind(AssertUnwindSafe(|| route_by_pointer(hook_addr, name, p, flags, version))) {
        // SAFETY: as above; the caller reads the function pointer from here.
        unsafe { *pfn = q };
    }
}

/// The hook for the driver function at `p`, which a lookup of `name` returned; else `p`.
fn route_by_pointer(hook_addr: impl Fn(Id) -> *mut c_void + Copy, name: &CStr, p: *mut c_void, flags: u64, version: i64) -> *mut c_void {
    if p.is_null() || ALL.iter().any(|&id| hook_addr(id) == p) {
        return p;
    }
    let driver = || ALL.iter().copied().filter(|id| id.info().layer == Layer::Driver);
    let matching = || driver().find(|&id| known_real(id) == p);
    if let Some(id) = matching() {
        return hook_addr(id);
    }
    let Ok(name) = name.to_str() else { return p };
    let variants: Vec<Id> = driver().filter(|id| id.info().base_name() == name).collect();
    if variants.is_empty() {
        return p; // not a function we hook
    }
    // Resolve every exported variant in the object that defined `p`, then compare pointers.
    if let Some(obj) = crate::modules::loaded_objects().into_iter().find(|o| o.contains(p as u64)) {
        for &id in &variants {
            let q = resolve::lookup_in(&obj, id.info().c_name());
            if !q.is_null() && !resolve::is_ours(q) {
                learn_real(id, q);
            }
        }
        if let Some(id) = matching() {
            return hook_addr(id);
        }
    }
    // The driver returned a function it does not export: choose the variant from the request.
    let ptsz = flags & PER_THREAD_DEFAULT_STREAM != 0;
    let mut fit: Vec<Id> = variants.iter().copied().filter(|id| id.info().is_ptsz() == ptsz).collect();
    if fit.is_empty() {
        fit = variants;
    }
    // Only cuGetProcAddress has two versions in the table: _v2 from CUDA 12.0.
    let id = if fit.len() > 1 && version < 12000 { fit[0] } else { fit[fit.len() - 1] };
    if learn_real(id, p) {
        hook_addr(id)
    } else {
        p
    }
}
