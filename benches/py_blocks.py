"""Driver for benches/py_blocks.sh: PAIRS tensors made and freed on the emulated PyTorch
(tests/python/site-packages/torch) from a Python stack DEPTH frames deep. Prints
    ns_per_pair=X"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python", "site-packages"))
import torch  # noqa: E402

pairs, depth = int(sys.argv[1]), int(sys.argv[2])


def deep(n, k):
    if k == 0:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            torch.empty(4096).free()
        return (time.perf_counter_ns() - t0) / n
    return deep(n, k - 1)


deep(2000, depth)  # warm: segments, caches
print(f"ns_per_pair={deep(pairs, depth):.1f}")
