// Emulated libtorch_cuda.so: operators and an autograd node that allocate through the emulated
// caching allocator (libc10_cuda.so), with the symbol names PyTorch's own frames have, plus a
// C API for the test programs (a C program through dlopen, Python through ctypes).
//
// torch_emu_run_backward runs "backward" the way PyTorch's engine does for CUDA tensors: on a
// device thread of its own (named pt_autograd_0), while the calling thread waits.
#include <pthread.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>

namespace c10 { namespace cuda { namespace CUDACachingAllocator {
void *malloc(uint64_t n);
void free(void *p);
}}}

#define NOINLINE __attribute__((noinline))

namespace at { namespace _ops {
struct empty_memory_format {
    NOINLINE static void *call(uint64_t n) { return c10::cuda::CUDACachingAllocator::malloc(n); }
};
struct mm {
    NOINLINE static void *call(uint64_t n) { return empty_memory_format::call(n); }
};
}} // namespace at::_ops

namespace torch { namespace autograd { namespace generated {
struct MmBackward0 {
    NOINLINE void *apply(uint64_t n) { return at::_ops::mm::call(n); }
};
}}} // namespace torch::autograd::generated

// Tensors still alive at exit are freed by a C exit handler, as Python's shutdown frees a
// program's tensors from C with no Python frame running.
static std::mutex live_mu;
static std::set<void *> live;

static void free_live_at_exit()
{
    for (void *p : live)
        c10::cuda::CUDACachingAllocator::free(p);
    live.clear();
}

static void *track(void *p)
{
    static bool registered;
    std::lock_guard<std::mutex> g(live_mu);
    if (!registered) {
        registered = true;
        atexit(free_live_at_exit); // after the tracer's (it started with the first segment)
    }
    if (p)
        live.insert(p);
    return p;
}

namespace {
struct BackwardTask {
    int n;
    uint64_t size;
    void **out;
};

void *engine_thread_main(void *arg)
{
    auto *t = static_cast<BackwardTask *>(arg);
    pthread_setname_np(pthread_self(), "pt_autograd_0");
    torch::autograd::generated::MmBackward0 node;
    for (int i = 0; i < t->n; i++)
        t->out[i] = track(node.apply(t->size));
    return nullptr;
}
} // namespace

extern "C" {
NOINLINE void *torch_emu_empty(unsigned long long n) { return track(at::_ops::empty_memory_format::call(n)); }
NOINLINE void *torch_emu_mm(unsigned long long n) { return track(at::_ops::mm::call(n)); }
void torch_emu_free(void *p)
{
    {
        std::lock_guard<std::mutex> g(live_mu);
        live.erase(p);
    }
    c10::cuda::CUDACachingAllocator::free(p);
}

// Allocates n gradients of `size` bytes on the autograd thread; the caller waits.
int torch_emu_run_backward(int n, unsigned long long size, void **out)
{
    BackwardTask t{n, size, out};
    pthread_t th;
    if (pthread_create(&th, nullptr, engine_thread_main, &t) != 0)
        return -1;
    pthread_join(th, nullptr);
    return 0;
}
}
