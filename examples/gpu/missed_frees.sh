#!/usr/bin/env bash
# Why does a PyTorch run without the caching allocator show "allocations at addresses already
# live"? (issue 13) From the repo root on a GPU machine: BIN=target/release examples/gpu/missed_frees.sh
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
GMT="$BIN/gpumemtrace"
W=${WORK:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
for script in train.py perf_train.py; do
    printf '\n===== %s, PYTORCH_NO_CUDA_MEMORY_CACHING=1\n' "$script"
    rm -rf "$W/$script"; mkdir -p "$W/$script"
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$GMT" run --output "$W/$script" -- python3 "$HERE/$script" ${ARGS:-} >/dev/null 2>"$W/$script.err"
    echo "exit code $?"; grep -i "already live\|gpumemtrace:" "$W/$script.err" | head -5
    for t in "$W/$script"/*.trace; do
        "$GMT" dump "$t" | python3 "$HERE/missed_frees.py"
    done
done
