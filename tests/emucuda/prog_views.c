/*
 * prog_views (tests/views.rs): allocations through two libraries, in two phases (marks "part
 * a", "part b", when the tracer is preloaded) with a pause between them, for the filters by
 * module, phase and time, the temporary allocations and `gpumemtrace live`.
 *   part a, libviews_a: 1, 2, 3 MiB kept; two 8 MiB scratch buffers freed at once; the 2 MiB
 *           freed after three other allocations. Leaks 1 + 3 MiB.
 *   (200 ms pause)
 *   part b, libviews_b: 4 x 4 MiB kept; one 16 MiB scratch buffer; the first 4 MiB freed
 *           after four other allocations. Leaks 12 MiB.
 * Device memory on device 0: 10 allocations, 54 MiB allocated, peak 36 MiB (part a's 4 MiB
 * left, part b's 16 MiB and its scratch buffer); part a alone peaks at 14 MiB (6 MiB and a
 * scratch buffer). With argv[1] "step", each of part b's allocations first waits for a byte
 * on stdin (a test following the trace as it grows says when).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_runtime.h"

#define MiB (1024UL * 1024UL)

extern int gpumemtrace_mark(const char *name) __attribute__((weak));
void *va_alloc(size_t n);
void va_scratch(size_t n);
void *vb_alloc(size_t n);
void vb_scratch(size_t n);

static void mark(const char *name)
{
    if (gpumemtrace_mark)
        gpumemtrace_mark(name);
}

int main(int argc, char **argv)
{
    int step = argc > 1 && strcmp(argv[1], "step") == 0;
    char c;
    void *a1, *a2, *a3, *b[4];
    int i;

    mark("part a");
    a1 = va_alloc(1 * MiB);
    a2 = va_alloc(2 * MiB);
    a3 = va_alloc(3 * MiB);
    va_scratch(8 * MiB);
    va_scratch(8 * MiB);
    cudaFree(a2);
    usleep(200 * 1000);

    mark("part b");
    for (i = 0; i < 4; i++) {
        if (step && read(0, &c, 1) != 1) {
            fprintf(stderr, "prog_views: stdin closed\n");
            return 1;
        }
        b[i] = vb_alloc(4 * MiB);
    }
    vb_scratch(16 * MiB);
    cudaFree(b[0]);
    if (!a1 || !a2 || !a3 || !b[3]) {
        fprintf(stderr, "prog_views: an allocation failed\n");
        return 1;
    }
    printf("prog_views: done\n");
    return 0;
}
