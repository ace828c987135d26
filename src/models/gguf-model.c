/* gguf-model.c: see gguf-model.h */
#include "models/gguf-model.h"

#include <stdio.h>
#include <string.h>

#include "toy/quant.h"

bool toy_model_arch_is(const struct toy_gguf *g, const char *arch) {
    const char *a;
    size_t n;
    return !toy_gguf_get_str(g, "general.architecture", &a, &n) && n == strlen(arch) && !memcmp(a, arch, n);
}

int64_t toy_model_key_int(const struct toy_gguf *g, const char *arch, const char *suffix, int64_t def,
                          enum toy_status *st) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t i = toy_gguf_find_key(g, key), v;
    if (i < 0 || *st) return def;
    if ((*st = toy_gguf_kv_int(g, i, &v))) return def;
    return v;
}

enum toy_status toy_model_shape_error(const struct toy_gguf *g, const struct toy_gguf_tensor *gt,
                                      const struct toy_tensor *t) {
    return toy_error(TOY_ERR_SHAPE, "%s: tensor %s is [%lld, %lld, %lld, %lld], the config needs "
                     "[%lld, %lld, %lld, %lld] (offset %zu)", toy_gguf_path(g), t->name,
                     (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2], (long long)gt->ne[3],
                     (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                     gt->file_offset);
}

enum toy_status toy_model_check_type(const struct toy_gguf *g, const struct toy_gguf_tensor *gt, const char *name) {
    if (toy_can_dequantize(gt->type)) return TOY_OK;
    return toy_error(TOY_ERR_UNSUPPORTED, "%s: tensor %s has type %s, which toy cannot read yet", toy_gguf_path(g),
                     name, toy_dtype_name(gt->type));
}

const struct toy_gguf_tensor *toy_model_find_tensor(const struct toy_gguf *g, const struct toy_tensor *t,
                                                    bool more_rows, int64_t *i, enum toy_status *st) {
    *i = toy_gguf_find_tensor(g, t->name);
    if (*i < 0) {
        *st = toy_error(TOY_ERR_FORMAT, "%s: missing tensor %s", toy_gguf_path(g), t->name);
        return NULL;
    }
    const struct toy_gguf_tensor *gt = toy_gguf_tensor(g, *i);
    for (int d = 0; d < 4; d++)
        if (gt->ne[d] != t->ne[d] && !(d == 1 && more_rows && gt->ne[1] >= t->ne[1])) {
            *st = toy_model_shape_error(g, gt, t);
            return NULL;
        }
    return (*st = toy_model_check_type(g, gt, t->name)) ? NULL : gt;
}

void toy_model_map_tensor(struct toy_tensor *t, const struct toy_gguf_tensor *gt, const void *data) {
    t->type = gt->type;
    t->nb[0] = toy_dtype_type_size(gt->type);
    t->nb[1] = toy_row_bytes(gt->type, gt->ne[0]);
    for (int d = 2; d < 4; d++) t->nb[d] = t->nb[d - 1] * (size_t)t->ne[d - 1];
    t->data = (void *)data;
    toy_set_frozen(t);
}

struct conv {
    const struct toy_tensor *t;
    enum toy_dtype type;
};

static enum toy_status fill_converted(void *ctx, void *dst, size_t nbytes) {
    const struct conv *c = ctx;
    (void)nbytes;
    return toy_quantize_row(c->type, c->t->data, dst, toy_nelements(c->t));
}

enum toy_status toy_model_write_tensor(struct toy_gguf_writer *w, struct toy_ctx *ctx, const struct toy_tensor *t,
                                       int nd, enum toy_dtype type) {
    if (type == t->type || t->type != TOY_F32) {
        if (!toy_is_contiguous(t)) return toy_error(TOY_ERR_STATE, "tensor %s is not contiguous", t->name);
        return toy_gguf_writer_add_tensor(w, t->name, t->type, nd, t->ne, t->data);
    }
    struct conv *cv = toy_ctx_alloc(ctx, sizeof *cv);
    if (!cv) return toy_error(TOY_ERR_NOMEM, "writing %s", t->name);
    cv->t = t;
    cv->type = type;
    return toy_gguf_writer_add_tensor_fn(w, t->name, type, nd, t->ne, fill_converted, cv);
}
