"""Two ranks on one GPU through torchrun and gloo, for examples/gpu/blocks_validate.sh: each
rank trains a small model with DistributedDataParallel, keeps rank-dependent tensors, and
writes its own accounting to DIR/truth-RANK.json before exiting.

  torchrun --standalone --nproc_per_node=2 ddp_blocks.py DIR
"""
import json
import os
import sys

import torch
import torch.distributed as dist

out_dir = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
dev = torch.device("cuda", 0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).to(dev))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []
for step in range(5):
    loss = model(torch.randn(64, 1024, device=dev)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    kept.append(torch.empty((rank + 1) << 20, dtype=torch.uint8, device=dev))  # rank r keeps (r+1) MiB a step
torch.cuda.synchronize()
truth = {"rank": rank, "allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated(),
         "reserved": torch.cuda.memory_reserved(), "max_reserved": torch.cuda.max_memory_reserved()}
json.dump(truth, open(os.path.join(out_dir, f"truth-{rank}.json"), "w"))
dist.barrier()
dist.destroy_process_group()
