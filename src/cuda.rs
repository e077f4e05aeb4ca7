//! The few CUDA types the hooks need, laid out as in `cuda.h` / `cuda_runtime_api.h` (CUDA 12/13).
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_int, c_void};

/// Both `CUresult` and `cudaError_t` are C enums: `int` on every supported ABI.
pub type Status = c_int;
pub type CUdeviceptr = u64;
pub type CUstream = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type cudaStream_t = *mut c_void;
pub type cudaMemPool_t = *mut c_void;

pub const SUCCESS: Status = 0;
/// `CUDA_ERROR_NOT_INITIALIZED` / `cudaErrorInitializationError`: what a hook returns when the
/// real function cannot be found at all (nothing else can be done then).
pub const NOT_INITIALIZED: Status = 3;

/// `cudaExtent`, passed by value to `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaExtent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `cudaPitchedPtr`, filled in by `cudaMalloc3D`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct cudaPitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// The leading fields of `CUmemAllocationProp` (the rest is not read).
#[repr(C)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requested_handle_types: c_int,
    pub location_type: c_int,
    pub location_id: c_int,
}

/// `CU_MEM_LOCATION_TYPE_DEVICE`.
pub const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
/// `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` (and `cudaEnablePerThreadDefaultStream`).
pub const PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `c10::Device` as PyTorch passes it by value: two `int8_t`s (device type, index), one register.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct C10Device {
    pub type_: i8,
    pub index: i8,
}

/// `c10::DeviceType::CUDA`.
pub const C10_CUDA: i8 = 1;
