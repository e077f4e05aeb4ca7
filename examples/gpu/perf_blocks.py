"""Per-step time of two training loops, for examples/gpu/perf_blocks.sh (issue 11's cost):
  - launch-bound: a small MLP, batch 8 (about 1.5 ms and some 70 tensors a step: the CPU cost
    of tracing shows here);
  - GPU-bound: a wider MLP, batch 4096 (the GPU's time dominates).
Prints `loop=NAME us_per_step=X steps=N windows=...` for each, timed after warm-up,
CUDA-synchronized: the median of WINDOWS (default 5) windows of steps.

`perf_blocks.py alternate [LOOP]` (under LD_PRELOAD=libgpumemtrace.so): the cost of tracing inside
one process. PAIRS (default 40) pairs of windows of K (default 20) steps, one window traced and
one paused (gpumemtrace_pause: the hooks only forward), in turn first or second; prints each
pair's `traced_us=... paused_us=...` and a summary line `alternate loop=NAME pairs=N
traced_us=median paused_us=median added=median of the pairs' ratios (quartiles)`. Separate runs
of the same loop differ by 10-20 % on a shared host; windows a few milliseconds apart do not.
"""
import ctypes
import os
import statistics
import sys
import time

import torch

WINDOWS = int(os.environ.get("WINDOWS", "5"))
torch.manual_seed(0)
dev = "cuda"


def make_step(width, depth, batch):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step():
        x = torch.randn(batch, width, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run(name, width, depth, batch, steps):
    step = make_step(width, depth, batch)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    # The steps in WINDOWS windows; the median window is the run's figure (a pause of the
    # host in one window does not move it).
    per = []
    for _ in range(WINDOWS):
        t0 = time.perf_counter()
        for _ in range(steps // WINDOWS):
            step()
        torch.cuda.synchronize()
        per.append((time.perf_counter() - t0) / (steps // WINDOWS) * 1e6)
    us = statistics.median(per)
    shown = ",".join(f"{w:.0f}" for w in per)
    print(f"loop={name} us_per_step={us:.1f} steps={steps} windows={shown}", flush=True)


def window(step, k):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / k * 1e6


def alternate(name, width, depth, batch):
    gmt = ctypes.CDLL(None)
    if not hasattr(gmt, "gpumemtrace_pause"):
        sys.exit("alternate: run under LD_PRELOAD=libgpumemtrace.so (gpumemtrace_pause not found)")
    pairs, k = int(os.environ.get("PAIRS", "40")), int(os.environ.get("K", "20"))
    step = make_step(width, depth, batch)
    for _ in range(20):
        step()
    ratios, traced, paused = [], [], []
    for i in range(pairs):
        got = {}
        for state in (("traced", "paused") if i % 2 == 0 else ("paused", "traced")):
            (gmt.gpumemtrace_pause if state == "paused" else gmt.gpumemtrace_resume)()
            got[state] = window(step, k)
        gmt.gpumemtrace_resume()
        traced.append(got["traced"])
        paused.append(got["paused"])
        ratios.append(got["traced"] / got["paused"])
        print(f"pair={i} loop={name} traced_us={got['traced']:.1f} paused_us={got['paused']:.1f}", flush=True)
    q = statistics.quantiles(ratios, n=4)
    print(f"alternate loop={name} pairs={pairs} k={k} traced_us={statistics.median(traced):.1f} "
          f"paused_us={statistics.median(paused):.1f} added={100 * (statistics.median(ratios) - 1):+.2f}% "
          f"quartiles={100 * (q[0] - 1):+.2f}%..{100 * (q[2] - 1):+.2f}%", flush=True)


if len(sys.argv) > 1 and sys.argv[1] == "alternate":
    which = sys.argv[2] if len(sys.argv) > 2 else "launch-bound"
    if which == "launch-bound":
        alternate("launch-bound", 256, 6, 8)
    else:
        alternate("gpu-bound", 4096, 6, 8192)
    sys.exit(0)

only = sys.argv[1] if len(sys.argv) > 1 else None  # one loop by name, or both
if only in (None, "launch-bound"):
    # STEPS: a longer run (a sampling profiler needs more of the hooks' time than 600 steps give).
    run("launch-bound", 256, 6, 8, int(os.environ.get("STEPS", "600")))
if only in (None, "gpu-bound"):
    run("gpu-bound", 4096, 6, 8192, 60)
