#!/usr/bin/python3
"""A PyTorch reference for LoRA on toy's Llama, written for toy's tests.

PEFT's LoraLayer math, written out: for each adapted projection
    y = x W^T + (alpha / r) * (dropout(x) A^T) B^T
with A (r, in), B (out, r) read from a llama.cpp-convention adapter GGUF
("<weight>.lora_a" ne {in, r}, "<weight>.lora_b" ne {r, out}, the
adapter.lora.alpha key); the base (a plain Llama: no biases, QK-norm, caps)
comes from an F32 GGUF through ref_llama.read_gguf; a mixture of experts'
layers run ref_llama's MoE block, with no adapter on the experts. Float64 throughout;
dropout is off (p = 0), as in eval mode.

Usage: ref_lora.py SPEC.json OUT.json
SPEC: {"cases": [{"gguf": base, "adapter": adapter, "scale": 1.0,
                  "tokens": [[...]] (B x T), "targets": [[...]] (B x T, -100 ignored)}]}
OUT:  {"cases": [{"logits": flat, "loss": x, "grads": {name: flat (A (r, in) / B (out, r) row-major)}}]}
"""
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402

DT = torch.float64


def forward(kv, t, ad, scaling, tok):
    m = ref_llama.Llama(kv, t)
    B, T = tok.shape
    x = t["token_embd.weight"][tok]
    pos = torch.arange(T)

    def lin(h, name):
        y = h @ t[name].T
        if name + ".lora_a" in ad:
            A, Bm = ad[name + ".lora_a"], ad[name + ".lora_b"]
            y = y + scaling * ((h @ A.T) @ Bm.T)
        return y

    for l in range(m.L):
        p = f"blk.{l}."
        h = ref_llama.rms(x, t[p + "attn_norm.weight"], m.eps)
        q = lin(h, p + "attn_q.weight").view(B, T, m.H, m.hd)
        k = lin(h, p + "attn_k.weight").view(B, T, m.Hkv, m.hd)
        v = lin(h, p + "attn_v.weight").view(B, T, m.Hkv, m.hd)
        q = ref_llama.rope(q, pos, m.inv, m.neox, m.mscale)
        k = ref_llama.rope(k, pos, m.inv, m.neox, m.mscale)
        g = m.H // m.Hkv
        qh = q.permute(0, 2, 1, 3)
        kh = k.permute(0, 2, 1, 3).repeat_interleave(g, 1)
        vh = v.permute(0, 2, 1, 3).repeat_interleave(g, 1)
        s = qh @ kh.transpose(-1, -2) * m.scale
        i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
        s = s.masked_fill(j > i, -math.inf)
        a = (torch.softmax(s, -1) @ vh).permute(0, 2, 1, 3).reshape(B, T, m.H * m.hd)
        x = x + lin(a, p + "attn_output.weight")
        h = ref_llama.rms(x, t[p + "ffn_norm.weight"], m.eps)
        if p + "ffn_gate_inp.weight" in t:  # a mixture of experts: no adapter on the experts
            x = x + m.moe(h, lambda n, p=p: t.get(p + n))
            continue
        f = torch.nn.functional.silu(lin(h, p + "ffn_gate.weight")) * lin(h, p + "ffn_up.weight")
        x = x + lin(f, p + "ffn_down.weight")
    x = ref_llama.rms(x, t["output_norm.weight"], m.eps)
    return x @ t.get("output.weight", t["token_embd.weight"]).T


def main():
    spec = json.load(open(sys.argv[1]))
    out = []
    for case in spec["cases"]:
        kv, t = ref_llama.read_gguf(case["gguf"])
        akv, ad = ref_llama.read_gguf(case["adapter"])
        assert akv["general.type"] == "adapter" and akv["adapter.type"] == "lora"
        rank = next(v for k, v in ad.items() if k.endswith(".lora_a")).shape[0]
        scaling = case.get("scale", 1.0) * akv["adapter.lora.alpha"] / rank
        for v in ad.values():
            v.requires_grad_(True)
        tok = torch.tensor(case["tokens"], dtype=torch.long)
        logits = forward(kv, t, ad, scaling, tok)
        tgt = torch.tensor(case["targets"], dtype=torch.long).reshape(-1)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt, ignore_index=-100)
        loss.backward()
        out.append({"logits": logits.detach().flatten().tolist(), "loss": loss.item(),
                    "grads": {k: v.grad.flatten().tolist() for k, v in ad.items()}})
    json.dump({"cases": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
