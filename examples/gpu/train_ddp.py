"""Multi-GPU validation (issue 7; needs 2 GPUs): a small DDP model over NCCL, launched by
`gpumemtrace run -- torchrun --nproc_per_node=2 examples/gpu/train_ddp.py`. Each rank prints
PyTorch's own view of its device (`memory_reserved` / `max_memory_reserved`) for comparison with
its trace (named by rank). NCCL's own buffers do not appear in PyTorch's numbers."""
import json
import os

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off (device README)
dist.init_process_group("nccl")
rank = dist.get_rank()
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(2048, 8192), torch.nn.ReLU(), torch.nn.Linear(8192, 2048)).to(dev),
    device_ids=[local],
)
opt = torch.optim.Adam(model.parameters())
for step in range(10):
    x = torch.randn(256, 2048, device=dev)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
torch.cuda.synchronize()
print("TRUTH " + json.dumps({
    "rank": rank, "device": local,
    "reserved": torch.cuda.memory_reserved(dev),
    "max_reserved": torch.cuda.max_memory_reserved(dev),
}), flush=True)
dist.destroy_process_group()
