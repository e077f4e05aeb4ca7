#!/usr/bin/env bash
# Real-GPU validation of the tracer core (results: docs/validation.md). From the repo root, on a
# machine with an NVIDIA GPU, nvcc, PyTorch and JAX:
#   BIN=target/release examples/gpu/validate.sh
# BIN holds libgpumemtrace.so and gpumemtrace (built here or elsewhere for the same arch).
# For each case: run it under `gpumemtrace run`, print the summary, dump the trace and compare
# it with the truth (examples/gpu/compare.py). Exit status 1 if any comparison failed.
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
GMT="$BIN/gpumemtrace"
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
fail=0
section() { printf '\n===== %s\n' "$*"; }

section machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
nvcc --version | tail -2
python3 -c 'import sys, torch, jax; print("python", sys.version.split()[0], "torch", torch.__version__, "jax", jax.__version__)'

section build
nvcc -O1 -g -I tests/emucuda -o "$W/alloc_static" examples/gpu/alloc_paths.cu || fail=1
nvcc -O1 -g -I tests/emucuda -cudart shared -o "$W/alloc_shared" examples/gpu/alloc_paths.cu || fail=1
ldd "$W/alloc_static" | grep -c cudart | sed 's/^/alloc_static links libcudart dynamically: /'
ldd "$W/alloc_shared" | grep cudart

# case NAME COMPARE-MODE CMD...
case_() {
    local name=$1 mode=$2; shift 2
    section "$name: $*"
    mkdir -p "$W/$name"
    "$GMT" run --output "$W/$name" -- "$@" >"$W/$name.log" 2>"$W/$name.summary"
    echo "exit code $?"
    cat "$W/$name.summary"
    local traces=("$W/$name"/*.trace)
    echo "traces: ${#traces[@]}"
    "$GMT" dump "${traces[0]}" >"$W/$name.jsonl"
    python3 examples/gpu/compare.py "$mode" "$W/$name.log" "$W/$name.jsonl" || fail=1
}

cases=${CASES:-nvcc-static-cudart nvcc-shared-cudart torch-default torch-expandable jax}
want() { [[ " $cases " == *" $1 "* ]]; }
want nvcc-static-cudart && case_ nvcc-static-cudart log "$W/alloc_static"
want nvcc-shared-cudart && case_ nvcc-shared-cudart log "$W/alloc_shared"
want torch-default && case_ torch-default torch python3 examples/gpu/torch_check.py
want torch-expandable && PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True case_ torch-expandable torch python3 examples/gpu/torch_check.py
want jax && XLA_PYTHON_CLIENT_MEM_FRACTION=0.10 case_ jax jax python3 examples/gpu/jax_check.py

section "result"
[ $fail = 0 ] && echo "ALL CASES MATCH" || echo "SOME CASES DID NOT MATCH"
exit $fail
