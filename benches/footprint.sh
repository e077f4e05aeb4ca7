#!/usr/bin/env bash
# Instructions and hot code lines an allocation + free pair costs the hooks (benches/footprint.py),
# under callgrind: the emulated driver's allocation loop (tests/emucuda/bench_alloc.c), one thread,
# at caller depths 0 and 30; then PyTorch's path, a tensor made and freed on the emulated torch
# (block events, benches/py_blocks.py) from Python 20 frames deep. Exact and machine-independent:
# the figure to compare builds by where timings move by more than the change (docs/performance.md,
# "Code footprint").
#   LIB=target/release/libgpumemtrace.so [PY=python3.12] benches/footprint.sh [--by-function]
set -euo pipefail
cd "$(dirname "$0")/.."
LIB=$(realpath "${LIB:-target/release/libgpumemtrace.so}")
EMU=${EMU:-target/release/emucuda}
PAIRS=${PAIRS:-20000}
make -s -C tests/emucuda OUT="$PWD/$EMU" "$PWD/$EMU/bench_alloc" "$PWD/$EMU/libcuda.so.1" torch
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
for depth in ${DEPTHS:-0 30}; do
    LD_PRELOAD="$LIB" LD_LIBRARY_PATH="$PWD/$EMU" GPUMEMTRACE_OUTPUT="$T/t" \
        valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
        --separate-threads=yes --callgrind-out-file="$T/cg" "$PWD/$EMU/bench_alloc" 1 "$PAIRS" "$depth" >/dev/null 2>"$T/err" ||
        { cat "$T/err"; exit 1; }
    # Thread 1 is main (sorting latencies), 2 the allocating thread, 3 on the tracer's own.
    printf 'depth=%s ' "$depth"
    python3 benches/footprint.py "$T/cg-02" "$PAIRS" --lib="$LIB" "$@"
    rm -f "$T"/cg* "$T"/t*
done
# The interpreter itself, not a launcher script (pyenv's shims run several processes).
PY=$("${PY:-python3}" -c 'import sys; print(sys.executable)')
LD_PRELOAD="$LIB" GPUMEMTRACE_OUTPUT="$T/t" EMU_TORCH_LIB="$PWD/$EMU/libtorch_cuda.so" \
    valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
    --separate-threads=yes --callgrind-out-file="$T/cg" "$PY" benches/py_blocks.py "$PAIRS" 20 >/dev/null 2>"$T/err" ||
    { cat "$T/err"; exit 1; }
# py_blocks.py makes 2000 warm-up pairs before the PAIRS it times.
printf 'blocks python=%s ' "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
python3 benches/footprint.py "$T/cg-01" $((PAIRS + 2000)) --lib="$LIB" "$@"
