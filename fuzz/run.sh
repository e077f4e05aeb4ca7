#!/usr/bin/env bash
# Fuzzes for SECONDS each (default 30): `read_trace` (the reader, then the summary) and `reports`
# (every other report), starting from the traces in fuzz/seeds: traces the test suite records on
# the emulated CUDA (driver calls, PyTorch blocks with Python stacks, an OOM, phases, VMM views,
# two devices), compressed and plain (`-plain`, GPUMEMTRACE_COMPRESS=0: mutations of a plain
# body reach the model, a zstd body's mostly stop at the decompressor), and `extreme.seed`, the
# hand-built trace of reports_correct.rs's extreme-values test. `*-checked.seed` are written by
# today's writer (a frame with a checksum, ended, a Sync record first); the other zstd seeds by
# writers before checksums; `checked-frames.seed` is three small checked frames (the reader goes
# on past a damaged one). Named `.seed`: `*.trace` is ignored by git.
#   fuzz/run.sh 600
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable Rust without sanitizers (-s none).
# Fails on a crash, and when a fuzzer did not run to its end (a missing seed directory once made
# this script report a clean run that never happened).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in read_trace reports; do
    mkdir -p "corpus/$target"
    status=0
    # -close_fd_mask=1: the reports' own standard output is not the fuzzer's log.
    cargo fuzz run -s none "$target" "corpus/$target" seeds -- -max_total_time="$secs" -rss_limit_mb=2048 \
        -close_fd_mask=1 >"$log" 2>&1 || status=$?
    grep -E "^(#[0-9]+ +DONE|Done|INFO: seed corpus)|^==[0-9]+== ERROR|^ERROR:|panicked at" "$log" || true
    if [ -d "artifacts/$target" ] && [ -n "$(ls -A "artifacts/$target")" ]; then
        echo "fuzzing found a crash: see fuzz/artifacts/$target"
        exit 1
    fi
    if [ "$status" != 0 ] || ! grep -q "^Done [0-9]* runs" "$log"; then
        tail -20 "$log"
        echo "fuzz: $target did not run to its end (status $status)"
        exit 1
    fi
    echo "fuzz: $target, no crash in ${secs}s ($(grep -o "^Done [0-9]* runs" "$log"))"
done
