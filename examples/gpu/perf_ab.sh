#!/usr/bin/env bash
# Paired A/B of tracing cost on the launch-bound loop (issues 11, 12; docs/performance.md).
# ROUNDS rounds; each round runs every variant once, in a shuffled order, and each variant's
# cost is its ratio to the untraced run of the same round (drift between rounds cancels). Prints
# per variant the median of the per-round ratios and their quartiles, and the medians of
# us/step. Then one traced run with GPUMEMTRACE_SELF_TIME=1: what the hooks added, by part.
#   BIN=target/release ROUNDS=11 examples/gpu/perf_ab.sh
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
ROUNDS=${ROUNDS:-11}
VARIANTS=${VARIANTS:-"untraced traced disabled"}
LOOP=${LOOP:-launch-bound}
W=${WORK:-$(mktemp -d)}
mkdir -p "$W"
: >"$W/ab.txt"
run() {
    local v=$1 env=()
    case $v in
        untraced) env=() ;;
        traced) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_QUIET=1) ;;
        disabled) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_DISABLE=1) ;;
        aggregate) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_QUIET=1 GPUMEMTRACE_AGGREGATE=1) ;;
        nopython) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/" GPUMEMTRACE_QUIET=1 GPUMEMTRACE_PYTHON=0) ;;
        *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
    env "${env[@]}" python3 examples/gpu/perf_blocks.py "$LOOP"
}
for i in $(seq "$ROUNDS"); do
    for v in $(printf '%s\n' $VARIANTS | shuf); do
        run "$v" | sed "s/^/variant=$v round=$i /" | tee -a "$W/ab.txt"
    done
    rm -f "$W"/*.trace
done
python3 - "$W/ab.txt" $VARIANTS <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in l.split()) for l in open(sys.argv[1]) if "us_per_step" in l]
variants = sys.argv[2:]
by = {(r["round"], r["variant"]): float(r["us_per_step"]) for r in rows}
rounds = sorted({r["round"] for r in rows}, key=int)
print("| variant | rounds | median us/step | spread (min-max) | per-round ratio to untraced: median | quartiles |")
print("|---|---|---|---|---|---|")
for v in variants:
    xs = sorted(by[(k, v)] for k in rounds if (k, v) in by)
    ratios = sorted(by[(k, v)] / by[(k, "untraced")] for k in rounds if (k, v) in by and (k, "untraced") in by)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    print(f"| {v} | {len(xs)} | {statistics.median(xs):.1f} | {xs[0]:.1f}-{xs[-1]:.1f} | "
          f"{100 * (statistics.median(ratios) - 1):+.1f}% | {100 * (q[0] - 1):+.1f}% .. {100 * (q[2] - 1):+.1f}% |")
PY
GPUMEMTRACE_SELF_TIME=1 LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_OUTPUT="$W/self.trace" GPUMEMTRACE_QUIET=1 \
    python3 examples/gpu/perf_blocks.py "$LOOP" | sed "s/^/variant=self-time /"
"$BIN/gpumemtrace" summary "$W/self.trace" | grep -E "self time|native unwinding|waited|lost" | sed 's/^ *notice: //'
"$BIN/gpumemtrace" summary --json "$W/self.trace" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("events", d.get("events", d.get("stats")))' 2>/dev/null || true
