#!/usr/bin/env bash
# The README's two installs as a new user makes them, each followed by `gpumemtrace run` of the
# emulated CUDA's demo in a bare environment (PATH and HOME only):
#  1. `pip install .` into a fresh virtualenv: the wheel's CLI and preload library; nothing may be
#     written into HOME;
#  2. `cargo install --path tools`: the CLI alone, carrying the library, which it writes once
#     into HOME's cache (0700).
# .ci/run runs it after examples/demo.sh, whose release build both reuse (MATURIN_STRIP=false
# keeps maturin's build that one instead of recompiling the CLI to strip it).
# Needs python3 with venv and pip, and PyPI (maturin is the build backend).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$root/target/install-check"
rm -rf "$work" && mkdir -p "$work"
make -s -C "$root/tests/emucuda" OUT="$root/target/emucuda"
demo="$root/target/emucuda/demo"

# $1: what was installed, $2: its bin directory, $3: HOME for the run.
traced_run() {
    local dir="$work/run-$1"
    mkdir -p "$dir"
    if ! (cd "$dir" && env -i PATH="$2:/usr/bin:/bin" HOME="$3" gpumemtrace run -- "$demo" \
            >"$dir/stdout" 2>"$dir/stderr"); then
        echo "install check, $1: gpumemtrace run failed:" >&2
        cat "$dir/stderr" >&2
        exit 1
    fi
    if ! grep -q 'live at end (leaked) 20.0 MiB in 5 allocations' "$dir/stderr" \
        || ! grep -q 'cache_batch demo.c:59' "$dir/stderr"; then
        echo "install check, $1: the demo was not traced as expected:" >&2
        cat "$dir/stderr" >&2
        exit 1
    fi
}

# 1. pip
python3 -m venv "$work/venv"
MATURIN_STRIP=false "$work/venv/bin/pip" install --quiet --disable-pip-version-check "$root"
test -f "$work/venv/lib/gpumemtrace/libgpumemtrace.so"
traced_run pip "$work/venv/bin" "$work/home-pip"
if [ -e "$work/home-pip" ]; then
    echo "install check, pip: the wheel's CLI wrote into HOME:" >&2
    find "$work/home-pip" >&2
    exit 1
fi
echo "install check: pip install . -> gpumemtrace run traced the demo"

# 2. cargo install
cargo install --quiet --locked --path "$root/tools" --root "$work/cargo"
test ! -e "$work/cargo/bin/libgpumemtrace.so"
traced_run cargo "$work/cargo/bin" "$work/home-cargo"
cache="$work/home-cargo/.cache/gpumemtrace"
ls "$cache"/libgpumemtrace-*.so >/dev/null
test "$(stat -c %a "$cache")" = 700
echo "install check: cargo install --path tools -> gpumemtrace run traced the demo ($(ls "$cache"))"
