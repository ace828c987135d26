#!/usr/bin/python3
"""Reference runs of PyTorch's optimizers and of a small training loop.

Writes OUT/train.json with
  adamw / sgd: a parameter, 20 gradients, and torch.optim's parameter after
               each step (float32, the optimizer alone: the check is exact);
  mlp:         a 2-layer MLP (linear+bias, SiLU, linear, cross-entropy)
               trained 20 steps with AdamW; its initial weights, data, and
               the loss of every step (float32 PyTorch).
Usage: /usr/bin/python3 tests/torch/gen_train_refs.py OUTDIR
"""
import json
import os
import sys

import torch

torch.manual_seed(7)
torch.set_num_threads(1)
out = {}

def opt_run(make_opt, n=1000, steps=20):
    p = torch.nn.Parameter(torch.randn(n))
    p0 = p.detach().clone()
    opt = make_opt([p])
    grads, traj = [], []
    for _ in range(steps):
        g = torch.randn(n) * 0.5
        p.grad = g.clone()
        opt.step()
        grads.append(g.tolist())
        traj.append(p.detach().clone().tolist())
    return {"p0": p0.tolist(), "grads": grads, "traj": traj}

out["adamw"] = dict(opt_run(lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                                         weight_decay=0.1)),
                    lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1)
out["sgd"] = dict(opt_run(lambda ps: torch.optim.SGD(ps, lr=5e-2, momentum=0.9, weight_decay=1e-2)),
                  lr=5e-2, momentum=0.9, wd=1e-2)

# MLP
N, D, H, C = 32, 8, 32, 5
x = torch.randn(N, D)
y = torch.randint(0, C, (N,))
w1 = torch.nn.Parameter(torch.randn(H, D) * 0.3)
b1 = torch.nn.Parameter(torch.randn(H) * 0.1)
w2 = torch.nn.Parameter(torch.randn(C, H) * 0.3)
init = [t.detach().clone().flatten().tolist() for t in (w1, b1, w2)]
opt = torch.optim.AdamW([w1, b1, w2], lr=3e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
losses = []
for _ in range(20):
    opt.zero_grad()
    h = torch.nn.functional.silu(x @ w1.T + b1)
    loss = torch.nn.functional.cross_entropy(h @ w2.T, y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
out["mlp"] = {"N": N, "D": D, "H": H, "C": C, "x": x.flatten().tolist(), "y": y.tolist(),
              "init": init, "losses": losses, "lr": 3e-2, "beta1": 0.9, "beta2": 0.99, "wd": 0.01}

d = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(d, exist_ok=True)
with open(os.path.join(d, "train.json"), "w") as f:
    json.dump(out, f)
print("gen_train_refs: adamw, sgd, mlp ->", os.path.join(d, "train.json"))
