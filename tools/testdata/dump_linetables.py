"""Writes, for the running CPython, every code object of linetables_src.py with its line table
and the line of each instruction offset as CPython reports it (co_positions on 3.11+,
co_lines on 3.10). Usage: for each python: python dump_linetables.py linetables.json
(merges into the file under the key "3.N")."""
import json
import os
import sys
import types

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "linetables_src.py")
top = compile(open(src).read(), src, "exec")


def codes(c):
    yield c
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            yield from codes(k)


out = []
for c in codes(top):
    if sys.version_info >= (3, 11):
        lines = [[2 * i, p[0]] for i, p in enumerate(c.co_positions())]
        fmt = 2
    else:
        lines = []
        for start, end, line in c.co_lines():
            lines += [[o, line] for o in range(start, end, 2)]
        fmt = 1
    out.append({"name": c.co_name, "firstlineno": c.co_firstlineno, "format": fmt,
                "linetable": c.co_linetable.hex(), "lines": lines})
path = sys.argv[1]
data = json.load(open(path)) if os.path.exists(path) else {}
data["%d.%d" % sys.version_info[:2]] = out
json.dump(data, open(path, "w"), indent=0, sort_keys=True)
