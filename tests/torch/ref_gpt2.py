#!/usr/bin/python3
"""A PyTorch reference GPT-2, written for toy's tests (float64).

Reads a GGUF in llama.cpp's gpt2 naming (the reader of ref_llama.py) and
follows Hugging Face's modeling_gpt2.py: wte + wpe, per block ln_1 -> c_attn
(rows [q; k; v]) -> causal softmax attention -> c_proj, ln_2 -> c_fc ->
gelu (tanh) -> c_proj, ln_f, head = output.weight or the token embeddings.

Usage: ref_gpt2.py SPEC.json OUT.json
SPEC: {"cases": [{"gguf": path, "tokens": [[...]...] (B x T),
                  "train": {"lr", "beta1", "beta2", "eps", "wd",
                            "batches": [[tokens B x T, targets B x T], ...]}}]}
OUT:  {"cases": [{"logits": flat B x T x V} or {"losses": [...]}]}
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_llama import read_gguf  # noqa: E402


class GPT2:
    def __init__(self, kv, t):
        self.t = t
        self.d = kv["gpt2.embedding_length"]
        self.L = kv["gpt2.block_count"]
        self.H = kv["gpt2.attention.head_count"]
        self.eps = kv.get("gpt2.attention.layer_norm_epsilon", 1e-5)

    def params(self):
        return list(self.t.values())

    def ln(self, x, name):
        return F.layer_norm(x, (self.d,), self.t[name + ".weight"], self.t[name + ".bias"], self.eps)

    def lin(self, x, name):
        return x @ self.t[name + ".weight"].T + self.t[name + ".bias"]

    def forward(self, tok):
        t, B, T, H = self.t, tok.shape[0], tok.shape[1], self.H
        hd = self.d // H
        x = t["token_embd.weight"][tok] + t["position_embd.weight"][:T]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.L):
            p = f"blk.{l}."
            qkv = self.lin(self.ln(x, p + "attn_norm"), p + "attn_qkv")
            q, k, v = qkv.split(self.d, dim=-1)
            q, k, v = (z.view(B, T, H, hd).transpose(1, 2) for z in (q, k, v))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~mask, -math.inf)
            a = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, self.d)
            x = x + self.lin(a, p + "attn_output")
            h = F.gelu(self.lin(self.ln(x, p + "ffn_norm"), p + "ffn_up"), approximate="tanh")
            x = x + self.lin(h, p + "ffn_down")
        x = self.ln(x, "output_norm")
        return x @ t.get("output.weight", t["token_embd.weight"]).T


def main():
    spec = json.load(open(sys.argv[1]))
    out = []
    for case in spec["cases"]:
        kv, t = read_gguf(case["gguf"])
        m = GPT2(kv, t)
        if "train" not in case:
            with torch.no_grad():
                out.append({"logits": m.forward(torch.tensor(case["tokens"])).flatten().tolist()})
            continue
        tr = case["train"]
        ps = m.params()
        for p_ in ps:
            p_.requires_grad_(True)
        opt = torch.optim.AdamW(ps, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                                weight_decay=tr["wd"])
        losses = []
        for tok, tgt in tr["batches"]:
            opt.zero_grad()
            logits = m.forward(torch.tensor(tok))
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.tensor(tgt).reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out.append({"losses": losses})
    json.dump({"cases": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
