#!/usr/bin/env bash
# Builds gpumemtrace and the emulated CUDA (no GPU needed), then traces examples/demo.c, a small
# "training loop" that leaks a batch cache and ends with an out-of-memory failure, and prints the
# summary: peaks, leaks and the failed allocation, each with its source line.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
cargo build --release --workspace --quiet
make -s -C tests/emucuda OUT="$root/target/emucuda"
out="$root/target/demo-traces"
rm -rf "$out" && mkdir -p "$out"
exec "$root/target/release/gpumemtrace" run --output "$out" -- "$root/target/emucuda/demo"
