/* llama-gguf.c: Llama-family models to and from GGUF, in llama.cpp's
 * conventions (tensor names, `<arch>.*` metadata keys, dims innermost
 * first). The architecture comes from general.architecture; the family
 * flags from tensor presence (attn_q.bias: QKV bias; attn_q_norm: QK-norm;
 * post_attention_norm: sandwich norms; no output.weight: tied head), as the
 * earlier toy did, because general.architecture alone is not reliable.
 * Keys: llama.cpp's gguf-py constants (LLM_KV_*). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/gguf-model.h"
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/quant.h"

struct toy_llama *toy_llama_alloc(const struct toy_llama_config *cfg, bool alloc_data);

static bool has_tensor(const struct toy_gguf *g, const char *name) { return toy_gguf_find_tensor(g, name) >= 0; }

/* The architecture's keys (arch.suffix): key_int and key_float read an
 * absent key as its default. A key present with another type (a string, an
 * array, a float where a count belongs) reads as its default too, but the
 * first such error is kept, with its message naming the key and its type,
 * and the load fails with it (as llama.cpp's loader does) rather than run
 * with the default's rope base or context. */
struct keys {
    const struct toy_gguf *g;
    const char *arch;
    enum toy_status st;
    char err[320];
};

static int64_t key_find(struct keys *k, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", k->arch, suffix);
    return k->st ? -1 : toy_gguf_find_key(k->g, key);
}

static void key_failed(struct keys *k, enum toy_status st) {
    k->st = st;
    snprintf(k->err, sizeof k->err, "%s", toy_last_error());
}

static int64_t key_int(struct keys *k, const char *suffix, int64_t def) {
    int64_t i = key_find(k, suffix), v;
    if (i < 0) return def;
    enum toy_status st = toy_gguf_kv_int(k->g, i, &v);
    if (st) key_failed(k, st);
    return st ? def : v;
}

static double key_float(struct keys *k, const char *suffix, double def) {
    int64_t i = key_find(k, suffix);
    double v;
    if (i < 0) return def;
    enum toy_status st = toy_gguf_kv_float(k->g, i, &v);
    if (st) key_failed(k, st);
    return st ? def : v;
}

bool toy_llama_arch_known(const char *arch) {
    static const char *const archs[] = {"llama",   "mistral",  "mistral3", "ernie4_5", "qwen2",    "qwen3",
                                        "gemma2",  "gemma3",   "smollm3",  "olmo2",    "granite",  "phi3",
                                        "qwen2moe", "qwen3moe", "olmoe",   "deepseek2", "gpt-oss"};
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(arch, archs[i])) return true;
    return false;
}

bool toy_llama_moe_renormalises(const char *arch) { return strcmp(arch, "olmoe") && strcmp(arch, "qwen2moe"); }

struct toy_llama_arch_rules toy_llama_arch_rules(const char *arch) {
    struct toy_llama_arch_rules r = {0};
    if (!strcmp(arch, "gemma2")) r.swa_period = 2;
    if (!strcmp(arch, "gemma3")) r.swa_period = 6, r.rope_base_swa = 10000.0f;
    if (!strcmp(arch, "smollm3")) r.nope_period = 4;
    if (!strcmp(arch, "olmo2")) r.swa_period = 4, r.swa_base_global = true; /* OLMo 3 */
    if (!strcmp(arch, "gpt-oss")) r.swa_period = 2, r.ffn_norm_post_attn = true;
    return r;
}

int64_t toy_llama_gemma_query_scalar(const char *arch, int64_t n_layers, int64_t d_model, int64_t n_heads,
                                      int64_t head_dim) {
    /* llama.cpp (load_hparams): the 27Bs, Gemma 2's of 46 layers and Gemma 3's of 62, scale by
     * 1/sqrt(n_embd/n_head) (their query_pre_attn_scalar: 144, 168), not by their head dim (128) */
    bool big = n_layers == (!strcmp(arch, "gemma2") ? 46 : 62) && n_heads > 0;
    return big ? d_model / n_heads : head_dim;
}

float toy_llama_swa_base_default(const char *arch, int64_t sliding_window, float rope_base) {
    const struct toy_llama_arch_rules r = toy_llama_arch_rules(arch);
    return r.swa_base_global && sliding_window > 0 ? rope_base : r.rope_base_swa;
}

int32_t toy_llama_swa_period_of(const bool *slides, int64_t n, int64_t *bad) {
    int64_t p = 0;
    while (p < n && slides[p]) p++;
    p = p < n ? p + 1 : 0;
    for (int64_t l = 0; p && l < n; l++)
        if (!slides[l] != (l % p == p - 1)) {
            if (bad) *bad = l;
            return -1;
        }
    return (int32_t)p;
}

bool toy_llama_moe_own_ff_key(const char *arch) {
    return !strcmp(arch, "qwen2moe") || !strcmp(arch, "qwen3moe") || !strcmp(arch, "deepseek2") ||
           !strcmp(arch, "gpt-oss");
}

/* DeepSeek-V2/V3 (general.architecture deepseek2, llama.cpp's keys): latent
 * attention, leading dense layers, ungated shared experts, and the routing
 * llama.cpp reads from keys rather than from the architecture */
static enum toy_status deepseek2_config(const struct toy_gguf *g, struct keys *k, struct toy_llama_config *c) {
    const char *path = toy_gguf_path(g);
    c->rope_mode = TOY_ROPE_NORMAL;
    c->kv_lora_rank = key_int(k, "attention.kv_lora_rank", 0);
    c->q_lora_rank = key_int(k, "attention.q_lora_rank", 0);
    c->rope_dim = key_int(k, "rope.dimension_count", 0);
    /* llama.cpp since its MLA files (2025): key_length is the latent's, kv_lora + rope, and the heads' are *_mla;
     * before, key_length and value_length were the heads' and attn_kv_b held both up-projections */
    c->head_dim = key_int(k, "attention.key_length_mla", key_int(k, "attention.key_length", 0));
    c->head_dim_v = key_int(k, "attention.value_length_mla", key_int(k, "attention.value_length", 0));
    c->n_kv_heads = 1;
    c->n_dense_lead = key_int(k, "leading_dense_block_count", 0);
    c->moe_norm = key_int(k, "expert_weights_norm", 0) != 0;
    c->moe_scale = (float)key_float(k, "expert_weights_scale", 1.0);
    c->rope_yarn_log_mul = (float)(key_float(k, "rope.scaling.yarn_log_multiplier", 0.0) / 0.1);
    int64_t shared = key_int(k, "expert_shared_count", 0), gating = key_int(k, "expert_gating_func", 1);
    int64_t groups = key_int(k, "expert_group_count", 1), groups_used = key_int(k, "expert_group_used_count", groups);
    if (k->st) return toy_error(k->st, "%s", k->err);
    if (c->kv_lora_rank <= 0 || !has_tensor(g, "blk.0.attn_kv_a_mqa.weight"))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: a deepseek2 model without latent attention (kv_lora_rank %lld, "
                         "attn_kv_a_mqa) is not supported", path, (long long)c->kv_lora_rank);
    if (gating != 1 && gating != 2) /* llama.cpp: 1 softmax (DeepSeek-V2), 2 sigmoid (V3) */
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: expert_gating_func %lld: toy routes by softmax (1) or sigmoid (2)",
                         path, (long long)gating);
    c->moe_sigmoid = gating == 2;
    if (groups > 1 && groups_used < groups)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: routing within %lld of %lld expert groups is not supported", path,
                         (long long)groups_used, (long long)groups);
    c->d_ff_shared = shared > 0 ? shared * (c->d_ff_expert ? c->d_ff_expert : c->d_ff) : 0;
    c->shared_ungated = true;
    if (!has_tensor(g, "blk.0.attn_q_a.weight")) c->q_lora_rank = 0;
    return TOY_OK;
}

/* <arch>.attention.sliding_window_pattern (optional; llama.cpp hard-codes Gemma 2's 2 and Gemma 3's 6): a period, or
 * one bool per layer (true: the layer slides), which toy takes when it repeats a period whose last layer alone is
 * global */
static enum toy_status swa_pattern(const struct toy_gguf *g, const char *a, struct toy_llama_config *c) {
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    int64_t i = toy_gguf_find_key(g, key), v;
    if (i < 0) return TOY_OK;
    if (toy_gguf_kv_type(g, i) != TOY_GGUF_ARRAY) {
        if (toy_gguf_kv_int(g, i, &v)) return toy_error(TOY_ERR_FORMAT, "%s: %s", toy_gguf_path(g), toy_last_error());
        if (v < 0 || v > c->n_layers + 1)
            return toy_error(TOY_ERR_FORMAT, "%s: %s is %lld, for %lld layers", toy_gguf_path(g), key, (long long)v,
                             (long long)c->n_layers);
        c->swa_period = (int32_t)v;
        return TOY_OK;
    }
    uint64_t n = toy_gguf_arr_len(g, i);
    enum toy_gguf_type t = toy_gguf_arr_type(g, i);
    if (t != TOY_GGUF_BOOL || n != (uint64_t)c->n_layers)
        return toy_error(TOY_ERR_FORMAT, "%s: %s is an array of %llu %s, not of a bool per layer (%lld)",
                         toy_gguf_path(g), key, (unsigned long long)n, toy_gguf_type_name(t), (long long)c->n_layers);
    const uint8_t *bytes = toy_gguf_arr_data(g, i);
    bool *slides = malloc(n ? n : 1);
    if (!slides) return toy_error(TOY_ERR_NOMEM, "out of memory");
    for (uint64_t l = 0; l < n; l++) slides[l] = bytes[l] != 0;
    int64_t bad = 0;
    int32_t period = toy_llama_swa_period_of(slides, (int64_t)n, &bad);
    bool bad_slides = period < 0 && slides[bad];
    free(slides);
    if (period < 0)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: %s: layer %lld %s, which no period of sliding layers then one "
                         "global gives", toy_gguf_path(g), key, (long long)bad,
                         bad_slides ? "slides" : "attends globally");
    c->swa_period = period;
    return TOY_OK;
}

static bool rules_ffn_post_attn(const char *arch) { return toy_llama_arch_rules(arch).ffn_norm_post_attn; }

static enum toy_status config_from_gguf(const struct toy_gguf *g, struct toy_llama_config *c) {
    memset(c, 0, sizeof *c);
    const char *arch, *what;
    size_t alen;
    if (!toy_gguf_is_model(g, &what)) return toy_error(TOY_ERR_INVALID_ARG, "%s is %s", toy_gguf_path(g), what);
    if (toy_gguf_get_str(g, "general.architecture", &arch, &alen))
        return toy_error(TOY_ERR_FORMAT, "%s: no general.architecture", toy_gguf_path(g));
    snprintf(c->arch, sizeof c->arch, "%.*s", (int)alen, arch);
    const char *a = c->arch;
    if (!strcmp(a, "bert"))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: architecture 'bert' is a text encoder: it embeds and does not "
                         "generate (serve it: toy serve -m %s, then POST /v1/embeddings)", toy_gguf_path(g),
                         toy_gguf_path(g));
    if (!toy_llama_arch_known(a))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: architecture '%s' is not a Llama-family model toy runs "
                         "(llama, mistral, mistral3, ernie4_5, qwen2, qwen3, gemma2, gemma3, smollm3, olmo2, granite, phi3, "
                         "qwen2moe, qwen3moe, olmoe, deepseek2, gpt-oss)", toy_gguf_path(g), a);
    struct keys k = {.g = g, .arch = a};
    c->d_model = key_int(&k, "embedding_length", 0);
    c->n_layers = key_int(&k, "block_count", 0);
    c->d_ff = key_int(&k, "feed_forward_length", 0);
    c->n_heads = key_int(&k, "attention.head_count", 0);
    c->n_kv_heads = key_int(&k, "attention.head_count_kv", c->n_heads);
    c->max_ctx = key_int(&k, "context_length", 2048);
    c->head_dim = key_int(&k, "attention.key_length", 0);
    if (c->head_dim > 0 && c->n_heads > 0 && c->head_dim * c->n_heads == c->d_model) c->head_dim = 0;
    c->norm_eps = (float)key_float(&k, "attention.layer_norm_rms_epsilon", 1e-5);
    c->rope_base = (float)key_float(&k, "rope.freq_base", 10000.0);
    const bool granite = !strcmp(a, "granite");
    const bool mistral3 = !strcmp(a, "mistral3");
    /* adjacent pairs (llama.cpp's LLAMA_ROPE_TYPE_NORM); the others rotate halves */
    c->rope_mode = !strcmp(a, "llama") || !strcmp(a, "mistral") || !strcmp(a, "smollm3") || granite || mistral3 ||
                           !strcmp(a, "ernie4_5")
                       ? TOY_ROPE_NORMAL
                       : TOY_ROPE_NEOX;
    if (granite) { /* llama.cpp's: the logit scale required, the others optional */
        c->embed_mult = (float)key_float(&k, "embedding_scale", 0.0);
        c->residual_mult = (float)key_float(&k, "residual_scale", 0.0);
        c->attn_scale = (float)key_float(&k, "attention.scale", 0.0);
        c->logit_div = (float)key_float(&k, "logit_scale", 0.0);
        bool rope_on = true;
        char fk[128];
        snprintf(fk, sizeof fk, "%s.rope.scaling.finetuned", a);
        if (toy_gguf_find_key(g, fk) >= 0 && !toy_gguf_get_bool(g, fk, &rope_on) && !rope_on)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s: %s is false (Granite without RoPE) is not supported",
                             toy_gguf_path(g), fk);
    }
    const struct toy_llama_arch_rules rules = toy_llama_arch_rules(a);
    c->nope_period = rules.nope_period;
    c->swa_period = rules.swa_period; /* (a file may give another: swa_pattern) */
    const char *st;
    size_t stl;
    char skey[128];
    snprintf(skey, sizeof skey, "%s.rope.scaling.type", a);
    if (!toy_gguf_get_str(g, skey, &st, &stl)) {
        if (stl == 6 && !memcmp(st, "linear", 6)) c->rope_scaling = TOY_ROPE_SCALING_LINEAR;
        else if (stl == 4 && !memcmp(st, "yarn", 4)) c->rope_scaling = TOY_ROPE_SCALING_YARN;
        else if (stl == 6 && !memcmp(st, "llama3", 6)) c->rope_scaling = TOY_ROPE_SCALING_LLAMA3;
    }
    c->rope_factor = (float)key_float(&k, "rope.scaling.factor", 1.0);
    c->rope_orig_ctx = (int32_t)key_int(&k, "rope.scaling.original_context_length", c->max_ctx);
    c->rope_attn_factor = (float)key_float(&k, "rope.scaling.attn_factor", 0.0);
    /* YaRN's ramp (llama.cpp's keys; absent: 32 and 1) */
    c->rope_beta_fast = (float)key_float(&k, "rope.scaling.yarn_beta_fast", 0.0);
    c->rope_beta_slow = (float)key_float(&k, "rope.scaling.yarn_beta_slow", 0.0);
    c->sliding_window = (int32_t)key_int(&k, "attention.sliding_window", 0);
    int64_t pool = key_int(&k, "pooling_type", 0);
    if (pool < 0 || pool > TOY_POOLING_RANK)
        return toy_error(TOY_ERR_FORMAT, "%s: %s.pooling_type %lld (0 to 4)", toy_gguf_path(g), a, (long long)pool);
    c->pooling = (enum toy_pooling)pool;
    if (mistral3) { /* Ministral 3: Llama 4's query temperature; the scores' scale; llama.cpp's rotation magnitude */
        c->attn_temp_scale = (float)key_float(&k, "attention.temperature_scale", 0.0);
        c->attn_scale = (float)key_float(&k, "attention.scale", 0.0);
        /* its graph passes attn_factor 1 / (1 + 0.1 ln f): under YaRN that cancels the ramp's own magnitude
         * (cos and sin unscaled), otherwise it is the magnitude; the file's attn_factor is not read */
        c->rope_attn_factor = c->rope_scaling == TOY_ROPE_SCALING_YARN || c->rope_factor <= 1
                                  ? 1.0f
                                  : 1.0f / (1.0f + 0.1f * logf(c->rope_factor));
    }
    c->attn_softcap = (float)key_float(&k, "attn_logit_softcapping", 0.0);
    c->final_softcap = (float)key_float(&k, "final_logit_softcapping", 0.0);
    c->n_experts = key_int(&k, "expert_count", 0);
    c->n_experts_used = key_int(&k, "expert_used_count", 0);
    c->d_ff_expert = key_int(&k, "expert_feed_forward_length", 0);
    c->d_ff_shared = key_int(&k, "expert_shared_feed_forward_length", 0);
    c->moe_norm = toy_llama_moe_renormalises(a);
    int64_t te = toy_gguf_find_tensor(g, "token_embd.weight");
    if (te < 0) return toy_error(TOY_ERR_FORMAT, "%s: no token_embd.weight tensor", toy_gguf_path(g));
    c->vocab = key_int(&k, "vocab_size", toy_gguf_tensor(g, te)->ne[1]);
    if (k.st) return toy_error(k.st, "%s", k.err);
    c->tied = !has_tensor(g, "output.weight");
    c->qkv_bias = has_tensor(g, "blk.0.attn_q.bias");
    const bool gpt_oss = !strcmp(a, "gpt-oss");
    if (gpt_oss) { /* llama.cpp's graph: sinks, an output bias, biased experts, its clamped SwiGLU (7; no key) */
        c->attn_sinks = has_tensor(g, "blk.0.attn_sinks.weight");
        c->out_bias = has_tensor(g, "blk.0.attn_output.bias");
        c->moe_biases = has_tensor(g, "blk.0.ffn_gate_inp.bias");
        c->swiglu_limit = 7.0f;
        if (!c->attn_sinks || !c->moe_biases || !c->out_bias || !c->qkv_bias)
            return toy_error(TOY_ERR_FORMAT, "%s: a gpt-oss model without its %s", toy_gguf_path(g),
                             !c->attn_sinks ? "attention sinks (blk.0.attn_sinks.weight)"
                             : !c->moe_biases ? "router bias (blk.0.ffn_gate_inp.bias)"
                                              : "attention biases (blk.0.attn_q.bias, attn_output.bias)");
    }
    static const char *const unused_bias[] = {"blk.0.attn_output.bias", "blk.0.ffn_gate.bias", "blk.0.ffn_up.bias",
                                              "blk.0.ffn_down.bias"};
    for (size_t i = gpt_oss ? 1 : 0; i < sizeof unused_bias / sizeof unused_bias[0]; i++) /* the graph would leave it out */
        if (has_tensor(g, unused_bias[i]))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s: has %s: toy's Llama-family graph has no attention-output or "
                             "MLP biases", toy_gguf_path(g), unused_bias[i]);
    c->qk_norm = has_tensor(g, "blk.0.attn_q_norm.weight");
    if (c->qk_norm && c->n_heads > 0) { /* per head (Qwen3), or over the whole projection (OLMoE) */
        const struct toy_gguf_tensor *qn = toy_gguf_tensor(g, toy_gguf_find_tensor(g, "blk.0.attn_q_norm.weight"));
        int64_t hd = c->head_dim ? c->head_dim : c->d_model / c->n_heads;
        c->qk_norm_full = qn->ne[0] != hd && qn->ne[0] == hd * c->n_heads;
    }
    bool deepseek = !strcmp(a, "deepseek2");
    enum toy_status dst = deepseek ? deepseek2_config(g, &k, c) : TOY_OK;
    if (dst) return dst;
    /* a mixture's first layers may be dense (DeepSeek): look at its first mixture layer */
    char first[96];
    snprintf(first, sizeof first, "blk.%lld.", (long long)c->n_dense_lead);
    char nm[160];
#define FIRST(suffix) (snprintf(nm, sizeof nm, "%s%s", first, suffix), nm)
    bool moe = has_tensor(g, FIRST("ffn_gate_inp.weight"));
    bool shared = moe && has_tensor(g, FIRST("ffn_gate_shexp.weight"));
    if (shared && !deepseek && !has_tensor(g, FIRST("ffn_gate_inp_shexp.weight")))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: a shared expert without its gate (ffn_gate_inp_shexp) is not "
                         "supported", toy_gguf_path(g));
    if (shared && !c->d_ff_shared) /* llama.cpp's default: d_ff */
        c->d_ff_shared = c->d_ff;
    if (!shared) c->d_ff_shared = 0;
    if (moe && (c->n_experts <= 0 || c->n_experts_used <= 0))
        return toy_error(TOY_ERR_FORMAT, "%s: has expert tensors but %s.expert_count %lld and %s.expert_used_count "
                         "%lld", toy_gguf_path(g), a, (long long)c->n_experts, a, (long long)c->n_experts_used);
    c->moe_bias = moe && has_tensor(g, FIRST("exp_probs_b.bias"));
    if (!moe) c->n_experts = c->n_experts_used = c->d_ff_expert = c->n_dense_lead = 0, c->moe_norm = false;
    if (moe && has_tensor(g, FIRST("ffn_gate.0.weight")))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: experts stored one tensor each (an old Mixtral conversion): "
                         "convert it again with a current llama.cpp", toy_gguf_path(g));
#undef FIRST
    /* (gpt-oss's post_attention_norm is its MLP's norm, before the MLP) */
    c->sandwich_norm = !rules_ffn_post_attn(a) && has_tensor(g, "blk.0.post_attention_norm.weight");
    /* OLMo 2: the norms after attention and the MLP only */
    c->post_norm = c->sandwich_norm && !has_tensor(g, "blk.0.attn_norm.weight");
    if (c->post_norm) c->sandwich_norm = false;
    if (!strcmp(a, "gemma2") || !strcmp(a, "gemma3")) {
        c->embed_scale = true;
        c->gelu_mlp = true;
        c->attn_scale = 1.0f / sqrtf((float)toy_llama_gemma_query_scalar(a, c->n_layers, c->d_model, c->n_heads,
                                                                          toy_llama_head_dim(c)));
    }
    /* the sliding layers' own RoPE base, unscaled: Gemma 3's local layers take 10000 in llama.cpp, which has no key
     * for it; OLMo 3's (olmo2 with a window) the global base */
    if (c->sliding_window <= 0) c->swa_period = 0; /* (no layer slides: no period) */
    c->rope_base_swa = (float)key_float(&k, "rope.freq_base_swa", toy_llama_swa_base_default(a, c->sliding_window, c->rope_base));
    if (k.st) return toy_error(k.st, "%s", k.err);
    enum toy_status sp = swa_pattern(g, a, c);
    if (sp) return sp;
    if (!c->kv_lora_rank) { /* partial rotary (Phi-4-mini): the first rot dims of each head turn */
        int64_t rot = key_int(&k, "rope.dimension_count", toy_llama_head_dim(c));
        if (k.st) return toy_error(k.st, "%s", k.err);
        if (rot <= 0 || rot % 2 || rot > toy_llama_head_dim(c))
            return toy_error(TOY_ERR_FORMAT, "%s: %s.rope.dimension_count is %lld: want an even count up to the head "
                             "dim %lld", toy_gguf_path(g), a, (long long)rot, (long long)toy_llama_head_dim(c));
        c->rope_dim = rot == toy_llama_head_dim(c) ? 0 : rot;
    }
    enum toy_status st2 = toy_llama_check_config(c);
    if (st2) return toy_error(st2, "%s: %s", toy_gguf_path(g), toy_last_error());
    return TOY_OK;
}

static bool is_bias(const char *name) {
    size_t n = strlen(name);
    return n >= 5 && !strcmp(name + n - 5, ".bias");
}

/* Points (mapped) or copies (trainable) tensor `name` into t, checking its shape. */
static enum toy_status bind(struct toy_llama *m, struct toy_tensor **slot, const char *name, bool trainable,
                            bool required) {
    const struct toy_gguf *g = m->gguf;
    int64_t i = toy_gguf_find_tensor(g, name);
    if (i < 0) {
        if (!required) { *slot = NULL; return TOY_OK; }
        return toy_error(TOY_ERR_FORMAT, "%s: missing tensor %s", toy_gguf_path(g), name);
    }
    const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, i);
    struct toy_tensor *t = *slot;
    for (int d = 0; d < 4; d++)
        if (gt->ne[d] != t->ne[d]) return toy_model_shape_error(g, gt, t);
    if (trainable) return toy_gguf_tensor_read_f32(g, i, t->data, toy_nelements(t));
    if ((gt->ne[1] <= 1 || is_bias(name)) && gt->type != TOY_F32) {
        /* norms and biases (gpt-oss's experts' are {width, E}) must be f32 for the kernels: convert (small) */
        t->data = toy_ctx_alloc(m->ctx, (size_t)toy_nelements(t) * sizeof(float));
        toy_set_frozen(t);
        return toy_gguf_tensor_read_f32(g, i, t->data, toy_nelements(t));
    }
    enum toy_status cst = toy_model_check_type(g, gt, name);
    if (cst) return cst;
    toy_model_map_tensor(t, gt, gt->data); /* re-described as the file's type, over its mapped bytes */
    return TOY_OK;
}

/* Phi-3 keeps a layer's q, k and v rows in one attn_qkv and its gate and up
 * rows in one ffn_up of twice d_ff (as llama.cpp's converter writes them):
 * the file tensor that holds `name`'s rows, and the first of them, when the
 * file has no tensor of that name (or, for ffn_up, one of the fused width). */
static bool fused_rows(const struct toy_llama *m, const char *name, char *fused, size_t fn, int64_t *row0) {
    const struct toy_gguf *g = m->gguf;
    const struct toy_llama_config *c = &m->cfg;
    long long l;
    char part[32];
    if (sscanf(name, "blk.%lld.%31[^.].weight", &l, part) != 2) return false;
    int64_t hd = toy_llama_head_dim(c), dq = hd * c->n_heads, dkv = hd * c->n_kv_heads;
    if (!strcmp(part, "attn_q") || !strcmp(part, "attn_k") || !strcmp(part, "attn_v")) {
        snprintf(fused, fn, "blk.%lld.attn_qkv.weight", l);
        *row0 = part[5] == 'q' ? 0 : part[5] == 'k' ? dq : dq + dkv;
        return !has_tensor(g, name) && has_tensor(g, fused);
    }
    if (strcmp(part, "ffn_gate") && strcmp(part, "ffn_up")) return false;
    char gate[96];
    snprintf(fused, fn, "blk.%lld.ffn_up.weight", l);
    snprintf(gate, sizeof gate, "blk.%lld.ffn_gate.weight", l);
    int64_t i = toy_gguf_find_tensor(g, fused);
    *row0 = part[4] == 'g' ? 0 : c->d_ff;
    return !has_tensor(g, gate) && i >= 0 && toy_gguf_tensor(g, i)->ne[1] == 2 * c->d_ff;
}

/* bind() for rows row0.. of the fused file tensor `fused`: mapped, a view of
 * its bytes; trainable, copied out as f32 */
static enum toy_status bind_rows(struct toy_llama *m, struct toy_tensor *t, const char *fused, int64_t row0,
                                 bool trainable) {
    const struct toy_gguf *g = m->gguf;
    int64_t i = toy_gguf_find_tensor(g, fused);
    const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, i);
    if (gt->ne[0] != t->ne[0] || gt->ne[2] != 1 || row0 + t->ne[1] > gt->ne[1])
        return toy_error(TOY_ERR_SHAPE, "%s: tensor %s is [%lld, %lld, %lld]: the config needs %s in its rows "
                         "%lld..%lld, %lld wide", toy_gguf_path(g), fused, (long long)gt->ne[0], (long long)gt->ne[1],
                         (long long)gt->ne[2], t->name, (long long)row0, (long long)(row0 + t->ne[1] - 1),
                         (long long)t->ne[0]);
    enum toy_status cst = toy_model_check_type(g, gt, fused);
    if (cst) return cst;
    size_t row = toy_row_bytes(gt->type, gt->ne[0]);
    if (trainable) /* only its rows (each row is whole blocks of the type) */
        return toy_dequantize_row(gt->type, (const char *)gt->data + (size_t)row0 * row, t->data, toy_nelements(t));
    toy_model_map_tensor(t, gt, (const char *)gt->data + (size_t)row0 * row);
    return TOY_OK;
}

/* Phi-3's LongRoPE divisors: both tables or neither, each of rope dims / 2 */
static enum toy_status longrope_factors(struct toy_llama *m) {
    const struct toy_gguf *g = m->gguf;
    static const char *const names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
    struct toy_tensor **slots[2] = {&m->rope_long, &m->rope_short};
    int64_t half = (m->cfg.rope_dim ? m->cfg.rope_dim : toy_llama_head_dim(&m->cfg)) / 2;
    int n = has_tensor(g, names[0]) + has_tensor(g, names[1]);
    if (n == 0) return TOY_OK;
    if (n == 1)
        return toy_error(TOY_ERR_FORMAT, "%s: has %s but not %s", toy_gguf_path(g), names[!has_tensor(g, names[0])],
                         names[has_tensor(g, names[0])]);
    if (m->rope_freqs)
        return toy_error(TOY_ERR_FORMAT, "%s: has both rope_freqs.weight and LongRoPE's rope_factors_long/short: "
                         "which divides the frequencies is unclear", toy_gguf_path(g));
    for (int j = 0; j < 2; j++) {
        int64_t i = toy_gguf_find_tensor(g, names[j]);
        const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, i);
        if (gt->n_elements != half)
            return toy_error(TOY_ERR_SHAPE, "%s: %s holds %lld factors, not one per rotated pair (%lld)",
                             toy_gguf_path(g), names[j], (long long)gt->n_elements, (long long)half);
        struct toy_tensor *t = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, half), "%s", names[j]);
        if (!t->data) t->data = toy_ctx_alloc(m->ctx, (size_t)half * sizeof(float));
        toy_set_frozen(t);
        enum toy_status st = toy_gguf_tensor_read_f32(g, i, t->data, half);
        if (st) return st;
        *slots[j] = t;
    }
    return TOY_OK;
}

/* f32 data of t's shape for a tensor the loader makes (in the model's arena) */
static float *own_f32(struct toy_llama *m, struct toy_tensor *t) {
    if (t->data && t->type == TOY_F32) return t->data; /* trainable: allocated already */
    t->type = TOY_F32;
    t->nb[0] = sizeof(float);
    for (int d = 1; d < 4; d++) t->nb[d] = t->nb[d - 1] * (size_t)t->ne[d - 1];
    t->data = toy_ctx_alloc(m->ctx, (size_t)toy_nelements(t) * sizeof(float));
    toy_set_frozen(t);
    return t->data;
}

/* Latent attention's per-head up-projections, attn_k_b (transposed) and
 * attn_v_b: a file's stay as they are (mapped, of any type the matmul reads;
 * kept quantized, a decode step reads a quarter to a seventh of their f32
 * bytes: 9% faster on a DeepSeek-V2-shaped Q4_0 file). A file from before
 * llama.cpp's MLA conversion holds both in one attn_kv_b {kv_lora, H (nope
 * + v)}, rows head by head: nope key rows, then value rows; they are split
 * here, into f32. */
static enum toy_status mla_up_projections(struct toy_llama *m, int64_t l) {
    const struct toy_gguf *g = m->gguf;
    struct toy_llama_layer *L = &m->layers[l];
    char kv_name[96];
    snprintf(kv_name, sizeof kv_name, "blk.%lld.attn_kv_b.weight", (long long)l);
    int64_t ik = toy_gguf_find_tensor(g, L->wk_b->name), iv = toy_gguf_find_tensor(g, L->wv_b->name);
    enum toy_status st = TOY_OK;
    if (ik >= 0 && iv >= 0) return TOY_OK; /* bound already */
    int64_t i = toy_gguf_find_tensor(g, kv_name);
    if (i < 0) return toy_error(TOY_ERR_FORMAT, "%s: missing tensor %s (or %s and %s)", toy_gguf_path(g), kv_name,
                                L->wk_b->name, L->wv_b->name);
    const struct toy_llama_config *c = &m->cfg;
    int64_t H = c->n_heads, r = c->kv_lora_rank, dn = toy_llama_head_dim(c) - c->rope_dim, dv = c->head_dim_v;
    const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, i);
    if (gt->ne[0] != r || gt->ne[1] != H * (dn + dv) || gt->ne[2] != 1)
        return toy_error(TOY_ERR_SHAPE, "%s: tensor %s is [%lld, %lld, %lld], the config needs [%lld, %lld]",
                         toy_gguf_path(g), kv_name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2],
                         (long long)r, (long long)(H * (dn + dv)));
    float *kv = malloc((size_t)toy_nelements(L->wk_b) * sizeof(float) + (size_t)toy_nelements(L->wv_b) * sizeof(float));
    if (!kv) return toy_error(TOY_ERR_NOMEM, "%s: splitting %s", toy_gguf_path(g), kv_name);
    if (!(st = toy_gguf_tensor_read_f32(g, i, kv, gt->n_elements))) {
        float *kb = own_f32(m, L->wk_b), *vb = own_f32(m, L->wv_b); /* {dn, r, H}, {r, dv, H} */
        for (int64_t h = 0; h < H; h++) {
            const float *rows = kv + h * (dn + dv) * r;
            for (int64_t j = 0; j < dn; j++)
                for (int64_t x = 0; x < r; x++) kb[(h * r + x) * dn + j] = rows[j * r + x];
            memcpy(vb + h * dv * r, rows + dn * r, (size_t)(dv * r) * sizeof(float));
        }
    }
    free(kv);
    return st;
}

enum toy_status toy_llama_load(const char *path, bool trainable, struct toy_llama **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_llama_load: out is NULL");
    *out = NULL;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    struct toy_llama_config cfg;
    if ((st = config_from_gguf(g, &cfg))) { toy_gguf_close(g); return st; }
    struct toy_llama *m = toy_llama_alloc(&cfg, trainable);
    if (!m) { toy_gguf_close(g); return toy_error(TOY_ERR_NOMEM, "%s: model of %lld layers", path, (long long)cfg.n_layers); }
    m->gguf = g;
    /* tensors: the same order as toy_llama_tensor */
    for (int i = 0; i < toy_llama_n_tensors(m) && !st; i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        struct toy_tensor *slot = t;
        bool up = cfg.kv_lora_rank && (strstr(t->name, ".attn_k_b.") || strstr(t->name, ".attn_v_b."));
        char fused[96];
        int64_t row0;
        if (fused_rows(m, t->name, fused, sizeof fused, &row0)) st = bind_rows(m, t, fused, row0, trainable);
        else st = bind(m, &slot, t->name, trainable, !up); /* up: see mla_up_projections */
    }
    for (int64_t l = 0; l < cfg.n_layers && cfg.kv_lora_rank && !st; l++) st = mla_up_projections(m, l);
    if (!st && has_tensor(g, "rope_freqs.weight")) {
        int64_t i = toy_gguf_find_tensor(g, "rope_freqs.weight");
        const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, i);
        m->rope_freqs = toy_set_name(toy_new_tensor_1d(m->ctx, TOY_F32, gt->n_elements), "rope_freqs.weight");
        if (!m->rope_freqs->data) m->rope_freqs->data = toy_ctx_alloc(m->ctx, (size_t)gt->n_elements * sizeof(float));
        st = toy_gguf_tensor_read_f32(g, i, m->rope_freqs->data, gt->n_elements);
    }
    if (!st) st = longrope_factors(m);
    if (st) { toy_llama_free(m); return st; }
    if (trainable) { /* the file is no longer needed */
        toy_gguf_close(m->gguf);
        m->gguf = NULL;
    }
    *out = m;
    return TOY_OK;
}

/* ---- writing ------------------------------------------------------------------------ */

/* A fused tensor's parts, the rows of each written one after the other as `type`: each part either of that
 * type already (mapped from a file) or f32 converted to it */
struct fused {
    const struct toy_tensor *part[3];
    int n;
    enum toy_dtype type;
};

static enum toy_status fill_fused(void *ctx, void *dst, size_t nbytes) {
    const struct fused *f = ctx;
    char *p = dst;
    enum toy_status st = TOY_OK;
    for (int j = 0; j < f->n && !st; j++) {
        const struct toy_tensor *t = f->part[j];
        size_t bytes = toy_row_bytes(f->type, t->ne[0]) * (size_t)t->ne[1];
        if (t->type == f->type) memcpy(p, t->data, bytes);
        else st = toy_quantize_row(f->type, t->data, p, toy_nelements(t));
        p += bytes;
    }
    (void)nbytes;
    return st;
}

/* Where t goes in a fused Phi-3 tensor: -1 the first part (wq, w_gate: the fused tensor is written there), 1 a
 * later one (wk, wv, w_up), 0 none */
static int fused_part(const struct toy_llama *m, const struct toy_tensor *t) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        const struct toy_llama_layer *L = &m->layers[l];
        if (t == L->wq || t == L->w_gate) return L->wk || L->w_up ? -1 : 0;
        if (t == L->wk || t == L->wv || t == L->w_up) return 1;
    }
    return 0;
}

/* Layer tensor t (wq or w_gate) written with the rest of its part as llama.cpp's fused attn_qkv or ffn_up */
static enum toy_status write_fused(const struct toy_llama *m, struct toy_gguf_writer *w, const struct toy_tensor *t,
                                   enum toy_dtype type) {
    const struct toy_llama_layer *L = NULL;
    int64_t l = 0;
    for (; l < m->cfg.n_layers && !L; l++)
        if (t == m->layers[l].wq || t == m->layers[l].w_gate) L = &m->layers[l];
    struct fused *f = toy_ctx_alloc(m->ctx, sizeof *f); /* lives until the write, like conv */
    memset(f, 0, sizeof *f);
    bool qkv = t == L->wq;
    f->part[0] = t;
    f->part[1] = qkv ? L->wk : L->w_up;
    f->part[2] = qkv ? L->wv : NULL;
    f->n = qkv ? 3 : 2;
    f->type = t->type == TOY_F32 ? toy_row_type_for(type, t->ne[0]) : t->type;
    int64_t ne[2] = {t->ne[0], 0};
    for (int j = 0; j < f->n; j++) {
        const struct toy_tensor *p = f->part[j];
        if (p->ne[0] != t->ne[0] || (p->type != f->type && p->type != TOY_F32) || !toy_is_contiguous(p))
            return toy_error(TOY_ERR_UNSUPPORTED, "blk.%lld: %s (%s) and %s (%s) cannot be written as one %s",
                             (long long)(l - 1), t->name, toy_dtype_name(t->type), p->name, toy_dtype_name(p->type),
                             qkv ? "attn_qkv" : "ffn_up");
        ne[1] += p->ne[1];
    }
    char name[96];
    snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)(l - 1), qkv ? "attn_qkv" : "ffn_up");
    return toy_gguf_writer_add_tensor_fn(w, name, f->type, 2, ne, fill_fused, f);
}

enum toy_status toy_llama_write_gguf(const struct toy_llama *m, struct toy_gguf_writer *w, enum toy_dtype type) {
    const struct toy_llama_config *c = &m->cfg;
    const char *a = c->arch[0] ? c->arch : "llama";
    const struct toy_llama_arch_rules rules = toy_llama_arch_rules(a);
    char k[128];
    enum toy_status st = TOY_OK;
#define SETU(suffix, v) if (!st) { snprintf(k, sizeof k, "%s." suffix, a); st = toy_gguf_writer_set_u32(w, k, (uint32_t)(v)); }
#define SETF(suffix, v) if (!st) { snprintf(k, sizeof k, "%s." suffix, a); st = toy_gguf_writer_set_f32(w, k, (float)(v)); }
    st = toy_gguf_writer_set_str(w, "general.architecture", a);
    if (!st) st = toy_gguf_writer_set_u32(w, "general.alignment", 32);
    if (!st) st = toy_gguf_writer_set_u32(w, "general.file_type", toy_file_type_for(type));
    if (!st && toy_dtype_info(type)->quantized) st = toy_gguf_writer_set_u32(w, "general.quantization_version", 2);
    SETU("vocab_size", c->vocab);
    SETU("context_length", c->max_ctx);
    SETU("embedding_length", c->d_model);
    SETU("block_count", c->n_layers);
    bool ff_key = c->n_experts && toy_llama_moe_own_ff_key(a); /* the experts' width under its own key */
    SETU("feed_forward_length", c->n_experts && !ff_key && c->d_ff_expert ? c->d_ff_expert : c->d_ff);
    SETU("attention.head_count", c->n_heads);
    SETU("attention.head_count_kv", c->n_kv_heads);
    SETU("rope.dimension_count", c->rope_dim ? c->rope_dim : toy_llama_head_dim(c)); /* (latent attention's: > 0) */
    if (c->kv_lora_rank) { /* llama.cpp's MLA files: key_length is the cached latent's, *_mla the heads' */
        SETU("attention.kv_lora_rank", c->kv_lora_rank);
        if (c->q_lora_rank) SETU("attention.q_lora_rank", c->q_lora_rank);
        SETU("attention.key_length", c->kv_lora_rank + c->rope_dim);
        SETU("attention.value_length", c->kv_lora_rank);
        SETU("attention.key_length_mla", toy_llama_head_dim(c));
        SETU("attention.value_length_mla", c->head_dim_v);
        if (c->rope_yarn_log_mul != 0) SETF("rope.scaling.yarn_log_multiplier", 0.1f * c->rope_yarn_log_mul);
    } else if (c->head_dim) {
        SETU("attention.key_length", c->head_dim);
        SETU("attention.value_length", c->head_dim);
    }
    SETF("attention.layer_norm_rms_epsilon", c->norm_eps);
    SETF("rope.freq_base", c->rope_base);
    if (c->rope_scaling != TOY_ROPE_SCALING_NONE && !st) {
        const char *names[] = {"none", "linear", "llama3", "yarn"};
        snprintf(k, sizeof k, "%s.rope.scaling.type", a);
        st = toy_gguf_writer_set_str(w, k, names[c->rope_scaling]);
        SETF("rope.scaling.factor", c->rope_factor);
        SETU("rope.scaling.original_context_length", c->rope_orig_ctx);
    } else if (m->rope_long) { /* LongRoPE: no scaling type; the context past which its long factors apply */
        SETU("rope.scaling.original_context_length", c->rope_orig_ctx);
    }
    if (c->rope_attn_factor > 0) SETF("rope.scaling.attn_factor", c->rope_attn_factor);
    if (c->rope_scaling == TOY_ROPE_SCALING_YARN) { /* a ramp other than llama.cpp's default */
        if (c->rope_beta_fast > 0 && c->rope_beta_fast != 32) SETF("rope.scaling.yarn_beta_fast", c->rope_beta_fast);
        if (c->rope_beta_slow > 0 && c->rope_beta_slow != 1) SETF("rope.scaling.yarn_beta_slow", c->rope_beta_slow);
    }
    if (c->sliding_window > 0) {
        SETU("attention.sliding_window", c->sliding_window);
        /* llama.cpp hard-codes gemma2's period (2) and gemma3's (6); the key where a model has another */
        if (c->swa_period != rules.swa_period) SETU("attention.sliding_window_pattern", c->swa_period);
    }
    if (c->attn_temp_scale > 0) SETF("attention.temperature_scale", c->attn_temp_scale);
    if (c->pooling != TOY_POOLING_NONE) SETU("pooling_type", c->pooling);
    if (!strcmp(a, "mistral3") && c->attn_scale > 0) SETF("attention.scale", c->attn_scale);
    if (!strcmp(a, "granite")) {
        if (c->embed_mult > 0) SETF("embedding_scale", c->embed_mult);
        if (c->residual_mult > 0) SETF("residual_scale", c->residual_mult);
        if (c->attn_scale > 0) SETF("attention.scale", c->attn_scale);
        SETF("logit_scale", c->logit_div > 0 ? c->logit_div : 1.0f);
    }
    if (c->rope_base_swa != toy_llama_swa_base_default(a, c->sliding_window, c->rope_base)) SETF("rope.freq_base_swa", c->rope_base_swa);
    if (c->attn_softcap > 0) SETF("attn_logit_softcapping", c->attn_softcap);
    if (c->final_softcap > 0) SETF("final_logit_softcapping", c->final_softcap);
    if (c->n_experts) {
        SETU("expert_count", c->n_experts);
        SETU("expert_used_count", c->n_experts_used);
        if (ff_key) SETU("expert_feed_forward_length", c->d_ff_expert ? c->d_ff_expert : c->d_ff);
        if (!strcmp(a, "deepseek2")) { /* the routing and the shared experts as llama.cpp reads them there */
            int64_t fe = c->d_ff_expert ? c->d_ff_expert : c->d_ff;
            if (c->d_ff_shared % fe)
                return toy_error(TOY_ERR_UNSUPPORTED, "deepseek2: shared experts %lld wide, not a multiple of the "
                                 "experts' %lld", (long long)c->d_ff_shared, (long long)fe);
            SETU("expert_shared_count", c->d_ff_shared / fe);
            SETU("leading_dense_block_count", c->n_dense_lead);
            SETF("expert_weights_scale", c->moe_scale > 0 ? c->moe_scale : 1.0f);
            SETU("expert_gating_func", c->moe_sigmoid ? 2 : 1); /* llama.cpp's: sigmoid, softmax */
            if (!st) { snprintf(k, sizeof k, "%s.expert_weights_norm", a); st = toy_gguf_writer_set_bool(w, k, c->moe_norm); }
        } else if (c->d_ff_shared) {
            SETU("expert_shared_feed_forward_length", c->d_ff_shared);
        }
    }
#undef SETU
#undef SETF
    const bool fuse = !strcmp(a, "phi3"); /* llama.cpp reads Phi-3's q, k, v as one attn_qkv, gate and up as one ffn_up */
    for (int i = 0; i < toy_llama_n_tensors(m) && !st; i++) {
        const struct toy_tensor *t = toy_llama_tensor(m, i);
        if (t == m->embd_proj) continue; /* folded into token_embd.weight */
        int part = fuse ? fused_part(m, t) : 0;
        if (part > 0) continue; /* written with its first */
        if (part < 0) {
            st = write_fused(m, w, t, type);
            continue;
        }
        if (t == m->tok_embd && m->embd_proj) { /* the table the model uses: donor P + residual */
            struct toy_tensor *ft = toy_ctx_alloc(m->ctx, sizeof *ft); /* lives until the write, like conv */
            *ft = *t;
            ft->data = m->embd_fold;
            toy_llama_embd_table(m, m->embd_fold);
            t = ft;
        }
        int nd = t->ne[2] > 1 ? 3 : t->ne[1] > 1 ? 2 : 1;
        /* rows that are not whole blocks of `type` (latent attention's attn_k_b) fall back to a type they fit */
        /* (vectors and biases stay f32, as llama.cpp's converter keeps them) */
        enum toy_dtype want = nd >= 2 && !is_bias(t->name) ? toy_row_type_for(type, t->ne[0]) : t->type;
        st = toy_model_write_tensor(w, m->ctx, t, nd, want);
    }
    if (!st && m->rope_freqs)
        st = toy_gguf_writer_add_tensor(w, "rope_freqs.weight", TOY_F32, 1, m->rope_freqs->ne, m->rope_freqs->data);
    for (int j = 0; j < 2 && !st && m->rope_long; j++) {
        const struct toy_tensor *t = j ? m->rope_short : m->rope_long;
        st = toy_gguf_writer_add_tensor(w, t->name, TOY_F32, 1, t->ne, t->data);
    }
    return st;
}
