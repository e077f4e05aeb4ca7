"""Per-step time of two training loops, for examples/gpu/perf_blocks.sh (issue 11's cost):
  - launch-bound: a small MLP, batch 8 (about 1.5 ms and some 70 tensors a step: the CPU cost
    of tracing shows here);
  - GPU-bound: a wider MLP, batch 4096 (the GPU's time dominates).
Prints `loop=NAME us_per_step=X steps=N windows=...` for each, timed after warm-up,
CUDA-synchronized: the median of WINDOWS (default 5) windows of steps.
"""
import os
import statistics
import sys
import time

import torch

WINDOWS = int(os.environ.get("WINDOWS", "5"))
torch.manual_seed(0)
dev = "cuda"


def run(name, width, depth, batch, steps):
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


only = sys.argv[1] if len(sys.argv) > 1 else None  # one loop by name, or both
if only in (None, "launch-bound"):
    run("launch-bound", 256, 6, 8, 600)
if only in (None, "gpu-bound"):
    run("gpu-bound", 4096, 6, 8192, 60)
