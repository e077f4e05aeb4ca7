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
            // PyTorch calls these at every block: kept beside the rest of the hot path (three
            // small functions), not on a code page of their own.
            #[no_mangle]
            #[link_section = ".text.hot.gpumemtrace"]
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
/// Saturates: a bogus request (or a driver's bogus pitch) never wraps to a small size.
unsafe fn pitched(r: Status, pitch: *mut usize, width: usize, height: usize, depth: usize) -> u64 {
    let row = if r == SUCCESS && !pitch.is_null() {
        // SAFETY: the call succeeded, so it wrote the pitch through this non-null pointer.
        unsafe { *pitch }
    } else {
        width
    };
    bytes3(row, height, depth)
}

/// `a * b * c` in bytes, saturating at `u64::MAX` (extents of 3D allocations and arrays).
fn bytes3(a: usize, b: usize, c: usize) -> u64 {
    (a as u64).saturating_mul(b as u64).saturating_mul(c as u64)
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

/// Our `dlsym`: a naked entry that asks [`dlsym_plan`] what to do, then either returns the
/// answer or jumps on to glibc's `dlsym` with the stack and arguments exactly as the program
/// made them. glibc's `dlsym` finds the caller from its return address (`RTLD_NEXT` and
/// `RTLD_DEFAULT` depend on it), so a jump keeps every answer, and every `dlerror` message,
/// what it is without us. Only the names we hook go another way (their answer is our hook).
///
/// A malloc wrapper preloaded before us calls this for `malloc` on its first `malloc`: nothing
/// here allocates, takes a lock of ours or touches `dlerror`'s state on that path.
///
/// glibc's loader accepts this unversioned definition for references to both
/// `dlsym@GLIBC_2.2.5` (libcudart, built against old glibc) and `dlsym@GLIBC_2.34`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8", // 16-byte alignment at the call
        "mov rdx, [rsp + 24]", // the return address: the caller
        "call {plan}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rdx, rdx",
        "jnz 2f",
        "ret", // rax: the answer
        "2:",
        "jmp rdx", // glibc's dlsym, as if called by the program
        plan = sym dlsym_plan,
    )
}

#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "mov x2, x30", // the return address: the caller
        "bl {plan}",
        "cbnz x1, 2f",
        "ldp x29, x30, [sp], #32",
        "ret", // x0: the answer
        "2:",
        "mov x16, x1",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "br x16", // glibc's dlsym, as if called by the program
        plan = sym dlsym_plan,
    )
}

/// What our `dlsym` does: return `value`, or, when `tail` is not null, jump to `tail` (glibc's
/// `dlsym`) with the program's own arguments. Two words: returned in registers.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Plan {
    value: *mut c_void,
    tail: *mut c_void,
}

/// Decides for [`dlsym`]. Allocates nothing and takes no lock unless `symbol` is one we hook.
extern "C" fn dlsym_plan(handle: *mut c_void, symbol: *const c_char, caller: *const c_void) -> Plan {
    let Some(real) = resolve::real_dlsym_fn() else {
        return Plan { value: null_mut(), tail: null_mut() };
    };
    let glibc = Plan { value: null_mut(), tail: real as *mut c_void };
    if symbol.is_null() {
        return glibc;
    }
    // SAFETY: dlsym's contract: `symbol` is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(symbol) };
    if !routing::routes_name(name.to_bytes()) {
        return glibc;
    }
    catch_unwind(AssertUnwindSafe(|| {
        let p = if handle == libc::RTLD_NEXT {
            // Relative to the caller; when only glibc knows, glibc answers (and sets dlerror).
            match resolve::next_after(caller, name) {
                Some(p) => {
                    // A successful dlsym discards a pending dlerror message; a lookup that
                    // surely succeeds does the same here.
                    dlsym_real(libc::RTLD_NEXT, c"dlsym");
                    p
                }
                None => return glibc,
            }
        } else {
            // One call of glibc's: its answer and its dlerror state are the program's.
            dlsym_real(handle, name)
        };
        Plan { value: routing::route_by_name(hook_addr, name, p), tail: null_mut() }
    }))
    .unwrap_or(glibc)
}

/// Looks up what `dlsym` needs while the library loads, before the program can call it.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

extern "C" fn at_load() {
    let _ = catch_unwind(resolve::init);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pitched_sizes_saturate_instead_of_wrapping() {
        let mut pitch = usize::MAX / 2;
        // SAFETY: `pitch` is a valid out-parameter.
        assert_eq!(unsafe { pitched(SUCCESS, &mut pitch, 1, 3, 1) }, u64::MAX);
        assert_eq!(unsafe { pitched(SUCCESS, &mut pitch, 1, 0, 1) }, 0);
        let mut pitch = 512;
        assert_eq!(unsafe { pitched(SUCCESS, &mut pitch, 100, 4, 1) }, 2048);
        assert_eq!(unsafe { pitched(1, std::ptr::null_mut(), 100, 4, 1) }, 400, "the request when the call failed");
        assert_eq!(unsafe { pitched(1, std::ptr::null_mut(), usize::MAX, usize::MAX, 2) }, u64::MAX);
        assert_eq!(bytes3(usize::MAX, usize::MAX, usize::MAX), u64::MAX);
        assert_eq!(bytes3(1 << 20, 1 << 20, 1 << 23), 1 << 63, "fits exactly");
        assert_eq!(bytes3(1 << 32, 1 << 32, 1), u64::MAX, "2^64 does not");
        assert_eq!(bytes3(7, 0, usize::MAX), 0);
    }
}
