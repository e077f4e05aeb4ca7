#!/usr/bin/env bash
# Where tensor-level tracing's cost goes on the launch-bound loop: untraced, traced with no
# stacks (GPUMEMTRACE_FRAMES=0 GPUMEMTRACE_PYTHON=0), Python stacks only, native only, both;
# REPS interleaved runs each (default 3), median per variant.
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
REPS=${REPS:-3}
T=$(mktemp -d)
for i in $(seq "$REPS"); do
    for v in untraced nostacks python native both; do
        case $v in
            untraced) env=() ;;
            nostacks) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$T/" GPUMEMTRACE_FRAMES=0 GPUMEMTRACE_PYTHON=0) ;;
            python) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$T/" GPUMEMTRACE_FRAMES=0) ;;
            native) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$T/" GPUMEMTRACE_PYTHON=0) ;;
            both) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$T/") ;;
        esac
        env "${env[@]}" python3 examples/gpu/perf_blocks.py launch-bound | sed "s/^/variant=$v /"
    done
done | tee "$T/parts.txt"
t=$(ls "$T"/*.trace | tail -1); [ -n "$t" ] && "$BIN/gpumemtrace" summary "$t" | head -3
python3 - "$T/parts.txt" <<'PY'
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in open(sys.argv[1])]
med = lambda v: statistics.median(float(r["us_per_step"]) for r in rows if r["variant"] == v)
base = med("untraced")
for v in ("untraced", "nostacks", "python", "native", "both"):
    print(f"| {v} | {med(v):.1f} | {100 * (med(v) / base - 1):+.1f}% |")
PY
