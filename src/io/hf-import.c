/* hf-import.c: Hugging Face model folder -> GGUF (toy convert), and GGUF
 * re-quantization (toy quantize). Names, keys and tensor transforms follow
 * llama.cpp's convert_hf_to_gguf.py and gguf-py/constants.py (see
 * include/toy/convert.h for the list); GGUF layout in gguf-write.c.
 *
 * Tensors are converted one at a time while the file is written (the
 * writer's fill callbacks), so peak memory is about two copies of the
 * largest tensor in f32, not the model. */
#include "toy/convert.h"
#include "toy/bert.h"
#include "toy/gpt2.h"
#include "toy/llama.h"
#include "toy/quant.h"
#include "toy/safetensors.h"
#include "toy/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum arch { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3, ARCH_GEMMA2, ARCH_GPT2, ARCH_MIXTRAL, ARCH_QWEN2MOE, ARCH_QWEN3MOE,
            ARCH_OLMOE, ARCH_DEEPSEEK2, ARCH_GEMMA3, ARCH_SMOLLM3, ARCH_OLMO2, ARCH_GRANITE, ARCH_PHI3, ARCH_BERT };
/* the GGUF architecture of each (llama.cpp's: Mixtral is a "llama" with experts; DeepSeek-V2 and V3 are
 * "deepseek2") */
static const char *const arch_names[] = {"llama", "qwen2", "qwen3", "gemma2", "gpt2", "llama", "qwen2moe", "qwen3moe",
                                         "olmoe", "deepseek2", "gemma3", "smollm3", "olmo2", "granite", "phi3", "bert"};

static bool is_gemma(enum arch a) { return a == ARCH_GEMMA2 || a == ARCH_GEMMA3; }
/* q and k rows permuted from rotate-half to adjacent pairs, as llama.cpp's LlamaModel converter does */
static bool permutes_qk(enum arch a) {
    return a == ARCH_LLAMA || a == ARCH_MIXTRAL || a == ARCH_SMOLLM3 || a == ARCH_GRANITE;
}

uint32_t toy_file_type_for(enum toy_dtype t) {
    switch (t) {
    case TOY_F32: return 0;   /* LLAMA_FTYPE_ALL_F32 */
    case TOY_F16: return 1;   /* MOSTLY_F16 */
    case TOY_Q4_0: return 2;
    case TOY_Q4_1: return 3;
    case TOY_Q8_0: return 7;
    case TOY_Q5_0: return 8;
    case TOY_Q5_1: return 9;
    case TOY_Q2_K: return 10;
    case TOY_Q3_K: return 11; /* MOSTLY_Q3_K_S: uniform Q3_K */
    case TOY_Q4_K: return 14; /* MOSTLY_Q4_K_S: uniform Q4_K */
    case TOY_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case TOY_Q6_K: return 18;
    case TOY_IQ4_NL: return 25;
    case TOY_IQ4_XS: return 30;
    case TOY_BF16: return 32;
    case TOY_MXFP4: return 38; /* MOSTLY_MXFP4_MOE */
    default: return 0;
    }
}

/* One output tensor and how to make it. */
struct job {
    const struct toy_safetensors *st;
    int64_t src;            /* safetensors index, or -1 for a computed tensor */
    enum toy_dtype out;
    int n_dims;
    int64_t ne[4];          /* GGUF order */
    int permute_heads;      /* > 0: un-permute q/k rows for this many heads */
    bool transpose;         /* GPT-2 Conv1D (in, out) -> (out, in) */
    bool add_one;           /* Gemma norms: 1 + w */
    float *values;          /* computed tensors (rope_freqs, Phi-3's rope_factors_long/short) */
    int64_t *experts;       /* a mixture's stacked experts: ne[2] safetensors indices, one matrix each */
    /* DeepSeek's kv_b_proj {kv_lora, H (nope + v)}: 1 its keys' part per head, transposed (attn_k_b
     * {nope, kv_lora, H}), 2 its values' (attn_v_b {kv_lora, v, H}); nope and v the heads' widths */
    int kv_b_part;
    int64_t kv_b_nope, kv_b_v;
    char name[TOY_GGUF_NAME_MAX];
    int64_t order;          /* position in the file (see job_order) */
};

/* Files read best in model order: embeddings, blocks by number, the head. */
static int64_t job_order(const char *name, int64_t idx) {
    if (!strncmp(name, "token_embd.", 11)) return idx;
    if (!strncmp(name, "position_embd.", 14) || !strncmp(name, "rope_freqs.", 11) || !strncmp(name, "rope_factors_", 13))
        return (1ll << 20) + idx;
    if (!strncmp(name, "blk.", 4)) return ((2 + atoll(name + 4)) << 20) + idx;
    if (!strncmp(name, "output_norm.", 12)) return (1ll << 50) + idx;
    return (1ll << 51) + idx;
}

static int job_cmp(const void *a, const void *b) {
    const struct job *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* llama.cpp's LlamaModel.permute: HF keeps each head's rows as [first half
 * of rotary pairs; second half]; llama.cpp interleaves them. */
static void unpermute_rows(const float *src, float *dst, int64_t rows, int64_t cols, int n_head) {
    const int64_t hd = rows / n_head, half = hd / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int s = 0; s < 2; s++)
            for (int64_t i = 0; i < half; i++) {
                const int64_t from = h * hd + s * half + i, to = h * hd + 2 * i + s;
                memcpy(dst + to * cols, src + from * cols, (size_t)cols * sizeof(float));
            }
}

/* Quantizing is the slow part of a conversion (q4_k's scale search runs at
 * ~60 MB/s per core), and rows are independent: split them across cores. */
struct qpart {
    enum toy_dtype t;
    const float *src;
    void *dst;
    int64_t n;
    enum toy_status st;
};

static void *qpart_run(void *arg) {
    struct qpart *p = arg;
    p->st = toy_quantize_row(p->t, p->src, p->dst, p->n);
    return NULL;
}

static enum toy_status quantize_rows(enum toy_dtype t, const float *src, void *dst, int64_t n, int64_t ne0) {
    const int64_t rows = ne0 ? n / ne0 : 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nth = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
    if (!toy_dtype_info(t)->quantized || n < (1 << 16) || rows < nth) nth = 1;
    if (nth == 1) return toy_quantize_row(t, src, dst, n);
    struct qpart parts[16];
    pthread_t tids[16];
    bool started[16] = {false};
    const size_t row_bytes = toy_row_bytes(t, ne0);
    for (int k = 0; k < nth; k++) {
        const int64_t r0 = rows * k / nth, r1 = rows * (k + 1) / nth;
        parts[k] = (struct qpart){t, src + r0 * ne0, (uint8_t *)dst + (size_t)r0 * row_bytes, (r1 - r0) * ne0, TOY_OK};
        if (k < nth - 1) started[k] = pthread_create(&tids[k], NULL, qpart_run, &parts[k]) == 0;
        if (!started[k]) qpart_run(&parts[k]); /* the last part, or no thread could start */
    }
    for (int k = 0; k < nth; k++)
        if (started[k]) pthread_join(tids[k], NULL);
    for (int k = 0; k < nth; k++)
        if (parts[k].st) return toy_error(parts[k].st, "quantize: %s rows failed", toy_dtype_name(t));
    return TOY_OK;
}

static enum toy_status fill_job(void *ctx, void *dst, size_t nbytes) {
    struct job *j = ctx;
    int64_t n = j->ne[0] * j->ne[1] * j->ne[2] * j->ne[3];
    float *a = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!a) return toy_error(TOY_ERR_NOMEM, "out of memory");
    enum toy_status e = TOY_OK;
    if (j->kv_b_part) { /* one part of every head's rows of kv_b_proj */
        const int64_t r = j->kv_b_part == 1 ? j->ne[1] : j->ne[0], H = j->ne[2], dn = j->kv_b_nope, dv = j->kv_b_v;
        float *kv = malloc((size_t)(H * (dn + dv) * r) * sizeof(float));
        if (!kv) { free(a); return toy_error(TOY_ERR_NOMEM, "out of memory"); }
        e = toy_safetensors_read_f32(j->st, j->src, kv, H * (dn + dv) * r);
        for (int64_t h = 0; h < H && !e; h++) {
            const float *rows = kv + h * (dn + dv) * r;
            if (j->kv_b_part == 1)
                for (int64_t x = 0; x < r; x++)
                    for (int64_t i = 0; i < dn; i++) a[(h * r + x) * dn + i] = rows[i * r + x];
            else
                memcpy(a + h * dv * r, rows + dn * r, (size_t)(dv * r) * sizeof(float));
        }
        free(kv);
    } else if (j->values) memcpy(a, j->values, (size_t)n * sizeof(float));
    else if (j->experts) /* the experts' matrices one after another */
        for (int64_t x = 0; x < j->ne[2] && !e; x++)
            e = toy_safetensors_read_f32(j->st, j->experts[x], a + x * j->ne[0] * j->ne[1], j->ne[0] * j->ne[1]);
    else e = toy_safetensors_read_f32(j->st, j->src, a, n);
    if (!e && (j->permute_heads || j->transpose)) {
        float *b = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (!b) { free(a); return toy_error(TOY_ERR_NOMEM, "out of memory"); }
        /* a q/k bias (1-D) is one value per row: its rows move as the weight's do */
        const int64_t cols = j->n_dims == 1 ? 1 : j->ne[0], rows = n / (cols ? cols : 1);
        if (j->transpose) {
            /* source is (rows_src = cols, cols_src = rows) row-major */
            for (int64_t r = 0; r < cols; r++)
                for (int64_t c = 0; c < rows; c++) b[c * cols + r] = a[r * rows + c];
        } else {
            unpermute_rows(a, b, rows, cols, j->permute_heads);
        }
        free(a);
        a = b;
    }
    if (!e && j->add_one)
        for (int64_t i = 0; i < n; i++) a[i] += 1.0f;
    if (!e) {
        if (nbytes != toy_row_bytes(j->out, j->ne[0]) * (size_t)(n / (j->ne[0] ? j->ne[0] : 1)))
            e = toy_error(TOY_ERR_STATE, "%s: size mismatch", j->name);
        else if (n)
            e = quantize_rows(j->out, a, dst, n, j->ne[0]);
    }
    free(a);
    return e;
}

/* ---- config.json -------------------------------------------------------------- */

static int64_t cfg_int(json_t *c, const char *key, int64_t def) {
    json_t *v = json_object_get(c, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

static double cfg_num(json_t *c, const char *key, double def) {
    json_t *v = json_object_get(c, key);
    return json_is_number(v) ? json_number_value(v) : def;
}

/* a logit softcap: def when absent (Gemma 2's config defaults), none when null */
static double cfg_cap(json_t *c, const char *key, double def) {
    json_t *v = json_object_get(c, key);
    return !v ? def : json_is_number(v) ? json_number_value(v) : 0;
}

static enum toy_status need_pos(const char *dir, const char *key, int64_t v) {
    if (v <= 0 || v > (1ll << 40))
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: '%s' missing or invalid (%lld)", dir, key, (long long)v);
    return TOY_OK;
}

struct hp {
    enum arch arch;
    int pooling; /* GGUF pooling_type (sentence-transformers' 1_Pooling/config.json), 0: none stated */
    int64_t n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, head_dim;
    int64_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp; /* a mixture of experts (n_expert 0: none) */
    /* DeepSeek: latent ranks, the heads' rotated (Phi-3's too: its partial rotary), unrotated and value widths, the
     * dense layers first, the shared experts' count, the routing */
    int64_t kv_lora, q_lora, rope_dim, nope, v_dim, dense_lead, n_shexp;
    bool sigmoid, norm_topk;
    double routed_scale;
    double eps, rope_base;
    bool tied;
    int64_t swa_period; /* Gemma: of each swa_period layers the last attends globally (0: every layer slides) */
    /* Phi-3: the context its RoPE was trained at, its window (0: none, Phi-4's), LongRoPE (rope_scaling longrope or
     * su) and its cos/sin scale */
    int64_t orig_ctx, swa;
    bool longrope;
    double attn_factor;
    bool multimodal; /* Gemma 3 with its vision tower: the text model's tensors under language_model */
    bool *slides;    /* OLMo 3 (GGUF olmo2 with a window): which layers slide (n_layer; NULL: none) */
};

/* A mixture's config: every layer sparse (toy's graph has no dense layers
 * among sparse ones), and the routing weights renormalised or not as the
 * GGUF architecture's readers do it (GGUF has no key for it). */
/* DeepSeek-V2 and V3 (modeling_deepseek.py's config): latent attention, the
 * first first_k_dense_replace layers dense, the others mixtures with
 * n_shared_experts shared experts; the routing as llama.cpp's deepseek2
 * reads it from its keys. Group-limited routing that drops groups, and
 * YaRN whose rotation and attention corrections differ (mscale against
 * mscale_all_dim), have no GGUF keys: refused. */
static enum toy_status read_deepseek(const char *dir, json_t *c, struct hp *h) {
    enum toy_status e;
    h->kv_lora = cfg_int(c, "kv_lora_rank", 0);
    h->q_lora = cfg_int(c, "q_lora_rank", 0); /* null in V2-Lite: queries straight from q_proj */
    h->rope_dim = cfg_int(c, "qk_rope_head_dim", 0);
    h->nope = cfg_int(c, "qk_nope_head_dim", 0);
    h->v_dim = cfg_int(c, "v_head_dim", 0);
    h->n_expert = cfg_int(c, "n_routed_experts", 0);
    h->n_expert_used = cfg_int(c, "num_experts_per_tok", 0);
    h->n_ff_exp = cfg_int(c, "moe_intermediate_size", 0);
    h->n_shexp = cfg_int(c, "n_shared_experts", 0);
    h->dense_lead = cfg_int(c, "first_k_dense_replace", 0);
    h->routed_scale = cfg_num(c, "routed_scaling_factor", 1.0);
    h->norm_topk = json_is_true(json_object_get(c, "norm_topk_prob"));
    const char *sf = json_string_value(json_object_get(c, "scoring_func"));
    h->sigmoid = sf && !strcmp(sf, "sigmoid");
    if ((e = need_pos(dir, "kv_lora_rank", h->kv_lora)) || (e = need_pos(dir, "qk_rope_head_dim", h->rope_dim)) ||
        (e = need_pos(dir, "qk_nope_head_dim", h->nope)) || (e = need_pos(dir, "v_head_dim", h->v_dim)))
        return e;
    if (sf && strcmp(sf, "softmax") && strcmp(sf, "sigmoid"))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: scoring_func '%s' (toy scores by softmax or sigmoid)",
                         dir, sf);
    if (h->n_expert) {
        if ((e = need_pos(dir, "num_experts_per_tok", h->n_expert_used)) ||
            (e = need_pos(dir, "moe_intermediate_size", h->n_ff_exp)))
            return e;
        if (h->n_expert_used > h->n_expert || h->n_expert_used > 64)
            return toy_error(TOY_ERR_FORMAT, "%s/config.json: %lld experts a token of %lld", dir,
                             (long long)h->n_expert_used, (long long)h->n_expert);
        if (cfg_int(c, "moe_layer_freq", 1) != 1 || h->dense_lead < 0 || h->dense_lead > h->n_layer)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: mixture layers other than all those after the "
                             "first first_k_dense_replace (moe_layer_freq %lld)", dir,
                             (long long)cfg_int(c, "moe_layer_freq", 1));
        const char *tm = json_string_value(json_object_get(c, "topk_method"));
        int64_t groups = cfg_int(c, "n_group", 1), used = cfg_int(c, "topk_group", groups);
        if (tm && strcmp(tm, "greedy") && groups > 1 && used < groups)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: %s routing within %lld of %lld expert groups is "
                             "not supported", dir, tm, (long long)used, (long long)groups);
        /* modeling_deepseek (V2) scales the weights only when it does not renormalise them; llama.cpp does both */
        const char *mt = json_string_value(json_object_get(c, "model_type"));
        if (mt && !strcmp(mt, "deepseek_v2") && h->norm_topk && h->routed_scale != 1.0)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: norm_topk_prob with routed_scaling_factor %g: "
                             "DeepSeek-V2 applies one or the other, a GGUF reader both", dir, h->routed_scale);
    } else {
        h->dense_lead = 0;
    }
    json_t *rs = json_object_get(c, "rope_scaling");
    if (json_is_object(rs) && cfg_num(rs, "mscale", 0) != cfg_num(rs, "mscale_all_dim", 0) &&
        cfg_num(rs, "mscale", 0) != 0)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: rope_scaling mscale %g and mscale_all_dim %g differ: "
                         "GGUF keeps the attention's correction only", dir, cfg_num(rs, "mscale", 0),
                         cfg_num(rs, "mscale_all_dim", 0));
    h->head_dim = h->nope + h->rope_dim;
    return TOY_OK;
}

static enum toy_status read_experts(const char *dir, json_t *c, struct hp *h) {
    if (h->arch == ARCH_DEEPSEEK2) return read_deepseek(dir, c, h);
    if (h->arch != ARCH_MIXTRAL && h->arch != ARCH_QWEN2MOE && h->arch != ARCH_QWEN3MOE && h->arch != ARCH_OLMOE)
        return TOY_OK;
    bool mixtral = h->arch == ARCH_MIXTRAL;
    h->n_expert = cfg_int(c, mixtral ? "num_local_experts" : "num_experts", 0);
    h->n_expert_used = cfg_int(c, "num_experts_per_tok", 0);
    bool own = toy_llama_moe_own_ff_key(arch_names[h->arch]); /* the experts' width under its own key */
    h->n_ff_exp = own ? cfg_int(c, "moe_intermediate_size", 0) : h->n_ff;
    h->n_ff_shexp = h->arch == ARCH_QWEN2MOE ? cfg_int(c, "shared_expert_intermediate_size", 0) : 0;
    enum toy_status e;
    if ((e = need_pos(dir, mixtral ? "num_local_experts" : "num_experts", h->n_expert)) ||
        (e = need_pos(dir, "num_experts_per_tok", h->n_expert_used)) ||
        (e = need_pos(dir, own ? "moe_intermediate_size" : "intermediate_size", h->n_ff_exp)) ||
        (h->arch == ARCH_QWEN2MOE && (e = need_pos(dir, "shared_expert_intermediate_size", h->n_ff_shexp))))
        return e;
    if (h->n_expert_used > h->n_expert || h->n_expert_used > 64)
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: %lld experts a token of %lld", dir,
                         (long long)h->n_expert_used, (long long)h->n_expert);
    json_t *only = json_object_get(c, "mlp_only_layers");
    if (cfg_int(c, "decoder_sparse_step", 1) != 1 || (json_is_array(only) && json_array_size(only)))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: dense layers among the sparse ones (decoder_sparse_step "
                         "or mlp_only_layers): toy's mixtures are sparse in every layer", dir);
    bool norm = toy_llama_moe_renormalises(arch_names[h->arch]);
    json_t *nt = json_object_get(c, "norm_topk_prob");
    if (!mixtral && json_is_boolean(nt) && json_is_true(nt) != norm)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: norm_topk_prob %s, but a %s GGUF is read as %s", dir,
                         json_is_true(nt) ? "true" : "false", arch_names[h->arch], norm ? "true" : "false");
    return TOY_OK;
}

/* Which of a config's n layers slide: layer_types' sliding_attention / full_attention, and the period the list
 * repeats into *period_out; without it, of each `period` layers all but the last (0: every one), that period kept.
 * A list of another length, another kind, or no period whose last layer alone is global is refused (GGUF holds a
 * period: llama.cpp's sliding_window_pattern). slides: n bools. */
static enum toy_status layer_slides(const char *dir, json_t *c, int64_t n, int32_t period, const char *family,
                                    bool *slides, int32_t *period_out) {
    json_t *lt = json_object_get(c, "layer_types");
    if (lt && json_is_null(lt)) lt = NULL;
    if (lt && (!json_is_array(lt) || (int64_t)json_array_size(lt) != n))
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: layer_types is not a list of %lld layers", dir, (long long)n);
    int64_t bad = -1;
    for (int64_t l = 0; l < n && bad < 0; l++) {
        const char *t = lt ? json_string_value(json_array_get(lt, (size_t)l)) : NULL;
        slides[l] = lt ? t && !strcmp(t, "sliding_attention") : period == 0 || l % period < period - 1;
        if (lt && !slides[l] && (!t || strcmp(t, "full_attention"))) bad = l; /* neither kind */
    }
    *period_out = !lt ? period : bad < 0 ? toy_llama_swa_period_of(slides, n, &bad) : -1;
    if (*period_out >= 0) return TOY_OK;
    const char *t = json_string_value(json_array_get(lt, (size_t)bad));
    return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: layer_types[%lld] is '%s': toy's %s layers slide but for "
                     "the last of each period (GGUF's sliding_window_pattern)", dir, (long long)bad,
                     t ? t : "(not a string)", family);
}

/* Gemma's period: of each the last attends globally (Gemma 2: 2; Gemma 3: 6, or its sliding_window_pattern, or
 * what layer_types repeats) */
static enum toy_status gemma_layers(const char *dir, json_t *c, struct hp *h) {
    int32_t rule = toy_llama_arch_rules(arch_names[h->arch]).swa_period;
    int32_t period = h->arch == ARCH_GEMMA2 ? rule : (int32_t)cfg_int(c, "sliding_window_pattern", rule);
    bool *slides = malloc((size_t)h->n_layer);
    if (!slides) return toy_error(TOY_ERR_NOMEM, "out of memory");
    enum toy_status e = layer_slides(dir, c, h->n_layer, period, "Gemma", slides, &period);
    free(slides);
    h->swa_period = period;
    return e;
}

/* SmolLM3 leaves out the rotary embedding on the layers no_rope_layers marks 0: llama.cpp (and a smollm3 GGUF)
 * holds only its released layout, every fourth layer (3, 7, ...), and a sliding window it does not run */
static enum toy_status smollm3_layers(const char *dir, json_t *c, struct hp *h) {
    json_t *nr = json_object_get(c, "no_rope_layers");
    if (!json_is_array(nr) || (int64_t)json_array_size(nr) != h->n_layer)
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: no_rope_layers is not a list of %lld layers", dir,
                         (long long)h->n_layer);
    const int64_t p = toy_llama_arch_rules("smollm3").nope_period;
    for (int64_t l = 0; l < h->n_layer; l++) {
        json_t *v = json_array_get(nr, (size_t)l);
        if (!json_is_integer(v) || json_integer_value(v) != (l % p != p - 1))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: no_rope_layers[%lld] is not %d: a smollm3 GGUF "
                             "rotates every layer but the last of each %lld", dir, (long long)l, l % p != p - 1,
                             (long long)p);
    }
    json_t *sw = json_object_get(c, "use_sliding_window");
    if (json_is_true(sw))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: use_sliding_window: a smollm3 GGUF has no window", dir);
    return TOY_OK;
}

/* Phi-3 and Phi-4-mini as llama.cpp's Phi3MiniModel writes them: partial rotary (Phi-4-mini rotates 3/4 of each
 * head), a sliding window or none (0), and LongRoPE (rope_scaling longrope, or su in the first 128k configs): two
 * tables of per-frequency divisors, long_factor for a context past original_max_position_embeddings and
 * short_factor within it, each one per rotated pair, and a scale on cos and sin (attention_factor, or
 * sqrt(1 + ln s / ln original) for s = max_position_embeddings / original). Other scalings are refused. */
static enum toy_status phi3_config(const char *dir, json_t *c, struct hp *h) {
    const double prf = cfg_num(c, "partial_rotary_factor", 1.0);
    /* llama.cpp's int(prf * hidden_size) // heads; Hugging Face's int(head_dim * prf) */
    const int64_t dims = prf > 0 && prf <= 1 ? (int64_t)(prf * (double)h->n_embd) / h->n_head : 0,
                  hf = prf > 0 && prf <= 1 ? (int64_t)(prf * (double)h->head_dim) : 0;
    if (dims <= 0 || dims % 2 || dims > h->head_dim || dims != hf)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: partial_rotary_factor %g rotates %lld of the %lld "
                         "dims of a head (Hugging Face: %lld): not an even count within it", dir, prf, (long long)dims,
                         (long long)h->head_dim, (long long)hf);
    h->rope_dim = dims;
    json_t *rs = json_object_get(c, "rope_scaling"), *sw = json_object_get(c, "sliding_window");
    h->orig_ctx = cfg_int(c, "original_max_position_embeddings",
                          cfg_int(rs, "original_max_position_embeddings", h->n_ctx));
    enum toy_status e = need_pos(dir, "original_max_position_embeddings", h->orig_ctx);
    if (e) return e;
    if (sw && !json_is_null(sw) && (!json_is_integer(sw) || json_integer_value(sw) <= 0))
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: sliding_window is neither null nor a positive integer", dir);
    h->swa = json_is_integer(sw) ? (int64_t)json_integer_value(sw) : 0;
    if (!rs || json_is_null(rs)) return TOY_OK;
    const char *rt = json_string_value(json_object_get(rs, "rope_type"));
    if (!rt) rt = json_string_value(json_object_get(rs, "type"));
    if (rt && !strcmp(rt, "default")) return TOY_OK; /* Hugging Face's name for none */
    if (!rt || (strcmp(rt, "longrope") && strcmp(rt, "su")))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: rope_scaling type '%s' for phi3 (toy knows longrope, su)",
                         dir, rt ? rt : "(none)");
    const char *names[2] = {"long_factor", "short_factor"};
    for (int k = 0; k < 2; k++) {
        json_t *a = json_object_get(rs, names[k]);
        if (!json_is_array(a))
            return toy_error(TOY_ERR_FORMAT, "%s/config.json: rope_scaling.%s is missing or not a list", dir, names[k]);
        if ((int64_t)json_array_size(a) != h->rope_dim / 2)
            return toy_error(TOY_ERR_FORMAT, "%s/config.json: rope_scaling.%s has %zu entries, not %lld (one per "
                             "rotated pair of the %lld rotated dims)", dir, names[k], json_array_size(a),
                             (long long)(h->rope_dim / 2), (long long)h->rope_dim);
        for (size_t i = 0; i < json_array_size(a); i++) {
            double v = json_number_value(json_array_get(a, i));
            if (!json_is_number(json_array_get(a, i)) || !(v > 0) || !isfinite(v))
                return toy_error(TOY_ERR_FORMAT, "%s/config.json: rope_scaling.%s[%zu] is not a positive number", dir,
                                 names[k], i);
        }
    }
    const double s = (double)h->n_ctx / (double)h->orig_ctx;
    json_t *af = json_object_get(rs, "attention_factor");
    h->attn_factor = json_is_number(af) ? json_number_value(af)
                     : s > 1 ? sqrt(1 + log(s) / log((double)h->orig_ctx)) : 1.0;
    h->longrope = true;
    return TOY_OK;
}

/* Phi-3's LongRoPE tables from config.json (phi3_config checked them): long_factor, then short_factor */
static float *phi3_rope_factors(json_t *c, const struct hp *h) {
    json_t *rs = json_object_get(c, "rope_scaling");
    const int64_t n = h->rope_dim / 2;
    float *f = malloc((size_t)(2 * n) * sizeof(float));
    if (!f) return NULL;
    for (int64_t i = 0; i < n; i++) {
        f[i] = (float)json_number_value(json_array_get(json_object_get(rs, "long_factor"), (size_t)i));
        f[n + i] = (float)json_number_value(json_array_get(json_object_get(rs, "short_factor"), (size_t)i));
    }
    return f;
}

/* Gemma 3 with its vision tower (model_type "gemma3": the 4B, 12B and 27B) keeps its text model's config in
 * text_config, whose absent keys take Gemma3TextConfig's defaults (transformers' configuration_gemma3.py): the 4B's
 * config.json gives no heads, head dim, vocabulary or RoPE bases. *out: that config, complete, as a gemma3_text
 * one (a new reference). The vision tower's config and tensors are left out. */
static enum toy_status gemma3_text_config(const char *dir, json_t *top, json_t **out) {
    json_t *tc = json_object_get(top, "text_config");
    if (!json_is_object(tc))
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: model_type 'gemma3' without a text_config object", dir);
    json_t *c = json_deep_copy(tc);
    if (!c) return toy_error(TOY_ERR_NOMEM, "out of memory");
    static const struct { const char *key; double v; bool is_int; } defaults[] = {
        {"vocab_size", 262208, true},           {"hidden_size", 2304, true},
        {"intermediate_size", 9216, true},      {"num_hidden_layers", 26, true},
        {"num_attention_heads", 8, true},       {"num_key_value_heads", 4, true},
        {"head_dim", 256, true},                {"max_position_embeddings", 131072, true},
        {"rms_norm_eps", 1e-6, false},          {"rope_theta", 1e6, false},
        {"query_pre_attn_scalar", 256, false},  {"sliding_window", 4096, true},
        {"rope_local_base_freq", 10000, false}};
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        if (!json_object_get(c, defaults[i].key))
            json_object_set_new(c, defaults[i].key, defaults[i].is_int ? json_integer((json_int_t)defaults[i].v)
                                                                       : json_real(defaults[i].v));
    if (!json_object_get(c, "layer_types") && !json_object_get(c, "sliding_window_pattern"))
        json_object_set_new(c, "sliding_window_pattern", json_integer(6));
    json_t *tie = json_object_get(top, "tie_word_embeddings");
    if (!json_object_get(c, "tie_word_embeddings"))
        json_object_set_new(c, "tie_word_embeddings", json_boolean(!tie || json_is_true(tie)));
    json_t *name = json_object_get(top, "_name_or_path");
    if (json_is_string(name) && !json_object_get(c, "_name_or_path")) json_object_set(c, "_name_or_path", name);
    json_object_set_new(c, "model_type", json_string("gemma3_text"));
    *out = c;
    return TOY_OK;
}

/* OLMo 3 as llama.cpp's Olmo2Model writes it (GGUF olmo2): attention.sliding_window and a bool per layer,
 * true where the layer slides (layer_types, or 3 of each 4), which toy reads as a period and so must repeat one */
static enum toy_status olmo3_layers(const char *dir, json_t *c, struct hp *h) {
    h->swa = cfg_int(c, "sliding_window", 4096);
    enum toy_status e = need_pos(dir, "sliding_window", h->swa);
    if (e) return e;
    h->slides = malloc((size_t)h->n_layer);
    if (!h->slides) return toy_error(TOY_ERR_NOMEM, "out of memory");
    int32_t period;
    return layer_slides(dir, c, h->n_layer, toy_llama_arch_rules("olmo2").swa_period, "OLMo 3", h->slides, &period);
}

static enum toy_status read_config(const char *dir, json_t *c, struct hp *h) {
    const char *mt = json_string_value(json_object_get(c, "model_type"));
    if (!mt) return toy_error(TOY_ERR_FORMAT, "%s/config.json: no model_type", dir);
    if (!strcmp(mt, "llama") || !strcmp(mt, "mistral")) h->arch = ARCH_LLAMA;
    else if (!strcmp(mt, "qwen2")) h->arch = ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3")) h->arch = ARCH_QWEN3;
    else if (!strcmp(mt, "gemma2")) h->arch = ARCH_GEMMA2;
    else if (!strcmp(mt, "gemma3_text")) h->arch = ARCH_GEMMA3;
    else if (!strcmp(mt, "smollm3")) h->arch = ARCH_SMOLLM3;
    else if (!strcmp(mt, "gpt2")) h->arch = ARCH_GPT2;
    else if (!strcmp(mt, "mixtral")) h->arch = ARCH_MIXTRAL;
    else if (!strcmp(mt, "qwen2_moe")) h->arch = ARCH_QWEN2MOE;
    else if (!strcmp(mt, "qwen3_moe")) h->arch = ARCH_QWEN3MOE;
    else if (!strcmp(mt, "olmoe")) h->arch = ARCH_OLMOE;
    else if (!strcmp(mt, "olmo2") || !strcmp(mt, "olmo3")) h->arch = ARCH_OLMO2; /* (OLMo 3: with its window) */
    else if (!strcmp(mt, "granite")) h->arch = ARCH_GRANITE;
    else if (!strcmp(mt, "phi3")) h->arch = ARCH_PHI3;
    else if (!strcmp(mt, "deepseek_v2") || !strcmp(mt, "deepseek_v3")) h->arch = ARCH_DEEPSEEK2;
    else if (!strcmp(mt, "bert")) h->arch = ARCH_BERT;
    else return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: model_type '%s' (supported: llama, mistral, qwen2, "
                          "qwen3, gemma2, gemma3_text, gemma3, smollm3, olmo2, olmo3, granite, phi3, gpt2, mixtral, qwen2_moe, qwen3_moe, "
                          "olmoe, deepseek_v2, deepseek_v3, bert)", dir, mt);
    enum toy_status e;
    h->n_vocab = cfg_int(c, "vocab_size", 0);
    if (h->arch == ARCH_GPT2) {
        h->n_embd = cfg_int(c, "n_embd", 0);
        h->n_layer = cfg_int(c, "n_layer", 0);
        h->n_head = cfg_int(c, "n_head", 0);
        h->n_head_kv = h->n_head;
        h->n_ff = cfg_int(c, "n_inner", 4 * h->n_embd);
        if (h->n_ff <= 0) h->n_ff = 4 * h->n_embd;
        h->n_ctx = cfg_int(c, "n_ctx", cfg_int(c, "n_positions", 1024));
        h->eps = cfg_num(c, "layer_norm_epsilon", 1e-5);
        h->tied = true;
    } else if (h->arch == ARCH_BERT) { /* an encoder: no head, LayerNorms, learned positions */
        h->n_embd = cfg_int(c, "hidden_size", 0);
        h->n_layer = cfg_int(c, "num_hidden_layers", 0);
        h->n_head = h->n_head_kv = cfg_int(c, "num_attention_heads", 0);
        h->n_ff = cfg_int(c, "intermediate_size", 0);
        h->n_ctx = cfg_int(c, "max_position_embeddings", 512);
        h->eps = cfg_num(c, "layer_norm_eps", 1e-12);
        h->tied = true; /* (no output matrix to look for) */
        const char *act = json_string_value(json_object_get(c, "hidden_act"));
        const char *pe = json_string_value(json_object_get(c, "position_embedding_type"));
        if (act && strcmp(act, "gelu") && strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh"))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: hidden_act '%s' (toy's BERT runs GELU)", dir, act);
        if (pe && strcmp(pe, "absolute"))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: position_embedding_type '%s' (toy's BERT learns "
                             "absolute positions)", dir, pe);
    } else {
        h->n_embd = cfg_int(c, "hidden_size", 0);
        h->n_layer = cfg_int(c, "num_hidden_layers", 0);
        h->n_head = cfg_int(c, "num_attention_heads", 0);
        h->n_head_kv = cfg_int(c, "num_key_value_heads", h->n_head);
        h->n_ff = cfg_int(c, "intermediate_size", 0);
        h->n_ctx = cfg_int(c, "max_position_embeddings", 4096);
        h->eps = cfg_num(c, "rms_norm_eps", 1e-6);
        h->rope_base = cfg_num(c, "rope_theta", 10000.0);
        json_t *tie = json_object_get(c, "tie_word_embeddings");
        h->tied = tie ? json_is_true(tie) : is_gemma(h->arch);
    }
    if ((e = need_pos(dir, "vocab_size", h->n_vocab)) || (e = need_pos(dir, "hidden_size", h->n_embd)) ||
        (e = need_pos(dir, "num_hidden_layers", h->n_layer)) || (e = need_pos(dir, "num_attention_heads", h->n_head)) ||
        (e = need_pos(dir, "num_key_value_heads", h->n_head_kv)) || (e = need_pos(dir, "intermediate_size", h->n_ff)))
        return e;
    h->head_dim = cfg_int(c, "head_dim", h->n_embd / h->n_head);
    if ((e = read_experts(dir, c, h))) return e;
    if (h->head_dim <= 0 || h->n_head % h->n_head_kv)
        return toy_error(TOY_ERR_FORMAT, "%s/config.json: %lld heads, %lld kv heads, head_dim %lld do not fit",
                         dir, (long long)h->n_head, (long long)h->n_head_kv, (long long)h->head_dim);
    if (is_gemma(h->arch)) { /* GGUF has no key for it: readers (llama.cpp, toy) take their rule's */
        double want = (double)toy_llama_gemma_query_scalar(arch_names[h->arch], h->n_layer, h->n_embd, h->n_head,
                                                           h->head_dim);
        double q = cfg_num(c, "query_pre_attn_scalar", want);
        if (q != want)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: query_pre_attn_scalar %g, not %g: a GGUF reader "
                             "would scale attention by 1/sqrt(%g)", dir, q, want, want);
        if ((e = gemma_layers(dir, c, h))) return e;
    }
    if (h->arch == ARCH_SMOLLM3 && (e = smollm3_layers(dir, c, h))) return e;
    if (h->arch == ARCH_PHI3 && (e = phi3_config(dir, c, h))) return e;
    if (!strcmp(mt, "olmo3") && (e = olmo3_layers(dir, c, h))) return e;
    /* GGUF keeps these as u32: a larger value would wrap to another model */
    const int64_t dims[] = {h->n_vocab, h->n_embd, h->n_layer, h->n_head, h->n_head_kv, h->n_ff, h->n_ctx, h->head_dim,
                            h->orig_ctx, h->swa};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] > UINT32_MAX)
            return toy_error(TOY_ERR_FORMAT, "%s/config.json: a dimension of %lld is past GGUF's 32 bits", dir,
                             (long long)dims[i]);
    if (h->arch != ARCH_GPT2 && h->arch != ARCH_PHI3) { /* scalings the graph does not know would run as plain RoPE,
                                                         * wrong past its context (Phi-3's: phi3_config) */
        json_t *rs = json_object_get(c, "rope_scaling");
        const char *rt = json_string_value(json_object_get(rs, "rope_type"));
        if (!rt) rt = json_string_value(json_object_get(rs, "type"));
        if (rs && !json_is_null(rs) &&
            (!rt || (strcmp(rt, "linear") && strcmp(rt, "yarn") && strcmp(rt, "llama3") && strcmp(rt, "default"))))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: rope_scaling type '%s' (toy knows linear, yarn, "
                             "llama3; longrope for phi3)", dir, rt ? rt : "(none)");
        double prf = cfg_num(c, "partial_rotary_factor", 1.0);
        if (prf != 1.0 && h->arch != ARCH_DEEPSEEK2)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s/config.json: partial_rotary_factor %g: toy rotates whole heads "
                             "(but for phi3)", dir, prf);
    }
    return TOY_OK;
}

/* A sentence-transformers model's pooling (1_Pooling/config.json): mean, cls or last token; another mode (max,
 * weighted mean, several at once) would give other vectors than the model's, so it is refused */
static enum toy_status read_pooling(const char *dir, struct hp *h) {
    char path[4096];
    snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
    if (access(path, F_OK) != 0) return TOY_OK;
    json_error_t jerr;
    json_t *c = json_load_file(path, 0, &jerr);
    if (!c) return toy_error(TOY_ERR_FORMAT, "%s: %s", path, jerr.text);
    static const struct { const char *key; int type; } modes[] = {
        {"pooling_mode_mean_tokens", 1}, {"pooling_mode_cls_token", 2}, {"pooling_mode_lasttoken", 3},
        {"pooling_mode_max_tokens", -1}, {"pooling_mode_mean_sqrt_len_tokens", -1},
        {"pooling_mode_weightedmean_tokens", -1}};
    int n = 0;
    const char *other = NULL;
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (!json_is_true(json_object_get(c, modes[i].key))) continue;
        n++;
        if (modes[i].type < 0) other = modes[i].key;
        else h->pooling = modes[i].type;
    }
    json_decref(c);
    if (other || n > 1)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: %s (toy pools embeddings by one of mean, cls token or last token)",
                         path, other ? other : "several pooling modes at once");
    return TOY_OK;
}

static enum toy_status write_hparams(struct toy_gguf_writer *w, const struct hp *h, json_t *c, const char *name) {
    const char *A = arch_names[h->arch];
    char k[128];
#define KEY(suffix) (snprintf(k, sizeof k, "%s." suffix, A), k)
    enum toy_status e = TOY_OK;
    e |= toy_gguf_writer_set_str(w, "general.architecture", A);
    e |= toy_gguf_writer_set_str(w, "general.name", name);
    e |= toy_gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)h->n_ctx);
    e |= toy_gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)h->n_embd);
    e |= toy_gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)h->n_ff);
    e |= toy_gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)h->n_layer);
    e |= toy_gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)h->n_head);
    if (h->pooling) e |= toy_gguf_writer_set_u32(w, KEY("pooling_type"), (uint32_t)h->pooling);
    if (h->arch == ARCH_BERT) { /* llama.cpp's BertModel: no rope keys; bidirectional */
        e |= toy_gguf_writer_set_f32(w, KEY("attention.layer_norm_epsilon"), (float)h->eps);
        e |= toy_gguf_writer_set_bool(w, KEY("attention.causal"), false);
        /* llama.cpp sizes token_types.weight by it, and refuses a file without it */
        e |= toy_gguf_writer_set_u32(w, "tokenizer.ggml.token_type_count", (uint32_t)cfg_int(c, "type_vocab_size", 2));
        return e ? toy_error(TOY_ERR_NOMEM, "out of memory (metadata)") : TOY_OK;
    }
    if (h->arch == ARCH_GPT2) {
        e |= toy_gguf_writer_set_f32(w, KEY("attention.layer_norm_epsilon"), (float)h->eps);
        return e ? toy_error(TOY_ERR_NOMEM, "out of memory (metadata)") : TOY_OK;
    }
    e |= toy_gguf_writer_set_u32(w, KEY("attention.head_count_kv"),
                                 (uint32_t)(h->arch == ARCH_DEEPSEEK2 ? 1 : h->n_head_kv)); /* MLA: one latent */
    e |= toy_gguf_writer_set_f32(w, KEY("rope.freq_base"), (float)h->rope_base);
    e |= toy_gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), (float)h->eps);
    if (h->arch == ARCH_DEEPSEEK2) { /* llama.cpp's MLA layout (toy_llama_write_gguf writes the same keys) */
        e |= toy_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)h->n_vocab);
        e |= toy_gguf_writer_set_u32(w, KEY("attention.kv_lora_rank"), (uint32_t)h->kv_lora);
        if (h->q_lora > 0) e |= toy_gguf_writer_set_u32(w, KEY("attention.q_lora_rank"), (uint32_t)h->q_lora);
        e |= toy_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)(h->kv_lora + h->rope_dim));
        e |= toy_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)h->kv_lora);
        e |= toy_gguf_writer_set_u32(w, KEY("attention.key_length_mla"), (uint32_t)(h->nope + h->rope_dim));
        e |= toy_gguf_writer_set_u32(w, KEY("attention.value_length_mla"), (uint32_t)h->v_dim);
        e |= toy_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)h->rope_dim);
        if (h->n_expert) {
            e |= toy_gguf_writer_set_u32(w, KEY("leading_dense_block_count"), (uint32_t)h->dense_lead);
            e |= toy_gguf_writer_set_u32(w, KEY("expert_shared_count"), (uint32_t)h->n_shexp);
            e |= toy_gguf_writer_set_f32(w, KEY("expert_weights_scale"), (float)h->routed_scale);
            e |= toy_gguf_writer_set_bool(w, KEY("expert_weights_norm"), h->norm_topk);
            e |= toy_gguf_writer_set_u32(w, KEY("expert_gating_func"), h->sigmoid ? 2 : 1);
        }
        json_t *rsd = json_object_get(c, "rope_scaling");
        if (json_is_object(rsd) && cfg_num(rsd, "mscale_all_dim", 0) != 0)
            e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"),
                                         (float)(0.1 * cfg_num(rsd, "mscale_all_dim", 0)));
    } else if (json_object_get(c, "head_dim")) {
        e |= toy_gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)h->head_dim);
        e |= toy_gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)h->head_dim);
    }
    if (h->n_expert) {
        e |= toy_gguf_writer_set_u32(w, KEY("expert_count"), (uint32_t)h->n_expert);
        e |= toy_gguf_writer_set_u32(w, KEY("expert_used_count"), (uint32_t)h->n_expert_used);
        if (toy_llama_moe_own_ff_key(A)) /* the others' experts are feed_forward_length wide */
            e |= toy_gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), (uint32_t)h->n_ff_exp);
        if (h->n_ff_shexp)
            e |= toy_gguf_writer_set_u32(w, KEY("expert_shared_feed_forward_length"), (uint32_t)h->n_ff_shexp);
    }
    if (permutes_qk(h->arch)) {
        e |= toy_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)h->n_vocab);
        e |= toy_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)h->head_dim);
    }
    if (is_gemma(h->arch)) { /* Gemma 2's softcaps default on; Gemma 3 has none (null) */
        bool g2 = h->arch == ARCH_GEMMA2;
        const struct toy_llama_arch_rules rules = toy_llama_arch_rules(A);
        double acap = cfg_cap(c, "attn_logit_softcapping", g2 ? 50.0 : 0);
        double fcap = cfg_cap(c, "final_logit_softcapping", g2 ? 30.0 : 0);
        if (acap > 0) e |= toy_gguf_writer_set_f32(w, KEY("attn_logit_softcapping"), (float)acap);
        if (fcap > 0) e |= toy_gguf_writer_set_f32(w, KEY("final_logit_softcapping"), (float)fcap);
        json_t *sw = json_object_get(c, "sliding_window");
        if (!json_is_null(sw)) {
            e |= toy_gguf_writer_set_u32(w, KEY("attention.sliding_window"),
                                         (uint32_t)cfg_int(c, "sliding_window", 4096));
            /* llama.cpp hard-codes the period (2, 6) and Gemma 3's local base (10000): keys only where they differ */
            if (h->swa_period != rules.swa_period)
                e |= toy_gguf_writer_set_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)h->swa_period);
        }
        double local = cfg_num(c, "rope_local_base_freq", rules.rope_base_swa);
        if (local != rules.rope_base_swa) e |= toy_gguf_writer_set_f32(w, KEY("rope.freq_base_swa"), (float)local);
    }
    if (h->slides) { /* OLMo 3: its window, and a bool per layer (true: it slides), as llama.cpp's Olmo2Model */
        uint8_t *b = malloc((size_t)h->n_layer);
        if (!b) return toy_error(TOY_ERR_NOMEM, "out of memory (metadata)");
        for (int64_t l = 0; l < h->n_layer; l++) b[l] = h->slides[l];
        e |= toy_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)h->swa);
        e |= toy_gguf_writer_set_arr(w, KEY("attention.sliding_window_pattern"), TOY_GGUF_BOOL, b, (uint64_t)h->n_layer);
        free(b);
    }
    if (h->arch == ARCH_GRANITE) { /* its multipliers under llama.cpp's keys (GraniteModel) */
        e |= toy_gguf_writer_set_f32(w, KEY("embedding_scale"), (float)cfg_num(c, "embedding_multiplier", 1.0));
        e |= toy_gguf_writer_set_f32(w, KEY("residual_scale"), (float)cfg_num(c, "residual_multiplier", 1.0));
        /* (GraniteConfig's default is 1, the scores unscaled) */
        e |= toy_gguf_writer_set_f32(w, KEY("attention.scale"), (float)cfg_num(c, "attention_multiplier", 1.0));
        e |= toy_gguf_writer_set_f32(w, KEY("logit_scale"), (float)cfg_num(c, "logits_scaling", 1.0));
    }
    if (h->arch == ARCH_PHI3) { /* llama.cpp's Phi3MiniModel: no rope.scaling.type; a window of 0 is none (Phi-4) */
        e |= toy_gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)h->n_vocab);
        e |= toy_gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)h->rope_dim);
        e |= toy_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)h->orig_ctx);
        e |= toy_gguf_writer_set_u32(w, KEY("attention.sliding_window"), (uint32_t)h->swa);
        if (h->longrope) e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"), (float)h->attn_factor);
        return e ? toy_error(TOY_ERR_NOMEM, "out of memory (metadata)") : TOY_OK;
    }
    json_t *rs = json_object_get(c, "rope_scaling");
    const char *rt = json_string_value(json_object_get(rs, "rope_type"));
    if (!rt) rt = json_string_value(json_object_get(rs, "type"));
    if (rt && (!strcmp(rt, "linear") || !strcmp(rt, "yarn"))) {
        e |= toy_gguf_writer_set_str(w, KEY("rope.scaling.type"), rt);
        e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.factor"), (float)cfg_num(rs, "factor", 1.0));
        if (!strcmp(rt, "yarn")) {
            e |= toy_gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"),
                                         (uint32_t)cfg_int(rs, "original_max_position_embeddings", h->n_ctx));
            if (h->arch != ARCH_DEEPSEEK2 && json_is_number(json_object_get(rs, "attention_factor")))
                e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.attn_factor"),
                                             (float)cfg_num(rs, "attention_factor", 0.0));
            /* the ramp's bounds where they are not llama.cpp's (and Hugging Face's) defaults, 32 and 1 */
            const double bf = cfg_num(rs, "beta_fast", 32.0), bs = cfg_num(rs, "beta_slow", 1.0);
            if (bf != 32.0) e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_fast"), (float)bf);
            if (bs != 1.0) e |= toy_gguf_writer_set_f32(w, KEY("rope.scaling.yarn_beta_slow"), (float)bs);
        }
    }
#undef KEY
    return e ? toy_error(TOY_ERR_NOMEM, "out of memory (metadata)") : TOY_OK;
}

/* Llama 3 "rope_scaling": per-frequency factors (llama.cpp's
 * generate_extra_tensors), written as rope_freqs.weight. */
static float *llama3_rope_factors(json_t *rs, const struct hp *h) {
    const double factor = cfg_num(rs, "factor", 8.0), lo = cfg_num(rs, "low_freq_factor", 1.0),
                 hi = cfg_num(rs, "high_freq_factor", 4.0),
                 old_ctx = (double)cfg_int(rs, "original_max_position_embeddings", 8192);
    const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi;
    const int64_t n = h->head_dim / 2;
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) return NULL;
    for (int64_t i = 0; i < n; i++) {
        const double freq = 1.0 / pow(h->rope_base, (double)(2 * i) / (double)h->head_dim);
        const double wavelen = 2 * M_PI / freq;
        double r;
        if (wavelen < hi_wavelen) r = 1.0;
        else if (wavelen > lo_wavelen) r = factor;
        else {
            const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
            r = 1.0 / ((1 - smooth) / factor + smooth);
        }
        f[i] = (float)r;
    }
    return f;
}

/* ---- tensor names ------------------------------------------------------------- */

/* Maps an HF tensor name to llama.cpp's; 1 = mapped, 0 = skip (buffers),
 * -1 = unknown. Sets the transforms in *j. */
/* a mixture's tensors, rest being what follows "layers.N.": the GGUF name
 * (and *expert, for one expert's matrix), or NULL */
static const char *map_expert(const struct hp *h, const char *rest, long *expert) {
    *expert = -1;
    if (!h->n_expert) return NULL;
    bool mixtral = h->arch == ARCH_MIXTRAL;
    const char *moe = mixtral ? "block_sparse_moe." : "mlp.";
    if (strncmp(rest, moe, strlen(moe))) return NULL;
    rest += strlen(moe);
    if (!strcmp(rest, "gate")) return "ffn_gate_inp";
    if (!strcmp(rest, "shared_expert_gate")) return "ffn_gate_inp_shexp";
    if (!strcmp(rest, "shared_expert.gate_proj")) return "ffn_gate_shexp";
    if (!strcmp(rest, "shared_expert.up_proj")) return "ffn_up_shexp";
    if (!strcmp(rest, "shared_expert.down_proj")) return "ffn_down_shexp";
    if (!strcmp(rest, "shared_experts.gate_proj")) return "ffn_gate_shexp"; /* DeepSeek's, all shared ones in one */
    if (!strcmp(rest, "shared_experts.up_proj")) return "ffn_up_shexp";
    if (!strcmp(rest, "shared_experts.down_proj")) return "ffn_down_shexp";
    if (strncmp(rest, "experts.", 8)) return NULL;
    char *end;
    long x = strtol(rest + 8, &end, 10);
    if (end == rest + 8 || *end != '.' || x < 0 || x >= h->n_expert) return NULL;
    static const struct { const char *hf, *gg; } names[] = {
        {"w1", "ffn_gate_exps"}, {"w3", "ffn_up_exps"}, {"w2", "ffn_down_exps"}, /* Mixtral */
        {"gate_proj", "ffn_gate_exps"}, {"up_proj", "ffn_up_exps"}, {"down_proj", "ffn_down_exps"}};
    for (size_t i = mixtral ? 0 : 3; i < (mixtral ? 3u : 6u); i++)
        if (!strcmp(end + 1, names[i].hf)) {
            *expert = x;
            return names[i].gg;
        }
    return NULL;
}

/* BERT's names (modeling_bert.py: BertModel's, or under "bert." in a model with a head) as llama.cpp's
 * BertModel maps them; the pooler, the masked-LM head and the position_ids buffer are not taken */
static int map_bert(const struct hp *h, const char *s, char *out, size_t outn) {
    if (!strncmp(s, "bert.", 5)) s += 5;
    if (!strncmp(s, "pooler.", 7) || !strncmp(s, "cls.", 4) || strstr(s, "position_ids")) return 0;
    const char *dot = strrchr(s, '.');
    if (!dot) return -1;
    /* old checkpoints name a LayerNorm's parameters gamma and beta */
    const char *suffix = !strcmp(dot, ".weight") || !strcmp(dot, ".gamma") ? ".weight"
                         : !strcmp(dot, ".bias") || !strcmp(dot, ".beta")  ? ".bias"
                                                                           : NULL;
    if (!suffix) return -1;
    char stem[256];
    if ((size_t)(dot - s) >= sizeof stem) return -1;
    memcpy(stem, s, (size_t)(dot - s));
    stem[dot - s] = 0;
    static const struct { const char *hf, *gg; } top[] = {
        {"embeddings.word_embeddings", "token_embd"}, {"embeddings.position_embeddings", "position_embd"},
        {"embeddings.token_type_embeddings", "token_types"}, {"embeddings.LayerNorm", "token_embd_norm"}};
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (!strcmp(stem, top[i].hf)) return snprintf(out, outn, "%s%s", top[i].gg, suffix), 1;
    if (strncmp(stem, "encoder.layer.", 14)) return -1;
    char *end;
    long layer = strtol(stem + 14, &end, 10);
    if (end == stem + 14 || *end != '.' || layer < 0 || layer >= h->n_layer) return -1;
    static const struct { const char *hf, *gg; } blk[] = {
        {"attention.self.query", "attn_q"}, {"attention.self.key", "attn_k"}, {"attention.self.value", "attn_v"},
        {"attention.output.dense", "attn_output"}, {"attention.output.LayerNorm", "attn_output_norm"},
        {"intermediate.dense", "ffn_up"}, {"output.dense", "ffn_down"}, {"output.LayerNorm", "layer_output_norm"}};
    for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
        if (!strcmp(end + 1, blk[i].hf)) return snprintf(out, outn, "blk.%ld.%s%s", layer, blk[i].gg, suffix), 1;
    return -1;
}

static int map_name(const struct hp *h, const char *hf, char *out, size_t outn, struct job *j, long *expert) {
    *expert = -1;
    const char *s = hf;
    if (h->arch == ARCH_BERT) return map_bert(h, s, out, outn);
    const bool gpt2 = h->arch == ARCH_GPT2;
    if (h->multimodal) { /* the text model under language_model (two spellings); the vision tower is not taken */
        static const char *const vision[] = {"vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                                             "model.multi_modal_projector."};
        for (size_t i = 0; i < sizeof vision / sizeof vision[0]; i++)
            if (!strncmp(s, vision[i], strlen(vision[i]))) return 0;
        if (!strncmp(s, "language_model.model.", 21) || !strncmp(s, "model.language_model.", 21)) s += 21;
        else if (!strncmp(s, "language_model.", 15)) s += 15; /* language_model.lm_head */
    }
    if (strstr(s, "rotary_emb.inv_freq") || (gpt2 && (strstr(s, ".attn.bias") || strstr(s, ".attn.masked_bias"))))
        return 0;
    if (!strncmp(s, "model.", 6)) s += 6;
    else if (!strncmp(s, "transformer.", 12)) s += 12;
    /* DeepSeek-V3's routing bias has no .weight/.bias suffix: read it as mlp.exp_probs_b.bias (llama.cpp's name) */
    char fixed[300];
    const char *ec = ".mlp.gate.e_score_correction_bias";
    size_t sl = strlen(s), el = strlen(ec);
    if (h->arch == ARCH_DEEPSEEK2 && sl > el && sl < 200 && !strcmp(s + sl - el, ec)) {
        snprintf(fixed, sizeof fixed, "%.*s.mlp.exp_probs_b.bias", (int)(sl - el), s);
        s = fixed;
    }
    const char *suffix = strrchr(s, '.');
    if (!suffix || (strcmp(suffix, ".weight") && strcmp(suffix, ".bias"))) return -1;
    size_t stem_len = (size_t)(suffix - s);
    char stem[256];
    if (stem_len >= sizeof stem) return -1;
    memcpy(stem, s, stem_len);
    stem[stem_len] = 0;
    static const struct { const char *hf, *gg; } top_llama[] = {
        {"embed_tokens", "token_embd"}, {"norm", "output_norm"}, {"lm_head", "output"}};
    static const struct { const char *hf, *gg; } top_gpt2[] = {
        {"wte", "token_embd"}, {"wpe", "position_embd"}, {"ln_f", "output_norm"}};
    if (gpt2) {
        if (!strcmp(stem, "lm_head")) return 0; /* tied: output is written from wte */
        for (size_t i = 0; i < 3; i++)
            if (!strcmp(stem, top_gpt2[i].hf)) { snprintf(out, outn, "%s%s", top_gpt2[i].gg, suffix); return 1; }
    } else {
        for (size_t i = 0; i < 3; i++)
            if (!strcmp(stem, top_llama[i].hf)) {
                snprintf(out, outn, "%s%s", top_llama[i].gg, suffix);
                if (is_gemma(h->arch) && !strcmp(stem, "norm")) j->add_one = true;
                return 1;
            }
    }
    const char *lp = gpt2 ? "h." : "layers.";
    if (strncmp(stem, lp, strlen(lp))) return -1;
    char *end;
    long layer = strtol(stem + strlen(lp), &end, 10);
    if (end == stem + strlen(lp) || *end != '.' || layer < 0 || layer >= h->n_layer) return -1;
    const char *rest = end + 1;
    static const struct { const char *hf, *gg; } blk_llama[] = {
        {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"},
        {"self_attn.v_proj", "attn_v"}, {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
        {"self_attn.k_norm", "attn_k_norm"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
        {"mlp.down_proj", "ffn_down"}, {"pre_feedforward_layernorm", "ffn_norm"},
        {"post_feedforward_layernorm", "post_ffw_norm"}};
    static const struct { const char *hf, *gg; } blk_gpt2[] = {
        {"ln_1", "attn_norm"}, {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
        {"ln_2", "ffn_norm"}, {"mlp.c_fc", "ffn_up"}, {"mlp.c_proj", "ffn_down"}};
    const char *gg = NULL;
    if (gpt2) {
        for (size_t i = 0; i < sizeof blk_gpt2 / sizeof blk_gpt2[0]; i++)
            if (!strcmp(rest, blk_gpt2[i].hf)) gg = blk_gpt2[i].gg;
        if (gg && !strcmp(suffix, ".weight") && strcmp(gg, "attn_norm") && strcmp(gg, "ffn_norm")) j->transpose = true;
    } else {
        if (!strcmp(rest, "post_attention_layernorm"))
            gg = is_gemma(h->arch) || h->arch == ARCH_OLMO2 ? "post_attention_norm" : "ffn_norm";
        if (h->arch == ARCH_PHI3) { /* fused, and kept so: [q; k; v] rows, [gate; up] rows */
            if (!strcmp(rest, "self_attn.qkv_proj")) gg = "attn_qkv";
            if (!strcmp(rest, "mlp.gate_up_proj")) gg = "ffn_up";
        }
        for (size_t i = 0; !gg && i < sizeof blk_llama / sizeof blk_llama[0]; i++)
            if (!strcmp(rest, blk_llama[i].hf)) gg = blk_llama[i].gg;
        if (!gg) gg = map_expert(h, rest, expert);
        if (gg && permutes_qk(h->arch)) { /* weights and biases alike (llama.cpp permutes both) */
            if (!strcmp(gg, "attn_q")) j->permute_heads = (int)h->n_head;
            if (!strcmp(gg, "attn_k")) j->permute_heads = (int)h->n_head_kv;
        }
        if (gg && is_gemma(h->arch) && strstr(rest, "norm") && !strcmp(suffix, ".weight")) j->add_one = true;
        static const struct { const char *hf, *gg; } blk_mla[] = {
            {"self_attn.q_a_proj", "attn_q_a"}, {"self_attn.q_a_layernorm", "attn_q_a_norm"},
            {"self_attn.q_b_proj", "attn_q_b"}, {"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"},
            {"self_attn.kv_a_layernorm", "attn_kv_a_norm"}, {"self_attn.kv_b_proj", "attn_kv_b"},
            {"mlp.exp_probs_b", "exp_probs_b"}};
        for (size_t i = 0; h->arch == ARCH_DEEPSEEK2 && !gg && i < sizeof blk_mla / sizeof blk_mla[0]; i++)
            if (!strcmp(rest, blk_mla[i].hf)) gg = blk_mla[i].gg;
    }
    if (!gg) return -1;
    snprintf(out, outn, "blk.%ld.%s%s", layer, gg, suffix);
    return 1;
}

/* The stored type of a tensor: 1-D stays f32; 2-D gets the requested type
 * when its rows fit the block, else q8_0, else f16. */
enum toy_dtype toy_row_type_for(enum toy_dtype want, int64_t ne0) {
    if (ne0 % toy_dtype_block_size(want) == 0) return want;
    if (toy_dtype_info(want)->quantized && ne0 % 32 == 0) return TOY_Q8_0;
    return toy_dtype_info(want)->quantized ? TOY_F16 : want;
}

static enum toy_dtype out_type(enum toy_dtype want, int n_dims, int64_t ne0) {
    return n_dims < 2 ? TOY_F32 : toy_row_type_for(want, ne0);
}

static bool file_exists(const char *dir, const char *name) {
    char p[4096];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

enum toy_status toy_hf_convert(const char *dir, const char *out_path, const struct toy_convert_opts *opts,
                               struct toy_convert_report *report) {
    if (!dir || !out_path)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_hf_convert: NULL %s", dir ? "output path" : "model folder");
    struct toy_convert_opts o = opts ? *opts : (struct toy_convert_opts){0};
    struct toy_convert_report rep_local;
    struct toy_convert_report *rep = report ? report : &rep_local;
    memset(rep, 0, sizeof *rep);
    if (!toy_can_quantize(o.type))
        return toy_error(TOY_ERR_UNSUPPORTED, "cannot write tensors of type %s", toy_dtype_name(o.type));
    /* the GGUF replaces what is at out_path: never one of the files it is made from */
    char rin[PATH_MAX], rout[PATH_MAX];
    if (realpath(dir, rin) && realpath(out_path, rout)) {
        size_t n = strlen(rin);
        const char *leaf = strrchr(rout, '/');
        leaf = leaf ? leaf + 1 : rout;
        size_t ll = strlen(leaf);
        bool input = !strncmp(rout, rin, n) && rout[n] == '/' && !strchr(rout + n + 1, '/') &&
                     ((ll > 12 && !strcmp(leaf + ll - 12, ".safetensors")) || (ll > 5 && !strcmp(leaf + ll - 5, ".json")) ||
                      !strcmp(leaf, "tokenizer.model") || !strcmp(leaf, "merges.txt") || !strcmp(leaf, "vocab.bpe"));
        if (input) return toy_error(TOY_ERR_INVALID_ARG, "convert: -o %s is one of the model's own files", out_path);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr);
    if (!cfg) return toy_error(TOY_ERR_NOT_FOUND, "%s: %s", path, jerr.text);
    const char *top_type = json_string_value(json_object_get(cfg, "model_type"));
    const bool multimodal = top_type && !strcmp(top_type, "gemma3"); /* its text model alone */
    if (multimodal) {
        json_t *text = NULL;
        enum toy_status te = gemma3_text_config(dir, cfg, &text);
        json_decref(cfg);
        if (te) return te;
        cfg = text;
    }
    struct hp h = {0};
    struct toy_safetensors *st = NULL;
    struct toy_gguf_writer *w = NULL;
    struct toy_tokenizer *tok = NULL;
    struct job *jobs = NULL;
    int64_t n_jobs = 0; /* jobs' slots (their experts freed at the end) */
    float *rope_freqs = NULL; /* Llama 3's, or Phi-3's long then short factors */
    enum toy_status e = read_config(dir, cfg, &h);
    if (!e) e = read_pooling(dir, &h);
    if (e) goto done;
    h.multimodal = multimodal;
    if ((e = toy_safetensors_open(dir, &st))) goto done;
    if ((e = toy_gguf_writer_init(&w))) goto done;
    const char *slash = strrchr(dir, '/');
    const char *base = slash && slash[1] ? slash + 1 : dir;
    const char *name = json_string_value(json_object_get(cfg, "_name_or_path"));
    if ((e = write_hparams(w, &h, cfg, name && *name ? name : base))) goto done;
    snprintf(rep->arch, sizeof rep->arch, "%s", arch_names[h.arch]);

    /* tokenizer */
    if (!o.skip_tokenizer) {
        if (file_exists(dir, "tokenizer.json") || file_exists(dir, "tokenizer.model") ||
            (file_exists(dir, "vocab.json") && file_exists(dir, "merges.txt")) ||
            (file_exists(dir, "encoder.json") && file_exists(dir, "vocab.bpe"))) { /* what toy_tokenizer_load reads */
            if ((e = toy_tokenizer_load(dir, &tok))) goto done;
            int64_t nt = toy_tokenizer_n_vocab(tok);
            if (nt > h.n_vocab) { /* ids past the embedding: the file would load and fail on the first such token */
                e = toy_error(TOY_ERR_FORMAT, "%s: the tokenizer has %lld tokens, the embedding %lld rows "
                              "(vocab_size)", dir, (long long)nt, (long long)h.n_vocab);
                goto done;
            }
            if (nt < h.n_vocab)
                snprintf(rep->note, sizeof rep->note, "the tokenizer has %lld tokens for %lld embedding rows: the "
                         "token list is padded with [PAD<id>] tokens, as llama.cpp's converter does",
                         (long long)nt, (long long)h.n_vocab);
            if ((e = toy_tokenizer_write_gguf_rows(tok, w, h.n_vocab))) goto done;
            rep->tokenizer = true;
        } else {
            snprintf(rep->note, sizeof rep->note, "no tokenizer.json, tokenizer.model, vocab.json + merges.txt or encoder.json + vocab.bpe in %s: GGUF has no tokenizer", dir);
        }
    }
    if (toy_dtype_info(o.type)->quantized) toy_gguf_writer_set_u32(w, "general.quantization_version", 2);
    toy_gguf_writer_set_u32(w, "general.file_type", toy_file_type_for(o.type));

    int64_t n_src = toy_safetensors_n_tensors(st);
    /* DeepSeek's kv_b_proj makes two a layer; computed ones: rope_freqs, Phi-3's two rope factors, GPT-2's output */
    jobs = calloc((size_t)(n_src + 2 + h.n_layer), sizeof *jobs);
    n_jobs = jobs ? n_src + 2 + h.n_layer : 0;
    if (!jobs) { e = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
    int64_t nj = 0, n_vision = 0;
    bool have_output = false;
    int64_t tok_embd_job = -1;
    for (int64_t i = 0; i < n_src; i++) {
        const struct toy_st_tensor *t = toy_safetensors_tensor(st, i);
        struct job *j = &jobs[nj];
        memset(j, 0, sizeof *j);
        char gname[TOY_GGUF_NAME_MAX + 64];
        long expert;
        int m = map_name(&h, t->name, gname, sizeof gname, j, &expert);
        if (m == 0 && h.multimodal && !strstr(t->name, "language_model")) n_vision++;
        if (m == 0) continue;
        if (m < 0) {
            e = toy_error(TOY_ERR_UNSUPPORTED, "%s: cannot map tensor '%s' to a llama.cpp name", dir, t->name);
            goto done;
        }
        if (t->type != TOY_F32 && t->type != TOY_F16 && t->type != TOY_BF16 && t->type != TOY_F64) {
            e = toy_error(TOY_ERR_UNSUPPORTED, "tensor '%s' is %s, not a float type", t->name, toy_dtype_name(t->type));
            goto done;
        }
        if (t->n_dims < 1 || t->n_dims > 4) {
            e = toy_error(TOY_ERR_UNSUPPORTED, "tensor '%s' has %d dims", t->name, t->n_dims);
            goto done;
        }
        j->st = st;
        j->src = i;
        j->n_dims = t->n_dims;
        for (int d = 0; d < 4; d++) j->ne[d] = d < t->n_dims ? t->shape[t->n_dims - 1 - d] : 1;
        if (j->n_dims == 2 && j->ne[1] == 1 && strstr(gname, ".ffn_gate_inp_shexp.")) j->n_dims = 1; /* {d}, as llama.cpp's */
        if (strlen(gname) >= TOY_GGUF_NAME_MAX) {
            e = toy_error(TOY_ERR_FORMAT, "tensor name '%s' is too long", gname);
            goto done;
        }
        memcpy(j->name, gname, strlen(gname) + 1); /* length checked above */
        rep->n_params += t->n_elements;
        if (expert >= 0) { /* one expert's matrix: into the stack of its layer's experts */
            if (t->n_dims != 2) { e = toy_error(TOY_ERR_FORMAT, "'%s' should be 2-D", t->name); goto done; }
            struct job *s = NULL;
            for (int64_t q = 0; q < nj && !s; q++)
                if (jobs[q].experts && !strcmp(jobs[q].name, j->name)) s = &jobs[q];
            if (!s) { /* the first of them: a 3-d tensor of n_expert matrices */
                j->ne[2] = h.n_expert;
                j->n_dims = 3;
                j->experts = malloc((size_t)h.n_expert * sizeof *j->experts);
                if (!j->experts) { e = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
                for (int64_t q = 0; q < h.n_expert; q++) j->experts[q] = -1;
                j->out = out_type(o.type, 3, j->ne[0]);
                s = j;
                nj++;
            } else if (s->ne[0] != j->ne[0] || s->ne[1] != j->ne[1]) {
                e = toy_error(TOY_ERR_FORMAT, "'%s' is not the shape of the other experts' %s", t->name, gname);
                goto done;
            }
            if (s->experts[expert] >= 0) { e = toy_error(TOY_ERR_FORMAT, "'%s' is there twice", t->name); goto done; }
            s->experts[expert] = i;
            continue;
        }
        if (j->transpose) {
            if (t->n_dims != 2) { e = toy_error(TOY_ERR_FORMAT, "'%s' should be 2-D", t->name); goto done; }
            int64_t x = j->ne[0]; j->ne[0] = j->ne[1]; j->ne[1] = x;
        }
        int64_t rows = j->n_dims == 1 ? j->ne[0] : j->ne[1];
        if (j->permute_heads && (rows % (2 * j->permute_heads))) {
            e = toy_error(TOY_ERR_FORMAT, "'%s': %lld rows do not split into %d heads", t->name,
                          (long long)rows, j->permute_heads);
            goto done;
        }
        j->out = out_type(o.type, j->n_dims, j->ne[0]);
        if (h.arch == ARCH_PHI3 && (strstr(gname, ".attn_qkv.weight") || strstr(gname, ".ffn_up.weight"))) {
            const bool qkv = strstr(gname, ".attn_qkv.") != NULL;
            const int64_t want = qkv ? (h.n_head + 2 * h.n_head_kv) * h.head_dim : 2 * h.n_ff;
            if (j->n_dims != 2 || j->ne[0] != h.n_embd || j->ne[1] != want) {
                e = toy_error(TOY_ERR_FORMAT, "%s: '%s' is %lld rows of %lld, not %lld of %lld (%s)", dir, t->name,
                              (long long)(j->n_dims == 2 ? j->ne[1] : 1), (long long)j->ne[0], (long long)want,
                              (long long)h.n_embd, qkv ? "the heads' q, k and v rows" : "gate rows, then up rows");
                goto done;
            }
        }
        if (strstr(gname, ".attn_kv_b.")) { /* DeepSeek: each head's key rows transposed, and its value rows */
            const int64_t r = h.kv_lora, H = h.n_head, dn = h.nope, dv = h.v_dim;
            if (j->n_dims != 2 || j->ne[0] != r || j->ne[1] != H * (dn + dv)) {
                e = toy_error(TOY_ERR_FORMAT, "'%s' is not {%lld heads x (%lld + %lld), %lld}", t->name, (long long)H,
                              (long long)dn, (long long)dv, (long long)r);
                goto done;
            }
            struct job *jv = &jobs[nj + 1];
            *jv = *j;
            char *kb = strstr(j->name, "attn_kv_b"), *vb = strstr(jv->name, "attn_kv_b");
            memcpy(kb, "attn_k_b", 8), memmove(kb + 8, kb + 9, strlen(kb + 9) + 1);
            memcpy(vb, "attn_v_b", 8), memmove(vb + 8, vb + 9, strlen(vb + 9) + 1);
            j->kv_b_part = 1, jv->kv_b_part = 2;
            j->kv_b_nope = jv->kv_b_nope = dn;
            j->kv_b_v = jv->kv_b_v = dv;
            j->n_dims = jv->n_dims = 3;
            j->ne[0] = dn, j->ne[1] = r, j->ne[2] = H;
            jv->ne[0] = r, jv->ne[1] = dv, jv->ne[2] = H;
            j->out = out_type(o.type, 3, dn);
            jv->out = out_type(o.type, 3, r);
            nj += 2;
            continue;
        }
        if (!strcmp(gname, "output.weight")) have_output = true;
        if (!strcmp(gname, "token_embd.weight")) tok_embd_job = nj;
        nj++;
    }
    if (tok_embd_job < 0) { e = toy_error(TOY_ERR_FORMAT, "%s has no token embedding", dir); goto done; }
    for (int64_t q = 0; q < nj; q++)
        for (int64_t x = 0; jobs[q].experts && x < h.n_expert; x++)
            if (jobs[q].experts[x] < 0) {
                e = toy_error(TOY_ERR_FORMAT, "%s: no expert %lld for %s", dir, (long long)x, jobs[q].name);
                goto done;
            }
    if (h.arch == ARCH_GPT2 && !have_output) {
        /* llama.cpp's GPT-2 files carry output.weight = token_embd */
        jobs[nj] = jobs[tok_embd_job];
        snprintf(jobs[nj].name, sizeof jobs[nj].name, "output.weight");
        nj++;
    } else if (!have_output && !h.tied) {
        e = toy_error(TOY_ERR_FORMAT, "%s: no lm_head.weight and tie_word_embeddings is false", dir);
        goto done;
    }
    json_t *rs = json_object_get(cfg, "rope_scaling");
    const char *rt = json_string_value(json_object_get(rs, "rope_type"));
    if (h.arch == ARCH_LLAMA && rt && !strcmp(rt, "llama3")) {
        rope_freqs = llama3_rope_factors(rs, &h);
        if (!rope_freqs) { e = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
        struct job *j = &jobs[nj++];
        memset(j, 0, sizeof *j);
        j->src = -1;
        j->values = rope_freqs;
        j->out = TOY_F32;
        j->n_dims = 1;
        j->ne[0] = h.head_dim / 2;
        j->ne[1] = j->ne[2] = j->ne[3] = 1;
        snprintf(j->name, sizeof j->name, "rope_freqs.weight");
    }
    if (h.longrope) { /* Phi-3's LongRoPE: rope_factors_long.weight, rope_factors_short.weight (F32, rope dims / 2) */
        rope_freqs = phi3_rope_factors(cfg, &h);
        if (!rope_freqs) { e = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
        for (int k = 0; k < 2; k++) {
            struct job *j = &jobs[nj++];
            memset(j, 0, sizeof *j);
            j->src = -1;
            j->values = rope_freqs + k * (h.rope_dim / 2);
            j->out = TOY_F32;
            j->n_dims = 1;
            j->ne[0] = h.rope_dim / 2;
            j->ne[1] = j->ne[2] = j->ne[3] = 1;
            snprintf(j->name, sizeof j->name, k ? "rope_factors_short.weight" : "rope_factors_long.weight");
        }
    }
    if (n_vision) { /* say what the file leaves out (after the tokenizer's note, if any) */
        size_t k = strlen(rep->note);
        snprintf(rep->note + k, sizeof rep->note - k, "%sthe vision tower and projector (%lld tensors) are left out: "
                 "the file holds the text model", k ? "; " : "", (long long)n_vision);
    }
    for (int64_t i = 0; i < nj; i++) jobs[i].order = job_order(jobs[i].name, i);
    qsort(jobs, (size_t)nj, sizeof *jobs, job_cmp);
    for (int64_t i = 0; i < nj; i++)
        if ((e = toy_gguf_writer_add_tensor_fn(w, jobs[i].name, jobs[i].out, jobs[i].n_dims, jobs[i].ne, fill_job,
                                               &jobs[i])))
            goto done;
    rep->n_tensors = toy_gguf_writer_n_tensors(w);
    toy_gguf_writer_set_progress(w, o.progress, o.progress_ctx);
    /* written beside out_path and loaded before it takes its place: what the loader refuses (a missing tensor, a
     * shape that is not the config's) is refused here, not at the first generate, and a file already at out_path
     * stays as it was */
    char staged[PATH_MAX];
    if (snprintf(staged, sizeof staged, "%s.converting", out_path) >= (int)sizeof staged) {
        e = toy_error(TOY_ERR_RANGE, "path too long: %s", out_path);
        goto done;
    }
    e = toy_gguf_writer_write(w, staged);
    if (!e) {
        enum toy_status le;
        if (h.arch == ARCH_GPT2) {
            struct toy_gpt2 *gm = NULL;
            le = toy_gpt2_load(staged, false, &gm);
            toy_gpt2_free(gm);
        } else if (h.arch == ARCH_BERT) {
            struct toy_bert *bm = NULL;
            le = toy_bert_load(staged, &bm);
            toy_bert_free(bm);
        } else {
            struct toy_llama *lm = NULL;
            le = toy_llama_load(staged, false, &lm);
            toy_llama_free(lm);
        }
        if (le) e = toy_error(le, "convert: the converted %s does not load: %s", dir, toy_last_error());
        else if (rename(staged, out_path) != 0)
            e = toy_error(TOY_ERR_IO, "%s: %s", out_path, strerror(errno));
    }
    if (e) unlink(staged);
done:
    toy_tokenizer_free(tok);
    toy_gguf_writer_free(w);
    toy_safetensors_close(st);
    for (int64_t q = 0; jobs && q < n_jobs; q++) free(jobs[q].experts);
    free(jobs);
    free(rope_freqs);
    free(h.slides);
    json_decref(cfg);
    return e;
}

/* ---- toy quantize ------------------------------------------------------------- */

struct rq {
    const struct toy_gguf *g;
    int64_t i;
    enum toy_dtype out;
};

static enum toy_status fill_requant(void *ctx, void *dst, size_t nbytes) {
    struct rq *r = ctx;
    const struct toy_gguf_tensor *t = toy_gguf_tensor(r->g, r->i);
    float *a = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
    if (!a) return toy_error(TOY_ERR_NOMEM, "quantize: out of memory");
    enum toy_status e = toy_gguf_tensor_read_f32(r->g, r->i, a, t->n_elements);
    if (!e && t->n_elements) e = quantize_rows(r->out, a, dst, t->n_elements, t->ne[0]);
    (void)nbytes;
    free(a);
    return e;
}

enum toy_status toy_gguf_quantize(const char *in_path, const char *out_path, enum toy_dtype type,
                                  toy_gguf_progress_fn progress, void *progress_ctx) {
    if (!toy_can_quantize(type))
        return toy_error(TOY_ERR_UNSUPPORTED, "quantize: cannot write tensors of type %s", toy_dtype_name(type));
    struct toy_gguf *g;
    enum toy_status e = toy_gguf_open(in_path, &g);
    if (e) return e;
    const char *what;
    if (!toy_gguf_is_model(g, &what)) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_INVALID_ARG, "quantize: %s is %s", in_path, what);
    }
    struct toy_gguf_writer *w = NULL;
    struct rq *rqs = calloc((size_t)toy_gguf_n_tensors(g) + 1, sizeof *rqs);
    if (!rqs) { toy_gguf_close(g); return toy_error(TOY_ERR_NOMEM, "quantize: out of memory"); }
    if ((e = toy_gguf_writer_init(&w))) goto done;
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++) {
        const char *k = toy_gguf_kv_key(g, i);
        if (!strcmp(k, "general.file_type") || !strcmp(k, "general.quantization_version")) continue;
        if ((e = toy_gguf_writer_copy_kv(w, g, i))) goto done;
    }
    if (toy_dtype_info(type)->quantized) toy_gguf_writer_set_u32(w, "general.quantization_version", 2);
    toy_gguf_writer_set_u32(w, "general.file_type", toy_file_type_for(type));
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        enum toy_dtype out = t->n_dims >= 2 ? out_type(type, t->n_dims, t->ne[0]) : t->type;
        if (out == t->type || !toy_can_dequantize(t->type)) {
            e = toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims ? t->n_dims : 1, t->ne, t->data);
        } else {
            rqs[i] = (struct rq){g, i, out};
            e = toy_gguf_writer_add_tensor_fn(w, t->name, out, t->n_dims, t->ne, fill_requant, &rqs[i]);
        }
        if (e) goto done;
    }
    toy_gguf_writer_set_progress(w, progress, progress_ctx);
    e = toy_gguf_writer_write(w, out_path);
done:
    toy_gguf_writer_free(w);
    free(rqs);
    toy_gguf_close(g);
    return e;
}
