/*
 * prog_dlerror: what dlsym and dlerror answer, printed, so a test can compare a traced run with
 * an untraced one line by line. Links libcuda (so RTLD_NEXT from here can find the driver) and
 * allocates once through a dlsym'd pointer (so the trace has an event).
 *   case=NAME found=0|1 error=<dlerror() right after, or (null)>
 * Also after a driver allocation and free: the tracer's own lookups leave dlerror() empty.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

#include "cuda.h"
#include "testlog.h"

static void *check(const char *name, void *p)
{
    const char *e = dlerror();
    printf("case=%s found=%d error=%s\n", name, p != NULL, e ? e : "(null)");
    fflush(stdout);
    return p;
}

int main(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!cuda || !libc) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: dlopen: %s\n", dlerror());
        return 1;
    }
    dlerror();
    check("default-missing", dlsym(RTLD_DEFAULT, "gpumemtrace_no_such_symbol"));
    check("next-missing", dlsym(RTLD_NEXT, "gpumemtrace_no_such_symbol"));
    check("handle-missing", dlsym(cuda, "gpumemtrace_no_such_symbol"));
    check("handle-missing-cuda-name", dlsym(libc, "cuMemAlloc_v2"));
    check("next-found", dlsym(RTLD_NEXT, "printf"));
    /* A failure, then a success: the success discards the pending error. */
    dlsym(RTLD_NEXT, "gpumemtrace_no_such_symbol");
    check("next-found-after-failure", dlsym(RTLD_NEXT, "puts"));
    dlsym(RTLD_NEXT, "gpumemtrace_no_such_symbol");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult(*)(CUdeviceptr *, size_t))check("handle-cuda-name-after-failure", dlsym(cuda, "cuMemAlloc_v2"));
    dlsym(RTLD_NEXT, "gpumemtrace_no_such_symbol");
    check("next-cuda-name-after-failure", dlsym(RTLD_NEXT, "cuMemFree_v2"));
    /* An error is reported once. */
    dlsym(RTLD_NEXT, "gpumemtrace_no_such_symbol");
    dlerror();
    check("error-read-twice", NULL);

    CUcontext ctx = NULL;
    CUdevice dev;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    CUdeviceptr d = 0;
    dlerror();
    ALLOC("cuMemAlloc_v2", "device", alloc(&d, 3 << 20), d, 3 << 20, 0, 0);
    /* The tracer starts inside that call and looks things up (an interpreter, real functions):
     * a lookup of its that missed must leave no message for the program's next dlerror(). */
    check("after-allocation", NULL);
    MUST(cuMemFree_v2(d));
    check("after-free", NULL);
    return 0;
}
