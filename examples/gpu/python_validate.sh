#!/usr/bin/env bash
# Real-GPU validation of Python stacks (issue 3). From the repo root, on a machine with an NVIDIA
# GPU and PyTorch:
#   BIN=target/release examples/gpu/python_validate.sh
# BIN holds libgpumemtrace.so and gpumemtrace. Runs examples/gpu/train.py under `gpumemtrace run`
# with PyTorch's default caching allocator and with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every
# tensor is one cudaMalloc), prints each summary (with 4 frames per site) and checks that the
# peak and leak sites name train.py lines. Exit status 1 if a check failed.
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
GMT="$BIN/gpumemtrace"
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
fail=0
section() { printf '\n===== %s\n' "$*"; }

section machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'

run_case() {
    local name=$1; shift
    section "$name"
    rm -rf "$W/$name"; mkdir -p "$W/$name"
    env "$@" "$GMT" run --output "$W/$name" --frames 4 -- python3 examples/gpu/train.py >"$W/$name.log" 2>"$W/$name.summary"
    echo "exit code $?"
    cat "$W/$name.log"
    cat "$W/$name.summary"
    "$GMT" summary --json "$W/$name" >"$W/$name.json" || fail=1
    python3 - "$W/$name.json" "$name" <<'PY' || fail=1
import json, sys
s = json.load(open(sys.argv[1])); name = sys.argv[2]
ok = True
def lines(sites):
    return {(s.get("function"), (s.get("file") or "").rsplit("/", 1)[-1], s.get("line")) for s in sites}
for t in s["traces"]:
    if t["notices"]:
        print(f"{name}: notices: {t['notices']}")
    for g in t["groups"]:
        if g["kind"] not in ("device", "vmm-physical") or g["allocations"] == 0:
            continue
        peak, leak = lines(g["peak_sites"]), lines(g["leak_sites"])
        print(f"{name}: device {g['device']} {g['kind']}: peak sites {sorted(map(str, peak))}")
        print(f"{name}: device {g['device']} {g['kind']}: leak sites {sorted(map(str, leak))}")
        py_peak = [x for x in peak if x[1] == "train.py"]
        py_leak = [x for x in leak if x[1] == "train.py"]
        if not py_peak:
            print(f"{name}: FAIL: no peak site in train.py"); ok = False
        if not py_leak:
            print(f"{name}: FAIL: no leak site in train.py"); ok = False
        if name == "no-caching" and not any(x[0] == "train_step" and x[2] for x in py_leak):
            print(f"{name}: FAIL: the leak (train_step, kept.append) is not a leak site"); ok = False
if name == "python-off":
    print(f"{name}: capture off, sites are native (no check)"); ok = True
print(f"{name}: {'OK' if ok else 'FAILED'}")
sys.exit(0 if ok else 1)
PY
}

run_case default-allocator
run_case no-caching PYTORCH_NO_CUDA_MEMORY_CACHING=1
# The cost of Python capture on this workload: the same run with capture off.
run_case python-off GPUMEMTRACE_PYTHON=0 PYTORCH_NO_CUDA_MEMORY_CACHING=1

section result
[ $fail = 0 ] && echo "PYTHON STACKS OK" || echo "SOME CHECKS FAILED"
exit $fail
