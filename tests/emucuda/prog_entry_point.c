/*
 * prog_entry_point: PyTorch-expandable-segments-like.  Links libcudart.so.13
 * only; obtains driver functions through cudaGetDriverEntryPointByVersion
 * (and the deprecated cudaGetDriverEntryPoint) and calls them by pointer.
 */
#include <string.h>

#include "cuda.h" /* types only */
#include "cuda_runtime.h"
#include "testlog.h"

static struct {
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t); /* resolves to cuMemAlloc_v2 */
    CUresult (*MemFree)(CUdeviceptr);            /* resolves to cuMemFree_v2 */
} drv;

static void get_entry(const char *name, void **slot, int by_version)
{
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e;
    if (by_version)
        e = cudaGetDriverEntryPointByVersion(name, slot, 12000, cudaEnableDefault, &st);
    else
        e = cudaGetDriverEntryPoint(name, slot, cudaEnableDefault, &st);
    if (e != cudaSuccess || st != cudaDriverEntryPointSuccess || !*slot) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: entry point %s: err=%d status=%d\n", name, e, st);
        exit(1);
    }
}

static void resolve_driver(void)
{
    void *p = (void *)1;
    enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSuccess;
    get_entry("cuMemGetAllocationGranularity", (void **)&drv.MemGetAllocationGranularity, 1);
    get_entry("cuMemCreate", (void **)&drv.MemCreate, 1);
    get_entry("cuMemRelease", (void **)&drv.MemRelease, 1);
    get_entry("cuMemAddressReserve", (void **)&drv.MemAddressReserve, 1);
    get_entry("cuMemAddressFree", (void **)&drv.MemAddressFree, 1);
    get_entry("cuMemMap", (void **)&drv.MemMap, 1);
    get_entry("cuMemUnmap", (void **)&drv.MemUnmap, 1);
    get_entry("cuMemSetAccess", (void **)&drv.MemSetAccess, 1);
    get_entry("cuMemFree", (void **)&drv.MemFree, 1);
    get_entry("cuMemAlloc", (void **)&drv.MemAlloc, 0); /* deprecated API, newest version */
    /* unknown symbol: cudaSuccess, NULL pointer, SymbolNotFound */
    MUST(cudaGetDriverEntryPoint("cuNoSuchFunction", &p, cudaEnableDefault, &st));
    if (p != NULL || st != cudaDriverEntryPointSymbolNotFound) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: unknown entry point resolved\n");
        exit(1);
    }
}

/* a growing segment: reserve a large VA range, map physical chunks on demand */
static void expandable_segment(int dev)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    CUmemGenericAllocationHandle h[3] = {0, 0, 0};
    CUmemGenericAllocationHandle leaked = 0;
    CUdeviceptr va = 0;
    size_t gran = 0, seg;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    MUST(drv.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    seg = 32 * gran;
    ALLOC("cuMemAddressReserve", "vmm_reserved", drv.MemAddressReserve(&va, seg, 0, 0, 0), va, seg, dev, 0);
    ALLOC("cuMemCreate", "vmm_physical", drv.MemCreate(&h[0], 1 * gran, &prop, 0), h[0], 1 * gran, dev, 0);
    ALLOC("cuMemCreate", "vmm_physical", drv.MemCreate(&h[1], 2 * gran, &prop, 0), h[1], 2 * gran, dev, 0);
    ALLOC("cuMemCreate", "vmm_physical", drv.MemCreate(&h[2], 6 * gran, &prop, 0), h[2], 6 * gran, dev, 0);
    MAP(drv.MemMap(va, 1 * gran, 0, h[0], 0), va, 1 * gran, h[0], 0);
    MAP(drv.MemMap(va + 1 * gran, 2 * gran, 0, h[1], 0), va + 1 * gran, 2 * gran, h[1], 0);
    MAP(drv.MemMap(va + 3 * gran, 6 * gran, 0, h[2], 0), va + 3 * gran, 6 * gran, h[2], 0);
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(drv.MemSetAccess(va, 9 * gran, &acc, 1));
    /* shrink: give back the last chunk */
    UNMAP(drv.MemUnmap(va + 3 * gran, 6 * gran), va + 3 * gran, 6 * gran, 0);
    FREE("cuMemRelease", "vmm_physical", drv.MemRelease(h[2]), h[2], 0);
    /* a chunk created and never mapped nor released: leak */
    ALLOC("cuMemCreate", "vmm_physical", drv.MemCreate(&leaked, 4 * gran, &prop, 0), leaked, 4 * gran, dev, 0);
    /* empty_cache(): unmap everything, release, free the VA */
    UNMAP(drv.MemUnmap(va, 3 * gran), va, 3 * gran, 0);
    FREE("cuMemRelease", "vmm_physical", drv.MemRelease(h[0]), h[0], 0);
    FREE("cuMemRelease", "vmm_physical", drv.MemRelease(h[1]), h[1], 0);
    FREE_SIZED("cuMemAddressFree", "vmm_reserved", drv.MemAddressFree(va, seg), va, seg, 0);
}

static CUdeviceptr driver_alloc(int dev)
{
    CUdeviceptr a = 0, b = 0;
    ALLOC("cuMemAlloc_v2", "device", drv.MemAlloc(&a, 7 * MiB + 512), a, 7 * MiB + 512, dev, 0);
    ALLOC("cuMemAlloc_v2", "device", drv.MemAlloc(&b, 9 * MiB + 512), b, 9 * MiB + 512, dev, 0); /* leak */
    FREE("cuMemFree_v2", "device", drv.MemFree(a), a, 0);
    return b;
}

static void runtime_alloc(int dev)
{
    void *p = NULL, *q = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 11 * MiB), p, 11 * MiB, dev, 0);
    ALLOC("cudaMalloc", "device", cudaMalloc(&q, 13 * MiB), q, 13 * MiB, dev, 0); /* leak */
    FREE("cudaFree", "device", cudaFree(p), p, 0);
}

static void try_oom(int dev)
{
    size_t fr = 0, total = 0, want;
    void *p = NULL;
    MUST(cudaMemGetInfo(&fr, &total));
    want = total >= (2ULL << 30) ? 2 * total : (2ULL << 30);
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, want), p, want, dev, cudaErrorMemoryAllocation);
}

static void bad_free(void)
{
    FREE("cudaFree", "device", cudaFree((void *)0x1234), 0x1234, cudaErrorInvalidValue);
}

int main(void)
{
    int dev = -1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cudaFree(0));
    MUST(cudaGetDevice(&dev));
    resolve_driver();
    expandable_segment(dev);
    driver_alloc(dev);
    runtime_alloc(dev);
    try_oom(dev);
    bad_free();
    printf("prog_entry_point: done\n");
    return 0;
}
