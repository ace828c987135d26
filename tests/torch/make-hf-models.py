#!/usr/bin/python3
"""make-hf-models.py OUT: small random Hugging Face-style model folders for
tests/test-hf-import.c, one per architecture toy convert supports, with
real config.json layouts and safetensors files written by hand (8-byte
little-endian header length, JSON header padded with spaces, raw data), and
for each an expected.safetensors holding what llama.cpp's
convert_hf_to_gguf.py would store: GGUF tensor names, float32 values after
its transforms (q/k row permutation for Llama, Conv1D transpose and tied
output for GPT-2, 1 + w for Gemma 2 norms, rope_freqs for Llama-3 rope
scaling, Phi-3's fused projections as they are and its LongRoPE tables as
rope_factors_long / rope_factors_short). For the Llama family it also writes logits.json: the logits of
a fixed token sequence computed in float64 the Hugging Face way (rotate-half
RoPE on the unpermuted weights, HF's Llama-3 inv_freq scaling, Gemma 2's
normalizer, soft-capping and sandwich norms), so a converted model run by
toy's engine can be checked end to end. Exits 77 when torch is missing (the
test then skips).
"""
import json
import math
import os
import shutil
import struct
import sys

try:
    import torch
except ImportError:
    sys.exit(77)

DT = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


def save_safetensors(path, tensors, metadata=None):
    header = {}
    blobs = []
    off = 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[name] = {"dtype": DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def permute(w, n_head, n_head_kv):
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def rnd(*shape):
    return torch.randn(*shape, dtype=torch.float32) * 0.05


TOKENS = [3, 17, 5, 100, 42, 7, 250, 11, 64]
# past a Phi-3's original_max_position_embeddings (16): its LongRoPE takes long_factor
LONG_TOKENS = TOKENS + [200, 31, 9, 77, 150, 2, 300, 45, 8, 123, 60, 19, 280, 33, 91]


MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")


def hf_moe(arch, cfg, g, p, w, x):
    """The sparse MoE blocks of modeling_{mixtral,qwen2_moe,qwen3_moe,olmoe}.py:
    softmax over the router's logits, top k, renormalised where
    norm_topk_prob (Mixtral always), each expert's SwiGLU on its tokens,
    and Qwen2-MoE's shared expert gated by a sigmoid."""
    mix = arch == "mixtral"
    n = cfg["num_local_experts" if mix else "num_experts"]
    pre = p + ("block_sparse_moe." if mix else "mlp.")
    probs = torch.softmax(x @ g(pre + "gate.weight").T, -1)
    wts, ids = torch.topk(probs, cfg["num_experts_per_tok"], -1)
    if mix or cfg.get("norm_topk_prob"):
        wts = wts / wts.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    names = ("w1", "w3", "w2") if mix else ("gate_proj", "up_proj", "down_proj")
    for e in range(n):
        sel = (ids == e)
        if not sel.any():
            continue
        we = lambda nm: g(f"{pre}experts.{e}.{nm}.weight")
        y = (torch.nn.functional.silu(x @ we(names[0]).T) * (x @ we(names[1]).T)) @ we(names[2]).T
        out = out + y * (wts * sel).sum(-1, keepdim=True)
    if arch == "qwen2_moe":
        sh = lambda nm: g(f"{pre}shared_expert.{nm}.weight")
        y = (torch.nn.functional.silu(x @ sh("gate_proj").T) * (x @ sh("up_proj").T)) @ sh("down_proj").T
        out = out + torch.sigmoid(x @ g(pre + "shared_expert_gate.weight").T) * y
    return out


def hf_forward(arch, cfg, w, tokens):
    """The Hugging Face modeling_{llama,qwen2,qwen3,gemma2,gemma3}.py forward
    pass, float64, from the HF-named tensors w. Gemma 3: per-head QK-norm,
    sliding layers (layer_types) masked to their last sliding_window keys and
    rotated with rope_local_base_freq, unscaled; the global layers take
    rope_theta and rope_scaling. Phi-3 (modeling_phi3.py): q, k and v from
    one qkv_proj, gate and up from one gate_up_proj; rotate_half on the first
    int(head_dim * partial_rotary_factor) dims of each head, the rest passed
    through; LongRoPE (modeling_rope_utils' longrope): inv_freq divided by
    long_factor when the forward spans more than
    original_max_position_embeddings positions, by short_factor otherwise,
    cos and sin times attention_factor; a sliding window when
    sliding_window is set."""
    D = torch.float64
    g = lambda n: w[n].to(D)
    E, L, H, KV = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", E // H)
    eps = cfg["rms_norm_eps"]
    gemma = arch in ("gemma2", "gemma3_text")
    gemma3 = arch == "gemma3_text"
    phi3 = arch == "phi3"
    olmo3 = arch == "olmo3"

    def rms(x, wt):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return x * (1 + wt) if gemma else x * wt

    T = len(tokens)
    base = cfg.get("rope_theta", 10000.0)
    rd = int(hd * cfg.get("partial_rotary_factor", 1.0)) if phi3 else hd  # the rotated dims of each head
    inv_freq = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=D) / rd))
    rs = cfg.get("rope_scaling")
    mscale = 1.0  # LongRoPE's scale on cos and sin
    if rs and rs.get("rope_type", rs.get("type")) in ("longrope", "su"):  # _compute_longrope_parameters
        orig = cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"])
        ext = torch.tensor(rs["long_factor"] if T > orig else rs["short_factor"], dtype=D)
        inv_freq = 1.0 / (ext * base ** (torch.arange(0, rd, 2, dtype=D) / rd))
        s = cfg["max_position_embeddings"] / orig
        mscale = rs.get("attention_factor")
        if mscale is None:
            mscale = math.sqrt(1 + math.log(s) / math.log(orig)) if s > 1 else 1.0
    if rs and rs.get("rope_type") == "llama3":  # transformers' _compute_llama3_parameters
        fac, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / lo, inv_freq / fac, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / fac + smooth * scaled
        medium = ~(wavelen < old / hi) & ~(wavelen > old / lo)
        inv_freq = torch.where(medium, smoothed, scaled)
    if rs and rs.get("rope_type") == "linear":
        inv_freq = inv_freq / rs["factor"]
    if rs and rs.get("rope_type", rs.get("type")) == "yarn":  # _compute_yarn_parameters (truncated bounds)
        fac, old = rs["factor"], rs["original_max_position_embeddings"]
        corr = lambda rot: (rd * math.log(old / (rot * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(rs.get("beta_fast", 32))), 0), min(math.ceil(corr(rs.get("beta_slow", 1))), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=D) - lo) / ((hi + 0.001 if lo == hi else hi) - lo)).clamp(0, 1)
        inv_freq = (inv_freq / fac) * ramp + inv_freq * (1 - ramp)
        mscale = rs.get("attention_factor") or (0.1 * math.log(fac) + 1.0)
    # the sliding layers' rotation: Gemma 3's own base; OLMo 3's the global one, both without the scaling
    local_base = base if olmo3 else cfg.get("rope_local_base_freq", 10000.0)
    local_inv = 1.0 / (local_base ** (torch.arange(0, hd, 2, dtype=D) / hd))

    def rope(x, inv, ms=None):  # x: (T, heads, hd), rotate_half over the first 2 len(inv) dims, the others as they are
        ms = mscale if ms is None else ms
        ang = torch.arange(T, dtype=D)[:, None] * inv[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :] * ms
        sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :] * ms
        r = 2 * inv.shape[0]
        xr, xp = x[..., :r], x[..., r:]
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)
    h = g("model.embed_tokens.weight")[tokens]
    if gemma:
        h = h * torch.tensor(E ** 0.5, dtype=torch.float32).to(D)
    mask = torch.full((T, T), float("-inf"), dtype=D).triu(1)
    scale = cfg.get("query_pre_attn_scalar", hd) ** -0.5 if gemma else hd ** -0.5
    granite = arch == "granite"  # modeling_granite.py's multipliers (GraniteConfig's defaults are 1)
    rmul = cfg.get("residual_multiplier", 1.0) if granite else 1.0
    if granite:
        h = h * cfg.get("embedding_multiplier", 1.0)
        scale = cfg.get("attention_multiplier", 1.0)
    for i in range(L):
        p = f"model.layers.{i}."
        sliding = (gemma3 or olmo3) and cfg["layer_types"][i] == "sliding_attention"
        lmask = mask
        if sliding or (phi3 and cfg.get("sliding_window")):  # key j is seen from position t when t - j < sliding_window
            far = torch.arange(T)[:, None] - torch.arange(T)[None, :] >= cfg["sliding_window"]
            lmask = mask.masked_fill(far, float("-inf"))
        olmo2 = arch in ("olmo2", "olmo3")  # no norm before attention or the MLP: one after each
        x = h if olmo2 else rms(h, g(p + "input_layernorm.weight"))
        lin = lambda n, x: x @ g(p + n + ".weight").T + (g(p + n + ".bias") if p + n + ".bias" in w else 0)
        if phi3:  # qkv_proj's rows: the queries', the keys', the values'
            q, k, v = lin("self_attn.qkv_proj", x).split([H * hd, KV * hd, KV * hd], -1)
        else:
            q, k, v = lin("self_attn.q_proj", x), lin("self_attn.k_proj", x), lin("self_attn.v_proj", x)
        if arch in ("olmoe", "olmo2", "olmo3"):  # q_norm / k_norm over the whole projections
            q, k = rms(q, g(p + "self_attn.q_norm.weight")), rms(k, g(p + "self_attn.k_norm.weight"))
        q, k, v = q.reshape(T, H, hd), k.reshape(T, KV, hd), v.reshape(T, KV, hd)
        if arch in ("qwen3", "qwen3_moe", "gemma3_text"):
            q = rms(q, g(p + "self_attn.q_norm.weight"))
            k = rms(k, g(p + "self_attn.k_norm.weight"))
        inv, ms = (local_inv, 1.0) if sliding else (inv_freq, None)
        if cfg.get("no_rope_layers", [1] * L)[i]:  # SmolLM3: 0 leaves the layer unrotated
            q, k = rope(q, inv, ms), rope(k, inv, ms)
        outs = []
        for hh in range(H):
            kv = hh // (H // KV)
            s_ = (q[:, hh] @ k[:, kv].T) * scale
            if gemma and cfg.get("attn_logit_softcapping"):
                c = cfg["attn_logit_softcapping"]
                s_ = torch.tanh(s_ / c) * c
            outs.append(torch.softmax(s_ + lmask, -1) @ v[:, kv])
        o = torch.cat(outs, -1) @ g(p + "self_attn.o_proj.weight").T
        if olmo2:
            h = h + rms(o, g(p + "post_attention_layernorm.weight"))
            act = torch.nn.functional.silu(h @ g(p + "mlp.gate_proj.weight").T)
            f = (act * (h @ g(p + "mlp.up_proj.weight").T)) @ g(p + "mlp.down_proj.weight").T
            h = h + rms(f, g(p + "post_feedforward_layernorm.weight"))
        elif gemma:
            o = rms(o, g(p + "post_attention_layernorm.weight"))
            h = h + o
            x = rms(h, g(p + "pre_feedforward_layernorm.weight"))
            act = torch.nn.functional.gelu(x @ g(p + "mlp.gate_proj.weight").T, approximate="tanh")
            f = (act * (x @ g(p + "mlp.up_proj.weight").T)) @ g(p + "mlp.down_proj.weight").T
            h = h + rms(f, g(p + "post_feedforward_layernorm.weight"))
        elif arch in MOE:
            h = h + o
            h = h + hf_moe(arch, cfg, g, p, w, rms(h, g(p + "post_attention_layernorm.weight")))
        else:
            h = h + o * rmul
            x = rms(h, g(p + "post_attention_layernorm.weight"))
            if phi3:  # gate_up_proj's rows: the gate's, then up's
                gate, up = (x @ g(p + "mlp.gate_up_proj.weight").T).chunk(2, -1)
            else:
                gate, up = x @ g(p + "mlp.gate_proj.weight").T, x @ g(p + "mlp.up_proj.weight").T
            act = torch.nn.functional.silu(gate)
            h = h + (act * up) @ g(p + "mlp.down_proj.weight").T * rmul
    h = rms(h, g("model.norm.weight"))
    head = g("lm_head.weight") if "lm_head.weight" in w else g("model.embed_tokens.weight")
    logits = h @ head.T
    if granite:
        logits = logits / cfg.get("logits_scaling", 1.0)
    if gemma and cfg.get("final_logit_softcapping"):
        c = cfg["final_logit_softcapping"]
        logits = torch.tanh(logits / c) * c
    return logits  # (T, V)


# Gemma3TextConfig's defaults (transformers' configuration_gemma3.py), which a multimodal gemma3 config.json's
# text_config leaves out
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
                        "query_pre_attn_scalar": 256, "sliding_window": 4096, "rope_local_base_freq": 10000.0,
                        "tie_word_embeddings": True}


def gemma3_multimodal(cfg, hf, spelling, dtype):
    """Gemma 3 with its vision tower, as its HF folders hold it: config.json's text_config without the keys at
    their defaults (the sliding pattern too, when it is the default 5 of 6), the text model's tensors under
    language_model ("old": language_model.model.*, as the released checkpoints; "new": model.language_model.*, as
    newer transformers saves), and a vision tower and projector the conversion leaves out. Returns the config and
    the tensors."""
    text = {k: v for k, v in cfg.items() if GEMMA3_TEXT_DEFAULTS.get(k, object()) != v and k != "architectures"}
    if text.get("layer_types") == [("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                                   for i in range(cfg["num_hidden_layers"])]:
        del text["layer_types"]
    text["model_type"] = "gemma3_text"
    pre = "language_model.model." if spelling == "old" else "model.language_model."
    out = {}
    for n, t in hf.items():
        if n.startswith("model."):
            out[pre + n[6:]] = t
        else:  # lm_head
            out[("language_model." if spelling == "old" else "") + n] = t
    vt = "vision_tower." if spelling == "old" else "model.vision_tower."
    mp = "multi_modal_projector." if spelling == "old" else "model.multi_modal_projector."
    out[vt + "vision_model.embeddings.patch_embedding.weight"] = rnd(8, 3, 4, 4).to(dtype)
    out[vt + "vision_model.post_layernorm.weight"] = rnd(8).to(dtype)
    out[mp + "mm_input_projection_weight"] = rnd(8, cfg["hidden_size"]).to(dtype)
    out[mp + "mm_soft_emb_norm.weight"] = rnd(8).to(dtype)
    top = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "text_config": text,
           "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8, "num_hidden_layers": 1},
           "mm_tokens_per_image": 256, "boi_token_index": 255999, "eoi_token_index": 256000,
           "image_token_index": 262144}
    return top, out


def llama_like(out, name, arch, cfg, dtype, shards, tokenizer=None, rope_scaling=None, tokens=TOKENS, multimodal=None):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    E, L, H, KV = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", E // H)
    F_, V = cfg["intermediate_size"], cfg["vocab_size"]
    hf = {}
    exp = {}
    gemma = arch in ("gemma2", "gemma3_text")

    def add(hn, gn, t, transform=None):
        t = t.to(dtype)
        hf[hn] = t
        v = t.to(torch.float32)
        exp[gn] = transform(v) if transform else v

    norm = (lambda v: v + 1) if gemma else None
    add("model.embed_tokens.weight", "token_embd.weight", rnd(V, E))
    for i in range(L):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        if arch not in ("olmo2", "olmo3"):
            add(p + "input_layernorm.weight", g + "attn_norm.weight", 1 + rnd(E), norm)
        qt = (lambda v: permute(v, H, H)) if arch in ("llama", "mixtral", "smollm3", "granite") else None
        kt = (lambda v: permute(v, H, KV)) if arch in ("llama", "mixtral", "smollm3", "granite") else None
        if arch == "phi3":  # q, k and v rows in one tensor, which llama.cpp keeps as it is (NEOX rotation: no permute)
            add(p + "self_attn.qkv_proj.weight", g + "attn_qkv.weight", rnd((H + 2 * KV) * hd, E))
        else:
            add(p + "self_attn.q_proj.weight", g + "attn_q.weight", rnd(H * hd, E), qt)
            add(p + "self_attn.k_proj.weight", g + "attn_k.weight", rnd(KV * hd, E), kt)
            add(p + "self_attn.v_proj.weight", g + "attn_v.weight", rnd(KV * hd, E))
        add(p + "self_attn.o_proj.weight", g + "attn_output.weight", rnd(E, H * hd))
        if arch in ("qwen2", "qwen2_moe") or cfg.get("attention_bias"):  # a Llama's q/k biases move with their rows
            add(p + "self_attn.q_proj.bias", g + "attn_q.bias", rnd(H * hd), qt)
            add(p + "self_attn.k_proj.bias", g + "attn_k.bias", rnd(KV * hd), kt)
            add(p + "self_attn.v_proj.bias", g + "attn_v.bias", rnd(KV * hd))
        if arch in ("qwen3", "qwen3_moe"):
            add(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", 1 + rnd(hd))
            add(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", 1 + rnd(hd))
        if arch == "gemma3_text":  # stored as w, run as 1 + w: GGUF holds 1 + w
            add(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", rnd(hd), norm)
            add(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", rnd(hd), norm)
        if arch in ("olmoe", "olmo2", "olmo3"):  # over the whole projections
            add(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", 1 + rnd(H * hd))
            add(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", 1 + rnd(KV * hd))
        if arch in ("olmo2", "olmo3"):
            add(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight", 1 + rnd(E))
            add(p + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", 1 + rnd(E))
        elif gemma:
            add(p + "post_attention_layernorm.weight", g + "post_attention_norm.weight", rnd(E), norm)
            add(p + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", rnd(E), norm)
            add(p + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", rnd(E), norm)
        else:
            add(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", 1 + rnd(E))
        if arch in MOE:  # the experts' matrices one by one; llama.cpp's GGUF stacks them
            mix = arch == "mixtral"
            n = cfg["num_local_experts" if mix else "num_experts"]
            fe = cfg.get("moe_intermediate_size", F_)
            pre = p + ("block_sparse_moe." if mix else "mlp.")
            add(pre + "gate.weight", g + "ffn_gate_inp.weight", rnd(n, E) * 20)  # a router that decides
            stacks = {"ffn_gate_exps": [], "ffn_up_exps": [], "ffn_down_exps": []}
            names = (("w1", "ffn_gate_exps", (fe, E)), ("w3", "ffn_up_exps", (fe, E)), ("w2", "ffn_down_exps", (E, fe)))
            for e in range(n):
                for (mn, gn, shape), hn in zip(names, ("gate_proj", "up_proj", "down_proj")):
                    t = rnd(*shape).to(dtype)
                    hf[f"{pre}experts.{e}.{mn if mix else hn}.weight"] = t
                    stacks[gn].append(t.to(torch.float32))
            for gn, ts in stacks.items():
                exp[g + gn + ".weight"] = torch.stack(ts)
            if arch == "qwen2_moe":
                fs = cfg["shared_expert_intermediate_size"]
                add(pre + "shared_expert.gate_proj.weight", g + "ffn_gate_shexp.weight", rnd(fs, E))
                add(pre + "shared_expert.up_proj.weight", g + "ffn_up_shexp.weight", rnd(fs, E))
                add(pre + "shared_expert.down_proj.weight", g + "ffn_down_shexp.weight", rnd(E, fs))
                add(pre + "shared_expert_gate.weight", g + "ffn_gate_inp_shexp.weight", rnd(1, E) * 20,
                    lambda v: v.reshape(-1))
        elif arch == "phi3":  # gate rows, then up rows, in one tensor: llama.cpp's ffn_up, as it is
            add(p + "mlp.gate_up_proj.weight", g + "ffn_up.weight", rnd(2 * F_, E))
            add(p + "mlp.down_proj.weight", g + "ffn_down.weight", rnd(E, F_))
        else:
            add(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", rnd(F_, E))
            add(p + "mlp.up_proj.weight", g + "ffn_up.weight", rnd(F_, E))
            add(p + "mlp.down_proj.weight", g + "ffn_down.weight", rnd(E, F_))
    add("model.norm.weight", "output_norm.weight", 1 + rnd(E), norm)
    if not cfg.get("tie_word_embeddings", False):
        add("lm_head.weight", "output.weight", rnd(V, E))
    hf["model.rotary_emb.inv_freq"] = torch.zeros(hd // 2, dtype=dtype)  # a buffer: skipped
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
        base = cfg.get("rope_theta", 10000.0)
        fac, lo, hi = rope_scaling["factor"], rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
        old = rope_scaling["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        fs = []
        for f in freqs.tolist():
            wl = 2 * math.pi / f
            if wl < old / hi:
                fs.append(1.0)
            elif wl > old / lo:
                fs.append(fac)
            else:
                s = (old / wl - lo) / (hi - lo)
                fs.append(1 / ((1 - s) / fac + s))
        exp["rope_freqs.weight"] = torch.tensor(fs, dtype=torch.float32)
    lr = cfg.get("rope_scaling") if arch == "phi3" else None
    if lr and lr.get("type") in ("longrope", "su"):  # llama.cpp's Phi3MiniModel: the two tables as they are, in f32
        exp["rope_factors_long.weight"] = torch.tensor(lr["long_factor"], dtype=torch.float32)
        exp["rope_factors_short.weight"] = torch.tensor(lr["short_factor"], dtype=torch.float32)
    cfg["model_type"] = "mistral" if name == "mistral" else arch
    cfg["architectures"] = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                             "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                             "smollm3": "SmolLM3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
                             "olmo3": "Olmo3ForCausalLM",
                             "granite": "GraniteForCausalLM", "phi3": "Phi3ForCausalLM",
                             "mixtral": "MixtralForCausalLM",
                             "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                             "olmoe": "OlmoeForCausalLM"}[arch]]
    cfg["torch_dtype"] = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}[dtype]
    w32 = {n: t.to(torch.float32) for n, t in hf.items()}
    file_cfg = cfg
    if multimodal:
        file_cfg, hf = gemma3_multimodal(cfg, hf, multimodal, dtype)
        file_cfg["torch_dtype"] = cfg["torch_dtype"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(file_cfg, f, indent=2)
    names = list(hf)
    if shards == 1:
        save_safetensors(os.path.join(d, "model.safetensors"), hf, {"format": "pt"})
    else:
        per = (len(names) + shards - 1) // shards
        wmap = {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: hf[n] for n in names[s * per:(s + 1) * per]}
            save_safetensors(os.path.join(d, fn), part, {"format": "pt"})
            for n in part:
                wmap[n] = fn
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f, indent=2)
    if tokenizer:
        shutil.copy(tokenizer, os.path.join(d, "tokenizer.json"))
    save_safetensors(os.path.join(d, "expected.safetensors"), exp)
    logits = hf_forward(arch, cfg, w32, tokens)
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"tokens": tokens, "logits": logits.flatten().tolist()}, f)


def deepseek_forward(cfg, w, tokens):
    """modeling_deepseek.py's DeepseekV2/V3 forward, float64: latent attention
    (queries through q_proj or the q_a / q_b latent; keys and values
    up-projected per head from the normed kv latent by kv_b_proj), RoPE on
    the interleaved rope part as HF applies it (de-interleaved, then
    rotate_half), YaRN with its mscale, and the MoE gate: softmax (V2) or
    sigmoid scores with e_score_correction_bias to choose (V3), weights
    renormalised when norm_topk_prob and scaled by routed_scaling_factor,
    shared experts added; the first first_k_dense_replace layers dense."""
    D = torch.float64
    g = lambda n: w[n].to(D)
    E, L, H = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]
    r, dr, dn, dv = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    eps, T = cfg["rms_norm_eps"], len(tokens)

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wt

    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, dr, 2, dtype=D) / dr))
    scale, mag = (dn + dr) ** -0.5, 1.0
    rs = cfg.get("rope_scaling")
    if rs:  # DeepseekV2YarnRotaryEmbedding
        f, orig, bf, bs = rs["factor"], rs["original_max_position_embeddings"], rs.get("beta_fast", 32), rs.get("beta_slow", 1)
        corr = lambda rot: (dr * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))
        lo, hi = max(math.floor(corr(bf)), 0), min(math.ceil(corr(bs)), dr - 1)
        hi = hi + 0.001 if lo == hi else hi
        mask = 1.0 - ((torch.arange(dr // 2, dtype=D) - lo) / (hi - lo)).clamp(0, 1)
        inv = (inv / f) * (1 - mask) + inv * mask
        gm = lambda m: 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0
        mag = gm(rs.get("mscale", 1)) / gm(rs.get("mscale_all_dim", 0))
        if rs.get("mscale_all_dim"):
            scale *= gm(rs["mscale_all_dim"]) ** 2
    ang = torch.arange(T, dtype=D)[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :] * mag
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :] * mag

    def rope(x):  # (T, heads, dr), interleaved pairs
        x = x.reshape(T, x.shape[1], dr // 2, 2).transpose(-1, -2).reshape(T, x.shape[1], dr)
        x1, x2 = x[..., : dr // 2], x[..., dr // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def mlp(x, pre):
        return (torch.nn.functional.silu(x @ g(pre + "gate_proj.weight").T) * (x @ g(pre + "up_proj.weight").T)) \
            @ g(pre + "down_proj.weight").T

    h = g("model.embed_tokens.weight")[tokens]
    mask_ = torch.full((T, T), float("-inf"), dtype=D).triu(1)
    for i in range(L):
        p = f"model.layers.{i}."
        x = rms(h, g(p + "input_layernorm.weight"))
        if cfg.get("q_lora_rank"):
            q = rms(x @ g(p + "self_attn.q_a_proj.weight").T, g(p + "self_attn.q_a_layernorm.weight")) \
                @ g(p + "self_attn.q_b_proj.weight").T
        else:
            q = x @ g(p + "self_attn.q_proj.weight").T
        q = q.view(T, H, dn + dr)
        ckv = x @ g(p + "self_attn.kv_a_proj_with_mqa.weight").T
        lat, k_pe = rms(ckv[:, :r], g(p + "self_attn.kv_a_layernorm.weight")), ckv[:, r:].view(T, 1, dr)
        kv = (lat @ g(p + "self_attn.kv_b_proj.weight").T).view(T, H, dn + dv)
        k = torch.cat([kv[..., :dn], rope(k_pe).expand(T, H, dr)], -1)
        q = torch.cat([q[..., :dn], rope(q[..., dn:])], -1)
        outs = [torch.softmax((q[:, hh] @ k[:, hh].T) * scale + mask_, -1) @ kv[:, hh, dn:] for hh in range(H)]
        h = h + torch.cat(outs, -1) @ g(p + "self_attn.o_proj.weight").T
        x = rms(h, g(p + "post_attention_layernorm.weight"))
        if i < cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
            h = h + mlp(x, p + "mlp.")
            continue
        logits = x @ g(p + "mlp.gate.weight").T
        sig = cfg.get("scoring_func") == "sigmoid"
        scores = torch.sigmoid(logits) if sig else torch.softmax(logits, -1)
        choice = scores + g(p + "mlp.gate.e_score_correction_bias") if sig else scores
        _, ids = torch.topk(choice, cfg["num_experts_per_tok"], -1)
        wts = scores.gather(-1, ids)
        if cfg.get("norm_topk_prob"):
            wts = wts / (wts.sum(-1, keepdim=True) + 1e-20)
        wts = wts * cfg.get("routed_scaling_factor", 1.0)
        out = torch.zeros_like(x)
        for e in range(cfg["n_routed_experts"]):
            sel = ids == e
            if sel.any():
                out = out + mlp(x, f"{p}mlp.experts.{e}.") * (wts * sel).sum(-1, keepdim=True)
        if cfg.get("n_shared_experts"):
            out = out + mlp(x, p + "mlp.shared_experts.")
        h = h + out
    h = rms(h, g("model.norm.weight"))
    return h @ g("lm_head.weight").T


def deepseek(out, name, cfg, dtype):
    """A DeepSeek-V2/V3 folder; expected.safetensors as llama.cpp's converter
    (DeepseekV2Model) stores it: kv_b_proj split into attn_k_b (each head's
    key rows, transposed) and attn_v_b, the routing bias as exp_probs_b."""
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    E, L, H, V, F_ = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["vocab_size"], \
        cfg["intermediate_size"]
    r, dr, dn, dv = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    hf, exp = {}, {}

    def add(hn, gn, t):
        t = t.to(dtype)
        hf[hn] = t
        if gn:
            exp[gn] = t.to(torch.float32)

    add("model.embed_tokens.weight", "token_embd.weight", rnd(V, E))
    for i in range(L):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        add(p + "input_layernorm.weight", g + "attn_norm.weight", 1 + rnd(E))
        if cfg.get("q_lora_rank"):
            ql = cfg["q_lora_rank"]
            add(p + "self_attn.q_a_proj.weight", g + "attn_q_a.weight", rnd(ql, E) * 4)
            add(p + "self_attn.q_a_layernorm.weight", g + "attn_q_a_norm.weight", 1 + rnd(ql))
            add(p + "self_attn.q_b_proj.weight", g + "attn_q_b.weight", rnd(H * (dn + dr), ql) * 4)
        else:
            add(p + "self_attn.q_proj.weight", g + "attn_q.weight", rnd(H * (dn + dr), E) * 4)
        add(p + "self_attn.kv_a_proj_with_mqa.weight", g + "attn_kv_a_mqa.weight", rnd(r + dr, E) * 4)
        add(p + "self_attn.kv_a_layernorm.weight", g + "attn_kv_a_norm.weight", 1 + rnd(r))
        add(p + "self_attn.kv_b_proj.weight", None, rnd(H * (dn + dv), r) * 4)
        kvb = hf[p + "self_attn.kv_b_proj.weight"].to(torch.float32).view(H, dn + dv, r)
        exp[g + "attn_k_b.weight"] = kvb[:, :dn].transpose(1, 2).contiguous()
        exp[g + "attn_v_b.weight"] = kvb[:, dn:].contiguous()
        add(p + "self_attn.o_proj.weight", g + "attn_output.weight", rnd(E, H * dv))
        add(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", 1 + rnd(E))
        if i < cfg["first_k_dense_replace"]:
            add(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", rnd(F_, E))
            add(p + "mlp.up_proj.weight", g + "ffn_up.weight", rnd(F_, E))
            add(p + "mlp.down_proj.weight", g + "ffn_down.weight", rnd(E, F_))
            continue
        n, fe = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        add(p + "mlp.gate.weight", g + "ffn_gate_inp.weight", rnd(n, E) * 20)
        if cfg.get("scoring_func") == "sigmoid":
            add(p + "mlp.gate.e_score_correction_bias", g + "exp_probs_b.bias", rnd(n) * 4)
        stacks = {"ffn_gate_exps": [], "ffn_up_exps": [], "ffn_down_exps": []}
        for e in range(n):
            for hn, gn, shape in (("gate_proj", "ffn_gate_exps", (fe, E)), ("up_proj", "ffn_up_exps", (fe, E)),
                                  ("down_proj", "ffn_down_exps", (E, fe))):
                t = rnd(*shape).to(dtype)
                hf[f"{p}mlp.experts.{e}.{hn}.weight"] = t
                stacks[gn].append(t.to(torch.float32))
        for gn, ts in stacks.items():
            exp[g + gn + ".weight"] = torch.stack(ts)
        fs = fe * cfg["n_shared_experts"]
        add(p + "mlp.shared_experts.gate_proj.weight", g + "ffn_gate_shexp.weight", rnd(fs, E))
        add(p + "mlp.shared_experts.up_proj.weight", g + "ffn_up_shexp.weight", rnd(fs, E))
        add(p + "mlp.shared_experts.down_proj.weight", g + "ffn_down_shexp.weight", rnd(E, fs))
    add("model.norm.weight", "output_norm.weight", 1 + rnd(E))
    add("lm_head.weight", "output.weight", rnd(V, E))
    cfg["architectures"] = ["DeepseekV3ForCausalLM" if cfg["model_type"] == "deepseek_v3" else "DeepseekV2ForCausalLM"]
    cfg["torch_dtype"] = {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(d, "model.safetensors"), hf, {"format": "pt"})
    save_safetensors(os.path.join(d, "expected.safetensors"), exp)
    logits = deepseek_forward(cfg, {n: t.to(torch.float32) for n, t in hf.items()}, TOKENS)
    with open(os.path.join(d, "logits.json"), "w") as f:
        json.dump({"tokens": TOKENS, "logits": logits.flatten().tolist()}, f)


def gpt2(out):
    d = os.path.join(out, "gpt2")
    os.makedirs(d, exist_ok=True)
    E, L, H, V, C = 64, 2, 4, 320, 128
    hf, exp = {}, {}

    def add(hn, gn, t, transpose=False):
        hf[hn] = t
        exp[gn] = t.t().contiguous() if transpose else t

    add("transformer.wte.weight", "token_embd.weight", rnd(V, E))
    add("transformer.wpe.weight", "position_embd.weight", rnd(C, E))
    for i in range(L):
        p, g = f"transformer.h.{i}.", f"blk.{i}."
        add(p + "ln_1.weight", g + "attn_norm.weight", 1 + rnd(E))
        add(p + "ln_1.bias", g + "attn_norm.bias", rnd(E))
        add(p + "attn.c_attn.weight", g + "attn_qkv.weight", rnd(E, 3 * E), True)   # Conv1D: (in, out)
        add(p + "attn.c_attn.bias", g + "attn_qkv.bias", rnd(3 * E))
        add(p + "attn.c_proj.weight", g + "attn_output.weight", rnd(E, E), True)
        add(p + "attn.c_proj.bias", g + "attn_output.bias", rnd(E))
        add(p + "ln_2.weight", g + "ffn_norm.weight", 1 + rnd(E))
        add(p + "ln_2.bias", g + "ffn_norm.bias", rnd(E))
        add(p + "mlp.c_fc.weight", g + "ffn_up.weight", rnd(E, 4 * E), True)
        add(p + "mlp.c_fc.bias", g + "ffn_up.bias", rnd(4 * E))
        add(p + "mlp.c_proj.weight", g + "ffn_down.weight", rnd(4 * E, E), True)
        add(p + "mlp.c_proj.bias", g + "ffn_down.bias", rnd(E))
        hf[p + "attn.bias"] = torch.tril(torch.ones(1, 1, C, C))  # causal mask buffer: skipped
    add("transformer.ln_f.weight", "output_norm.weight", 1 + rnd(E))
    add("transformer.ln_f.bias", "output_norm.bias", rnd(E))
    exp["output.weight"] = exp["token_embd.weight"]
    cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": E, "n_layer": L, "n_head": H,
           "n_positions": C, "n_ctx": C, "vocab_size": V, "layer_norm_epsilon": 1e-5, "n_inner": None}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_safetensors(os.path.join(d, "model.safetensors"), hf)
    save_safetensors(os.path.join(d, "expected.safetensors"), exp)


def main():
    out = sys.argv[1]
    tok = sys.argv[2] if len(sys.argv) > 2 else None
    torch.manual_seed(1234)
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 96, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "rope_theta": 100000.0, "tie_word_embeddings": True}
    # SmolLM2 / Llama-3 style: llama, GQA, tied, rope scaling, bf16, 2 shards, real tokenizer
    c = dict(base, vocab_size=49152 if tok else 320)
    llama_like(out, "llama", "llama", c, torch.bfloat16, 2, tok,
               {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64})
    # with attention_bias (q/k/v only, as the Llama graph runs them): the biases are permuted like their rows
    llama_like(out, "mistral", "llama", dict(base, vocab_size=320, tie_word_embeddings=False, attention_bias=True),
               torch.float16, 1)
    llama_like(out, "qwen2", "qwen2", dict(base, vocab_size=320, tie_word_embeddings=False), torch.float32, 1)
    # hidden 256 so that every 2-D weight takes Q4_K
    llama_like(out, "qwen3", "qwen3", dict(base, vocab_size=320, hidden_size=256, intermediate_size=512,
                                           head_dim=32, num_attention_heads=4, num_key_value_heads=2),
               torch.float32, 1)
    # query_pre_attn_scalar = head_dim: llama.cpp scales Gemma 2 scores by 1/sqrt(head_dim)
    llama_like(out, "gemma2", "gemma2", dict(base, vocab_size=320, head_dim=16, sliding_window=512,
                                             attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                                             query_pre_attn_scalar=16),
               torch.float32, 1)
    # Gemma 3 (the 270M's layout: head_dim past hidden / heads, one kv head): of each 3 layers the last global
    # (layer_types; the 270M's period is 6), sliding ones 3 keys wide over the 9 tokens and rotated with their own
    # base, unscaled; the global ones with rope_theta, linearly scaled
    llama_like(out, "gemma3", "gemma3_text",
               dict(base, vocab_size=320, head_dim=32, num_key_value_heads=1, num_hidden_layers=4, sliding_window=3,
                    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                    rope_theta=1000000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=32,
                    rope_scaling={"rope_type": "linear", "factor": 2.0}, attn_logit_softcapping=None,
                    final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh"),
               torch.float32, 1)
    # Gemma 3 with its vision tower (the 4B's config.json: text_config gives only what differs from Gemma3TextConfig's
    # defaults: here 8 heads, 4 kv heads, RoPE bases 1e6 and 1e4, eps 1e-6, tied, 5 of each 6 layers sliding come
    # from them), the text model under language_model, in both spellings; the vision tensors are left out
    mm = dict(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=8,
              num_key_value_heads=4, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
              max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 8.0},
              layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention") for i in range(7)],
              attn_logit_softcapping=None, final_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh")
    llama_like(out, "gemma3_mm", "gemma3_text", dict(mm), torch.bfloat16, 2, multimodal="old")
    llama_like(out, "gemma3_mm_new", "gemma3_text", dict(mm), torch.float32, 1, multimodal="new")
    # SmolLM3: a Llama (q/k permuted for llama.cpp's pairs) whose every fourth layer takes no rotary embedding
    llama_like(out, "smollm3", "smollm3", dict(base, vocab_size=320, num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0],
                                               no_rope_layer_interval=4, use_sliding_window=False, rope_theta=5000000.0),
               torch.bfloat16, 1)
    # OLMo 2: RMSNorm after attention and the MLP, not before; QK-norm over the whole projections
    llama_like(out, "olmo2", "olmo2", dict(base, vocab_size=320, tie_word_embeddings=False, rope_theta=500000.0),
               torch.float32, 1)
    # OLMo 3: OLMo 2's norms, and of each 4 layers the last global (layer_types), the sliding ones 4 keys wide over
    # the 9 tokens and rotated with rope_theta unscaled, the global ones with YaRN (x4 of 4096, its own
    # attention_factor, a ramp from beta_fast 8, which moves its lower bound here: llama.cpp's yarn_beta_fast key)
    llama_like(out, "olmo3", "olmo3", dict(base, vocab_size=320, tie_word_embeddings=False, rope_theta=10000.0,
                                           num_hidden_layers=4, sliding_window=4,
                                           layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                           rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 8,
                                                         "beta_slow": 1, "original_max_position_embeddings": 4096,
                                                         "attention_factor": 1.2}),
               torch.float32, 1)
    # Granite: a Llama with multipliers on the embeddings (12), the residual branches (0.22), the scores (1/64,
    # Granite 3's: not 1/sqrt(head_dim)) and the logits (divided by 8)
    llama_like(out, "granite", "granite", dict(base, vocab_size=320, embedding_multiplier=12.0, residual_multiplier=0.22,
                                               attention_multiplier=0.015625, logits_scaling=8.0), torch.bfloat16, 1)
    # Phi-3 / Phi-4-mini: fused qkv_proj and gate_up_proj. "phi3" is Phi-4-mini's layout in small: 3/4 of each head
    # rotated (12 of 16 dims), LongRoPE trained at 16 positions of 64 (cos and sin times sqrt(1 + ln 4 / ln 16)),
    # tied, no window; its 9 tokens take short_factor. "phi3_long": untied, an attention_factor of its own, a window
    # of 8, and 24 tokens, past 16: long_factor. "phi3_mini" is Phi-3-mini-4k's: no scaling, whole heads rotated, a
    # window (6) inside its 9 tokens
    pairs = 6
    longrope = lambda: {"type": "longrope", "short_factor": [round(1 + 3 * x, 4) for x in torch.rand(pairs).tolist()],
                        "long_factor": [round(1 + 3 * x, 4) for x in torch.rand(pairs).tolist()]}
    phi = dict(base, vocab_size=320, max_position_embeddings=64, original_max_position_embeddings=16,
               partial_rotary_factor=0.75, hidden_act="silu")
    llama_like(out, "phi3", "phi3", dict(phi, sliding_window=None, rope_scaling=longrope()), torch.bfloat16, 1)
    llama_like(out, "phi3_long", "phi3", dict(phi, tie_word_embeddings=False, sliding_window=8,
                                              rope_scaling=dict(longrope(), attention_factor=1.1)),
               torch.float32, 2, tokens=LONG_TOKENS)
    llama_like(out, "phi3_mini", "phi3", dict(base, vocab_size=320, max_position_embeddings=64,
                                              original_max_position_embeddings=64, tie_word_embeddings=False,
                                              sliding_window=6, rope_scaling=None), torch.float16, 1)
    # mixtures of experts: Mixtral (a llama with experts: permuted q/k), Qwen2-MoE (QKV bias, a shared
    # expert), Qwen3-MoE (per-head QK-norm, narrower experts), OLMoE (QK-norm over the projections)
    llama_like(out, "mixtral", "mixtral", dict(base, vocab_size=320, tie_word_embeddings=False, num_local_experts=4,
                                               num_experts_per_tok=2), torch.bfloat16, 2)
    llama_like(out, "qwen2_moe", "qwen2_moe", dict(base, vocab_size=320, tie_word_embeddings=False, num_experts=6,
                                                   num_experts_per_tok=2, moe_intermediate_size=32,
                                                   shared_expert_intermediate_size=80, norm_topk_prob=False),
               torch.float32, 1)
    llama_like(out, "qwen3_moe", "qwen3_moe", dict(base, vocab_size=320, num_experts=8, num_experts_per_tok=3,
                                                   moe_intermediate_size=64, norm_topk_prob=True, head_dim=32),
               torch.float16, 1)
    llama_like(out, "olmoe", "olmoe", dict(base, vocab_size=320, tie_word_embeddings=False, num_key_value_heads=4,
                                           num_experts=4, num_experts_per_tok=2, norm_topk_prob=False),
               torch.float32, 1)
    # DeepSeek-V2-Lite's layout (queries straight from q_proj, a dense first layer, two shared experts, softmax
    # routing, YaRN with mscale = mscale_all_dim) and DeepSeek-V3's (a query latent, sigmoid routing with a
    # bias, renormalised and scaled), in small
    mla = {"kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16,
           "moe_intermediate_size": 32, "num_experts_per_tok": 2, "n_routed_experts": 6, "moe_layer_freq": 1,
           "first_k_dense_replace": 1, "tie_word_embeddings": False}
    deepseek(out, "deepseek_v2", dict(base, vocab_size=320, num_hidden_layers=3, num_key_value_heads=4, **mla,
                                      model_type="deepseek_v2", q_lora_rank=None, n_shared_experts=2,
                                      topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
                                      scoring_func="softmax",
                                      rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                                    "beta_fast": 32, "beta_slow": 1, "mscale": 0.707,
                                                    "mscale_all_dim": 0.707}),
             torch.bfloat16)
    deepseek(out, "deepseek_v3", dict(base, vocab_size=320, num_hidden_layers=3, num_key_value_heads=4, **mla,
                                      model_type="deepseek_v3", q_lora_rank=24, n_shared_experts=1,
                                      topk_method="noaux_tc", n_group=1, topk_group=1, norm_topk_prob=True,
                                      routed_scaling_factor=2.5, scoring_func="sigmoid"),
             torch.float32)
    gpt2(out)


if __name__ == "__main__":
    main()
