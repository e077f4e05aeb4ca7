"""The classic PyTorch leak, for examples/gpu/blocks_validate.sh: a training step whose loss is
kept (`losses.append(loss)`) after `backward(retain_graph=True)`, so every step's graph and its
saved activations stay allocated. At the end it writes PyTorch's own accounting to TRUTH.json:
memory_allocated/max_memory_allocated/memory_reserved/max_memory_reserved and the active blocks
and segments of torch.cuda.memory._snapshot(), then exits (nothing is allocated after).

  python3 torch_leak.py TRUTH.json [steps]
"""
import json
import sys

import torch

truth_path = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
losses = []


def train_step(x):
    out = model(x)  # LINE forward: the activations the kept graph holds
    loss = out.square().mean()
    loss.backward(retain_graph=True)  # LINE backward
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


for step in range(steps):
    x = torch.randn(512, 1024, device=dev)  # LINE input
    loss = train_step(x)
    losses.append(loss)  # LINE keep: the leak (loss.item() would not keep the graph)

torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
lines = {}
for i, text in enumerate(open(__file__), 1):
    if "# LINE " in text and "split" not in text:
        lines[text.split("# LINE ")[1].split(":")[0].strip()] = i  # noqa
truth = {
    "allocated": torch.cuda.memory_allocated(),
    "max_allocated": torch.cuda.max_memory_allocated(),
    "reserved": torch.cuda.memory_reserved(),
    "max_reserved": torch.cuda.max_memory_reserved(),
    "active_blocks": sorted(
        [b["address"], b["size"]]
        for seg in snap["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"),
    "segments": sorted([seg["address"], seg["total_size"]] for seg in snap["segments"]),
    "lines": lines,
}
json.dump(truth, open(truth_path, "w"))
print(f"torch: allocated {truth['allocated']} in {len(truth['active_blocks'])} blocks, "
      f"max_allocated {truth['max_allocated']}, reserved {truth['reserved']}", flush=True)
