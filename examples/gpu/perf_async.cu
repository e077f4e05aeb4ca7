// Stream-ordered allocation loop for examples/gpu/perf.sh: N cudaMallocAsync + cudaFreeAsync
// pairs on one stream, from a call stack D frames deep. Prints `ns_per_pair=...`.
//   perf_async N D
// With ALTERNATE=WINDOWS (under LD_PRELOAD=libgpumemtrace.so): instead, WINDOWS pairs of windows
// of N pairs, one traced and one paused (gpumemtrace_pause: the hooks only forward), in turn
// first or second; prints each pair and `alternate ... added_ns=median of the differences`.
#include <algorithm>
#include <chrono>
#include <dlfcn.h>
#include <vector>
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

static double window(int d, int n)
{
    cudaStreamSynchronize(s);
    auto t0 = std::chrono::steady_clock::now();
    descend(d, n);
    cudaStreamSynchronize(s);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}

static double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    int d = argc > 2 ? atoi(argv[2]) : 20;
    cudaStreamCreate(&s);
    descend(d, 1000); // warm-up: pool, tracer start, unwind caches
    cudaStreamSynchronize(s);
    if (const char *alt = getenv("ALTERNATE")) {
        auto pause = (int (*)())dlsym(RTLD_DEFAULT, "gpumemtrace_pause");
        auto resume = (int (*)())dlsym(RTLD_DEFAULT, "gpumemtrace_resume");
        if (!pause || !resume) {
            fprintf(stderr, "perf_async: ALTERNATE needs LD_PRELOAD=libgpumemtrace.so\n");
            return 1;
        }
        int windows = atoi(alt);
        std::vector<double> traced, paused, added;
        for (int i = 0; i < windows; i++) {
            double t = 0, p = 0;
            for (int k = 0; k < 2; k++) {
                bool trace = (k == 0) == (i % 2 == 0);
                (trace ? resume : pause)();
                (trace ? t : p) = window(d, n);
            }
            resume();
            traced.push_back(t);
            paused.push_back(p);
            added.push_back(t - p);
            printf("pair=%d traced_ns=%.1f paused_ns=%.1f\n", i, t, p);
        }
        printf("alternate windows=%d pairs_per_window=%d depth=%d traced_ns=%.1f paused_ns=%.1f added_ns=%.1f\n", windows, n, d,
               median(traced), median(paused), median(added));
        return 0;
    }
    auto t0 = std::chrono::steady_clock::now();
    descend(d, n);
    cudaStreamSynchronize(s);
    double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    printf("ns_per_pair=%.1f pairs=%d depth=%d\n", ns / n, n, d);
    return 0;
}
