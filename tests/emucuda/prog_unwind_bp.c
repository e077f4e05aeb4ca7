/* Stacks for tests/unwind.rs where rbp matters in some frames and not in others (frames in
 * unwind_bp.S), each allocation compared with libgcc's stack:
 *  1. through a frame like libffi's ffi_call_unix64 (CFA = rbp + 32), at alternating depths;
 *  2. through fp_at, whose inner frames sit at the same stack addresses at every depth: only a
 *     saved rbp word, read by a frame that itself ignores rbp, tells the outer stacks apart
 *     (at two depths of one function, then from two functions called from one site);
 *  3. a loop whose caller keeps a changing value in rbp that no frame uses (the unwinder's memo
 *     should take these stacks without walking them).
 *   usage: prog_unwind_bp                                                                    */
#include <stdint.h>
#include <stdio.h>

#include "cuda.h"

int ua_descend(int depth, int (*next)(int), int x);
void leaf_asm(int x);
void ffi_like(int x);
void scramble_v(long v, int x);
void fp_at(uintptr_t target, int x);

#define NOINLINE __attribute__((noinline))
#define NOTAIL __asm__ volatile("" ::: "memory")

static uintptr_t target;

static NOINLINE int via_ffi_like(int x) { ffi_like(x); NOTAIL; return 0; }
static NOINLINE int via_fp_at(int x) { fp_at(target, x); NOTAIL; return 0; }

/* Called from one call site, each calls fp_at at its own depth: after in_big, its frames stay
 * intact below in_small's (fp_at moves the stack away), so every word the walk of in_big's
 * stack read still holds, but for the rbp that scramble_v saved (fp_at's frame pointer). */
static NOINLINE int in_big(int x)
{
    volatile char pad[4096];
    pad[0] = (char)x;
    fp_at(target, x);
    NOTAIL;
    return pad[0];
}
static NOINLINE int in_small(int x) { fp_at(target, x); NOTAIL; return 0; }
static int (*volatile pick)(int);

int main(void)
{
    cuInit(0);
    /* Far below every frame of this program (the main thread's stack is megabytes). */
    target = ((uintptr_t)__builtin_frame_address(0) - 65536) & ~(uintptr_t)15;
    for (int i = 0; i < 20; i++) ua_descend(1 + i % 2, via_ffi_like, i);
    for (int i = 0; i < 20; i++) ua_descend(1 + i % 2, via_fp_at, i);
    for (int i = 0; i < 20; i++) {
        pick = i % 2 ? in_small : in_big;
        pick(i);
    }
    for (long i = 0; i < 3000; i++) scramble_v(0x10000 + i, 7);
    printf("ok\n");
    return 0;
}
