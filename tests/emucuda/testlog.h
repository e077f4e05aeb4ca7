/*
 * emucuda test programs: one stdout line per allocation-related call, the
 * contract with gpumemtrace's Rust tests.  Every macro is meant to be used on
 * ONE source line together with the call it wraps, so __LINE__ is the line of
 * the call.  Each macro checks the call returned `expect` and exits 1 if not.
 *
 *   op=alloc api=A kind=K ptr=0xP size=S result=R line=L device=D
 *   op=free  api=A kind=K ptr=0xP result=R line=L            (size=S too for cuMemAddressFree)
 *   op=map   api=cuMemMap   kind=vmm_mapped ptr=0xVA size=S result=R line=L handle=0xH
 *   op=unmap api=cuMemUnmap kind=vmm_mapped ptr=0xVA size=S result=R line=L
 */
#ifndef EMUCUDA_TESTLOG_H
#define EMUCUDA_TESTLOG_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TL_U64(v) ((unsigned long long)(uintptr_t)(v))

static inline void tl_check(const char *api, int r, int expect, int line)
{
    if (r != expect) {
        fflush(stdout);
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: %s at line %d returned %d, expected %d\n", api, line, r, expect);
        exit(1);
    }
}

static inline void tl_alloc(const char *api, const char *kind, unsigned long long ptr, unsigned long long size, int r,
                            int line, int dev, int expect)
{
    printf("op=alloc api=%s kind=%s ptr=0x%llx size=%llu result=%d line=%d device=%d\n", api, kind, ptr, size, r, line,
           dev);
    fflush(stdout);
    tl_check(api, r, expect, line);
}

static inline void tl_free(const char *api, const char *kind, unsigned long long ptr, int r, int line, int expect)
{
    printf("op=free api=%s kind=%s ptr=0x%llx result=%d line=%d\n", api, kind, ptr, r, line);
    fflush(stdout);
    tl_check(api, r, expect, line);
}

static inline void tl_free_sized(const char *api, const char *kind, unsigned long long ptr, unsigned long long size,
                                 int r, int line, int expect)
{
    printf("op=free api=%s kind=%s ptr=0x%llx size=%llu result=%d line=%d\n", api, kind, ptr, size, r, line);
    fflush(stdout);
    tl_check(api, r, expect, line);
}

static inline void tl_map(unsigned long long va, unsigned long long size, unsigned long long handle, int r, int line,
                          int expect)
{
    printf("op=map api=cuMemMap kind=vmm_mapped ptr=0x%llx size=%llu result=%d line=%d handle=0x%llx\n", va, size, r,
           line, handle);
    fflush(stdout);
    tl_check("cuMemMap", r, expect, line);
}

static inline void tl_unmap(unsigned long long va, unsigned long long size, int r, int line, int expect)
{
    printf("op=unmap api=cuMemUnmap kind=vmm_mapped ptr=0x%llx size=%llu result=%d line=%d\n", va, size, r, line);
    fflush(stdout);
    tl_check("cuMemUnmap", r, expect, line);
}

/* ALLOC: `call` is evaluated first, then `ptr` (an expression read after the
 * call; initialise the variable to 0 beforehand so failures print 0x0). */
#define ALLOC(api, kind, call, ptr, size, dev, expect) \
    do { int r_ = (int)(call); tl_alloc(api, kind, TL_U64(ptr), (unsigned long long)(size), r_, __LINE__, dev, expect); } while (0)
#define FREE(api, kind, call, ptr, expect) \
    do { int r_ = (int)(call); tl_free(api, kind, TL_U64(ptr), r_, __LINE__, expect); } while (0)
#define FREE_SIZED(api, kind, call, ptr, size, expect) \
    do { int r_ = (int)(call); tl_free_sized(api, kind, TL_U64(ptr), (unsigned long long)(size), r_, __LINE__, expect); } while (0)
#define MAP(call, va, size, handle, expect) \
    do { int r_ = (int)(call); tl_map(TL_U64(va), (unsigned long long)(size), (unsigned long long)(handle), r_, __LINE__, expect); } while (0)
#define UNMAP(call, va, size, expect) \
    do { int r_ = (int)(call); tl_unmap(TL_U64(va), (unsigned long long)(size), r_, __LINE__, expect); } while (0)
/* any other call that must succeed (setup etc.), not logged */
#define MUST(call) \
    do { int r_ = (int)(call); tl_check(#call, r_, 0, __LINE__); } while (0)

#define MiB (1024ULL * 1024ULL)
#define KiB 1024ULL

#endif
