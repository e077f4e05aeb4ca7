#!/usr/bin/env bash
# One device call for the figures issues 11 and 12 still need (docs/performance.md), with
# prebuilt libraries (the device has no Rust toolchain to spare time on):
#   BIN=dir-with: gpumemtrace libgpumemtrace.so (new) libgpumemtrace-base.so (the build to beat)
#   passed to `run` with carry=[that dir] when it is git-ignored.
# 1. writer throughput, 8 threads: untraced / base / new / new with the batch thread off;
# 2. issue 11's launch-bound loop: traced and paused windows alternated in one process (3 runs),
#    then untraced / traced / disabled processes, shuffled in each of ROUNDS rounds, and the
#    hooks' self time (which names the Python version's share).
# Results go to $OUT (or ./open-issues-out): threads.txt, alternate.txt, ab.txt.
#   BIN=.gpubin ROUNDS=7 examples/gpu/open_issues.sh
set -u
BIN=${BIN:?}
ROUNDS=${ROUNDS:-7}
OUTDIR=${OUT:-open-issues-out}
mkdir -p "$OUTDIR"
{
    date -u
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>/dev/null
    nproc
    echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
} | tee "$OUTDIR/host.txt"
BIN=$BIN ROUNDS=$ROUNDS VARIANTS="none base new new-inline" timeout 200 examples/gpu/writer_threads.sh >"$OUTDIR/threads.txt" 2>&1
tail -4 "$OUTDIR/threads.txt"
: >"$OUTDIR/alternate.txt"
for i in 1 2 3; do
    rm -rf /tmp/open-issues-alt && mkdir -p /tmp/open-issues-alt
    LD_PRELOAD="$(cd "$BIN" && pwd)/libgpumemtrace.so" GPUMEMTRACE_OUTPUT=/tmp/open-issues-alt/ GPUMEMTRACE_QUIET=1 PAIRS=40 \
        timeout 90 python3 examples/gpu/perf_blocks.py alternate launch-bound | tail -1 | tee -a "$OUTDIR/alternate.txt"
done
rm -rf /tmp/open-issues-ab
BIN=$BIN ROUNDS=$ROUNDS WORK=/tmp/open-issues-ab timeout 330 examples/gpu/perf_ab.sh >"$OUTDIR/ab.txt" 2>&1
tail -8 "$OUTDIR/ab.txt"
