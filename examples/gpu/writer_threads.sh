#!/usr/bin/env bash
# Eight threads against the writer, two builds alternated round by round: the emulated allocation
# loop (tests/emucuda/bench_alloc.c, EMUCUDA_UNLOCKED=1: the emulator keeps no books and takes
# no lock, so the tracer is what limits) with THREADS threads x PAIRS allocation + free pairs,
# no stacks, untraced and under each build's shim. Each traced run's trace is counted: every
# event must be in it.
#   BIN=dir-with: gpumemtrace libgpumemtrace.so libgpumemtrace-base.so
# VARIANTS adds new-inline (the new build with GPUMEMTRACE_WRITE_THREAD=0: compression and writes
# on the writer thread) to tell the batch thread's share from the rest, and any NAME whose build
# is BIN/libgpumemtrace-NAME.so. Every other round runs the variants in reverse order.
#   usage: BIN=.gpubin ROUNDS=7 [VARIANTS="none base new new-inline"] examples/gpu/writer_threads.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
ROUNDS=${ROUNDS:-7}
THREADS=${THREADS:-8}
PAIRS=${PAIRS:-50000}
SCRATCH=${SCRATCH:-/tmp/wt}
mkdir -p "$SCRATCH/emu"
echo "host: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
make -s -C tests/emucuda OUT="$SCRATCH/emu" "$SCRATCH/emu/bench_alloc" || exit 1
# The emulator must come first: the host's LD_LIBRARY_PATH names the real driver.
export LD_LIBRARY_PATH=$SCRATCH/emu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
for r in $(seq "$ROUNDS"); do
  # Every other round in reverse order: no build always runs right after the same one.
  order=${VARIANTS:-none base new}
  [ $((r % 2)) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
  for v in $order; do
    wt=
    case $v in
      none) pre= ;;
      base) pre=$BIN/libgpumemtrace-base.so ;;
      new) pre=$BIN/libgpumemtrace.so ;;
      new-inline) pre=$BIN/libgpumemtrace.so wt=0 ;;
      # Any other name: a build of its own, libgpumemtrace-NAME.so.
      *) pre=$BIN/libgpumemtrace-$v.so; [ -f "$pre" ] || { echo "no $pre" >&2; exit 2; } ;;
    esac
    rm -rf "$SCRATCH/tr" && mkdir -p "$SCRATCH/tr"
    line=$(GPUMEMTRACE_WRITE_THREAD=$wt EMUCUDA_UNLOCKED=1 LD_PRELOAD=$pre GPUMEMTRACE_FRAMES=0 GPUMEMTRACE_OUTPUT=$SCRATCH/tr/ GPUMEMTRACE_QUIET=1 \
      "$SCRATCH/emu/bench_alloc" "$THREADS" "$PAIRS" 0)
    events=-
    t=$(ls "$SCRATCH"/tr/*.trace 2>/dev/null | head -1)
    [ -n "$t" ] && events=$("$BIN/gpumemtrace" summary "$t" | sed -n 's/.*, \([0-9]*\) events.*/\1/p' | head -1)
    echo "threads round=$r build=$v events_in_trace=$events $line"
  done
done
} | tee "$SCRATCH/rows.txt"
# Per build: median wall time and events/s, the calls' p50 and p99 (their ranges over the rounds).
python3 - "$SCRATCH/rows.txt" <<'PY'
import statistics, sys
rows = [dict(kv.split("=", 1) for kv in l.split() if "=" in kv) for l in open(sys.argv[1]) if "build=" in l]
for b in dict.fromkeys(r["build"] for r in rows):
    v = [r for r in rows if r["build"] == b]
    wall = sorted(int(r["wall_ns"]) / 1e6 for r in v)
    ev = 2 * int(v[0]["threads"]) * int(v[0]["pairs"])
    p50 = sorted(int(r["alloc_p50_ns"]) for r in v)
    p99 = sorted(int(r["alloc_p99_ns"]) for r in v)
    m = statistics.median(wall)
    print(f"summary build={b} runs={len(v)} wall_ms_median={m:.1f} ({wall[0]:.0f}-{wall[-1]:.0f}) "
          f"events_per_s={ev / m / 1e3:.2f}M alloc_p50={p50[0]}-{p50[-1]} alloc_p99={p99[0]}-{p99[-1]} "
          f"in_trace={','.join(sorted(set(r['events_in_trace'] for r in v)))}")
PY
