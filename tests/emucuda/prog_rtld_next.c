/* Checks that dlsym(RTLD_NEXT, ...) keeps its meaning under the tracer: prints "probe=11". */
#include <stdio.h>
int probe(void);
int main(void)
{
    printf("probe=%d\n", probe());
    return 0;
}
