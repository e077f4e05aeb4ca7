#!/usr/bin/env bash
# Events ordered by their timestamps (a mark on each thread's own ring) against the build that
# ordered them by a process-wide sequence number: 8 threads' throughput alternated with the
# untraced run (writer_threads.sh), the traced call's p50 at 1-8 threads (both builds alternated,
# RUNS runs each), the hooks' own account at 1 and 8 threads, and issue 12's async pair.
#   BIN=dir-with: gpumemtrace libgpumemtrace.so (new) libgpumemtrace-base.so (the build before)
#   usage: BIN=.gpubin-w [ROUNDS=7] [RUNS=3] examples/gpu/order_keys.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
ROUNDS=${ROUNDS:-7}
RUNS=${RUNS:-3}
W=${WORK:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
echo "host: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
grep -o -m1 -w -E "constant_tsc|nonstop_tsc" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
echo "== 8 threads x 50000 pairs, alternated"
BIN=$BIN ROUNDS=$ROUNDS VARIANTS="none base new" SCRATCH=$W/wt "$HERE/writer_threads.sh"
export LD_LIBRARY_PATH=$W/wt/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$W/tr"
echo "== the traced call at 1-8 threads"
for t in 1 2 4 8; do
    for r in $(seq "$RUNS"); do
        for v in base new; do
            lib=$BIN/libgpumemtrace.so
            [ "$v" = base ] && lib=$BIN/libgpumemtrace-base.so
            rm -f "$W"/tr/*
            echo "scaling build=$v $(EMUCUDA_UNLOCKED=1 LD_PRELOAD=$lib GPUMEMTRACE_FRAMES=0 GPUMEMTRACE_OUTPUT=$W/tr/ \
                GPUMEMTRACE_QUIET=1 "$W/wt/emu/bench_alloc" "$t" 50000 0)"
        done
    done
done
echo "== self time, new build"
for t in 1 8; do
    rm -f "$W"/tr/*
    EMUCUDA_UNLOCKED=1 GPUMEMTRACE_SELF_TIME=1 LD_PRELOAD=$BIN/libgpumemtrace.so GPUMEMTRACE_FRAMES=0 \
        GPUMEMTRACE_OUTPUT=$W/self-$t.trace GPUMEMTRACE_QUIET=1 "$W/wt/emu/bench_alloc" "$t" 50000 0 >/dev/null
    echo "threads=$t $("$BIN/gpumemtrace" summary "$W/self-$t.trace" | grep -E "self time|reached the writer" | sed 's/^ *notice: //')"
done
echo "== async pair, new build"
BIN=$BIN WORK=$W/async "$HERE/async_pair.sh"
