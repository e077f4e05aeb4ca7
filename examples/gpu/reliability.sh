#!/usr/bin/env bash
# Real-GPU reliability checks (results: docs/validation.md). From the repo root, on a GPU machine:
#   BIN=target/release examples/gpu/reliability.sh
# 1. PyTorch leaks until torch.cuda.OutOfMemoryError: summary names the leak and the live set at
#    the failed allocation. 2. A CUDA C program segfaults after allocating: the trace is readable
#    and the process still dies of SIGSEGV.
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
GMT="$BIN/gpumemtrace"
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"

printf '\n===== torch OOM: python3 examples/gpu/oom_leak.py\n'
"$GMT" run --output "$W/oom" --frames 3 -- python3 examples/gpu/oom_leak.py 2>&1 | tail -n 60
echo "exit code ${PIPESTATUS[0]}"

printf '\n===== segfault after allocating: segv_after_alloc\n'
nvcc -O1 -g -o "$W/segv_after_alloc" examples/gpu/segv_after_alloc.cu
"$GMT" run --output "$W/segv" -- "$W/segv_after_alloc"
echo "exit code $? (139 = killed by SIGSEGV)"
