/* A wrapper library in the style of an LD_PRELOAD interposer: its probe() forwards to the next
 * definition through dlsym(RTLD_NEXT). A dlsym hook that forwarded RTLD_NEXT naively would
 * resolve it relative to the hook's library and hand this very function back: endless recursion. */
#define _GNU_SOURCE
#include <dlfcn.h>

int probe(void)
{
    int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "probe");
    if (next == probe)
        return -1000; /* would recurse forever */
    return 1 + (next ? next() : 100);
}
