#!/usr/bin/python3
"""PyTorch side of bench-llama: the same Llama shapes in float32 (RMSNorm,
RoPE, GQA, SwiGLU, tied head), a training step (forward + cross-entropy +
backward + AdamW), prefill of 256 tokens and KV-cache decode, timed in this
process with torch.set_num_threads = toy's threads (run with
OMP_WAIT_POLICY=passive, as bench/run.sh does). Prints JSON lines.
Usage: torch_llama.py THREADS S|M|E train|infer (E: a mixture of experts, train only)"""
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

nth, which, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.set_num_threads(nth)
torch.manual_seed(0)
NE = K = 0  # experts, and how many a token
if which == "S":
    V, d, L, H, Hkv, ff, T, B, base = 32000, 288, 6, 6, 6, 768, 256, 8, 10000.0
elif which == "E":  # bench-llama's mixture: 12 layers of 32 experts 512 wide, 4 a token, renormalised (Mixtral's)
    V, d, L, H, Hkv, ff, T, B, base = 49152, 512, 12, 8, 4, 512, 256, 4, 100000.0
    NE, K = 32, 4
else:
    V, d, L, H, Hkv, ff, T, B, base = 49152, 576, 30, 9, 3, 1536, 256, 4, 100000.0
hd = d // H


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Parameter(torch.randn(V, d) * 0.02)
        self.layers = torch.nn.ModuleList()
        for _ in range(L):
            m = torch.nn.Module()
            m.n1 = torch.nn.Parameter(torch.ones(d))
            m.wq = torch.nn.Linear(d, H * hd, bias=False)
            m.wk = torch.nn.Linear(d, Hkv * hd, bias=False)
            m.wv = torch.nn.Linear(d, Hkv * hd, bias=False)
            m.wo = torch.nn.Linear(H * hd, d, bias=False)
            m.n2 = torch.nn.Parameter(torch.ones(d))
            if NE:  # an nn.Linear triple per expert, as Hugging Face's MixtralSparseMoeBlock keeps them (a
                # stacked (E, ff, d) parameter indexed per expert is ~50x slower: each index's backward
                # writes a whole-stack gradient)
                m.router = torch.nn.Linear(d, NE, bias=False)
                m.g = torch.nn.ModuleList(torch.nn.Linear(d, ff, bias=False) for _ in range(NE))
                m.u = torch.nn.ModuleList(torch.nn.Linear(d, ff, bias=False) for _ in range(NE))
                m.dn = torch.nn.ModuleList(torch.nn.Linear(ff, d, bias=False) for _ in range(NE))
            else:
                m.g = torch.nn.Linear(d, ff, bias=False)
                m.u = torch.nn.Linear(d, ff, bias=False)
                m.dn = torch.nn.Linear(ff, d, bias=False)
            self.layers.append(m)
        self.nf = torch.nn.Parameter(torch.ones(d))
        inv = 1.0 / (base ** (torch.arange(0, hd, 2).float() / hd))
        ang = torch.arange(4096).float()[:, None] * inv[None]
        self.cos, self.sin = torch.cos(ang), torch.sin(ang)

    @staticmethod
    def moe(m, h):
        """Hugging Face's Mixtral sparse block: the router's top k renormalised, a loop over the experts that
        gathers their tokens, and index_add_ of the weighted outputs"""
        x = h.reshape(-1, d)
        w, ids = torch.topk(torch.softmax(m.router(x), -1), K, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(NE):
            tok, slot = torch.where(ids == e)
            if tok.numel():
                xe = x[tok]
                ye = m.dn[e](F.silu(m.g[e](xe)) * m.u[e](xe))
                out.index_add_(0, tok, ye * w[tok, slot, None])
        return out.view(h.shape)

    @staticmethod
    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(self, x, p0):
        t = x.shape[2]
        c, s = self.cos[p0:p0 + t], self.sin[p0:p0 + t]
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], -1)

    def forward(self, tok, cache=None, p0=0, last=False):
        Bn, Tn = tok.shape
        x = self.emb[tok]
        for i, m in enumerate(self.layers):
            h = self.rms(x, m.n1)
            q = m.wq(h).view(Bn, Tn, H, hd).transpose(1, 2)
            k = m.wk(h).view(Bn, Tn, Hkv, hd).transpose(1, 2)
            v = m.wv(h).view(Bn, Tn, Hkv, hd).transpose(1, 2)
            q, k = self.rope(q, p0), self.rope(k, p0)
            if cache is not None:
                if i in cache:
                    k = torch.cat([cache[i][0], k], 2)
                    v = torch.cat([cache[i][1], v], 2)
                cache[i] = (k, v)
            k = k.repeat_interleave(H // Hkv, 1)
            v = v.repeat_interleave(H // Hkv, 1)
            s = q @ k.transpose(-1, -2) / math.sqrt(hd)
            if Tn > 1:
                s = s + torch.triu(torch.full((Tn, k.shape[2]), float("-inf")), diagonal=1 + k.shape[2] - Tn)
            a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(Bn, Tn, H * hd)
            x = x + m.wo(a)
            h = self.rms(x, m.n2)
            x = x + (self.moe(m, h) if NE else m.dn(F.silu(m.g(h)) * m.u(h)))
        if last:  # a generation's prefill needs only the last position's logits (as toy's and llama.cpp's)
            x = x[:, -1:]
        return self.rms(x, self.nf) @ self.emb.T


model = Model()
if mode == "train":
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    tok = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    best = 1e30
    for i in range(5 if which == "S" else 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(tok).view(-1, V), tgt.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if i > 0:
            best = min(best, dt)
    print(json.dumps({"bench": "train", "shape": which, "threads": nth, "torch_s": best, "torch_tok_s": B * T / best}))
else:
    with torch.no_grad():
        prompt = torch.randint(0, V, (1, 256))
        bp, bd = 0, 0
        for _ in range(2):
            cache = {}
            t0 = time.perf_counter()
            logits = model(prompt, cache, 0, last=True)
            tp = time.perf_counter() - t0
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            t0 = time.perf_counter()
            for j in range(16):
                logits = model(nxt, cache, 256 + j)
                nxt = logits[:, -1].argmax(-1, keepdim=True)
            td = time.perf_counter() - t0
            bp, bd = max(bp, 256 / tp), max(bd, 16 / td)
    print(json.dumps({"bench": "infer", "shape": which, "threads": nth, "torch_prefill_tok_s": bp,
                      "torch_decode_tok_s": bd}))
