#!/usr/bin/python3
"""A PyTorch reference BERT encoder, written for toy's tests (float64).

Reads a GGUF in llama.cpp's bert naming (the reader of ref_llama.py) and
follows Hugging Face's modeling_bert.py: word + token type 0 + position
embeddings, LayerNorm; per layer, q/k/v with biases, softmax over every key
(no mask: one text per row), output dense, LayerNorm(x + it); intermediate
dense, GELU, output dense, LayerNorm(x + it). GELU is the tanh form (as
llama.cpp and toy compute it); the exact erf form, Hugging Face's "gelu",
is computed too so the tests can say how far apart the two are.

Usage: ref_bert.py SPEC.json OUT.json
SPEC: {"cases": [{"gguf": path, "tokens": [[...]...] (B x T)}]}
OUT:  {"cases": [{"hidden": flat B x T x d (tanh GELU),
                  "cos_erf": [per row: cosine of the mean-pooled tanh and erf embeddings]}]}
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_llama import read_gguf  # noqa: E402


class Bert:
    def __init__(self, kv, t):
        self.t = t
        self.d = kv["bert.embedding_length"]
        self.L = kv["bert.block_count"]
        self.H = kv["bert.attention.head_count"]
        self.eps = kv.get("bert.attention.layer_norm_epsilon", 1e-12)

    def ln(self, x, name):
        return F.layer_norm(x, (self.d,), self.t[name + ".weight"], self.t[name + ".bias"], self.eps)

    def lin(self, x, name):
        return x @ self.t[name + ".weight"].T + self.t[name + ".bias"]

    def forward(self, tok, approximate):
        t, B, T, H = self.t, tok.shape[0], tok.shape[1], self.H
        hd = self.d // H
        x = t["token_embd.weight"][tok] + t["position_embd.weight"][:T]
        if "token_types.weight" in t:
            x = x + t["token_types.weight"][0]
        x = self.ln(x, "token_embd_norm")
        for l in range(self.L):
            p = f"blk.{l}."
            q, k, v = (self.lin(x, p + n).view(B, T, H, hd).transpose(1, 2) for n in ("attn_q", "attn_k", "attn_v"))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, self.d)
            x = self.ln(x + self.lin(a, p + "attn_output"), p + "attn_output_norm")
            h = F.gelu(self.lin(x, p + "ffn_up"), approximate=approximate)
            x = self.ln(x + self.lin(h, p + "ffn_down"), p + "layer_output_norm")
        return x


def main():
    spec = json.load(open(sys.argv[1]))
    out = []
    for case in spec["cases"]:
        kv, t = read_gguf(case["gguf"])
        m = Bert(kv, t)
        tok = torch.tensor(case["tokens"])
        with torch.no_grad():
            h = m.forward(tok, "tanh")
            e = m.forward(tok, "none")
            cos = F.cosine_similarity(h.mean(1), e.mean(1), dim=-1)
        out.append({"hidden": h.flatten().tolist(), "cos_erf": cos.tolist()})
    json.dump({"cases": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
