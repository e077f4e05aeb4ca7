#!/usr/bin/env bash
# Real-GPU validation of tensor-level tracing (issue 11; results: docs/validation.md). From the
# repo root, on a machine with an NVIDIA GPU and PyTorch:
#   BIN=target/release examples/gpu/blocks_validate.sh
# 1. the classic leak (torch_leak.py), default allocator and expandable segments: blocks, peaks
#    and reserved against torch's counters and _snapshot(), to the byte (compare_blocks.py);
# 2. torch.profiler(profile_memory=True) gives the same figures with and without the tracer;
# 3. two ranks on one GPU through torchrun (gloo): each rank's blocks against its own counters.
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
python3 - <<'PY'
import ctypes, torch  # which report signature this torch exports
lib = ctypes.CDLL(torch.__file__.rsplit("/", 1)[0] + "/lib/libc10.so")
for s in ("_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE", "_ZN3c1027reportMemoryUsageToProfilerEPvlNS_6DeviceE"):
    print(s, "exported" if hasattr(lib, s) else "absent")
PY

for mode in default expandable; do
    section "classic leak, $mode allocator"
    conf=""; [ $mode = expandable ] && conf="expandable_segments:True"
    mkdir -p "$W/leak-$mode"
    PYTORCH_CUDA_ALLOC_CONF=$conf "$GMT" run --output "$W/leak-$mode" -- python3 examples/gpu/torch_leak.py "$W/leak-$mode.truth.json" 12 2>"$W/leak-$mode.summary"
    echo "exit code $?"
    cat "$W/leak-$mode.summary"
    t=$(ls "$W/leak-$mode"/*.trace | head -1)
    "$GMT" summary --json "$t" >"$W/leak-$mode.json"
    "$GMT" dump "$t" >"$W/leak-$mode.jsonl"
    python3 examples/gpu/compare_blocks.py "$W/leak-$mode.truth.json" "$W/leak-$mode.json" "$W/leak-$mode.jsonl" || fail=1
    ls -l "$t" | awk '{print "trace bytes:", $5}'
done

section "torch.profiler(profile_memory=True) with and without the tracer"
a=$(python3 examples/gpu/profiler_check.py | grep '^PROFILER')
b=$(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/" python3 examples/gpu/profiler_check.py | grep '^PROFILER')
echo "untraced: $a"
echo "traced:   $b"
[ -n "$a" ] && [ "$a" = "$b" ] && echo "PROFILER SAME" || { echo "PROFILER DIFFERS"; fail=1; }

section "two ranks on one GPU (torchrun, gloo)"
mkdir -p "$W/ddp"
"$GMT" run --output "$W/ddp" -- torchrun --standalone --nproc_per_node=2 examples/gpu/ddp_blocks.py "$W/ddp" 2>"$W/ddp.summary"
echo "exit code $?"
tail -30 "$W/ddp.summary"
for r in 0 1; do
    t=$(ls "$W/ddp"/gpumemtrace-rank$r-*.trace | head -1)
    "$GMT" summary --json "$t" >"$W/ddp-$r.json"
    python3 - "$W/ddp/truth-$r.json" "$W/ddp-$r.json" <<'PY' || fail=1
import json, sys
t = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2]))["traces"][0]
b = next(g for g in s["groups"] if g["kind"] == "block")
p = next(p for p in s["pools"] if p["device"] == 0)
rows = [("live blocks at exit", t["allocated"], b["live_at_python_exit_bytes"]), ("allocated peak", t["max_allocated"], b["peak_bytes"]),
        ("reserved at exit", t["reserved"], p["reserved_bytes"]), ("reserved peak", t["max_reserved"], p["reserved_peak_bytes"])]
ok = all(w == g for _, w, g in rows)
for n, w, g in rows:
    print(f"| rank {t['rank']} | {n} | {w} | {g} |{'' if w == g else ' MISMATCH'}")
sys.exit(0 if ok else 1)
PY
done

section result
[ $fail = 0 ] && echo "ALL BLOCK CHECKS MATCH" || echo "SOME BLOCK CHECKS DID NOT MATCH"
exit $fail
