"""torch.profiler's memory figures must be the same with and without the tracer (the tracer
forwards every block report to the profiler). Prints one JSON line: per op, the self CUDA memory
its kernels allocated, from key_averages().

  python3 profiler_check.py
"""
import json

import torch
from torch.profiler import ProfilerActivity, profile

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
x = torch.randn(256, 1024, device="cuda")
model(x).sum().backward()  # warm-up: caches, cuBLAS handles
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
    for _ in range(3):
        model(x).square().mean().backward()
    torch.cuda.synchronize()
mem = {e.key: e.self_device_memory_usage for e in prof.key_averages() if e.self_device_memory_usage}
print("PROFILER " + json.dumps(mem, sort_keys=True), flush=True)
