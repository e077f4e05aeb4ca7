// prog_throw: allocates (a leak), then throws a C++ exception nobody catches:
// std::terminate -> abort() -> SIGABRT. The trace must hold the allocation.
#include <stdexcept>

#include "cuda.h"
#include "testlog.h"

static void run_model()
{
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, 10 * MiB), d, 10 * MiB, 0, 0);
    throw std::runtime_error("model exploded");
}

int main()
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUcontext ctx = NULL;
    CUdevice dev;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    run_model();
    return 0;
}
