"""Real-GPU check of the memory_viz export at block level (issue 11): is what we export what
torch.cuda.memory._snapshot() says, block for block?

  python3 memviz_compare.py snapshot TORCH.pickle          traced: a training loop that takes
      PyTorch's snapshot at its end and leaves at once (os._exit, once the tracer's writer has
      flushed), so the trace ends at the snapshot's moment
  python3 memviz_compare.py compare TORCH.pickle OURS.pickle
      prints the comparison as JSON; exit status 1 unless the active blocks (device, address,
      size) are equal
"""
import json
import os
import pickle
import sys
import time


def train(path):
    import torch

    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    kept = []
    for step in range(5):
        x = torch.randn(512 + 128 * step, 2048, device=dev)  # shapes change: blocks split and merge
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
        kept.append(torch.empty((3 + step) << 20, dtype=torch.uint8, device=dev))
        kept.append(torch.ones(1000 * (step + 1), device=dev))  # small-pool blocks
    big = torch.empty(600 << 20, dtype=torch.uint8, device=dev)
    del big, kept[0]
    torch.cuda.empty_cache()
    kept.append(torch.empty(5 << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    with open(path, "wb") as f:
        pickle.dump(snap, f)
    print(f"allocated={torch.cuda.memory_allocated()} reserved={torch.cuda.memory_reserved()}", flush=True)
    time.sleep(0.2)  # the tracer's writer flushes at least every 10 ms
    os._exit(0)


def blocks(snap):
    out = set()
    for s in snap["segments"]:
        addr = s["address"]
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                out.add((s["device"], addr, b["size"]))
            addr += b["size"]
    return out


def segments(snap):
    return {(s["device"], s["address"], s["total_size"], bool(s.get("is_expandable"))) for s in snap["segments"]}


def compare(torch_path, ours_path):
    with open(torch_path, "rb") as f:
        theirs = pickle.load(f)
    with open(ours_path, "rb") as f:
        ours = pickle.load(f)
    bt, bo = blocks(theirs), blocks(ours)
    st, so = segments(theirs), segments(ours)
    r = {
        "blocks_torch": len(bt), "blocks_ours": len(bo), "blocks_equal": bt == bo,
        "active_bytes_torch": sum(b[2] for b in bt), "active_bytes_ours": sum(b[2] for b in bo),
        "blocks_only_torch": sorted(bt - bo)[:20], "blocks_only_ours": sorted(bo - bt)[:20],
        "segments_torch": len(st), "segments_ours": len(so), "segments_equal": st == so,
        "reserved_torch": sum(s[2] for s in st), "reserved_ours": sum(s[2] for s in so),
        "segments_only_torch": sorted(st - so)[:20], "segments_only_ours": sorted(so - st)[:20],
        "trace_entries_ours": [len(t) for t in ours["device_traces"]],
    }
    print(json.dumps(r, indent=1))
    return 0 if r["blocks_equal"] else 1


if __name__ == "__main__":
    if sys.argv[1] == "snapshot":
        train(sys.argv[2])
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
