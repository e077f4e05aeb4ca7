//! The hook table: every interposed function, declared once.
//!
//! One line per function. `hooks` expands the lines into the exported hooks (so PLT callers
//! reach them) and the lookup entry points; this module expands them into what the rest of the
//! shim knows of each hook: its [`Id`], symbol, layer and what its calls record, read by
//! `routing` for `dlsym` (JAX/XLA style lookups) and `cuGetProcAddress` (static cudart, CuPy,
//! PyTorch's entry-point API), and by the writer for the trace's list of APIs. Adding an API is
//! one line here.
//!
//! An event line reads: `Layer symbol(args) Kind Op => |result| fields`. `fields` runs after the
//! real call with its result code and says what to record (see `hotpath`); it may read
//! out-parameters, which the helpers do only when the call succeeded. A route line reads
//! `Layer symbol(args) => (symbol, pfn, flags, version)`: the lookup's arguments routing needs.
//! The lines stay tokens until a generator expands them: the names they use (`alloc`, `out`,
//! `pitched`, `bytes3`, the CUDA types) are those in scope in `hooks`, where they become code.
//!
//! Besides the list, this module holds the slots of the real functions behind the hooks. It
//! depends on `resolve` (to find a real function) and `lazy` (to keep it).

use std::ffi::{c_void, CStr};

use crate::lazy::LazyFn;

use gpumemtrace_format::{MemKind, Op};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Layer {
    /// The CUDA runtime (`libcudart`): reached through the PLT or `dlsym`.
    Runtime,
    /// The CUDA driver (`libcuda`): also reached through `cuGetProcAddress`.
    Driver,
    /// A framework's caching allocator reporting its blocks (PyTorch's `libc10`), reached
    /// through the PLT of the libraries that report; never routed by `dlsym`.
    Allocator,
}

/// What the table knows of one hooked function.
pub struct Hook {
    /// Exported symbol, NUL-terminated.
    symbol: &'static str,
    pub layer: Layer,
    /// What its calls record; `None` for the routing functions (they record nothing).
    pub event: Option<(MemKind, Op)>,
}

impl Hook {
    /// The exported symbol (for records without a function of their own: their label).
    pub fn name(&self) -> &'static str {
        &self.symbol[..self.symbol.len() - 1]
    }
    pub fn c_name(&self) -> &'static CStr {
        // SAFETY: every symbol is built by `concat!(name, "\0")` from an identifier.
        unsafe { CStr::from_bytes_with_nul_unchecked(self.symbol.as_bytes()) }
    }
    /// The name `cuGetProcAddress` is asked for: without `_ptsz` and without a `_vN` suffix.
    pub fn base_name(&self) -> &'static str {
        let n = self.name();
        let n = n.strip_suffix("_ptsz").unwrap_or(n);
        match n.rfind("_v") {
            Some(i) if n[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < n.len() => &n[..i],
            _ => n,
        }
    }
    /// Whether this is the per-thread-default-stream flavour.
    pub fn is_ptsz(&self) -> bool {
        self.name().ends_with("_ptsz")
    }
}

/// The list itself: hands every line to the generator macro `$gen`, which must accept
/// `events { .. } routes { .. } reports { .. } records { .. }` as `describe` below does.
macro_rules! hook_table {
    ($gen:ident) => {
        $gen! {
            events {
                // --- runtime: device memory
                Runtime cudaMalloc(p: *mut *mut c_void, size: usize) Device Alloc => |r| alloc(out(r, p), size as u64);
                Runtime cudaFree(ptr: *mut c_void) Device Free => |r| free(ptr as u64);
                Runtime cudaMallocPitch(p: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) Device Alloc
                    => |r| alloc(out(r, p), pitched(r, pitch, width, height, 1));
                Runtime cudaMalloc3D(pp: *mut cudaPitchedPtr, e: cudaExtent) Device Alloc
                    => |r| if r == SUCCESS && !pp.is_null() {
                        alloc((*pp).ptr as u64, bytes3((*pp).pitch, e.height, e.depth))
                    } else {
                        alloc(0, bytes3(e.width, e.height, e.depth))
                    };
                Runtime cudaMallocManaged(p: *mut *mut c_void, size: usize, flags: c_uint) Managed Alloc
                    => |r| alloc(out(r, p), size as u64);
                // --- runtime: stream-ordered
                Runtime cudaMallocAsync(p: *mut *mut c_void, size: usize, s: cudaStream_t) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Runtime cudaMallocAsync_ptsz(p: *mut *mut c_void, size: usize, s: cudaStream_t) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Runtime cudaFreeAsync(ptr: *mut c_void, s: cudaStream_t) Device Free => |r| free(ptr as u64).stream(s);
                Runtime cudaFreeAsync_ptsz(ptr: *mut c_void, s: cudaStream_t) Device Free => |r| free(ptr as u64).stream(s);
                Runtime cudaMallocFromPoolAsync(p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, s: cudaStream_t) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Runtime cudaMallocFromPoolAsync_ptsz(p: *mut *mut c_void, size: usize, pool: cudaMemPool_t, s: cudaStream_t) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                // --- runtime: pinned host memory
                Runtime cudaMallocHost(p: *mut *mut c_void, size: usize) HostPinned Alloc => |r| alloc(out(r, p), size as u64).host();
                Runtime cudaHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) HostPinned Alloc
                    => |r| alloc(out(r, p), size as u64).host();
                Runtime cudaFreeHost(ptr: *mut c_void) HostPinned Free => |r| free(ptr as u64).host();

                // --- driver: device memory
                Driver cuMemAlloc_v2(p: *mut CUdeviceptr, size: usize) Device Alloc => |r| alloc(out(r, p), size as u64);
                Driver cuMemFree_v2(ptr: CUdeviceptr) Device Free => |r| free(ptr);
                Driver cuMemAllocPitch_v2(p: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) Device Alloc
                    => |r| alloc(out(r, p), pitched(r, pitch, width, height, 1));
                Driver cuMemAllocManaged(p: *mut CUdeviceptr, size: usize, flags: c_uint) Managed Alloc
                    => |r| alloc(out(r, p), size as u64);
                // --- driver: stream-ordered
                Driver cuMemAllocAsync(p: *mut CUdeviceptr, size: usize, s: CUstream) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Driver cuMemAllocAsync_ptsz(p: *mut CUdeviceptr, size: usize, s: CUstream) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Driver cuMemFreeAsync(ptr: CUdeviceptr, s: CUstream) Device Free => |r| free(ptr).stream(s);
                Driver cuMemFreeAsync_ptsz(ptr: CUdeviceptr, s: CUstream) Device Free => |r| free(ptr).stream(s);
                Driver cuMemAllocFromPoolAsync(p: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                Driver cuMemAllocFromPoolAsync_ptsz(p: *mut CUdeviceptr, size: usize, pool: CUmemoryPool, s: CUstream) Device Alloc
                    => |r| alloc(out(r, p), size as u64).stream(s);
                // --- driver: pinned host memory
                Driver cuMemAllocHost_v2(p: *mut *mut c_void, size: usize) HostPinned Alloc => |r| alloc(out(r, p), size as u64).host();
                Driver cuMemHostAlloc(p: *mut *mut c_void, size: usize, flags: c_uint) HostPinned Alloc
                    => |r| alloc(out(r, p), size as u64).host();
                Driver cuMemFreeHost(ptr: *mut c_void) HostPinned Free => |r| free(ptr as u64).host();
                // --- driver: virtual memory management (PyTorch expandable segments, JAX)
                Driver cuMemCreate(h: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) VmmPhysical Alloc
                    => |r| alloc(out(r, h), size as u64).device(prop_device(prop));
                Driver cuMemRelease(h: CUmemGenericAllocationHandle) VmmPhysical Free => |r| free(h).device(-1);
                Driver cuMemAddressReserve(p: *mut CUdeviceptr, size: usize, align: usize, addr: CUdeviceptr, flags: u64) VmmReserved Alloc
                    => |r| alloc(out(r, p), size as u64).device(-1);
                Driver cuMemAddressFree(ptr: CUdeviceptr, size: usize) VmmReserved Free => |r| free(ptr).size(size as u64).device(-1);
                Driver cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, h: CUmemGenericAllocationHandle, flags: u64) VmmMapped Alloc
                    => |r| alloc(ptr, size as u64).extra(h);
                Driver cuMemUnmap(ptr: CUdeviceptr, size: usize) VmmMapped Free => |r| free(ptr).size(size as u64);
            }
            routes {
                // Before CUDA 12.0.
                Driver cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64)
                    => (symbol, pfn, flags, version as i64);
                Driver cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int)
                    => (symbol, pfn, flags, version as i64);
                // The CUDA 12/13 signature. It has no version argument: it resolves the newest.
                Runtime cudaGetDriverEntryPoint(symbol: *const c_char, pfn: *mut *mut c_void, flags: u64, status: *mut c_int)
                    => (symbol, pfn, flags, i64::MAX);
                Runtime cudaGetDriverEntryPointByVersion(symbol: *const c_char, pfn: *mut *mut c_void, version: c_uint, flags: u64, status: *mut c_int)
                    => (symbol, pfn, flags, version as i64);
            }
            reports {
                // PyTorch's caching allocator reports every block it hands out (+size) or takes back
                // (-size) to `c10::reportMemoryUsageToProfiler`, through the PLT of libc10_cuda and
                // libtorch_cpu. torch 1.10+: (ptr, size, total allocated, total reserved, device).
                _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE(ptr: *mut c_void, size: i64, allocated: usize, reserved: usize, device: C10Device)
                    => (ptr, size, device, Some((allocated as u64, reserved as u64)));
                // Between 1.10 and 1.13 the totals were signed.
                _ZN3c1027reportMemoryUsageToProfilerEPvlllNS_6DeviceE(ptr: *mut c_void, size: i64, allocated: i64, reserved: i64, device: C10Device)
                    => (ptr, size, device, Some((allocated.max(0) as u64, reserved.max(0) as u64)));
                // Older torch: (ptr, size, device).
                _ZN3c1027reportMemoryUsageToProfilerEPvlNS_6DeviceE(ptr: *mut c_void, size: i64, device: C10Device)
                    => (ptr, size, device, None);
            }
            records {
                // What the reports above record: an allocation and a free of a block.
                Allocator block_alloc Block Alloc "c10::reportMemoryUsageToProfiler(+)";
                Allocator block_free Block Free "c10::reportMemoryUsageToProfiler(-)";
            }
        }
    };
}
pub(crate) use hook_table;

/// Generates [`Id`], [`HOOKS`] and [`ALL`] from the list.
macro_rules! describe {
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
        /// Index of a hook in [`HOOKS`].
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub enum Id { $($name,)* $($rname,)* $($bname,)* $($kname,)* }

        pub static HOOKS: &[Hook] = &[
            $( Hook {
                symbol: concat!(stringify!($name), "\0"),
                layer: Layer::$layer,
                event: Some((MemKind::$kind, Op::$op)),
            }, )*
            $( Hook {
                symbol: concat!(stringify!($rname), "\0"),
                layer: Layer::$rlayer,
                event: None,
            }, )*
            $( Hook {
                symbol: concat!(stringify!($bname), "\0"),
                layer: Layer::Allocator,
                event: None,
            }, )*
            $( Hook {
                symbol: concat!($klabel, "\0"),
                layer: Layer::$klayer,
                event: Some((MemKind::$kkind, Op::$kop)),
            }, )*
        ];

        pub const ALL: &[Id] = &[$(Id::$name,)* $(Id::$rname,)* $(Id::$bname,)* $(Id::$kname,)*];
    };
}

hook_table!(describe);

// ---------------------------------------------------------------------------------------------
// The real functions behind the hooks.

static REAL: [LazyFn; ALL.len()] = [const { LazyFn::new() }; ALL.len()];

impl Id {
    pub fn info(self) -> &'static Hook {
        &HOOKS[self as usize]
    }

    /// The hook whose exported symbol is `name`.
    pub fn by_name(name: &[u8]) -> Option<Id> {
        ALL.iter().copied().find(|id| id.info().name().as_bytes() == name)
    }
}

/// The real function of `id` typed as `F`.
///
/// # Safety
/// `F` must be the function pointer type of `id`'s signature.
pub unsafe fn real<F: Copy>(id: Id) -> Option<F> {
    // SAFETY: per the contract.
    unsafe { REAL[id as usize].typed(|| crate::resolve::next_definition(id.info().c_name())) }
}

/// The real function's address, when the slot is already known (no resolution attempted).
pub fn known_real(id: Id) -> *mut c_void {
    REAL[id as usize].known()
}

/// Routing met the real function behind `id` (through `dlsym` or `cuGetProcAddress`).
/// Returns false if a different function is already recorded as the real one: then the
/// caller must not hand out our hook for `p`, since the hook would call the other function.
pub fn learn_real(id: Id, p: *mut c_void) -> bool {
    REAL[id as usize].learn(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_names_drop_version_and_ptsz_suffixes() {
        let base = |id: Id| id.info().base_name();
        assert_eq!(base(Id::cuMemAlloc_v2), "cuMemAlloc");
        assert_eq!(base(Id::cuMemAllocAsync_ptsz), "cuMemAllocAsync");
        assert_eq!(base(Id::cuGetProcAddress_v2), "cuGetProcAddress");
        assert_eq!(base(Id::cuMemCreate), "cuMemCreate");
        assert!(Id::cuMemFreeAsync_ptsz.info().is_ptsz());
        assert_eq!(Id::by_name(b"cuMemMap"), Some(Id::cuMemMap));
    }
}
