#!/usr/bin/env bash
# Real-GPU check that the memory_viz export at block level equals torch.cuda.memory._snapshot()
# (examples/gpu/memviz_compare.py), with the default caching allocator and with expandable
# segments. From the repo root: BIN=target/release OUT=dir examples/gpu/memviz_compare.sh
set -uo pipefail
BIN=$(cd "${BIN:-target/release}" && pwd)
GMT="$BIN/gpumemtrace"
OUT=${OUT:-$(mktemp -d)}
fail=0
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name())'
for mode in default expandable; do
    echo "===== $mode"
    d="$OUT/$mode"; mkdir -p "$d"
    conf=""; [ $mode = expandable ] && conf="expandable_segments:True"
    PYTORCH_CUDA_ALLOC_CONF=$conf "$GMT" run --output "$d" -- python3 examples/gpu/memviz_compare.py snapshot "$d/torch.pickle" 2>"$d/summary.txt"
    echo "exit $?"; head -40 "$d/summary.txt"
    t=("$d"/*.trace)
    "$GMT" export "${t[0]}" --format memviz -o "$d/ours.pickle" || fail=1
    python3 tests/memviz_check.py "$d/ours.pickle" >"$d/check.json" || { echo "memviz_check failed"; fail=1; }
    python3 examples/gpu/memviz_compare.py compare "$d/torch.pickle" "$d/ours.pickle" || fail=1
    # PyTorch's own viewers read it.
    python3 -c "import pickle,sys; from torch.cuda import _memory_viz as m; d=pickle.load(open('$d/ours.pickle','rb')); print(m.segsum(d)[:600]); m.trace_plot(d); m.segment_plot(d); print('torch _memory_viz: trace_plot and segment_plot ok')" || fail=1
    ls -la "$d"
done
[ $fail = 0 ] && echo "ALL EQUAL" || echo "SOME DIFFER"
exit $fail
