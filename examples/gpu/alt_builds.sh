#!/usr/bin/env bash
# Issue 11's launch-bound loop, traced and paused windows alternated inside each process
# (perf_blocks.py alternate), for several builds and settings interleaved process by process:
#   new       this build (libgpumemtrace.so), as users run it
#   base      another build (libgpumemtrace-base.so), as users run it
#   new-self  this build measuring its own hooks (GPUMEMTRACE_SELF_TIME=1): what self-measurement
#             itself adds (it reads the time-stamp counter up to seven times an event)
#   base-self the other build measuring its own hooks (its parts beside new-self's)
# Prints each process's median added time (40 pairs of 20-step windows; a new-self run also its
# self-time notice) and, per variant, the median over processes. ab_python.sh runs it for its loop.
#   BIN=dir-with: gpumemtrace libgpumemtrace.so [libgpumemtrace-base.so]
#   usage: BIN=.gpubin ROUNDS=3 VARIANTS="new base new-self" examples/gpu/alt_builds.sh
set -u
BIN=$(cd "${BIN:?}" && pwd)
ROUNDS=${ROUNDS:-3}
VARIANTS=${VARIANTS:-"new base new-self"}
SCRATCH=${SCRATCH:-/tmp/altb}
mkdir -p "$SCRATCH"
: >"$SCRATCH/rows.txt"
for r in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    case $v in
      new) env=(LD_PRELOAD="$BIN/libgpumemtrace.so") ;;
      base) env=(LD_PRELOAD="$BIN/libgpumemtrace-base.so") ;;
      new-self) env=(LD_PRELOAD="$BIN/libgpumemtrace.so" GPUMEMTRACE_SELF_TIME=1) ;;
      base-self) env=(LD_PRELOAD="$BIN/libgpumemtrace-base.so" GPUMEMTRACE_SELF_TIME=1) ;;
      *) echo "unknown variant $v" >&2; exit 2 ;;
    esac
    rm -rf "$SCRATCH/tr" && mkdir -p "$SCRATCH/tr"
    line=$(env "${env[@]}" GPUMEMTRACE_OUTPUT="$SCRATCH/tr/" GPUMEMTRACE_QUIET=1 PAIRS=${PAIRS:-40} \
      timeout 120 python3 examples/gpu/perf_blocks.py alternate launch-bound | grep '^alternate')
    echo "variant=$v round=$r $line" | tee -a "$SCRATCH/rows.txt"
    # A run measuring itself also says what its hooks took, by part.
    case $v in *-self) "$BIN/gpumemtrace" summary "$SCRATCH"/tr/*.trace 2>/dev/null | grep -o 'self time (GPUMEMTRACE_SELF_TIME).*' ;; esac
  done
done
python3 - "$SCRATCH/rows.txt" $VARIANTS <<'PY'
import re, statistics, sys
rows = open(sys.argv[1]).read().splitlines()
for v in sys.argv[2:]:
    xs = [float(re.search(r"added=([-+0-9.]+)%", l).group(1)) for l in rows if l.startswith(f"variant={v} ") and "added=" in l]
    if xs:
        print(f"{v}: processes={len(xs)} median added {statistics.median(xs):+.2f}% (each: {', '.join(f'{x:+.2f}' for x in xs)})")
PY
