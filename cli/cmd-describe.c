/* cmd-describe.c: `toy describe <model.gguf|NAME> [--json]`: what a GGUF
 * holds (architecture, dimensions, parameter count, file type, bytes per
 * tensor type, tokenizer) and an algorithm card: the forward pass as
 * Phuong & Hutter style pseudocode ("Formal Algorithms for Transformers",
 * 2022) with every shape filled in from the file's own hyperparameters.
 * Keys read: llama.cpp's <arch>.* and tokenizer.ggml.* (gguf-spec). */
#include <jansson.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "json-out.h"
#include "toy/chat-reply.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/models.h"

struct text {
    char *s;
    size_t len, cap;
};

__attribute__((format(printf, 2, 3))) static void tprintf(struct text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->len + (size_t)n + 1 > t->cap) {
        size_t cap = (t->cap ? t->cap * 2 : 4096) + (size_t)n;
        char *s = realloc(t->s, cap);
        if (!s) return;
        t->s = s;
        t->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(t->s + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* Display width of UTF-8 text: code points, less combining marks (the
 * card's other symbols are all single-width). */
static int width(const char *s) {
    int w = 0;
    for (const unsigned char *u = (const unsigned char *)s; *u; u++) {
        if ((*u & 0xC0) == 0x80) continue;
        if (*u == 0xCC || (*u == 0xCD && u[1] < 0xB0)) continue; /* combining marks (X̃) */
        w++;
    }
    return w;
}

/* One line: `left` padded to column `col`, then `right`. */
__attribute__((format(printf, 4, 5))) static void row(struct text *t, int col, const char *right, const char *fmt, ...) {
    char left[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(left, sizeof left, fmt, ap);
    va_end(ap);
    int pad = col - width(left);
    if (!right || !*right) tprintf(t, "%s\n", left);
    else tprintf(t, "%s%*s%s\n", left, pad > 1 ? pad : 1, "", right);
}

/* What the file says. A key it lacks is marked (has_*), never filled in
 * with a default that reads as a fact: "rms eps 1e-05" on a LayerNorm
 * model, "rope base 10000" on an ALiBi one, "tied" on a file without
 * tensors. Hkv defaults to H and d_h to d/H, as the GGUF spec says. */
struct hp {
    const char *arch, *name;
    int64_t d, L, H, Hkv, dff, ctx, vocab, dh, n_params, n_tensors;
    double eps, rope_base;
    bool has_d, has_L, has_H, has_dff, has_ctx, has_vocab;
    bool has_eps, eps_rms, has_rope_base, tied, qkv_bias, qk_norm, has_rope_freqs;
    double attn_cap, final_cap;
    int64_t swa, swa_period; /* the window, and of each swa_period layers the last is global (0: all slide) */
    int64_t nope_period;     /* of each nope_period layers the last takes no RoPE (SmolLM3; 0: none) */
    double rope_base_swa;    /* the sliding layers' RoPE base (Gemma 3; 0: rope_base) */
    double embed_mult, residual_mult, attn_mult, logit_div; /* Granite's (0: absent) */
    int64_t experts, experts_used, dff_exp; /* a mixture of experts (0: none) */
    int64_t dff_shared;                     /* its shared expert's width (Qwen2-MoE; 0: none) */
    int64_t dense_lead;                     /* DeepSeek: the first layers' dense MLP */
    int64_t kv_rank, q_rank, rope_dim, dv;  /* DeepSeek's latent attention (kv_rank 0: none) */
    int64_t rot;                            /* the rotated dims of a head (Phi-4-mini's partial rotary) */
    bool longrope, fused;                   /* Phi-3: LongRoPE's tables; attn_qkv and a fused ffn_up */
    double rope_attn;                       /* rope.scaling.attn_factor (0: absent) */
    double attn_temp;                       /* Ministral 3's query temperature (0: none) */
    int64_t rope_orig;
    bool moe_sigmoid, moe_bias, moe_norm;   /* DeepSeek's routing */
    double moe_scale, yarn_log_mul, rope_factor;
    /* gpt-oss: the MLP's norm stored as post_attention_norm (toy_llama_arch_rules' ffn_norm_post_attn); attention
     * sinks, the attention output's, the router's and the experts' biases (by their tensors); the clamped SwiGLU's
     * limit (llama.cpp's 7, no key); YaRN (rope.scaling.type) and its ramp's ends, in pairs of a head */
    bool mlp_norm_post_attn, sinks, out_bias, router_bias, exp_biases, yarn;
    double swiglu_limit, yarn_lo, yarn_hi;
    int64_t pooling; /* pooling_type (an embedding model's; 0: none stated) */
    bool vit; /* a ViT classifier (toy train --arch vit): images in, classes out */
    int64_t img_h, img_w, channels, patch, classes;
    struct { char key[128]; const char *type; } bad[16]; /* hyperparameters stored as something not a number */
    int n_bad;
};

/* The key arch.suffix is in the file with a type that is not a number: noted in h->bad, since a loader
 * refuses the file for it, and it is not "missing" */
static void note_bad(const struct toy_gguf *g, struct hp *h, const char *key) {
    int64_t i = toy_gguf_find_key(g, key);
    if (i < 0 || h->n_bad == (int)(sizeof h->bad / sizeof h->bad[0])) return;
    snprintf(h->bad[h->n_bad].key, sizeof h->bad[0].key, "%s", key);
    h->bad[h->n_bad++].type = toy_gguf_type_name(toy_gguf_kv_type(g, i));
}

static bool is_bad(const struct hp *h, const char *suffix) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", h->arch, suffix);
    for (int i = 0; i < h->n_bad; i++)
        if (!strcmp(h->bad[i].key, k)) return true;
    return false;
}

static int64_t geti(const struct toy_gguf *g, struct hp *h, const char *suffix, int64_t def, bool *found) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", h->arch, suffix);
    int64_t v;
    enum toy_status st = toy_gguf_get_i64(g, k, &v);
    if (st == TOY_ERR_FORMAT) note_bad(g, h, k);
    if (st) return def;
    if (found) *found = true;
    return v;
}

static double getf(const struct toy_gguf *g, struct hp *h, const char *suffix, double def, bool *found) {
    char k[256];
    snprintf(k, sizeof k, "%s.%s", h->arch, suffix);
    double v;
    enum toy_status st = toy_gguf_get_f64(g, k, &v);
    if (st == TOY_ERR_FORMAT) note_bad(g, h, k);
    if (st) return def;
    if (found) *found = true;
    return v;
}

/* arch.attention.sliding_window_pattern: a period, or (newer llama.cpp files) a bool per layer, true where the layer
 * slides, read as the period it repeats (src/models/llama-gguf.c refuses one that repeats none: -1 here) */
static int64_t swa_pattern(const struct toy_gguf *g, struct hp *h, int64_t def) {
    char k[256];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", h->arch);
    int64_t i = toy_gguf_find_key(g, k);
    if (i < 0 || toy_gguf_kv_type(g, i) != TOY_GGUF_ARRAY) return geti(g, h, "attention.sliding_window_pattern", def, NULL);
    uint64_t n = toy_gguf_arr_len(g, i);
    if (toy_gguf_arr_type(g, i) != TOY_GGUF_BOOL || !n) {
        note_bad(g, h, k);
        return def;
    }
    const uint8_t *b = toy_gguf_arr_data(g, i);
    bool *slides = malloc(n);
    if (!slides) return def;
    for (uint64_t l = 0; l < n; l++) slides[l] = b[l] != 0;
    int64_t p = toy_llama_swa_period_of(slides, (int64_t)n, NULL);
    free(slides);
    return p;
}

static void read_hp(const struct toy_gguf *g, struct hp *h) {
    memset(h, 0, sizeof *h);
    h->arch = "unknown";
    toy_gguf_get_str(g, "general.architecture", &h->arch, NULL);
    h->name = "";
    toy_gguf_get_str(g, "general.name", &h->name, NULL);
    h->d = geti(g, h, "embedding_length", 0, &h->has_d);
    h->L = geti(g, h, "block_count", 0, &h->has_L);
    h->H = geti(g, h, "attention.head_count", 0, &h->has_H);
    h->Hkv = geti(g, h, "attention.head_count_kv", h->H, NULL);
    h->dff = geti(g, h, "feed_forward_length", 0, &h->has_dff);
    h->ctx = geti(g, h, "context_length", 0, &h->has_ctx);
    h->dh = geti(g, h, "attention.key_length", h->H ? h->d / h->H : 0, NULL);
    h->eps = getf(g, h, "attention.layer_norm_rms_epsilon", 0, &h->eps_rms);
    h->has_eps = h->eps_rms;
    if (!h->has_eps) h->eps = getf(g, h, "attention.layer_norm_epsilon", 0, &h->has_eps);
    h->rope_base = getf(g, h, "rope.freq_base", 10000.0, &h->has_rope_base);
    h->attn_cap = getf(g, h, "attn_logit_softcapping", 0, NULL);
    h->final_cap = getf(g, h, "final_logit_softcapping", 0, NULL);
    h->swa = geti(g, h, "attention.sliding_window", 0, NULL);
    h->pooling = geti(g, h, "pooling_type", 0, NULL);
    /* llama.cpp hard-codes Gemma 2's period and Gemma 3's (src/models/llama-gguf.c reads a per-layer array too) */
    const struct toy_llama_arch_rules rules = toy_llama_arch_rules(h->arch);
    h->swa_period = swa_pattern(g, h, rules.swa_period);
    h->rope_base_swa = getf(g, h, "rope.freq_base_swa",
                            toy_llama_swa_base_default(h->arch, h->swa, (float)h->rope_base), NULL);
    h->nope_period = rules.nope_period;
    if (!strcmp(h->arch, "granite")) {
        h->embed_mult = getf(g, h, "embedding_scale", 0, NULL);
        h->residual_mult = getf(g, h, "residual_scale", 0, NULL);
        h->attn_mult = getf(g, h, "attention.scale", 0, NULL);
        h->logit_div = getf(g, h, "logit_scale", 0, NULL);
    }
    h->dense_lead = geti(g, h, "leading_dense_block_count", 0, NULL);
    char first[96], nm[160];
    snprintf(first, sizeof first, "blk.%lld.", (long long)h->dense_lead);
#define FIRST(suffix) (snprintf(nm, sizeof nm, "%s%s", first, suffix), nm)
    if (toy_gguf_find_tensor(g, FIRST("ffn_gate_inp.weight")) >= 0) {
        h->experts = geti(g, h, "expert_count", 0, NULL);
        h->experts_used = geti(g, h, "expert_used_count", 0, NULL);
        h->dff_exp = geti(g, h, "expert_feed_forward_length", 0, NULL);
        int64_t n_shared = geti(g, h, "expert_shared_count", 1, NULL); /* DeepSeek: the shared experts' count */
        if (toy_gguf_find_tensor(g, FIRST("ffn_gate_shexp.weight")) >= 0)
            h->dff_shared = geti(g, h, "expert_shared_feed_forward_length",
                                 !strcmp(h->arch, "deepseek2") ? n_shared * (h->dff_exp ? h->dff_exp : h->dff) : h->dff,
                                 NULL);
    } else {
        h->dense_lead = 0;
    }
#undef FIRST
    if ((h->kv_rank = geti(g, h, "attention.kv_lora_rank", 0, NULL))) { /* heads' dims under the *_mla keys */
        h->q_rank = geti(g, h, "attention.q_lora_rank", 0, NULL);
        h->rope_dim = geti(g, h, "rope.dimension_count", 0, NULL);
        h->dh = geti(g, h, "attention.key_length_mla", h->dh, NULL);
        h->dv = geti(g, h, "attention.value_length_mla", geti(g, h, "attention.value_length", h->dh, NULL), NULL);
        if (toy_gguf_find_tensor(g, "blk.0.attn_q_a.weight") < 0) h->q_rank = 0;
        h->moe_sigmoid = geti(g, h, "expert_gating_func", 1, NULL) == 2;
        h->moe_norm = geti(g, h, "expert_weights_norm", 0, NULL) != 0;
        h->moe_scale = getf(g, h, "expert_weights_scale", 1.0, NULL);
        h->yarn_log_mul = getf(g, h, "rope.scaling.yarn_log_multiplier", 0.0, NULL) / 0.1;
        h->rope_factor = getf(g, h, "rope.scaling.factor", 1.0, NULL);
        char b[96];
        snprintf(b, sizeof b, "blk.%lld.exp_probs_b.bias", (long long)h->dense_lead);
        h->moe_bias = toy_gguf_find_tensor(g, b) >= 0;
    }
    if ((h->vit = !strcmp(h->arch, "vit"))) { /* the keys src/models/vit.c writes */
        h->img_w = geti(g, h, "image_size", 0, NULL);
        h->img_h = geti(g, h, "image_height", h->img_w, NULL);
        h->channels = geti(g, h, "channels", 3, NULL);
        h->patch = geti(g, h, "patch_size", 0, NULL);
        h->classes = geti(g, h, "class_count", 0, NULL);
    }
    uint64_t n;
    int64_t k;
    if (!toy_gguf_get_arr(g, "tokenizer.ggml.tokens", &k, NULL, &n)) h->vocab = (int64_t)n, h->has_vocab = true;
    else h->vocab = geti(g, h, "vocab_size", 0, &h->has_vocab);
    int64_t te = toy_gguf_find_tensor(g, "token_embd.weight");
    if (te >= 0 && !h->vocab) h->vocab = toy_gguf_tensor(g, te)->ne[1], h->has_vocab = true;
    h->n_tensors = toy_gguf_n_tensors(g);
    /* tied: the embedding is there and no output matrix; a file without tensors says nothing either way */
    h->tied = te >= 0 && toy_gguf_find_tensor(g, "output.weight") < 0 && strcmp(h->arch, "bert"); /* (an encoder
                                                                                                 * has no head) */
    h->qkv_bias = toy_gguf_find_tensor(g, "blk.0.attn_q.bias") >= 0;
    h->qk_norm = toy_gguf_find_tensor(g, "blk.0.attn_q_norm.weight") >= 0;
    h->has_rope_freqs = toy_gguf_find_tensor(g, "rope_freqs.weight") >= 0;
    h->rot = h->kv_rank ? h->dh : geti(g, h, "rope.dimension_count", h->dh, NULL);
    h->longrope = toy_gguf_find_tensor(g, "rope_factors_long.weight") >= 0;
    h->rope_attn = getf(g, h, "rope.scaling.attn_factor", 0, NULL);
    h->rope_orig = geti(g, h, "rope.scaling.original_context_length", h->ctx, NULL);
    h->attn_temp = !strcmp(h->arch, "mistral3") ? getf(g, h, "attention.temperature_scale", 0, NULL) : 0;
    h->fused = strcmp(h->arch, "gpt2") && toy_gguf_find_tensor(g, "blk.0.attn_qkv.weight") >= 0;
    h->mlp_norm_post_attn = rules.ffn_norm_post_attn;
    if (!strcmp(h->arch, "gpt-oss")) { /* as src/models/llama-gguf.c reads it */
        h->sinks = toy_gguf_find_tensor(g, "blk.0.attn_sinks.weight") >= 0;
        h->out_bias = toy_gguf_find_tensor(g, "blk.0.attn_output.bias") >= 0;
        h->router_bias = toy_gguf_find_tensor(g, "blk.0.ffn_gate_inp.bias") >= 0;
        h->exp_biases = toy_gguf_find_tensor(g, "blk.0.ffn_gate_exps.bias") >= 0;
        h->swiglu_limit = 7;
        char k[256];
        const char *st = NULL;
        size_t stl = 0;
        snprintf(k, sizeof k, "%s.rope.scaling.type", h->arch);
        h->rope_factor = getf(g, h, "rope.scaling.factor", 1.0, NULL);
        h->yarn = !toy_gguf_get_str(g, k, &st, &stl) && stl == 4 && !memcmp(st, "yarn", 4) && h->rope_factor > 1;
        if (h->yarn) { /* the ramp's ends as the rope kernels place them (src/backends/cpu/cpu.c), β 32 and 1 */
            const double n = (double)h->rot, base = h->rope_base > 0 ? h->rope_base : 10000.0,
                         o = (double)h->rope_orig, two_pi = 6.283185307179586;
            double bf = getf(g, h, "rope.scaling.yarn_beta_fast", 32.0, NULL);
            double bs = getf(g, h, "rope.scaling.yarn_beta_slow", 1.0, NULL);
            if (!(bf > 0)) bf = 32;
            if (!(bs > 0)) bs = 1;
            h->yarn_lo = floor(n * log(o / (bf * two_pi)) / (2 * log(base)));
            h->yarn_hi = ceil(n * log(o / (bs * two_pi)) / (2 * log(base)));
            if (h->yarn_lo < 0) h->yarn_lo = 0;
            if (h->yarn_hi > n - 1) h->yarn_hi = n - 1;
        }
    }
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) h->n_params += toy_gguf_tensor(g, i)->n_elements;
}

static const char *ttype(const struct toy_gguf *g, const char *name) {
    int64_t i = toy_gguf_find_tensor(g, name);
    return i < 0 ? "absent" : toy_dtype_name(toy_gguf_tensor(g, i)->type);
}

/* "name   type" for the right column of a parameter line. */
static const char *pname(const struct toy_gguf *g, char *buf, size_t n, const char *label, const char *tensor) {
    snprintf(buf, n, "%-30s %s", label, tensor ? ttype(g, tensor) : "");
    return buf;
}

#define PCOL 46 /* column of the GGUF names */
#define SCOL 58 /* column of the shapes in the steps */

/* DeepSeek-V2/V3's forward pass (deepseek2): latent attention, the dense
 * first layers, the routed and shared experts (src/models/llama.c's
 * toy_llama_mla_qkv and toy_llama_moe_ffn), written in the plain,
 * unabsorbed form, which the absorbed one toy runs computes. */
static void card_mla(const struct toy_gguf *g, const struct hp *h, struct text *t) {
    const long long d = h->d, L = h->L, H = h->H, dh = h->dh, dr = h->rope_dim, dn = h->dh - h->rope_dim, dv = h->dv,
                    R = h->kv_rank, QR = h->q_rank, F = h->dff, V = h->vocab, C = h->ctx, NE = h->experts,
                    NK = h->experts_used, FE = h->dff_exp ? h->dff_exp : h->dff, FS = h->dff_shared, LD = h->dense_lead;
    char r[160], sh[96], nm[96];
#define FIRST(suffix) (snprintf(nm, sizeof nm, "blk.%lld.%s", LD, suffix), nm)
    tprintf(t, "Algorithm: deepseek2 forward pass (decoder-only transformer, pre-RMSNorm, multi-head latent "
               "attention%s)\n", NE ? ", mixture of experts" : "");
    tprintf(t, "Input:  x ∈ [N_V]^T, token ids, T ≤ l_max = %lld\n", C);
    tprintf(t, "Output: P ∈ (0,1)^(N_V×T), P[:, t] = p(x[t+1] | x[1:t])\n");
    tprintf(t, "Hyperparameters: L = %lld, H = %lld, d_e = %lld, d_c = %lld (the kv latent), d_h = %lld, d_r = %lld "
               "(rotated), d_v = %lld,\n                 d_mlp = %lld, N_V = %lld, ε = %g, RoPE base θ = %g",
            L, H, d, R, dn, dr, dv, F, V, h->eps, h->rope_base);
    if (QR) tprintf(t, ", d_q = %lld (the query latent)", QR);
    if (NE && LD) tprintf(t, ", L_d = %lld (dense layers first)", LD);
    tprintf(t, "\nParameters (GGUF name, stored type):\n");
    row(t, PCOL, pname(g, r, sizeof r, "token_embd.weight", "token_embd.weight"), "  W_e ∈ R^(d_e×N_V) = (%lld×%lld)", d, V);
    tprintf(t, "  for l = 1..%lld (tensors blk.{0..%lld}.*):\n", L, L - 1);
    row(t, PCOL, pname(g, r, sizeof r, "attn_norm.weight", "blk.0.attn_norm.weight"), "    γ_att ∈ R^%lld", d);
    if (QR) {
        row(t, PCOL, pname(g, r, sizeof r, "attn_q_a.weight", "blk.0.attn_q_a.weight"), "    W_qa = (d_q×d_e) = (%lld×%lld)", QR, d);
        row(t, PCOL, pname(g, r, sizeof r, "attn_q_a_norm.weight", "blk.0.attn_q_a_norm.weight"), "    γ_q ∈ R^%lld", QR);
        row(t, PCOL, pname(g, r, sizeof r, "attn_q_b.weight", "blk.0.attn_q_b.weight"), "    W_qb = (H·(d_h+d_r)×d_q) = (%lld×%lld)", H * dh, QR);
    } else {
        row(t, PCOL, pname(g, r, sizeof r, "attn_q.weight", "blk.0.attn_q.weight"), "    W_q = (H·(d_h+d_r)×d_e) = (%lld×%lld)", H * dh, d);
    }
    row(t, PCOL, pname(g, r, sizeof r, "attn_kv_a_mqa.weight", "blk.0.attn_kv_a_mqa.weight"), "    W_kva = ((d_c+d_r)×d_e) = (%lld×%lld)", R + dr, d);
    row(t, PCOL, pname(g, r, sizeof r, "attn_kv_a_norm.weight", "blk.0.attn_kv_a_norm.weight"), "    γ_c ∈ R^%lld", R);
    if (toy_gguf_find_tensor(g, "blk.0.attn_k_b.weight") < 0) { /* the older layout: both in one */
        row(t, PCOL, pname(g, r, sizeof r, "attn_kv_b.weight", "blk.0.attn_kv_b.weight"), "    [W_k,h; W_v,h] = (H·(%lld+%lld)×%lld)", dn, dv, R);
    } else {
        row(t, PCOL, pname(g, r, sizeof r, "attn_k_b.weight", "blk.0.attn_k_b.weight"), "    W_k,hᵀ = (%lld×%lld), h ∈ [%lld]", R, dn, H);
        row(t, PCOL, pname(g, r, sizeof r, "attn_v_b.weight", "blk.0.attn_v_b.weight"), "    W_v,h = (%lld×%lld), h ∈ [%lld]", dv, R, H);
    }
    row(t, PCOL, pname(g, r, sizeof r, "attn_output.weight", "blk.0.attn_output.weight"), "    W_o = (d_e×H·d_v) = (%lld×%lld)", d, H * dv);
    row(t, PCOL, pname(g, r, sizeof r, "ffn_norm.weight", "blk.0.ffn_norm.weight"), "    γ_ffn ∈ R^%lld", d);
    if (!NE || LD) {
        row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up}.weight", "blk.0.ffn_gate.weight"), "    W_gate, W_up = (%lld×%lld)%s", F, d,
            NE ? ", l ≤ L_d" : "");
        row(t, PCOL, pname(g, r, sizeof r, "ffn_down.weight", "blk.0.ffn_down.weight"), "    W_down = (%lld×%lld)", d, F);
    }
    if (NE) {
        row(t, PCOL, pname(g, r, sizeof r, "ffn_gate_inp.weight", FIRST("ffn_gate_inp.weight")), "    W_r = (N_E×d_e) = (%lld×%lld)", NE, d);
        if (h->moe_bias) row(t, PCOL, pname(g, r, sizeof r, "exp_probs_b.bias", FIRST("exp_probs_b.bias")), "    b_r ∈ R^%lld", NE);
        row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up}_exps.weight", FIRST("ffn_gate_exps.weight")), "    W_gate,e, W_up,e = (%lld×%lld), e ∈ [%lld]", FE, d, NE);
        row(t, PCOL, pname(g, r, sizeof r, "ffn_down_exps.weight", FIRST("ffn_down_exps.weight")), "    W_down,e = (%lld×%lld)", d, FE);
        if (FS) row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up,down}_shexp.weight", FIRST("ffn_gate_shexp.weight")), "    W_gate,s, W_up,s = (%lld×%lld), W_down,s", FS, d);
    }
    row(t, PCOL, pname(g, r, sizeof r, "output_norm.weight", "output_norm.weight"), "  γ_f ∈ R^%lld", d);
    if (h->tied) row(t, PCOL, "(tied: no output.weight)", "  W_u = W_eᵀ");
    else row(t, PCOL, pname(g, r, sizeof r, "output.weight", "output.weight"), "  W_u = (N_V×d_e) = (%lld×%lld)", V, d);
    tprintf(t, "\n");
    int n = 1;
#define STEP(shape, ...) row(t, SCOL, shape, "%2d " __VA_ARGS__)
    snprintf(sh, sizeof sh, "X: (%lld×T)", d);
    STEP(sh, "for t ∈ [T]: X[:, t] ← W_e[:, x[t]]", n++);
    STEP("", "for l = 1..%lld:", n++, L);
    snprintf(sh, sizeof sh, "(%lld×T)", d);
    STEP(sh, "  X̃ ← RMSNorm(X | γ_att)", n++);
    snprintf(sh, sizeof sh, "Q_h = [Q_h^n; Q_h^r]: ((%lld+%lld)×T)", dn, dr);
    if (QR) STEP(sh, "  Q ← W_qb RMSNorm(W_qa X̃ | γ_q)", n++);
    else STEP(sh, "  Q ← W_q X̃", n++);
    snprintf(sh, sizeof sh, "C: (%lld×T), K^r: (%lld×T)", R, dr);
    STEP(sh, "  [C; K^r] ← W_kva X̃; C ← RMSNorm(C | γ_c)", n++);
    STEP("adjacent pairs", "  Q_h^r ← RoPE(Q_h^r, θ); K^r ← RoPE(K^r, θ)%s", n++, h->rope_factor > 1 ? " (YaRN)" : "");
    double f = h->rope_factor > 1 ? h->rope_factor : 1;
    double m = (h->yarn_log_mul != 0 ? 1.0 : 1.0 + 0.1 * log(f)) * (1.0 + 0.1 * h->yarn_log_mul * log(f));
    snprintf(sh, sizeof sh, "S: (T×T), s = %.4g", m * m / sqrt((double)dh));
    STEP(sh, "  for h ∈ [%lld]: S ← s ((W_k,h C)ᵀ Q_h^n + K^rᵀ Q_h^r)", n++, H);
    snprintf(sh, sizeof sh, "Y_h: (%lld×T), M causal", dv);
    STEP(sh, "    Y_h ← (W_v,h C) softmax(S + M)", n++);
    snprintf(sh, sizeof sh, "(%lld×T)", d);
    STEP(sh, "  X ← X + W_o [Y_1; …; Y_%lld]", n++, H);
    STEP(sh, "  X̃ ← RMSNorm(X | γ_ffn)", n++);
    snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
    if (!NE) STEP(sh, "  X ← X + W_down (SiLU(W_gate X̃) ⊙ W_up X̃)", n++);
    else {
        if (LD) STEP(sh, "  l ≤ L_d: X ← X + W_down (SiLU(W_gate X̃) ⊙ W_up X̃), next l", n++);
        snprintf(sh, sizeof sh, "P: (%lld×T)", NE);
        STEP(sh, "  P ← %s(W_r X̃); for t ∈ [T]: E_t ← the %lld largest of P[:, t]%s", n++,
             h->moe_sigmoid ? "σ" : "softmax", NK, h->moe_bias ? " + b_r" : "");
        char scale[48] = "";
        if (h->moe_scale != 1) snprintf(scale, sizeof scale, "%g · ", h->moe_scale);
        if (h->moe_norm) STEP("", "    w_t,e ← %sP[e, t] / Σ_{e' ∈ E_t} P[e', t]", n++, scale);
        else STEP("", "    w_t,e ← %sP[e, t]", n++, scale);
        snprintf(sh, sizeof sh, "(%lld×1) → (%lld×1), %lld of %lld", FE, d, NK, NE);
        STEP(sh, "  X[:, t] ← X[:, t] + Σ_{e ∈ E_t} w_t,e W_down,e (SiLU(W_gate,e x̃_t) ⊙ W_up,e x̃_t)", n++);
        if (FS) {
            snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", FS, d);
            STEP(sh, "  X ← X + W_down,s (SiLU(W_gate,s X̃) ⊙ W_up,s X̃)", n++);
        }
    }
    STEP("", "X ← RMSNorm(X | γ_f)", n++);
    snprintf(sh, sizeof sh, "(%lld×T)", V);
    STEP(sh, "Z ← W_u X", n++);
    STEP(sh, "return P = softmax(Z)", n);
#undef STEP
#undef FIRST
    tprintf(t, "RMSNorm(x | γ) = x ⊙ γ / √(mean(x²) + ε). toy runs the attention absorbed: W_k,hᵀ folded into "
               "the query, W_v,h applied after the softmax,\nso the cache holds C and K^r, %lld numbers a position "
               "and layer\n", R + dr);
}

/* The forward pass of the Llama family (llama, mistral, qwen2, qwen3,
 * gemma2, gemma3, and the mixtures qwen3moe and olmoe) and GPT-2. Matrices act on column vectors, one per position, so
 * X is (d_e x T); shapes are (rows x cols). */
static void card(const struct toy_gguf *g, const struct hp *h, struct text *t) {
    const bool gpt2 = !strcmp(h->arch, "gpt2");
    const bool gemma = !strcmp(h->arch, "gemma2") || !strcmp(h->arch, "gemma3");
    /* (DeepSeek's latent attention has a card of its own: card_mla) */
    const bool llama_family = toy_llama_arch_known(h->arch) && strcmp(h->arch, "deepseek2");
    /* OLMo 2: RMSNorm after attention and the MLP, none before */
    const bool post_only = toy_gguf_find_tensor(g, "blk.0.post_attention_norm.weight") >= 0 &&
                           toy_gguf_find_tensor(g, "blk.0.attn_norm.weight") < 0 && !h->mlp_norm_post_attn;
    const long long NE = h->experts, NK = h->experts_used, FE = h->dff_exp ? h->dff_exp : h->dff, FS = h->dff_shared;
    if (!h->n_tensors) {
        tprintf(t, "(no tensors: a vocabulary-only file (a tokenizer), no network to describe)\n");
        return;
    }
    if (h->vit && h->d > 0 && h->L > 0 && h->H > 0 && h->patch > 0) {
        const long long P = h->patch, N = (h->img_h / P) * (h->img_w / P);
        tprintf(t, "Algorithm: vit forward pass (Vision Transformer classifier, pre-LayerNorm, class token)\n");
        tprintf(t, "Input:  an image of %lld x %lld pixels, %lld channel%s, normalised by the file's mean and std\n",
                (long long)h->img_h, (long long)h->img_w, (long long)h->channels, h->channels == 1 ? "" : "s");
        tprintf(t, "Output: p ∈ (0,1)^%lld, a distribution over the classes\n", (long long)h->classes);
        tprintf(t, "1. patches: %lld of %lld x %lld; e = W_p patch + b_p (a stride-%lld convolution) -> %lld x %lld\n", N, P,
                P, P, (long long)h->d, N);
        tprintf(t, "2. x = [cls, e] + pos (%lld positions)\n", N + 1);
        tprintf(t, "3. for l = 1..%lld: x += attention(LN(x)) (%lld heads, bidirectional); x += W_down GELU(W_up LN(x))"
                " (d_ff %lld)\n", (long long)h->L, (long long)h->H, (long long)h->dff);
        tprintf(t, "4. p = softmax(W_head LN(x[cls]) + b_head)\n");
        return;
    }
    if (h->kv_rank && h->d > 0 && h->L > 0 && h->H > 0 && h->dh > h->rope_dim) {
        card_mla(g, h, t);
        return;
    }
    if (!gpt2 && !llama_family) {
        tprintf(t, "(no algorithm card for architecture '%s': toy knows the Llama family, GPT-2 and ViT)\n", h->arch);
        return;
    }
    if (h->d < 1 || h->L < 1 || h->H < 1) { /* a card "for l = 1..0" over shapes of 0 describes nothing */
        tprintf(t, "(no algorithm card: %s.embedding_length, .block_count and .attention.head_count must be "
                "positive; the file has %lld, %lld, %lld)\n", h->arch, (long long)h->d, (long long)h->L, (long long)h->H);
        return;
    }
    const long long d = h->d, L = h->L, H = h->H, K = h->Hkv, dh = h->dh, F = h->dff, V = h->vocab, C = h->ctx;
    int64_t qn = toy_gguf_find_tensor(g, "blk.0.attn_q_norm.weight");
    const bool qk_full = qn >= 0 && toy_gguf_tensor(g, qn)->ne[0] == H * dh && H > 1; /* OLMoE: the whole projection */
    char r[160], sh[192];
    tprintf(t, "Algorithm: %s forward pass (decoder-only transformer, %s)\n", h->arch,
            gpt2 ? "pre-LayerNorm, learned positions"
                 : h->sinks ? "pre-RMSNorm, rotary positions, attention sinks" : "pre-RMSNorm, rotary positions");
    tprintf(t, "Input:  x ∈ [N_V]^T, token ids, T ≤ l_max = %lld\n", C);
    tprintf(t, "Output: P ∈ (0,1)^(N_V×T), P[:, t] = p(x[t+1] | x[1:t])\n");
    char eps[64], theta[80];
    if (h->has_eps) snprintf(eps, sizeof eps, "%g", h->eps);
    else if (is_bad(h, "attention.layer_norm_rms_epsilon") || is_bad(h, "attention.layer_norm_epsilon"))
        snprintf(eps, sizeof eps, "? (not a number in the file)");
    else snprintf(eps, sizeof eps, "? (not in the file)");
    /* toy, like llama.cpp, runs a missing base as 10000: say that it is the default */
    if (is_bad(h, "rope.freq_base")) snprintf(theta, sizeof theta, "? (not a number in the file)");
    else snprintf(theta, sizeof theta, h->has_rope_base ? "%g" : "%g (not in the file: the default)", h->rope_base);
    tprintf(t, "Hyperparameters: L = %lld, H = %lld, d_e = %lld, d_h = %lld, d_mlp = %lld, N_V = %lld, ε = %s", L, H,
            d, dh, F, V, eps);
    if (!gpt2) tprintf(t, ",\n                 H_kv = %lld (%lld query heads share each K/V head), RoPE base θ = %s", K,
                       K ? H / K : 0, theta);
    if (h->embed_mult > 0 || h->residual_mult > 0 || h->attn_mult > 0 || h->logit_div > 0)
        tprintf(t, "\nMultipliers (Granite): X times %g after the embedding, each attention and MLP output times %g "
                   "before its residual add, S times %g in place of 1/√d_h, Z divided by %g",
                h->embed_mult > 0 ? h->embed_mult : 1.0, h->residual_mult > 0 ? h->residual_mult : 1.0,
                h->attn_mult > 0 ? h->attn_mult : 1.0 / sqrt((double)(h->dh > 0 ? h->dh : 1)), h->logit_div > 0 ? h->logit_div : 1.0);
    tprintf(t, "\nParameters (GGUF name, stored type):\n");
    row(t, PCOL, pname(g, r, sizeof r, "token_embd.weight", "token_embd.weight"), "  W_e ∈ R^(d_e×N_V) = (%lld×%lld)", d, V);
    if (gpt2) row(t, PCOL, pname(g, r, sizeof r, "position_embd.weight", "position_embd.weight"), "  W_p ∈ R^(d_e×l_max) = (%lld×%lld)", d, C);
    tprintf(t, "  for l = 1..%lld (tensors blk.{0..%lld}.*):\n", L, L - 1);
    if (gpt2) {
        row(t, PCOL, pname(g, r, sizeof r, "attn_norm.{weight,bias}", "blk.0.attn_norm.weight"), "    γ₁, β₁ ∈ R^%lld", d);
        row(t, PCOL, pname(g, r, sizeof r, "attn_qkv.{weight,bias}", "blk.0.attn_qkv.weight"), "    W_qkv = (%lld×%lld), b_qkv", 3 * d, d);
        row(t, PCOL, pname(g, r, sizeof r, "attn_output.{weight,bias}", "blk.0.attn_output.weight"), "    W_o = (%lld×%lld), b_o", d, d);
        row(t, PCOL, pname(g, r, sizeof r, "ffn_norm.{weight,bias}", "blk.0.ffn_norm.weight"), "    γ₂, β₂ ∈ R^%lld", d);
        row(t, PCOL, pname(g, r, sizeof r, "ffn_up.{weight,bias}", "blk.0.ffn_up.weight"), "    W_up = (%lld×%lld), b_up", F, d);
        row(t, PCOL, pname(g, r, sizeof r, "ffn_down.{weight,bias}", "blk.0.ffn_down.weight"), "    W_down = (%lld×%lld), b_down", d, F);
        row(t, PCOL, pname(g, r, sizeof r, "output_norm.{weight,bias}", "output_norm.weight"), "  γ, β ∈ R^%lld", d);
    } else {
        if (!post_only) row(t, PCOL, pname(g, r, sizeof r, "attn_norm.weight", "blk.0.attn_norm.weight"), "    γ_att ∈ R^%lld", d);
        if (h->fused) { /* Phi-3: one product gives q, k and v */
            row(t, PCOL, pname(g, r, sizeof r, "attn_qkv.weight", "blk.0.attn_qkv.weight"),
                "    [W_q; W_k; W_v] = (%lld×%lld)", (H + 2 * K) * dh, d);
        } else {
            row(t, PCOL, pname(g, r, sizeof r, h->qkv_bias ? "attn_q.{weight,bias}" : "attn_q.weight", "blk.0.attn_q.weight"),
                "    W_q = (H·d_h×d_e) = (%lld×%lld)%s", H * dh, d, h->qkv_bias ? ", b_q" : "");
            row(t, PCOL, pname(g, r, sizeof r, h->qkv_bias ? "attn_{k,v}.{weight,bias}" : "attn_{k,v}.weight", "blk.0.attn_k.weight"),
                "    W_k, W_v = (H_kv·d_h×d_e) = (%lld×%lld)", K * dh, d);
        }
        if (h->qk_norm) row(t, PCOL, pname(g, r, sizeof r, "attn_{q,k}_norm.weight", "blk.0.attn_q_norm.weight"), "    γ_q, γ_k ∈ R^%lld", qk_full ? H * dh : dh);
        row(t, PCOL, pname(g, r, sizeof r, h->out_bias ? "attn_output.{weight,bias}" : "attn_output.weight",
                           "blk.0.attn_output.weight"), "    W_o = (d_e×H·d_h) = (%lld×%lld)%s", d, H * dh,
            h->out_bias ? ", b_o" : "");
        if (h->sinks) /* gpt-oss: a logit per query head that joins its softmax */
            row(t, PCOL, pname(g, r, sizeof r, "attn_sinks.weight", "blk.0.attn_sinks.weight"),
                "    s ∈ R^%lld (s_h: head h's sink logit)", H);
        if (gemma || post_only) {
            row(t, PCOL, pname(g, r, sizeof r, "post_attention_norm.weight", "blk.0.post_attention_norm.weight"), "    γ_post_att ∈ R^%lld", d);
            row(t, PCOL, pname(g, r, sizeof r, "post_ffw_norm.weight", "blk.0.post_ffw_norm.weight"), "    γ_post_ffn ∈ R^%lld", d);
        }
        if (h->mlp_norm_post_attn) /* gpt-oss: the MLP's norm, before it, under this name (no sandwich) */
            row(t, PCOL, pname(g, r, sizeof r, "post_attention_norm.weight", "blk.0.post_attention_norm.weight"),
                "    γ_ffn ∈ R^%lld (the MLP's norm, before it)", d);
        else if (!post_only) row(t, PCOL, pname(g, r, sizeof r, "ffn_norm.weight", "blk.0.ffn_norm.weight"), "    γ_ffn ∈ R^%lld", d);
        if (NE) {
            row(t, PCOL, pname(g, r, sizeof r, h->router_bias ? "ffn_gate_inp.{weight,bias}" : "ffn_gate_inp.weight",
                               "blk.0.ffn_gate_inp.weight"), "    W_r = (N_E×d_e) = (%lld×%lld)%s", NE, d,
                h->router_bias ? ", b_r" : "");
            row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up}_exps.weight", "blk.0.ffn_gate_exps.weight"), "    W_gate,e, W_up,e = (%lld×%lld), e ∈ [%lld]", FE, d, NE);
            if (h->exp_biases)
                row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up}_exps.bias", "blk.0.ffn_gate_exps.bias"),
                    "    b_gate,e, b_up,e ∈ R^%lld", FE);
            row(t, PCOL, pname(g, r, sizeof r, "ffn_down_exps.weight", "blk.0.ffn_down_exps.weight"), "    W_down,e = (%lld×%lld)", d, FE);
            if (h->exp_biases)
                row(t, PCOL, pname(g, r, sizeof r, "ffn_down_exps.bias", "blk.0.ffn_down_exps.bias"),
                    "    b_down,e ∈ R^%lld", d);
            if (FS) {
                row(t, PCOL, pname(g, r, sizeof r, "ffn_gate_inp_shexp.weight", "blk.0.ffn_gate_inp_shexp.weight"), "    w_s ∈ R^%lld", d);
                row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up,down}_shexp.weight", "blk.0.ffn_gate_shexp.weight"), "    W_gate,s, W_up,s = (%lld×%lld), W_down,s", FS, d);
            }
        } else if (h->fused) {
            row(t, PCOL, pname(g, r, sizeof r, "ffn_up.weight", "blk.0.ffn_up.weight"), "    [W_gate; W_up] = (2·%lld×%lld)", F, d);
            row(t, PCOL, pname(g, r, sizeof r, "ffn_down.weight", "blk.0.ffn_down.weight"), "    W_down = (%lld×%lld)", d, F);
        } else {
            row(t, PCOL, pname(g, r, sizeof r, "ffn_{gate,up}.weight", "blk.0.ffn_gate.weight"), "    W_gate, W_up = (%lld×%lld)", F, d);
            row(t, PCOL, pname(g, r, sizeof r, "ffn_down.weight", "blk.0.ffn_down.weight"), "    W_down = (%lld×%lld)", d, F);
        }
        row(t, PCOL, pname(g, r, sizeof r, "output_norm.weight", "output_norm.weight"), "  γ_f ∈ R^%lld", d);
    }
    if (h->tied) row(t, PCOL, "(tied: no output.weight)", "  W_u = W_eᵀ");
    else row(t, PCOL, pname(g, r, sizeof r, "output.weight", "output.weight"), "  W_u = (N_V×d_e) = (%lld×%lld)", V, d);
    if (h->has_rope_freqs) row(t, PCOL, pname(g, r, sizeof r, "rope_freqs.weight", "rope_freqs.weight"), "  ρ ∈ R^%lld (RoPE frequency divisors)", dh / 2);
    if (h->longrope)
        row(t, PCOL, pname(g, r, sizeof r, "rope_factors_{long,short}.weight", "rope_factors_long.weight"),
            "  ρ_long, ρ_short ∈ R^%lld (LongRoPE's divisors)", (long long)h->rot / 2);
    tprintf(t, "\n");
    int n = 1;
#define STEP(shape, ...) row(t, SCOL, shape, "%2d " __VA_ARGS__)
    if (gpt2) {
        snprintf(sh, sizeof sh, "X: (%lld×T)", d);
        STEP(sh, "for t ∈ [T]: X[:, t] ← W_e[:, x[t]] + W_p[:, t]", n++);
        STEP("", "for l = 1..%lld:", n++, L);
        snprintf(sh, sizeof sh, "(%lld×T)", d);
        STEP(sh, "  X̃ ← LayerNorm(X | γ₁, β₁)", n++);
        snprintf(sh, sizeof sh, "Q, K, V: (%lld×T) per head", dh);
        STEP(sh, "  [Q; K; V] ← W_qkv X̃ + b_qkv", n++);
        snprintf(sh, sizeof sh, "Y_h: (%lld×T)", dh);
        STEP(sh, "  for h ∈ [%lld]: Y_h ← V_h softmax(K_hᵀQ_h/√d_h + M)", n++, H);
        snprintf(sh, sizeof sh, "(%lld×T)", d);
        STEP(sh, "  X ← X + W_o [Y_1; …; Y_%lld] + b_o", n++, H);
        STEP(sh, "  X̃ ← LayerNorm(X | γ₂, β₂)", n++);
        snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
        STEP(sh, "  X ← X + W_down GELU(W_up X̃ + b_up) + b_down", n++);
        STEP("", "X ← LayerNorm(X | γ, β)", n++);
    } else {
        snprintf(sh, sizeof sh, "X: (%lld×T)", d);
        STEP(sh, "for t ∈ [T]: X[:, t] ← W_e[:, x[t]]%s", n++, gemma ? " · √d_e" : "");
        STEP("", "for l = 1..%lld:", n++, L);
        snprintf(sh, sizeof sh, "(%lld×T)", d);
        if (post_only) STEP(sh, "  X̃ ← X (no norm before attention)", n++);
        else STEP(sh, "  X̃ ← RMSNorm(X | γ_att)", n++);
        snprintf(sh, sizeof sh, "Q: %lld×(%lld×T), K,V: %lld×(%lld×T)", H, dh, K, dh);
        STEP(sh, "  Q ← W_q X̃%s; K ← W_k X̃%s; V ← W_v X̃%s", n++, h->qkv_bias ? " + b_q" : "",
             h->qkv_bias ? " + b_k" : "", h->qkv_bias ? " + b_v" : "");
        if (h->qk_norm && qk_full) STEP("each position", "  Q ← RMSNorm(Q | γ_q); K ← RMSNorm(K | γ_k)", n++);
        else if (h->qk_norm) STEP("per head", "  Q_h ← RMSNorm(Q_h | γ_q); K_g ← RMSNorm(K_g | γ_k)", n++);
        if (h->rope_base_swa > 0 && h->swa > 0 && h->rope_base_swa == h->rope_base) /* OLMo 3 */
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ%s); K ← RoPE(K, θ%s), unscaled where l slides", n++,
                 h->has_rope_freqs ? ", ρ" : "", h->has_rope_freqs ? ", ρ" : "");
        else if (h->rope_base_swa > 0 && h->swa > 0)
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ_l%s); K ← RoPE(K, θ_l%s), θ_l = %g where l slides", n++,
                 h->has_rope_freqs ? ", ρ" : "", h->has_rope_freqs ? ", ρ" : "", h->rope_base_swa);
        else if (h->nope_period > 0) /* llama.cpp's SmolLM3: no rotation on every fourth layer */
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ%s); K ← RoPE(K, θ%s) unless %lld | l (no position there)",
                 n++, h->has_rope_freqs ? ", ρ" : "", h->has_rope_freqs ? ", ρ" : "", (long long)h->nope_period);
        else if (h->longrope || h->rot < dh) { /* Phi-3: partial rotary, LongRoPE's divisors and magnitude */
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ%s); K ← RoPE(K, θ%s)", n++, h->longrope ? ", ρ" : "",
                 h->longrope ? ", ρ" : "");
            if (h->rot < dh) row(t, SCOL, "", "       on the first %lld of each head's %lld dims", (long long)h->rot, dh);
            if (h->longrope)
                row(t, SCOL, "", "       ρ = ρ_long for a context past %lld, else ρ_short", (long long)h->rope_orig);
            if (h->rope_attn > 0 && h->rope_attn != 1) row(t, SCOL, "", "       cos and sin × %g", h->rope_attn);
        } else if (h->yarn) { /* gpt-oss: YaRN's frequencies and magnitude, on halves (NeoX) */
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ%s); K ← RoPE(K, θ%s), YaRN ×%g past %lld", n++,
                 h->has_rope_freqs ? ", ρ" : "", h->has_rope_freqs ? ", ρ" : "", h->rope_factor, (long long)h->rope_orig);
            row(t, SCOL, "", "       on pairs (i, i + %lld) of a head: frequency θ^(−2i/%lld) for i ≤ %g, ÷ %g for i ≥ %g,",
                (long long)h->rot / 2, (long long)h->rot, h->yarn_lo, h->rope_factor, h->yarn_hi);
            if (h->rope_attn > 0) row(t, SCOL, "", "       a linear ramp between; cos and sin × %.4g", h->rope_attn);
            else row(t, SCOL, "", "       a linear ramp between; cos and sin × %.4g (1 + 0.1 ln %g)",
                     1 + 0.1 * log(h->rope_factor), h->rope_factor);
        } else
            STEP("position t turns pairs", "  Q ← RoPE(Q, θ%s); K ← RoPE(K, θ%s)", n++, h->has_rope_freqs ? ", ρ" : "",
                 h->has_rope_freqs ? ", ρ" : "");
        if (h->attn_temp > 0) /* Llama 4's temperature, as Ministral 3 takes it */
            STEP("each position t", "  Q[:, t] ← Q[:, t] · (1 + %g ln(1 + ⌊t / %lld⌋))", n++, h->attn_temp,
                 (long long)h->rope_orig);
        STEP("S: (T×T)", "  for h ∈ [%lld], g = ⌊h·H_kv/H⌋: S ← K_gᵀ Q_h / √d_h", n++, H);
        if (h->attn_cap > 0) STEP("", "    S ← %g·tanh(S/%g)", n++, h->attn_cap, h->attn_cap);
        /* the window is part of the mask M. Of each P layers the last attends globally: Gemma 2's P = 2 has
         * blk.0, blk.2, ... slide (0-based even, as src/models/llama.c and llama.cpp's set_swa_pattern(2) have
         * it), i.e. l = 1, 3, ... here; Gemma 3's P = 6 all but l = 6, 12, ... */
        const long long P = h->swa_period;
        char mask[96];
        if (h->swa > 0 && P == 2)
            snprintf(mask, sizeof mask, "M causal; window %lld for odd l (blk.0, 2, …)", (long long)h->swa);
        else if (h->swa > 0 && P > 2)
            snprintf(mask, sizeof mask, "M causal; window %lld unless %lld | l", (long long)h->swa, P);
        else if (h->swa > 0 && P < 0) /* a per-layer list no period gives */
            snprintf(mask, sizeof mask, "M causal; window %lld on some l, in no period", (long long)h->swa);
        else if (h->swa > 0 && P != 1)
            snprintf(mask, sizeof mask, "M causal, window %lld", (long long)h->swa);
        else snprintf(mask, sizeof mask, "M causal");
        if (h->sinks) { /* gpt-oss: head h's sink joins each column's softmax as one more key, of value 0 */
            snprintf(sh, sizeof sh, "A: ((T+1)×T), %s", mask);
            STEP(sh, "    A ← softmax([S + M; s_h 1ᵀ])", n++);
            snprintf(sh, sizeof sh, "Y_h: (%lld×T), the sink's row dropped", dh);
            STEP(sh, "    Y_h ← V_g A[1:T, :]", n++);
        } else {
            snprintf(sh, sizeof sh, "Y_h: (%lld×T), %s", dh, mask);
            STEP(sh, "    Y_h ← V_g softmax(S + M)", n++);
        }
        snprintf(sh, sizeof sh, "(%lld×T)", d);
        if (post_only) {
            STEP(sh, "  X ← X + RMSNorm(W_o [Y_1; …; Y_%lld] | γ_post_att)", n++, H);
            snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
            STEP(sh, "  X ← X + RMSNorm(W_down(SiLU(W_gate X) ⊙ W_up X) | γ_post_ffn)", n++);
        } else if (gemma) {
            STEP(sh, "  X ← X + RMSNorm(W_o [Y_1; …; Y_%lld] | γ_post_att)", n++, H);
            STEP(sh, "  X̃ ← RMSNorm(X | γ_ffn)", n++);
            snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
            STEP(sh, "  X ← X + RMSNorm(W_down(GELU(W_gate X̃) ⊙ W_up X̃) | γ_post_ffn)", n++);
        } else {
            STEP(sh, "  X ← X + W_o [Y_1; …; Y_%lld]%s", n++, H, h->out_bias ? " + b_o" : "");
            STEP(sh, "  X̃ ← RMSNorm(X | γ_ffn)", n++);
            const double lim = h->swiglu_limit, alpha = TOY_LLAMA_OAI_ALPHA; /* gpt-oss's clamped SwiGLU */
            if (NE) {
                snprintf(sh, sizeof sh, "p: (%lld×T)", NE);
                STEP(sh, "  P ← softmax(W_r X̃%s); for t ∈ [T]: E_t ← the %lld largest of P[:, t]", n++,
                     h->router_bias ? " + b_r" : "", NK);
                if (toy_llama_moe_renormalises(h->arch))
                    STEP("", "    w_t,e ← P[e, t] / Σ_{e' ∈ E_t} P[e', t]", n++);
                else STEP("", "    w_t,e ← P[e, t]", n++);
                if (lim > 0) {
                    const char *bg = h->exp_biases ? " + b_gate,e" : "", *bu = h->exp_biases ? " + b_up,e" : "";
                    snprintf(sh, sizeof sh, "(%lld×1)", FE);
                    STEP(sh, "  for t ∈ [T], e ∈ E_t: g_t,e ← min(W_gate,e x̃_t%s, %g); u_t,e ← clamp(W_up,e x̃_t%s, "
                         "−%g, %g)", n++, bg, lim, bu, lim, lim);
                }
                snprintf(sh, sizeof sh, "(%lld×1) → (%lld×1), %lld of %lld", FE, d, NK, NE);
                if (lim > 0 && h->exp_biases)
                    STEP(sh, "  X[:, t] ← X[:, t] + Σ_{e ∈ E_t} w_t,e (W_down,e (g_t,e ⊙ σ(%g g_t,e) ⊙ (u_t,e + 1)) "
                         "+ b_down,e)", n++, alpha);
                else if (lim > 0)
                    STEP(sh, "  X[:, t] ← X[:, t] + Σ_{e ∈ E_t} w_t,e W_down,e (g_t,e ⊙ σ(%g g_t,e) ⊙ (u_t,e + 1))",
                         n++, alpha);
                else STEP(sh, "  X[:, t] ← X[:, t] + Σ_{e ∈ E_t} w_t,e W_down,e (SiLU(W_gate,e x̃_t) ⊙ W_up,e x̃_t)", n++);
                if (FS) {
                    snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", FS, d);
                    STEP(sh, "  X ← X + σ(w_sᵀ X̃) ⊙ W_down,s (SiLU(W_gate,s X̃) ⊙ W_up,s X̃)", n++);
                }
            } else if (lim > 0) {
                snprintf(sh, sizeof sh, "(%lld×T)", F);
                STEP(sh, "  G ← min(W_gate X̃, %g); U ← clamp(W_up X̃, −%g, %g)", n++, lim, lim, lim);
                snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
                STEP(sh, "  X ← X + W_down (G ⊙ σ(%g G) ⊙ (U + 1))", n++, alpha);
            } else {
                snprintf(sh, sizeof sh, "(%lld×T) → (%lld×T)", F, d);
                STEP(sh, "  X ← X + W_down (SiLU(W_gate X̃) ⊙ W_up X̃)", n++);
            }
        }
        STEP("", "X ← RMSNorm(X | γ_f)", n++);
    }
    snprintf(sh, sizeof sh, "(%lld×T)", V);
    if (h->final_cap > 0) STEP(sh, "Z ← %g·tanh(W_u X / %g)", n++, h->final_cap, h->final_cap);
    else STEP(sh, "Z ← W_u X", n++);
    STEP(sh, "return P = softmax(Z)", n);
#undef STEP
    tprintf(t, "%s(x | γ) = x ⊙ γ / √(mean(x²) + ε)%s\n", gpt2 ? "LayerNorm(x | γ, β) = (x − mean x) ⊙ γ / √(var x + ε) + β;  RMSNorm" : "RMSNorm",
            gemma ? "  (GGUF stores Gemma's γ as 1 + w)" : "");
    if (h->mlp_norm_post_attn) /* gpt-oss */
        tprintf(t, "γ_ffn is the MLP's norm, before it: gpt-oss stores it as post_attention_norm (no norm follows "
                   "attention)\n");
    if (h->sinks)
        tprintf(t, "s_h: head h's sink, one more key in each column's softmax, of value 0: the weights on the "
                   "positions sum to less than 1\n");
    if (h->swiglu_limit > 0)
        tprintf(t, "σ(x) = 1 / (1 + e^(−x)); the clamped SwiGLU's limit %g and α = %g are gpt-oss's, fixed (no GGUF "
                   "key)\n",
                h->swiglu_limit, (double)TOY_LLAMA_OAI_ALPHA);
}

struct type_row {
    int64_t tensors, elements;
    uint64_t bytes;
};

static void human(char *buf, size_t n, double v) {
    const char *sfx[] = {"", "K", "M", "G", "T"};
    int k = 0;
    while (v >= 1000 && k < 4) { v /= 1000; k++; }
    snprintf(buf, n, k ? "%.2f%s" : "%.0f%s", v, sfx[k]);
}

static const char *tok_piece(const struct toy_gguf *g, int64_t toks, int64_t id, char *buf, size_t n) {
    if (toks < 0 || id < 0 || (uint64_t)id >= toy_gguf_arr_len(g, toks)) return "?";
    size_t len;
    const char *s = toy_gguf_arr_str(g, toks, (uint64_t)id, &len);
    snprintf(buf, n, "%.*s", (int)(len > 40 ? 40 : len), s);
    return buf;
}

/* JSON has no NaN or infinity: such a value (a broken file's) becomes null rather than losing its object */
static json_t *num_or_null(double x) { return isfinite(x) ? json_real(x) : json_null(); }
static json_t *int_or_null(bool has, int64_t v) { return has ? json_integer((json_int_t)v) : json_null(); }

/* "name 42, " or "name ?, " (the key is not in the file, or not a number there (bad): its name goes to
 * *missing unless bad, which has its own line) */
static void dim(char *buf, size_t n, const char *label, bool has, bool bad, long long v, char *missing, size_t mn) {
    size_t k = strlen(buf);
    if (has) snprintf(buf + k, n - k, "%s %lld, ", label, v);
    else {
        snprintf(buf + k, n - k, "%s ?, ", label);
        if (bad) return;
        k = strlen(missing);
        snprintf(missing + k, mn - k, "%s%s", k ? ", " : "", label);
    }
}

int toy_cmd_describe(int argc, char **argv) {
    const char *q = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (argv[i][0] != '-' && !q) q = argv[i];
        else q = NULL, i = argc;
    }
    bool help = toy_cli_wants_help(argc, argv);
    if (!q || help) {
        fprintf(help ? stdout : stderr, "usage: toy describe <model.gguf|NAME> [--json]\n"
                        "Architecture, dimensions, parameters, file type, bytes per tensor type, tokenizer,\n"
                        "and the forward pass as annotated pseudocode.\n");
        return help ? 0 : 2;
    }
    char path[4096];
    struct toy_gguf *g;
    if (toy_model_resolve(q, path, sizeof path) || toy_gguf_open(path, &g)) {
        fprintf(stderr, "toy describe: %s\n", toy_last_error());
        return 1;
    }
    const char *what;
    if (!toy_gguf_is_model(g, &what)) { /* not a network to describe */
        const char *arch = "";
        size_t al = 0;
        toy_gguf_get_str(g, "general.architecture", &arch, &al);
        if (json) {
            json_t *j = json_pack("{s:o,s:o,s:s,s:I}", "path", toy_cli_json_text(path, strlen(path)), "architecture",
                                  toy_cli_json_text(arch, al), "kind", what,
                                  "tensors", (json_int_t)toy_gguf_n_tensors(g));
            toy_gguf_close(g);
            return toy_cli_print_json("describe", j, JSON_INDENT(2));
        }
        if (al) printf("%s: %s; architecture %.*s, %lld tensors\n", path, what, (int)al, arch,
                       (long long)toy_gguf_n_tensors(g));
        else printf("%s: %s; %lld tensors\n", path, what, (long long)toy_gguf_n_tensors(g));
        toy_gguf_close(g);
        return 0;
    }
    struct hp h;
    read_hp(g, &h);
    uint32_t ft = UINT32_MAX;
    toy_gguf_get_u32(g, "general.file_type", &ft);
    struct type_row rows[TOY_DTYPE_COUNT] = {{0}};
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        rows[t->type].tensors++;
        rows[t->type].elements += t->n_elements;
        rows[t->type].bytes += t->nbytes;
    }
    /* tokenizer */
    const char *tmodel = NULL, *tpre = NULL, *tmpl = NULL;
    toy_gguf_get_str(g, "tokenizer.ggml.model", &tmodel, NULL);
    toy_gguf_get_str(g, "tokenizer.ggml.pre", &tpre, NULL);
    size_t tmpl_len = 0;
    toy_gguf_get_str(g, "tokenizer.chat_template", &tmpl, &tmpl_len);
    char *tmpl_z = tmpl ? strndup(tmpl, tmpl_len) : NULL;
    struct toy_chat_syntax syn = toy_chat_syntax_detect(tmpl_z);
    free(tmpl_z);
    int64_t toks = -1, merges = -1;
    uint64_t n_toks = 0, n_merges = 0;
    if (toy_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, NULL, &n_toks)) toks = -1;
    if (toy_gguf_get_arr(g, "tokenizer.ggml.merges", &merges, NULL, &n_merges)) merges = -1;
    int64_t bos = -1, eos = -1;
    toy_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &bos);
    toy_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &eos);
    struct text c = {0};
    card(g, &h, &c);

    int rc = 0;
    if (json) {
        json_t *o = json_object();
        /* paths and the file's strings need not be UTF-8: json_string() would be NULL and the key dropped */
        json_object_set_new(o, "path", toy_cli_json_text(path, strlen(path)));
        json_object_set_new(o, "architecture", toy_cli_json_text(h.arch, strlen(h.arch)));
        json_object_set_new(o, "name", toy_cli_json_text(h.name, strlen(h.name)));
        json_object_set_new(o, "file_size", json_integer((json_int_t)toy_gguf_file_size(g)));
        json_object_set_new(o, "gguf_version", json_integer(toy_gguf_version(g)));
        json_object_set_new(o, "alignment", json_integer((json_int_t)toy_gguf_alignment(g)));
        json_object_set_new(o, "n_kv", json_integer(toy_gguf_n_kv(g)));
        json_object_set_new(o, "n_tensors", json_integer(toy_gguf_n_tensors(g)));
        json_object_set_new(o, "params", json_integer(h.n_params));
        json_object_set_new(o, "file_type", ft == UINT32_MAX ? json_null() : json_integer(ft));
        json_object_set_new(o, "file_type_name", json_string(toy_file_type_name(ft)));
        /* GPT-2, BERT and ViT have learned positions, no RoPE */
        bool rope = strcmp(h.arch, "gpt2") != 0 && strcmp(h.arch, "bert") != 0 && !h.vit;
        /* null: not in the file */
        json_object_set_new(o, "hparams", json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
            "embedding_length", int_or_null(h.has_d, h.d), "block_count", int_or_null(h.has_L, h.L),
            "head_count", int_or_null(h.has_H, h.H), "head_count_kv", int_or_null(h.has_H, h.Hkv),
            "head_dim", int_or_null(h.has_H && h.dh, h.dh), "feed_forward_length", int_or_null(h.has_dff, h.dff),
            "context_length", int_or_null(h.has_ctx, h.ctx), "vocab_size", int_or_null(h.has_vocab, h.vocab),
            "norm_eps", h.has_eps ? num_or_null(h.eps) : json_null(),
            "rope_freq_base", rope && h.has_rope_base ? num_or_null(h.rope_base) : json_null(),
            "tied_embeddings", h.n_tensors && strcmp(h.arch, "bert") ? json_boolean(h.tied) : json_null()));
        if (h.pooling > 0 && h.pooling <= TOY_POOLING_RANK)
            json_object_set_new(o, "pooling", json_string(toy_pooling_name((enum toy_pooling)h.pooling)));
        if (h.kv_rank) /* DeepSeek's latent attention: head_dim above is the keys' (unrotated + rotated) */
            json_object_set_new(o, "latent_attention", json_pack("{s:I, s:I, s:I, s:I}", "kv_lora_rank",
                                                                 (json_int_t)h.kv_rank, "q_lora_rank", (json_int_t)h.q_rank,
                                                                 "rope_dim", (json_int_t)h.rope_dim, "value_head_dim",
                                                                 (json_int_t)h.dv));
        if (!h.kv_rank && (h.rot < h.dh || h.longrope)) /* Phi-3: partial rotary, LongRoPE */
            json_object_set_new(o, "rope", json_pack("{s:I, s:o, s:o}", "rotated_dims", (json_int_t)h.rot,
                                                     "longrope_original_context",
                                                     h.longrope ? json_integer((json_int_t)h.rope_orig) : json_null(),
                                                     "attn_factor", h.rope_attn > 0 ? json_real(h.rope_attn) : json_null()));
        if (h.experts && h.dense_lead)
            json_object_set_new(o, "leading_dense_layers", json_integer((json_int_t)h.dense_lead));
        if (h.experts)
            json_object_set_new(o, "experts", json_pack("{s:I, s:I, s:I, s:I}", "count", (json_int_t)h.experts, "used",
                                                        (json_int_t)h.experts_used, "feed_forward_length",
                                                        (json_int_t)(h.dff_exp ? h.dff_exp : h.dff),
                                                        "shared_feed_forward_length", (json_int_t)h.dff_shared));
        if (!strcmp(h.arch, "gpt-oss")) { /* what the card draws of gpt-oss's own (null: not in the file) */
            json_t *oss = json_object();
            json_object_set_new(oss, "attention_sinks", json_boolean(h.sinks));
            json_object_set_new(oss, "attention_output_bias", json_boolean(h.out_bias));
            json_object_set_new(oss, "router_bias", json_boolean(h.router_bias));
            json_object_set_new(oss, "expert_biases", json_boolean(h.exp_biases));
            json_object_set_new(oss, "swiglu_limit", json_real(h.swiglu_limit));
            json_object_set_new(oss, "swiglu_alpha", /* 1.702, not the float's 1.70200002 */
                                json_real(round(1e6 * (double)TOY_LLAMA_OAI_ALPHA) / 1e6));
            json_object_set_new(oss, "mlp_norm", json_string("post_attention_norm.weight"));
            json_object_set_new(oss, "sliding_window", h.swa > 0 ? json_integer((json_int_t)h.swa) : json_null());
            json_object_set_new(oss, "sliding_window_period",
                                h.swa > 0 ? json_integer((json_int_t)h.swa_period) : json_null());
            json_object_set_new(oss, "rope_scaling", h.yarn ? json_string("yarn") : json_null());
            json_object_set_new(oss, "rope_scaling_factor", h.yarn ? num_or_null(h.rope_factor) : json_null());
            json_object_set_new(oss, "rope_original_context",
                                h.yarn ? json_integer((json_int_t)h.rope_orig) : json_null());
            json_object_set_new(o, "gpt_oss", oss);
        }
        if (h.vit)
            json_object_set_new(o, "vit", json_pack("{s:I, s:I, s:I, s:I, s:I}", "image_height", (json_int_t)h.img_h,
                                                    "image_width", (json_int_t)h.img_w, "channels",
                                                    (json_int_t)h.channels, "patch_size", (json_int_t)h.patch,
                                                    "class_count", (json_int_t)h.classes));
        json_t *types = json_array();
        for (int t = 0; t < TOY_DTYPE_COUNT; t++) {
            if (!rows[t].tensors) continue;
            json_array_append_new(types, json_pack("{s:s, s:I, s:I, s:I, s:f}", "type", toy_dtype_name((enum toy_dtype)t),
                "tensors", (json_int_t)rows[t].tensors, "elements", (json_int_t)rows[t].elements,
                "bytes", (json_int_t)rows[t].bytes,
                "bits_per_weight", rows[t].elements ? 8.0 * (double)rows[t].bytes / (double)rows[t].elements : 0.0));
        }
        json_object_set_new(o, "tensor_types", types);
        json_t *bad = json_object(); /* key: its stored type, for hyperparameters that are not numbers */
        for (int i = 0; i < h.n_bad; i++)
            json_object_set_new(bad, h.bad[i].key, json_string(h.bad[i].type));
        json_object_set_new(o, "hparams_wrong_type", bad);
        json_t *tk = json_object();
        json_object_set_new(tk, "model", tmodel ? toy_cli_json_text(tmodel, strlen(tmodel)) : json_null());
        json_object_set_new(tk, "pre", tpre ? toy_cli_json_text(tpre, strlen(tpre)) : json_null());
        json_object_set_new(tk, "tokens", json_integer((json_int_t)n_toks));
        json_object_set_new(tk, "merges", json_integer((json_int_t)n_merges));
        json_object_set_new(tk, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
        json_object_set_new(tk, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
        json_object_set_new(tk, "chat_template", json_boolean(tmpl != NULL));
        if (tmpl) /* how its chat replies are split (toy/chat-reply.h) */
            json_object_set_new(tk, "chat_replies", json_pack("{s:s,s:b}", "format", toy_chat_format_name(syn.format),
                                                               "think", syn.think));
        json_object_set_new(o, "tokenizer", tk);
        json_object_set_new(o, "algorithm", toy_cli_json_text(c.s, c.s ? strlen(c.s) : 0));
        rc = toy_cli_print_json("describe", o, JSON_INDENT(2));
    } else {
        char p[32], sz[32];
        human(p, sizeof p, (double)h.n_params);
        human(sz, sizeof sz, (double)toy_gguf_file_size(g));
        printf("%s\n", path);
        printf("  architecture   %s%s%s%s\n", h.arch, *h.name ? " (" : "", h.name, *h.name ? ")" : "");
        printf("  parameters     %s (%lld)\n", p, (long long)h.n_params);
        printf("  file           %sB, GGUF v%u, %lld KV, %lld tensors, alignment %zu\n", sz, toy_gguf_version(g),
               (long long)toy_gguf_n_kv(g), (long long)toy_gguf_n_tensors(g), toy_gguf_alignment(g));
        printf("  file type      %s\n", toy_file_type_name(ft));
        /* only what the file says; "?" and a "not in the file" line for the keys it lacks */
        char l1[256] = "", l2[256] = "", missing[256] = "";
        dim(l1, sizeof l1, "d_model", h.has_d, is_bad(&h, "embedding_length"), h.d, missing, sizeof missing);
        dim(l1, sizeof l1, "layers", h.has_L, is_bad(&h, "block_count"), h.L, missing, sizeof missing);
        if (h.has_H) {
            size_t k = strlen(l1);
            snprintf(l1 + k, sizeof l1 - k, "heads %lld (kv %lld, head dim %lld), ", (long long)h.H, (long long)h.Hkv,
                     (long long)h.dh);
            if (!h.kv_rank && h.rot < h.dh) /* partial rotary */
                snprintf(l1 + k, sizeof l1 - k, "heads %lld (kv %lld, head dim %lld, %lld rotated), ", (long long)h.H,
                         (long long)h.Hkv, (long long)h.dh, (long long)h.rot);
        } else dim(l1, sizeof l1, "heads", false, is_bad(&h, "attention.head_count"), 0, missing, sizeof missing);
        if (h.kv_rank) { /* latent attention: the keys' and values' head dims differ, and the cache holds the latent */
            size_t k = strlen(l1);
            snprintf(l1 + k, sizeof l1 - k, "latent attention (kv rank %lld, q rank %lld, value head dim %lld, rope "
                     "dims %lld), ", (long long)h.kv_rank, (long long)h.q_rank, (long long)h.dv, (long long)h.rope_dim);
        }
        dim(l1, sizeof l1, "d_ff", h.has_dff, is_bad(&h, "feed_forward_length"), h.dff, missing, sizeof missing);
        if (h.experts && h.dense_lead) {
            size_t k = strlen(l1);
            snprintf(l1 + k, sizeof l1 - k, "%lld dense layer%s first, ", (long long)h.dense_lead,
                     h.dense_lead == 1 ? "" : "s");
        }
        if (h.experts) {
            size_t k = strlen(l1);
            char ff[80] = "";
            if (h.dff_exp) snprintf(ff, sizeof ff, ", d_ff %lld", (long long)h.dff_exp);
            if (h.dff_shared)
                snprintf(ff + strlen(ff), sizeof ff - strlen(ff), ", a shared one of d_ff %lld", (long long)h.dff_shared);
            snprintf(l1 + k, sizeof l1 - k, "experts %lld (%lld a token%s), ", (long long)h.experts,
                     (long long)h.experts_used, ff);
        }
        if (h.vit) { /* images and classes, not tokens */
            snprintf(l2, sizeof l2, "image %lldx%lldx%lld, patch %lld, %lld classes, ", (long long)h.img_h,
                     (long long)h.img_w, (long long)h.channels, (long long)h.patch, (long long)h.classes);
        } else {
            dim(l2, sizeof l2, "context", h.has_ctx, is_bad(&h, "context_length"), h.ctx, missing, sizeof missing);
            dim(l2, sizeof l2, "vocab", h.has_vocab, is_bad(&h, "vocab_size"), h.vocab, missing, sizeof missing);
        }
        size_t k = strlen(l2);
        /* the key found names the norm: RMSNorm's or LayerNorm's epsilon */
        if (h.has_eps) snprintf(l2 + k, sizeof l2 - k, "%s %g, ", h.eps_rms ? "rms eps" : "ln eps", h.eps);
        else dim(l2, sizeof l2, "norm eps", false,
                 is_bad(&h, "attention.layer_norm_rms_epsilon") || is_bad(&h, "attention.layer_norm_epsilon"), 0,
                 missing, sizeof missing);
        k = strlen(l2);
        if (h.has_rope_base) snprintf(l2 + k, sizeof l2 - k, "rope base %g, ", h.rope_base);
        else if (is_bad(&h, "rope.freq_base")) snprintf(l2 + k, sizeof l2 - k, "rope base ?, ");
        else if (strcmp(h.arch, "gpt2") && strcmp(h.arch, "bert") && !h.vit) { /* learned positions, no RoPE */
            k = strlen(missing);
            snprintf(missing + k, sizeof missing - k, "%srope base", k ? ", " : "");
        }
        k = strlen(l2);
        if (h.longrope) snprintf(l2 + k, sizeof l2 - k, "LongRoPE past %lld, ", (long long)h.rope_orig);
        k = strlen(l2);
        if (h.attn_temp > 0) snprintf(l2 + k, sizeof l2 - k, "query temperature %g, ", h.attn_temp);
        k = strlen(l2);
        if (h.rope_attn > 0 && h.rope_attn != 1) snprintf(l2 + k, sizeof l2 - k, "rope attn factor %g, ", h.rope_attn);
        k = strlen(l2);
        if (h.yarn) snprintf(l2 + k, sizeof l2 - k, "YaRN ×%g past %lld, ", h.rope_factor, (long long)h.rope_orig);
        k = strlen(l2);
        if (h.sinks) snprintf(l2 + k, sizeof l2 - k, "attention sinks, ");
        k = strlen(l2);
        if (h.n_tensors && h.tied) snprintf(l2 + k, sizeof l2 - k, "tied embeddings, ");
        l1[strlen(l1) - 2] = 0;
        if (strlen(l2) > 2) l2[strlen(l2) - 2] = 0;
        printf("  dimensions     %s,\n                 %s\n", l1, l2);
        if (*missing) printf("                 not in the file: %s\n", missing);
        if (h.pooling > 0 && h.pooling <= TOY_POOLING_RANK)
            printf("  embeddings     %s pooling%s\n", toy_pooling_name((enum toy_pooling)h.pooling),
                   h.pooling == TOY_POOLING_RANK ? " (a reranker: toy serve embeds it only with --pooling)" : "");
        for (int i = 0; i < h.n_bad; i++)
            printf("  wrong type     %s: %s, not a number (toy, as llama.cpp, refuses to run the file)\n",
                   h.bad[i].key, h.bad[i].type);
        if (!h.n_tensors) printf("  tensor types   none: the file holds no tensors (vocabulary only)\n");
        else printf("  tensor types   %-6s %8s %14s %12s %8s\n", "type", "tensors", "params", "bytes", "bits/w");
        for (int t = 0; t < TOY_DTYPE_COUNT; t++) {
            if (!rows[t].tensors) continue;
            char e[32], b[32];
            human(e, sizeof e, (double)rows[t].elements);
            human(b, sizeof b, (double)rows[t].bytes);
            printf("                 %-6s %8lld %14s %11sB %8.2f\n", toy_dtype_name((enum toy_dtype)t),
                   (long long)rows[t].tensors, e, b,
                   rows[t].elements ? 8.0 * (double)rows[t].bytes / (double)rows[t].elements : 0.0);
        }
        if (tmodel || toks >= 0) {
            char b1[64], b2[64];
            printf("  tokenizer      %s%s%s%s, %llu tokens, %llu merges\n", tmodel ? tmodel : "?",
                   tpre ? " (pre " : "", tpre ? tpre : "", tpre ? ")" : "", (unsigned long long)n_toks,
                   (unsigned long long)n_merges);
            if (bos >= 0) printf("                 bos %lld %s", (long long)bos, tok_piece(g, toks, bos, b1, sizeof b1));
            else printf("                 no bos");
            if (eos >= 0) printf(", eos %lld %s", (long long)eos, tok_piece(g, toks, eos, b2, sizeof b2));
            printf(", chat template %s", tmpl ? "yes" : "no");
            if (tmpl && (syn.think || syn.format))
                printf(" (replies: %s%s%s%s)", syn.think ? "reasoning in <think>" : "", syn.think && syn.format ? ", " : "",
                       syn.format ? "tool calls " : "", syn.format ? toy_chat_format_name(syn.format) : "");
            printf("\n");
        } else {
            printf("  tokenizer      none in this file\n");
        }
        printf("\n%s", c.s ? c.s : "");
    }
    free(c.s);
    toy_gguf_close(g);
    return rc;
}
