#!/usr/bin/env bash
# Per-tensor cost with real PyTorch stacks (examples/gpu/perf_tensor.py), interleaved: untraced,
# then for each build in BINS (space-separated folders holding libgpumemtrace.so): traced,
# preloaded-but-disabled, no stacks, Python stacks only, native stacks only, and (interp) native
# stacks walked on through the interpreter. REPS rounds
# (default 7); median and spread per variant, and the added ns per tensor against untraced.
#   BINS="target/release" REPS=7 examples/gpu/perf_tensor.sh
set -uo pipefail
REPS=${REPS:-7}
BINS=${BINS:-target/release}
VARIANTS=${VARIANTS:-traced disabled nostacks python native}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
: >"$W/tensor.txt"
for i in $(seq "$REPS"); do
    python3 examples/gpu/perf_tensor.py | sed "s|^|variant=untraced build=- |" >>"$W/tensor.txt"
    for b in $BINS; do
        so=$(cd "$b" && pwd)/libgpumemtrace.so
        for v in $VARIANTS; do
            case $v in
                traced) env=(LD_PRELOAD="$so" GPUMEMTRACE_OUTPUT="$W/") ;;
                disabled) env=(LD_PRELOAD="$so" GPUMEMTRACE_DISABLE=1) ;;
                nostacks) env=(LD_PRELOAD="$so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_FRAMES=0 GPUMEMTRACE_PYTHON=0) ;;
                python) env=(LD_PRELOAD="$so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_FRAMES=0) ;;
                native) env=(LD_PRELOAD="$so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_PYTHON=0) ;;
                interp) env=(LD_PRELOAD="$so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_INTERPRETER_FRAMES=1) ;;
            esac
            env "${env[@]}" python3 examples/gpu/perf_tensor.py | sed "s|^|variant=$v build=$b |" >>"$W/tensor.txt"
        done
    done
    rm -f "$W"/*.trace
done
python3 - "$W/tensor.txt" <<'PY'
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in open(sys.argv[1])]
print("| case | build | variant | runs | median ns/tensor | spread | added ns/tensor |")
print("|---|---|---|---|---|---|---|")
for case in ("empty_loop", "op_loop"):
    sel = [r for r in rows if r["case"] == case]
    base = statistics.median(float(r["ns_per_pair"]) for r in sel if r["variant"] == "untraced")
    keys = []
    for r in sel:
        if (r["build"], r["variant"]) not in keys:
            keys.append((r["build"], r["variant"]))
    for b, v in keys:
        xs = sorted(float(r["ns_per_pair"]) for r in sel if r["build"] == b and r["variant"] == v)
        m = statistics.median(xs)
        print(f"| {case} | {b} | {v} | {len(xs)} | {m:.0f} | {xs[0]:.0f}-{xs[-1]:.0f} | {m - base:+.0f} |")
PY
