/*
 * prog_dlsym / prog_dlsym_old: JAX/XLA-like.  Does not link libcuda; it
 * dlopen()s libcuda.so.1 and calls everything through dlsym() pointers.
 * prog_dlsym_old is built with -DEMU_OLD_DLSYM so its dlsym reference binds
 * to the compat version dlsym@GLIBC_2.2.5 instead of dlsym@GLIBC_2.34.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#ifdef EMU_OLD_DLSYM
__asm__(".symver dlsym, dlsym@GLIBC_2.2.5");
#endif

#include "cuda.h" /* types only: nothing here references a cu* symbol */
#include "testlog.h"

#ifndef PROG_NAME
#define PROG_NAME "prog_dlsym"
#endif

static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemGetInfo_v2)(size_t *, size_t *);
    CUresult (*MemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*MemFree_v2)(CUdeviceptr);
    CUresult (*MemHostAlloc)(void **, size_t, unsigned);
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} cu;

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

#define LOAD(h, field, name) (*(void **)&cu.field = sym(h, name))

static void load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: dlopen(libcuda.so.1): %s\n", dlerror());
        exit(1);
    }
    LOAD(h, Init, "cuInit");
    LOAD(h, DeviceGet, "cuDeviceGet");
    LOAD(h, PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(h, CtxSetCurrent, "cuCtxSetCurrent");
    LOAD(h, MemGetInfo_v2, "cuMemGetInfo_v2");
    LOAD(h, MemAlloc_v2, "cuMemAlloc_v2");
    LOAD(h, MemFree_v2, "cuMemFree_v2");
    LOAD(h, MemHostAlloc, "cuMemHostAlloc");
    LOAD(h, MemFreeHost, "cuMemFreeHost");
    LOAD(h, MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    LOAD(h, MemCreate, "cuMemCreate");
    LOAD(h, MemRelease, "cuMemRelease");
    LOAD(h, MemAddressReserve, "cuMemAddressReserve");
    LOAD(h, MemAddressFree, "cuMemAddressFree");
    LOAD(h, MemMap, "cuMemMap");
    LOAD(h, MemUnmap, "cuMemUnmap");
    LOAD(h, MemSetAccess, "cuMemSetAccess");
}

static void setup_context(void)
{
    CUdevice d;
    CUcontext ctx;
    MUST(cu.Init(0));
    MUST(cu.DeviceGet(&d, 0));
    MUST(cu.PrimaryCtxRetain(&ctx, d));
    MUST(cu.CtxSetCurrent(ctx));
}

static CUdeviceptr alloc_params(void)
{
    CUdeviceptr d = 0, t = 0;
    ALLOC("cuMemAlloc_v2", "device", cu.MemAlloc_v2(&d, 3 * MiB + 1024), d, 3 * MiB + 1024, 0, 0); /* leak #1 */
    ALLOC("cuMemAlloc_v2", "device", cu.MemAlloc_v2(&t, 1 * MiB + 1024), t, 1 * MiB + 1024, 0, 0);
    FREE("cuMemFree_v2", "device", cu.MemFree_v2(t), t, 0);
    return d;
}

static void *alloc_staging(void)
{
    void *a = NULL, *b = NULL;
    ALLOC("cuMemHostAlloc", "host", cu.MemHostAlloc(&a, 80 * KiB, 0), a, 80 * KiB, -1, 0);
    ALLOC("cuMemHostAlloc", "host", cu.MemHostAlloc(&b, 144 * KiB, CU_MEMHOSTALLOC_PORTABLE), b, 144 * KiB, -1, 0); /* leak #2 */
    memset(a, 3, 80 * KiB);
    FREE("cuMemFreeHost", "host", cu.MemFreeHost(a), a, 0);
    return b;
}

/* XLA's BFC allocator on top of the VMM API */
static void vmm_arena(void)
{
    CUmemAllocationProp prop;
    CUmemAccessDesc acc;
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, big = 0;
    CUdeviceptr va = 0;
    size_t gran = 0, total = 0, fr = 0, huge;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    MUST(cu.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    ALLOC("cuMemAddressReserve", "vmm_reserved", cu.MemAddressReserve(&va, 16 * gran, 0, 0, 0), va, 16 * gran, 0, 0);
    ALLOC("cuMemCreate", "vmm_physical", cu.MemCreate(&h1, 3 * gran, &prop, 0), h1, 3 * gran, 0, 0);
    ALLOC("cuMemCreate", "vmm_physical", cu.MemCreate(&h2, 5 * gran, &prop, 0), h2, 5 * gran, 0, 0);
    MAP(cu.MemMap(va, 3 * gran, 0, h1, 0), va, 3 * gran, h1, 0);
    MAP(cu.MemMap(va + 3 * gran, 5 * gran, 0, h2, 0), va + 3 * gran, 5 * gran, h2, 0);
    memset(&acc, 0, sizeof(acc));
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    MUST(cu.MemSetAccess(va, 8 * gran, &acc, 1));
    MUST(cu.MemGetInfo_v2(&fr, &total));
    huge = (total / gran + 1) * gran; /* more than the whole device */
    ALLOC("cuMemCreate", "vmm_physical", cu.MemCreate(&big, huge, &prop, 0), big, huge, 0, CUDA_ERROR_OUT_OF_MEMORY);
    UNMAP(cu.MemUnmap(va, 3 * gran), va, 3 * gran, 0);
    UNMAP(cu.MemUnmap(va + 3 * gran, 5 * gran), va + 3 * gran, 5 * gran, 0);
    FREE("cuMemRelease", "vmm_physical", cu.MemRelease(h1), h1, 0);
    FREE("cuMemRelease", "vmm_physical", cu.MemRelease(h2), h2, 0);
    FREE_SIZED("cuMemAddressFree", "vmm_reserved", cu.MemAddressFree(va, 16 * gran), va, 16 * gran, 0);
}

static void try_oom(void)
{
    CUdeviceptr d = 0;
    size_t fr = 0, total = 0, want;
    MUST(cu.MemGetInfo_v2(&fr, &total));
    want = total >= (2ULL << 30) ? 2 * total : (2ULL << 30);
    ALLOC("cuMemAlloc_v2", "device", cu.MemAlloc_v2(&d, want), d, want, 0, CUDA_ERROR_OUT_OF_MEMORY);
}

static void bad_free(void)
{
    FREE("cuMemFree_v2", "device", cu.MemFree_v2((CUdeviceptr)0x1234), 0x1234, CUDA_ERROR_INVALID_VALUE);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    load_driver();
    setup_context();
    alloc_params();
    alloc_staging();
    vmm_arena();
    try_oom();
    bad_free();
    printf("%s: done\n", PROG_NAME);
    return 0;
}
