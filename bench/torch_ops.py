#!/usr/bin/python3
"""The PyTorch side of bench-engine: the same ops, forward + backward, same
shapes and thread count, run fairly (OMP_WAIT_POLICY=passive set by run.sh,
torch.set_num_threads = toy's threads). Prints JSON lines."""
import json
import sys
import time

import torch

nth = int(sys.argv[1]) if len(sys.argv) > 1 else 2
torch.set_num_threads(nth)
torch.manual_seed(0)
B, T, D, H, Hkv, C, F = 4, 256, 64, 9, 3, 576, 1536


def best(fn, reps=5, iters=10):
    fn()
    b = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        b = min(b, (time.perf_counter() - t0) / iters)
    return b


def attention():
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, Hkv, T, D, requires_grad=True)
    v = torch.randn(B, Hkv, T, D, requires_grad=True)
    dy = torch.randn(B, H, T, D)
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)

    def step():
        kk = k.repeat_interleave(H // Hkv, dim=1)
        vv = v.repeat_interleave(H // Hkv, dim=1)
        p = torch.softmax(q @ kk.transpose(-1, -2) / D ** 0.5 + mask, dim=-1)
        (p @ vv).backward(dy)
    return step


def rms_norm():
    x = torch.randn(T * B, C, requires_grad=True)
    w = torch.randn(C, requires_grad=True)
    dy = torch.randn(T * B, C)

    def step():
        (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w).backward(dy)
    return step


def swiglu():
    g = torch.randn(T * B, F, requires_grad=True)
    u = torch.randn(T * B, F, requires_grad=True)
    dy = torch.randn(T * B, F)

    def step():
        (torch.nn.functional.silu(g) * u).backward(dy)
    return step


def sample(top_p=0.0, top_k=0):
    """one token from 49152 logits at temperature 0.8, as Hugging Face's warpers and multinomial draw it"""
    logits = torch.randn(49152) * 3

    def step():
        x = logits / 0.8
        if top_k:
            v, i = torch.topk(x, top_k)
            return i[torch.multinomial(torch.softmax(v, -1), 1)]
        if top_p:
            s, i = torch.sort(x)
            drop = torch.softmax(s, -1).cumsum(-1) <= 1 - top_p
            x = x.scatter(0, i, s.masked_fill(drop, float("-inf")))
        return torch.multinomial(torch.softmax(x, -1), 1)
    return step


for name, mk in [("attention", attention), ("rms_norm", rms_norm), ("swiglu", swiglu)]:
    print(json.dumps({"bench": name, "threads": nth, "torch_ms": best(mk()) * 1000}))
for name, mk in [("sample_temp", lambda: sample()), ("sample_top_p", lambda: sample(top_p=0.95)),
                 ("sample_top_k", lambda: sample(top_k=40))]:
    print(json.dumps({"bench": name, "threads": nth, "torch_ms": best(mk(), iters=50) * 1000}))
