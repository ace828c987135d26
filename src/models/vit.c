/* vit.c: the Vision Transformer classifier (toy/vit.h): configs, random
 * init, the graph, and GGUF read/write. Architecture: Dosovitskiy et al.
 * 2021 with timm's VisionTransformer layout (pre-LN blocks, class token
 * prepended before the position embeddings are added, head on the final
 * LayerNorm of the class token). The patch embedding is a stride-P
 * convolution written as im2col + matmul: two reshape/permute copies turn
 * the images {W, H, C, B} into patches {C*P*P, N, B} ordered (c, py, px)
 * inside a patch and row-major (gy, gx) across patches, which is exactly
 * conv2d(weight (d, C, P, P)).flatten(2).transpose(1, 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/gguf.h"
#include "toy/quant.h"
#include "toy/rng.h"
#include "toy/vit.h"
#include "models/qkv.h"

struct toy_vit_config toy_vit_preset(const char *name) {
    struct toy_vit_config c = {0};
    c.norm_eps = 1e-6f;
    if (!name) return c; /* an unknown name: an empty config */
    if (!strcmp(name, "tiny")) {
        c = (struct toy_vit_config){224, 224, 3, 16, 192, 12, 3, 768, 1000, 1e-6f, false};
    } else if (!strcmp(name, "small-cpu")) {
        c = (struct toy_vit_config){32, 32, 3, 4, 128, 4, 4, 256, 10, 1e-6f, true};
    } else if (!strcmp(name, "mnist")) {
        c = (struct toy_vit_config){28, 28, 1, 7, 64, 2, 4, 128, 10, 1e-6f, true};
    }
    return c;
}

int64_t toy_vit_n_patches(const struct toy_vit_config *c) {
    return c->patch > 0 ? (c->image_h / c->patch) * (c->image_w / c->patch) : 0;
}

enum toy_status toy_vit_check_config(const struct toy_vit_config *c) {
#define NEED(cond, ...) if (!(cond)) return toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__)
    NEED(c->patch > 0 && c->image_h > 0 && c->image_w > 0, "vit config: image %lldx%lld, patch %lld",
         (long long)c->image_h, (long long)c->image_w, (long long)c->patch);
    if (c->image_h % c->patch || c->image_w % c->patch) { /* say which patches would fit */
        char fit[128] = "";
        size_t len = 0;
        for (int64_t p = 2; p <= c->image_h && p <= c->image_w && len + 8 < sizeof fit; p++)
            if (c->image_h % p == 0 && c->image_w % p == 0)
                len += (size_t)snprintf(fit + len, sizeof fit - len, "%s%lld", len ? ", " : "", (long long)p);
        return toy_error(TOY_ERR_INVALID_ARG, "vit config: image %lldx%lld is not a multiple of patch %lld (%s%s)",
                         (long long)c->image_h, (long long)c->image_w, (long long)c->patch,
                         fit[0] ? "patches that divide it: " : "no patch from 2 up divides it", fit);
    }
    NEED(c->image_h <= 65536 && c->image_w <= 65536, "vit config: image %lldx%lld too large", (long long)c->image_h,
         (long long)c->image_w);
    NEED(c->channels >= 1 && c->channels <= 4, "vit config: %lld channels (1..4)", (long long)c->channels);
    NEED(c->d_model > 0 && c->n_heads > 0 && c->d_model % c->n_heads == 0,
         "vit config: d_model %lld is not a multiple of n_heads %lld", (long long)c->d_model, (long long)c->n_heads);
    NEED(c->n_layers > 0 && c->n_layers < 10000, "vit config: n_layers %lld", (long long)c->n_layers);
    NEED(c->d_ff > 0, "vit config: d_ff %lld", (long long)c->d_ff);
    NEED(c->n_classes > 0 && c->n_classes < (1 << 24), "vit config: %lld classes", (long long)c->n_classes);
    NEED(c->norm_eps > 0, "vit config: norm_eps must be > 0");
#undef NEED
    return TOY_OK;
}

static struct toy_tensor *param(struct toy_vit *m, const char *name, int64_t ne0, int64_t ne1) {
    struct toy_tensor *t = ne1 ? toy_new_tensor_2d(m->ctx, TOY_F32, ne0, ne1) : toy_new_tensor_1d(m->ctx, TOY_F32, ne0);
    toy_set_name(t, "%s", name);
    toy_set_param(t);
    return t;
}

static struct toy_vit *vit_alloc(const struct toy_vit_config *cfg, bool alloc_data) {
    if (toy_vit_check_config(cfg)) return NULL;
    struct toy_vit *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->cfg = *cfg;
    m->ctx = toy_ctx_init(alloc_data);
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->ctx || !m->layers) { toy_vit_free(m); return NULL; }
    for (int c = 0; c < 4; c++) m->mean[c] = 0.0f, m->std[c] = 1.0f;
    int64_t d = cfg->d_model, f = cfg->d_ff, P = cfg->patch;
    m->patch_w = param(m, "patch_embd.weight", cfg->channels * P * P, d);
    m->patch_b = param(m, "patch_embd.bias", d, 0);
    m->cls = param(m, "class_embd", d, 0);
    m->pos = param(m, "position_embd.weight", d, 1 + toy_vit_n_patches(cfg));
    char name[TOY_NAME_MAX];
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_vit_layer *L = &m->layers[l];
#define P_(field, suffix, a, b)                                           \
        snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l);    \
        L->field = param(m, name, a, b);
        P_(attn_norm, "attn_norm.weight", d, 0);
        P_(attn_norm_b, "attn_norm.bias", d, 0);
        P_(w_qkv, "attn_qkv.weight", d, 3 * d);
        P_(b_qkv, "attn_qkv.bias", 3 * d, 0);
        P_(w_o, "attn_output.weight", d, d);
        P_(b_o, "attn_output.bias", d, 0);
        P_(ffn_norm, "ffn_norm.weight", d, 0);
        P_(ffn_norm_b, "ffn_norm.bias", d, 0);
        P_(w_up, "ffn_up.weight", d, f);
        P_(b_up, "ffn_up.bias", f, 0);
        P_(w_down, "ffn_down.weight", f, d);
        P_(b_down, "ffn_down.bias", d, 0);
#undef P_
    }
    m->out_norm = param(m, "output_norm.weight", d, 0);
    m->out_norm_b = param(m, "output_norm.bias", d, 0);
    m->head_w = param(m, "cls_head.weight", d, cfg->n_classes);
    m->head_b = param(m, "cls_head.bias", cfg->n_classes, 0);
    return m;
}

static void fill_normal(struct toy_tensor *t, struct toy_rng *r, float std) {
    toy_rng_fill_normal(r, t->data, toy_nelements(t), std);
}

static void fill_ones(struct toy_tensor *t) {
    float *x = t->data;
    for (int64_t i = 0; i < toy_nelements(t); i++) x[i] = 1.0f;
}

struct toy_vit *toy_vit_new(const struct toy_vit_config *cfg, uint64_t seed) {
    struct toy_vit *m = vit_alloc(cfg, true);
    if (!m) return NULL;
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    /* timm: 0.02; fan_in_init: PyTorch's default variance 1 / (3 fan_in) */
#define STD(w) (cfg->fan_in_init ? 1.0f / sqrtf(3.0f * (float)(w)->ne[0]) : 0.02f)
    fill_normal(m->patch_w, &r, STD(m->patch_w));
    fill_normal(m->cls, &r, 0.02f);
    fill_normal(m->pos, &r, 0.02f);
    for (int64_t l = 0; l < cfg->n_layers; l++) {
        struct toy_vit_layer *L = &m->layers[l];
        fill_ones(L->attn_norm);
        fill_normal(L->w_qkv, &r, STD(L->w_qkv));
        fill_normal(L->w_o, &r, STD(L->w_o));
        fill_ones(L->ffn_norm);
        fill_normal(L->w_up, &r, STD(L->w_up));
        fill_normal(L->w_down, &r, STD(L->w_down));
    }
    fill_ones(m->out_norm);
    fill_normal(m->head_w, &r, STD(m->head_w));
#undef STD
    return m;
}

void toy_vit_free(struct toy_vit *m) {
    if (!m) return;
    if (m->class_names)
        for (int64_t i = 0; i < m->cfg.n_classes; i++) free(m->class_names[i]);
    free(m->class_names);
    toy_ctx_free(m->ctx);
    toy_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

enum { PER_LAYER = 12, HEAD_TENSORS = 4, TAIL_TENSORS = 4 };

int toy_vit_n_tensors(const struct toy_vit *m) { return HEAD_TENSORS + PER_LAYER * (int)m->cfg.n_layers + TAIL_TENSORS; }

struct toy_tensor *toy_vit_tensor(const struct toy_vit *m, int i) {
    struct toy_tensor *const head[HEAD_TENSORS] = {m->patch_w, m->patch_b, m->cls, m->pos};
    struct toy_tensor *const tail[TAIL_TENSORS] = {m->out_norm, m->out_norm_b, m->head_w, m->head_b};
    if (i < 0) return NULL;
    if (i < HEAD_TENSORS) return head[i];
    i -= HEAD_TENSORS;
    if (i < PER_LAYER * m->cfg.n_layers) {
        const struct toy_vit_layer *L = &m->layers[i / PER_LAYER];
        struct toy_tensor *const all[PER_LAYER] = {L->attn_norm, L->attn_norm_b, L->w_qkv,  L->b_qkv,
                                                   L->w_o,       L->b_o,         L->ffn_norm, L->ffn_norm_b,
                                                   L->w_up,      L->b_up,        L->w_down,   L->b_down};
        return all[i % PER_LAYER];
    }
    i -= PER_LAYER * (int)m->cfg.n_layers;
    return i < TAIL_TENSORS ? tail[i] : NULL;
}

int64_t toy_vit_n_params(const struct toy_vit *m) {
    int64_t n = 0;
    for (int i = 0; i < toy_vit_n_tensors(m); i++) n += toy_nelements(toy_vit_tensor(m, i));
    return n;
}

/* ---- the graph ------------------------------------------------------------------ */

/* images {W, H, C, B} -> patches {C*P*P, N, B} (im2col of a stride-P conv) */
static struct toy_tensor *im2col(struct toy_ctx *ctx, struct toy_tensor *x, int64_t P) {
    int64_t W = x->ne[0], H = x->ne[1], C = x->ne[2], B = x->ne[3], Gw = W / P, Gh = H / P;
    if (!toy_is_contiguous(x)) x = toy_cont(ctx, x);
    /* memory order px, gx, py, (gy c b): swap gx and py */
    struct toy_tensor *t = toy_reshape_4d(ctx, x, P, Gw, P, Gh * C * B);
    t = toy_cont(ctx, toy_permute(ctx, t, 0, 2, 1, 3));          /* {px, py, gx, (gy c b)} */
    /* now px py | gx gy | c | b: swap (gx gy) and c */
    t = toy_reshape_4d(ctx, t, P * P, Gw * Gh, C, B);
    t = toy_cont(ctx, toy_permute(ctx, t, 0, 2, 1, 3));          /* {P*P, C, N, B} */
    return toy_reshape_3d(ctx, t, P * P * C, Gw * Gh, B);
}

struct toy_tensor *toy_vit_forward(struct toy_ctx *ctx, struct toy_vit *m, struct toy_tensor *images) {
    const struct toy_vit_config *c = &m->cfg;
    if (images->ne[0] != c->image_w || images->ne[1] != c->image_h || images->ne[2] != c->channels) {
        char s[96];
        fprintf(stderr, "toy_vit_forward: images %s, the model takes (B, %lld, %lld, %lld)\n",
                toy_shape_str(images, s, sizeof s), (long long)c->channels, (long long)c->image_h,
                (long long)c->image_w);
        abort();
    }
    int64_t B = images->ne[3], d = c->d_model, H = c->n_heads, hd = d / H, N = toy_vit_n_patches(c), T = N + 1;
    float eps = c->norm_eps;
    struct toy_tensor *x = toy_linear(ctx, im2col(ctx, images, c->patch), m->patch_w, m->patch_b); /* {d, N, B} */
    struct toy_tensor *shape = toy_new_tensor_3d(ctx, TOY_F32, d, 1, B);                        /* shape only */
    struct toy_tensor *cls = toy_repeat(ctx, toy_reshape_3d(ctx, m->cls, d, 1, 1), shape);      /* {d, 1, B} */
    x = toy_add(ctx, toy_concat(ctx, cls, x, 1), m->pos);                                       /* {d, T, B} */
    const struct toy_attn_params attn = {.causal = false};
    for (int64_t l = 0; l < c->n_layers; l++) {
        struct toy_vit_layer *L = &m->layers[l];
        struct toy_tensor *h = toy_layer_norm(ctx, x, L->attn_norm, L->attn_norm_b, eps);
        struct toy_tensor *qkv = toy_linear(ctx, h, L->w_qkv, L->b_qkv); /* {3d, T, B} */
        struct toy_tensor *a = toy_attention(ctx, toy_qkv_part(ctx, qkv, 0, hd, H), toy_qkv_part(ctx, qkv, 1, hd, H),
                                             toy_qkv_part(ctx, qkv, 2, hd, H), &attn); /* {hd, H, T, B} */
        x = toy_add(ctx, x, toy_linear(ctx, toy_reshape_3d(ctx, a, d, T, B), L->w_o, L->b_o));
        h = toy_layer_norm(ctx, x, L->ffn_norm, L->ffn_norm_b, eps);
        h = toy_gelu(ctx, toy_linear(ctx, h, L->w_up, L->b_up));
        x = toy_add(ctx, x, toy_linear(ctx, h, L->w_down, L->b_down));
    }
    /* only the class token reaches the head */
    const int64_t ne[2] = {d, B};
    const size_t nb[2] = {x->nb[0], x->nb[2]};
    struct toy_tensor *xc = toy_cont(ctx, toy_view(ctx, x, 2, ne, nb, 0)); /* {d, B} */
    xc = toy_layer_norm(ctx, xc, m->out_norm, m->out_norm_b, eps);
    return toy_linear(ctx, xc, m->head_w, m->head_b); /* {classes, B} */
}

/* ---- GGUF ----------------------------------------------------------------------- */

enum toy_status toy_vit_set_class_names(struct toy_vit *m, char *const *names) {
    if (m->class_names)
        for (int64_t i = 0; i < m->cfg.n_classes; i++) free(m->class_names[i]);
    free(m->class_names);
    m->class_names = NULL;
    if (!names) return TOY_OK;
    m->class_names = calloc((size_t)m->cfg.n_classes, sizeof *m->class_names);
    if (!m->class_names) return toy_error(TOY_ERR_NOMEM, "class names");
    for (int64_t i = 0; i < m->cfg.n_classes; i++)
        if (!(m->class_names[i] = strdup(names[i] ? names[i] : ""))) return toy_error(TOY_ERR_NOMEM, "class names");
    return TOY_OK;
}

enum toy_status toy_vit_write_gguf(const struct toy_vit *m, struct toy_gguf_writer *w) {
    const struct toy_vit_config *c = &m->cfg;
    enum toy_status st = toy_gguf_writer_set_str(w, "general.architecture", "vit");
    if (!st) st = toy_gguf_writer_set_u32(w, "general.alignment", 32);
    if (!st) st = toy_gguf_writer_set_u32(w, "general.file_type", 0);
#define U(k, v) if (!st) st = toy_gguf_writer_set_u32(w, "vit." k, (uint32_t)(v))
    U("image_size", c->image_w);
    U("image_height", c->image_h);
    U("patch_size", c->patch);
    U("channels", c->channels);
    U("embedding_length", c->d_model);
    U("block_count", c->n_layers);
    U("attention.head_count", c->n_heads);
    U("feed_forward_length", c->d_ff);
    U("class_count", c->n_classes);
#undef U
    if (!st) st = toy_gguf_writer_set_f32(w, "vit.attention.layer_norm_epsilon", c->norm_eps);
    if (!st) st = toy_gguf_writer_set_arr(w, "vit.image_mean", TOY_GGUF_F32, m->mean, (uint64_t)c->channels);
    if (!st) st = toy_gguf_writer_set_arr(w, "vit.image_std", TOY_GGUF_F32, m->std, (uint64_t)c->channels);
    if (!st && m->class_names)
        st = toy_gguf_writer_set_arr_str(w, "vit.class_names", (const char *const *)m->class_names, NULL,
                                         (uint64_t)c->n_classes);
    for (int i = 0; i < toy_vit_n_tensors(m) && !st; i++) {
        const struct toy_tensor *t = toy_vit_tensor(m, i);
        if (!toy_is_contiguous(t)) return toy_error(TOY_ERR_STATE, "tensor %s is not contiguous", t->name);
        st = toy_gguf_writer_add_tensor(w, t->name, t->type, t->ne[1] > 1 ? 2 : 1, t->ne, t->data);
    }
    return st;
}

static int64_t key_int(const struct toy_gguf *g, const char *key, int64_t def) {
    int64_t i = toy_gguf_find_key(g, key), v;
    if (i < 0 || toy_gguf_kv_int(g, i, &v)) return def;
    return v;
}

enum toy_status toy_vit_load(const char *path, bool trainable, struct toy_vit **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_vit_load: out is NULL");
    *out = NULL;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    const char *arch;
    size_t alen;
    if (toy_gguf_get_str(g, "general.architecture", &arch, &alen) || alen != 3 || memcmp(arch, "vit", 3)) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: general.architecture is not 'vit'", path);
    }
    struct toy_vit_config c = {0};
    c.image_w = key_int(g, "vit.image_size", 0);
    c.image_h = key_int(g, "vit.image_height", c.image_w);
    c.patch = key_int(g, "vit.patch_size", 0);
    c.channels = key_int(g, "vit.channels", 3);
    c.d_model = key_int(g, "vit.embedding_length", 0);
    c.n_layers = key_int(g, "vit.block_count", 0);
    c.n_heads = key_int(g, "vit.attention.head_count", 0);
    c.d_ff = key_int(g, "vit.feed_forward_length", 0);
    c.n_classes = key_int(g, "vit.class_count", 0);
    double eps = 1e-6;
    int64_t ki = toy_gguf_find_key(g, "vit.attention.layer_norm_epsilon");
    if (ki >= 0 && toy_gguf_kv_float(g, ki, &eps)) eps = 1e-6;
    c.norm_eps = (float)eps;
    if ((st = toy_vit_check_config(&c))) {
        toy_gguf_close(g);
        return toy_error(st, "%s: %s", path, toy_last_error());
    }
    struct toy_vit *m = vit_alloc(&c, trainable);
    if (!m) { toy_gguf_close(g); return toy_error(TOY_ERR_NOMEM, "%s", path); }
    m->gguf = g;
    const char *norm_keys[2] = {"vit.image_mean", "vit.image_std"};
    float *norm_dst[2] = {m->mean, m->std};
    for (int k = 0; k < 2; k++) {
        int64_t ai;
        uint64_t n;
        if (toy_gguf_get_arr(g, norm_keys[k], &ai, NULL, &n)) continue;
        for (uint64_t j = 0; j < n && j < (uint64_t)c.channels; j++) {
            double v;
            if (!toy_gguf_arr_float(g, ai, j, &v)) norm_dst[k][j] = (float)v;
        }
    }
    int64_t ai;
    uint64_t n;
    if (!toy_gguf_get_arr(g, "vit.class_names", &ai, NULL, &n) && n == (uint64_t)c.n_classes &&
        toy_gguf_arr_type(g, ai) == TOY_GGUF_STRING) {
        m->class_names = calloc((size_t)n, sizeof *m->class_names);
        for (uint64_t j = 0; m->class_names && j < n; j++) {
            size_t len;
            const char *s = toy_gguf_arr_str(g, ai, j, &len);
            m->class_names[j] = strndup(s, len);
        }
    }
    for (int i = 0; i < toy_vit_n_tensors(m) && !st; i++) {
        struct toy_tensor *t = toy_vit_tensor(m, i);
        int64_t ti = toy_gguf_find_tensor(g, t->name);
        if (ti < 0) { st = toy_error(TOY_ERR_FORMAT, "%s: missing tensor %s", path, t->name); break; }
        const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, ti);
        for (int d = 0; d < 4 && !st; d++)
            if (gt->ne[d] != t->ne[d])
                st = toy_error(TOY_ERR_SHAPE, "%s: tensor %s is [%lld, %lld], the config needs [%lld, %lld] (offset %zu)",
                               path, t->name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)t->ne[0],
                               (long long)t->ne[1], gt->file_offset);
        if (st) break;
        if (trainable) {
            st = toy_gguf_tensor_read_f32(g, ti, t->data, toy_nelements(t));
        } else if (gt->type == TOY_F32) {
            t->data = (void *)gt->data;
            toy_set_frozen(t);
        } else { /* toy writes f32; other files: converted once */
            t->data = toy_ctx_alloc(m->ctx, (size_t)toy_nelements(t) * sizeof(float));
            toy_set_frozen(t);
            st = toy_gguf_tensor_read_f32(g, ti, t->data, toy_nelements(t));
        }
    }
    if (st) { toy_vit_free(m); return st; }
    if (trainable) {
        toy_gguf_close(m->gguf);
        m->gguf = NULL;
    }
    *out = m;
    return TOY_OK;
}
