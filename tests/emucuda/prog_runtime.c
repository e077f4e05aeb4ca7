/*
 * prog_runtime_dynamic / prog_runtime_static: exercises the CUDA runtime API.
 * Built twice from this file: against libcudart.so.13 (calls via the PLT) and
 * against libcudart_static.a (no cuda* symbol is exported by the program).
 */
#include <string.h>

#include "cuda_runtime.h"
#include "testlog.h"

#ifndef PROG_NAME
#define PROG_NAME "prog_runtime"
#endif

static int cur_device(void)
{
    int d = -1;
    MUST(cudaGetDevice(&d));
    return d;
}

static void *alloc_weights(void)
{
    void *p = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 3 * MiB), p, 3 * MiB, cur_device(), 0);
    return p; /* leaked on purpose (leak #1) */
}

static void alloc_scratch(void)
{
    void *p = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 1 * MiB), p, 1 * MiB, cur_device(), 0);
    FREE("cudaFree", "device", cudaFree(p), p, 0);
}

static void alloc_pitched(void)
{
    void *p = NULL;
    size_t pitch = 0;
    ALLOC("cudaMallocPitch", "device", cudaMallocPitch(&p, &pitch, 1000, 300), p, (pitch ? pitch : 1024) * 300, cur_device(), 0);
    if (pitch != 1024) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: unexpected pitch %zu\n", pitch);
        exit(1);
    }
    FREE("cudaFree", "device", cudaFree(p), p, 0);
}

static void alloc_volume(void)
{
    struct cudaPitchedPtr pp;
    memset(&pp, 0, sizeof(pp));
    ALLOC("cudaMalloc3D", "device", cudaMalloc3D(&pp, make_cudaExtent(700, 20, 10)), pp.ptr, pp.pitch * 20 * 10, cur_device(), 0);
    if (pp.pitch != 1024 || pp.xsize != 700 || pp.ysize != 20) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: unexpected cudaPitchedPtr\n");
        exit(1);
    }
    FREE("cudaFree", "device", cudaFree(pp.ptr), pp.ptr, 0);
}

static void alloc_managed(void)
{
    void *p = NULL;
    ALLOC("cudaMallocManaged", "managed", cudaMallocManaged(&p, 256 * KiB, cudaMemAttachGlobal), p, 256 * KiB, cur_device(), 0);
    memset(p, 0x5a, 256 * KiB); /* managed memory is host-accessible */
    FREE("cudaFree", "managed", cudaFree(p), p, 0);
}

static void alloc_pinned(void)
{
    void *a = NULL, *b = NULL;
    ALLOC("cudaMallocHost", "host", cudaMallocHost(&a, 64 * KiB), a, 64 * KiB, -1, 0);
    ALLOC("cudaHostAlloc", "host", cudaHostAlloc(&b, 128 * KiB, cudaHostAllocPortable), b, 128 * KiB, -1, 0);
    memset(a, 1, 64 * KiB);
    memset(b, 2, 128 * KiB);
    FREE("cudaFreeHost", "host", cudaFreeHost(a), a, 0);
    FREE("cudaFreeHost", "host", cudaFreeHost(b), b, 0);
}

static void alloc_async(void)
{
    cudaStream_t s = NULL;
    cudaMemPool_t pool = NULL;
    void *a = NULL, *b = NULL, *c = NULL;
    MUST(cudaStreamCreate(&s));
    MUST(cudaDeviceGetDefaultMemPool(&pool, cur_device()));
    ALLOC("cudaMallocAsync", "device", cudaMallocAsync(&a, 512 * KiB, s), a, 512 * KiB, cur_device(), 0);
    ALLOC("cudaMallocAsync_ptsz", "device", cudaMallocAsync_ptsz(&b, 768 * KiB, s), b, 768 * KiB, cur_device(), 0);
    ALLOC("cudaMallocFromPoolAsync", "device", cudaMallocFromPoolAsync(&c, 640 * KiB, pool, s), c, 640 * KiB, cur_device(), 0);
    FREE("cudaFreeAsync", "device", cudaFreeAsync(a, s), a, 0);
    FREE("cudaFreeAsync_ptsz", "device", cudaFreeAsync_ptsz(b, s), b, 0);
    FREE("cudaFreeAsync", "device", cudaFreeAsync(c, s), c, 0);
    MUST(cudaStreamSynchronize(s));
    MUST(cudaStreamDestroy(s));
}

static void leak_cache(void)
{
    void *p = NULL, *h = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 5 * MiB), p, 5 * MiB, cur_device(), 0); /* leak #2 */
    ALLOC("cudaMallocHost", "host", cudaMallocHost(&h, 96 * KiB), h, 96 * KiB, -1, 0); /* leak #3 (host) */
}

static void try_oom(void)
{
    size_t fr = 0, total = 0, want;
    void *p = NULL;
    MUST(cudaMemGetInfo(&fr, &total));
    want = total >= (2ULL << 30) ? 2 * total : (2ULL << 30); /* 2 GiB unless capacity is larger */
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, want), p, want, cur_device(), cudaErrorMemoryAllocation);
    if (cudaGetLastError() != cudaErrorMemoryAllocation) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: cudaGetLastError after OOM\n");
        exit(1);
    }
}

static void bad_free(void)
{
    FREE("cudaFree", "device", cudaFree((void *)0x1234), 0x1234, cudaErrorInvalidValue);
    (void)cudaGetLastError();
}

static void use_second_device(void)
{
    void *p = NULL, *q = NULL;
    MUST(cudaSetDevice(1));
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 2 * MiB), p, 2 * MiB, cur_device(), 0);
    ALLOC("cudaMalloc", "device", cudaMalloc(&q, 6 * MiB), q, 6 * MiB, cur_device(), 0); /* leak on device 1 */
    FREE("cudaFree", "device", cudaFree(p), p, 0);
    MUST(cudaSetDevice(0));
}

int main(void)
{
    int n = 0;
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cudaFree(0)); /* initialise the runtime, no free */
    MUST(cudaGetDeviceCount(&n));
    alloc_weights();
    alloc_scratch();
    alloc_pitched();
    alloc_volume();
    alloc_managed();
    alloc_pinned();
    alloc_async();
    leak_cache();
    try_oom();
    bad_free();
    if (n >= 2)
        use_second_device();
    MUST(cudaDeviceSynchronize());
    printf("%s: done devices=%d\n", PROG_NAME, n);
    return 0;
}
