#!/usr/bin/env bash
# Two builds of the shim side by side on one host, alternated run by run, on what a Python
# allocation costs: (1) the emulated driver from a Python stack DEPTH frames deep
# (benches/py_alloc.py, ctypes; the same stack every time, then alternating between two),
# untraced and under each build; (2) issue 11's launch-bound
# training loop, traced and paused windows alternated inside each process
# (perf_blocks.py alternate, through alt_builds.sh). The py_alloc runs measure their hooks' self time
# (GPUMEMTRACE_SELF_TIME=1), read back from the trace with the CLI; the loop's runs do not.
#   BIN=dir-with: gpumemtrace libgpumemtrace.so libgpumemtrace-base.so
#   usage: BIN=.gpubin ROUNDS=5 DEPTH=20 examples/gpu/ab_python.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
ROUNDS=${ROUNDS:-5}
DEPTH=${DEPTH:-20}
LOOP_ROUNDS=${LOOP_ROUNDS:-$ROUNDS}
SCRATCH=${SCRATCH:-/tmp/abpy}
mkdir -p "$SCRATCH/emu" "$SCRATCH/tr"
echo "host: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1); $(python3 --version)"

# What the self-time notice says of events with Python stacks: median added, and the Python part.
selftime() {
  "$BIN/gpumemtrace" summary "$SCRATCH"/tr/*.trace 2>/dev/null |
    grep -o 'events with Python and native stacks: added per event median [0-9]* ns\|(before the call [0-9]*, Python stack [0-9]*, native stack [0-9]*, hand-off [0-9]*' |
    head -2 | sed 's/.*median \([0-9]*\) ns/median=\1/; s/(before the call \([0-9]*\), Python stack \([0-9]*\), native stack \([0-9]*\), hand-off \([0-9]*\)/mean_parts: before=\1 python=\2 native=\3 handoff=\4/' | tr '\n' ' '
}

# The shim a build name stands for (none: untraced).
shim() {
  case $1 in
    none) echo ;;
    base) echo "$BIN/libgpumemtrace-base.so" ;;
    new) echo "$BIN/libgpumemtrace.so" ;;
  esac
}

make -s -C tests/emucuda OUT="$SCRATCH/emu" "$SCRATCH/emu/libcuda.so.1" || exit 1
for r in $(seq "$ROUNDS"); do
  for alt in 0 1; do
  for v in none base new; do
    pre=$(shim $v)
    rm -f "$SCRATCH"/tr/*
    line=$(LD_PRELOAD=$pre BENCH_ALTERNATE=$alt GPUMEMTRACE_SELF_TIME=1 GPUMEMTRACE_OUTPUT=$SCRATCH/tr/ GPUMEMTRACE_QUIET=1 \
      python3 benches/py_alloc.py "$SCRATCH/emu/libcuda.so.1" 100000 "$DEPTH")
    echo "py_alloc round=$r alternate=$alt build=$v $line $([ "$v" = none ] || selftime)"
  done
  done
done

# The loop's windows are timed as users run the tracer: without self-measurement, which reads the
# counter up to seven times an event and so adds to what it measures (LOOP_SELF_TIME=1 adds runs
# of the new build measuring itself, with their parts).
BIN=$BIN ROUNDS=$LOOP_ROUNDS SCRATCH=$SCRATCH/alt \
  VARIANTS="base new$([ "${LOOP_SELF_TIME:-0}" = 1 ] && echo ' new-self')" bash "$(dirname "$0")/alt_builds.sh"
