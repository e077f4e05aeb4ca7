#!/usr/bin/env bash
# Fuzzes the trace reader for SECONDS (default 30), starting from real traces in fuzz/seeds.
#   fuzz/run.sh 600
# Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable Rust without sanitizers (-s none).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
mkdir -p corpus/read_trace
cargo fuzz run -s none read_trace corpus/read_trace seeds -- -max_total_time="$secs" -rss_limit_mb=1024 2>&1 |
    grep -E "^(#[0-9]+ +DONE|Done|INFO: seed corpus)|ERROR|panicked" || true
if [ -d artifacts/read_trace ] && [ -n "$(ls -A artifacts/read_trace)" ]; then
    echo "fuzzing found a crash: see fuzz/artifacts/read_trace"
    exit 1
fi
echo "fuzz: no crash in ${secs}s"
