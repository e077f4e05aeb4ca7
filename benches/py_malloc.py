"""Peer driver for benches/overhead.rs: the same loop as py_alloc.py, allocating and freeing a
4 KiB bytearray instead (Python asks libc's malloc for it: what memray traces; memray does not see
malloc called through ctypes, which bypasses the PLT it patches). Prints one line:
    pairs=N depth=D wall_ns=W
Usage: python3 py_malloc.py IGNORED PAIRS DEPTH"""
import sys
import time

pairs, depth = int(sys.argv[2]), int(sys.argv[3])


def loop():
    t0 = time.perf_counter_ns()
    for i in range(pairs):
        b = bytearray(4096)
        del b
    return time.perf_counter_ns() - t0


def descend(d):
    return loop() if d <= 0 else descend(d - 1)


descend(2)  # warm up
print(f"pairs={pairs} depth={depth} wall_ns={descend(depth)}")
