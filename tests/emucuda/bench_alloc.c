/* Benchmark driver for benches/overhead.rs: T threads each make N cuMemAlloc_v2 + cuMemFree_v2
 * pairs (emulated driver, linked directly) from a call stack D frames deep, timing every call.
 * Prints one line: threads=.. pairs=.. depth=.. wall_ns=.. alloc_p50_ns=.. alloc_p99_ns=..
 * free_p50_ns=.. free_p99_ns=..
 *   usage: bench_alloc THREADS PAIRS DEPTH
 * BENCH_COLD_KB=N: between pairs, each thread writes a private N KiB buffer, a line at a time, so
 * the tracer meets caches as a busy host (PyTorch between two block allocations) leaves them.  */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda.h"

static int g_pairs, g_depth;
static size_t g_cold; /* bytes each thread writes between pairs (BENCH_COLD_KB) */
static unsigned long long *g_lat, *g_free_lat; /* latencies, per thread slices */

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void loop(unsigned long long *lat)
{
    unsigned long long *free_lat = g_free_lat + (lat - g_lat);
    volatile unsigned char *cold = g_cold ? malloc(g_cold) : NULL;
    for (int i = 0; i < g_pairs; i++) {
        for (size_t b = 0; b < g_cold; b += 64) cold[b] = (unsigned char)i;
        CUdeviceptr p = 0;
        unsigned long long t0 = now_ns();
        CUresult r = cuMemAlloc(&p, 4096 + (i & 7) * 512);
        unsigned long long t1 = now_ns();
        CUresult f = r == CUDA_SUCCESS ? cuMemFree(p) : r;
        unsigned long long t2 = now_ns();
        lat[i] = t1 - t0;
        free_lat[i] = t2 - t1;
        if (r != CUDA_SUCCESS || f != CUDA_SUCCESS) {
            fprintf(stderr, "bench_alloc: call failed\n");
            exit(1);
        }
    }
}

/* Not inlined and not a tail call: every level is a real frame. */
__attribute__((noinline)) static int descend(int depth, unsigned long long *lat)
{
    if (depth <= 0) {
        loop(lat);
        return 0;
    }
    return descend(depth - 1, lat) + 1;
}

static void *worker(void *arg)
{
    CUcontext ctx;
    CUdevice d;
    cuDeviceGet(&d, 0);
    cuDevicePrimaryCtxRetain(&ctx, d);
    cuCtxSetCurrent(ctx);
    descend(g_depth, (unsigned long long *)arg);
    return NULL;
}

static int cmp(const void *a, const void *b)
{
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    g_pairs = argc > 2 ? atoi(argv[2]) : 100000;
    g_depth = argc > 3 ? atoi(argv[3]) : 0;
    const char *cold_kb = getenv("BENCH_COLD_KB");
    g_cold = cold_kb ? (size_t)atol(cold_kb) * 1024 : 0;
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    g_lat = calloc((size_t)threads * g_pairs, sizeof *g_lat);
    g_free_lat = calloc((size_t)threads * g_pairs, sizeof *g_free_lat);
    pthread_t *t = calloc(threads, sizeof *t);
    unsigned long long t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, g_lat + (size_t)i * g_pairs);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    unsigned long long wall = now_ns() - t0;
    size_t n = (size_t)threads * g_pairs;
    qsort(g_lat, n, sizeof *g_lat, cmp);
    qsort(g_free_lat, n, sizeof *g_free_lat, cmp);
    printf("threads=%d pairs=%d depth=%d wall_ns=%llu alloc_p50_ns=%llu alloc_p99_ns=%llu free_p50_ns=%llu free_p99_ns=%llu\n",
           threads, g_pairs, g_depth, wall, g_lat[n / 2], g_lat[n * 99 / 100], g_free_lat[n / 2], g_free_lat[n * 99 / 100]);
    return 0;
}
