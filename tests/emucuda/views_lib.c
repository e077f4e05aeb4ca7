/* Libraries for prog_views (tests/views.rs, filters by module): the same code built twice,
 * as libviews_a.so (PREFIX va_) and libviews_b.so (PREFIX vb_), so that each allocation's stack
 * runs through exactly one of them. */
#ifndef PREFIX
#error define PREFIX
#endif
#include <stddef.h>

#include "cuda_runtime.h"

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

/* Allocates n bytes of device memory (NULL on failure). */
__attribute__((noinline)) void *CAT(PREFIX, alloc)(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n) != cudaSuccess)
        return NULL;
    __asm__ volatile("" ::: "memory"); /* no tail call */
    return p;
}

/* A scratch buffer: allocated and freed at once (a temporary allocation). */
__attribute__((noinline)) void CAT(PREFIX, scratch)(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n) == cudaSuccess)
        cudaFree(p);
    __asm__ volatile("" ::: "memory");
}
