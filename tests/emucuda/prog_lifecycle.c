/*
 * prog_lifecycle MODE [ARG]: process-lifecycle situations the tracer must survive.
 * Each allocation prints its op= line (testlog.h) before anything else happens.
 *   fork            parent allocates, forks a child that allocates and one that never touches
 *                   CUDA, then allocates again; prints child_cuda_pid= and child_nocuda_pid=
 *   exec PROGRAM    allocates, then execv()s PROGRAM (traced again through LD_PRELOAD)
 *   segv|abort|bus|fpe|term|kill   allocates (a leak), then dies of that signal
 *   atexit          an atexit handler, registered before the first CUDA call (so it runs after
 *                   the tracer's own), frees an allocation at exit
 *   thread-exit     a second thread calls exit() while the main thread sleeps
 *   vfork           allocates, runs /bin/true through vfork + execv (the child shares the
 *                   parent's memory), then allocates again
 *   _exit|_Exit|quick_exit|kill-now   allocates (a leak), then ends that way at once
 *   _Fork-exit      allocates, makes a child with _Fork() (no fork handlers run: the child
 *                   has the parent's tracer state but none of its threads) that calls exit(0)
 *                   (exit handlers run), then allocates again
 *   fork-_exit      a forked child allocates three times and leaves with _exit(0), as
 *                   multiprocessing workers do; prints child_pid=
 *   closefrom       allocates, closes every descriptor above 2 (as daemons do), opens its own
 *                   file host.txt, writes one line to it, allocates twice more, waits 50 ms
 *   stderr-file     allocates, puts its own file host-stderr.txt on descriptor 2 (dup2),
 *                   writes one line to it, allocates twice more
 *   dlopen-kill     allocates, dlopen()s libunwind_c.so (beside the program; its loading
 *                   allocates nothing), waits 200 ms, allocates through it (a callback at
 *                   the bottom of uc_descend), then raise(SIGKILL) at once
 *   handler         installs its own SIGSEGV handler (prints "own handler ran", exits 42),
 *                   then segfaults: the program's handler must still run
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "testlog.h"

static CUdeviceptr kept;

static void setup(void)
{
    CUcontext ctx = NULL;
    CUdevice dev;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
}

static CUdeviceptr alloc_leak(size_t size)
{
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, size), d, size, 0, 0);
    return d;
}

static int alloc_4mib(int x)
{
    alloc_leak(4 * MiB);
    return x;
}

static void free_kept_at_exit(void)
{
    FREE("cuMemFree_v2", "device", cuMemFree_v2(kept), kept, 0);
}

static void *exit_from_thread(void *arg)
{
    (void)arg;
    alloc_leak(5 * MiB);
    exit(0);
}

static void own_handler(int sig)
{
    (void)sig;
    static const char msg[] = "own handler ran\n";
    write(1, msg, sizeof msg - 1);
    _exit(42);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "atexit"))
        atexit(free_kept_at_exit); /* before the tracer starts: runs after its exit handler */
    setup();
    if (!strcmp(mode, "fork")) {
        alloc_leak(1 * MiB);
        pid_t c1 = fork();
        if (c1 == 0) {
            CUdeviceptr d = alloc_leak(2 * MiB);
            FREE("cuMemFree_v2", "device", cuMemFree_v2(d), d, 0);
            alloc_leak(3 * MiB);
            exit(0);
        }
        waitpid(c1, NULL, 0);
        pid_t c2 = fork();
        if (c2 == 0) {
            printf("child without CUDA calls\n");
            exit(0);
        }
        waitpid(c2, NULL, 0);
        printf("child_cuda_pid=%d\nchild_nocuda_pid=%d\n", c1, c2);
        alloc_leak(4 * MiB);
        return 0;
    }
    if (!strcmp(mode, "_Fork-exit")) {
        alloc_leak(1 * MiB);
        pid_t c = _Fork();
        if (c == 0)
            exit(0);
        int st = 0;
        waitpid(c, &st, 0);
        alloc_leak(2 * MiB);
        return WEXITSTATUS(st);
    }
    if (!strcmp(mode, "exec")) {
        alloc_leak(1 * MiB);
        char *args[] = {argv[2], NULL};
        execv(argv[2], args);
        perror("execv");
        return 1;
    }
    if (!strcmp(mode, "vfork")) {
        alloc_leak(1 * MiB);
        pid_t c = vfork();
        if (c == 0) {
            char *args[] = {"/bin/true", NULL};
            execv("/bin/true", args);
            _exit(127);
        }
        int st = 0;
        waitpid(c, &st, 0);
        alloc_leak(2 * MiB);
        return WEXITSTATUS(st);
    }
    if (!strcmp(mode, "atexit")) {
        kept = alloc_leak(6 * MiB);
        return 0;
    }
    if (!strcmp(mode, "thread-exit")) {
        pthread_t t;
        pthread_create(&t, NULL, exit_from_thread, NULL);
        sleep_ms(10000);
        return 1;
    }
    if (!strcmp(mode, "handler")) {
        signal(SIGSEGV, own_handler);
        alloc_leak(7 * MiB);
        *(volatile int *)8 = 1;
        return 1;
    }
    if (!strcmp(mode, "closefrom")) {
        int fd, i;
        alloc_leak(1 * MiB);
        sleep_ms(30); /* the writer has written to its descriptor */
        for (i = 3; i < 4096; i++)
            close(i);
        fd = open("host.txt", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (write(fd, "host data\n", 10) != 10)
            return 4;
        alloc_leak(2 * MiB);
        alloc_leak(3 * MiB);
        sleep_ms(50);
        close(fd);
        printf("host_fd=%d\n", fd);
        return 0;
    }
    if (!strcmp(mode, "stderr-file")) {
        int fd;
        alloc_leak(1 * MiB);
        fd = open("host-stderr.txt", O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) != 2 || write(2, "host line\n", 10) != 10)
            return 4;
        close(fd);
        alloc_leak(2 * MiB);
        alloc_leak(3 * MiB);
        return 0;
    }
    if (!strcmp(mode, "dlopen-kill")) {
        char path[4096];
        void *lib;
        int (*descend)(int, int (*)(int), int);
        alloc_leak(1 * MiB);
        snprintf(path, sizeof path, "%s", argv[0]);
        snprintf(strrchr(path, '/') + 1, sizeof path - (size_t)(strrchr(path, '/') + 1 - path), "libunwind_c.so");
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!lib || !(descend = (int (*)(int, int (*)(int), int))dlsym(lib, "uc_descend")))
            return 4;
        sleep_ms(200); /* the tracer has seen the library arrive */
        descend(2, alloc_4mib, 0);
        raise(SIGKILL);
        return 3;
    }
    if (!strcmp(mode, "fork-_exit")) {
        pid_t pid = fork();
        if (pid == 0) {
            alloc_leak(1 * MiB);
            alloc_leak(2 * MiB);
            alloc_leak(3 * MiB);
            _exit(0);
        }
        waitpid(pid, NULL, 0);
        printf("child_pid=%d\n", (int)pid);
        return 0;
    }
    alloc_leak(8 * MiB);
    alloc_leak(9 * MiB);
    if (!strcmp(mode, "_exit")) {
        _exit(5);
    } else if (!strcmp(mode, "_Exit")) {
        _Exit(6);
    } else if (!strcmp(mode, "quick_exit")) {
        quick_exit(7);
    } else if (!strcmp(mode, "kill-now")) {
        raise(SIGKILL);
    } else if (!strcmp(mode, "segv")) {
        *(volatile int *)8 = 1;
    } else if (!strcmp(mode, "abort")) {
        abort();
    } else if (!strcmp(mode, "bus")) {
        char path[] = "/tmp/gmt-busXXXXXX";
        int fd = mkstemp(path);
        unlink(path);
        volatile char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); /* empty file */
        p[0] = 1;                                                                      /* SIGBUS */
    } else if (!strcmp(mode, "fpe")) {
        raise(SIGFPE);
    } else if (!strcmp(mode, "term")) {
        raise(SIGTERM);
    } else if (!strcmp(mode, "kill")) {
        sleep_ms(100); /* longer than the tracer's flush interval */
        raise(SIGKILL);
    }
    return 3;
}
