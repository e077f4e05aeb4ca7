/* Peer benchmark for benches/overhead.rs: the same loop as bench_alloc.c with malloc + free, the
 * calls heaptrack and memray trace. T threads each make N malloc + free
 * pairs from a call stack D frames deep, timing every malloc.
 * Prints one line: threads=.. pairs=.. depth=.. wall_ns=.. alloc_p50_ns=.. alloc_p99_ns=..
 *   usage: bench_malloc THREADS PAIRS DEPTH                                                   */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int g_pairs, g_depth;
static unsigned long long *g_lat; /* alloc latencies, per thread slices */

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void loop(unsigned long long *lat)
{
    for (int i = 0; i < g_pairs; i++) {
        void *p = NULL;
        unsigned long long t0 = now_ns();
        p = malloc(4096 + (i & 7) * 512);
        unsigned long long t1 = now_ns();
        lat[i] = t1 - t0;
        if (!p) {
            fprintf(stderr, "bench_malloc: malloc failed\n");
            exit(1);
        }
        ((volatile char *)p)[0] = 1;
        free(p);
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
    g_lat = calloc((size_t)threads * g_pairs, sizeof *g_lat);
    pthread_t *t = calloc(threads, sizeof *t);
    unsigned long long t0 = now_ns();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, g_lat + (size_t)i * g_pairs);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    unsigned long long wall = now_ns() - t0;
    size_t n = (size_t)threads * g_pairs;
    qsort(g_lat, n, sizeof *g_lat, cmp);
    printf("threads=%d pairs=%d depth=%d wall_ns=%llu alloc_p50_ns=%llu alloc_p99_ns=%llu\n", threads, g_pairs, g_depth,
           wall, g_lat[n / 2], g_lat[n * 99 / 100]);
    return 0;
}
