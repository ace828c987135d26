#!/usr/bin/python3
"""A PyTorch reference Llama-family model, written for toy's tests.

Reads GGUF files (a small reader below: header, metadata, tensor infos,
F32 data), builds the model from the metadata and the tensors present
(the same detection rules as llama.cpp: attn_q.bias -> QKV bias, attn_q_norm
-> QK-norm, post_attention_norm -> sandwich norms, no output.weight -> tied),
and computes logits, or trains with AdamW, in float64.

RoPE follows llama.cpp's GGUF convention: "llama"/"mistral" rotate adjacent
pairs (the converter permuted Q/K for it), qwen2/qwen3/gemma2/gemma3 rotate
halves. Sliding windows as llama.cpp's set_swa_pattern: of each period the
last layer is global (gemma2 2, gemma3 6, or attention.sliding_window_pattern);
gemma3's sliding layers rotate with rope.freq_base_swa (10000), unscaled;
smollm3's every fourth layer (3, 7, ...) does not rotate at all.
phi3 (Hugging Face's Phi3 as llama.cpp stores it): q, k, v rows in one
attn_qkv, gate and up rows in one ffn_up; the first rope.dimension_count
dims of each head rotate; LongRoPE divides the frequencies by
rope_factors_long when the sequence passes rope.scaling.original_context_length,
else by rope_factors_short, and rope.scaling.attn_factor scales cos and sin.
gpt-oss (Hugging Face's GptOss, llama.cpp's tensor names): attention sinks
(a per-head logit concatenated to the scores, its column dropped after the
softmax), biases on q, k, v and o, post_attention_norm as the MLP's norm, the
router's top k logits softmaxed, experts with biases and the clamped SwiGLU
(limit 7, alpha 1.702), even layers sliding.

Usage: ref_llama.py SPEC.json OUT.json
SPEC: {"cases": [{"gguf": path, "tokens": [[...]...] (B x T),
                  "train": {"steps", "lr", "beta1", "beta2", "eps", "wd",
                            "batches": [[tokens B x T, targets B x T], ...]}}]}
OUT:  {"cases": [{"logits": flat B x T x V} or {"losses": [...]}]}
"""
import json
import math
import struct
import sys

import numpy as np
import torch

DT = torch.float64

# ---- a minimal GGUF reader -------------------------------------------------
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    buf = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("<Q")
        s = buf[off:off + n].decode("utf-8")
        off += n
        return s

    def value(t):
        if t in SCALAR:
            return take(SCALAR[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError(f"type {t}")

    assert buf[:4] == b"GGUF"
    off = 4
    take("<I")
    n_t, n_kv = take("<Q"), take("<Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("<I"))
    infos = []
    for _ in range(n_t):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        typ, o = take("<I"), take("<Q")
        infos.append((name, ne, typ, o))
    align = kv.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    tensors = {}
    for name, ne, typ, o in infos:
        assert typ == 0, f"{name}: the reference reads f32 only"
        n = int(np.prod(ne))
        a = np.frombuffer(buf, dtype="<f4", count=n, offset=base + o)
        tensors[name] = torch.tensor(a.reshape(list(reversed(ne))).copy(), dtype=DT)
    return kv, tensors


# ---- the model -----------------------------------------------------------------
def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def inv_freqs(n, base, kind, factor, orig, low=1.0, high=4.0, bfast=32.0, bslow=1.0):
    inv = 1.0 / (base ** (torch.arange(0, n, 2, dtype=DT) / n))
    if kind == "linear":
        inv = inv / factor
    elif kind == "llama3":
        low_wl, high_wl = orig / low, orig / high
        wl = 2 * math.pi / inv
        smooth = (orig / wl - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wl > low_wl, inv / factor, torch.where(wl < high_wl, inv, mid))
    elif kind == "yarn":
        def corr(rot):
            return (n * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(bfast)), 0), min(math.ceil(corr(bslow)), n - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(n // 2, dtype=DT) - lo) / (hi - lo)).clamp(0, 1)
        inv = (inv / factor) * ramp + inv * (1 - ramp)
    return inv


def rope(x, pos, inv, neox, mscale):
    # x (B, T, H, D); inv holds the frequencies of the first 2 len(inv) dims, the rest pass through
    if 2 * inv.numel() < x.shape[-1]:
        n = 2 * inv.numel()
        return torch.cat([rope(x[..., :n], pos, inv, neox, mscale), x[..., n:]], -1)
    D = x.shape[-1]
    ang = pos.to(DT).view(-1, 1) * inv.view(1, -1)
    c = (torch.cos(ang) * mscale).view(1, -1, 1, D // 2)
    s = (torch.sin(ang) * mscale).view(1, -1, 1, D // 2)
    if neox:
        a, b = x[..., : D // 2], x[..., D // 2:]
        return torch.cat([a * c - b * s, a * s + b * c], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)


class Llama:
    def __init__(self, kv, t):
        a = kv["general.architecture"]
        g = lambda k, d=None: kv.get(f"{a}.{k}", d)
        self.arch, self.t = a, t
        self.d, self.L = g("embedding_length"), g("block_count")
        self.H = g("attention.head_count")
        self.Hkv = g("attention.head_count_kv", self.H)
        self.hd = g("attention.key_length", self.d // self.H)
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-5)
        self.neox = a not in ("llama", "mistral", "mistral3", "ernie4_5", "smollm3", "granite")
        # Granite: multipliers on the embeddings, the residual branches and the scores; the logits divided
        self.embed_mult = g("embedding_scale", 1.0)
        self.res_mult = g("residual_scale", 1.0)
        self.logit_div = g("logit_scale", 1.0)
        self.nope = 4 if a == "smollm3" else 0
        kind = g("rope.scaling.type", "none")
        factor = g("rope.scaling.factor", 1.0)
        self.rot = g("rope.dimension_count", self.hd)
        self.orig = g("rope.scaling.original_context_length", 0)
        betas = dict(bfast=g("rope.scaling.yarn_beta_fast", 32.0), bslow=g("rope.scaling.yarn_beta_slow", 1.0))
        self.inv = inv_freqs(self.rot, g("rope.freq_base", 10000.0), kind, factor, self.orig, **betas)
        self.mscale = g("rope.scaling.attn_factor", 0.1 * math.log(factor) + 1.0 if kind == "yarn" else 1.0)
        # Ministral 3 (HF's Ministral3 / llama.cpp's mistral3): YaRN without its magnitude; Llama 4's query
        # temperature 1 + beta ln(1 + floor(p / original context)), after the rotation
        self.temp = g("attention.temperature_scale", 0.0) if a == "mistral3" else 0.0
        if a == "mistral3":
            self.mscale = 1.0 if kind == "yarn" or factor <= 1 else 1.0 / (1.0 + 0.1 * math.log(factor))
        # LongRoPE's tables are no parameters
        self.long, self.short = t.pop("rope_factors_long.weight", None), t.pop("rope_factors_short.weight", None)
        for l in range(self.L):  # Phi-3's fused projections, split as Hugging Face's Phi3 splits them
            qkv, up = t.pop(f"blk.{l}.attn_qkv.weight", None), t.get(f"blk.{l}.ffn_up.weight")
            if qkv is not None:
                dq, dkv = self.H * self.hd, self.Hkv * self.hd
                t[f"blk.{l}.attn_q.weight"], t[f"blk.{l}.attn_k.weight"], t[f"blk.{l}.attn_v.weight"] = \
                    qkv[:dq].clone(), qkv[dq:dq + dkv].clone(), qkv[dq + dkv:].clone()
            if f"blk.{l}.ffn_gate.weight" not in t and up is not None and up.shape[0] == 2 * g("feed_forward_length"):
                f = up.shape[0] // 2
                t[f"blk.{l}.ffn_gate.weight"], t[f"blk.{l}.ffn_up.weight"] = up[:f].clone(), up[f:].clone()
        self.window = g("attention.sliding_window", 0)
        self.attn_cap = g("attn_logit_softcapping", 0.0)
        self.final_cap = g("final_logit_softcapping", 0.0)
        self.gemma = a in ("gemma2", "gemma3")
        # (a per-layer list of bools in newer llama.cpp files: true slides)
        self.period = g("attention.sliding_window_pattern", {"gemma2": 2, "gemma3": 6, "olmo2": 4, "gpt-oss": 2}.get(a, 0))
        self.oss = a == "gpt-oss"
        # the sliding layers' own base, unscaled: gemma3's 10000; OLMo 3's (olmo2 with a window) the global base
        olmo3 = a == "olmo2" and self.window > 0
        base_swa = g("rope.freq_base_swa", 10000.0 if a == "gemma3" else g("rope.freq_base", 10000.0) if olmo3 else None)
        self.inv_swa = inv_freqs(self.rot, base_swa, "none", 1.0, 0) if base_swa else None
        self.scale = g("attention.scale", 0.0) or 1.0 / math.sqrt(self.hd)
        self.k = g("expert_used_count", 0)
        self.moe_norm = a not in ("olmoe", "qwen2moe")
        self.moe_scale = 1.0
        self.sigmoid = g("expert_gating_func", 1) == 2
        self.is_mla = a == "deepseek2"
        if self.is_mla:
            # DeepSeek-V2 as Hugging Face's DeepseekV2Attention computes it (not absorbed: keys and values
            # up-projected per head from the latent), with llama.cpp's GGUF conventions: adjacent-pair rope
            # over the last rope_dim dims of each head, yarn_log_multiplier = mscale_all_dim / 10
            self.r = g("attention.kv_lora_rank")
            self.dr = g("rope.dimension_count")
            self.hd = g("attention.key_length_mla", g("attention.key_length"))
            self.dv = g("attention.value_length_mla", g("attention.value_length"))
            self.moe_norm = bool(g("expert_weights_norm", False))
            self.moe_scale = g("expert_weights_scale", 1.0)
            self.inv = inv_freqs(self.dr, g("rope.freq_base", 10000.0), kind, factor,
                                 g("rope.scaling.original_context_length", 0), **betas)
            self.mscale = 1.0
            self.scale = 1.0 / math.sqrt(self.hd)
            all_dim = g("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
            if kind == "yarn" and all_dim and factor > 1:
                self.scale *= (0.1 * all_dim * math.log(factor) + 1.0) ** 2

    def oss_moe(self, h, p):
        # Hugging Face's GptOssMLP: the router's top k logits softmaxed; each expert's gate and up with their
        # biases, glu = min(gate, 7) sigmoid(1.702 glu), times clamp(up, -7, 7) + 1, then down with its bias
        logits = h @ p("ffn_gate_inp.weight").T + p("ffn_gate_inp.bias")
        top, ids = torch.topk(logits, self.k, -1)
        w = torch.softmax(top, -1)
        out = torch.zeros_like(h)
        for e in range(p("ffn_gate_exps.weight").shape[0]):
            sel = ids == e
            if not sel.any():
                continue
            gate = h @ p("ffn_gate_exps.weight")[e].T + p("ffn_gate_exps.bias")[e]
            up = h @ p("ffn_up_exps.weight")[e].T + p("ffn_up_exps.bias")[e]
            gate, up = gate.clamp(max=7.0), up.clamp(min=-7.0, max=7.0)
            y = ((up + 1) * gate * torch.sigmoid(gate * 1.702)) @ p("ffn_down_exps.weight")[e].T \
                + p("ffn_down_exps.bias")[e]
            out = out + y * (w * sel).sum(-1, keepdim=True)
        return out

    def moe(self, h, p):
        if self.oss:
            return self.oss_moe(h, p)
        # Hugging Face's sparse MoE block (Mixtral, Qwen3-MoE, OLMoE): softmax
        # over the router's logits, the top k, renormalised when norm_topk_prob
        logits = h @ p("ffn_gate_inp.weight").T
        # DeepSeek-V3: sigmoid scores, chosen with a bias added (exp_probs_b), weighed without it
        probs = torch.sigmoid(logits) if self.sigmoid else torch.softmax(logits, -1)
        bias = p("exp_probs_b.bias")
        _, ids = torch.topk(probs + bias if bias is not None else probs, self.k, -1)
        w = probs.gather(-1, ids)
        if self.moe_norm:
            w = w / w.sum(-1, keepdim=True)
        gate, up, down = p("ffn_gate_exps.weight"), p("ffn_up_exps.weight"), p("ffn_down_exps.weight")
        out = torch.zeros_like(h)
        for e in range(gate.shape[0]):
            sel = ids == e  # (B, T, k)
            if not sel.any():
                continue
            y = (torch.nn.functional.silu(h @ gate[e].T) * (h @ up[e].T)) @ down[e].T
            out = out + y * (w * sel).sum(-1, keepdim=True)
        out = out * self.moe_scale
        if p("ffn_gate_shexp.weight") is not None:  # shared experts: Qwen2-MoE's gated by a sigmoid, DeepSeek's not
            y = (torch.nn.functional.silu(h @ p("ffn_gate_shexp.weight").T) * (h @ p("ffn_up_shexp.weight").T)) \
                @ p("ffn_down_shexp.weight").T
            gate = p("ffn_gate_inp_shexp.weight")
            out = out + (torch.sigmoid(h @ gate.reshape(-1, 1)) * y if gate is not None else y)
        return out

    def params(self):
        return list(self.t.values())

    def mla(self, h, p, pos):
        B, T, H, r, dr, hd, dv = h.shape[0], h.shape[1], self.H, self.r, self.dr, self.hd, self.dv
        dn = hd - dr
        if p("attn_q_a.weight") is not None:
            q = rms(h @ p("attn_q_a.weight").T, p("attn_q_a_norm.weight"), self.eps) @ p("attn_q_b.weight").T
        else:
            q = h @ p("attn_q.weight").T
        q = q.view(B, T, H, hd)
        kv = h @ p("attn_kv_a_mqa.weight").T
        lat, k_pe = rms(kv[..., :r], p("attn_kv_a_norm.weight"), self.eps), kv[..., r:]
        if p("attn_kv_b.weight") is not None:  # before llama.cpp's MLA files: both up-projections in one
            w = p("attn_kv_b.weight").view(H, dn + dv, r)
            wk, wv = w[:, :dn], w[:, dn:]
        else:
            wk, wv = p("attn_k_b.weight").transpose(1, 2), p("attn_v_b.weight")  # (H, dn, r), (H, dv, r)
        k_nope = torch.einsum("btr,hdr->bthd", lat, wk)
        v = torch.einsum("btr,hdr->bthd", lat, wv)
        q_pe = rope(q[..., dn:], pos, self.inv, False, 1.0)
        k_pe = rope(k_pe.view(B, T, 1, dr), pos, self.inv, False, 1.0).expand(B, T, H, dr)
        qh = torch.cat([q[..., :dn], q_pe], -1).permute(0, 2, 1, 3)
        kh = torch.cat([k_nope, k_pe], -1).permute(0, 2, 1, 3)
        s = qh @ kh.transpose(-1, -2) * self.scale
        i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
        s = s.masked_fill(j > i, -math.inf)
        a = (torch.softmax(s, -1) @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3).reshape(B, T, H * dv)
        return a @ p("attn_output.weight").T

    def forward(self, tok):
        t, B, T = self.t, tok.shape[0], tok.shape[1]
        x = t["token_embd.weight"][tok]
        if self.gemma:
            x = x * math.sqrt(self.d)
        x = x * self.embed_mult
        pos = torch.arange(T)
        inv_all = self.inv
        if self.long is not None:  # LongRoPE: the long factors for a sequence past the original context
            inv_all = self.inv / (self.long if T > self.orig else self.short)
        for l in range(self.L):
            p = lambda n: t.get(f"blk.{l}.{n}")
            # OLMo 2 (no attn_norm / ffn_norm) norms after attention and the MLP only
            h = rms(x, p("attn_norm.weight"), self.eps) if p("attn_norm.weight") is not None else x
            if self.is_mla:
                x = x + self.mla(h, p, pos)
                h = rms(x, p("ffn_norm.weight"), self.eps)
                if p("ffn_gate_inp.weight") is not None:
                    x = x + self.moe(h, p)
                else:
                    x = x + (torch.nn.functional.silu(h @ p("ffn_gate.weight").T) * (h @ p("ffn_up.weight").T)) \
                        @ p("ffn_down.weight").T
                continue
            q, k, v = h @ p("attn_q.weight").T, h @ p("attn_k.weight").T, h @ p("attn_v.weight").T
            if p("attn_q.bias") is not None:
                q, k, v = q + p("attn_q.bias"), k + p("attn_k.bias"), v + p("attn_v.bias")
            qn = p("attn_q_norm.weight")
            if qn is not None and qn.numel() == q.shape[-1] != self.hd:  # OLMoE: the whole projection
                q, k = rms(q, qn, self.eps), rms(k, p("attn_k_norm.weight"), self.eps)
                qn = None
            q = q.view(B, T, self.H, self.hd)
            k = k.view(B, T, self.Hkv, self.hd)
            v = v.view(B, T, self.Hkv, self.hd)
            if qn is not None:
                q, k = rms(q, p("attn_q_norm.weight"), self.eps), rms(k, p("attn_k_norm.weight"), self.eps)
            if isinstance(self.period, list):
                slides = self.window > 0 and bool(self.period[l])
            else:
                slides = self.window > 0 and (self.period == 0 or l % self.period < self.period - 1)
            inv, ms = (self.inv_swa, 1.0) if slides and self.inv_swa is not None else (inv_all, self.mscale)
            if not (self.nope and l % self.nope == self.nope - 1):
                q, k = rope(q, pos, inv, self.neox, ms), rope(k, pos, inv, self.neox, ms)
            if self.temp:
                q = q * (1 + self.temp * torch.log(1 + torch.floor(pos.to(DT) / self.orig))).view(1, -1, 1, 1)
            g = self.H // self.Hkv
            qh, kh, vh = (q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3).repeat_interleave(g, 1),
                          v.permute(0, 2, 1, 3).repeat_interleave(g, 1))
            s = qh @ kh.transpose(-1, -2) * self.scale
            if self.attn_cap > 0:
                s = self.attn_cap * torch.tanh(s / self.attn_cap)
            i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
            bad = j > i
            if slides:
                bad = bad | (j <= i - self.window)
            s = s.masked_fill(bad, -math.inf)
            if p("attn_sinks.weight") is not None:  # gpt-oss: the sink's column joins the softmax, then goes
                sk = p("attn_sinks.weight").view(1, -1, 1, 1).expand(B, self.H, T, 1)
                pr = torch.softmax(torch.cat([s, sk], -1), -1)[..., :-1]
            else:
                pr = torch.softmax(s, -1)
            a = (pr @ vh).permute(0, 2, 1, 3).reshape(B, T, self.H * self.hd)
            a = a @ p("attn_output.weight").T
            if p("attn_output.bias") is not None:
                a = a + p("attn_output.bias")
            if p("post_attention_norm.weight") is not None and not self.oss:
                a = rms(a, p("post_attention_norm.weight"), self.eps)
            x = x + a * self.res_mult
            fn = p("post_attention_norm.weight") if self.oss else p("ffn_norm.weight")
            h = rms(x, fn, self.eps) if fn is not None else x
            if p("ffn_gate_inp.weight") is not None:
                f = self.moe(h, p)
            else:
                gate, up = h @ p("ffn_gate.weight").T, h @ p("ffn_up.weight").T
                act = torch.nn.functional.gelu(gate, approximate="tanh") if self.gemma else torch.nn.functional.silu(gate)
                f = (act * up) @ p("ffn_down.weight").T
            if p("post_ffw_norm.weight") is not None:
                f = rms(f, p("post_ffw_norm.weight"), self.eps)
            x = x + f * self.res_mult
        x = rms(x, t["output_norm.weight"], self.eps)
        logits = x @ t.get("output.weight", t["token_embd.weight"]).T / self.logit_div
        if self.final_cap > 0:
            logits = self.final_cap * torch.tanh(logits / self.final_cap)
        return logits


def main():
    spec = json.load(open(sys.argv[1]))
    out = []
    for case in spec["cases"]:
        kv, t = read_gguf(case["gguf"])
        m = Llama(kv, t)
        if "train" not in case:
            tok = torch.tensor(case["tokens"], dtype=torch.long)
            with torch.no_grad():
                out.append({"logits": m.forward(tok).flatten().tolist()})
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
            logits = m.forward(torch.tensor(tok, dtype=torch.long))
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                     torch.tensor(tgt, dtype=torch.long).reshape(-1))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out.append({"losses": losses})
    json.dump({"cases": out}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
