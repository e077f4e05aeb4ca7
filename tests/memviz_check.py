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
    facts = {"peak": {}, "live_end": {}, "oom": {}, "entries": {}}
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
        facts["peak"][dev] = peak
        facts["live_end"][dev] = now
        facts["oom"][dev] = ooms
        facts["entries"][dev] = len(entries)
    print(json.dumps(facts))


main()
