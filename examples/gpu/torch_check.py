"""Real-GPU validation with PyTorch (docs/validation.md).

Allocates in a known pattern and prints, at each checkpoint, CLOCK_MONOTONIC and PyTorch's own
view of what it holds from CUDA (torch.cuda.memory_reserved / max_memory_reserved), so the trace
can be compared with the truth at the same moments. Run it with the default caching allocator
and with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
"""
import json
import time

import torch

checkpoints = []


def checkpoint(label):
    torch.cuda.synchronize()
    checkpoints.append({
        "label": label,
        "t_ns": time.monotonic_ns(),
        "reserved": torch.cuda.memory_reserved(),
        "max_reserved": torch.cuda.max_memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
    })


def main():
    dev = torch.device("cuda")
    checkpoint("start")
    model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    checkpoint("model")
    leak = []
    for step in range(3):
        x = torch.randn(2048, 4096, device=dev)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        leak.append(torch.empty(16 << 20, dtype=torch.uint8, device=dev))  # kept: 16 MiB a step
        checkpoint(f"step{step}")
    big = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    checkpoint("big")
    del big
    torch.cuda.empty_cache()  # hands unused segments back: cudaFree / cuMemUnmap + cuMemRelease
    checkpoint("emptied")
    print("TRUTH " + json.dumps(checkpoints), flush=True)


if __name__ == "__main__":
    main()
