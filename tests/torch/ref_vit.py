#!/usr/bin/python3
"""A PyTorch reference ViT classifier, written for toy's tests (float64).

Reads a toy "vit" GGUF (the reader of ref_llama.py) and follows timm's
VisionTransformer: patch embedding as a real conv2d (stride = patch; so
toy's im2col is checked against a convolution), class token prepended, position
embeddings added, pre-LN blocks (LayerNorm, softmax attention without a
mask, GELU-tanh MLP), final LayerNorm, linear head on the class token.

Usage: ref_vit.py SPEC.json OUT.json
SPEC: {"cases": [{"gguf": path, "images": flat B x C x H x W, "batch": B,
                  "train": {"lr", "beta1", "beta2", "eps", "wd", "labels": [[B]...],
                            "batches": [flat images, ...]}}]}
OUT:  {"cases": [{"logits": flat B x classes} or {"losses": [...], "logits_after": flat}]}
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_llama import read_gguf  # noqa: E402

DT = torch.float64


class ViT:
    def __init__(self, kv, t):
        self.t = t
        self.W = kv["vit.image_size"]
        self.Hh = kv.get("vit.image_height", self.W)
        self.P = kv["vit.patch_size"]
        self.C = kv["vit.channels"]
        self.d = kv["vit.embedding_length"]
        self.L = kv["vit.block_count"]
        self.H = kv["vit.attention.head_count"]
        self.eps = kv["vit.attention.layer_norm_epsilon"]

    def params(self):
        return list(self.t.values())

    def ln(self, x, name):
        return F.layer_norm(x, (self.d,), self.t[name + ".weight"], self.t[name + ".bias"], self.eps)

    def lin(self, x, name):
        return x @ self.t[name + ".weight"].T + self.t[name + ".bias"]

    def forward(self, img):
        t, B, d, H = self.t, img.shape[0], self.d, self.H
        hd = d // H
        w = t["patch_embd.weight"].view(d, self.C, self.P, self.P)
        x = F.conv2d(img, w, t["patch_embd.bias"], stride=self.P).flatten(2).transpose(1, 2)  # (B, N, d)
        x = torch.cat([t["class_embd"].view(1, 1, d).expand(B, 1, d), x], 1) + t["position_embd.weight"]
        T = x.shape[1]
        for l in range(self.L):
            p = f"blk.{l}."
            qkv = self.lin(self.ln(x, p + "attn_norm"), p + "attn_qkv")
            q, k, v = (z.view(B, T, H, hd).transpose(1, 2) for z in qkv.split(d, -1))
            a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), -1) @ v
            x = x + self.lin(a.transpose(1, 2).reshape(B, T, d), p + "attn_output")
            h = F.gelu(self.lin(self.ln(x, p + "ffn_norm"), p + "ffn_up"), approximate="tanh")
            x = x + self.lin(h, p + "ffn_down")
        return self.lin(self.ln(x[:, 0], "output_norm"), "cls_head")


def main():
    spec = json.load(open(sys.argv[1]))
    out = []
    for case in spec["cases"]:
        kv, t = read_gguf(case["gguf"])
        m = ViT(kv, t)
        shape = (case["batch"], m.C, m.Hh, m.W)
        if "train" not in case:
            with torch.no_grad():
                img = torch.tensor(case["images"], dtype=DT).view(shape)
                out.append({"logits": m.forward(img).flatten().tolist()})
            continue
        tr = case["train"]
        ps = m.params()
        for p_ in ps:
            p_.requires_grad_(True)
        opt = torch.optim.AdamW(ps, lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"],
                                weight_decay=tr["wd"])
        losses = []
        for imgs, labels in zip(tr["batches"], tr["labels"]):
            opt.zero_grad()
            logits = m.forward(torch.tensor(imgs, dtype=DT).view(shape))
            loss = F.cross_entropy(logits, torch.tensor(labels))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        with torch.no_grad():
            after = m.forward(torch.tensor(tr["batches"][0], dtype=DT).view(shape))
        out.append({"losses": losses, "logits_after": after.flatten().tolist()})
    json.dump({"cases": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
