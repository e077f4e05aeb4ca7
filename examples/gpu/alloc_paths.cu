// Real-GPU validation program (docs/validation.md): a known sequence of CUDA runtime allocation
// calls, each logged on one stdout line (tests/emucuda/testlog.h format) so the trace can be
// compared with what the program really got. Built twice by validate.sh: with nvcc's default
// static cudart (only the driver-level hooks can see it) and with -cudart shared (PLT hooks).
#include <cuda_runtime.h>
#include "testlog.h"

static int dev(void) { int d = -1; MUST(cudaGetDevice(&d)); return d; }

static void *weights(void) {
    void *p = 0;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 64 * MiB), p, 64 * MiB, dev(), 0);
    return p;  // leaked on purpose
}

static void scratch(void) {
    void *p = 0;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 256 * MiB), p, 256 * MiB, dev(), 0);
    FREE("cudaFree", "device", cudaFree(p), p, 0);
}

static void pitched(void) {
    void *p = 0; size_t pitch = 0;
    ALLOC("cudaMallocPitch", "device", cudaMallocPitch(&p, &pitch, 1000, 300), p, pitch * 300, dev(), 0);
    FREE("cudaFree", "device", cudaFree(p), p, 0);
}

static void managed(void) {
    void *p = 0;
    ALLOC("cudaMallocManaged", "managed", cudaMallocManaged(&p, 8 * MiB, cudaMemAttachGlobal), p, 8 * MiB, dev(), 0);
    FREE("cudaFree", "managed", cudaFree(p), p, 0);
}

static void *pinned(void) {
    void *h = 0, *h2 = 0;
    ALLOC("cudaMallocHost", "host", cudaMallocHost(&h, 4 * MiB), h, 4 * MiB, -1, 0);
    ALLOC("cudaHostAlloc", "host", cudaHostAlloc(&h2, 2 * MiB, cudaHostAllocDefault), h2, 2 * MiB, -1, 0);
    FREE("cudaFreeHost", "host", cudaFreeHost(h), h, 0);
    return h2;  // leaked on purpose
}

static void stream_ordered(void) {
    cudaStream_t s; MUST(cudaStreamCreate(&s));
    for (int i = 0; i < 4; i++) {
        void *p = 0;
        ALLOC("cudaMallocAsync", "device", cudaMallocAsync(&p, (1 + i) * MiB, s), p, (1 + i) * MiB, dev(), 0);
        FREE("cudaFreeAsync", "device", cudaFreeAsync(p, s), p, 0);
    }
    MUST(cudaStreamSynchronize(s));
    MUST(cudaStreamDestroy(s));
}

static void too_big(void) {
    void *p = 0;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 1ULL << 40), p, 1ULL << 40, dev(), 2);  // 1 TiB: out of memory
    cudaGetLastError();
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    MUST(cudaFree(0));  // context creation, no allocation
    void *w = weights();
    scratch();
    pitched();
    managed();
    void *h = pinned();
    stream_ordered();
    too_big();
    FREE("cudaFree", "device", cudaFree((void *)0x1234), 0x1234, 1);  // invalid pointer
    cudaGetLastError();
    (void)w; (void)h;
    return 0;
}
