// What the driver's "which device is current" costs on this host, per call, on a warm thread:
// cuCtxGetDevice (what the hooks ask when a call does not name its device) beside
// cudaGetDevice and an empty loop. Prints `query=... ns_per_call=...` lines.
//   driver_query_cost [CALLS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
#include <cuda_runtime.h>

template <class F> static double per_call(long n, F f)
{
    for (long i = 0; i < n / 10; i++) f(); // warm
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; i++) f();
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / n;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    cudaFree(nullptr); // the primary context, current on this thread
    volatile int sink = 0;
    for (int round = 0; round < 3; round++) {
        printf("round=%d query=empty ns_per_call=%.2f\n", round, per_call(n, [&] { sink = sink + 1; }));
        printf("round=%d query=cuCtxGetDevice ns_per_call=%.2f\n", round, per_call(n, [&] {
                   CUdevice d;
                   cuCtxGetDevice(&d);
                   sink = sink + d;
               }));
        printf("round=%d query=cudaGetDevice ns_per_call=%.2f\n", round, per_call(n, [&] {
                   int d;
                   cudaGetDevice(&d);
                   sink = sink + d;
               }));
    }
    return 0;
}
