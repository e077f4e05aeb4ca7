#!/usr/bin/env bash
# Issue 12's async pair on the GPU (cudaMallocAsync + cudaFreeAsync, 20 frames deep), with the
# new build: traced and paused windows alternated in one process (3 processes x WINDOWS pairs of
# windows), then one traced run with GPUMEMTRACE_SELF_TIME=1 (what the hooks took, by part), and
# what the driver's current-device query costs here.
#   BIN=dir-with-libgpumemtrace.so-and-gpumemtrace examples/gpu/async_pair.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
WINDOWS=${WINDOWS:-40}
W=${WORK:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$W/tr"
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
nvcc -O2 -o "$W/perf_async" "$HERE/perf_async.cu" || exit 1
nvcc -O2 -o "$W/driver_query_cost" "$HERE/driver_query_cost.cu" -lcuda || exit 1
for i in 1 2 3; do
    ALTERNATE=$WINDOWS LD_PRELOAD=$BIN/libgpumemtrace.so GPUMEMTRACE_OUTPUT=$W/tr/ GPUMEMTRACE_QUIET=1 \
        timeout 120 "$W/perf_async" 5000 20 | tail -1
    rm -f "$W"/tr/*
done
GPUMEMTRACE_SELF_TIME=1 LD_PRELOAD=$BIN/libgpumemtrace.so GPUMEMTRACE_OUTPUT=$W/self.trace GPUMEMTRACE_QUIET=1 \
    timeout 120 "$W/perf_async" 100000 20
# The hooks' own account is a notice at the end of the trace.
"$BIN/gpumemtrace" summary "$W/self.trace" | grep -E "self time|native unwinding" | sed 's/^ *notice: //'
"$W/driver_query_cost"
