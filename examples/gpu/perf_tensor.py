"""Per-tensor cost of tracing with real PyTorch stacks (examples/gpu/perf_tensor.sh): N
allocate+free pairs of a small CUDA tensor through the caching allocator (no kernel runs, so the
loop is pure CPU: each pair is two `reportMemoryUsageToProfiler` calls with PyTorch's real native
stack under a Python stack DEPTH frames deep). Prints `case=... ns_per_pair=X pairs=N`.
  python3 perf_tensor.py [PAIRS] [DEPTH]"""
import sys
import time

import torch

pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
depth = int(sys.argv[2]) if len(sys.argv) > 2 else 10
dev = torch.device("cuda")
a = torch.ones(64, device=dev)


def empty_loop():
    t0 = time.perf_counter_ns()
    for _ in range(pairs):
        x = torch.empty(256, device=dev)
        del x
    return time.perf_counter_ns() - t0


def op_loop():
    # Each op has its own dispatcher chain: many distinct native stacks, as in a model.
    t0 = time.perf_counter_ns()
    for _ in range(pairs // 4):
        b = a + 1
        c = a * b
        d = torch.relu(c)
        e = d.sum()
        del b, c, d, e
    return time.perf_counter_ns() - t0


def descend(d, f):
    return f() if d <= 0 else descend(d - 1, f)


for f in (empty_loop, op_loop):
    descend(depth, f)  # warm up: caches, the tracer's start
    torch.cuda.synchronize()
    ns = descend(depth, f)
    torch.cuda.synchronize()
    print(f"case={f.__name__} ns_per_pair={ns / pairs:.0f} pairs={pairs}", flush=True)
