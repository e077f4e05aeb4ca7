"""Checks a gpumemtrace memory_viz export the way PyTorch's memory_viz reads snapshots.

Usage: python3 memviz_check.py SNAPSHOT.pickle -> prints JSON facts (stdout); exits 1 on a
structural error. Only the standard library: what torch/cuda/_memory_viz.py and MemoryViz.js
access is re-stated here (keys, types, action names, the backward replay from the final state).
"""
import json
import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot", "segment_map", "segment_unmap"}


def fail(msg):
    print("memviz_check: " + msg, file=sys.stderr)
    sys.exit(1)


def check_frames(frames, where):
    if not isinstance(frames, list):
        fail(f"{where}: frames is not a list")
    for f in frames:
        for k, t in (("filename", str), ("line", int), ("name", str)):
            if not isinstance(f.get(k), t):
                fail(f"{where}: frame {f!r} lacks {k} ({t.__name__})")


def replay_backwards(data, dev, entries):
    """MemoryViz.js's Allocator State History: from the final segments and blocks, undo the
    entries one by one; at every step each live block must lie in a live segment (else the
    page fails to draw it), and each segment entry must match a segment then."""
    segs = sorted([s["address"], s["total_size"]] for s in data["segments"] if s["device"] == dev)
    blocks = {b["address"]: b["size"] for s in data["segments"] if s["device"] == dev
              for b in s["blocks"] if b["state"] in ("active_allocated", "active_pending_free")}

    def containing(addr, size):
        return next((s for s in segs if s[0] <= addr and addr + size <= s[0] + s[1]), None)

    for i in range(len(entries) - 1, -1, -1):
        e = entries[i]
        a, n, act = e["addr"], e["size"], e["action"]
        where = f"device {dev} entry {i} ({act} {a:#x})"
        if act == "alloc":
            if blocks.pop(a, None) is None:
                fail(f"{where}: undoing an alloc of a block that is not live")
        elif act == "free_completed":
            if a in blocks:
                fail(f"{where}: undoing a free of a live block")
            blocks[a] = n
        elif act == "free_requested":
            if a not in blocks:
                fail(f"{where}: free_requested of a block that is not live")
        elif act in ("segment_free", "segment_unmap"):
            if containing(a, 1) or any(a <= s[0] < a + n for s in segs):
                fail(f"{where}: segment overlaps a live one")
            segs.append([a, n])
            segs.sort()
            if act == "segment_unmap":  # merged with its neighbours, as the page does
                merged = []
                for s in segs:
                    if merged and merged[-1][0] + merged[-1][1] == s[0]:
                        merged[-1][1] += s[1]
                    else:
                        merged.append(s)
                segs[:] = merged
        elif act == "segment_alloc":
            s = next((s for s in segs if s[0] == a), None)
            if s is None or s[1] != n:
                fail(f"{where}: no live segment of {n} bytes at this address")
            segs.remove(s)
        elif act == "segment_map":
            s = containing(a, n)
            if s is None:
                fail(f"{where}: mapped range in no live segment")
            segs.remove(s)
            for piece in ([s[0], a - s[0]], [a + n, s[0] + s[1] - a - n]):
                if piece[1] > 0:
                    segs.append(piece)
            segs.sort()
        for b, size in blocks.items():
            if containing(b, size) is None:
                fail(f"{where}: block {b:#x} of {size} bytes lies in no segment before it")


def main():
    with open(sys.argv[1], "rb") as fh:
        data = pickle.load(fh)
    if not isinstance(data, dict) or "segments" not in data or "device_traces" not in data:
        fail("not a snapshot dict with segments and device_traces")
    # segsum() / MemoryViz.js: segment and block fields.
    for i, seg in enumerate(data["segments"]):
        for k, t in (("device", int), ("address", int), ("total_size", int), ("allocated_size", int),
                     ("active_size", int), ("stream", int), ("segment_type", str), ("blocks", list)):
            if not isinstance(seg.get(k), t):
                fail(f"segment {i}: {k} missing or not {t.__name__}")
        boffset = 0
        for b in seg["blocks"]:
            for k, t in (("size", int), ("state", str), ("address", int), ("requested_size", int)):
                if not isinstance(b.get(k), t):
                    fail(f"segment {i} block: {k} missing or not {t.__name__}")
            if b["state"] not in ("active_allocated", "active_pending_free", "inactive"):
                fail(f"segment {i}: block state {b['state']!r}")
            if b["address"] != seg["address"] + boffset:
                fail(f"segment {i}: block address does not follow the previous block")
            check_frames(b.get("frames", []), f"segment {i} block")
            boffset += b["size"]
        if boffset != seg["total_size"]:
            fail(f"segment {i}: blocks do not add up to total_size")
        active = sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
        if active != seg["active_size"]:
            fail(f"segment {i}: active_size {seg['active_size']} != blocks {active}")
    if not isinstance(data["device_traces"], list):
        fail("device_traces is not a list")
    facts = {"peak": {}, "live_end": {}, "oom": {}, "entries": {}, "active": {}, "segments": {}, "actions": {}}
    for dev, entries in enumerate(data["device_traces"]):
        live, now, peak, ooms = {}, 0, 0, 0
        last_t = -1
        for e in entries:
            for k, t in (("action", str), ("addr", int), ("size", int), ("stream", int), ("time_us", int)):
                if not isinstance(e.get(k), t):
                    fail(f"device {dev}: entry {e!r}: {k} missing or not {t.__name__}")
            if e["action"] not in ACTIONS:
                fail(f"device {dev}: unknown action {e['action']!r}")
            if e["time_us"] < last_t:
                fail(f"device {dev}: time goes backwards")
            last_t = e["time_us"]
            check_frames(e.get("frames", []), f"device {dev} {e['action']}")
            if e["action"] == "alloc":
                if e["addr"] in live:
                    fail(f"device {dev}: alloc of live address {e['addr']:#x}")
                live[e["addr"]] = e["size"]
                now += e["size"]
                peak = max(peak, now)
            elif e["action"] == "free_completed":
                if live.pop(e["addr"], None) != e["size"]:
                    fail(f"device {dev}: free_completed of {e['addr']:#x} does not match its alloc")
                now -= e["size"]
            elif e["action"] == "oom":
                if not isinstance(e.get("device_free"), int):
                    fail("oom entry without device_free")
                ooms += 1
        # MemoryViz replays backwards from the segments: the final state must be what is live.
        final = {b["address"]: b["size"] for s in data["segments"] if s["device"] == dev
                 for b in s["blocks"] if b["state"] == "active_allocated"}
        if final != live:
            fail(f"device {dev}: segments {sorted(final)} != live at the end of the trace {sorted(live)}")
        replay_backwards(data, dev, entries)
        facts["active"][dev] = sorted([a, n] for a, n in final.items())
        facts["segments"][dev] = [[s["address"], s["total_size"], s["is_expandable"]] for s in data["segments"] if s["device"] == dev]
        facts["actions"][dev] = {}
        for e in entries:
            facts["actions"][dev][e["action"]] = facts["actions"][dev].get(e["action"], 0) + 1
        facts["peak"][dev] = peak
        facts["live_end"][dev] = now
        facts["oom"][dev] = ooms
        facts["entries"][dev] = len(entries)
    print(json.dumps(facts))


main()
