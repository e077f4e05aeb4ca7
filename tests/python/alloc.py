"""Test program for gpumemtrace's Python stacks: calls the emulated CUDA driver through ctypes
(which releases the GIL around each call, as PyTorch's bindings do) from nested functions,
threads, a generator, a class method and through a stdlib module (sched). Every allocation is
leaked on purpose and logged on stdout with the line and function that made it:
    py_alloc size=N line=L func=QUALNAME thread=NAME
Usage: python3 alloc.py /path/to/libcuda.so.1 [--no-calls | --frees | --reuse | --pause]
--frees: instead, two blocks freed from Python, one by the main thread and one by a worker
thread, each logged as `py_free addr=A thread=NAME`.
--reuse: instead, functions compiled one after another, each called once and dropped, so that
later code objects take the addresses of earlier ones; each call is logged as above with
`code=ADDRESS` added.
--pause: instead, an allocation, then with tracing paused (gpumemtrace_pause) an allocation and
a free of the first, then resumed an allocation; each call logged as above or as py_free.
"""
import gc
import ctypes
import sched
import sys
import threading

lib = ctypes.CDLL(sys.argv[1])
lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
lock = threading.Lock()


def log(size, r):
    f = sys._getframe(1)
    assert r == 0, r
    with lock:
        print(f"py_alloc size={size} line={f.f_lineno} func={f.f_code.co_qualname if hasattr(f.f_code, 'co_qualname') else f.f_code.co_name} "
              f"thread={threading.current_thread().name} code={id(f.f_code)}", flush=True)


def setup():
    ctx = ctypes.c_void_p()
    assert lib.cuInit(0) == 0
    assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert lib.cuCtxSetCurrent(ctx) == 0
    return ctx


def innermost(n):
    p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n); log(n, r)


def middle(n):
    innermost(n)
    p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n + 1024); log(n + 1024, r)


def outer(n):
    middle(n)


def in_thread(n):
    ctx = setup()
    p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n); log(n, r)


def generator(sizes):
    for n in sizes:
        p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n); log(n, r)
        yield p.value


class Model:
    def forward(self, n):
        p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n); log(n, r)
        return p.value


def through_stdlib(n):
    s = sched.scheduler()
    p = ctypes.c_uint64()
    s.enter(0, 1, lib.cuMemAlloc_v2, (ctypes.byref(p), n))
    s.run(); log(n, 0)


def free(p):
    assert lib.cuMemFree_v2(p) == 0
    print(f"py_free addr={p} thread={threading.current_thread().name}", flush=True)


def frees():
    setup()
    a, b = ctypes.c_uint64(), ctypes.c_uint64()
    assert lib.cuMemAlloc_v2(ctypes.byref(a), 4096) == 0
    assert lib.cuMemAlloc_v2(ctypes.byref(b), 8192) == 0
    free(a.value)
    worker = threading.Thread(target=lambda: (setup(), free(b.value)), name="freer")
    worker.start()
    worker.join()


def reuse():
    setup()
    for k in range(24):
        # Each function at its own line of its own name: a code object that took a freed one's
        # address must not be named (or have its lines read) as the old one.
        src = "\n" * (k % 5) + f"def made_{k}(n):\n    p = ctypes.c_uint64(); r = lib.cuMemAlloc_v2(ctypes.byref(p), n); log(n, r)\n"
        ns = {"ctypes": ctypes, "lib": lib, "log": log}
        exec(compile(src, "generated.py", "exec"), ns)
        ns[f"made_{k}"](4096 * (k + 1))
        del ns
        gc.collect()


def paused():
    setup()
    gmt = ctypes.CDLL(None)
    a, b, c = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
    r = lib.cuMemAlloc_v2(ctypes.byref(a), 1 << 20); log(1 << 20, r)
    assert gmt.gpumemtrace_pause() == 0
    r = lib.cuMemAlloc_v2(ctypes.byref(b), 2 << 20); log(2 << 20, r)
    free(a.value)
    assert gmt.gpumemtrace_resume() == 0
    r = lib.cuMemAlloc_v2(ctypes.byref(c), 3 << 20); log(3 << 20, r)


def main():
    if "--pause" in sys.argv:
        paused()
        return
    if "--reuse" in sys.argv:
        reuse()
        return
    if "--no-calls" in sys.argv:
        print("no calls made")
        return
    if "--frees" in sys.argv:
        frees()
        return
    setup()
    outer(1 << 20)
    threads = [threading.Thread(target=in_thread, args=(3 << 20 + i,), name=f"worker-{i}") for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    list(generator([5 << 10, 6 << 10]))
    Model().forward(7 << 10)
    through_stdlib(9 << 10)


main()
