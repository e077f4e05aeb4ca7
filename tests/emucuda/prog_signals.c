/*
 * prog_signals MODE: the program's own signal handlers, of every flavour of sigaction flags.
 * Each mode installs its handler, then allocates (which starts the tracer: its handlers go in
 * front of the program's), then faults or raises. A test runs each mode with and without the
 * tracer and compares output and exit status.
 *   oneshot-return        SA_RESETHAND SIGSEGV handler that returns without fixing the fault:
 *                         runs once, then the fault kills (SIGSEGV)
 *   oneshot-siginfo-return the same with SA_SIGINFO; prints whether si_addr is the fault address
 *   reraise               handler restores SIG_DFL and raises SIGSEGV: dies of SIGSEGV
 *   oneshot-reraise       SA_RESETHAND handler raises SIGSEGV (blocked while it runs), prints
 *                         "after raise", returns: dies of SIGSEGV then
 *   nodefer-reraise       SA_RESETHAND|SA_NODEFER: the raise kills at once ("after raise" never)
 *   nodefer-nest          SA_NODEFER handler raising SIGSEGV again, three levels deep, nested
 *   mask / mask-nodefer   prints which signals are blocked in the handler (sa_mask has SIGUSR1)
 *   onstack / offstack    with an alternate stack set: prints whether the handler runs on it
 *   overflow              stack overflow caught on the alternate stack (SA_ONSTACK): exits 9
 *   restart / norestart   SIGTERM handler with / without SA_RESTART interrupting a read()
 *   runtime N             a language runtime's guard page: N faults fixed with mprotect
 *   chain-later           handler installed after the tracer's, chaining to the saved one (as
 *                         faulthandler and JVMs do): prints, chains, dies of SIGSEGV
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "testlog.h"

static void say(const char *s) { write(1, s, strlen(s)); }

static void setup_and_alloc(void)
{
    CUcontext ctx = NULL;
    CUdevice dev;
    MUST(cuInit(0));
    MUST(cuDeviceGet(&dev, 0));
    MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
    MUST(cuCtxSetCurrent(ctx));
    CUdeviceptr d = 0;
    ALLOC("cuMemAlloc_v2", "device", cuMemAlloc_v2(&d, 8 * MiB), d, 8 * MiB, 0, 0);
}

static void install(int sig, void (*h)(int), void (*sa)(int, siginfo_t *, void *), int flags, int masked)
{
    struct sigaction act;
    memset(&act, 0, sizeof act);
    sigemptyset(&act.sa_mask);
    if (masked)
        sigaddset(&act.sa_mask, masked);
    act.sa_flags = flags;
    if (flags & SA_SIGINFO)
        act.sa_sigaction = sa;
    else
        act.sa_handler = h;
    if (sigaction(sig, &act, NULL) != 0) {
        perror("sigaction");
        _exit(1);
    }
}

static volatile int *volatile fault_at = (int *)16;
static void fault(void) { *fault_at = 1; }

static void h_print(int sig) { (void)sig; say("handler ran\n"); }

static void h_siginfo(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)ctx;
    say(si->si_addr == (void *)fault_at ? "handler ran si_addr=fault\n" : "handler ran si_addr=other\n");
}

static void h_reraise(int sig)
{
    say("handler ran\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void h_raise_inside(int sig)
{
    say("handler ran\n");
    raise(sig);
    say("after raise\n");
}

static volatile int depth;
static void h_nest(int sig)
{
    char line[32];
    int d = ++depth;
    snprintf(line, sizeof line, "enter %d\n", d);
    say(line);
    if (d < 3)
        raise(sig);
    snprintf(line, sizeof line, "leave %d\n", d);
    say(line);
}

static void h_mask(int sig)
{
    (void)sig;
    sigset_t now;
    sigprocmask(SIG_BLOCK, NULL, &now);
    char line[64];
    snprintf(line, sizeof line, "usr1_blocked=%d segv_blocked=%d term_blocked=%d\n", sigismember(&now, SIGUSR1),
             sigismember(&now, SIGSEGV), sigismember(&now, SIGTERM));
    say(line);
}

static char altstack[1 << 16];
static void h_where(int sig)
{
    (void)sig;
    char here;
    int on = &here >= altstack && &here < altstack + sizeof altstack;
    say(on ? "on_altstack=1\n" : "on_altstack=0\n");
}

static void h_overflow(int sig)
{
    (void)sig;
    say("overflow caught\n");
    _exit(9);
}

static int recurse(int n)
{
    volatile char pad[4096];
    pad[0] = (char)n;
    if (n < 0) /* never: keeps the compiler from calling this infinite */
        return 0;
    return recurse(n + 1) + pad[0];
}

static void h_term(int sig) { (void)sig; say("sigterm handled\n"); }

static int pipefd[2];
static void *send_term(void *arg)
{
    (void)arg;
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
    kill(getpid(), SIGTERM);
    nanosleep(&ts, NULL);
    nanosleep(&ts, NULL);
    write(pipefd[1], "x", 1);
    return NULL;
}

static char *page;
static long page_size;
static long fixed;
static void h_fixup(int sig, siginfo_t *si, void *ctx)
{
    (void)sig;
    (void)ctx;
    char *a = (char *)si->si_addr;
    if (a >= page && a < page + page_size) {
        mprotect(page, page_size, PROT_READ | PROT_WRITE);
        fixed++;
        return;
    }
    signal(SIGSEGV, SIG_DFL); /* a real crash */
}

static struct sigaction saved;
static void h_chain(int sig, siginfo_t *si, void *ctx)
{
    say("chaining to the previous handler\n");
    sigaction(sig, &saved, NULL);
    if (saved.sa_flags & SA_SIGINFO)
        saved.sa_sigaction(sig, si, ctx);
    else if (saved.sa_handler != SIG_DFL && saved.sa_handler != SIG_IGN)
        saved.sa_handler(sig);
    else
        raise(sig);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "oneshot-return")) {
        install(SIGSEGV, h_print, NULL, SA_RESETHAND, 0);
        setup_and_alloc();
        fault();
    } else if (!strcmp(mode, "oneshot-siginfo-return")) {
        install(SIGSEGV, NULL, h_siginfo, SA_SIGINFO | SA_RESETHAND, 0);
        setup_and_alloc();
        fault();
    } else if (!strcmp(mode, "reraise")) {
        install(SIGSEGV, h_reraise, NULL, 0, 0);
        setup_and_alloc();
        fault();
    } else if (!strcmp(mode, "oneshot-reraise")) {
        install(SIGSEGV, h_raise_inside, NULL, SA_RESETHAND, 0);
        setup_and_alloc();
        fault();
    } else if (!strcmp(mode, "nodefer-reraise")) {
        install(SIGSEGV, h_raise_inside, NULL, SA_RESETHAND | SA_NODEFER, 0);
        setup_and_alloc();
        fault();
    } else if (!strcmp(mode, "nodefer-nest")) {
        install(SIGSEGV, h_nest, NULL, SA_NODEFER, 0);
        setup_and_alloc();
        raise(SIGSEGV);
        say("main goes on\n");
        return 0;
    } else if (!strcmp(mode, "mask") || !strcmp(mode, "mask-nodefer")) {
        install(SIGSEGV, h_mask, NULL, !strcmp(mode, "mask") ? 0 : SA_NODEFER, SIGUSR1);
        setup_and_alloc();
        raise(SIGSEGV);
        say("main goes on\n");
        return 0;
    } else if (!strcmp(mode, "onstack") || !strcmp(mode, "offstack")) {
        stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
        sigaltstack(&ss, NULL);
        install(SIGSEGV, h_where, NULL, !strcmp(mode, "onstack") ? SA_ONSTACK : 0, 0);
        setup_and_alloc();
        raise(SIGSEGV);
        say("main goes on\n");
        return 0;
    } else if (!strcmp(mode, "overflow")) {
        stack_t ss = {.ss_sp = altstack, .ss_size = sizeof altstack, .ss_flags = 0};
        sigaltstack(&ss, NULL);
        install(SIGSEGV, h_overflow, NULL, SA_ONSTACK, 0);
        setup_and_alloc();
        return recurse(0);
    } else if (!strcmp(mode, "restart") || !strcmp(mode, "norestart")) {
        install(SIGTERM, h_term, NULL, !strcmp(mode, "restart") ? SA_RESTART : 0, 0);
        setup_and_alloc();
        if (pipe(pipefd) != 0)
            return 1;
        sigset_t term, old;
        sigemptyset(&term);
        sigaddset(&term, SIGTERM);
        pthread_sigmask(SIG_BLOCK, &term, &old); /* the helper thread never takes SIGTERM */
        pthread_t t;
        pthread_create(&t, NULL, send_term, NULL);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        char c;
        ssize_t n = read(pipefd[0], &c, 1);
        int err = errno;
        printf("read returned %zd%s\n", n, n < 0 && err == EINTR ? " EINTR" : "");
        fflush(stdout);
        pthread_join(t, NULL);
        return 0;
    } else if (!strcmp(mode, "runtime")) {
        long n = argc > 2 ? atol(argv[2]) : 2000;
        page_size = sysconf(_SC_PAGESIZE);
        page = mmap(NULL, page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        install(SIGSEGV, NULL, h_fixup, SA_SIGINFO, 0);
        setup_and_alloc();
        for (long i = 0; i < n; i++) {
            mprotect(page, page_size, PROT_NONE);
            ((volatile char *)page)[i % page_size] = 1;
        }
        printf("faults fixed=%ld\n", fixed);
        return 0;
    } else if (!strcmp(mode, "chain-later")) {
        setup_and_alloc();
        struct sigaction act;
        memset(&act, 0, sizeof act);
        act.sa_sigaction = h_chain;
        act.sa_flags = SA_SIGINFO;
        sigemptyset(&act.sa_mask);
        sigaction(SIGSEGV, &act, &saved);
        fault();
    }
    say("unknown mode or survived\n");
    return 3;
}
