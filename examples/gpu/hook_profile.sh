#!/usr/bin/env bash
# Where the hooks' time goes on the real host: a sampling profile (perf, carried: PERFKIT holds
# the binary and the libraries it needs) of issue 11's launch-bound loop, traced with Python and
# native stacks. Cycles where the host lends its counters, else the CPU clock. Writes to OUT:
# the symbols of our library by share of all samples, and the annotated code of the hottest.
#   usage: PERFKIT=.perfkit LIB=.gpubin-w/libgpumemtrace.so OUT=dir [STEPS=6000] [CMD=...] examples/gpu/hook_profile.sh
set -u
KIT=$(cd "${PERFKIT:?}" && pwd)
LIB=$(cd "$(dirname "${LIB:?}")" && pwd)/$(basename "$LIB")
OUT=${OUT:?}
STEPS=${STEPS:-6000}
W=$(mktemp -d)
perf() { /lib64/ld-linux-x86-64.so.2 --library-path "$KIT" "$KIT/perf" "$@"; }
ev=cycles
if ! perf stat -e cycles true >/dev/null 2>&1; then
    ev=cpu-clock
fi
echo "perf event: $ev ($(perf stat -e $ev true 2>&1 | grep -E "$ev|not supported" | head -1 | tr -s ' '))"
# CMD: another program to profile instead (the emulated allocation loop, say).
STEPS=$STEPS GPUMEMTRACE_OUTPUT=$W/ GPUMEMTRACE_QUIET=1 \
    perf record -e "$ev" -F 20000 -o "$W/p.data" -- env LD_PRELOAD="$LIB" ${CMD:-python3 examples/gpu/perf_blocks.py launch-bound} 2>&1 | tail -3
perf report -i "$W/p.data" --no-children --sort dso --stdio 2>/dev/null | grep -v "^#" | grep . | head -15 >"$OUT/${TAG:-profile}-dsos.txt"
perf report -i "$W/p.data" --no-children --dsos "$(basename "$LIB")" --sort sym --stdio 2>/dev/null | grep -v "^#" | grep . | head -60 >"$OUT/${TAG:-profile}-syms.txt"
# The host's threads apart from the tracer's own (the writer and the batch thread).
perf report -i "$W/p.data" --no-children --dsos "$(basename "$LIB")" --sort comm,sym --stdio 2>/dev/null | grep -v "^#" | grep . | head -60 >"$OUT/${TAG:-profile}-comm.txt"
cat "$OUT/${TAG:-profile}-dsos.txt"
head -40 "$OUT/${TAG:-profile}-comm.txt"
: >"$OUT/${TAG:-profile}-annotate.txt"
for sym in $(grep -o '\] .*' "$OUT/${TAG:-profile}-syms.txt" | sed 's/^\] //' | head -12 | tr ' ' '@'); do
    sym=${sym//@/ }
    echo "=== $sym" >>"$OUT/${TAG:-profile}-annotate.txt"
    perf annotate -i "$W/p.data" --stdio --dsos "$(basename "$LIB")" -s "$sym" 2>/dev/null \
        | awk '$1+0 >= 0.5' | head -80 >>"$OUT/${TAG:-profile}-annotate.txt"
done
wc -l "$OUT"/profile-*.txt
