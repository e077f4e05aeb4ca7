#!/usr/bin/env bash
# Two builds side by side on one host, alternated round by round: `summary` over a synthetic trace
# of EVENTS events (benches/summary_speed.rs writes it), and the emulated allocation loop
# (tests/emucuda/bench_alloc.c) with no stack (GPUMEMTRACE_FRAMES=0) and 32 frames deep,
# untraced and under each build's shim.
#   BIN=dir-with: gpumemtrace gpumemtrace-base libgpumemtrace.so libgpumemtrace-base.so summary_speed
#   usage: BIN=.gpubin EVENTS=100000000 ROUNDS=3 examples/gpu/ab_builds.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
EVENTS=${EVENTS:-100000000}
ROUNDS=${ROUNDS:-3}
SCRATCH=${SCRATCH:-/tmp/ab}
mkdir -p "$SCRATCH/emu" "$SCRATCH/out"
echo "host: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"

# The trace, and one run of the new build to show the bench's own table.
CARGO_TARGET_DIR=$SCRATCH EVENTS=$EVENTS GPUMEMTRACE_CLI=$BIN/gpumemtrace "$BIN/summary_speed" | tail -3
T=$SCRATCH/bench-scratch/synthetic-$EVENTS.trace
TIMEFORMAT='%R'
for r in $(seq "$ROUNDS"); do
  for v in base inline beside; do
    case $v in
      base) cli=$BIN/gpumemtrace-base; m= ;;
      inline) cli=$BIN/gpumemtrace; m=0 ;;
      beside) cli=$BIN/gpumemtrace; m=1 ;;
    esac
    s=$( { time GPUMEMTRACE_MODEL_THREAD=$m "$cli" summary "$T" >"$SCRATCH/out/$v.txt"; } 2>&1 )
    echo "summary round=$r build=$v wall_s=$s"
  done
done
cmp -s "$SCRATCH/out/inline.txt" "$SCRATCH/out/beside.txt" && echo "inline and beside: the same summary"
diff "$SCRATCH/out/base.txt" "$SCRATCH/out/beside.txt" >/dev/null && echo "base and new: the same summary"

# The allocation loop. The emulator must come first: the host's LD_LIBRARY_PATH names the real driver.
make -s -C tests/emucuda OUT="$SCRATCH/emu" "$SCRATCH/emu/bench_alloc" || exit 1
export LD_LIBRARY_PATH=$SCRATCH/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for r in $(seq "$ROUNDS"); do
  for depth in 0 32; do
    for v in none base new; do
      case $v in
        none) pre= ;;
        base) pre=$BIN/libgpumemtrace-base.so ;;
        new) pre=$BIN/libgpumemtrace.so ;;
      esac
      rm -rf "$SCRATCH/tr" && mkdir -p "$SCRATCH/tr"
      frames=$([ "$depth" = 0 ] && echo 0 || echo 128)
      line=$(LD_PRELOAD=$pre GPUMEMTRACE_FRAMES=$frames GPUMEMTRACE_OUTPUT=$SCRATCH/tr/ GPUMEMTRACE_QUIET=1 "$SCRATCH/emu/bench_alloc" 1 200000 "$depth")
      echo "alloc round=$r depth=$depth build=$v $line"
    done
  done
done
