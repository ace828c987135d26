#!/usr/bin/python3
"""PyTorch side of bench-finetune: the same LoRA step on the SmolLM2-135M
shape (random weights, T 256, B 4): a frozen float32 Llama (RMSNorm, RoPE,
GQA, SwiGLU, tied head) with PEFT-style adapters on q and v
(y = x W^T + alpha/r (x A^T) B^T, r 8, alpha 16), forward + cross-entropy +
backward + AdamW on the adapters only, timed in this process with
torch.set_num_threads = toy's threads (run with OMP_WAIT_POLICY=passive).
Reads toy's JSON lines on stdin and prints the comparison:
toy/PyTorch step time per base type, and QLoRA (Q4_0) vs LoRA (F32).
Usage: bench-finetune THREADS | torch_lora.py THREADS [STEPS]"""
import json
import sys
import time

import torch
import torch.nn.functional as F

nth = int(sys.argv[1])
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2
toy = [json.loads(l) for l in sys.stdin if l.startswith("{")]
torch.set_num_threads(nth)
torch.manual_seed(0)
V, d, L, H, Hkv, ff, T, B, base, r, alpha = 49152, 576, 30, 9, 3, 1536, 256, 4, 100000.0, 8, 16.0
hd = d // H


def frozen(*shape, std=0.02):
    return torch.randn(*shape) * std


class LoRALinear(torch.nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.w = frozen(o, i)
        self.a = torch.nn.Parameter(torch.empty(r, i).uniform_(-1 / i ** 0.5, 1 / i ** 0.5))
        self.b = torch.nn.Parameter(torch.zeros(o, r))

    def forward(self, x):
        return x @ self.w.T + (alpha / r) * ((x @ self.a.T) @ self.b.T)


emb = frozen(V, d)
layers = []
params = []
for _ in range(L):
    q, v = LoRALinear(d, H * hd), LoRALinear(d, Hkv * hd)
    params += [q.a, q.b, v.a, v.b]
    layers.append(dict(q=q, v=v, k=frozen(Hkv * hd, d), o=frozen(d, H * hd), g=frozen(ff, d), u=frozen(ff, d),
                       dn=frozen(d, ff), n1=torch.ones(d), n2=torch.ones(d)))
nf = torch.ones(d)
inv = 1.0 / (base ** (torch.arange(0, hd, 2).float() / hd))
ang = torch.arange(T).float()[:, None] * inv[None]
cos, sin = torch.cos(ang), torch.sin(ang)
causal = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


def rope(x):
    a, b = x[..., : hd // 2], x[..., hd // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


def forward(tok):
    x = emb[tok]
    for m in layers:
        h = rms(x, m["n1"])
        q = m["q"](h).view(B, T, H, hd).transpose(1, 2)
        k = (h @ m["k"].T).view(B, T, Hkv, hd).transpose(1, 2)
        v = m["v"](h).view(B, T, Hkv, hd).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        s = (q @ k.transpose(-1, -2)) * hd ** -0.5 + causal
        a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, d)
        x = x + a @ m["o"].T
        h = rms(x, m["n2"])
        x = x + (F.silu(h @ m["g"].T) * (h @ m["u"].T)) @ m["dn"].T
    return rms(x, nf) @ emb.T


tok = (torch.arange(T * B) * 7919 % V).view(B, T)
tgt = ((torch.arange(T * B) * 104729 + 3) % V).view(B, T)
opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)
best = 1e30
for i in range(steps + 1):
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = F.cross_entropy(forward(tok).view(-1, V), tgt.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    dt = time.perf_counter() - t0
    if i > 0:
        best = min(best, dt)
print(json.dumps({"bench": "lora", "base": "torch-f32", "threads": nth, "torch_s": round(best, 3)}))
by = {t["base"]: t for t in toy if t.get("products", "f32") == "f32"}
for t in toy:
    prod = ", bf16 products" if t.get("products") == "bf16" else ""
    print(f"lora SmolLM2-135M T {T} B {B} r 8 q,v, {t['base']:>4} base ({t['base_mb']:.0f} MB{prod}): toy {t['toy_s']:.3f} s/step, "
          f"toy/PyTorch(f32) time {t['toy_s'] / best:.2f}x")
print(f"lora torch f32: {best:.3f} s/step (OMP_WAIT_POLICY=passive, {nth} threads)")
if "q4_0" in by and "f32" in by:
    q, f = by["q4_0"], by["f32"]
    print(f"qlora (q4_0) vs lora (f32): {q['toy_s'] / f['toy_s']:.2f}x the step time at "
          f"{q['base_mb'] / f['base_mb']:.2f}x the base memory")
