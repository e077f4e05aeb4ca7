/* Libraries for prog_unwind (fast unwinder against libgcc): the same code built three times,
 * with and without frame pointers, one of them loaded with dlopen. Every level is a real frame
 * (no inlining, no tail calls), so the stack runs through several objects and both styles. */
#ifndef PREFIX
#error define PREFIX
#endif
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

__attribute__((noinline)) int CAT(PREFIX, descend)(int depth, int (*next)(int), int x)
{
    int r;
    if (depth <= 0)
        r = next(x);
    else
        r = CAT(PREFIX, descend)(depth - 1, next, x + 1);
    __asm__ volatile("" ::: "memory"); /* no tail call */
    return r + 1;
}
