"""Compares a gpumemtrace trace (as `gpumemtrace dump --jsonl` prints it) with the truth.

  compare.py log   PROGRAM_STDOUT DUMP.jsonl   # programs logging one `op=` line per call
  compare.py torch PROGRAM_STDOUT DUMP.jsonl   # torch_check.py: reserved bytes at checkpoints
  compare.py jax   PROGRAM_STDOUT DUMP.jsonl   # jax_check.py: XLA's memory statistics

Prints a table and exits 1 on any mismatch.
"""
import json
import sys
from collections import Counter


def load_dump(path):
    proc, events = None, []
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if "process" in rec:
                proc = rec["process"]
            elif "event" in rec:
                events.append(rec["event"])
    return proc, events


def parse_log(path):
    calls = []
    for line in open(path):
        if line.startswith("op="):
            kv = dict(f.split("=", 1) for f in line.split())
            calls.append(kv)
    return calls


def compare_log(log, dump):
    calls = parse_log(log)
    _, events = load_dump(dump)
    pool = list(events)
    missing = []
    for c in calls:
        ptr, res = int(c["ptr"], 16), int(c["result"])
        size = int(c["size"]) if "size" in c else None
        hit = next((e for e in pool if e["addr"] == ptr and e["result"] == res
                    and (size is None or c["op"] == "free" or e["size"] == size)
                    and e["op"] == ("alloc" if c["op"] in ("alloc", "map") else "free")), None)
        if hit is None:
            missing.append(c)
        else:
            pool.remove(hit)
            c["traced_api"] = hit["api"]
    print(f"calls logged by the program: {len(calls)}; events in the trace: {len(events)}")
    print("| line | program called | result | size | traced as |")
    print("|---|---|---|---|---|")
    for c in calls:
        print(f"| {c['line']} | {c['api']} | {c['result']} | {c.get('size', '')} | {c.get('traced_api', 'MISSING')} |")
    for e in pool:
        print(f"extra event not logged by the program: {e}")
    ok = not missing and not pool
    print("MATCH" if ok else f"MISMATCH: {len(missing)} calls missing, {len(pool)} extra events")
    return ok


def live_series(events, kinds):
    """(time_ns, live bytes of `kinds`) after each event, replaying allocs and frees."""
    live, total, out = {}, 0, []
    for e in events:
        if e["result"] != 0:
            continue
        key = (e["namespace"], e["addr"])
        if e["op"] == "alloc" and e["kind"] in kinds:
            live[key] = e["size"]
            total += e["size"]
        elif e["op"] == "free" and key in live:
            total -= live.pop(key)
        out.append((e["t_abs_ns"], total))
    return out


def at(series, t):
    v = 0
    for ts, total in series:
        if ts > t:
            break
        v = total
    return v


def compare_torch(log, dump):
    truth = next(json.loads(l[6:]) for l in open(log) if l.startswith("TRUTH "))
    proc, events = load_dump(dump)
    for e in events:
        e["t_abs_ns"] = proc["start_monotonic_ns"] + e["t"]
    # PyTorch's caching allocator takes its segments with cudaMalloc (default) or cuMemCreate
    # (expandable segments): memory_reserved() counts exactly those. Other device memory in the
    # trace (cuBLAS's own workspaces through cuMemAlloc_v2, ...) is real but invisible to PyTorch.
    mine = [e for e in events if e["api"] in ("cudaMalloc", "cudaFree", "cuMemCreate", "cuMemRelease")]
    others = [e for e in events if e not in mine]
    kinds = {"device", "vmm-physical"}
    series = live_series(mine, kinds)
    other_series = live_series(others, kinds)
    ok = True
    print("| checkpoint | torch memory_reserved | trace: live from PyTorch's allocator | torch max_memory_reserved | trace: its peak so far | trace: other device memory live |")
    print("|---|---|---|---|---|---|")
    for cp in truth:
        live = at(series, cp["t_ns"])
        peak = max([v for ts, v in series if ts <= cp["t_ns"]] or [0])
        good = live == cp["reserved"] and peak == cp["max_reserved"]
        ok &= good
        other = at(other_series, cp["t_ns"])
        print(f"| {cp['label']} | {cp['reserved']} | {live} | {cp['max_reserved']} | {peak} | {other} |{'' if good else ' MISMATCH'}")
    print("apis seen:", dict(Counter(e["api"] for e in events)))
    print("MATCH" if ok else "MISMATCH")
    return ok


def compare_jax(log, dump):
    truth = next(json.loads(l[6:]) for l in open(log) if l.startswith("TRUTH "))
    proc, events = load_dump(dump)
    for e in events:
        e["t_abs_ns"] = proc["start_monotonic_ns"] + e["t"]
    stats = truth["stats"]
    by_kind = {}
    for k in ("device", "vmm-physical", "vmm-reserved", "vmm-mapped", "host-pinned"):
        s = live_series(events, {k})
        by_kind[k] = (at(s, truth["t_ns"]), max([v for _, v in s] or [0]))
    print("XLA memory_stats:", json.dumps(stats))
    print("| kind | trace live at the TRUTH point | trace peak |")
    print("|---|---|---|")
    for k, (live, peak) in by_kind.items():
        print(f"| {k} | {live} | {peak} |")
    print("apis seen:", dict(Counter(e["api"] for e in events)))
    held = by_kind["device"][0] + by_kind["vmm-physical"][0]
    limit = stats.get("bytes_limit") or stats.get("pool_bytes")
    ok = limit is not None and held >= stats.get("bytes_in_use", 0) and held > 0
    print(f"trace holds {held} bytes of device memory; XLA bytes_limit {stats.get('bytes_limit')}, "
          f"pool_bytes {stats.get('pool_bytes')}, bytes_in_use {stats.get('bytes_in_use')}")
    print("CONSISTENT" if ok else "INCONSISTENT")
    return ok


if __name__ == "__main__":
    mode, log, dump = sys.argv[1:4]
    ok = {"log": compare_log, "torch": compare_torch, "jax": compare_jax}[mode](log, dump)
    sys.exit(0 if ok else 1)
