/*
 * emucuda: minimal stand-in for NVIDIA's cuda_runtime_api.h (+ the bits of
 * driver_types.h / driver_functions.h it needs), CUDA 12/13 ABI, C only.
 */
#ifndef EMUCUDA_CUDA_RUNTIME_API_H
#define EMUCUDA_CUDA_RUNTIME_API_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUDART_VERSION 13000
#define CUDARTAPI

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM) || defined(__CUDA_API_VERSION_INTERNAL)
#define __CUDART_API_PER_THREAD_DEFAULT_STREAM
#define __CUDART_API_PTDS(api) api##_ptds
#define __CUDART_API_PTSZ(api) api##_ptsz
#else
#define __CUDART_API_PTDS(api) api
#define __CUDART_API_PTSZ(api) api
#endif

#if defined(__CUDART_API_PER_THREAD_DEFAULT_STREAM)
#define cudaMallocAsync                  __CUDART_API_PTSZ(cudaMallocAsync)
#define cudaFreeAsync                    __CUDART_API_PTSZ(cudaFreeAsync)
#define cudaMallocFromPoolAsync          __CUDART_API_PTSZ(cudaMallocFromPoolAsync)
#define cudaGetDriverEntryPoint          __CUDART_API_PTSZ(cudaGetDriverEntryPoint)
#define cudaGetDriverEntryPointByVersion __CUDART_API_PTSZ(cudaGetDriverEntryPointByVersion)
#endif

/* ---- driver_types.h subset ---- */
enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInsufficientDriver = 35,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorDeviceUninitialized = 201,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorSymbolNotFound = 500,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999
};
typedef enum cudaError cudaError_t;

typedef struct CUstream_st *cudaStream_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;

#define cudaStreamLegacy    ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)

#define cudaHostAllocDefault       0x00
#define cudaHostAllocPortable      0x01
#define cudaHostAllocMapped        0x02
#define cudaHostAllocWriteCombined 0x04

#define cudaMemAttachGlobal 0x01
#define cudaMemAttachHost   0x02
#define cudaMemAttachSingle 0x04

enum cudaGetDriverEntryPointFlags {
    cudaEnableDefault = 0x0,
    cudaEnableLegacyStream = 0x1,
    cudaEnablePerThreadDefaultStream = 0x2
};

enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2 /* sic: real spelling */
};

struct cudaPitchedPtr {
    void *ptr;
    size_t pitch;
    size_t xsize;
    size_t ysize;
};

struct cudaExtent {
    size_t width;
    size_t height;
    size_t depth;
};

/* ---- driver_functions.h subset ---- */
static inline struct cudaExtent make_cudaExtent(size_t w, size_t h, size_t d)
{
    struct cudaExtent e;
    e.width = w;
    e.height = h;
    e.depth = d;
    return e;
}

static inline struct cudaPitchedPtr make_cudaPitchedPtr(void *d, size_t p, size_t xsz, size_t ysz)
{
    struct cudaPitchedPtr s;
    s.ptr = d;
    s.pitch = p;
    s.xsize = xsz;
    s.ysize = ysz;
    return s;
}

/* ---- runtime API ---- */
extern cudaError_t CUDARTAPI cudaDeviceSynchronize(void);
extern cudaError_t CUDARTAPI cudaGetLastError(void);
extern cudaError_t CUDARTAPI cudaPeekAtLastError(void);
extern const char *CUDARTAPI cudaGetErrorString(cudaError_t error);
extern const char *CUDARTAPI cudaGetErrorName(cudaError_t error);
extern cudaError_t CUDARTAPI cudaGetDeviceCount(int *count);
extern cudaError_t CUDARTAPI cudaSetDevice(int device);
extern cudaError_t CUDARTAPI cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice);
extern cudaError_t CUDARTAPI cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags);
extern cudaError_t CUDARTAPI cudaGetDevice(int *device);
extern cudaError_t CUDARTAPI cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device);
extern cudaError_t CUDARTAPI cudaDriverGetVersion(int *driverVersion);
extern cudaError_t CUDARTAPI cudaRuntimeGetVersion(int *runtimeVersion);

extern cudaError_t CUDARTAPI cudaStreamCreate(cudaStream_t *pStream);
extern cudaError_t CUDARTAPI cudaStreamDestroy(cudaStream_t stream);
extern cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t stream);

extern cudaError_t CUDARTAPI cudaMalloc(void **devPtr, size_t size);
extern cudaError_t CUDARTAPI cudaFree(void *devPtr);
extern cudaError_t CUDARTAPI cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
extern cudaError_t CUDARTAPI cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent);
extern cudaError_t CUDARTAPI cudaMallocManaged(void **devPtr, size_t size, unsigned int flags);
extern cudaError_t CUDARTAPI cudaMallocHost(void **ptr, size_t size);
extern cudaError_t CUDARTAPI cudaHostAlloc(void **pHost, size_t size, unsigned int flags);
extern cudaError_t CUDARTAPI cudaFreeHost(void *ptr);
extern cudaError_t CUDARTAPI cudaMemGetInfo(size_t *free, size_t *total);

extern cudaError_t CUDARTAPI cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream);
extern cudaError_t CUDARTAPI cudaFreeAsync(void *devPtr, cudaStream_t hStream);
extern cudaError_t CUDARTAPI cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);

extern cudaError_t CUDARTAPI cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus);
extern cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus);

/*
 * emucuda extension: the real header declares the _ptsz exports only via the
 * CUDA_API_PER_THREAD_DEFAULT_STREAM macros above; declared explicitly here
 * so test programs can call them by name.
 */
extern cudaError_t CUDARTAPI cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
extern cudaError_t CUDARTAPI cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
extern cudaError_t CUDARTAPI cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);
extern cudaError_t CUDARTAPI cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus);
extern cudaError_t CUDARTAPI cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags, enum cudaDriverEntryPointQueryResult *driverStatus);

#ifdef __cplusplus
}
#endif
#endif /* EMUCUDA_CUDA_RUNTIME_API_H */
