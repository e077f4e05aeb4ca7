/* The definition that probe() in next_a.c must reach through RTLD_NEXT. */
int probe(void) { return 10; }
