#!/usr/bin/python3
"""Reference values for every op of the engine, computed by PyTorch.

Writes OUT/ops.json: a list of cases. Each case names an op, its parameters,
its inputs (PyTorch shapes, float32 values; "layout": "T" asks the C test to
store the input transposed and pass a transposed view), an upstream gradient
dy, and PyTorch's output and input gradients of sum(out * dy).

The reference is computed in float64 from the float32 inputs, so the
comparison measures toy's float32 error only. tests/test-ops.c runs the same
cases through toy and compares: |toy - ref| <= tol * (1 + |ref|).

Usage: /usr/bin/python3 tests/torch/gen_op_refs.py OUTDIR
"""
import json
import math
import os
import sys

import torch

torch.manual_seed(1234)
DT = torch.float64


def rnd(*shape, lo=None):
    x = torch.randn(*shape, dtype=torch.float32)
    if lo is not None:
        x = x.abs() + lo
    return x


cases = []


def add_case(name, op, inputs, fn, params=None, int_inputs=None, grads=True, tol=1e-5):
    """inputs: list of (name, float32 tensor, layout); fn(*float64 tensors, **ints) -> out"""
    params = params or {}
    int_inputs = int_inputs or {}
    xs = [t.to(DT).clone().requires_grad_(grads) for (_, t, _) in inputs]
    out = fn(*xs)
    dy = torch.randn(out.shape, dtype=torch.float32)
    entry = {
        "name": name,
        "op": op,
        "params": params,
        "tol": tol,
        "inputs": [{"name": n, "shape": list(t.shape), "layout": lay,
                    "data": t.flatten().tolist()} for (n, t, lay) in inputs],
        "ints": {k: {"shape": list(v.shape), "data": v.flatten().tolist()} for k, v in int_inputs.items()},
        "out_shape": list(out.shape),
        "out": out.detach().to(torch.float32).flatten().tolist() if out.dim() else [out.item()],
        "dy": dy.flatten().tolist() if out.dim() else [dy.item()],
        "grads": [],
    }
    if grads:
        (out * dy.to(DT)).sum().backward()
        entry["grads"] = [x.grad.flatten().tolist() if x.grad is not None else None for x in xs]
    cases.append(entry)


# ---- elementwise with broadcasting ------------------------------------------------
for op, f in [("add", torch.add), ("sub", torch.sub), ("mul", torch.mul), ("div", torch.div)]:
    for bshape in [(3, 5, 7), (1, 5, 7), (3, 1, 7), (3, 5, 1), (7,), (1, 1, 1)]:
        a = rnd(3, 5, 7)
        b = rnd(*bshape, lo=0.5) if op == "div" else rnd(*bshape)
        add_case(f"{op}_b{'x'.join(map(str, bshape))}", op, [("a", a, ""), ("b", b, "")], f)
# non-contiguous input (a transposed view)
add_case("add_transposed", "add", [("a", rnd(6, 9), "T"), ("b", rnd(6, 9), "")], torch.add)
add_case("mul_transposed_both", "mul", [("a", rnd(4, 8), "T"), ("b", rnd(4, 8), "T")], torch.mul)

add_case("scale", "scale", [("a", rnd(4, 33), "")], lambda a: a * 0.37, {"s": 0.37})
add_case("sqr", "sqr", [("a", rnd(4, 33), "")], lambda a: a * a)
add_case("sqrt", "sqrt", [("a", rnd(4, 33, lo=0.2), "")], torch.sqrt)
add_case("neg", "neg", [("a", rnd(4, 33), "")], torch.neg)
add_case("tanh", "tanh", [("a", rnd(4, 33) * 2, "")], torch.tanh)
add_case("silu", "silu", [("a", rnd(5, 67) * 3, "")], torch.nn.functional.silu)
add_case("silu_transposed", "silu", [("a", rnd(8, 12), "T")], torch.nn.functional.silu)
add_case("gelu", "gelu", [("a", rnd(5, 67) * 3, "")],
         lambda a: torch.nn.functional.gelu(a, approximate="tanh"))
add_case("swiglu", "swiglu", [("g", rnd(6, 70) * 2, ""), ("u", rnd(6, 70), "")],
         lambda g, u: torch.nn.functional.silu(g) * u)

# ---- matmul ----------------------------------------------------------------------------
for ta in (0, 1):
    for tb in (0, 1):
        m, k, n = 13, 37, 19
        A = rnd(k, m) if ta else rnd(m, k)
        B = rnd(n, k) if tb else rnd(k, n)
        add_case(f"matmul_ta{ta}_tb{tb}", "matmul", [("A", A, ""), ("B", B, "")],
                 lambda A, B, ta=ta, tb=tb: (A.T if ta else A) @ (B.T if tb else B),
                 {"trans_a": ta, "trans_b": tb})
# batched, B broadcast by ratio (grouped heads): A (2, 4, m, k), B (2, 2, k, n)
A = rnd(2, 4, 9, 16)
B = rnd(2, 2, 16, 11)
add_case("matmul_batched_gqa", "matmul", [("A", A, ""), ("B", B, "")],
         lambda A, B: A @ B.repeat_interleave(2, dim=1), {"trans_a": 0, "trans_b": 0})
A = rnd(3, 8, 24)
B = rnd(1, 10, 24)
add_case("matmul_batched_bcast_tb", "matmul", [("A", A, ""), ("B", B, "")],
         lambda A, B: A @ B.transpose(-1, -2), {"trans_a": 0, "trans_b": 1})
add_case("matmul_transposed_view", "matmul", [("A", rnd(12, 20), "T"), ("B", rnd(20, 7), "")],
         lambda A, B: A @ B, {"trans_a": 0, "trans_b": 0})
add_case("linear_bias", "linear", [("x", rnd(2, 5, 24), ""), ("w", rnd(40, 24), ""), ("b", rnd(40), "")],
         lambda x, w, b: x @ w.T + b)
add_case("linear_large", "linear", [("x", rnd(64, 576), ""), ("w", rnd(96, 576) * 0.05, "")],
         lambda x, w: x @ w.T)

# ---- indexing, reductions ---------------------------------------------------------------
ids = torch.tensor([[3, 0, 7, 3], [1, 1, 9, 2]], dtype=torch.int32)
add_case("get_rows", "get_rows", [("table", rnd(10, 12), "")],
         lambda t: t[ids.long()], int_inputs={"ids": ids})
for dim in range(3):
    tdim = 2 - dim  # torch dim of toy dim
    add_case(f"sum_dim{dim}", "sum", [("a", rnd(3, 4, 5), "")],
             lambda a, d=tdim: a.sum(dim=d, keepdim=True), {"dim": dim})
    add_case(f"mean_dim{dim}", "mean", [("a", rnd(3, 4, 5), "")],
             lambda a, d=tdim: a.mean(dim=d, keepdim=True), {"dim": dim})
add_case("sum_all", "sum_all", [("a", rnd(3, 4, 5), "")], lambda a: a.sum().reshape(1))
add_case("repeat", "repeat", [("a", rnd(3, 1, 5), "")], lambda a: a.expand(3, 4, 5).clone(),
         {"like": [3, 4, 5]})
add_case("sum_to", "sum_to", [("a", rnd(3, 4, 5), "")], lambda a: a.sum(dim=1, keepdim=True),
         {"like": [3, 1, 5]})
# a bias's gradient: one row from 80 (big enough for the pool's threads, which split its columns)
add_case("sum_to_bias", "sum_to", [("a", rnd(2, 40, 300), "")], lambda a: a.sum(dim=(0, 1), keepdim=True),
         {"like": [1, 1, 300]})
add_case("concat_dim0", "concat", [("a", rnd(3, 4, 5), ""), ("b", rnd(3, 4, 2), "")],
         lambda a, b: torch.cat([a, b], dim=2), {"dim": 0})
add_case("concat_dim1", "concat", [("a", rnd(3, 4, 5), ""), ("b", rnd(3, 2, 5), "")],
         lambda a, b: torch.cat([a, b], dim=1), {"dim": 1})
add_case("concat_dim2", "concat", [("a", rnd(3, 4, 5), ""), ("b", rnd(1, 4, 5), "")],
         lambda a, b: torch.cat([a, b], dim=0), {"dim": 2})

# ---- norms, softmax -------------------------------------------------------------------------
add_case("rms_norm", "rms_norm", [("x", rnd(2, 7, 96), ""), ("w", rnd(96), "")],
         lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, {"eps": 1e-5})
add_case("rms_norm_noweight", "rms_norm", [("x", rnd(9, 64) * 4, "")],
         lambda x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), {"eps": 1e-6})
add_case("layer_norm", "layer_norm", [("x", rnd(2, 7, 96) + 0.5, ""), ("w", rnd(96), ""), ("b", rnd(96), "")],
         lambda x, w, b: torch.nn.functional.layer_norm(x, (96,), w, b, 1e-5), {"eps": 1e-5})
# views of one intermediate (2x): GPT-2's q, k, v split (disjoint; the gradient gathered in one
# buffer), overlapping views, and views beside a use of the whole tensor
add_case("qkv_views", "qkv_views", [("x", rnd(2, 5, 3 * 12), "")],
         lambda x: (lambda q, k, v: q * k + v)(*(2 * x).split(12, dim=-1)))
add_case("qkv_head_views", "qkv_head_views", [("x", rnd(2, 5, 3 * 2 * 4), "")],
         lambda x: (lambda q, k, v: q * k + v)(*(2 * x).split(8, dim=-1)))
add_case("overlapping_views", "overlapping_views", [("x", rnd(4, 3 * 10), "")],
         lambda x: (2 * x)[..., :20] * (2 * x)[..., 10:])
add_case("views_and_whole", "views_and_whole", [("x", rnd(3, 2 * 9), "")],
         lambda x: (2 * x)[..., :9] * (2 * x)[..., 9:] + (2 * x).sum(-1, keepdim=True))
# widths with tails past the vector kernels' 16 and 8 lanes, and without the affine part
add_case("layer_norm_odd", "layer_norm", [("x", rnd(3, 5, 37) * 3 - 1, ""), ("w", rnd(37), ""), ("b", rnd(37), "")],
         lambda x, w, b: torch.nn.functional.layer_norm(x, (37,), w, b, 1e-5), {"eps": 1e-5})
add_case("layer_norm_plain", "layer_norm", [("x", rnd(4, 200) + 2, "")],
         lambda x: torch.nn.functional.layer_norm(x, (200,), None, None, 1e-6), {"eps": 1e-6})
add_case("softmax", "softmax", [("x", rnd(4, 6, 50), "")],
         lambda x: torch.softmax(x * 0.5, dim=-1), {"scale": 0.5})
mask = torch.triu(torch.full((6, 6), -math.inf), diagonal=1).to(torch.float32)
add_case("softmax_mask", "softmax", [("x", rnd(3, 6, 6), "")],
         lambda x: torch.softmax(x * 0.7 + mask.to(DT), dim=-1), {"scale": 0.7, "mask": [None if math.isinf(v) else v for v in mask.flatten().tolist()],
                                                                   "mask_shape": [6, 6]})

# ---- attention ---------------------------------------------------------------------------------
def ref_attention(q, k, v, causal, window, softcap, scale=None, seg=None, sinks=None):
    # q (B, Tq, Hq, D), k/v (B, Tk, Hkv, D); seg (B, T) int: a query sees keys of its own id only
    B, Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    g = Hq // Hkv
    scale = scale or 1.0 / math.sqrt(D)
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(g, dim=1)
    s = qh @ kh.transpose(-1, -2) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if causal:
        off = Tk - Tq
        t = torch.arange(Tq).view(-1, 1)
        j = torch.arange(Tk).view(1, -1)
        bad = j > t + off
        if window > 0:
            bad = bad | (j <= t + off - window)
        s = s.masked_fill(bad, -math.inf)
    if seg is not None:
        other = seg.view(B, 1, Tq, 1) != seg.view(B, 1, 1, Tk)  # (B, 1, Tq, Tk)
        s = s.masked_fill(other, -math.inf)
    if sinks is not None:  # gpt-oss: one more logit per head, a key whose value is zero
        s = torch.cat([s, sinks.view(1, Hq, 1, 1).expand(B, Hq, Tq, 1)], dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
    return (p @ vh).permute(0, 2, 1, 3).contiguous()


for (nm, B, Tq, Tk, Hq, Hkv, D, causal, window, cap) in [
    ("attn_causal_gqa", 2, 70, 70, 6, 2, 16, True, 0, 0.0),
    ("attn_noncausal", 2, 9, 9, 3, 3, 8, False, 0, 0.0),
    ("attn_window", 1, 75, 75, 4, 2, 8, True, 5, 0.0),
    ("attn_softcap", 1, 12, 12, 2, 1, 8, True, 0, 2.0),
    ("attn_kv_longer", 1, 3, 10, 2, 2, 8, True, 0, 0.0),
]:
    q, k, v = rnd(B, Tq, Hq, D), rnd(B, Tk, Hkv, D), rnd(B, Tk, Hkv, D)
    add_case(nm, "attention", [("q", q, ""), ("k", k, ""), ("v", v, "")],
             lambda q, k, v, c=causal, w=window, sc=cap: ref_attention(q, k, v, c, w, sc),
             {"causal": int(causal), "window": window, "softcap": cap}, tol=2e-5)


# attention sinks (gpt-oss): a learned logit per query head; with a window and
# GQA, a softcap, more keys than queries, and a batch
for (nm, B, Tq, Tk, Hq, Hkv, D, causal, window, cap) in [
    ("attn_sinks_causal_gqa", 2, 70, 70, 6, 2, 16, True, 0, 0.0),
    ("attn_sinks_window", 1, 75, 75, 4, 2, 8, True, 5, 0.0),
    ("attn_sinks_softcap_kv_longer", 2, 3, 10, 2, 1, 8, True, 0, 2.0),
]:
    q, k, v, sk = rnd(B, Tq, Hq, D), rnd(B, Tk, Hkv, D), rnd(B, Tk, Hkv, D), 2 * rnd(Hq)
    add_case(nm, "attention", [("q", q, ""), ("k", k, ""), ("v", v, ""), ("sinks", sk, "")],
             lambda q, k, v, sk, c=causal, w=window, sc=cap: ref_attention(q, k, v, c, w, sc, sinks=sk),
             {"causal": int(causal), "window": window, "softcap": cap}, tol=2e-5)


# segmented (packed) attention: contiguous documents (one crossing the 64-query
# block boundary, one of length 1), non-contiguous ids, a window, a softcap
def seg_runs(lengths):
    return [i for i, n in enumerate(lengths) for _ in range(n)]


for (nm, B, T, Hq, Hkv, D, causal, window, cap, seg) in [
    ("attn_seg_causal_gqa", 2, 70, 4, 2, 8, True, 0, 0.0, [seg_runs([20, 35, 15]), seg_runs([5, 64, 1])]),
    ("attn_seg_noncontiguous", 1, 12, 2, 1, 8, False, 0, 0.0, [[0, 0, 1, 1, 0, 2, 2, 2, 1, 0, 3, 3]]),
    ("attn_seg_causal_noncontiguous", 1, 12, 2, 2, 8, True, 0, 0.0, [[7, 7, -1, 7, 3, 3, -1, 7, 3, 3, 3, 7]]),
    ("attn_seg_window_softcap", 2, 40, 2, 1, 8, True, 6, 2.0, [seg_runs([13, 27]), seg_runs([3, 3, 30, 4])]),
]:
    sg = torch.tensor(seg, dtype=torch.int32)
    q, k, v = rnd(B, T, Hq, D), rnd(B, T, Hkv, D), rnd(B, T, Hkv, D)
    add_case(nm, "attention", [("q", q, ""), ("k", k, ""), ("v", v, "")],
             lambda q, k, v, c=causal, w=window, sc=cap, sg=sg: ref_attention(q, k, v, c, w, sc, seg=sg),
             {"causal": int(causal), "window": window, "softcap": cap}, int_inputs={"seg": sg}, tol=2e-5)


# ---- rope (Hugging Face definitions of the scalings) ----------------------------------------------
def inv_freqs(n_dims, base, scaling, factor=1.0, orig=0, low=1.0, high=4.0, bfast=32.0, bslow=1.0):
    inv = 1.0 / (base ** (torch.arange(0, n_dims, 2, dtype=DT) / n_dims))
    if scaling == 1:
        inv = inv / factor
    elif scaling == 2:  # llama3
        low_wl, high_wl = orig / low, orig / high
        wl = 2 * math.pi / inv
        smooth = (orig / wl - low) / (high - low)
        mid = (1 - smooth) * inv / factor + smooth * inv
        inv = torch.where(wl > low_wl, inv / factor, torch.where(wl < high_wl, inv, mid))
    elif scaling == 3:  # yarn
        def corr(rot):
            return (n_dims * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        lo = max(math.floor(corr(bfast)), 0)
        hi = min(math.ceil(corr(bslow)), n_dims - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(n_dims // 2, dtype=DT) - lo) / (hi - lo)).clamp(0, 1)
        extrap = 1 - ramp
        inv = (inv / factor) * (1 - extrap) + inv * extrap
    return inv


def ref_rope(x, pos, n_dims, neox, inv, mscale):
    # x (B, T, H, D)
    ang = pos.to(DT).view(-1, 1) * inv.view(1, -1)  # (T, n/2)
    c = (torch.cos(ang) * mscale).view(1, -1, 1, n_dims // 2)
    s = (torch.sin(ang) * mscale).view(1, -1, 1, n_dims // 2)
    xr, rest = x[..., :n_dims], x[..., n_dims:]
    if neox:
        a, b = xr[..., : n_dims // 2], xr[..., n_dims // 2:]
        out = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        a, b = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([out, rest], dim=-1)


pos = torch.tensor([0, 1, 2, 5, 9, 17, 40, 300], dtype=torch.int32)
for (nm, mode, n_dims, scaling, extra) in [
    ("rope_neox", 2, 16, 0, {}),
    ("rope_normal", 0, 16, 0, {}),
    ("rope_partial", 2, 8, 0, {}),
    ("rope_linear", 2, 16, 1, {"factor": 4.0}),
    ("rope_llama3", 2, 16, 2, {"factor": 8.0, "orig_ctx": 64, "low": 1.0, "high": 4.0}),
    ("rope_yarn", 2, 16, 3, {"factor": 4.0, "orig_ctx": 64, "beta_fast": 32.0, "beta_slow": 1.0}),
]:
    base = 10000.0
    inv = inv_freqs(n_dims, base, scaling, extra.get("factor", 1.0), extra.get("orig_ctx", 0),
                    extra.get("low", 1.0), extra.get("high", 4.0), extra.get("beta_fast", 32.0),
                    extra.get("beta_slow", 1.0))
    mscale = 0.1 * math.log(extra["factor"]) + 1.0 if scaling == 3 else 1.0
    x = rnd(2, 8, 3, 16)
    params = {"mode": mode, "n_dims": n_dims, "base": base, "scaling": scaling}
    params.update(extra)
    add_case(nm, "rope", [("x", x, "")],
             lambda x, nd=n_dims, neox=(mode == 2), inv=inv, ms=mscale: ref_rope(x, pos, nd, neox, inv, ms),
             params, int_inputs={"pos": pos})

# ---- cross-entropy ----------------------------------------------------------------------------------
tg = torch.tensor([3, 0, -100, 7, 49, 2, 2, -100, 11], dtype=torch.int32)
add_case("cross_entropy", "cross_entropy", [("logits", rnd(9, 50) * 3, "")],
         lambda lg: torch.nn.functional.cross_entropy(lg, tg.long(), ignore_index=-100).reshape(1),
         {"ignore": -100}, int_inputs={"targets": tg})

# ---- mixture of experts: the router's top k (its ids constants), the experts' products ---------------------
def ref_route(x, wr, k, norm, sigmoid):
    lg = x @ wr.T
    s = torch.sigmoid(lg) if sigmoid else torch.softmax(lg, -1)
    top = torch.topk(s.detach(), k, dim=-1).indices  # largest first, as toy's slots
    w = s.gather(-1, top)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    return top, w


def ref_moe(x, wr, wg, wu, wd, k, norm, sigmoid):
    top, w = ref_route(x, wr, k, norm, sigmoid)
    rows = []
    for t in range(x.shape[0]):
        acc = 0
        for s in range(k):
            e = int(top[t, s])
            h = torch.nn.functional.silu(wg[e] @ x[t]) * (wu[e] @ x[t])
            acc = acc + w[t, s] * (wd[e] @ h)
        rows.append(acc)
    return torch.stack(rows)


def ref_moe_linear(x, wr, w3, k, norm, sigmoid):
    top, w = ref_route(x, wr, k, norm, sigmoid)
    return torch.stack([sum(w[t, s] * (w3[int(top[t, s])] @ x[t]) for s in range(k)) for t in range(x.shape[0])])


for nm, E, k, norm, sig in [("moe_softmax", 4, 2, False, False), ("moe_softmax_norm", 5, 2, True, False),
                            ("moe_sigmoid_norm", 6, 3, True, True), ("moe_sigmoid", 4, 2, False, True),
                            ("moe_top1", 3, 1, False, False)]:
    N, d, f = 7, 8, 12
    add_case(nm, "moe_ffn", [("x", rnd(N, d), ""), ("router", rnd(E, d), ""), ("gate", rnd(E, f, d) * 0.5, ""),
                             ("up", rnd(E, f, d) * 0.5, ""), ("down", rnd(E, d, f) * 0.5, "")],
             lambda x, wr, wg, wu, wd, k=k, norm=norm, sig=sig: ref_moe(x, wr, wg, wu, wd, k, norm, sig),
             {"k": k, "norm": int(norm), "sigmoid": int(sig)})
add_case("moe_linear_combined", "moe_linear", [("x", rnd(6, 10), ""), ("router", rnd(3, 10), ""),
                                               ("w", rnd(3, 9, 10), "")],
         lambda x, wr, w3: ref_moe_linear(x, wr, w3, 2, False, False), {"k": 2, "norm": 0, "sigmoid": 0})

# ---- gpt-oss's clamped SwiGLU (ggml's swiglu_oai), as gpt-oss's reference writes it ----
OAI_ALPHA = torch.tensor(1.702, dtype=torch.float32).item()  # the float32 toy gets


def swiglu_oai(g, u, alpha=OAI_ALPHA, limit=7.0):
    if limit > 0:
        g = g.clamp(min=None, max=limit)
        u = u.clamp(min=-limit, max=limit)
    return g * torch.sigmoid(alpha * g) * (u + 1)


def off_kinks(x, limit=7.0):
    """x moved at least 0.5 away from +-limit: the finite differences (h up to
    0.1 at |x| = 10) must not straddle a clamp"""
    near = (x.abs() - limit).abs() < 0.5
    return torch.where(near, x * 0.8, x)


def oai_inputs(n, seed_vals):
    """n values, |x| up to ~10, with seed_vals at every third position: the
    finite-difference test checks every (n // 7)-th element, so these land
    on both sides of both clamps"""
    x = off_kinks(rnd(n) * 5)
    x[::3] = torch.tensor(seed_vals, dtype=torch.float32)[: len(x[::3])]
    return x


# 8 x 3 = 24 elements: the finite differences check elements 0, 3, .., 21
G = oai_inputs(24, [-9.5, 8.5, -3.0, 9.8, 1.2, 7.9, -0.5, 10.0]).reshape(3, 8)
U = oai_inputs(24, [8.2, -9.1, 2.5, -7.6, 9.9, -1.5, 7.8, -8.8]).reshape(3, 8)
add_case("swiglu_oai", "swiglu_oai", [("g", G, ""), ("u", U, "")], swiglu_oai,
         {"alpha": OAI_ALPHA, "limit": 7.0})
add_case("swiglu_oai_wide", "swiglu_oai",
         [("g", off_kinks(rnd(5, 70) * 4), ""), ("u", off_kinks(rnd(5, 70) * 4), "")],
         swiglu_oai, {"alpha": OAI_ALPHA, "limit": 7.0})
add_case("swiglu_oai_transposed", "swiglu_oai",
         [("g", off_kinks(rnd(6, 9) * 5), "T"), ("u", off_kinks(rnd(6, 9) * 5), "T")],
         swiglu_oai, {"alpha": OAI_ALPHA, "limit": 7.0})
# gpt-oss's layout: gate and up interleaved in one row (x[..., ::2], x[..., 1::2]): views with
# a stride of two floats. The rows have one float more, unused: toy_view's bounds check
# counts a strided row's last element as nb[0] bytes (ctx.c's toy_nbytes), which the up
# view (offset 4) would pass by 4 bytes.
add_case("swiglu_oai_interleaved", "swiglu_oai_interleaved", [("x", off_kinks(rnd(4, 2 * 11 + 1) * 5), "")],
         lambda x: swiglu_oai(x[..., 0:22:2], x[..., 1:22:2]), {"alpha": OAI_ALPHA, "limit": 7.0})
# limit 0: no clamping; another alpha
add_case("swiglu_oai_noclamp", "swiglu_oai", [("g", rnd(4, 33) * 5, ""), ("u", rnd(4, 33) * 5, "")],
         lambda g, u: swiglu_oai(g, u, 0.9, 0.0), {"alpha": 0.9, "limit": 0.0})
# on the clamps themselves (gate = 7, up = +-7: PyTorch's clamp passes the
# gradient there) and just past them; no finite differences across the kinks
K = torch.tensor([7.0, -7.0, 7.0, 6.999, 7.001, -7.001, -6.999, 0.0, 7.0, -7.0, 12.0, -12.0])
add_case("swiglu_oai_on_the_clamps", "swiglu_oai", [("g", torch.stack([K, K.flip(0)]), ""),
                                                    ("u", torch.stack([K.roll(1), K.flip(0).roll(2)]), "")],
         swiglu_oai, {"alpha": OAI_ALPHA, "limit": 7.0, "no_fd": 1})

# ---- dtype conversions: torch's float16 / bfloat16 rounding, bit for bit ----------------
vals = [0.0, -0.0, 1.0, -1.5, 65504.0, 65519.0, 65520.0, 1e6, -1e6, 6.1e-5, 6.0e-8, 5.96e-8, 2.98e-8, 2.99e-8,
        1e-10, 3.14159265, 1.0009765625, 1.00048828125, 1.000732421875, 1.0 + 2 ** -8, 1.0 + 2 ** -9,
        1.0 + 3 * 2 ** -9, 3.0e38, -3.4e38]
vals += torch.randn(2000).mul(torch.exp(torch.randn(2000) * 8)).tolist()
v32 = torch.tensor(vals, dtype=torch.float32)
conversions = {
    "f32": v32.tolist(),
    "f16_bits": v32.half().view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist(),
    "bf16_bits": v32.bfloat16().view(torch.int16).to(torch.int32).bitwise_and(0xFFFF).tolist(),
}

out = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, "ops.json"), "w") as f:
    json.dump({"torch": torch.__version__, "cases": cases, "conversions": conversions}, f, allow_nan=False)
print(f"gen_op_refs: {len(cases)} cases -> {os.path.join(out, 'ops.json')}")
