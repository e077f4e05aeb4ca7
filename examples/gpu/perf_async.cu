// Stream-ordered allocation loop for examples/gpu/perf.sh: N cudaMallocAsync + cudaFreeAsync
// pairs on one stream, from a call stack D frames deep. Prints `ns_per_pair=...`.
//   perf_async N D
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

static cudaStream_t s;

__attribute__((noinline)) static void loop(int n)
{
    for (int i = 0; i < n; i++) {
        void *p = nullptr;
        if (cudaMallocAsync(&p, 4096 + (i & 7) * 512, s) != cudaSuccess || cudaFreeAsync(p, s) != cudaSuccess) {
            fprintf(stderr, "perf_async: call failed\n");
            exit(1);
        }
    }
}

__attribute__((noinline)) static int descend(int d, int n)
{
    if (d <= 0) {
        loop(n);
        return 0;
    }
    int r = descend(d - 1, n);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    int d = argc > 2 ? atoi(argv[2]) : 20;
    cudaStreamCreate(&s);
    descend(d, 1000); // warm-up: pool, tracer start, unwind caches
    cudaStreamSynchronize(s);
    auto t0 = std::chrono::steady_clock::now();
    descend(d, n);
    cudaStreamSynchronize(s);
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    printf("ns_per_pair=%.1f pairs=%d depth=%d\n", ns / n, n, d);
    return 0;
}
