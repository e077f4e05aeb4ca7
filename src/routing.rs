//! Handing our hooks out where programs look functions up instead of linking them:
//! - `dlsym(libcuda, "cuMemCreate")` (JAX/XLA), `dlsym(h, "cuGetProcAddress_v2")` (cudart);
//! - `cuGetProcAddress(_v2)`: cudart, static or shared, asks it for every driver function, and
//!   first for "cuGetProcAddress" itself, so it must hand back itself;
//! - `cudaGetDriverEntryPoint(ByVersion)`: PyTorch's expandable segments reach the VMM API so.
//!
//! The lookup functions run the real lookup, then swap a real function for our hook. Which hook
//! is decided by the returned *pointer*: each real variant (`_v2`, `_ptsz`) is resolved by its
//! exported name and compared, which gets versions and per-thread-stream flags right without
//! guessing from the requested name.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::cuda::{Status, NOT_INITIALIZED, PER_THREAD_DEFAULT_STREAM, SUCCESS};
use crate::resolve::{self, dlsym_real};
use crate::table::{self, known_real, learn_real, Id, Layer, ALL};

// ---------------------------------------------------------------------------------------------
// dlsym

/// Our `dlsym`. A naked entry passes the return address along: `RTLD_NEXT` must be resolved
/// relative to the caller, and a Rust function cannot see its own return address.
/// glibc's loader accepts this unversioned definition for references to both
/// `dlsym@GLIBC_2.2.5` (libcudart, built against old glibc) and `dlsym@GLIBC_2.34`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("mov rdx, [rsp]", "jmp {}", sym dlsym_from)
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!("mov x2, x30", "b {}", sym dlsym_from)
}

extern "C" fn dlsym_from(handle: *mut c_void, symbol: *const c_char, caller: *const c_void) -> *mut c_void {
    if symbol.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    let lookup = || {
        if handle == libc::RTLD_NEXT {
            resolve::next_after(caller, name)
        } else {
            dlsym_real(handle, name)
        }
    };
    match catch_unwind(AssertUnwindSafe(|| {
        let p = lookup();
        route_by_name(name, p)
    })) {
        Ok(p) => p,
        Err(_) => lookup(),
    }
}

/// `p` is what `name` resolved to; hand out our hook if `name` is one we hook.
fn route_by_name(name: &CStr, p: *mut c_void) -> *mut c_void {
    let bytes = name.to_bytes();
    if p.is_null() || !bytes.starts_with(b"cu") {
        return p;
    }
    let Some(id) = Id::by_name(bytes) else { return p };
    if resolve::is_ours(p) {
        return p; // found our own export
    }
    if learn_real(id, p) {
        id.hook_addr()
    } else {
        p
    }
}

// ---------------------------------------------------------------------------------------------
// cuGetProcAddress and the runtime's entry-point API

type GetProcV1 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> Status;
type GetProcV2 = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> Status;
type EntryPoint = unsafe extern "C" fn(*const c_char, *mut *mut c_void, u64, *mut c_int) -> Status;
type EntryPointByVersion = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_uint, u64, *mut c_int) -> Status;

/// Swaps the function a lookup returned through `pfn` for our hook, if we hook it.
///
/// # Safety
/// `symbol` is null or a C string; `pfn` is null or the out-pointer of a successful lookup.
unsafe fn route_out(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, version: i64) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: per this function's contract.
    let (name, p) = unsafe { (CStr::from_ptr(symbol), *pfn) };
    if let Ok(q) = catch_unwind(AssertUnwindSafe(|| route_by_pointer(name, p, flags, version))) {
        // SAFETY: as above; the caller reads the function pointer from here.
        unsafe { *pfn = q };
    }
}

#[no_mangle]
#[allow(non_snake_case)]
/// # Safety
/// As the driver's `cuGetProcAddress` (before CUDA 12.0).
pub unsafe extern "C" fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) -> Status {
    // SAFETY: the slot holds the real cuGetProcAddress.
    let Some(real) = (unsafe { table::real::<GetProcV1>(Id::cuGetProcAddress) }) else { return NOT_INITIALIZED };
    // SAFETY: arguments forwarded unchanged; route_out only touches `pfn` after success.
    unsafe {
        let r = real(symbol, pfn, version, flags);
        if r == SUCCESS {
            route_out(symbol, pfn, flags, version as i64);
        }
        r
    }
}

#[no_mangle]
#[allow(non_snake_case)]
/// # Safety
/// As the driver's `cuGetProcAddress_v2`.
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Status {
    // SAFETY: the slot holds the real cuGetProcAddress_v2.
    let Some(real) = (unsafe { table::real::<GetProcV2>(Id::cuGetProcAddress_v2) }) else { return NOT_INITIALIZED };
    // SAFETY: as in cuGetProcAddress.
    unsafe {
        let r = real(symbol, pfn, version, flags, status);
        if r == SUCCESS {
            route_out(symbol, pfn, flags, version as i64);
        }
        r
    }
}

#[no_mangle]
#[allow(non_snake_case)]
/// # Safety
/// As the runtime's `cudaGetDriverEntryPoint` (CUDA 12/13 signature).
pub unsafe extern "C" fn cudaGetDriverEntryPoint(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    flags: u64,
    status: *mut c_int,
) -> Status {
    // SAFETY: the slot holds the real cudaGetDriverEntryPoint.
    let Some(real) = (unsafe { table::real::<EntryPoint>(Id::cudaGetDriverEntryPoint) }) else { return NOT_INITIALIZED };
    // SAFETY: as in cuGetProcAddress. It has no version argument: it resolves the newest.
    unsafe {
        let r = real(symbol, pfn, flags, status);
        if r == SUCCESS {
            route_out(symbol, pfn, flags, i64::MAX);
        }
        r
    }
}

#[no_mangle]
#[allow(non_snake_case)]
/// # Safety
/// As the runtime's `cudaGetDriverEntryPointByVersion`.
pub unsafe extern "C" fn cudaGetDriverEntryPointByVersion(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_uint,
    flags: u64,
    status: *mut c_int,
) -> Status {
    // SAFETY: the slot holds the real cudaGetDriverEntryPointByVersion.
    let Some(real) = (unsafe { table::real::<EntryPointByVersion>(Id::cudaGetDriverEntryPointByVersion) }) else {
        return NOT_INITIALIZED;
    };
    // SAFETY: as in cuGetProcAddress.
    unsafe {
        let r = real(symbol, pfn, version, flags, status);
        if r == SUCCESS {
            route_out(symbol, pfn, flags, version as i64);
        }
        r
    }
}

/// The hook for the driver function at `p`, which a lookup of `name` returned; else `p`.
fn route_by_pointer(name: &CStr, p: *mut c_void, flags: u64, version: i64) -> *mut c_void {
    if p.is_null() || Id::by_hook_addr(p).is_some() {
        return p;
    }
    let driver = || ALL.iter().copied().filter(|id| id.info().layer == Layer::Driver);
    let matching = || driver().find(|&id| known_real(id) == p);
    if let Some(id) = matching() {
        return id.hook_addr();
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
            return id.hook_addr();
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
        id.hook_addr()
    } else {
        p
    }
}
