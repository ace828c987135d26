#!/usr/bin/python3
"""PyTorch side of bench-gpt2-vit: the same GPT-2 124M (B 4, T 64) or
ViT-Tiny/16 (224, B 8) training step in float32 (forward + cross-entropy +
backward + clip + AdamW), timed here with torch.set_num_threads = toy's
threads (run with OMP_WAIT_POLICY=passive). Reads toy's JSON line on stdin
and prints both and the ratio.
Usage: bench-gpt2-vit N gpt2 | torch_gpt2_vit.py N gpt2"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

nth, which = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(nth)
torch.manual_seed(0)
toy = next((json.loads(l) for l in sys.stdin if l.startswith("{")), None)


class Block(nn.Module):
    def __init__(s, d, H, ff, causal, eps):
        super().__init__()
        s.H, s.causal = H, causal
        s.n1, s.n2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        s.qkv, s.o, s.up, s.dn = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(s, x):
        B, T, d = x.shape
        q, k, v = (z.view(B, T, s.H, d // s.H).transpose(1, 2) for z in s.qkv(s.n1(x)).split(d, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=s.causal) if hasattr(F, "scaled_dot_product_attention") \
            else torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(d // s.H) + (torch.triu(
                torch.full((T, T), float("-inf")), 1) if s.causal else 0), -1) @ v
        x = x + s.o(a.transpose(1, 2).reshape(B, T, d))
        return x + s.dn(F.gelu(s.up(s.n2(x)), approximate="tanh"))


def step_time(model, batch, target, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    best = 1e30
    for i in range(steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        out = model(batch)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i > 0:
            best = min(best, time.perf_counter() - t0)
    return best


if which == "gpt2":
    V, d, L, H, C, B, T = 50257, 768, 12, 12, 1024, 4, 64

    class GPT2(nn.Module):
        def __init__(s):
            super().__init__()
            s.wte, s.wpe = nn.Embedding(V, d), nn.Embedding(C, d)
            s.blocks = nn.ModuleList([Block(d, H, 4 * d, True, 1e-5) for _ in range(L)])
            s.nf = nn.LayerNorm(d)

        def forward(s, tok):
            x = s.wte(tok) + s.wpe(torch.arange(tok.shape[1]))
            for b in s.blocks:
                x = b(x)
            return s.nf(x) @ s.wte.weight.T

    t = step_time(GPT2(), torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T)))
    line = f"gpt2 124M train B{B} T{T}: PyTorch {t:.3f} s/step"
    if toy:
        line = (f"gpt2 124M train B{B} T{T}: toy {toy['toy_s']:.3f} s/step ({toy['toy_tok_s']:.0f} tok/s), "
                f"PyTorch {t:.3f} s/step, toy/PyTorch time {toy['toy_s'] / t:.2f}x")
else:
    d, L, H, P, S, K, B = 192, 12, 3, 16, 224, 1000, 8

    class ViT(nn.Module):
        def __init__(s):
            super().__init__()
            s.pe = nn.Conv2d(3, d, P, P)
            s.cls = nn.Parameter(torch.zeros(1, 1, d))
            s.pos = nn.Parameter(torch.zeros(1, (S // P) ** 2 + 1, d))
            s.blocks = nn.ModuleList([Block(d, H, 4 * d, False, 1e-6) for _ in range(L)])
            s.nf, s.head = nn.LayerNorm(d, eps=1e-6), nn.Linear(d, K)

        def forward(s, x):
            x = s.pe(x).flatten(2).transpose(1, 2)
            x = torch.cat([s.cls.expand(x.shape[0], -1, -1), x], 1) + s.pos
            for b in s.blocks:
                x = b(x)
            return s.head(s.nf(x[:, 0]))

    t = step_time(ViT(), torch.randn(B, 3, S, S), torch.randint(0, K, (B,)))
    line = f"vit tiny/16 train B{B}: PyTorch {B / t:.1f} images/s"
    if toy:
        line = (f"vit tiny/16 train B{B}: toy {toy['toy_img_s']:.1f} images/s, PyTorch {B / t:.1f} images/s, "
                f"toy/PyTorch speed {toy['toy_img_s'] * t / B:.2f}x")
print(line)
