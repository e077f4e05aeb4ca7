#!/usr/bin/env bash
# Cost of a tensor (one block allocation + free) on the emulated PyTorch, 20 Python frames deep:
# interleaved untraced / traced / preloaded-but-disabled runs, REPS each (default 7), median and
# spread of ns per pair. Needs `cargo build --release` and `make -C tests/emucuda OUT=...`.
#   EMU=target/emucuda-release benches/py_blocks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EMU=${EMU:-target/release/emucuda}
make -s -C tests/emucuda OUT="$PWD/$EMU" torch
LIB=$PWD/target/release/libgpumemtrace.so
REPS=${REPS:-7}
T=$(mktemp -d)
for i in $(seq "$REPS"); do
    for v in untraced traced disabled; do
        case $v in
            untraced) pre=() ;;
            traced) pre=(LD_PRELOAD="$LIB" GPUMEMTRACE_OUTPUT="$T/") ;;
            disabled) pre=(LD_PRELOAD="$LIB" GPUMEMTRACE_DISABLE=1) ;;
        esac
        env "${pre[@]}" EMU_TORCH_LIB="$PWD/$EMU/libtorch_cuda.so" python3 benches/py_blocks.py 200000 20 | sed "s/^/variant=$v /"
        rm -f "$T"/*.trace
    done
done | python3 -c '
import statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in sys.stdin]
base = statistics.median(float(r["ns_per_pair"]) for r in rows if r["variant"] == "untraced")
for v in ("untraced", "traced", "disabled"):
    xs = sorted(float(r["ns_per_pair"]) for r in rows if r["variant"] == v)
    m = statistics.median(xs)
    print(f"| {v} | {len(xs)} | {m:.0f} | {xs[0]:.0f}-{xs[-1]:.0f} | {m - base:+.0f} |")
'
