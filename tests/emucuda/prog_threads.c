/*
 * prog_threads: N threads (argv[1], default 4) each doing M (argv[2], default
 * 1000) cudaMalloc/cudaFree pairs; every thread leaks exactly one allocation
 * at the end.  Only the leaked allocations are logged, plus a summary line:
 *   total_pairs=<N*M> threads=<N> leaks=<N>
 * and, with PRINT_THREADS set, then the names of the process's other threads (the tracer's),
 * sorted:
 *   other_threads=<name>,<name>...
 * With PROGRESS_FILE set, each thread t stores in that file's t-th u64 how many calls it has
 * completed (the file is a shared mapping: what was stored survives a SIGKILL), and the
 * program prints "running" once every thread has made a first call.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cuda_runtime.h"
#include "testlog.h"

static int iters = 1000;
static volatile uint64_t *progress; /* per thread: calls completed */
static volatile int started;

static void done_call(int t)
{
    if (progress) {
        progress[t]++;
        if (progress[t] == 1 && __sync_add_and_fetch(&started, 1) < 0)
            abort();
    }
}

/* distinct per thread and per iteration, never zero */
static size_t pair_size(int t, int i) { return 4096 + (size_t)t * 256 + (size_t)(i % 97) * 512; }
static size_t leak_size(int t) { return 3 * MiB + (size_t)t * 4096; }

static void churn(int t)
{
    int i;
    for (i = 0; i < iters; i++) {
        void *p = NULL;
        tl_check("cudaMalloc", cudaMalloc(&p, pair_size(t, i)), 0, __LINE__);
        done_call(t);
        tl_check("cudaFree", cudaFree(p), 0, __LINE__);
        done_call(t);
    }
}

static void leak_one(int t)
{
    void *p = NULL;
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, leak_size(t)), p, leak_size(t), 0, 0);
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    churn(t);
    leak_one(t);
    return NULL;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The names of the threads other than the calling one (from /proc/self/task), sorted. */
static void print_other_threads(void)
{
    char names[64][32], path[300];
    int n = 0, me = (int)syscall(SYS_gettid);
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64) {
        if (e->d_name[0] == '.' || atoi(e->d_name) == me)
            continue;
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        int fd = open(path, O_RDONLY);
        ssize_t r = fd >= 0 ? read(fd, names[n], sizeof names[n] - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (r <= 0)
            continue;
        names[n][r] = 0;
        names[n][strcspn(names[n], "\n")] = 0;
        n++;
    }
    if (d)
        closedir(d);
    qsort(names, n, sizeof names[0], by_name);
    printf("other_threads=");
    for (int i = 0; i < n; i++)
        printf("%s%s", i ? "," : "", names[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 4, i;
    pthread_t *th;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 2)
        iters = atoi(argv[2]);
    if (n < 1 || iters < 0) {
        fprintf(stderr, "usage: %s [threads] [pairs-per-thread]\n", argv[0]);
        return 2;
    }
    if (getenv("PROGRESS_FILE")) {
        int fd = open(getenv("PROGRESS_FILE"), O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)n * 8) != 0)
            return 2;
        progress = mmap(NULL, (size_t)n * 8, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (progress == MAP_FAILED)
            return 2;
    }
    MUST(cudaFree(0));
    th = calloc((size_t)n, sizeof(*th));
    for (i = 0; i < n; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) != 0) {
            fprintf(stderr, "EMUCUDA-TEST-FAILURE: pthread_create\n");
            return 1;
        }
    if (progress) {
        while (started < n)
            usleep(1000);
        printf("running\n");
    }
    for (i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    free(th);
    printf("total_pairs=%lld threads=%d leaks=%d\n", (long long)n * iters, n, n);
    if (getenv("PRINT_THREADS"))
        print_other_threads();
    return 0;
}
