#!/usr/bin/env bash
# How the traced call's cost grows with the number of threads (issue 12: what the hooks of
# different threads cost each other), beside the raw cost of one shared counter at 1-8 threads
# (seq_contention.c). The emulated allocation loop without stacks, untraced and traced, RUNS times
# at each thread count; rows to stdout.
#   BIN=dir-with-libgpumemtrace.so examples/gpu/thread_scaling.sh
# (Figures of 2026-12-06 in docs/performance.md, "The shared number is what the threads wait for".)
set -u
BIN=$(cd "${BIN:?}" && pwd)
RUNS=${RUNS:-3}
W=${WORK:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
gcc -O2 -pthread -o "$W/seq_contention" "$HERE/seq_contention.c" || exit 1
for t in 1 2 4 8; do
    "$W/seq_contention" "$t" 0
    "$W/seq_contention" "$t" 300
done
make -s -C "$HERE/../../tests/emucuda" OUT="$W/emu" "$W/emu/bench_alloc" || exit 1
export LD_LIBRARY_PATH=$W/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$W/tr"
for t in 1 2 4 8; do
    for r in $(seq "$RUNS"); do
        rm -f "$W"/tr/*
        echo "threads=$t untraced $(EMUCUDA_UNLOCKED=1 "$W/emu/bench_alloc" "$t" 50000 0)"
        echo "threads=$t traced $(EMUCUDA_UNLOCKED=1 LD_PRELOAD=$BIN/libgpumemtrace.so GPUMEMTRACE_FRAMES=0 \
            GPUMEMTRACE_OUTPUT=$W/tr/ GPUMEMTRACE_QUIET=1 "$W/emu/bench_alloc" "$t" 50000 0)"
    done
done
