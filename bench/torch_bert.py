#!/usr/bin/python3
"""PyTorch side of bench-bert: the same BERT-base encoder (bge-base's shape,
post-LN blocks, GELU tanh, mean pooling) in float32 under inference_mode,
timed on a query (B 1, T 32) and a batch of passages (B 8, T 128) with
torch.set_num_threads = toy's threads (run with OMP_WAIT_POLICY=passive).
Reads toy's JSON line on stdin and prints both and the ratios.
Usage: bench-bert N | torch_bert.py N"""
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

nth = int(sys.argv[1])
torch.set_num_threads(nth)
torch.manual_seed(0)
toy = next((json.loads(l) for l in sys.stdin if l.startswith("{")), None)
V, d, L, H, FF, C = 30522, 768, 12, 12, 3072, 512


class Layer(nn.Module):
    def __init__(s):
        super().__init__()
        s.q, s.k, s.v, s.o = (nn.Linear(d, d) for _ in range(4))
        s.up, s.dn = nn.Linear(d, FF), nn.Linear(FF, d)
        s.n1, s.n2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)

    def forward(s, x):
        B, T, _ = x.shape
        q, k, v = (f(x).view(B, T, H, d // H).transpose(1, 2) for f in (s.q, s.k, s.v))
        a = F.scaled_dot_product_attention(q, k, v) if hasattr(F, "scaled_dot_product_attention") \
            else torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(d // H), -1) @ v
        x = s.n1(x + s.o(a.transpose(1, 2).reshape(B, T, d)))
        return s.n2(x + s.dn(F.gelu(s.up(x), approximate="tanh")))


class Bert(nn.Module):
    def __init__(s):
        super().__init__()
        s.we, s.pe, s.te = nn.Embedding(V, d), nn.Embedding(C, d), nn.Embedding(2, d)
        s.n = nn.LayerNorm(d, eps=1e-12)
        s.layers = nn.ModuleList([Layer() for _ in range(L)])

    def forward(s, tok):
        x = s.n(s.we(tok) + s.pe(torch.arange(tok.shape[1])) + s.te.weight[0])
        for layer in s.layers:
            x = layer(x)
        return x.mean(1)


def best(model, B, T, runs):
    tok = torch.randint(0, V, (B, T))
    t = 1e30
    with torch.inference_mode():
        for i in range(runs + 1):
            t0 = time.perf_counter()
            model(tok)
            if i > 0:
                t = min(t, time.perf_counter() - t0)
    return t


m = Bert().eval()
q, p = best(m, 1, 32, 5), best(m, 8, 128, 2)
line = f"bert-base encode: PyTorch query (T 32) {1 / q:.1f} texts/s, batch (8 x T 128) {8 / p:.1f} texts/s"
if toy:
    line = (f"bert-base encode: query (T 32) toy {toy['query_texts_s']:.1f} texts/s, PyTorch {1 / q:.1f}, "
            f"toy/PyTorch {toy['query_texts_s'] * q:.2f}x; batch (8 x T 128) toy {toy['batch_texts_s']:.1f} texts/s, "
            f"PyTorch {8 / p:.1f}, toy/PyTorch {toy['batch_texts_s'] * p / 8:.2f}x")
print(line)
