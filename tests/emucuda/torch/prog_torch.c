/*
 * prog_torch: a program using the emulated PyTorch (libtorch_cuda.so -> libc10_cuda.so ->
 * libc10.so), opened with dlopen(RTLD_LOCAL) as Python imports torch. Prints the allocator's own
 * counters at checkpoints and the profiler tally at the end (the contract with tests/torch.rs):
 *   checkpoint=NAME allocated=A reserved=R max_allocated=M max_reserved=MR
 *   oom request=N allocated=A reserved=R
 *   profiler calls=... (libc10's tally: identical with and without the tracer)
 * The two gradients still alive at exit are freed by libtorch_cuda's exit handler.
 * Modes (argv[1]): basic (default), oom.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/cuda_runtime_api.h"

#define MiB (1ULL << 20)
#define NOINLINE __attribute__((noinline))

static void *(*raw_alloc)(unsigned long long);
static void (*raw_free)(void *), (*op_free)(void *);
static void *(*op_mm)(unsigned long long);
static void (*empty_cache)(void);
static unsigned long long (*allocated)(int), (*reserved)(int), (*max_allocated)(int), (*max_reserved)(int);
static int (*run_backward)(int, unsigned long long, void **);
static void *(*cpu_alloc)(size_t);
static void (*cpu_free)(void *, size_t);
static void (*profiler_print)(void);
static cudaError_t (*rt_malloc)(void **, size_t);

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: dlsym %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

static void checkpoint(const char *name)
{
    printf("checkpoint=%s allocated=%llu reserved=%llu max_allocated=%llu max_reserved=%llu\n", name, allocated(0),
           reserved(0), max_allocated(0), max_reserved(0));
    fflush(stdout);
}

static void *weights[3], *small[10], *history[5], *grads[4];

NOINLINE static void load_weights(void)
{
    for (int i = 0; i < 3; i++)
        weights[i] = raw_alloc(4 * MiB); /* 4 MiB blocks share 20 MiB segments */
}

NOINLINE static void small_buffers(void)
{
    for (int i = 0; i < 10; i++)
        small[i] = raw_alloc(1000); /* 1024-byte blocks in one 2 MiB segment */
}

NOINLINE static void *forward_temp(void) { return raw_alloc(8 * MiB); }

NOINLINE static void *keep_history(void) { return raw_alloc(1 * MiB); }

NOINLINE static void *matmul(void) { return op_mm(3 * MiB); }

NOINLINE static void *cublas_workspace(void)
{
    void *p = NULL;
    rt_malloc(&p, 3 * MiB); /* straight from the driver, like cuBLAS's workspaces */
    return p;
}

static int basic(void)
{
    load_weights();
    small_buffers();
    void *ws = cublas_workspace();
    void *c = cpu_alloc(4096); /* a CPU block: forwarded, never GPU memory */
    checkpoint("loaded");
    for (int step = 0; step < 5; step++) {
        void *t = forward_temp();
        void *m = matmul();
        history[step] = keep_history(); /* the leak: one block kept per step */
        op_free(m);
        raw_free(t);
        usleep(3000); /* a training step takes time: growth is judged over time windows */
    }
    checkpoint("trained");
    if (run_backward(4, 512 * 1024, grads) != 0)
        return 1;
    op_free(grads[0]);
    op_free(grads[1]);
    raw_free(weights[0]);
    for (int i = 0; i < 10; i += 2)
        raw_free(small[i]);
    cpu_free(c, 4096);
    empty_cache();
    checkpoint("end");
    (void)ws;
    profiler_print();
    return 0;
}

NOINLINE static void *big_activation(unsigned long long n) { return raw_alloc(n); }

/* Device capacity 1 GiB: 4 MiB + 600 MiB live in 620 MiB reserved (16 MiB of it cached and
 * free, in a segment that still holds a block), then 500 MiB cannot be had. */
static int oom(void)
{
    load_weights();
    raw_free(weights[1]);
    raw_free(weights[2]);
    void *a = big_activation(600 * MiB);
    void *b = big_activation(500 * MiB);
    printf("oom request=%llu allocated=%llu reserved=%llu got=%d\n", 500 * MiB, allocated(0), reserved(0), b != NULL);
    (void)a;
    profiler_print();
    return 0;
}

int main(int argc, char **argv)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    if (n <= 0)
        return 1;
    dir[n] = 0;
    *strrchr(dir, '/') = 0;
    snprintf(path, sizeof path, "%s/libtorch_cuda.so", dir);
    void *torch = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!torch) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    raw_alloc = sym(torch, "c10_cuda_raw_alloc");
    raw_free = sym(torch, "c10_cuda_raw_free");
    op_mm = sym(torch, "torch_emu_mm");
    op_free = sym(torch, "torch_emu_free");
    empty_cache = sym(torch, "c10_cuda_empty_cache");
    allocated = sym(torch, "c10_cuda_memory_allocated");
    reserved = sym(torch, "c10_cuda_memory_reserved");
    max_allocated = sym(torch, "c10_cuda_max_memory_allocated");
    max_reserved = sym(torch, "c10_cuda_max_memory_reserved");
    run_backward = sym(torch, "torch_emu_run_backward");
    cpu_alloc = sym(torch, "c10_cpu_alloc");
    cpu_free = sym(torch, "c10_cpu_free");
    profiler_print = sym(torch, "c10_profiler_print");
    rt_malloc = sym(torch, "cudaMalloc");
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "basic";
    if (!strcmp(mode, "oom"))
        return oom();
    return basic();
}
