"""A small PyTorch training loop for gpumemtrace's Python-stack validation (examples/gpu/
python_validate.sh). The summary's peak and leak sites should name these lines: the forward
pass, loss.backward() (run by the autograd engine's own thread: native stack only), the
optimizer step (its state is created on the first step), and the deliberate leak below."""
import torch

torch.manual_seed(0)
dev = torch.device("cuda")
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)
).to(dev)                                                       # parameters
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
kept = []                                                       # the leak: grows every step


def forward(x):
    return model(x)                                             # activations


def train_step(step):
    x = torch.randn(512, 1024, device=dev)                      # input batch
    y = forward(x)
    loss = (y - x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()                                             # gradients
    opt.step()                                                  # optimizer state (step 0)
    kept.append(torch.empty(256, 1024, device=dev))             # LEAK: 1 MiB a step, never freed
    return loss.item()


for step in range(20):
    train_step(step)
torch.cuda.synchronize()
print(f"done, kept {len(kept)} tensors")
