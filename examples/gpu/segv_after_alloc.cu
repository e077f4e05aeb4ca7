// Real-GPU reliability check (docs/validation.md): allocates, then crashes on the host with a
// segmentation fault. The trace must hold the allocations and the process must still die of
// SIGSEGV.
#include <cstdio>
#include <cuda_runtime.h>

static void *load_model() {
    void *weights = nullptr;
    cudaMalloc(&weights, 1ull << 30);  // 1 GiB, never freed
    return weights;
}

int main() {
    void *w = load_model();
    void *scratch = nullptr;
    cudaMalloc(&scratch, 256ull << 20);
    std::printf("allocated %p and %p, now crashing\n", w, scratch);
    std::fflush(stdout);
    *(volatile int *)nullptr = 1;  // SIGSEGV
    return 0;
}
