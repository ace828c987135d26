/* lora.c: LoRA adapters for Llama-family models (toy/finetune.h): attach
 * (PEFT init), dropout masks, adapter GGUF save/load in llama.cpp's
 * convention, and merging into a model or a GGUF file.
 *
 * LoRA: Hu et al. 2021; the init and scale follow PEFT's LoraLayer
 * (A kaiming_uniform_(a = sqrt 5) -> U(-1/sqrt(in), 1/sqrt(in)), B zeros,
 * scaling = alpha / r). The file format is llama.cpp's adapter GGUF
 * (src/llama-adapter.cpp: names "<weight>.lora_a" ne {in, r} and
 * "<weight>.lora_b" ne {r, out}; general.type "adapter", adapter.type
 * "lora", adapter.lora.alpha f32). Invariant: the tensors are listed in
 * file order (layer, target, a then b), so load + save reproduces a file
 * toy wrote byte for byte. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/finetune.h"
#include "toy/gguf.h"
#include "toy/quant.h"

struct toy_lora {
    struct toy_llama *m;
    struct toy_lora_opts o;
    struct toy_ctx *ctx;        /* A, B */
    struct toy_ctx *mask_ctx;   /* dropout masks for one (T, B) */
    int n;                      /* tensors */
    struct toy_tensor **t;      /* (n) file order */
    struct toy_tensor **masks;  /* (n / 2) the dropout masks graphs were built with */
    int n_masks;
    struct toy_rng rng;         /* dropout */
};

static const char *const target_names[TOY_LORA_N_TARGETS] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const peft_names[TOY_LORA_N_TARGETS] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                           "gate_proj", "up_proj", "down_proj"};

enum toy_status toy_lora_parse_targets(const char *s, unsigned *targets) {
    if (!targets) return toy_error(TOY_ERR_INVALID_ARG, "toy_lora_parse_targets: targets is NULL");
    unsigned mask = 0;
    const char *p = s ? s : "";
    while (*p) {
        size_t n = strcspn(p, ", ");
        if (n) {
            int found = 0;
            if (n == 3 && !strncmp(p, "all", 3)) { mask |= (1u << TOY_LORA_N_TARGETS) - 1; found = 1; }
            if (n == 4 && !strncmp(p, "attn", 4)) { mask |= 0xFu; found = 1; }
            if (n == 3 && !strncmp(p, "mlp", 3)) { mask |= 0x70u; found = 1; }
            for (int t = 0; t < TOY_LORA_N_TARGETS && !found; t++)
                if ((strlen(target_names[t]) == n && !strncmp(p, target_names[t], n)) ||
                    (strlen(peft_names[t]) == n && !strncmp(p, peft_names[t], n))) {
                    mask |= 1u << t;
                    found = 1;
                }
            if (!found)
                return toy_error(TOY_ERR_INVALID_ARG, "LoRA target '%.*s': use q, k, v, o, gate, up, down (or all)",
                                 (int)n, p);
        }
        p += n;
        while (*p == ',' || *p == ' ') p++;
    }
    if (!mask) return toy_error(TOY_ERR_INVALID_ARG, "no LoRA targets in '%s'", s ? s : "");
    *targets = mask;
    return TOY_OK;
}

const char *toy_lora_targets_str(unsigned targets, char *buf, size_t size) {
    size_t k = 0;
    if (size) buf[0] = 0;
    for (int t = 0; t < TOY_LORA_N_TARGETS; t++)
        if (targets & (1u << t)) {
            int w = snprintf(buf + k, size > k ? size - k : 0, "%s%s", k ? "," : "", target_names[t]);
            if (w > 0) k += (size_t)w;
            if (k >= size) break;
        }
    return buf;
}

static struct toy_tensor *target_weight(const struct toy_llama_layer *L, int t) {
    switch (t) {
    case TOY_LORA_Q: return L->wq;
    case TOY_LORA_K: return L->wk;
    case TOY_LORA_V: return L->wv;
    case TOY_LORA_O: return L->wo;
    case TOY_LORA_GATE: return L->w_gate;
    case TOY_LORA_UP: return L->w_up;
    case TOY_LORA_DOWN: return L->w_down;
    default: return NULL;
    }
}

static bool any_attached(const struct toy_llama *m) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++)
            if (m->layers[l].lora_a[t]) return true;
    return false;
}

/* Allocates the A/B pairs for the targets in o (zeroed) and hooks them in. */
static enum toy_status make_pairs(struct toy_llama *m, const struct toy_lora_opts *o, bool trainable,
                                  struct toy_lora **out) {
    *out = NULL;
    if (any_attached(m)) return toy_error(TOY_ERR_STATE, "the model already has a LoRA adapter attached");
    struct toy_lora *a = calloc(1, sizeof *a);
    if (!a) return toy_error(TOY_ERR_NOMEM, "LoRA adapter");
    a->m = m;
    a->o = *o;
    int per_layer = 0;
    for (int t = 0; t < TOY_LORA_N_TARGETS; t++) per_layer += (o->targets >> t) & 1;
    a->t = calloc((size_t)(2 * per_layer * m->cfg.n_layers) + 1, sizeof *a->t);
    a->ctx = toy_ctx_init(true);
    if (!a->t || !a->ctx) { toy_lora_free(a); return toy_error(TOY_ERR_NOMEM, "LoRA adapter"); }
    for (int64_t l = 0; l < m->cfg.n_layers; l++) {
        struct toy_llama_layer *L = &m->layers[l];
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
            if (!(o->targets & (1u << t))) continue;
            struct toy_tensor *w = target_weight(L, t);
            if (!w) continue; /* a mixture's layer: its experts take no adapter */
            int64_t in = w->ne[0], outd = w->ne[1];
            struct toy_tensor *A = toy_set_name(toy_new_tensor_2d(a->ctx, TOY_F32, in, o->rank), "%s.lora_a", w->name);
            struct toy_tensor *B = toy_set_name(toy_new_tensor_2d(a->ctx, TOY_F32, o->rank, outd), "%s.lora_b", w->name);
            if (trainable) { toy_set_param(A); toy_set_param(B); }
            L->lora_a[t] = A;
            L->lora_b[t] = B;
            a->t[a->n++] = A;
            a->t[a->n++] = B;
        }
    }
    if (!a->n) {
        char names[128];
        toy_lora_free(a);
        return toy_error(TOY_ERR_INVALID_ARG, "LoRA targets %s: no layer of this model has them (a mixture of "
                         "experts' feed-forward is its experts, which take no adapter: target q,k,v,o)",
                         toy_lora_targets_str(o->targets, names, sizeof names));
    }
    m->lora_scale = o->alpha / (float)o->rank;
    toy_rng_seed(&a->rng, o->seed ^ 0x4c6f5241ull);
    *out = a;
    return TOY_OK;
}

static enum toy_status check_opts(struct toy_lora_opts *o) {
    if (o->rank < 1 || o->rank > 65536) return toy_error(TOY_ERR_INVALID_ARG, "LoRA rank %d must be in 1..65536", o->rank);
    if (o->alpha == 0) o->alpha = (float)o->rank;
    if (!o->targets) o->targets = TOY_LORA_DEFAULT_TARGETS;
    if (o->targets >> TOY_LORA_N_TARGETS) return toy_error(TOY_ERR_INVALID_ARG, "LoRA targets 0x%x: unknown bits", o->targets);
    if (!(o->dropout >= 0 && o->dropout < 1)) return toy_error(TOY_ERR_INVALID_ARG, "LoRA dropout %g must be in [0, 1)", o->dropout);
    if (!isfinite(o->alpha)) return toy_error(TOY_ERR_INVALID_ARG, "LoRA alpha must be finite");
    return TOY_OK;
}

enum toy_status toy_lora_attach(struct toy_llama *m, const struct toy_lora_opts *opts, struct toy_lora **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_lora_attach: out is NULL");
    *out = NULL;
    enum toy_status mst = toy_llama_adaptable(m, "LoRA");
    if (mst) return mst;
    struct toy_lora_opts o = *opts;
    enum toy_status st = check_opts(&o);
    if (st) return st;
    struct toy_lora *a;
    if ((st = make_pairs(m, &o, true, &a))) return st;
    struct toy_rng r;
    toy_rng_seed(&r, o.seed);
    for (int i = 0; i < a->n; i += 2) {
        struct toy_tensor *A = a->t[i];
        float bound = 1.0f / sqrtf((float)A->ne[0]); /* kaiming_uniform_(a=sqrt(5)) on (r, in) */
        float *d = A->data;
        for (int64_t k = 0; k < toy_nelements(A); k++) d[k] = bound * (2.0f * toy_rng_uniform(&r) - 1.0f);
        /* B stays zero */
    }
    *out = a;
    return TOY_OK;
}

void toy_lora_free(struct toy_lora *a) {
    if (!a) return;
    if (a->m) {
        for (int64_t l = 0; l < a->m->cfg.n_layers; l++)
            for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
                struct toy_llama_layer *L = &a->m->layers[l];
                for (int i = 0; i < a->n; i++)
                    if (L->lora_a[t] == a->t[i] || L->lora_b[t] == a->t[i]) {
                        L->lora_a[t] = L->lora_b[t] = L->lora_mask[t] = NULL;
                        break;
                    }
            }
        a->m->lora_scale = 0;
    }
    toy_ctx_free(a->ctx);
    toy_ctx_free(a->mask_ctx);
    free(a->masks);
    free(a->t);
    free(a);
}

const struct toy_lora_opts *toy_lora_get_opts(const struct toy_lora *a) { return &a->o; }
int toy_lora_n_tensors(const struct toy_lora *a) { return a->n; }
struct toy_tensor *toy_lora_tensor(const struct toy_lora *a, int i) { return i >= 0 && i < a->n ? a->t[i] : NULL; }
struct toy_rng *toy_lora_rng(struct toy_lora *a) { return &a->rng; }

int64_t toy_lora_n_params(const struct toy_lora *a) {
    int64_t n = 0;
    for (int i = 0; i < a->n; i++) n += toy_nelements(a->t[i]);
    return n;
}

/* ---- dropout ------------------------------------------------------------------ */

enum toy_status toy_lora_dropout_begin(struct toy_lora *a, int64_t T, int64_t B) {
    if (a->o.dropout <= 0) return TOY_OK;
    /* each call adds a set of masks (one per graph shape); all are refreshed */
    if (!a->mask_ctx && !(a->mask_ctx = toy_ctx_init(true))) return toy_error(TOY_ERR_NOMEM, "LoRA dropout masks");
    struct toy_tensor **nm = realloc(a->masks, (size_t)(a->n_masks + a->n / 2 + 1) * sizeof *nm);
    if (!nm) return toy_error(TOY_ERR_NOMEM, "LoRA dropout masks");
    a->masks = nm;
    for (int64_t l = 0; l < a->m->cfg.n_layers; l++) {
        struct toy_llama_layer *L = &a->m->layers[l];
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
            if (!L->lora_a[t]) continue;
            struct toy_tensor *mk = toy_new_tensor_3d(a->mask_ctx, TOY_F32, L->lora_a[t]->ne[0], T, B);
            toy_set_name(mk, "lora_mask.%lld.%s.%lld", (long long)l, target_names[t], (long long)T);
            toy_set_input(mk);
            L->lora_mask[t] = mk;
            a->masks[a->n_masks++] = mk;
        }
    }
    toy_lora_dropout_refresh(a);
    return TOY_OK;
}

void toy_lora_dropout_refresh(struct toy_lora *a) {
    if (a->o.dropout <= 0 || !a->mask_ctx) return;
    const float p = a->o.dropout, keep = 1.0f / (1.0f - p);
    for (int i = 0; i < a->n_masks; i++) {
        float *d = a->masks[i]->data; /* (B, T, in) */
        for (int64_t k = 0; k < toy_nelements(a->masks[i]); k++) d[k] = toy_rng_uniform(&a->rng) < p ? 0.0f : keep;
    }
}

void toy_lora_dropout_end(struct toy_lora *a) {
    for (int64_t l = 0; l < a->m->cfg.n_layers; l++)
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) a->m->layers[l].lora_mask[t] = NULL;
}

/* ---- adapter files ------------------------------------------------------------- */

enum toy_status toy_lora_write_gguf(const struct toy_lora *a, struct toy_gguf_writer *w) {
    char tg[64];
    enum toy_status st = toy_gguf_writer_set_str(w, "general.architecture", a->m->cfg.arch);
    if (!st) st = toy_gguf_writer_set_str(w, "general.type", "adapter");
    if (!st) st = toy_gguf_writer_set_str(w, "adapter.type", "lora");
    if (!st) st = toy_gguf_writer_set_f32(w, "adapter.lora.alpha", a->o.alpha);
    /* toy's own extras (llama.cpp ignores unknown keys) */
    if (!st) st = toy_gguf_writer_set_str(w, "toy.lora.targets", toy_lora_targets_str(a->o.targets, tg, sizeof tg));
    if (!st) st = toy_gguf_writer_set_f32(w, "toy.lora.dropout", a->o.dropout);
    for (int i = 0; i < a->n && !st; i++)
        st = toy_gguf_writer_add_tensor(w, a->t[i]->name, TOY_F32, 2, a->t[i]->ne, a->t[i]->data);
    return st;
}

enum toy_status toy_lora_save(const struct toy_lora *a, const char *path) {
    struct toy_gguf_writer *w;
    enum toy_status st = toy_gguf_writer_init(&w);
    if (st) return st;
    st = toy_lora_write_gguf(a, w);
    if (!st) st = toy_gguf_writer_write(w, path);
    toy_gguf_writer_free(w);
    return st;
}

/* Which layer and target a base weight name is ("blk.N.attn_q.weight"). */
static bool parse_weight(const struct toy_llama *m, const char *name, size_t len, int64_t *layer, int *target) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
            const struct toy_tensor *w = target_weight(&m->layers[l], t);
            if (w && strlen(w->name) == len && !strncmp(w->name, name, len)) {
                *layer = l;
                *target = t;
                return true;
            }
        }
    return false;
}

static enum toy_status check_header(const struct toy_gguf *g, const char *path, const char *arch, float *alpha) {
    const char *s;
    size_t n;
    if (toy_gguf_get_str(g, "general.type", &s, &n) || n != 7 || memcmp(s, "adapter", 7))
        return toy_error(TOY_ERR_FORMAT, "%s: general.type is not \"adapter\" (not a LoRA adapter file)", path);
    if (toy_gguf_get_str(g, "adapter.type", &s, &n) || n != 4 || memcmp(s, "lora", 4))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: adapter.type is not \"lora\"", path);
    if (arch && !toy_gguf_get_str(g, "general.architecture", &s, &n) && (strlen(arch) != n || memcmp(s, arch, n)))
        return toy_error(TOY_ERR_FORMAT, "%s: adapter for architecture %.*s, the model is %s", path, (int)n, s, arch);
    /* absent: 0, which means alpha = rank (scale 1), as llama.cpp reads it (llama-adapter.cpp's get_kv_f32
     * gives 0 for a missing key, and get_scale then uses the adapter scale alone) */
    if (toy_gguf_get_f32(g, "adapter.lora.alpha", alpha)) *alpha = 0;
    return TOY_OK;
}

/* The types a LoRA pair may have: llama.cpp's converter writes f16 (or bf16, f32); toy widens to f32. */
static bool pair_type_ok(enum toy_dtype t) { return t == TOY_F32 || t == TOY_F16 || t == TOY_BF16; }

/* Whether A ({in, r}) and B ({r, out}) can be applied to the weight `wname` of ne {in, out} (w_dims dims),
 * with a message that says what is wrong with them: the type, a transposed matrix, the other base model. */
static enum toy_status check_pair(const char *path, const char *wname, int64_t in, int64_t out, int w_dims,
                                  const struct toy_gguf_tensor *A, const struct toy_gguf_tensor *B) {
    if (!pair_type_ok(A->type) || !pair_type_ok(B->type))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: %s is %s and its lora_b %s: toy reads f32, f16 and bf16 LoRA "
                         "pairs", path, A->name, toy_dtype_name(A->type), toy_dtype_name(B->type));
    if (A->n_dims != 2 || B->n_dims != 2)
        return toy_error(TOY_ERR_FORMAT, "%s: %s is %d-D and its lora_b %d-D: a LoRA pair is two matrices", path,
                         A->name, A->n_dims, B->n_dims);
    if (w_dims != 2)
        return toy_error(TOY_ERR_SHAPE, "%s: %s adapts %s, which is %d-D, not a matrix", path, A->name, wname, w_dims);
    long long a0 = A->ne[0], a1 = A->ne[1], b0 = B->ne[0], b1 = B->ne[1];
    if (a0 != in && a1 == in && a0 == b0 && b1 == out)
        return toy_error(TOY_ERR_SHAPE, "%s: %s is {%lld, %lld}: transposed (llama.cpp's lora_a is {in, rank} = "
                         "{%lld, %lld} for %s)", path, A->name, a0, a1, (long long)in, a0, wname);
    if (b1 != out && b0 == out && a0 == in && b1 == a1)
        return toy_error(TOY_ERR_SHAPE, "%s: %s's lora_b is {%lld, %lld}: transposed (llama.cpp's lora_b is {rank, "
                         "out} = {%lld, %lld} for %s)", path, A->name, b0, b1, b1, (long long)out, wname);
    if (a0 != in || b1 != out)
        return toy_error(TOY_ERR_SHAPE, "%s: %s is {%lld, %lld} x {%lld, %lld}, %s is {%lld, %lld} (wrong base "
                         "model?)", path, A->name, a0, a1, b0, b1, wname, (long long)in, (long long)out);
    if (a1 != b0)
        return toy_error(TOY_ERR_SHAPE, "%s: %s rank %lld but lora_b rank %lld", path, A->name, a1, b0);
    if (a1 < 1 || a1 > 65536) return toy_error(TOY_ERR_FORMAT, "%s: %s has rank %lld", path, A->name, a1);
    return TOY_OK;
}

/* Phi-3 keeps a layer's q, k, v rows in one attn_qkv and its gate and up rows in one ffn_up of 2 d_ff, and
 * llama.cpp's converter names PEFT's adapters on qkv_proj and gate_up_proj after them: a pair on `name` whose B has
 * `out` rows is such a fused pair when the model's projections it spans add up to out. The targets it covers
 * (0: none), its layer, and the first row of target t in it (fused_row0). */
static unsigned fused_pair(const struct toy_llama *m, const char *name, size_t len, int64_t out, int64_t *layer) {
    long long l;
    char part[16], rest[16];
    char nm[TOY_GGUF_NAME_MAX];
    snprintf(nm, sizeof nm, "%.*s", (int)len, name);
    if (sscanf(nm, "blk.%lld.%15[^.].%15s", &l, part, rest) != 3 || strcmp(rest, "weight") || l < 0 ||
        l >= m->cfg.n_layers)
        return 0;
    const struct toy_llama_layer *L = &m->layers[l];
    *layer = l;
    if (!strcmp(part, "attn_qkv") && L->wq && L->wk && L->wv && out == L->wq->ne[1] + L->wk->ne[1] + L->wv->ne[1])
        return 1u << TOY_LORA_Q | 1u << TOY_LORA_K | 1u << TOY_LORA_V;
    if (!strcmp(part, "ffn_up") && L->w_gate && L->w_up && out == L->w_gate->ne[1] + L->w_up->ne[1])
        return 1u << TOY_LORA_GATE | 1u << TOY_LORA_UP;
    return 0;
}

static int64_t fused_row0(const struct toy_llama_layer *L, int t) {
    return t == TOY_LORA_K ? L->wq->ne[1] : t == TOY_LORA_V ? L->wq->ne[1] + L->wk->ne[1] : t == TOY_LORA_UP ? L->w_gate->ne[1] : 0;
}

/* Target t's pair of layer l read from the fused pair that covers it: A whole (the projections share it), B's rows
 * of the target */
static enum toy_status read_fused(const struct toy_gguf *g, const struct toy_llama *m, int64_t l, int t,
                                  struct toy_tensor *A, struct toy_tensor *B) {
    char name[TOY_GGUF_NAME_MAX + 16];
    bool qkv = t == TOY_LORA_Q || t == TOY_LORA_K || t == TOY_LORA_V;
    snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_a", (long long)l, qkv ? "attn_qkv" : "ffn_up");
    enum toy_status st = toy_gguf_tensor_read_f32(g, toy_gguf_find_tensor(g, name), A->data, toy_nelements(A));
    name[strlen(name) - 1] = 'b';
    int64_t j = toy_gguf_find_tensor(g, name);
    int64_t n = toy_gguf_tensor(g, j)->n_elements, r = B->ne[0];
    float *all = st ? NULL : malloc((size_t)n * sizeof *all);
    if (!st && !all) st = toy_error(TOY_ERR_NOMEM, "reading %s", name);
    if (!st) st = toy_gguf_tensor_read_f32(g, j, all, n);
    if (!st) memcpy(B->data, all + fused_row0(&m->layers[l], t) * r, (size_t)toy_nelements(B) * sizeof *all);
    free(all);
    return st;
}

enum toy_status toy_lora_load(struct toy_llama *m, const char *path, float scale, bool trainable,
                              struct toy_lora **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_lora_load: out is NULL");
    *out = NULL;
    enum toy_status mst = toy_llama_adaptable(m, path);
    if (mst) return mst;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    struct toy_lora_opts o = {0};
    unsigned *fused = calloc((size_t)m->cfg.n_layers, sizeof *fused); /* per layer: the targets a fused pair gives */
    if (!fused) { st = toy_error(TOY_ERR_NOMEM, "%s: out of memory", path); goto done; }
    if ((st = check_header(g, path, m->cfg.arch, &o.alpha))) goto done;
    /* pass 1: targets and rank, with llama.cpp's shape checks */
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *ti = toy_gguf_tensor(g, i);
        size_t len = strlen(ti->name);
        bool is_a = len > 7 && !strcmp(ti->name + len - 7, ".lora_a");
        bool is_b = len > 7 && !strcmp(ti->name + len - 7, ".lora_b");
        if (!is_a && !is_b) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "%s: tensor %s is not a .lora_a/.lora_b", path, ti->name);
            goto done;
        }
        int64_t l;
        int t;
        char other[TOY_GGUF_NAME_MAX + 8];
        snprintf(other, sizeof other, "%.*s.lora_%c", (int)(len - 7), ti->name, is_a ? 'b' : 'a');
        int64_t j = toy_gguf_find_tensor(g, other);
        if (j < 0) { st = toy_error(TOY_ERR_FORMAT, "%s: %s has no %s", path, ti->name, other); goto done; }
        const struct toy_gguf_tensor *tb = toy_gguf_tensor(g, j);
        unsigned fmask = fused_pair(m, ti->name, len - 7, is_a ? tb->ne[1] : ti->ne[1], &l);
        if (fmask) { /* one pair for two or three projections */
            if (!is_a) continue;
            const struct toy_tensor *w0 = target_weight(&m->layers[l], fmask & 1 ? TOY_LORA_Q : TOY_LORA_GATE);
            if ((st = check_pair(path, ti->name, w0->ne[0], tb->ne[1], 2, ti, tb))) goto done;
            fused[l] |= fmask;
        } else if (!parse_weight(m, ti->name, len - 7, &l, &t)) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "%s: %s does not name a projection toy adapts (q,k,v,o,gate,up,down%s)",
                           path, ti->name, !strcmp(m->cfg.arch, "phi3") ? ", or Phi-3's attn_qkv and ffn_up" : "");
            goto done;
        } else {
            if (!is_a) continue;
            const struct toy_tensor *w = target_weight(&m->layers[l], t);
            if ((st = check_pair(path, w->name, w->ne[0], w->ne[1], 2, ti, tb))) goto done;
            fmask = 1u << t;
        }
        if (o.rank && o.rank != ti->ne[1]) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "%s: ranks differ between pairs (%d, %lld)", path, o.rank,
                           (long long)ti->ne[1]);
            goto done;
        }
        o.rank = (int32_t)ti->ne[1];
        o.targets |= fmask;
    }
    if (!o.rank) { st = toy_error(TOY_ERR_FORMAT, "%s: no LoRA tensors", path); goto done; }
    for (int64_t l = 0; l < m->cfg.n_layers; l++) /* a projection in a fused pair and in one of its own */
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
            const struct toy_tensor *w = target_weight(&m->layers[l], t);
            char own[TOY_GGUF_NAME_MAX + 8];
            if (!(fused[l] >> t & 1) || t == TOY_LORA_UP) continue; /* (up's own name is the fused pair's) */
            snprintf(own, sizeof own, "%s.lora_a", w->name);
            if (toy_gguf_find_tensor(g, own) >= 0) {
                st = toy_error(TOY_ERR_FORMAT, "%s: %s adapts a projection that the layer's fused %s pair adapts too",
                               path, own, t == TOY_LORA_GATE ? "ffn_up" : "attn_qkv");
                goto done;
            }
        }
    double dd;
    if (!toy_gguf_get_f64(g, "toy.lora.dropout", &dd) && dd >= 0 && dd < 1) o.dropout = (float)dd;
    /* toy adapts every layer of each target; a file that skips some layers
     * gets zero pairs there (B = 0: no change), and is saved back with them */
    struct toy_lora *a;
    if ((st = make_pairs(m, &o, trainable, &a))) goto done;
    for (int64_t l = 0; l < m->cfg.n_layers && !st; l++)
        for (int t = 0; t < TOY_LORA_N_TARGETS && !st; t++) {
            struct toy_tensor *A = m->layers[l].lora_a[t], *B = m->layers[l].lora_b[t];
            if (!A) continue;
            if (fused[l] >> t & 1) { st = read_fused(g, m, l, t, A, B); continue; }
            /* f16/bf16 pairs widen to toy's f32 (an f32 file is copied as it is) */
            for (int h = 0; h < 2 && !st; h++) {
                int64_t j = toy_gguf_find_tensor(g, (h ? B : A)->name);
                if (j >= 0) st = toy_gguf_tensor_read_f32(g, j, (h ? B : A)->data, toy_nelements(h ? B : A));
            }
        }
    if (st) { toy_lora_free(a); goto done; }
    m->lora_scale = scale * (o.alpha != 0 ? o.alpha / (float)o.rank : 1.0f); /* alpha 0: alpha = rank, as llama.cpp */
    *out = a;
done:
    free(fused);
    toy_gguf_close(g);
    return st;
}

/* ---- merging -------------------------------------------------------------------- */

/* w (out, in) += s * B (out, r) A (r, in) */
static void add_ba(float *w, const float *A, const float *B, int64_t in, int64_t out, int64_t r, float s) {
    for (int64_t o = 0; o < out; o++) {
        float *row = w + o * in;
        for (int64_t k = 0; k < r; k++) {
            float c = s * B[o * r + k];
            const float *a = A + k * in;
            for (int64_t i = 0; i < in; i++) row[i] += c * a[i];
        }
    }
}

enum toy_status toy_lora_merge_into(struct toy_llama *m, const struct toy_lora *a) {
    for (int64_t l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < TOY_LORA_N_TARGETS; t++) {
            struct toy_llama_layer *L = &m->layers[l];
            if (!L->lora_a[t]) continue;
            struct toy_tensor *w = target_weight(L, t);
            if (w->type != TOY_F32 || !w->data)
                return toy_error(TOY_ERR_UNSUPPORTED, "%s: merging needs f32 weights in memory (load trainable)", w->name);
            add_ba(w->data, L->lora_a[t]->data, L->lora_b[t]->data, w->ne[0], w->ne[1], L->lora_a[t]->ne[1],
                   m->lora_scale);
        }
    (void)a;
    return TOY_OK;
}

struct merge_job {
    const struct toy_gguf *base, *ad;
    int64_t index;         /* the weight in base */
    int n;                 /* its pairs in ad: A ia[k], B ib[k], onto its rows row0[k].. (several: a fused weight) */
    int64_t ia[3], ib[3], row0[3];
    float scale;
};

static enum toy_status merge_fill(void *ctx, void *dst, size_t nbytes) {
    const struct merge_job *j = ctx;
    const struct toy_gguf_tensor *w = toy_gguf_tensor(j->base, j->index);
    int64_t in = w->ne[0], out = w->ne[1];
    /* the weight as f32 */
    float *f = malloc((size_t)(in * out) * sizeof *f);
    enum toy_status st = f ? TOY_OK : toy_error(TOY_ERR_NOMEM, "%s: out of memory for the merged weights", w->name);
    if (!st) st = toy_gguf_tensor_read_f32(j->base, j->index, f, in * out);
    for (int k = 0; k < j->n && !st; k++) { /* each pair (f32, or f16/bf16 as llama.cpp's converter writes them) */
        const struct toy_gguf_tensor *A = toy_gguf_tensor(j->ad, j->ia[k]), *B = toy_gguf_tensor(j->ad, j->ib[k]);
        float *fa = malloc((size_t)A->n_elements * sizeof *fa), *fb = malloc((size_t)B->n_elements * sizeof *fb);
        if (!fa || !fb) st = toy_error(TOY_ERR_NOMEM, "%s: out of memory for the merged weights", w->name);
        if (!st) st = toy_gguf_tensor_read_f32(j->ad, j->ia[k], fa, A->n_elements);
        if (!st) st = toy_gguf_tensor_read_f32(j->ad, j->ib[k], fb, B->n_elements);
        if (!st) add_ba(f + j->row0[k] * in, fa, fb, in, B->ne[1], A->ne[1], j->scale);
        free(fa);
        free(fb);
    }
    if (!st) {
        size_t rb = toy_row_bytes(w->type, in);
        for (int64_t o = 0; o < out && !st; o++) st = toy_quantize_row(w->type, f + o * in, (char *)dst + o * rb, in);
        if (!st && rb * (size_t)out != nbytes) st = toy_error(TOY_ERR_SHAPE, "%s: the merged weights have another size", w->name);
    }
    free(f);
    return st;
}

/* The pairs of an adapter with toy's names for Phi-3's projections (attn_q, attn_k, attn_v; ffn_gate, ffn_up) that
 * fall in the fused base tensor ti (attn_qkv; an ffn_up of twice their width): their A and B, and the rows of ti
 * they adapt, into job (n 0: none) */
static enum toy_status fused_parts(const struct toy_gguf *ad, const char *adapter_path, const struct toy_gguf_tensor *ti,
                                   struct merge_job *job) {
    long long l;
    char part[16];
    if (sscanf(ti->name, "blk.%lld.%15[^.].weight", &l, part) != 2 || ti->n_dims != 2) return TOY_OK;
    bool qkv = !strcmp(part, "attn_qkv");
    if (!qkv && strcmp(part, "ffn_up")) return TOY_OK;
    static const char *const qkv_parts[] = {"attn_q", "attn_k", "attn_v"}, *const ff_parts[] = {"ffn_gate", "ffn_up"};
    const char *const *parts = qkv ? qkv_parts : ff_parts;
    int np = qkv ? 3 : 2;
    int64_t ia[3], ib[3], rows[3] = {0, 0, 0};
    char name[TOY_GGUF_NAME_MAX + 16];
    for (int k = 0; k < np; k++) {
        snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_a", l, parts[k]);
        ia[k] = toy_gguf_find_tensor(ad, name);
        snprintf(name, sizeof name, "blk.%lld.%s.weight.lora_b", l, parts[k]);
        ib[k] = toy_gguf_find_tensor(ad, name);
        if (ib[k] >= 0) rows[k] = toy_gguf_tensor(ad, ib[k])->ne[1];
    }
    if (!qkv) { /* fused only when twice as wide as the pairs (else a Llama's ffn_up, or llama.cpp's fused pair) */
        int64_t f = rows[0] ? rows[0] : rows[1];
        if (!f || ti->ne[1] != 2 * f) return TOY_OK;
        rows[0] = rows[1] = f;
    } else { /* q's rows are what k's and v's (which are alike) leave */
        int64_t kv = rows[1] ? rows[1] : rows[2];
        if (kv) rows[1] = rows[2] = kv, rows[0] = ti->ne[1] - 2 * kv;
        else if (rows[0]) rows[1] = rows[2] = (ti->ne[1] - rows[0]) / 2;
    }
    int64_t row0 = 0;
    for (int k = 0; k < np; k++, row0 += rows[k - 1]) {
        if (ia[k] < 0 && ib[k] < 0) continue;
        const struct toy_gguf_tensor *A = ia[k] >= 0 ? toy_gguf_tensor(ad, ia[k]) : NULL;
        const struct toy_gguf_tensor *B = ib[k] >= 0 ? toy_gguf_tensor(ad, ib[k]) : NULL;
        if (!A || !B)
            return toy_error(TOY_ERR_FORMAT, "%s: blk.%lld.%s.weight.lora_%c has no lora_%c", adapter_path, l, parts[k],
                             A ? 'a' : 'b', A ? 'b' : 'a');
        char what[TOY_GGUF_NAME_MAX * 2 + 64];
        snprintf(what, sizeof what, "blk.%lld.%s.weight (rows %lld.. of %s)", l, parts[k], (long long)row0, ti->name);
        enum toy_status st = check_pair(adapter_path, what, ti->ne[0], rows[k], 2, A, B);
        if (!st && row0 + rows[k] > ti->ne[1])
            st = toy_error(TOY_ERR_SHAPE, "%s: the pairs for %s's parts have more rows (%lld) than it (%lld)",
                           adapter_path, ti->name, (long long)(row0 + rows[k]), (long long)ti->ne[1]);
        if (st) return st;
        job->ia[job->n] = ia[k], job->ib[job->n] = ib[k], job->row0[job->n] = row0;
        job->n++;
    }
    return TOY_OK;
}

enum toy_status toy_lora_merge_file(const char *base_path, const char *adapter_path, float scale,
                                    const char *out_path) {
    struct toy_gguf *g = NULL, *ad = NULL;
    struct toy_gguf_writer *w = NULL;
    struct merge_job *jobs = NULL;
    enum toy_status st = toy_gguf_open(base_path, &g);
    if (!st) st = toy_gguf_open(adapter_path, &ad);
    const char *arch = NULL;
    size_t alen = 0;
    char archbuf[64] = "";
    if (!st && !toy_gguf_get_str(g, "general.architecture", &arch, &alen))
        snprintf(archbuf, sizeof archbuf, "%.*s", (int)alen, arch);
    float alpha = 0;
    if (!st) st = check_header(ad, adapter_path, archbuf[0] ? archbuf : NULL, &alpha);
    if (!st) st = toy_gguf_writer_init(&w);
    int64_t nt = st ? 0 : toy_gguf_n_tensors(g);
    if (!st && !(jobs = calloc((size_t)nt + 1, sizeof *jobs))) st = toy_error(TOY_ERR_NOMEM, "out of memory for the merge");
    for (int64_t i = 0; !st && i < toy_gguf_n_kv(g); i++) st = toy_gguf_writer_copy_kv(w, g, i);
    int64_t used = 0;
    char name[TOY_GGUF_NAME_MAX + 16];
    for (int64_t i = 0; i < nt && !st; i++) {
        const struct toy_gguf_tensor *ti = toy_gguf_tensor(g, i);
        snprintf(name, sizeof name, "%s.lora_a", ti->name);
        int64_t ja = toy_gguf_find_tensor(ad, name);
        snprintf(name, sizeof name, "%s.lora_b", ti->name);
        int64_t jb = toy_gguf_find_tensor(ad, name);
        int n_dims = ti->n_dims < 1 ? 1 : ti->n_dims;
        struct merge_job fj = {.n = 0};
        if ((st = fused_parts(ad, adapter_path, ti, &fj))) break;
        if (fj.n) { /* Phi-3's fused attn_qkv or ffn_up, adapted per projection */
            if (!toy_can_dequantize(ti->type) || !toy_can_quantize(ti->type)) {
                st = toy_error(TOY_ERR_UNSUPPORTED, "cannot re-encode %s after merging (%s)", ti->name, toy_dtype_name(ti->type));
                break;
            }
            const struct toy_gguf_tensor *A0 = toy_gguf_tensor(ad, fj.ia[0]);
            jobs[i] = fj;
            jobs[i].base = g, jobs[i].ad = ad, jobs[i].index = i;
            jobs[i].scale = scale * (alpha != 0 ? alpha / (float)A0->ne[1] : 1.0f);
            used += 2 * fj.n;
            st = toy_gguf_writer_add_tensor_fn(w, ti->name, ti->type, 2, ti->ne, merge_fill, &jobs[i]);
            continue;
        }
        if (ja < 0 && jb < 0) {
            st = toy_gguf_writer_add_tensor(w, ti->name, ti->type, n_dims, ti->ne, ti->data);
            continue;
        }
        if (ja < 0 || jb < 0) { /* half a pair: name the missing half, not "N tensors match no weight" */
            st = toy_error(TOY_ERR_FORMAT, "%s: %s.lora_%c has no %s.lora_%c", adapter_path, ti->name, ja < 0 ? 'b' : 'a',
                           ti->name, ja < 0 ? 'a' : 'b');
            break;
        }
        const struct toy_gguf_tensor *A = toy_gguf_tensor(ad, ja), *B = toy_gguf_tensor(ad, jb);
        if ((st = check_pair(adapter_path, ti->name, ti->ne[0], ti->ne[1], ti->n_dims, A, B))) break;
        if (!toy_can_dequantize(ti->type) || !toy_can_quantize(ti->type)) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "cannot re-encode %s after merging (%s)", ti->name, toy_dtype_name(ti->type));
            break;
        }
        /* alpha 0 (or absent): alpha = rank, scale 1, as llama.cpp */
        jobs[i] = (struct merge_job){.base = g, .ad = ad, .index = i, .n = 1, .ia = {ja}, .ib = {jb}, .row0 = {0},
                                     .scale = scale * (alpha != 0 ? alpha / (float)A->ne[1] : 1.0f)};
        used += 2;
        st = toy_gguf_writer_add_tensor_fn(w, ti->name, ti->type, 2, ti->ne, merge_fill, &jobs[i]);
    }
    if (!st && used != toy_gguf_n_tensors(ad))
        st = toy_error(TOY_ERR_FORMAT, "%s: %lld of its %lld tensors match no weight of %s", adapter_path,
                       (long long)(toy_gguf_n_tensors(ad) - used), (long long)toy_gguf_n_tensors(ad), base_path);
    if (!st) st = toy_gguf_writer_write(w, out_path);
    toy_gguf_writer_free(w);
    free(jobs);
    toy_gguf_close(ad);
    toy_gguf_close(g);
    return st;
}
