#!/usr/bin/env bash
# Real-GPU report pictures (for the lead's GPU machine). From the repo root, on a machine with an
# NVIDIA GPU and PyTorch:
#   BIN=target/release OUT=gpu-reports examples/gpu/reports.sh
# Runs examples/gpu/train_phases.py (a small training loop with torch.cuda.nvtx ranges and
# gpumemtrace_mark phases) under `gpumemtrace run`, then writes into OUT every report with the
# command that made it (OUT/commands.txt): timeline SVG + HTML, flame graphs (SVG + folded),
# memory_viz pickle, Perfetto JSON, speedscope JSON, phases, check (JSON) and a diff of two runs
# with different batch caches. PNGs are made too when rsvg-convert or chromium is there;
# otherwise convert the SVGs elsewhere (examples/pictures.sh shows the chromium command).
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
G="$BIN/gpumemtrace"
OUT=${OUT:-gpu-reports}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
: >"$OUT/commands.txt"
do_() { echo "\$ $*" | sed "s#$BIN/##g; s#$OUT/##g" >>"$OUT/commands.txt"; "$@"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/machine.txt"

rm -rf "$OUT/traces" && mkdir -p "$OUT/traces"
do_ "$G" run --output "$OUT/traces" -- python3 examples/gpu/train_phases.py >"$OUT/run.log" 2>&1
echo "run exit code $?" >>"$OUT/run.log"
T=$(ls "$OUT"/traces/*.trace | head -1)
cp "$T" "$OUT/train.trace"; T="$OUT/train.trace"

do_ "$G" summary --frames 3 "$T" >"$OUT/summary.txt" 2>&1
do_ "$G" phases "$T" >"$OUT/phases.txt"
do_ "$G" timeline "$T" -o "$OUT/timeline.svg"
do_ "$G" timeline "$T" -o "$OUT/timeline.html"
do_ "$G" timeline "$T" --device 0 --phase backward -o "$OUT/timeline-backward.svg"
do_ "$G" flamegraph "$T" --of peak -o "$OUT/flamegraph-peak.svg"
do_ "$G" flamegraph "$T" --of allocated -o "$OUT/flamegraph-allocated.svg"
do_ "$G" flamegraph "$T" --of leaks -o "$OUT/flamegraph-leaks.svg"
do_ "$G" flamegraph "$T" --of allocated --folded >"$OUT/allocated.folded"
do_ "$G" flamegraph "$T" --of allocated --phase backward --folded >"$OUT/backward.folded"
do_ "$G" export "$T" --format memviz -o "$OUT/snapshot.pickle"
do_ "$G" export "$T" --format perfetto -o "$OUT/perfetto.json"
do_ "$G" export "$T" --format speedscope -o "$OUT/speedscope.json"
python3 tests/memviz_check.py "$OUT/snapshot.pickle" >"$OUT/memviz_check.json" 2>&1; echo "memviz_check exit $?" >>"$OUT/memviz_check.json"
do_ "$G" check "$T" --max-peak 1GiB --max-leaked 0 --json >"$OUT/check.json"; echo "check exit $?" >>"$OUT/check.json"
# A second run whose batch cache is bigger: diff names the site that grew.
rm -rf "$OUT/traces2" && mkdir -p "$OUT/traces2"
CACHE_MIB=96 "$G" run --output "$OUT/traces2" -- python3 examples/gpu/train_phases.py >"$OUT/run2.log" 2>&1
cp "$(ls "$OUT"/traces2/*.trace | head -1)" "$OUT/train-cache96.trace"
do_ "$G" diff "$T" "$OUT/train-cache96.trace" >"$OUT/diff.txt"
do_ "$G" diff "$T" "$OUT/train-cache96.trace" --json >"$OUT/diff.json"
if python3 -c 'import torch.cuda._memory_viz' 2>/dev/null; then
    # PyTorch's own reader of the snapshot.
    python3 -c "import pickle,sys; from torch.cuda import _memory_viz as m; d=pickle.load(open('$OUT/snapshot.pickle','rb')); print(m.segsum(d)); open('$OUT/memviz_trace_plot.html','w').write(m.trace_plot(d))" >"$OUT/memviz_segsum.txt" 2>&1
    echo "torch _memory_viz exit $?" >>"$OUT/memviz_segsum.txt"
fi
for f in "$OUT"/*.svg; do
    if command -v rsvg-convert >/dev/null; then rsvg-convert "$f" -o "${f%.svg}.png"
    elif command -v chromium >/dev/null; then
        chromium --headless --no-sandbox --disable-gpu --user-data-dir="$(mktemp -d)" --hide-scrollbars \
            --window-size=1200,700 --screenshot="${f%.svg}.png" "file://$f" >/dev/null 2>&1
    fi
done
ls -l "$OUT"
