/* dlopen()s libctor_alloc.so, whose constructor allocates; then allocates once more itself. */
#include <dlfcn.h>
#include <string.h>

#include "cuda_runtime.h"
#include "testlog.h"

int main(int argc, char **argv)
{
    (void)argc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    char path[4096];
    snprintf(path, sizeof path, "%s", argv[0]);
    char *slash = strrchr(path, '/');
    snprintf(slash + 1, sizeof path - (size_t)(slash + 1 - path), "libctor_alloc.so");
    if (!dlopen(path, RTLD_NOW | RTLD_LOCAL)) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: %s\n", dlerror());
        return 1;
    }
    void *p = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, 12 * MiB), p, 12 * MiB, 0, 0);
    return 0;
}
