# Source of the code objects in linetables.json (see dump_linetables.py). Varied on purpose:
# long jumps between lines, multi-line expressions, nested functions, a generator, a class.
import ctypes


def simple(n):
    return n + 1


def branches(x):
    if x > 10:
        y = x * 2
    else:
        y = x - 2
    for i in range(3):
        y += i
    return y


def long_gap(a):
    b = a + 1










































































































































    return b * 2


def multi_line(a, b):
    return (a +
            b *
            (a -
             b))


def gen(n):
    for i in range(n):
        yield i * 2


class Model:
    def forward(self, x):
        h = [v * 2 for v in x]
        return sum(h)

    def step(self, lr):
        try:
            return 1 / lr
        except ZeroDivisionError:
            return None


def calls():
    p = ctypes.c_uint64(); r = simple(ctypes.sizeof(p)); return r
