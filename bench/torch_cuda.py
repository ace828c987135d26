#!/usr/bin/env python3
"""torch_cuda.py: PyTorch on the GPU, the peer of bench-cuda (bench/bench-cuda.sh).

  torch_cuda.py train gpt2-124m|smollm2-135m B T STEPS eager|compile
  torch_cuda.py decode smollm2-135m|llama-1b bf16|f16 N_TOKENS

Same shapes as toy's presets, random weights, BF16 autocast with F32 master
weights and fused AdamW (train); a one-token-at-a-time decode loop with a
static KV cache (decode). Prints one JSON line like bench-cuda's.
"""
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

SHAPES = {
    "gpt2-124m": dict(arch="gpt2", vocab=50257, d=768, layers=12, heads=12, kv=12, ff=3072),
    "smollm2-135m": dict(arch="llama", vocab=49152, d=576, layers=30, heads=9, kv=3, ff=1536, theta=100000.0),
    "llama-1b": dict(arch="llama", vocab=128256, d=2048, layers=16, heads=32, kv=8, ff=8192, theta=500000.0),
}


class Block(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.s, d, hd = s, s["d"], s["d"] // s["heads"]
        self.hd = hd
        gpt2 = s["arch"] == "gpt2"
        self.n1 = nn.LayerNorm(d) if gpt2 else nn.RMSNorm(d, eps=1e-5)
        self.n2 = nn.LayerNorm(d) if gpt2 else nn.RMSNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, (s["heads"] + 2 * s["kv"]) * hd, bias=gpt2)
        self.o = nn.Linear(d, d, bias=gpt2)
        if gpt2:
            self.up, self.down = nn.Linear(d, s["ff"]), nn.Linear(s["ff"], d)
        else:
            self.gate = nn.Linear(d, s["ff"], bias=False)
            self.up = nn.Linear(d, s["ff"], bias=False)
            self.down = nn.Linear(s["ff"], d, bias=False)

    def rope(self, x, cos, sin):  # NEOX halves, as Llama in HF
        h = x.shape[-1] // 2
        x1, x2 = x[..., :h], x[..., h:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def forward(self, x, cos=None, sin=None, cache=None, pos=0):
        s, B, T = self.s, x.shape[0], x.shape[1]
        q, k, v = self.qkv(self.n1(x)).split([s["heads"] * self.hd, s["kv"] * self.hd, s["kv"] * self.hd], dim=-1)
        q = q.view(B, T, s["heads"], self.hd).transpose(1, 2)
        k = k.view(B, T, s["kv"], self.hd).transpose(1, 2)
        v = v.view(B, T, s["kv"], self.hd).transpose(1, 2)
        if cos is not None:
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        if cache is not None:
            cache[0][:, :, pos:pos + T] = k
            cache[1][:, :, pos:pos + T] = v
            k, v = cache[0][:, :, :pos + T], cache[1][:, :, :pos + T]
            a = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1, enable_gqa=True)
        else:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(B, T, -1))
        h = self.n2(x)
        if s["arch"] == "gpt2":
            return x + self.down(F.gelu(self.up(h), approximate="tanh"))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LM(nn.Module):
    def __init__(self, s, max_ctx):
        super().__init__()
        self.s = s
        self.emb = nn.Embedding(s["vocab"], s["d"])
        self.pos = nn.Embedding(max_ctx, s["d"]) if s["arch"] == "gpt2" else None
        self.blocks = nn.ModuleList([Block(s) for _ in range(s["layers"])])
        self.norm = nn.LayerNorm(s["d"]) if s["arch"] == "gpt2" else nn.RMSNorm(s["d"], eps=1e-5)
        self.head = nn.Linear(s["d"], s["vocab"], bias=False)
        if s["arch"] == "llama":
            hd = s["d"] // s["heads"]
            inv = 1.0 / (s["theta"] ** (torch.arange(0, hd, 2).float() / hd))
            ang = torch.outer(torch.arange(max_ctx).float(), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, idx, caches=None, pos=0):
        T = idx.shape[1]
        x = self.emb(idx)
        cos = sin = None
        if self.pos is not None:
            x = x + self.pos(torch.arange(pos, pos + T, device=idx.device))
        else:
            cos, sin = self.cos[pos:pos + T], self.sin[pos:pos + T]
        for i, b in enumerate(self.blocks):
            x = b(x, cos, sin, caches[i] if caches is not None else None, pos)
        return self.head(self.norm(x))


def train(name, B, T, steps, mode):
    s = SHAPES[name]
    torch.manual_seed(1)
    m = LM(s, max(T, 1024)).cuda()
    n_params = sum(p.numel() for p in m.parameters())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    f = torch.compile(m) if mode == "compile" else m
    tok = torch.randint(0, s["vocab"], (B, T), device="cuda")
    tgt = torch.randint(0, s["vocab"], (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(f(tok).float().view(-1, s["vocab"]), tgt.view(-1))
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = B * T * steps / dt
    peak = float(os.environ.get("TOY_PEAK_TFLOPS", "989")) * 1e12
    print(json.dumps({"bench": "train", "impl": "torch-" + mode, "model": name, "device": torch.cuda.get_device_name(),
                      "precision": "bf16", "B": B, "T": T, "params": n_params, "tokens_per_s": round(tps, 1),
                      "step_ms": round(1e3 * dt / steps, 2), "mfu": round(6 * n_params * tps / peak, 4),
                      "loss_last": round(loss.item(), 4)}), flush=True)


@torch.no_grad()
def decode(name, wtype, n_tokens):
    s = SHAPES[name]
    dt_ = torch.bfloat16 if wtype == "bf16" else torch.float16
    torch.manual_seed(1)
    m = LM(s, n_tokens + 8).cuda().to(dt_).eval()
    hd = s["d"] // s["heads"]
    caches = [(torch.zeros(1, s["kv"], n_tokens + 8, hd, device="cuda", dtype=dt_),
               torch.zeros(1, s["kv"], n_tokens + 8, hd, device="cuda", dtype=dt_)) for _ in range(s["layers"])]
    tok = torch.tensor([[7]], device="cuda")
    with torch.inference_mode():  # no autograd bookkeeping: PyTorch's own fastest eager decode
        for i in range(n_tokens):
            if i == 2:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            lg = m(tok, caches, i)
            tok = lg[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print(json.dumps({"bench": "decode", "impl": "torch-eager", "model": name, "device": torch.cuda.get_device_name(),
                      "weights": wtype, "tokens": n_tokens - 2, "tokens_per_s": round((n_tokens - 2) / dt, 1),
                      "ms_per_token": round(1e3 * dt / (n_tokens - 2), 3)}), flush=True)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print(json.dumps({"bench": sys.argv[1] if len(sys.argv) > 1 else "?", "impl": "torch", "skipped": "no CUDA"}))
        sys.exit(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    if sys.argv[1] == "train":
        train(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        decode(sys.argv[2], sys.argv[3], int(sys.argv[4]))
