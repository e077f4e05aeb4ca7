/*
 * prog_driver: links libcuda directly and calls the driver API through its
 * exported symbols (cuMemAlloc -> cuMemAlloc_v2 via the header macros, the
 * _ptsz twins by explicit name).
 */
#include <string.h>

#include "cuda.h"
#include "testlog.h"

static CUdevice dev0;

static void setup_context(void)
{
    CUcontext ctx = NULL;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev0, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev0));
    MUST(cuCtxSetCurrent(ctx));
}

static CUdeviceptr alloc_weights(void)
{
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, 3 * MiB + 512), d, 3 * MiB + 512, dev0, 0);
    return d; /* leaked on purpose (leak #1) */
}

static void alloc_scratch(void)
{
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, 1 * MiB + 512), d, 1 * MiB + 512, dev0, 0);
    FREE("cuMemFree_v2", "device", cuMemFree_v2(d), d, 0);
}

static void alloc_pitched(void)
{
    CUdeviceptr d = 0;
    size_t pitch = 0;
    ALLOC("cuMemAllocPitch_v2", "device", cuMemAllocPitch_v2(&d, &pitch, 1500, 200, 4), d, (pitch ? pitch : 1536) * 200, dev0, 0);
    if (pitch != 1536) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: unexpected pitch %zu\n", pitch);
        exit(1);
    }
    FREE("cuMemFree_v2", "device", cuMemFree_v2(d), d, 0);
}

static void alloc_managed(void)
{
    CUdeviceptr d = 0;
    ALLOC("cuMemAllocManaged", "managed", cuMemAllocManaged(&d, 320 * KiB, CU_MEM_ATTACH_GLOBAL), d, 320 * KiB, dev0, 0);
    memset((void *)(uintptr_t)d, 7, 320 * KiB);
    FREE("cuMemFree_v2", "managed", cuMemFree_v2(d), d, 0);
}

static void alloc_pinned(void)
{
    void *a = NULL, *b = NULL;
    ALLOC("cuMemAllocHost_v2", "host", cuMemAllocHost_v2(&a, 72 * KiB), a, 72 * KiB, -1, 0);
    ALLOC("cuMemHostAlloc", "host", cuMemHostAlloc(&b, 136 * KiB, CU_MEMHOSTALLOC_PORTABLE), b, 136 * KiB, -1, 0);
    memset(a, 1, 72 * KiB);
    memset(b, 2, 136 * KiB);
    FREE("cuMemFreeHost", "host", cuMemFreeHost(a), a, 0);
    FREE("cuMemFreeHost", "host", cuMemFreeHost(b), b, 0);
}

static CUdeviceptr alloc_async(void)
{
    CUstream s = NULL;
    CUmemoryPool pool = NULL;
    CUdeviceptr a = 0, b = 0, c = 0, leak = 0;
    MUST(cuStreamCreate(&s, 0));
    MUST(cuDeviceGetDefaultMemPool(&pool, dev0));
    ALLOC("cuMemAllocAsync", "device", cuMemAllocAsync(&a, 520 * KiB, s), a, 520 * KiB, dev0, 0);
    ALLOC("cuMemAllocAsync_ptsz", "device", cuMemAllocAsync_ptsz(&b, 776 * KiB, s), b, 776 * KiB, dev0, 0);
    ALLOC("cuMemAllocFromPoolAsync", "device", cuMemAllocFromPoolAsync(&c, 648 * KiB, pool, s), c, 648 * KiB, dev0, 0);
    ALLOC("cuMemAllocAsync_ptsz", "device", cuMemAllocAsync_ptsz(&leak, 904 * KiB, s), leak, 904 * KiB, dev0, 0); /* leak #2 */
    FREE("cuMemFreeAsync", "device", cuMemFreeAsync(a, s), a, 0);
    FREE("cuMemFreeAsync_ptsz", "device", cuMemFreeAsync_ptsz(b, s), b, 0);
    FREE("cuMemFreeAsync", "device", cuMemFreeAsync(c, s), c, 0);
    MUST(cuStreamDestroy(s));
    return leak;
}

static void vmm_roundtrip(void)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    size_t gran = 0, sz, resv;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev0;
    MUST(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    sz = 2 * gran;   /* 4 MiB physical */
    resv = 4 * gran; /* 8 MiB of VA */
    ALLOC("cuMemCreate", "vmm_physical", cuMemCreate(&h, sz, &prop, 0), h, sz, dev0, 0);
    ALLOC("cuMemAddressReserve", "vmm_reserved", cuMemAddressReserve(&va, resv, 0, 0, 0), va, resv, dev0, 0);
    MAP(cuMemMap(va, sz, 0, h, 0), va, sz, h, 0);
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(cuMemSetAccess(va, sz, &acc, 1));
    UNMAP(cuMemUnmap(va, sz), va, sz, 0);
    FREE("cuMemRelease", "vmm_physical", cuMemRelease(h), h, 0);
    FREE_SIZED("cuMemAddressFree", "vmm_reserved", cuMemAddressFree(va, resv), va, resv, 0);
}

static void try_oom(void)
{
    CUdeviceptr d = 0;
    size_t fr = 0, total = 0, want;
    MUST(cuMemGetInfo(&fr, &total));
    want = total >= (2ULL << 30) ? 2 * total : (2ULL << 30);
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, want), d, want, dev0, CUDA_ERROR_OUT_OF_MEMORY);
}

static void bad_free(void)
{
    FREE("cuMemFree_v2", "device", cuMemFree_v2((CUdeviceptr)0x1234), 0x1234, CUDA_ERROR_INVALID_VALUE);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    setup_context();
    alloc_weights();
    alloc_scratch();
    alloc_pitched();
    alloc_managed();
    alloc_pinned();
    alloc_async();
    vmm_roundtrip();
    try_oom();
    bad_free();
    printf("prog_driver: done\n");
    return 0;
}
