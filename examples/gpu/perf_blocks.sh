#!/usr/bin/env bash
# Cost of tensor-level tracing on a GPU (issue 11; docs/performance.md): interleaved runs of
# untraced, traced (blocks with Python and native stacks) and preloaded-but-disabled, REPS each
# (default 7), median and spread per variant and loop.
#   BIN=target/release REPS=7 examples/gpu/perf_blocks.sh
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
REPS=${REPS:-7}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
: >"$W/perf.txt"
for i in $(seq "$REPS"); do
    for v in untraced traced disabled; do
        case $v in
            untraced) env=() ;;
            traced) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/") ;;
            disabled) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_DISABLE=1) ;;
        esac
        env "${env[@]}" python3 examples/gpu/perf_blocks.py | sed "s/^/variant=$v rep=$i /" | tee -a "$W/perf.txt"
    done
done
ls -l "$W"/*.trace 2>/dev/null | awk '{s+=$5; n++} END {print n, "traces,", s, "bytes in all"}'
python3 - "$W/perf.txt" <<'PY'
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in open(sys.argv[1])]
for loop in ("launch-bound", "gpu-bound"):
    base = statistics.median(float(r["us_per_step"]) for r in rows if r["loop"] == loop and r["variant"] == "untraced")
    for v in ("untraced", "traced", "disabled"):
        xs = sorted(float(r["us_per_step"]) for r in rows if r["loop"] == loop and r["variant"] == v)
        m = statistics.median(xs)
        print(f"| {loop} | {v} | {len(xs)} | {m:.1f} | {xs[0]:.1f}-{xs[-1]:.1f} | {100 * (m / base - 1):+.1f}% |")
PY
