//! Finding real functions: the real `dlsym`, the next definition of a hooked symbol, an
//! emulation of `RTLD_NEXT` for our callers, and the driver's current device.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use crate::modules::{loaded_objects, Object};

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

static REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(null_mut());

/// glibc's own `dlsym`. We export `dlsym` ourselves, so it is looked up by version: glibc 2.34+
/// has it in libc as GLIBC_2.34, older ones in libdl as GLIBC_2.2.5.
fn real_dlsym_fn() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5"] {
            // SAFETY: plain dlvsym call with NUL-terminated strings.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: `p` is glibc's dlsym, whose type is DlsymFn.
    Some(unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) })
}

/// Calls glibc's `dlsym`. Note: `RTLD_NEXT` here means "after this library".
pub fn dlsym_real(handle: *mut c_void, name: &CStr) -> *mut c_void {
    match real_dlsym_fn() {
        // SAFETY: forwarding a handle the caller got from the loader and a C string.
        Some(f) => unsafe { f(handle, name.as_ptr()) },
        None => null_mut(),
    }
}

/// Base address of the object containing `p` (dladdr), or 0.
fn object_base(p: *const c_void) -> usize {
    // SAFETY: dladdr only reads loader tables; `info` is a plain out-struct.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(p, &mut info) == 0 {
            return 0;
        }
        info.dli_fbase as usize
    }
}

/// Whether `p` lies in this library.
pub fn is_ours(p: *const c_void) -> bool {
    let base = object_base(p);
    base != 0 && base == object_base(is_ours as *const c_void)
}

/// Looks `name` up in one loaded object (by its own handle: the object, then its dependencies).
pub fn lookup_in(obj: &Object, name: &CStr) -> *mut c_void {
    let Ok(path) = std::ffi::CString::new(obj.path.as_str()) else { return null_mut() };
    // SAFETY: RTLD_NOLOAD only returns a handle for an object that is already loaded (and
    // takes a reference we drop right after); the main program is opened with a null path.
    unsafe {
        let h = libc::dlopen(if obj.is_main { std::ptr::null() } else { path.as_ptr() }, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return null_mut();
        }
        let p = dlsym_real(h, name);
        libc::dlclose(h);
        p
    }
}

/// The definition of `name` that our hook stands in front of: the next one after this library
/// in global lookup order, or, for libraries opened with RTLD_LOCAL (cudart opening libcuda,
/// Python extensions opening libcudart), the one in any loaded object other than us.
pub fn next_definition(name: &CStr) -> *mut c_void {
    let p = dlsym_real(libc::RTLD_NEXT, name);
    if !p.is_null() && !is_ours(p) {
        return p;
    }
    for obj in loaded_objects() {
        let q = lookup_in(&obj, name);
        if !q.is_null() && !is_ours(q) {
            return q;
        }
    }
    null_mut()
}

/// `dlsym(RTLD_NEXT, name)` as seen from `caller` (a return address in the calling object).
/// Forwarding `RTLD_NEXT` to glibc would search after *this* library instead.
pub fn next_after(caller: *const c_void, name: &CStr) -> *mut c_void {
    let objects = loaded_objects();
    let Some(i) = objects.iter().position(|o| o.contains(caller as u64)) else {
        return dlsym_real(libc::RTLD_NEXT, name);
    };
    for obj in &objects[i + 1..] {
        let q = lookup_in(obj, name);
        // Only a definition in this very object counts (its dependencies come later anyway).
        if !q.is_null() && obj.contains(q as u64) {
            return q;
        }
    }
    null_mut()
}

type CtxGetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
static CTX_GET_DEVICE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static CTX_GET_DEVICE_TRIES: AtomicU32 = AtomicU32::new(0);

/// The calling thread's current device according to the driver, or -1.
pub fn current_device() -> i32 {
    let mut p = CTX_GET_DEVICE.load(Ordering::Acquire);
    if p.is_null() {
        // The driver is loaded before any allocation succeeds; give up after a few misses so a
        // process without libcuda does not scan its objects on every call.
        if CTX_GET_DEVICE_TRIES.fetch_add(1, Ordering::Relaxed) >= 8 {
            return -1;
        }
        p = next_definition(c"cuCtxGetDevice");
        if p.is_null() {
            return -1;
        }
        CTX_GET_DEVICE.store(p, Ordering::Release);
    }
    let mut dev: c_int = -1;
    // SAFETY: `p` is the driver's cuCtxGetDevice(CUdevice*), CUdevice being int.
    let r = unsafe { std::mem::transmute::<*mut c_void, CtxGetDeviceFn>(p)(&mut dev) };
    if r == 0 {
        dev
    } else {
        -1
    }
}
