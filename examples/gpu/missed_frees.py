"""Explains "allocations at addresses already live (missed frees)" in a trace (issue 13).

Reads `gpumemtrace dump` JSON lines on stdin. For every successful allocation that returns an
address the trace still holds live, prints the earlier allocation, the new one, the events at
that address around them (api, thread, time, order in the file) and whether a free of the
address comes later in the file (a free written out of order) or never (a free not seen). Also
counts successful allocations that returned NULL (cudaMalloc of 0 bytes): the CLI once took each
of those as an allocation at a live address.
"""
import json
import sys
from collections import defaultdict

events = []
for line in sys.stdin:
    rec = json.loads(line)
    if "event" in rec:
        events.append(rec["event"])
    elif "notice" in rec:
        print("notice:", rec["notice"])

by_addr = defaultdict(list)
for i, e in enumerate(events):
    if e["result"] == 0 and e["addr"]:
        by_addr[(e["namespace"], e["addr"])].append(i)

live = {}
cases = 0
later_free = 0
for i, e in enumerate(events):
    if e["result"] != 0 or not e["addr"]:
        continue
    key = (e["namespace"], e["addr"])
    if e["op"] == "free":
        live.pop(key, None)
        continue
    if key in live:
        cases += 1
        j = live[key]
        idx = by_addr[key]
        after = [k for k in idx if k > i and events[k]["op"] == "free"]
        if after:
            later_free += 1
        if cases <= 12:
            p = events[j]
            print(f"case {cases}: {e['namespace']} {e['addr']:#x}: live since #{j} {p['api']} tid {p['tid']} "
                  f"t={p['t']} size {p['size']}; again #{i} {e['api']} tid {e['tid']} t={e['t']} size {e['size']}")
            pos = idx.index(i)
            for k in idx[max(0, pos - 3): pos + 4]:
                x = events[k]
                print(f"    #{k} {x['op']:5} {x['api']:24} tid {x['tid']} t={x['t']} size {x['size']} dev {x['device']}")
    live[key] = i

nulls = sum(1 for e in events if e["op"] == "alloc" and e["result"] == 0 and not e["addr"])
print(f"successful allocations that returned NULL (size 0): {nulls}")
apis = defaultdict(int)
for e in events:
    apis[(e["api"], e["op"], e["result"] == 0)] += 1
print("events by api:", dict(sorted(apis.items(), key=lambda kv: -kv[1])[:20]))
print(f"ALLOCATIONS AT LIVE ADDRESSES: {cases}; with a free of the address later in the file: {later_free}")
