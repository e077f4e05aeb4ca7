"""What one traced allocation + free costs the hooks in code, counted rather than timed.

Reads a callgrind profile of the traced thread (`--dump-instr=yes --compress-pos=no
--compress-strings=no --separate-threads=yes`) and prints, for the preload library's code:
instructions a pair, and hot code lines: the distinct 64-byte lines holding an instruction run
at least once a pair. On a busy host (PyTorch runs megabytes of code between two block
allocations) each of those lines is fetched again from a slower cache at every event, so the
count is what a hook pays there beside its instructions; unlike a timing it is exact and the same
on any machine. Per function with --by-function.

    python3 benches/footprint.py PROFILE PAIRS [--by-function] [--lib=PATH]
"""
import collections
import sys


def main():
    path, pairs = sys.argv[1], int(sys.argv[2])
    by_function = "--by-function" in sys.argv[3:]
    # The library by its path (--lib=PATH; else any file named libgpumemtrace*): a copy under
    # another name would otherwise be left out, and the hooks' code outside .text.hot with it.
    lib = next((a[6:] for a in sys.argv[3:] if a.startswith("--lib=")), None)
    ours = lambda ob: ob is not None and (ob == "???" or (ob == lib if lib else "libgpumemtrace" in ob))
    counts, owner = collections.Counter(), {}
    ob = fn = None
    skip = False  # the line after `calls=` is the call's inclusive cost, not an instruction's
    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("fn="):
                fn, skip = line[3:].strip(), False
            elif line.startswith("calls="):
                skip = True
            elif line.startswith("0x"):
                if skip:
                    skip = False
                    continue
                # positions "instr line", then the Ir count; callgrind leaves the code of a
                # section it cannot place (our .text.hot) under "???".
                p = line.split()
                if ours(ob) and len(p) > 2:
                    a = int(p[0], 16)
                    counts[a] += int(p[2])
                    owner[a] = fn
    hot = {a for a, c in counts.items() if c >= pairs * 0.95}
    lines = {a // 64 for a in hot}
    print(f"pairs={pairs} instructions_per_pair={sum(counts.values()) / pairs:.0f} hot_code_lines={len(lines)}")
    if by_function:
        per_fn = collections.defaultdict(set)
        ins = collections.Counter()
        for a, c in counts.items():
            ins[owner[a]] += c
            if a in hot:
                per_fn[owner[a]].add(a // 64)
        for f, l in sorted(per_fn.items(), key=lambda kv: -len(kv[1])):
            print(f"{len(l):4d} lines {ins[f] / pairs:7.0f} instructions a pair  {f}")


main()
