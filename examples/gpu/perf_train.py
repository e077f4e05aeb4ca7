"""Training-loop timing for examples/gpu/perf.sh: a small transformer with real AdamW steps.

  python3 perf_train.py STEPS [none|python|all]

The second argument turns on PyTorch's own allocation history
(`torch.cuda.memory._record_memory_history(stacks=...)`) for comparison. Prints one line:
`ms_per_step=... steps=...`, timed over STEPS steps after 5 warm-up steps (CUDA-synchronized).
"""
import sys
import time

import torch
import torch.nn as nn

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
history = sys.argv[2] if len(sys.argv) > 2 else "none"
torch.manual_seed(0)
dev = "cuda"
vocab, d, layers, seq, batch = 8192, 512, 6, 256, 16


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.enc(self.emb(x)))


model = Model().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
loss_fn = nn.CrossEntropyLoss()
if history != "none":
    torch.cuda.memory._record_memory_history(stacks=history)


def step():
    x = torch.randint(0, vocab, (batch, seq), device=dev)
    y = torch.randint(0, vocab, (batch, seq), device=dev)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x).view(-1, vocab), y.view(-1))
    loss.backward()
    opt.step()


for _ in range(5):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
print(f"ms_per_step={dt * 1000 / steps:.3f} steps={steps}")
