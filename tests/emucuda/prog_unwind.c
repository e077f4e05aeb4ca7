/* Stacks for the unwinder comparison (tests/unwind.rs): allocations reached through the
 * program, libunwind_a (-O2 -fomit-frame-pointer), libunwind_b (frame pointers), the emulated
 * runtime and driver, a library opened with dlopen (and reopened after dlclose), and a thread.
 * The program itself is built twice: prog_unwind_fp and prog_unwind_nofp.
 * With ROUNDS, the places of `work` are then visited ROUNDS times more, in turn (as a training
 * step visits its ops): each round's stacks are the first round's.
 *   usage: prog_unwind [ROUNDS]                                                              */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda.h"
#include "cuda_runtime_api.h"

int ua_descend(int depth, int (*next)(int), int x);
int ub_descend(int depth, int (*next)(int), int x);

#define NOINLINE __attribute__((noinline))
#define NOTAIL __asm__ volatile("" ::: "memory")

static NOINLINE int leaf_driver(int x)
{
    CUdeviceptr p = 0;
    if (cuMemAlloc(&p, 1024 + (size_t)x) != CUDA_SUCCESS) return 1000;
    cuMemFree(p);
    NOTAIL;
    return 0;
}

static NOINLINE int leaf_runtime(int x)
{
    void *p = 0;
    if (cudaMalloc(&p, 2048 + (size_t)x) != cudaSuccess) return 1000;
    cudaFree(p);
    NOTAIL;
    return 0;
}

static NOINLINE int via_b_driver(int x) { int r = ub_descend(4, leaf_driver, x); NOTAIL; return r; }
static NOINLINE int via_b_runtime(int x) { int r = ub_descend(2, leaf_runtime, x); NOTAIL; return r; }

static int (*dl_descend)(int, int (*)(int), int);
static NOINLINE int via_dl(int x) { int r = dl_descend(3, via_b_driver, x); NOTAIL; return r; }

static NOINLINE int work(int x)
{
    int r = ua_descend(3, via_b_driver, x);
    r += ua_descend(5, via_b_runtime, x);
    r += leaf_driver(x);
    r += ua_descend(70, leaf_driver, x); /* deeper than the 64 frames recorded */
    if (dl_descend) r += ua_descend(2, via_dl, x);
    NOTAIL;
    return r;
}

static void *thread_main(void *arg)
{
    (void)arg;
    cudaSetDevice(0);
    work(7);
    return NULL;
}

static void *open_c(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/libunwind_c.so", dir);
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return NULL; }
    dl_descend = (int (*)(int, int (*)(int), int))dlsym(h, "uc_descend");
    return dl_descend ? h : NULL;
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 0;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", argv[0]);
    char *slash = dir;
    for (char *p = dir; *p; p++) if (*p == '/') slash = p;
    *slash = 0;
    cudaSetDevice(0);
    work(1);
    void *c = open_c(dir);
    if (!c) return 1;
    work(2);
    pthread_t t;
    pthread_create(&t, NULL, thread_main, NULL);
    pthread_join(t, NULL);
    /* Reopen after dlclose: the unwinder must not use the unloaded image's tables. */
    dlclose(c);
    dl_descend = NULL;
    work(3);
    if (!open_c(dir)) return 1;
    work(4);
    for (int i = 0; i < rounds; i++) work(5);
    printf("ok\n");
    return 0;
}
