#!/usr/bin/env bash
# Fuzzes the trace reader and the summary for SECONDS (default 30), starting from the traces in
# fuzz/seeds: traces the test suite records on the emulated CUDA (driver calls, PyTorch blocks
# with Python stacks, an OOM, phases, VMM views, two devices), compressed and plain (`-plain`,
# GPUMEMTRACE_COMPRESS=0: mutations of a plain body reach the model, a zstd body's mostly stop
# at the decompressor), and `extreme.seed`, the hand-built trace of reports_correct.rs's
# extreme-values test. Named `.seed`: `*.trace` is ignored by git.
#   fuzz/run.sh 600
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable Rust without sanitizers (-s none).
# Fails on a crash, and when the fuzzer did not run (a missing seed directory once made this
# script report a clean run that never happened).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
mkdir -p corpus/read_trace
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo fuzz run -s none read_trace corpus/read_trace seeds -- -max_total_time="$secs" -rss_limit_mb=2048 \
    >"$log" 2>&1 || status=$?
grep -E "^(#[0-9]+ +DONE|Done|INFO: seed corpus)|ERROR|panicked" "$log" || true
if [ -d artifacts/read_trace ] && [ -n "$(ls -A artifacts/read_trace)" ]; then
    echo "fuzzing found a crash: see fuzz/artifacts/read_trace"
    exit 1
fi
if [ "$status" != 0 ] || ! grep -q "^Done [0-9]* runs" "$log"; then
    tail -20 "$log"
    echo "fuzz: the fuzzer did not run to its end (status $status)"
    exit 1
fi
echo "fuzz: no crash in ${secs}s ($(grep -o "^Done [0-9]* runs" "$log"))"
