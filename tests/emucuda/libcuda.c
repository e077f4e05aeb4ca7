/*
 * emucuda libcuda.so.1 — an emulated CUDA driver for gpumemtrace's tests.
 *
 * Device memory is fake: deterministic addresses that are never dereferenced,
 * with per-device capacity accounting.  Managed and pinned host memory is real
 * (mmap) so programs may touch it.  See README.md for the environment knobs.
 *
 * Interposition realism: every exported function is a thin wrapper over a
 * static helper, so no internal call goes through an exported (interposable)
 * symbol; the library is linked with -Bsymbolic-functions so the addresses
 * handed out by cuGetProcAddress are always this library's own definitions.
 */
#define _GNU_SOURCE
#include "cuda.h"

/* We define the real exported names ourselves, both v1 and v2. */
#undef cuDeviceTotalMem
#undef cuCtxCreate
#undef cuMemGetInfo
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemAllocHost
#undef cuCtxDestroy
#undef cuStreamDestroy
#undef cuDevicePrimaryCtxRelease
#undef cuGetProcAddress

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

#define MAXDEV 8
#define DEV_BASE 0x7f0000000000ULL
#define DEV_SPAN 0x1000000000ULL /* 64 GiB of fake VA per device */
#define VA_BASE 0x7e0000000000ULL
#define VA_SPAN 0x10000000000ULL /* 1 TiB of reservable VA */
#define DEV_ALIGN 512ULL
#define GRAN (2ULL << 20)
#define MAX_CAPACITY (32ULL << 30)
#define DRIVER_VERSION 13000

typedef unsigned long long u64;

/* ------------------------------------------------------------------ state */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int g_init;
static int g_ndev;
static u64 g_cap;

struct block {
    u64 addr, size;
};
struct heap {
    u64 base, span;
    struct block *b;
    size_t n, cap;
};
static struct heap dheap[MAXDEV];
static u64 dused[MAXDEV];
static struct heap vaheap; /* cuMemAddressReserve ranges */

enum { HK_PINNED = 1, HK_MANAGED = 2 };
struct hblk {
    void *p;
    size_t size, mapsize, acct;
    int kind, dev;
};
static struct hblk *hb;
static size_t hb_n, hb_cap;

struct vhandle {
    u64 handle, size, acct;
    int dev;
};
static struct vhandle *vh;
static size_t vh_n, vh_cap;
static u64 vh_next;

struct vmap {
    u64 va, size, handle;
};
static struct vmap *vm;
static size_t vm_n, vm_cap;

#define CTX_MAGIC 0xC7C7C7C7u
#define STREAM_MAGIC 0x57EA57EAu
#define POOL_MAGIC 0x9001F00Du

struct CUctx_st {
    unsigned magic;
    int dev;
    int refcount;
};
struct CUstream_st {
    unsigned magic;
    int dev;
};
struct CUmemPoolHandle_st {
    unsigned magic;
    int dev;
    int is_default;
};
static struct CUctx_st g_ctx[MAXDEV];
static struct CUmemPoolHandle_st g_pool[MAXDEV];
static __thread CUcontext t_cur;

#define GROW(arr, n, cap)                                                       \
    do {                                                                        \
        if ((n) == (cap)) {                                                     \
            size_t nc_ = (cap) ? (cap)*2 : 64;                                  \
            void *np_ = realloc((arr), nc_ * sizeof(*(arr)));                   \
            if (!np_)                                                           \
                abort();                                                        \
            (arr) = np_;                                                        \
            (cap) = nc_;                                                        \
        }                                                                       \
    } while (0)

static u64 align_up(u64 v, u64 a) { return (v + a - 1) & ~(a - 1); }

/* -------------------------------------------------------------- env/init */

static u64 parse_size(const char *s, u64 dflt)
{
    char *end;
    unsigned long long v;
    if (!s || !*s)
        return dflt;
    v = strtoull(s, &end, 10);
    if (end == s)
        goto bad;
    while (*end == ' ')
        end++;
    if (*end) {
        u64 mul;
        switch (toupper((unsigned char)*end)) {
        case 'K': mul = 1ULL << 10; break;
        case 'M': mul = 1ULL << 20; break;
        case 'G': mul = 1ULL << 30; break;
        case 'T': mul = 1ULL << 40; break;
        default: goto bad;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
        if (*end)
            goto bad;
        v *= mul;
    }
    return v;
bad:
    fprintf(stderr, "emucuda: cannot parse size '%s', using %llu\n", s, dflt);
    return dflt;
}

/*
 * Fake device addresses live in the normal x86_64 mmap area (0x7e../0x7f..),
 * so real host mappings (ours: managed/pinned memory, or anybody's) could
 * land on the same numbers.  Reserve the part of each fake range we can hand
 * out as PROT_NONE, 1 GiB at a time, never replacing an existing mapping.
 * Chunks already in use are skipped.  A side effect: dereferencing a fake
 * device pointer faults, as it would on a real GPU.
 */
static void reserve_fake_range(u64 base, u64 len)
{
    const u64 chunk = 1ULL << 30;
    u64 a;
    for (a = base; a < base + len; a += chunk) {
        void *want = (void *)(uintptr_t)a;
        void *p = mmap(want, chunk, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0);
        if (p != MAP_FAILED && p != want)
            munmap(p, chunk); /* old kernel: treated as a hint */
    }
}

static void init_locked(void)
{
    const char *e;
    int i;
    if (g_init)
        return;
    g_ndev = 1;
    e = getenv("EMUCUDA_DEVICES");
    if (e && *e) {
        g_ndev = atoi(e);
        if (g_ndev < 0)
            g_ndev = 0;
        if (g_ndev > MAXDEV)
            g_ndev = MAXDEV;
    }
    g_cap = parse_size(getenv("EMUCUDA_CAPACITY"), 1ULL << 30);
    if (g_cap > MAX_CAPACITY)
        g_cap = MAX_CAPACITY;
    for (i = 0; i < MAXDEV; i++) {
        dheap[i].base = DEV_BASE + (u64)i * DEV_SPAN;
        dheap[i].span = DEV_SPAN;
        g_ctx[i].magic = CTX_MAGIC;
        g_ctx[i].dev = i;
        g_pool[i].magic = POOL_MAGIC;
        g_pool[i].dev = i;
        g_pool[i].is_default = 1;
    }
    vaheap.base = VA_BASE;
    vaheap.span = VA_SPAN;
    for (i = 0; i < g_ndev; i++) {
        u64 len = align_up(2 * g_cap + (1ULL << 30), 1ULL << 30);
        reserve_fake_range(dheap[i].base, len < DEV_SPAN ? len : DEV_SPAN);
    }
    reserve_fake_range(VA_BASE, 64ULL << 30);
    vh_next = 0x10000;
    g_init = 1;
}

#define REQUIRE_INIT()                                                          \
    do {                                                                        \
        if (!g_init) {                                                          \
            pthread_mutex_unlock(&mu);                                          \
            return CUDA_ERROR_NOT_INITIALIZED;                                  \
        }                                                                       \
    } while (0)

static int cur_dev(void) { return t_cur ? t_cur->dev : 0; }

/* ------------------------------------------------------------------ heaps */

/* index of the block starting at addr, or -1 */
static long heap_find(const struct heap *h, u64 addr)
{
    size_t lo = 0, hi = h->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (h->b[mid].addr == addr)
            return (long)mid;
        if (h->b[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

static void heap_insert(struct heap *h, size_t i, u64 addr, u64 size)
{
    GROW(h->b, h->n, h->cap);
    memmove(&h->b[i + 1], &h->b[i], (h->n - i) * sizeof(h->b[0]));
    h->b[i].addr = addr;
    h->b[i].size = size;
    h->n++;
}

static void heap_remove(struct heap *h, size_t i)
{
    memmove(&h->b[i], &h->b[i + 1], (h->n - i - 1) * sizeof(h->b[0]));
    h->n--;
}

/* first fit (lowest address) with alignment; hint: try that address first */
static int heap_alloc(struct heap *h, u64 size, u64 align, u64 hint, u64 *out)
{
    u64 cur, end = h->base + h->span;
    size_t i;
    if (hint && hint % align == 0 && hint >= h->base && hint + size <= end) {
        for (i = 0; i < h->n && h->b[i].addr < hint; i++)
            ;
        if ((i == 0 || h->b[i - 1].addr + h->b[i - 1].size <= hint) &&
            (i == h->n || hint + size <= h->b[i].addr)) {
            heap_insert(h, i, hint, size);
            *out = hint;
            return 0;
        }
    }
    cur = align_up(h->base, align);
    for (i = 0; i < h->n; i++) {
        if (cur + size <= h->b[i].addr)
            break;
        if (h->b[i].addr + h->b[i].size > cur)
            cur = align_up(h->b[i].addr + h->b[i].size, align);
    }
    if (cur + size > end)
        return -1;
    heap_insert(h, i, cur, size);
    *out = cur;
    return 0;
}

/* ----------------------------------------------------------- device memory */

static CUresult dev_alloc_locked(int dev, size_t size, CUdeviceptr *out)
{
    u64 rs, addr;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    rs = align_up(size, DEV_ALIGN);
    if (rs < size || dused[dev] + rs > g_cap)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (heap_alloc(&dheap[dev], rs, DEV_ALIGN, 0, &addr) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    dused[dev] += rs;
    *out = addr;
    return CUDA_SUCCESS;
}

static long hb_find(const void *p, int kind)
{
    size_t i;
    for (i = 0; i < hb_n; i++)
        if (hb[i].p == p && (hb[i].kind & kind))
            return (long)i;
    return -1;
}

static void hb_remove(size_t i)
{
    munmap(hb[i].p, hb[i].mapsize);
    if (hb[i].kind == HK_MANAGED)
        dused[hb[i].dev] -= hb[i].acct;
    hb[i] = hb[--hb_n];
}

static CUresult dev_free_locked(CUdeviceptr p)
{
    int d;
    long i;
    if (p == 0)
        return CUDA_SUCCESS;
    i = hb_find((void *)(uintptr_t)p, HK_MANAGED);
    if (i >= 0) {
        hb_remove((size_t)i);
        return CUDA_SUCCESS;
    }
    for (d = 0; d < g_ndev; d++) {
        if (p >= dheap[d].base && p < dheap[d].base + dheap[d].span) {
            i = heap_find(&dheap[d], p);
            if (i < 0)
                return CUDA_ERROR_INVALID_VALUE;
            dused[d] -= dheap[d].b[i].size;
            heap_remove(&dheap[d], (size_t)i);
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult host_alloc_locked(void **pp, size_t size, int kind, int dev)
{
    size_t ms;
    u64 acct = 0;
    void *p;
    if (!pp || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (kind == HK_MANAGED) {
        acct = align_up(size, DEV_ALIGN);
        if (dused[dev] + acct > g_cap)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    ms = align_up(size, (u64)sysconf(_SC_PAGESIZE));
    p = mmap(NULL, ms, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    GROW(hb, hb_n, hb_cap);
    hb[hb_n].p = p;
    hb[hb_n].size = size;
    hb[hb_n].mapsize = ms;
    hb[hb_n].acct = acct;
    hb[hb_n].kind = kind;
    hb[hb_n].dev = dev;
    hb_n++;
    dused[dev] += acct;
    *pp = p;
    return CUDA_SUCCESS;
}

/* EMUCUDA_UNLOCKED=1 (throughput benchmarks only): cuMemAlloc_v2/cuMemFree_v2 keep no books
 * and take no lock: each thread hands out addresses from its own 1 GiB stretch of the fake
 * range and every free succeeds, so several threads measure the tracer, not this emulator's
 * mutex. Addresses are unique per thread and never reused. */
static int g_unlocked = -1;
static __thread u64 t_next;
static u64 g_stretch;

static int unlocked(void)
{
    if (__builtin_expect(g_unlocked < 0, 0)) {
        const char *e = getenv("EMUCUDA_UNLOCKED");
        g_unlocked = e && *e == '1';
    }
    return g_unlocked;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size, int dev_or_cur)
{
    CUresult r;
    CUdeviceptr p;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    if (unlocked() && dev_or_cur < 0) {
        if (!g_init)
            return CUDA_ERROR_NOT_INITIALIZED;
        if (!t_next)
            t_next = VA_BASE + (__atomic_fetch_add(&g_stretch, 1, __ATOMIC_RELAXED) % 64) * (1ULL << 30);
        *dptr = t_next;
        t_next += align_up(size ? size : 1, DEV_ALIGN);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    r = dev_alloc_locked(dev_or_cur < 0 ? cur_dev() : dev_or_cur, size, &p);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

static CUresult mem_free(CUdeviceptr p)
{
    CUresult r;
    if (unlocked())
        return g_init ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    r = dev_free_locked(p);
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned es)
{
    size_t pi;
    CUresult r;
    if (!dptr || !pitch || w == 0 || h == 0 || (es != 4 && es != 8 && es != 16))
        return CUDA_ERROR_INVALID_VALUE;
    pi = align_up(w, DEV_ALIGN);
    if (h > (size_t)-1 / pi)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = mem_alloc(dptr, pi * h, -1);
    if (r == CUDA_SUCCESS)
        *pitch = pi;
    return r;
}

static CUresult mem_alloc_managed(CUdeviceptr *dptr, size_t size, unsigned flags)
{
    CUresult r;
    void *p = NULL;
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    r = host_alloc_locked(&p, size, HK_MANAGED, cur_dev());
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return r;
}

static CUresult mem_host_alloc(void **pp, size_t size)
{
    CUresult r;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    r = host_alloc_locked(pp, size, HK_PINNED, 0);
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult mem_free_host(void *p)
{
    long i;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    i = hb_find(p, HK_PINNED);
    if (i >= 0) {
        hb_remove((size_t)i);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult mem_get_info(size_t *fr, size_t *total)
{
    int d;
    if (!fr || !total)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    d = cur_dev();
    *fr = (size_t)(g_cap - dused[d]);
    *total = (size_t)g_cap;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* --------------------------------------------------- streams and pools */

/* device of a stream, or -1 if the handle is bogus; caller holds mu */
static int stream_dev_locked(CUstream s)
{
    if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD)
        return cur_dev();
    if (s->magic != STREAM_MAGIC)
        return -1;
    return s->dev;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s, int use_pool)
{
    CUresult r;
    CUdeviceptr p;
    int dev;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    dev = stream_dev_locked(s);
    if (dev < 0) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (use_pool) {
        if (!pool || pool->magic != POOL_MAGIC) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_INVALID_VALUE;
        }
        dev = pool->dev;
    }
    r = dev_alloc_locked(dev, size, &p);
    pthread_mutex_unlock(&mu);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

static CUresult free_async(CUdeviceptr p, CUstream s)
{
    CUresult r;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    if (stream_dev_locked(s) < 0)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        r = dev_free_locked(p);
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult stream_create(CUstream *ps, unsigned flags)
{
    struct CUstream_st *s;
    (void)flags;
    if (!ps)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    s = malloc(sizeof(*s));
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = STREAM_MAGIC;
    s->dev = cur_dev();
    *ps = s;
    return CUDA_SUCCESS;
}

static CUresult stream_destroy(CUstream s)
{
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD || s->magic != STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- VMM */

static CUresult vmm_granularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags opt)
{
    (void)opt;
    if (!g || !prop)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id < 0 ||
        prop->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *g = GRAN;
    return CUDA_SUCCESS;
}

static CUresult vmm_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                           unsigned long long flags)
{
    int dev;
    if (!h || !prop || flags != 0 || size == 0 || size % GRAN != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    dev = prop->location.id;
    if (dev < 0 || dev >= g_ndev) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (dused[dev] + size > g_cap) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    GROW(vh, vh_n, vh_cap);
    vh[vh_n].handle = vh_next;
    vh[vh_n].size = size;
    vh[vh_n].acct = size;
    vh[vh_n].dev = dev;
    vh_n++;
    vh_next += 16;
    dused[dev] += size;
    *h = vh[vh_n - 1].handle;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

static long vh_find(u64 handle)
{
    size_t i;
    for (i = 0; i < vh_n; i++)
        if (vh[i].handle == handle)
            return (long)i;
    return -1;
}

static CUresult vmm_release(CUmemGenericAllocationHandle h)
{
    long i;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    i = vh_find(h);
    if (i >= 0) {
        dused[vh[i].dev] -= vh[i].acct;
        vh[i] = vh[--vh_n];
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    u64 out;
    int rc;
    if (!ptr || size == 0 || size % GRAN != 0 || flags != 0 || (align & (align - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (align < GRAN)
        align = GRAN;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    rc = heap_alloc(&vaheap, size, align, addr, &out);
    pthread_mutex_unlock(&mu);
    if (rc != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = out;
    return CUDA_SUCCESS;
}

static CUresult vmm_addr_free(CUdeviceptr ptr, size_t size)
{
    long i;
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    i = heap_find(&vaheap, ptr);
    if (i >= 0 && vaheap.b[i].size == size) {
        heap_remove(&vaheap, (size_t)i);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&mu);
    return r;
}

/* is [va, va+size) inside one reservation?  caller holds mu */
static int in_reservation_locked(u64 va, u64 size)
{
    size_t i;
    for (i = 0; i < vaheap.n; i++)
        if (va >= vaheap.b[i].addr && va + size <= vaheap.b[i].addr + vaheap.b[i].size)
            return 1;
    return 0;
}

static CUresult vmm_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                        unsigned long long flags)
{
    long hi;
    size_t i;
    CUresult r = CUDA_SUCCESS;
    if (size == 0 || flags != 0 || va % GRAN || size % GRAN || offset % GRAN)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    hi = vh_find(h);
    if (hi < 0 || offset + size > vh[hi].size || !in_reservation_locked(va, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (i = 0; i < vm_n; i++)
        if (va < vm[i].va + vm[i].size && vm[i].va < va + size) {
            r = CUDA_ERROR_INVALID_VALUE; /* already mapped */
            goto out;
        }
    GROW(vm, vm_n, vm_cap);
    vm[vm_n].va = va;
    vm[vm_n].size = size;
    vm[vm_n].handle = h;
    vm_n++;
out:
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult vmm_unmap(CUdeviceptr va, size_t size)
{
    size_t i;
    int found = 0;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    for (i = 0; i < vm_n;) {
        if (vm[i].va >= va && vm[i].va + vm[i].size <= va + size) {
            vm[i] = vm[--vm_n];
            found = 1;
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&mu);
    return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static CUresult vmm_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    size_t i;
    CUresult r = CUDA_SUCCESS;
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    REQUIRE_INIT();
    for (i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= g_ndev)
            r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS && !in_reservation_locked(va, size))
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    return r;
}

/* ------------------------------------------------------- init / devices */

static CUresult do_init(unsigned flags)
{
    int n;
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    init_locked();
    n = g_ndev;
    pthread_mutex_unlock(&mu);
    return n > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static CUresult device_get(CUdevice *d, int ordinal)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

static CUresult device_count(int *c)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    *c = g_ndev;
    return CUDA_SUCCESS;
}

static CUresult device_total_mem(size_t *b, CUdevice dev)
{
    if (!b)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *b = (size_t)g_cap;
    return CUDA_SUCCESS;
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    g_ctx[dev].refcount++;
    pthread_mutex_unlock(&mu);
    *pctx = &g_ctx[dev];
    return CUDA_SUCCESS;
}

static CUresult primary_release(CUdevice dev)
{
    CUresult r = CUDA_SUCCESS;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mu);
    if (g_ctx[dev].refcount > 0)
        g_ctx[dev].refcount--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&mu);
    return r;
}

static CUresult ctx_set_current(CUcontext c)
{
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (c && (c < &g_ctx[0] || c >= &g_ctx[g_ndev] || c->magic != CTX_MAGIC))
        return CUDA_ERROR_INVALID_CONTEXT;
    t_cur = c;
    return CUDA_SUCCESS;
}

static CUresult ctx_get_current(CUcontext *pc)
{
    if (!pc)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    *pc = t_cur;
    return CUDA_SUCCESS;
}

static CUresult ctx_get_device(CUdevice *d)
{
    if (!d)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    *d = cur_dev(); /* emucuda: no current context means device 0 */
    return CUDA_SUCCESS;
}

static CUresult default_pool(CUmemoryPool *p, CUdevice dev)
{
    if (!p)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *p = &g_pool[dev];
    return CUDA_SUCCESS;
}

static CUresult pool_create(CUmemoryPool *p, const CUmemPoolProps *props)
{
    struct CUmemPoolHandle_st *np;
    if (!p || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (props->location.id < 0 || props->location.id >= g_ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    np = malloc(sizeof(*np));
    if (!np)
        return CUDA_ERROR_OUT_OF_MEMORY;
    np->magic = POOL_MAGIC;
    np->dev = props->location.id;
    np->is_default = 0;
    *p = np;
    return CUDA_SUCCESS;
}

static CUresult pool_destroy(CUmemoryPool p)
{
    if (!g_init)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!p || p->magic != POOL_MAGIC || p->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    p->magic = 0;
    free(p);
    return CUDA_SUCCESS;
}

/* ----------------------------------------------------------------- errors */

static const struct {
    CUresult code;
    const char *name, *str;
} errtab[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult err_lookup(CUresult e, const char **out, int want_name)
{
    size_t i;
    if (!out)
        return CUDA_ERROR_INVALID_VALUE;
    for (i = 0; i < sizeof(errtab) / sizeof(errtab[0]); i++)
        if (errtab[i].code == e) {
            *out = want_name ? errtab[i].name : errtab[i].str;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ========================================================= exported API */

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) { return err_lookup(e, s, 0); }
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) { return err_lookup(e, s, 1); }
EXPORT CUresult cuInit(unsigned int flags) { return do_init(flags); }
EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v)
        return CUDA_ERROR_INVALID_VALUE;
    *v = DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) { return device_get(d, ordinal); }
EXPORT CUresult cuDeviceGetCount(int *c) { return device_count(c); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *b, CUdevice dev) { return device_total_mem(b, dev); }
EXPORT CUresult cuDeviceTotalMem(unsigned int *b, CUdevice dev)
{
    (void)b, (void)dev;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { return primary_retain(c, d); }
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { return primary_release(d); }
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return primary_release(d); }
EXPORT CUresult cuCtxSetCurrent(CUcontext c) { return ctx_set_current(c); }
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { return ctx_get_current(c); }
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { return ctx_get_device(d); }

EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { return mem_get_info(f, t); }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *d, size_t n) { return mem_alloc(d, n, -1); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return mem_free(p); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *d, size_t *pitch, size_t w, size_t h, unsigned int es)
{
    return mem_alloc_pitch(d, pitch, w, h, es);
}
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t n) { return mem_host_alloc(pp, n); }
EXPORT CUresult cuMemHostAlloc(void **pp, size_t n, unsigned int flags)
{
    (void)flags;
    return mem_host_alloc(pp, n);
}
EXPORT CUresult cuMemFreeHost(void *p) { return mem_free_host(p); }
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *d, size_t n, unsigned int flags) { return mem_alloc_managed(d, n, flags); }

/* legacy 32-bit (pre-3.2) ABI: exported like the real driver, not supported */
EXPORT CUresult cuMemGetInfo(unsigned int *f, unsigned int *t)
{
    (void)f, (void)t;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemAlloc(unsigned int *d, unsigned int n)
{
    (void)d, (void)n;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemFree(unsigned int p)
{
    (void)p;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemAllocPitch(unsigned int *d, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int es)
{
    (void)d, (void)pitch, (void)w, (void)h, (void)es;
    return CUDA_ERROR_NOT_SUPPORTED;
}
EXPORT CUresult cuMemAllocHost(void **pp, unsigned int n)
{
    (void)pp, (void)n;
    return CUDA_ERROR_NOT_SUPPORTED;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, NULL, s, 0); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return alloc_async(d, n, NULL, s, 0); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(p, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(p, s); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s)
{
    return alloc_async(d, n, pool, s, 1);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool pool, CUstream s)
{
    return alloc_async(d, n, pool, s, 1);
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *p, CUdevice d) { return default_pool(p, d); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *p, const CUmemPoolProps *props) { return pool_create(p, props); }
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p) { return pool_destroy(p); }

EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) { return stream_create(s, flags); }
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { return stream_destroy(s); }
EXPORT CUresult cuStreamDestroy(CUstream s) { return stream_destroy(s); }

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags opt)
{
    return vmm_granularity(g, prop, opt);
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                            unsigned long long flags)
{
    return vmm_create(h, n, prop, flags);
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return vmm_release(h); }
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t n, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    return vmm_reserve(p, n, align, addr, flags);
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n) { return vmm_addr_free(p, n); }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags)
{
    return vmm_map(p, n, off, h, flags);
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) { return vmm_unmap(p, n); }
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t n, const CUmemAccessDesc *desc, size_t count)
{
    return vmm_set_access(p, n, desc, count);
}

/* ------------------------------------------------------ cuGetProcAddress */

struct proc_entry {
    const char *name; /* base name, as callers pass it */
    int minver;       /* CUDA version that introduced the function */
    void *fn;         /* newest ABI */
    void *ptsz;       /* per-thread-default-stream twin, or NULL */
    int v2ver;        /* version from which fn applies; below it v1fn */
    void *v1fn;
};

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st);

#define F(x) ((void *)&(x))
static const struct proc_entry proc_table[] = {
    {"cuGetErrorString", 6000, F(cuGetErrorString), NULL, 0, NULL},
    {"cuGetErrorName", 6000, F(cuGetErrorName), NULL, 0, NULL},
    {"cuInit", 2000, F(cuInit), NULL, 0, NULL},
    {"cuDriverGetVersion", 2020, F(cuDriverGetVersion), NULL, 0, NULL},
    {"cuDeviceGet", 2000, F(cuDeviceGet), NULL, 0, NULL},
    {"cuDeviceGetCount", 2000, F(cuDeviceGetCount), NULL, 0, NULL},
    {"cuDeviceTotalMem", 2000, F(cuDeviceTotalMem_v2), NULL, 3020, F(cuDeviceTotalMem)},
    {"cuDevicePrimaryCtxRetain", 7000, F(cuDevicePrimaryCtxRetain), NULL, 0, NULL},
    {"cuDevicePrimaryCtxRelease", 7000, F(cuDevicePrimaryCtxRelease_v2), NULL, 11000, F(cuDevicePrimaryCtxRelease)},
    {"cuCtxSetCurrent", 4000, F(cuCtxSetCurrent), NULL, 0, NULL},
    {"cuCtxGetCurrent", 4000, F(cuCtxGetCurrent), NULL, 0, NULL},
    {"cuCtxGetDevice", 2000, F(cuCtxGetDevice), NULL, 0, NULL},
    {"cuMemGetInfo", 2000, F(cuMemGetInfo_v2), NULL, 3020, F(cuMemGetInfo)},
    {"cuMemAlloc", 2000, F(cuMemAlloc_v2), NULL, 3020, F(cuMemAlloc)},
    {"cuMemFree", 2000, F(cuMemFree_v2), NULL, 3020, F(cuMemFree)},
    {"cuMemAllocPitch", 2000, F(cuMemAllocPitch_v2), NULL, 3020, F(cuMemAllocPitch)},
    {"cuMemAllocHost", 2000, F(cuMemAllocHost_v2), NULL, 3020, F(cuMemAllocHost)},
    {"cuMemHostAlloc", 2020, F(cuMemHostAlloc), NULL, 0, NULL},
    {"cuMemFreeHost", 2000, F(cuMemFreeHost), NULL, 0, NULL},
    {"cuMemAllocManaged", 6000, F(cuMemAllocManaged), NULL, 0, NULL},
    {"cuMemAllocAsync", 11020, F(cuMemAllocAsync), F(cuMemAllocAsync_ptsz), 0, NULL},
    {"cuMemFreeAsync", 11020, F(cuMemFreeAsync), F(cuMemFreeAsync_ptsz), 0, NULL},
    {"cuMemAllocFromPoolAsync", 11020, F(cuMemAllocFromPoolAsync), F(cuMemAllocFromPoolAsync_ptsz), 0, NULL},
    {"cuDeviceGetDefaultMemPool", 11020, F(cuDeviceGetDefaultMemPool), NULL, 0, NULL},
    {"cuMemPoolCreate", 11020, F(cuMemPoolCreate), NULL, 0, NULL},
    {"cuMemPoolDestroy", 11020, F(cuMemPoolDestroy), NULL, 0, NULL},
    {"cuStreamCreate", 2000, F(cuStreamCreate), NULL, 0, NULL},
    {"cuStreamDestroy", 2000, F(cuStreamDestroy_v2), NULL, 4000, F(cuStreamDestroy)},
    {"cuMemGetAllocationGranularity", 10020, F(cuMemGetAllocationGranularity), NULL, 0, NULL},
    {"cuMemCreate", 10020, F(cuMemCreate), NULL, 0, NULL},
    {"cuMemRelease", 10020, F(cuMemRelease), NULL, 0, NULL},
    {"cuMemAddressReserve", 10020, F(cuMemAddressReserve), NULL, 0, NULL},
    {"cuMemAddressFree", 10020, F(cuMemAddressFree), NULL, 0, NULL},
    {"cuMemMap", 10020, F(cuMemMap), NULL, 0, NULL},
    {"cuMemUnmap", 10020, F(cuMemUnmap), NULL, 0, NULL},
    {"cuMemSetAccess", 10020, F(cuMemSetAccess), NULL, 0, NULL},
    {"cuGetProcAddress", 11030, F(cuGetProcAddress_v2), NULL, 12000, F(cuGetProcAddress)},
};

static CUresult get_proc(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    size_t i;
    const struct proc_entry *e = NULL;
    CUdriverProcAddressQueryResult dummy;
    if (!st)
        st = &dummy;
    if (!sym || !pfn || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    for (i = 0; i < sizeof(proc_table) / sizeof(proc_table[0]); i++)
        if (strcmp(proc_table[i].name, sym) == 0) {
            e = &proc_table[i];
            break;
        }
    if (!e) {
        *st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    if (ver < e->minver) {
        *st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
        return CUDA_ERROR_NOT_FOUND;
    }
    if (e->v2ver && ver < e->v2ver)
        *pfn = e->v1fn;
    else if (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM && e->ptsz)
        *pfn = e->ptsz;
    else
        *pfn = e->fn;
    *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *st)
{
    return get_proc(sym, pfn, ver, flags, st);
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags)
{
    return get_proc(sym, pfn, ver, flags, NULL);
}
