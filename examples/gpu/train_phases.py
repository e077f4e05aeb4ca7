"""A small real PyTorch training loop for gpumemtrace's report pictures.

Phases come two ways: torch.cuda.nvtx ranges (forward/backward/optimizer, received through
NVTX injection, no code of ours) and gpumemtrace_mark via ctypes ("epoch N"). It leaks a
little on purpose (a list of cached batches) and ends with an allocation too large to fit.
"""
import ctypes
import os

import torch

gmt = ctypes.CDLL(None)  # the preloaded libgpumemtrace.so's symbols
mark = getattr(gmt, "gpumemtrace_mark", lambda name: 0)

dev = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Linear(4096, 8192), torch.nn.ReLU(),
    torch.nn.Linear(8192, 8192), torch.nn.ReLU(),
    torch.nn.Linear(8192, 4096),
).to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
cache = []  # the "leak": CACHE_MIB (default 64) per step
cache_mib = int(os.environ.get("CACHE_MIB", "64"))
for epoch in range(1, 4):
    mark(f"epoch {epoch}".encode())
    for step in range(4):
        x = torch.randn(2048, 4096, device=dev)
        with torch.cuda.nvtx.range("forward"):
            loss = model(x).square().mean()
        with torch.cuda.nvtx.range("backward"):
            loss.backward()
        with torch.cuda.nvtx.range("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        cache.append(torch.empty(cache_mib << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
mark(b"too big")
try:
    torch.empty(1 << 50, dtype=torch.uint8, device=dev)
except torch.cuda.OutOfMemoryError:
    print("out of memory, as intended")
torch.cuda.synchronize()
print("peak (torch.cuda.max_memory_reserved):", torch.cuda.max_memory_reserved())
