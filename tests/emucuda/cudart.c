/*
 * emucuda cudart — an emulated CUDA runtime (libcudart.so.13 and, built with
 * -DCUDART_STATIC -fvisibility=hidden, libcudart_static.a).
 *
 * Like the real runtime it never links libcuda: on first use it dlopen()s
 * libcuda.so.1, dlsym()s "cuGetProcAddress_v2" once, asks that for the
 * driver's own cuGetProcAddress, and resolves every other driver entry point
 * through it.  All driver calls go through the resolved pointers.
 */
#define _GNU_SOURCE
#include "cuda.h"
#include "cuda_runtime_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef CUDART_STATIC
#define CUDART_API __attribute__((visibility("hidden")))
#else
#define CUDART_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------- driver entry points */

typedef CUresult (*pfn_gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
    pfn_gpa_t getProcAddress;
    CUresult (*init)(unsigned);
    CUresult (*driverGetVersion)(int *);
    CUresult (*deviceGetCount)(int *);
    CUresult (*primaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*ctxSetCurrent)(CUcontext);
    CUresult (*ctxGetDevice)(CUdevice *);
    CUresult (*memGetInfo)(size_t *, size_t *);
    CUresult (*memAlloc)(CUdeviceptr *, size_t);
    CUresult (*memFree)(CUdeviceptr);
    CUresult (*memAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*memAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*memAllocHost)(void **, size_t);
    CUresult (*memHostAlloc)(void **, size_t, unsigned);
    CUresult (*memFreeHost)(void *);
    CUresult (*memAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*memFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*memFreeAsync_ptsz)(CUdeviceptr, CUstream);
    CUresult (*memAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*memAllocFromPoolAsync_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*deviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*streamCreate)(CUstream *, unsigned);
    CUresult (*streamDestroy)(CUstream);
} drv;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static cudaError_t init_err = cudaSuccess;
static int g_ndev;
static CUcontext g_primary[8];
static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;

static __thread int t_dev;             /* cudaSetDevice() */
static __thread int t_ctx_dev = -1;    /* device whose primary ctx is current here */
static __thread cudaError_t t_last;    /* cudaGetLastError() */

static int lookup(const char *name, void *slot, int ver, cuuint64_t flags)
{
    CUdriverProcAddressQueryResult st;
    void *p = NULL;
    if (drv.getProcAddress(name, &p, ver, flags, &st) != CUDA_SUCCESS || !p) {
        fprintf(stderr, "emucudart: driver lookup of %s (v%d, flags %llu) failed\n", name, ver,
                (unsigned long long)flags);
        return -1;
    }
    *(void **)slot = p;
    return 0;
}

static void do_init(void)
{
    void *h;
    pfn_gpa_t gpa;
    CUdriverProcAddressQueryResult st;
    void *p = NULL;
    int bad = 0;

    h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        init_err = cudaErrorInsufficientDriver;
        return;
    }
    gpa = (pfn_gpa_t)dlsym(h, "cuGetProcAddress_v2");
    if (!gpa) {
        init_err = cudaErrorInsufficientDriver;
        return;
    }
    /* get the driver's cuGetProcAddress through itself, then only use that */
    if (gpa("cuGetProcAddress", &p, 12000, 0, &st) != CUDA_SUCCESS || !p) {
        init_err = cudaErrorInsufficientDriver;
        return;
    }
    drv.getProcAddress = (pfn_gpa_t)p;

    bad |= lookup("cuInit", &drv.init, 2000, 0);
    bad |= lookup("cuDriverGetVersion", &drv.driverGetVersion, 2020, 0);
    bad |= lookup("cuDeviceGetCount", &drv.deviceGetCount, 2000, 0);
    bad |= lookup("cuDevicePrimaryCtxRetain", &drv.primaryCtxRetain, 7000, 0);
    bad |= lookup("cuCtxSetCurrent", &drv.ctxSetCurrent, 4000, 0);
    bad |= lookup("cuCtxGetDevice", &drv.ctxGetDevice, 2000, 0);
    bad |= lookup("cuMemGetInfo", &drv.memGetInfo, 3020, 0);
    bad |= lookup("cuMemAlloc", &drv.memAlloc, 3020, 0);
    bad |= lookup("cuMemFree", &drv.memFree, 3020, 0);
    bad |= lookup("cuMemAllocPitch", &drv.memAllocPitch, 3020, 0);
    bad |= lookup("cuMemAllocManaged", &drv.memAllocManaged, 6000, 0);
    bad |= lookup("cuMemAllocHost", &drv.memAllocHost, 3020, 0);
    bad |= lookup("cuMemHostAlloc", &drv.memHostAlloc, 2020, 0);
    bad |= lookup("cuMemFreeHost", &drv.memFreeHost, 2000, 0);
    bad |= lookup("cuMemAllocAsync", &drv.memAllocAsync, 11020, 0);
    bad |= lookup("cuMemAllocAsync", &drv.memAllocAsync_ptsz, 11020, 2);
    bad |= lookup("cuMemFreeAsync", &drv.memFreeAsync, 11020, 0);
    bad |= lookup("cuMemFreeAsync", &drv.memFreeAsync_ptsz, 11020, 2);
    bad |= lookup("cuMemAllocFromPoolAsync", &drv.memAllocFromPoolAsync, 11020, 0);
    bad |= lookup("cuMemAllocFromPoolAsync", &drv.memAllocFromPoolAsync_ptsz, 11020, 2);
    bad |= lookup("cuDeviceGetDefaultMemPool", &drv.deviceGetDefaultMemPool, 11020, 0);
    bad |= lookup("cuStreamCreate", &drv.streamCreate, 2000, 0);
    bad |= lookup("cuStreamDestroy", &drv.streamDestroy, 4000, 0);
    if (bad) {
        init_err = cudaErrorInsufficientDriver;
        return;
    }
    if (drv.init(0) != CUDA_SUCCESS || drv.deviceGetCount(&g_ndev) != CUDA_SUCCESS) {
        init_err = cudaErrorInitializationError;
        return;
    }
    if (g_ndev <= 0)
        init_err = cudaErrorNoDevice;
    if (g_ndev > 8)
        g_ndev = 8;
}

static cudaError_t map_err(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    default: return cudaErrorUnknown;
    }
}

static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess)
        t_last = e;
    return e;
}

/* lazy init + make this thread's device's primary context current */
static cudaError_t ensure(void)
{
    CUcontext c;
    CUresult r;
    pthread_once(&init_once, do_init);
    if (init_err != cudaSuccess)
        return init_err;
    if (t_ctx_dev == t_dev)
        return cudaSuccess;
    pthread_mutex_lock(&ctx_mu);
    c = g_primary[t_dev];
    if (!c) {
        r = drv.primaryCtxRetain(&c, t_dev);
        if (r != CUDA_SUCCESS) {
            pthread_mutex_unlock(&ctx_mu);
            return map_err(r);
        }
        g_primary[t_dev] = c;
    }
    pthread_mutex_unlock(&ctx_mu);
    r = drv.ctxSetCurrent(c);
    if (r != CUDA_SUCCESS)
        return map_err(r);
    t_ctx_dev = t_dev;
    return cudaSuccess;
}

#define ENSURE()                                                                \
    do {                                                                        \
        cudaError_t e_ = ensure();                                              \
        if (e_ != cudaSuccess)                                                  \
            return ret(e_);                                                     \
    } while (0)

#define DRV(call) ret(map_err(call))

/* ------------------------------------------------------ device management */

CUDART_API cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return ret(cudaErrorInvalidValue);
    pthread_once(&init_once, do_init);
    if (init_err != cudaSuccess) {
        *count = 0;
        return ret(init_err);
    }
    *count = g_ndev;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaSetDevice(int device)
{
    pthread_once(&init_once, do_init);
    if (init_err != cudaSuccess)
        return ret(init_err);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    t_dev = device;
    ENSURE();
    return cudaSuccess;
}

/* Peer access: every pair of distinct emulated devices can reach each other; enabling it twice
 * is an error, as on real devices.  Allocation is unaffected: memory stays on its own device. */
static int g_peer_enabled[8][8];

CUDART_API cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    pthread_once(&init_once, do_init);
    if (!can || device < 0 || device >= g_ndev || peer < 0 || peer >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    *can = device != peer;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags)
{
    ENSURE();
    if (flags != 0)
        return ret(cudaErrorInvalidValue);
    if (peer < 0 || peer >= g_ndev || peer == t_dev)
        return ret(cudaErrorInvalidDevice);
    if (g_peer_enabled[t_dev][peer])
        return ret((cudaError_t)704); /* cudaErrorPeerAccessAlreadyEnabled */
    g_peer_enabled[t_dev][peer] = 1;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return ret(cudaErrorInvalidValue);
    ENSURE();
    *device = t_dev;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceSynchronize(void)
{
    ENSURE();
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDriverGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    pthread_once(&init_once, do_init);
    if (!drv.driverGetVersion) {
        *v = 0;
        return cudaSuccess;
    }
    return DRV(drv.driverGetVersion(v));
}

CUDART_API cudaError_t cudaRuntimeGetVersion(int *v)
{
    if (!v)
        return ret(cudaErrorInvalidValue);
    *v = CUDART_VERSION;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device)
{
    ENSURE();
    if (!pool)
        return ret(cudaErrorInvalidValue);
    if (device < 0 || device >= g_ndev)
        return ret(cudaErrorInvalidDevice);
    return DRV(drv.deviceGetDefaultMemPool(pool, device));
}

CUDART_API cudaError_t cudaMemGetInfo(size_t *fr, size_t *total)
{
    ENSURE();
    return DRV(drv.memGetInfo(fr, total));
}

/* ---------------------------------------------------------------- errors */

CUDART_API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = t_last;
    t_last = cudaSuccess;
    return e;
}

CUDART_API cudaError_t cudaPeekAtLastError(void) { return t_last; }

CUDART_API const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorDeviceUninitialized: return "cudaErrorDeviceUninitialized";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
    }
}

CUDART_API const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorDeviceUninitialized: return "invalid device context";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorSymbolNotFound: return "named symbol not found";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
    }
}

/* ---------------------------------------------------------------- memory */

CUDART_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    CUdeviceptr d;
    CUresult r;
    ENSURE();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    r = drv.memAlloc(&d, size);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    return DRV(r);
}

CUDART_API cudaError_t cudaFree(void *devPtr)
{
    ENSURE(); /* cudaFree(0) only initialises */
    if (!devPtr)
        return cudaSuccess;
    return DRV(drv.memFree((CUdeviceptr)(uintptr_t)devPtr));
}

CUDART_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
    CUdeviceptr d;
    size_t p;
    CUresult r;
    ENSURE();
    if (!devPtr || !pitch)
        return ret(cudaErrorInvalidValue);
    r = drv.memAllocPitch(&d, &p, width, height, 16);
    if (r == CUDA_SUCCESS) {
        *devPtr = (void *)(uintptr_t)d;
        *pitch = p;
    }
    return DRV(r);
}

CUDART_API cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pp, struct cudaExtent ext)
{
    CUdeviceptr d;
    size_t p;
    CUresult r;
    ENSURE();
    if (!pp)
        return ret(cudaErrorInvalidValue);
    r = drv.memAllocPitch(&d, &p, ext.width, ext.height * ext.depth, 16);
    if (r == CUDA_SUCCESS)
        *pp = make_cudaPitchedPtr((void *)(uintptr_t)d, p, ext.width, ext.height);
    return DRV(r);
}

CUDART_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    CUdeviceptr d;
    CUresult r;
    ENSURE();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    r = drv.memAllocManaged(&d, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    return DRV(r);
}

CUDART_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    ENSURE();
    return DRV(drv.memAllocHost(ptr, size));
}

CUDART_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    ENSURE();
    return DRV(drv.memHostAlloc(pHost, size, flags));
}

CUDART_API cudaError_t cudaFreeHost(void *ptr)
{
    ENSURE();
    return DRV(drv.memFreeHost(ptr));
}

static cudaError_t malloc_async(CUresult (*fn)(CUdeviceptr *, size_t, CUstream), void **devPtr, size_t size,
                                cudaStream_t s)
{
    CUdeviceptr d;
    CUresult r;
    ENSURE();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    r = fn(&d, size, s);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    return DRV(r);
}

static cudaError_t malloc_pool_async(CUresult (*fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), void **devPtr,
                                     size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    CUdeviceptr d;
    CUresult r;
    ENSURE();
    if (!devPtr)
        return ret(cudaErrorInvalidValue);
    r = fn(&d, size, pool, s);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)d;
    return DRV(r);
}

static cudaError_t free_async(CUresult (*fn)(CUdeviceptr, CUstream), void *p, cudaStream_t s)
{
    ENSURE();
    return DRV(fn((CUdeviceptr)(uintptr_t)p, s));
}

CUDART_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s)
{
    ENSURE();
    return malloc_async(drv.memAllocAsync, devPtr, size, s);
}

CUDART_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s)
{
    ENSURE();
    return malloc_async(drv.memAllocAsync_ptsz, devPtr, size, s);
}

CUDART_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    ENSURE();
    return free_async(drv.memFreeAsync, p, s);
}

CUDART_API cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s)
{
    ENSURE();
    return free_async(drv.memFreeAsync_ptsz, p, s);
}

CUDART_API cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    ENSURE();
    return malloc_pool_async(drv.memAllocFromPoolAsync, p, size, pool, s);
}

CUDART_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s)
{
    ENSURE();
    return malloc_pool_async(drv.memAllocFromPoolAsync_ptsz, p, size, pool, s);
}

/* --------------------------------------------------------------- streams */

CUDART_API cudaError_t cudaStreamCreate(cudaStream_t *s)
{
    ENSURE();
    return DRV(drv.streamCreate(s, 0));
}

CUDART_API cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ENSURE();
    return DRV(drv.streamDestroy(s));
}

CUDART_API cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    ENSURE();
    return cudaSuccess;
}

/* ---------------------------------------------------- driver entry points */

static cudaError_t entry_point(const char *symbol, void **funcPtr, int ver, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status)
{
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    ENSURE();
    if (!symbol || !funcPtr || flags > cudaEnablePerThreadDefaultStream)
        return ret(cudaErrorInvalidValue);
    *funcPtr = NULL;
    /* like the real runtime: cudaSuccess with *funcPtr == NULL when absent */
    drv.getProcAddress(symbol, funcPtr, ver, (cuuint64_t)flags, &st);
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                               enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, status);
}

CUDART_API cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags ? flags : cudaEnablePerThreadDefaultStream, status);
}

CUDART_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                        unsigned long long flags,
                                                        enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, status);
}

CUDART_API cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                             unsigned int cudaVersion, unsigned long long flags,
                                                             enum cudaDriverEntryPointQueryResult *status)
{
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags ? flags : cudaEnablePerThreadDefaultStream,
                       status);
}
