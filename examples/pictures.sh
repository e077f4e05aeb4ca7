#!/usr/bin/env bash
# Makes the pictures in docs/: traces tests/emucuda/prog_phases (a toy training loop with NVTX
# ranges and gpumemtrace_mark phases, on the emulated CUDA: no GPU needed), then renders the
# timeline (SVG and HTML), the HTML report, the flame graphs, and PNG screenshots of them with
# headless Chromium when it is installed (apt-get install chromium), else with resvg.
#   examples/pictures.sh [OUTDIR]        default OUTDIR: docs/pictures
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
out="${1:-$root/docs/pictures}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cargo build --release --workspace --quiet
make -s -C tests/emucuda OUT="$root/target/emucuda"
g="$root/target/release/gpumemtrace"
traces="$root/target/pictures-traces"
rm -rf "$traces" && mkdir -p "$traces"
# `run` preloads the tracer and points NVTX_INJECTION64_PATH at it.
"$g" run --output "$traces" -- "$root/target/emucuda/prog_phases" >/dev/null 2>&1
t="$(ls "$traces"/*.trace)"
"$g" timeline "$t" -o "$out/timeline.svg"
"$g" timeline "$t" -o "$out/timeline.html"
"$g" report "$t" -o "$out/report.html"
"$g" flamegraph "$t" --of peak -o "$out/flamegraph-peak.svg"
"$g" flamegraph "$t" --of allocated -o "$out/flamegraph-allocated.svg"
"$g" flamegraph "$t" --of allocated --folded > "$out/allocated.folded"
chrome="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [ -n "$chrome" ]; then
    shot() { # file, WxH, png
        timeout 60 "$chrome" --headless --no-sandbox --disable-gpu --no-first-run \
            --disable-background-networking --disable-component-update --disable-sync \
            --user-data-dir="$(mktemp -d)" --hide-scrollbars --window-size="$2" \
            --screenshot="$3" "file://$1" >/dev/null 2>&1
    }
    shot "$out/timeline.svg" 1200,315 "$out/timeline.png"
    shot "$out/flamegraph-allocated.svg" 1200,230 "$out/flamegraph.png"
elif command -v resvg >/dev/null; then
    # resvg (cargo install resvg) renders the SVGs themselves.
    resvg "$out/timeline.svg" "$out/timeline.png"
    resvg "$out/flamegraph-allocated.svg" "$out/flamegraph.png"
fi
ls -l "$out"
