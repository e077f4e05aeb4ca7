"""The classic PyTorch leak, on the emulated PyTorch (tests/python/site-packages/torch): a training loop that keeps
every step's loss (as `losses.append(loss)` with the graph kept would). Prints the allocator's
own counters, as torch.cuda.memory_allocated/max_memory_allocated/memory_reserved give them:
    line name=N line=L                       (the lines the report must name)
    at name=NAME allocated=A reserved=R max_allocated=M
Usage: python3 torch_train.py [steps]
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages"))
import torch  # noqa: E402

MiB = 1 << 20
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8


def at(name):
    print(f"at name={name} allocated={torch.cuda.memory_allocated()} reserved={torch.cuda.memory_reserved()} "
          f"max_allocated={torch.cuda.max_memory_allocated()}", flush=True)


def line(name):
    print(f"line name={name} line={sys._getframe(1).f_lineno + 1}", flush=True)


line("weights")
weights = [torch.empty(4 * MiB) for _ in range(3)]
losses = []


def train_step():
    x = torch.empty(8 * MiB)
    line("loss")
    loss = torch.mm(2 * MiB)
    line("backward")
    grads = loss.backward()
    losses.append(loss)  # the leak: the loss (and its graph) is kept
    for g in grads:
        g.free()
    x.free()


for step in range(steps):
    train_step()
    time.sleep(0.004)
at("end")
