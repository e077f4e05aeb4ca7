/*
 * gpumemtrace demo: a toy "training loop" using the CUDA runtime API.
 *
 * Built by tests/emucuda/Makefile against the emulated libcudart.so.13, but it
 * is plain CUDA runtime code and builds against the real toolkit too:
 *   gcc demo.c -o demo -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart
 *
 * It keeps its weights for the whole run, allocates and frees activations and
 * gradients every step, deliberately leaks a 4 MiB "batch cache" per step,
 * uses a pinned host buffer and one stream-ordered allocation, and finally
 * asks for more memory than the device has.
 */
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define MiB (1024UL * 1024UL)
#define STEPS 5
#define N_ACT 3

#define CHECK(call)                                                             \
    do {                                                                        \
        cudaError_t e_ = (call);                                                \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "demo: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static void *batch_cache[STEPS]; /* never freed: the bug gpumemtrace should find */

static void *load_weights(void)
{
    void *w;
    CHECK(cudaMalloc(&w, 64 * MiB));
    return w;
}

static void forward(void *act[N_ACT])
{
    int i;
    for (i = 0; i < N_ACT; i++)
        CHECK(cudaMalloc(&act[i], 16 * MiB));
}

static void backward(void *act[N_ACT])
{
    void *grad;
    int i;
    for (i = 0; i < N_ACT; i++)
        CHECK(cudaFree(act[i]));
    CHECK(cudaMalloc(&grad, 32 * MiB));
    CHECK(cudaFree(grad));
}

static void cache_batch(int step)
{
    CHECK(cudaMalloc(&batch_cache[step], 4 * MiB)); /* leaked on purpose */
}

static void prefetch_async(cudaStream_t s)
{
    void *tmp;
    CHECK(cudaMallocAsync(&tmp, 8 * MiB, s));
    CHECK(cudaFreeAsync(tmp, s));
    CHECK(cudaStreamSynchronize(s));
}

static int try_huge_allocation(void)
{
    void *huge = NULL;
    cudaError_t e = cudaMalloc(&huge, 4096 * MiB);
    if (e == cudaSuccess) {
        cudaFree(huge);
        return 0;
    }
    printf("demo: 4 GiB allocation failed as expected: %s\n", cudaGetErrorString(e));
    (void)cudaGetLastError();
    return 1;
}

int main(void)
{
    void *weights, *act[N_ACT];
    float *host_buf;
    cudaStream_t stream;
    size_t free_b, total_b;
    int step;

    /* the emulated driver reads this at init; keep an explicit user setting */
    setenv("EMUCUDA_CAPACITY", "512MiB", 0);

    CHECK(cudaMallocHost((void **)&host_buf, 2 * MiB));
    CHECK(cudaStreamCreate(&stream));
    weights = load_weights();

    for (step = 0; step < STEPS; step++) {
        forward(act);
        backward(act);
        cache_batch(step);
    }
    prefetch_async(stream);

    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("demo: %d steps done, %zu MiB of %zu MiB in use\n", STEPS, (total_b - free_b) / MiB, total_b / MiB);
    try_huge_allocation();

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(weights));
    CHECK(cudaFreeHost(host_buf));
    printf("demo: finished (%d x 4 MiB batch cache still allocated)\n", STEPS);
    return 0;
}
