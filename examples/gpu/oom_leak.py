"""Real-GPU reliability check (docs/validation.md): a training-style loop that leaks 20 GiB a step
into a list until the GPU runs out of memory and PyTorch raises torch.cuda.OutOfMemoryError.
The trace must be readable and its summary must name the leaking line and show the live set at
the failed allocation."""
import torch

kept = []


def step(i):
    x = torch.empty(20 << 30, dtype=torch.uint8, device="cuda")  # the leak: 20 GiB a step
    kept.append(x)
    print(f"step {i}: {torch.cuda.memory_reserved() >> 30} GiB reserved", flush=True)


for i in range(100):
    step(i)
