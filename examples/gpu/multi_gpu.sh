#!/usr/bin/env bash
# Multi-GPU validation (issue 7): run on a machine with 2 or more GPUs, from the repo root:
#   BIN=target/release examples/gpu/multi_gpu.sh
# 1. torchrun with 2 ranks (DDP, NCCL): one trace per rank, named by rank, each rank's memory on
#    its own device, NCCL's buffers visible; merged summary with per-rank and per-device peaks.
# Compare each rank's device peak in the merged summary with its TRUTH line (PyTorch's
# max_memory_reserved): the trace's peak is larger by NCCL's and cuBLAS's own allocations.
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
W=${WORK:-$(mktemp -d)}
mkdir -p "$W/ddp"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
"$BIN/gpumemtrace" run --output "$W/ddp" --frames 3 -- \
    torchrun --nproc_per_node=2 examples/gpu/train_ddp.py 2>&1
echo "exit code $?"
ls -l "$W/ddp"
"$BIN/gpumemtrace" summary --json "$W/ddp" > "$W/ddp.json"
python3 - "$W/ddp.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for p in s.get("merged", {}).get("processes", []):
    print("rank", p["rank"], "local", p["local_rank"], "pid", p["pid"], "peaks by device", p["peaks"])
for d in s.get("merged", {}).get("devices", []):
    print("device", d["device"], "combined peak", d["peak_bytes"], "shares", d["peak_by_pid"])
PY
