/* A library whose constructor allocates GPU memory: it runs inside dlopen(), with the loader's
 * lock held, and is the process's first allocation call (the tracer starts right there). */
#include "cuda_runtime.h"
#include "testlog.h"

__attribute__((constructor)) static void allocate_at_load(void)
{
    void *p = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 11 * MiB), p, 11 * MiB, 0, 0);
}
