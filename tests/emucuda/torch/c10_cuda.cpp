// Emulated libc10_cuda.so: a small caching allocator with PyTorch's shape, seen from outside.
//
// - Blocks are rounded to 512 bytes and carved from segments: requests up to 1 MiB from 2 MiB
//   segments, up to 10 MiB from 20 MiB segments, larger ones from a segment of their own
//   (rounded to 2 MiB). Segments come from cudaMalloc and are only given back by empty_cache
//   (or when an allocation fails: then free segments are released and the request retried).
// - With expandable segments, each device has one large cuMemAddressReserve; 2 MiB pages are
//   cuMemCreate'd and cuMemMap'ped at its end as blocks need them.
// - Every block handed out or taken back is reported to c10::reportMemoryUsageToProfiler
//   (defined in libc10.so, called through the PLT) with the totals after the change; the old
//   signature is used when asked to (torch before 1.10).
// Counters are exact, like torch.cuda.memory_allocated/memory_reserved/max_memory_allocated.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>

#include "cuda.h"
#include "cuda_runtime.h"

namespace c10 {
struct Device {
    int8_t type;
    int8_t index;
};
void reportMemoryUsageToProfiler(void *ptr, long size, unsigned long allocated, unsigned long reserved, Device d);
void reportMemoryUsageToProfiler(void *ptr, long size, Device d);
} // namespace c10

namespace c10 { namespace cuda { namespace CUDACachingAllocator {

struct Block {
    uint64_t addr, size;
    bool free;
    uint64_t segment; // start of its segment
};

struct DeviceState {
    std::map<uint64_t, Block> blocks;      // by address, every block of every segment
    std::map<uint64_t, uint64_t> segments; // start -> size (classic segments)
    uint64_t allocated = 0, reserved = 0, max_allocated = 0, max_reserved = 0;
    // expandable segments
    CUdeviceptr va = 0;
    uint64_t va_size = 0, mapped = 0;
    std::map<uint64_t, CUmemGenericAllocationHandle> pages; // va -> handle
};

static std::mutex mu;
static DeviceState devs[8];
static bool expandable = getenv("EMU_TORCH_EXPANDABLE") && *getenv("EMU_TORCH_EXPANDABLE") == '1';
static bool old_api = getenv("EMU_TORCH_OLD_API") && *getenv("EMU_TORCH_OLD_API") == '1';
static const uint64_t MiB = 1 << 20, PAGE = 2 * MiB;

static int current_device()
{
    int d = 0;
    cudaGetDevice(&d);
    return d;
}

static void report(DeviceState &s, int dev, uint64_t addr, long size)
{
    if (s.reserved > s.max_reserved)
        s.max_reserved = s.reserved;
    c10::Device d{1, (int8_t)dev};
    if (old_api)
        c10::reportMemoryUsageToProfiler((void *)addr, size, d);
    else
        c10::reportMemoryUsageToProfiler((void *)addr, size, s.allocated, s.reserved, d);
}

static uint64_t round_block(uint64_t n) { return n < 512 ? 512 : (n + 511) / 512 * 512; }
static uint64_t segment_size(uint64_t n)
{
    if (n <= MiB)
        return 2 * MiB;
    if (n < 10 * MiB)
        return 20 * MiB;
    return (n + PAGE - 1) / PAGE * PAGE;
}
static bool small(uint64_t n) { return n <= MiB; }

// Best fit among free blocks of the same pool (small blocks only from small segments).
static Block *find_free(DeviceState &s, uint64_t n)
{
    Block *best = nullptr;
    for (auto &kv : s.blocks) {
        Block &b = kv.second;
        if (!b.free || b.size < n)
            continue;
        if (!expandable && small(n) != (s.segments[b.segment] == 2 * MiB))
            continue;
        if (!best || b.size < best->size)
            best = &b;
    }
    return best;
}

static void release_free_segments(DeviceState &s)
{
    if (expandable) {
        // Unmap whole free pages at the end of the mapped range.
        while (s.mapped > 0) {
            auto last = s.blocks.empty() ? s.blocks.end() : std::prev(s.blocks.end());
            if (last == s.blocks.end() || !last->second.free)
                break;
            Block &b = last->second;
            uint64_t page = s.va + s.mapped - PAGE;
            if (b.addr > page)
                break;
            cuMemUnmap(page, PAGE);
            cuMemRelease(s.pages[page]);
            s.pages.erase(page);
            s.mapped -= PAGE;
            s.reserved -= PAGE;
            if (b.size == PAGE && b.addr == page)
                s.blocks.erase(last);
            else
                b.size -= PAGE;
        }
        return;
    }
    for (auto it = s.segments.begin(); it != s.segments.end();) {
        auto b = s.blocks.find(it->first);
        if (b != s.blocks.end() && b->second.free && b->second.size == it->second) {
            cudaFree((void *)it->first);
            s.reserved -= it->second;
            s.blocks.erase(b);
            it = s.segments.erase(it);
        } else {
            ++it;
        }
    }
}

static bool grow(DeviceState &s, int dev, uint64_t n)
{
    if (expandable) {
        if (!s.va) {
            s.va_size = 8ULL << 30;
            if (cuMemAddressReserve(&s.va, s.va_size, 0, 0, 0) != CUDA_SUCCESS)
                return false;
        }
        // Map pages at the end until the free block there (extended or new) fits `n`.
        for (;;) {
            bool tail = !s.blocks.empty() && std::prev(s.blocks.end())->second.free;
            uint64_t have = tail ? std::prev(s.blocks.end())->second.size : 0;
            if (have >= n)
                break;
            CUmemAllocationProp prop = {};
            prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            CUmemGenericAllocationHandle h;
            if (s.mapped + PAGE > s.va_size || cuMemCreate(&h, PAGE, &prop, 0) != CUDA_SUCCESS)
                return false;
            uint64_t page = s.va + s.mapped;
            cuMemMap(page, PAGE, 0, h, 0);
            s.pages[page] = h;
            s.mapped += PAGE;
            s.reserved += PAGE;
            if (tail)
                std::prev(s.blocks.end())->second.size += PAGE;
            else
                s.blocks[page] = Block{page, PAGE, true, s.va};
        }
        return true;
    }
    uint64_t seg = segment_size(n);
    void *p = nullptr;
    if (cudaMalloc(&p, seg) != cudaSuccess)
        return false;
    s.segments[(uint64_t)p] = seg;
    s.reserved += seg;
    s.blocks[(uint64_t)p] = Block{(uint64_t)p, seg, true, (uint64_t)p};
    return true;
}

void *malloc(uint64_t request)
{
    std::lock_guard<std::mutex> g(mu);
    int dev = current_device();
    DeviceState &s = devs[dev];
    uint64_t n = round_block(request);
    Block *b = find_free(s, n);
    if (!b && !grow(s, dev, n)) {
        release_free_segments(s); // torch frees its cache and retries before raising an OOM
        if (!grow(s, dev, n))
            return nullptr;
    }
    if (!b)
        b = find_free(s, n);
    if (!b)
        return nullptr;
    if (b->size > n) { // split: the rest stays free
        Block rest{b->addr + n, b->size - n, true, b->segment};
        s.blocks[rest.addr] = rest;
        b->size = n;
    }
    b->free = false;
    s.allocated += b->size;
    if (s.allocated > s.max_allocated)
        s.max_allocated = s.allocated;
    report(s, dev, b->addr, (long)b->size);
    return (void *)b->addr;
}

void free(void *p)
{
    std::lock_guard<std::mutex> g(mu);
    for (int dev = 0; dev < 8; dev++) {
        DeviceState &s = devs[dev];
        auto it = s.blocks.find((uint64_t)p);
        if (it == s.blocks.end() || it->second.free)
            continue;
        Block &b = it->second;
        s.allocated -= b.size;
        report(s, dev, b.addr, -(long)b.size);
        b.free = true;
        // Merge with free neighbours of the same segment.
        auto next = std::next(it);
        if (next != s.blocks.end() && next->second.free && next->second.segment == b.segment) {
            b.size += next->second.size;
            s.blocks.erase(next);
        }
        if (it != s.blocks.begin()) {
            auto prev = std::prev(it);
            if (prev->second.free && prev->second.segment == b.segment) {
                prev->second.size += b.size;
                s.blocks.erase(it);
            }
        }
        return;
    }
}

void emptyCache()
{
    std::lock_guard<std::mutex> g(mu);
    for (auto &s : devs)
        release_free_segments(s);
}

}}} // namespace c10::cuda::CUDACachingAllocator

using namespace c10::cuda::CUDACachingAllocator;

extern "C" {
unsigned long long c10_cuda_memory_allocated(int dev) { return devs[dev].allocated; }
unsigned long long c10_cuda_memory_reserved(int dev) { return devs[dev].reserved; }
unsigned long long c10_cuda_max_memory_allocated(int dev) { return devs[dev].max_allocated; }
unsigned long long c10_cuda_max_memory_reserved(int dev) { return devs[dev].max_reserved; }
void *c10_cuda_raw_alloc(unsigned long long n) { return c10::cuda::CUDACachingAllocator::malloc(n); }
void c10_cuda_raw_free(void *p) { c10::cuda::CUDACachingAllocator::free(p); }
void c10_cuda_empty_cache(void) { emptyCache(); }
}
