/*
 * libmalloc_wrapper.so: a malloc wrapper in the style of libmemusage and many profilers,
 * preloaded BEFORE the tracer (LD_PRELOAD=libmalloc_wrapper.so:libgpumemtrace.so). It resolves
 * the real functions with dlsym(RTLD_NEXT) on first use and has no recursion guard: glibc's
 * dlsym does not allocate on success, so a dlsym that allocates re-enters malloc, which calls
 * dlsym again, until the stack overflows (SIGSEGV).
 * At exit it says on stderr that it saw calls (so a test knows it was active).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <unistd.h>

static void *(*real_malloc)(size_t);
static void (*real_free)(void *);
static void *(*real_calloc)(size_t, size_t);
static void *(*real_realloc)(void *, size_t);
static unsigned long calls;

void *malloc(size_t n)
{
    if (!real_malloc)
        real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return real_malloc(n);
}

void free(void *p)
{
    if (!real_free)
        real_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    real_free(p);
}

void *calloc(size_t n, size_t m)
{
    if (!real_calloc)
        real_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return real_calloc(n, m);
}

void *realloc(void *p, size_t n)
{
    if (!real_realloc)
        real_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return real_realloc(p, n);
}

__attribute__((destructor)) static void report(void)
{
    static const char msg[] = "malloc-wrapper: active\n";
    if (__atomic_load_n(&calls, __ATOMIC_RELAXED) > 0)
        write(2, msg, sizeof msg - 1);
}
