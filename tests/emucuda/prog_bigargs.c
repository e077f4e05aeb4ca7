/*
 * prog_bigargs ARGS...: prints how many arguments and bytes it got, allocates once, exits 0.
 * Run with a huge argument list (more than the trace format's record bound).
 */
#include <string.h>

#include "cuda.h"
#include "testlog.h"

int main(int argc, char **argv)
{
    size_t bytes = 0;
    for (int i = 0; i < argc; i++)
        bytes += strlen(argv[i]) + 1;
    printf("argc=%d bytes=%zu\n", argc, bytes);
    CUcontext ctx = NULL;
    CUdevice dev;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, 5 * MiB), d, 5 * MiB, 0, 0);
    return 0;
}
