#!/usr/bin/env bash
# Real-GPU overhead of gpumemtrace (issue 5; results: docs/performance.md). From the repo root,
# on a machine with an NVIDIA GPU, nvcc and PyTorch:
#   BIN=target/release examples/gpu/perf.sh
# BIN holds libgpumemtrace.so and gpumemtrace. Each case runs untraced and traced in the same
# call, interleaved, REPS times (default 3); medians are compared. Prints a markdown table.
# Budget: about 5-6 minutes on an H200 (STEPS / NC_STEPS / PAIRS scale it).
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
SHIM="$BIN/libgpumemtrace.so"
W=${WORK:-$(mktemp -d)}
mkdir -p "$W/traces"
REPS=${REPS:-3}
STEPS=${STEPS:-60}          # timed training steps, caching allocator
NC_STEPS=${NC_STEPS:-20}    # timed steps with PYTORCH_NO_CUDA_MEMORY_CACHING=1
PAIRS=${PAIRS:-100000}      # cudaMallocAsync + cudaFreeAsync pairs
SAN_STEPS=${SAN_STEPS:-3}   # steps under compute-sanitizer (slow)
HERE=$(cd "$(dirname "$0")" && pwd)
R="$W/results.txt"
: >"$R"

echo "## machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
date -u +"date %Y-%m-%dT%H:%MZ"

traced() { env LD_PRELOAD="$SHIM" GPUMEMTRACE_OUTPUT="$W/traces/" "$@"; }
val() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" | tail -1; }
# record CASE VARIANT VALUE
record() { echo "$1|$2|$3" >>"$R"; echo "  $1 / $2: $3" >&2; }
clean() { rm -f "$W/traces/"*.trace; }

echo "## async pairs" >&2
nvcc -O2 -o "$W/perf_async" "$HERE/perf_async.cu" || exit 1
for i in $(seq "$REPS"); do
    record async untraced "$("$W/perf_async" "$PAIRS" 20 | val ns_per_pair)"
    record async traced "$(traced "$W/perf_async" "$PAIRS" 20 | val ns_per_pair)"
    record async traced-backtrace "$(GPUMEMTRACE_UNWINDER=backtrace traced "$W/perf_async" "$PAIRS" 20 | val ns_per_pair)"
    clean
done

echo "## training loop" >&2
for i in $(seq "$REPS"); do
    record train untraced "$(python3 "$HERE/perf_train.py" "$STEPS" | val ms_per_step)"
    record train traced "$(traced python3 "$HERE/perf_train.py" "$STEPS" | val ms_per_step)"
    record train torch-history-python "$(python3 "$HERE/perf_train.py" "$STEPS" python | val ms_per_step)"
    record train torch-history-all "$(python3 "$HERE/perf_train.py" "$STEPS" all | val ms_per_step)"
    clean
    record train-nocache untraced "$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 python3 "$HERE/perf_train.py" "$NC_STEPS" | val ms_per_step)"
    record train-nocache traced "$(PYTORCH_NO_CUDA_MEMORY_CACHING=1 traced python3 "$HERE/perf_train.py" "$NC_STEPS" | val ms_per_step)"
    clean
done

echo "## compute-sanitizer (one run, $SAN_STEPS steps)" >&2
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
    record train-san untraced "$(python3 "$HERE/perf_train.py" "$SAN_STEPS" | val ms_per_step)"
    record train-san compute-sanitizer "$(timeout 180 "$SAN" --leak-check full --print-limit 1 python3 "$HERE/perf_train.py" "$SAN_STEPS" 2>/dev/null | val ms_per_step)"
else
    record train-san compute-sanitizer ""
fi

python3 - "$R" "$STEPS" "$NC_STEPS" "$PAIRS" "$SAN_STEPS" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1]) if l.strip()]
steps, nc, pairs, san = sys.argv[2:6]
by = {}
for case, variant, v in rows:
    by.setdefault((case, variant), []).append(float(v) if v else None)
def med(case, variant):
    vs = [v for v in by.get((case, variant), []) if v is not None]
    return statistics.median(vs) if vs else None
desc = {
    "async": f"cudaMallocAsync+cudaFreeAsync, ns/pair ({pairs} pairs, 20-frame caller)",
    "train": f"transformer training, ms/step ({steps} steps, caching allocator)",
    "train-nocache": f"transformer training, ms/step ({nc} steps, PYTORCH_NO_CUDA_MEMORY_CACHING=1)",
    "train-san": f"transformer training, ms/step ({san} steps)",
}
print("\n| case | run | median | runs | vs untraced |")
print("|---|---|---|---|---|")
for case in ["async", "train", "train-nocache", "train-san"]:
    base = med(case, "untraced")
    for (c, variant), vs in by.items():
        if c != case:
            continue
        m = med(c, variant)
        if m is None:
            print(f"| {desc[case]} | {variant} | n/a | - | - |")
            continue
        rel = "-" if variant == "untraced" or not base else f"{(m / base - 1) * 100:+.1f}% ({m - base:+.1f})"
        runs = ", ".join(f"{v:.1f}" for v in vs if v is not None)
        print(f"| {desc[case]} | {variant} | {m:.2f} | {runs} | {rel} |")
PY
