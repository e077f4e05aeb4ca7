/*
 * Emulated libc10.so: the part of PyTorch's core library a tracer meets.
 *
 * It defines c10::reportMemoryUsageToProfiler in both signatures (torch >= 1.10 with the
 * allocator's totals, and the older one without), as the real library does: the allocators
 * call them through the PLT, so a preloaded definition interposes them. The "profiler" behind
 * them just keeps a tally, which the test programs print: it must be the same with and without
 * the tracer (forwarding is exact). A tiny CPU allocator reports CPU blocks (device type 0),
 * which a tracer must forward and not count.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

struct Device {
    int8_t type;
    int8_t index;
};

/* What torch's profiler would have seen. */
struct c10_profiler_tally {
    long long calls, cpu_calls, old_calls;
    long long bytes_sum; /* sum of signed sizes */
    unsigned long long last_allocated, last_reserved, checksum;
};
static struct c10_profiler_tally tally;

void _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE(void *ptr, int64_t size, size_t allocated, size_t reserved,
                                                          struct Device d)
{
    tally.calls++;
    if (d.type == 0)
        tally.cpu_calls++;
    tally.bytes_sum += size;
    tally.last_allocated = allocated;
    tally.last_reserved = reserved;
    tally.checksum = tally.checksum * 1000003ULL + (d.type ? (uintptr_t)ptr : 0) + (unsigned long long)size + allocated * 7 +
                     reserved * 13 + (unsigned)d.type * 17 + (unsigned)d.index * 19;
}

void _ZN3c1027reportMemoryUsageToProfilerEPvlNS_6DeviceE(void *ptr, int64_t size, struct Device d)
{
    tally.old_calls++;
    tally.bytes_sum += size;
    tally.checksum = tally.checksum * 1000003ULL + (uintptr_t)ptr + (unsigned long long)size + (unsigned)d.type * 17 +
                     (unsigned)d.index * 19;
}

void c10_profiler_print(void)
{
    printf("profiler calls=%lld cpu_calls=%lld old_calls=%lld bytes_sum=%lld last_allocated=%llu last_reserved=%llu "
           "checksum=%llu\n",
           tally.calls, tally.cpu_calls, tally.old_calls, tally.bytes_sum, tally.last_allocated, tally.last_reserved,
           tally.checksum);
    fflush(stdout);
}

/* The CPU allocator: reports with device type CPU (0). */
static size_t cpu_allocated;

void *c10_cpu_alloc(size_t n)
{
    void *p = malloc(n);
    cpu_allocated += n;
    _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE(p, (int64_t)n, cpu_allocated, 0, (struct Device){0, -1});
    return p;
}

void c10_cpu_free(void *p, size_t n)
{
    cpu_allocated -= n;
    _ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE(p, -(int64_t)n, cpu_allocated, 0, (struct Device){0, -1});
    free(p);
}
