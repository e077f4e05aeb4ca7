//! What the loader sees: every function this library exports in front of a CUDA one, generated
//! from the lines of `table` (`hook_table!(exports)`), and `dlsym`.
//!
//! - An event line becomes a hook that calls the real function through `hotpath::traced`.
//! - A report line becomes a hook that forwards the caller's exact arguments through
//!   `hotpath::block`.
//! - A route line becomes a lookup entry point (`cuGetProcAddress(_v2)`,
//!   `cudaGetDriverEntryPoint(ByVersion)`): the real lookup, then `routing` swaps the function it
//!   returned for our hook. `dlsym` does the same for lookups by name.
//!
//! Routing is told where our hooks are ([`hook_addr`]) rather than knowing this module, so the
//! dependencies point one way: hooks -> routing -> table.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

use gpumemtrace_format::Op;

use crate::cuda::*;
use crate::hotpath::{alloc, free, out, traced, FieldsExt};
use crate::resolve::{self, dlsym_real};
use crate::routing;
use crate::table::{hook_table, real, Id};

/// Generates the exported functions and [`hook_addr`] from the list.
macro_rules! exports {
    (
        events {
            $( $layer:ident $name:ident ( $($arg:ident : $ty:ty),* ) $kind:ident $op:ident
                => |$r:ident| $fields:expr ; )*
        }
        routes {
            $( $rlayer:ident $rname:ident ( $($rarg:ident : $rty:ty),* ) => $rroute:expr ; )*
        }
        reports {
            $( $bname:ident ( $($barg:ident : $bty:ty),* ) => $breport:expr ; )*
        }
        records {
            $( $klayer:ident $kname:ident $kkind:ident $kop:ident $klabel:literal ; )*
        }
    ) => {
        /// Address of our hook for this function (null for records without a function).
        pub fn hook_addr(id: Id) -> *mut c_void {
            match id {
                $( Id::$name => $name as *mut c_void, )*
                $( Id::$rname => $rname as *mut c_void, )*
                $( Id::$bname => $bname as *mut c_void, )*
                // Records only: no function of ours stands for them.
                $( Id::$kname => null_mut(), )*
            }
        }

        $(
            #[no_mangle]
            #[allow(non_snake_case, unused_unsafe, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $bname($($barg: $bty),*) {
                type Real = unsafe extern "C" fn($($bty),*);
                // SAFETY: the slot of `$bname` only ever holds the real `$bname`, of type `Real`.
                let real = unsafe { real::<Real>(Id::$bname) };
                let (ptr, size, device, totals) = $breport;
                // SAFETY: forwards the caller's arguments unchanged (the allocator's own
                // profiler listens behind the real function).
                crate::hotpath::block(BLOCK_APIS, ptr as u64, size, device, totals, || {
                    if let Some(real) = real {
                        unsafe { real($($barg),*) }
                    }
                })
            }
        )*

        $(
            #[no_mangle]
            #[allow(non_snake_case, unused_unsafe, unused_variables, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> Status {
                type Real = unsafe extern "C" fn($($ty),*) -> Status;
                // SAFETY: the slot of `$name` only ever holds the real `$name`, of type `Real`.
                let Some(real) = (unsafe { real::<Real>(Id::$name) }) else {
                    return NOT_INITIALIZED;
                };
                // SAFETY: forwards the caller's arguments unchanged; `$fields` reads
                // out-parameters only after the call succeeded (see `hotpath::out`).
                traced(Id::$name as u32, Op::$op, || unsafe { real($($arg),*) }, |$r| unsafe { $fields })
            }
        )*

        $(
            #[no_mangle]
            #[allow(non_snake_case, unused_variables, clippy::missing_safety_doc)]
            pub unsafe extern "C" fn $rname($($rarg: $rty),*) -> Status {
                type Real = unsafe extern "C" fn($($rty),*) -> Status;
                // SAFETY: the slot of `$rname` only ever holds the real `$rname`, of type `Real`.
                let Some(real) = (unsafe { real::<Real>(Id::$rname) }) else {
                    return NOT_INITIALIZED;
                };
                // SAFETY: arguments forwarded unchanged; route_out only touches `pfn` after
                // success.
                unsafe {
                    let r = real($($rarg),*);
                    if r == SUCCESS {
                        let (symbol, pfn, flags, version) = $rroute;
                        routing::route_out(hook_addr, symbol, pfn, flags, version);
                    }
                    r
                }
            }
        )*
    };
}

hook_table!(exports);

/// The API numbers the reports record: a block handed out, a block taken back.
const BLOCK_APIS: (u32, u32) = (Id::block_alloc as u32, Id::block_free as u32);

/// Bytes of a pitched allocation: the pitch the call chose times the rows, or the request.
unsafe fn pitched(r: Status, pitch: *mut usize, width: usize, height: usize, depth: usize) -> u64 {
    let row = if r == SUCCESS && !pitch.is_null() {
        // SAFETY: the call succeeded, so it wrote the pitch through this non-null pointer.
        unsafe { *pitch }
    } else {
        width
    };
    (row * height * depth) as u64
}

/// The device a `cuMemCreate` allocates on, from its properties; -1 for host locations.
unsafe fn prop_device(prop: *const CUmemAllocationProp) -> i32 {
    if prop.is_null() {
        return -1;
    }
    // SAFETY: the caller passed a valid CUmemAllocationProp (the real call read it too).
    let p = unsafe { &*prop };
    if p.location_type == CU_MEM_LOCATION_TYPE_DEVICE {
        p.location_id
    } else {
        -1
    }
}

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
        routing::route_by_name(hook_addr, name, p)
    })) {
        Ok(p) => p,
        Err(_) => lookup(),
    }
}
