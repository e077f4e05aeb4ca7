"""Compares gpumemtrace's block level with PyTorch's own accounting (examples/gpu/torch_leak.py).

  compare_blocks.py TRUTH.json SUMMARY.json DUMP.jsonl

Checks, to the byte: live blocks when the Python program finished = memory_allocated() and the
active blocks of _snapshot() (address and size); the allocated peak = max_memory_allocated();
reserved then = memory_reserved(), its peak = max_memory_reserved(). Prints where the summary
puts the leak and the growth. Exit 1 on any mismatch.
"""
import json
import sys

truth = json.load(open(sys.argv[1]))
summary = json.load(open(sys.argv[2]))["traces"][0]
proc, events, pid = None, [], None
for line in open(sys.argv[3]):
    r = json.loads(line)
    if "process" in r:
        pid = r["process"]["pid"]
    elif "event" in r:
        events.append(r["event"])

# The block live set just before the interpreter's shutdown: replay block events up to the first
# event of the main thread without Python after its last one with Python (as the CLI does).
def python(e):
    return e["pystack"] != 0 or e["flags"] & 1
main = [i for i, e in enumerate(events) if e["tid"] == pid]
last_py = max(i for i in main if python(events[i]))
exit_at = next((i for i in main if i > last_py), len(events))
live = {}
for e in events[:exit_at]:
    if e["kind"] != "block" or e["result"] != 0:
        continue
    if e["op"] == "alloc":
        live[e["addr"]] = e["size"]
    else:
        live.pop(e["addr"], None)
traced = sorted([a, s] for a, s in live.items())

blocks = next(g for g in summary["groups"] if g["kind"] == "block" and g["device"] == 0)
pool = next(p for p in summary["pools"] if p["device"] == 0)
rows = [
    ("live blocks at exit (bytes)", truth["allocated"], blocks["live_at_python_exit_bytes"]),
    ("live blocks at exit (count)", len(truth["active_blocks"]), blocks["live_at_python_exit_count"]),
    ("active blocks = _snapshot() (address, size)", len(truth["active_blocks"]), len(traced) if traced == truth["active_blocks"] else f"DIFFERENT ({len(traced)})"),
    ("allocated peak", truth["max_allocated"], blocks["peak_bytes"]),
    ("reserved at exit", truth["reserved"], pool["reserved_bytes"]),
    ("reserved peak", truth["max_reserved"], pool["reserved_peak_bytes"]),
    ("allocator's own max_allocated (reported)", truth["max_allocated"], (pool["reported"] or {}).get("max_allocated")),
]
ok = True
print("| quantity | PyTorch | gpumemtrace |")
print("|---|---|---|")
for name, want, got in rows:
    good = want == got
    ok &= good
    print(f"| {name} | {want} | {got} |{'' if good else ' MISMATCH'}")
print(f"cached, not leaked: {pool['cached_bytes']}; direct driver allocations live: {pool['direct_bytes']} in {pool['direct_count']}")
print("lines of the script:", truth["lines"])
for title, sites in (("leak sites", blocks["leak_sites"]), ("growing sites", blocks["growing_sites"])):
    print(f"{title}:")
    for s in sites[:5]:
        print(f"  {s.get('gained_bytes', s['bytes'])} bytes {s.get('count', '')}x {s.get('function')} {s.get('file', '')}:{s.get('line')} op={s.get('op')} thread={s.get('thread')} during_backward={s.get('during_backward', False)}")
top = blocks["growing_sites"][0] if blocks["growing_sites"] else None
lines = truth["lines"]
if not top or top["line"] not in (lines["forward"], lines["input"]):
    print("MISMATCH: the first growing site is not a line of the kept graph")
    ok = False
print("MATCH" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
