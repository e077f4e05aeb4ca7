"""Python driver for benches/overhead.rs: N cuMemAlloc_v2 + cuMemFree_v2 pairs through ctypes
(GIL released, as in PyTorch) from a Python stack DEPTH frames deep. Prints one line:
    pairs=N depth=D wall_ns=W
Usage: python3 py_alloc.py LIBCUDA PAIRS DEPTH
BENCH_COLD_KB=N: between pairs, copy N KiB (so the tracer's lines are evicted, as on a busy host).
BENCH_ALTERNATE=1: every other allocation is made one Python frame deeper, so that no allocation's
stack is its thread's last one (as in a training step, whose allocations come from many places).
BENCH_DISTINCT=1: each of the DEPTH frames runs a code object of its own (a training step's stack
is made of different functions; the plain recursion runs one code object in every frame)."""
import os
import ctypes
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
pairs, depth = int(sys.argv[2]), int(sys.argv[3])
ctx = ctypes.c_void_p()
assert lib.cuInit(0) == 0
assert lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert lib.cuCtxSetCurrent(ctx) == 0
alloc, free = lib.cuMemAlloc_v2, lib.cuMemFree_v2
free.argtypes = [ctypes.c_uint64]


cold_kb = int(os.environ.get("BENCH_COLD_KB", "0"))
alternate = os.environ.get("BENCH_ALTERNATE") == "1"


def deeper(ref):
    alloc(ref, 4096)
src, dst = bytearray(cold_kb << 10), bytearray(cold_kb << 10)


def loop():
    p = ctypes.c_uint64()
    ref = ctypes.byref(p)
    t0 = time.perf_counter_ns()
    for i in range(pairs):
        if alternate and i & 1:
            deeper(ref)
        else:
            alloc(ref, 4096)
        free(p.value)
        if cold_kb:
            dst[:] = src
    return time.perf_counter_ns() - t0


def descend(d):
    return loop() if d <= 0 else descend(d - 1)


if os.environ.get("BENCH_DISTINCT") == "1":
    # level_k calls level_{k-1}; level_0 runs the loop: DEPTH code objects, one a frame.
    levels = {"loop": loop}
    for k in range(max(depth, 2) + 1):
        exec(f"def level_{k}():\n    return {'loop' if k == 0 else f'level_{k - 1}'}()", levels)

    def descend(d):  # noqa: F811 (the distinct-frames variant)
        return levels[f"level_{max(d, 0)}"]()


descend(2)  # warm up (and start the tracer)
print(f"pairs={pairs} depth={depth} wall_ns={descend(depth)}")
