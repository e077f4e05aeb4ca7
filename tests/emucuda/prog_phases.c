/*
 * prog_phases: a toy training loop whose phases come from NVTX ranges (mini_nvtx.h, through
 * NVTX's injection protocol) and from gpumemtrace_mark (a weak symbol: present only when the
 * tracer is preloaded). Per epoch (2 epochs, marked "epoch 1", "epoch 2"):
 *   forward   (nvtxRangePushA):   3 x 16 MiB activations, kept until backward;
 *     attention (nvtxRangePushEx, nested in forward): 8 MiB allocated and freed
 *   backward  (nvtxDomainRangePushEx, registered string): frees the activations, 32 MiB
 *             gradient allocated and freed
 *   optimizer (nvtxRangePushA):   4 MiB state leaked each epoch
 * Setup (mark "setup"): 64 MiB weights, never freed. Finally, in range "eval", a 4 GiB
 * allocation fails (the emulated device has 1 GiB). Each phase lasts a few milliseconds
 * (usleep) so that pictures of the run look like a run. argv[1]: the optimizer state's size
 * in MiB (default 4), for diffs of two runs.
 */
#include <unistd.h>

#include "cuda_runtime.h"
#include "mini_nvtx.h"
#include "testlog.h"

extern int gpumemtrace_mark(const char *name) __attribute__((weak));

static void mark(const char *name)
{
    if (gpumemtrace_mark)
        gpumemtrace_mark(name);
}

static void *act[3];
static size_t state_mib = 4;

static void attention(void)
{
    void *p = NULL;
    nvtxEventAttributes_t a = {3, sizeof(nvtxEventAttributes_t), 0, 0, 0, 0, 0, 0, NVTX_MESSAGE_TYPE_ASCII, "attention"};
    nvtxRangePushEx(&a);
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 8 * MiB), p, 8 * MiB, 0, 0);
    usleep(1500);
    FREE("cudaFree", "device", cudaFree(p), p, 0);
    nvtxRangePop();
}

static void forward(void)
{
    int i;
    nvtxRangePushA("forward");
    for (i = 0; i < 3; i++) {
        act[i] = NULL;
        ALLOC("cudaMalloc", "device", cudaMalloc(&act[i], 16 * MiB), act[i], 16 * MiB, 0, 0);
    }
    usleep(2000);
    attention();
    usleep(1000);
    nvtxRangePop();
}

static void backward(const void *name)
{
    void *grad = NULL;
    int i;
    nvtxEventAttributes_t a = {3, sizeof(nvtxEventAttributes_t), 0, 0, 0, 0, 0, 0, NVTX_MESSAGE_TYPE_REGISTERED, name};
    nvtxDomainRangePushEx(NULL, &a);
    for (i = 0; i < 3; i++)
        FREE("cudaFree", "device", cudaFree(act[i]), act[i], 0);
    usleep(1000);
    ALLOC("cudaMalloc", "device", cudaMalloc(&grad, 32 * MiB), grad, 32 * MiB, 0, 0);
    usleep(3000);
    FREE("cudaFree", "device", cudaFree(grad), grad, 0);
    usleep(500);
    nvtxDomainRangePop(NULL);
}

static void optimizer(void)
{
    void *state = NULL;
    nvtxRangePushA("optimizer");
    ALLOC("cudaMalloc", "device", cudaMalloc(&state, state_mib * MiB), state, state_mib * MiB, 0, 0); /* leaked */
    usleep(1500);
    nvtxRangePop();
}

int main(int argc, char **argv)
{
    void *weights = NULL, *huge = NULL;
    const void *backward_name = nvtxDomainRegisterStringA(NULL, "backward");
    int epoch;
    char name[32];

    if (argc > 1)
        state_mib = (size_t)atoi(argv[1]);
    mark("setup");
    ALLOC("cudaMalloc", "device", cudaMalloc(&weights, 64 * MiB), weights, 64 * MiB, 0, 0);
    usleep(2000);
    for (epoch = 1; epoch <= 2; epoch++) {
        snprintf(name, sizeof name, "epoch %d", epoch);
        mark(name);
        forward();
        backward(backward_name);
        optimizer();
    }
    nvtxMarkA("eval");
    usleep(2000);
    ALLOC("cudaMalloc", "device", cudaMalloc(&huge, 4096 * MiB), huge, 4096 * MiB, 0, 2);
    usleep(1000);
    return 0;
}
