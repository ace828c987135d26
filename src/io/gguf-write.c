/* gguf-write.c: the GGUF writer (version 3, little-endian).
 * Format: ../shared/testdata/gguf-spec/gguf.md.
 *
 * Layout written, as ggml's gguf_write_to_file does: header, KVs in
 * insertion order, tensor infos in insertion order, zero padding to the
 * alignment, then each tensor's bytes followed by zero padding to the
 * alignment; tensor offsets are the running sum of the padded sizes. So a
 * file read and re-written with the same KVs and tensors is byte-identical.
 *
 * Each KV is serialized when it is set (key, type, value bytes), which keeps
 * replacing and copying simple. Writing to a path is atomic: a temp file in
 * the same directory, fsync, rename, fsync of the directory. */
#include "toy/gguf.h"
#include "toy/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct wkv {
    char *key;
    uint8_t *buf; /* serialized: key string, u32 type, value */
    size_t len;
};

struct wtensor {
    char name[TOY_GGUF_NAME_MAX];
    enum toy_dtype type;
    int n_dims;
    int64_t ne[TOY_GGUF_MAX_DIMS];
    size_t nbytes;
    const void *data;
    toy_gguf_fill_fn fill;
    void *ctx;
};

struct toy_gguf_writer {
    struct wkv *kvs;
    int64_t n_kv, cap_kv;
    struct wtensor *ts;
    int64_t n_t, cap_t;
    toy_gguf_progress_fn progress;
    void *progress_ctx;
};

/* growable byte buffer */
struct buf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
};

static void buf_put(struct buf *b, const void *src, size_t n) {
    if (b->oom || !n) return; /* nothing: src may be NULL (an empty string), which memcpy must not see */
    if (n > b->cap - b->len) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n) {
            if (cap > SIZE_MAX / 2) { b->oom = true; return; }
            cap *= 2;
        }
        uint8_t *p = realloc(b->p, cap);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}
static void buf_u32(struct buf *b, uint32_t v) { buf_put(b, &v, 4); }
static void buf_u64(struct buf *b, uint64_t v) { buf_put(b, &v, 8); }
static void buf_str(struct buf *b, const char *s, size_t n) { buf_u64(b, n); buf_put(b, s, n); }

enum toy_status toy_gguf_writer_init(struct toy_gguf_writer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_writer_init: out is NULL");
    *out = calloc(1, sizeof **out);
    return *out ? TOY_OK : toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory");
}

void toy_gguf_writer_free(struct toy_gguf_writer *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].buf);
    }
    free(w->kvs);
    free(w->ts);
    free(w);
}

int64_t toy_gguf_writer_n_kv(const struct toy_gguf_writer *w) { return w->n_kv; }
int64_t toy_gguf_writer_n_tensors(const struct toy_gguf_writer *w) { return w->n_t; }

void toy_gguf_writer_set_progress(struct toy_gguf_writer *w, toy_gguf_progress_fn fn, void *ctx) {
    w->progress = fn;
    w->progress_ctx = ctx;
}

static int64_t wfind(const struct toy_gguf_writer *w, const char *key) {
    for (int64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->kvs[i].key, key)) return i;
    return -1;
}

/* Starts a KV's serialization: key and type. */
static enum toy_status kv_begin(struct buf *b, const char *key, enum toy_gguf_type t) {
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > 65535)
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key length %zu (must be 1..65535)", n);
    buf_str(b, key, n);
    buf_u32(b, (uint32_t)t);
    return TOY_OK;
}

/* Stores a finished KV buffer under key (replacing in place). Takes b. */
static enum toy_status kv_commit(struct toy_gguf_writer *w, const char *key, struct buf *b) {
    if (b->oom) {
        free(b->p);
        return toy_error(TOY_ERR_NOMEM, "gguf writer: key '%s': out of memory", key);
    }
    int64_t i = wfind(w, key);
    if (i >= 0) {
        free(w->kvs[i].buf);
        w->kvs[i].buf = b->p;
        w->kvs[i].len = b->len;
        return TOY_OK;
    }
    if (w->n_kv == w->cap_kv) {
        int64_t cap = w->cap_kv ? w->cap_kv * 2 : 32;
        struct wkv *k = realloc(w->kvs, (size_t)cap * sizeof *k);
        if (!k) { free(b->p); return toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory"); }
        w->kvs = k;
        w->cap_kv = cap;
    }
    char *kc = strdup(key);
    if (!kc) { free(b->p); return toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory"); }
    w->kvs[w->n_kv++] = (struct wkv){kc, b->p, b->len};
    return TOY_OK;
}

static enum toy_status set_scalar(struct toy_gguf_writer *w, const char *key, enum toy_gguf_type t,
                                  const void *v) {
    struct buf b = {0};
    enum toy_status st = kv_begin(&b, key, t);
    if (st) return st;
    buf_put(&b, v, toy_gguf_type_size(t));
    return kv_commit(w, key, &b);
}

enum toy_status toy_gguf_writer_set_u8(struct toy_gguf_writer *w, const char *key, uint8_t v) { return set_scalar(w, key, TOY_GGUF_U8, &v); }
enum toy_status toy_gguf_writer_set_i8(struct toy_gguf_writer *w, const char *key, int8_t v) { return set_scalar(w, key, TOY_GGUF_I8, &v); }
enum toy_status toy_gguf_writer_set_u16(struct toy_gguf_writer *w, const char *key, uint16_t v) { return set_scalar(w, key, TOY_GGUF_U16, &v); }
enum toy_status toy_gguf_writer_set_i16(struct toy_gguf_writer *w, const char *key, int16_t v) { return set_scalar(w, key, TOY_GGUF_I16, &v); }
enum toy_status toy_gguf_writer_set_u32(struct toy_gguf_writer *w, const char *key, uint32_t v) { return set_scalar(w, key, TOY_GGUF_U32, &v); }
enum toy_status toy_gguf_writer_set_i32(struct toy_gguf_writer *w, const char *key, int32_t v) { return set_scalar(w, key, TOY_GGUF_I32, &v); }
enum toy_status toy_gguf_writer_set_u64(struct toy_gguf_writer *w, const char *key, uint64_t v) { return set_scalar(w, key, TOY_GGUF_U64, &v); }
enum toy_status toy_gguf_writer_set_i64(struct toy_gguf_writer *w, const char *key, int64_t v) { return set_scalar(w, key, TOY_GGUF_I64, &v); }
enum toy_status toy_gguf_writer_set_f32(struct toy_gguf_writer *w, const char *key, float v) { return set_scalar(w, key, TOY_GGUF_F32, &v); }
enum toy_status toy_gguf_writer_set_f64(struct toy_gguf_writer *w, const char *key, double v) { return set_scalar(w, key, TOY_GGUF_F64, &v); }

enum toy_status toy_gguf_writer_set_bool(struct toy_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, TOY_GGUF_BOOL, &b);
}

enum toy_status toy_gguf_writer_set_strn(struct toy_gguf_writer *w, const char *key, const char *s,
                                         size_t len) {
    if (!s && len) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': NULL string", key ? key : "");
    struct buf b = {0};
    enum toy_status st = kv_begin(&b, key, TOY_GGUF_STRING);
    if (st) return st;
    buf_str(&b, s, len);
    return kv_commit(w, key, &b);
}

enum toy_status toy_gguf_writer_set_str(struct toy_gguf_writer *w, const char *key, const char *s) {
    if (!s) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': NULL string", key ? key : "");
    return toy_gguf_writer_set_strn(w, key, s, strlen(s));
}

enum toy_status toy_gguf_writer_set_arr(struct toy_gguf_writer *w, const char *key,
                                        enum toy_gguf_type elem, const void *data, uint64_t n) {
    size_t sz = toy_gguf_type_size(elem);
    if (!sz)
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': array of %s needs set_arr_str",
                         key, toy_gguf_type_name(elem));
    if (n > SIZE_MAX / sz) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': array too long", key);
    if (n && !data) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': NULL array data", key ? key : "");
    struct buf b = {0};
    enum toy_status st = kv_begin(&b, key, TOY_GGUF_ARRAY);
    if (st) return st;
    buf_u32(&b, (uint32_t)elem);
    buf_u64(&b, n);
    if (n) buf_put(&b, data, (size_t)n * sz);
    return kv_commit(w, key, &b);
}

enum toy_status toy_gguf_writer_set_arr_str(struct toy_gguf_writer *w, const char *key,
                                            const char *const *strs, const size_t *lens, uint64_t n) {
    if (n && !strs) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': NULL strings", key ? key : "");
    for (uint64_t j = 0; j < n; j++)
        if (!strs[j] && (!lens || lens[j]))
            return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': string %llu is NULL", key ? key : "",
                             (unsigned long long)j);
    struct buf b = {0};
    enum toy_status st = kv_begin(&b, key, TOY_GGUF_ARRAY);
    if (st) return st;
    buf_u32(&b, TOY_GGUF_STRING);
    buf_u64(&b, n);
    for (uint64_t j = 0; j < n; j++) buf_str(&b, strs[j], lens ? lens[j] : strlen(strs[j]));
    return kv_commit(w, key, &b);
}

enum toy_status toy_gguf_writer_copy_kv(struct toy_gguf_writer *w, const struct toy_gguf *g, int64_t i) {
    const char *key = toy_gguf_kv_key(g, i);
    enum toy_gguf_type t = toy_gguf_kv_type(g, i);
    struct buf b = {0};
    enum toy_status st = kv_begin(&b, key, t);
    if (st) return st;
    if (t == TOY_GGUF_STRING) {
        const char *s;
        size_t len;
        toy_gguf_kv_str(g, i, &s, &len);
        buf_str(&b, s, len);
    } else if (t == TOY_GGUF_ARRAY) {
        enum toy_gguf_type et = toy_gguf_arr_type(g, i);
        uint64_t n = toy_gguf_arr_len(g, i);
        buf_u32(&b, (uint32_t)et);
        buf_u64(&b, n);
        if (et == TOY_GGUF_STRING) {
            for (uint64_t j = 0; j < n; j++) {
                size_t len;
                const char *s = toy_gguf_arr_str(g, i, j, &len);
                buf_str(&b, s, len);
            }
        } else if (n) {
            buf_put(&b, toy_gguf_arr_data(g, i), (size_t)n * toy_gguf_type_size(et));
        }
    } else {
        /* re-serialize the scalar at its own width */
        union { uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64; float f32; double f64; } v;
        int64_t si = 0;
        uint64_t ui = 0;
        double f = 0;
        switch (t) {
        case TOY_GGUF_U8: case TOY_GGUF_U16: case TOY_GGUF_U32: case TOY_GGUF_U64: case TOY_GGUF_BOOL:
            toy_gguf_kv_uint(g, i, &ui);
            v.u64 = 0;
            if (t == TOY_GGUF_U8 || t == TOY_GGUF_BOOL) v.u8 = (uint8_t)ui;
            else if (t == TOY_GGUF_U16) v.u16 = (uint16_t)ui;
            else if (t == TOY_GGUF_U32) v.u32 = (uint32_t)ui;
            else v.u64 = ui;
            break;
        case TOY_GGUF_I8: case TOY_GGUF_I16: case TOY_GGUF_I32: case TOY_GGUF_I64:
            toy_gguf_kv_int(g, i, &si);
            if (t == TOY_GGUF_I8) v.u8 = (uint8_t)(int8_t)si;
            else if (t == TOY_GGUF_I16) v.u16 = (uint16_t)(int16_t)si;
            else if (t == TOY_GGUF_I32) v.u32 = (uint32_t)(int32_t)si;
            else v.u64 = (uint64_t)si;
            break;
        case TOY_GGUF_F32: toy_gguf_kv_float(g, i, &f); v.f32 = (float)f; break;
        case TOY_GGUF_F64: toy_gguf_kv_float(g, i, &f); v.f64 = f; break;
        default: free(b.p); return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: key '%s': bad type", key);
        }
        buf_put(&b, &v, toy_gguf_type_size(t));
    }
    return kv_commit(w, key, &b);
}

enum toy_status toy_gguf_writer_remove(struct toy_gguf_writer *w, const char *key) {
    int64_t i = wfind(w, key);
    if (i < 0) return toy_error(TOY_ERR_NOT_FOUND, "gguf writer: key '%s' not found", key);
    free(w->kvs[i].key);
    free(w->kvs[i].buf);
    memmove(&w->kvs[i], &w->kvs[i + 1], (size_t)(w->n_kv - i - 1) * sizeof *w->kvs);
    w->n_kv--;
    return TOY_OK;
}

static enum toy_status add_tensor(struct toy_gguf_writer *w, const char *name, enum toy_dtype type,
                                  int n_dims, const int64_t *ne, const void *data,
                                  toy_gguf_fill_fn fill, void *ctx) {
    if (!name) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: NULL tensor name");
    if (!ne) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor '%s': NULL shape", name);
    size_t nlen = strlen(name);
    if (nlen == 0 || nlen >= TOY_GGUF_NAME_MAX)
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor name '%s': length %zu (must be 1..%d)",
                         name, nlen, TOY_GGUF_NAME_MAX - 1);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->ts[i].name, name))
            return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: duplicate tensor '%s'", name);
    const struct toy_dtype_info *info = toy_dtype_info(type);
    if (!info->name)
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor '%s': invalid type %d", name, (int)type);
    if (n_dims < 1 || n_dims > TOY_GGUF_MAX_DIMS)
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor '%s': %d dims", name, n_dims);
    struct wtensor t = {0};
    memcpy(t.name, name, nlen + 1);
    t.type = type;
    t.n_dims = n_dims;
    int64_t n = 1;
    for (int d = 0; d < TOY_GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0 || (t.ne[d] && n > INT64_MAX / t.ne[d]))
            return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor '%s': bad dim %d", name, d);
        n *= t.ne[d];
    }
    if (t.ne[0] % info->block_size)
        return toy_error(TOY_ERR_INVALID_ARG,
                         "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld",
                         name, (long long)t.ne[0], info->name, (long long)info->block_size);
    t.nbytes = (size_t)(n / info->block_size) * info->type_size;
    t.data = data;
    t.fill = fill;
    t.ctx = ctx;
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        struct wtensor *p = realloc(w->ts, (size_t)cap * sizeof *p);
        if (!p) return toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory");
        w->ts = p;
        w->cap_t = cap;
    }
    w->ts[w->n_t++] = t;
    return TOY_OK;
}

enum toy_status toy_gguf_writer_add_tensor(struct toy_gguf_writer *w, const char *name,
                                           enum toy_dtype type, int n_dims, const int64_t *ne,
                                           const void *data) {
    return add_tensor(w, name, type, n_dims, ne, data, NULL, NULL);
}

enum toy_status toy_gguf_writer_add_tensor_fn(struct toy_gguf_writer *w, const char *name,
                                              enum toy_dtype type, int n_dims, const int64_t *ne,
                                              toy_gguf_fill_fn fill, void *ctx) {
    return add_tensor(w, name, type, n_dims, ne, NULL, fill, ctx);
}

/* The alignment the file will use: a u32 general.alignment, else 32. */
static enum toy_status writer_alignment(const struct toy_gguf_writer *w, size_t *align) {
    *align = TOY_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = wfind(w, "general.alignment");
    if (i < 0) return TOY_OK;
    const struct wkv *kv = &w->kvs[i];
    size_t at = 8 + strlen(kv->key);
    uint32_t t, a;
    memcpy(&t, kv->buf + at, 4);
    if (t != TOY_GGUF_U32) return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: general.alignment must be u32");
    memcpy(&a, kv->buf + at + 4, 4);
    if (a < 8 || (a & (a - 1)) || a > (1u << 30))
        return toy_error(TOY_ERR_INVALID_ARG, "gguf writer: general.alignment %u is not a power of two >= 8", a);
    *align = a;
    return TOY_OK;
}

static size_t pad_to(size_t n, size_t a) { return (a - n % a) % a; }

/* Output: a FILE or a memory buffer. */
struct sink {
    FILE *f;
    struct buf *b;
    const char *path;
};

static enum toy_status sink_put(struct sink *s, const void *p, size_t n) {
    if (!n) return TOY_OK;
    if (s->f) {
        if (fwrite(p, 1, n, s->f) != n)
            return toy_error(TOY_ERR_IO, "%s: write: %s", s->path, strerror(errno));
        return TOY_OK;
    }
    buf_put(s->b, p, n);
    return s->b->oom ? toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory") : TOY_OK;
}

static enum toy_status sink_zeros(struct sink *s, size_t n) {
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? n : sizeof zeros;
        enum toy_status st = sink_put(s, zeros, k);
        if (st) return st;
        n -= k;
    }
    return TOY_OK;
}

static enum toy_status write_all(struct toy_gguf_writer *w, struct sink *s) {
    size_t align;
    enum toy_status st = writer_alignment(w, &align);
    if (st) return st;
    struct buf h = {0};
    buf_put(&h, "GGUF", 4);
    buf_u32(&h, 3);
    buf_u64(&h, (uint64_t)w->n_t);
    buf_u64(&h, (uint64_t)w->n_kv);
    for (int64_t i = 0; i < w->n_kv; i++) buf_put(&h, w->kvs[i].buf, w->kvs[i].len);
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_t; i++) {
        const struct wtensor *t = &w->ts[i];
        buf_str(&h, t->name, strlen(t->name));
        buf_u32(&h, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) buf_u64(&h, (uint64_t)t->ne[d]);
        buf_u32(&h, (uint32_t)t->type);
        buf_u64(&h, off);
        off += t->nbytes + pad_to(t->nbytes, align);
    }
    if (h.oom) { free(h.p); return toy_error(TOY_ERR_NOMEM, "gguf writer: out of memory"); }
    size_t hpad = pad_to(h.len, align);
    st = sink_put(s, h.p, h.len);
    free(h.p);
    if (st) return st;
    if ((st = sink_zeros(s, hpad))) return st;

    void *scratch = NULL;
    size_t scratch_cap = 0;
    for (int64_t i = 0; i < w->n_t && !st; i++) {
        const struct wtensor *t = &w->ts[i];
        const void *src = t->data;
        if (t->fill) {
            if (t->nbytes > scratch_cap) {
                free(scratch);
                scratch = malloc(t->nbytes ? t->nbytes : 1);
                scratch_cap = scratch ? t->nbytes : 0;
                if (!scratch) { st = toy_error(TOY_ERR_NOMEM, "gguf writer: tensor '%s': out of memory", t->name); break; }
            }
            if ((st = t->fill(t->ctx, scratch, t->nbytes))) break;
            src = scratch;
        } else if (!src && t->nbytes) {
            st = toy_error(TOY_ERR_INVALID_ARG, "gguf writer: tensor '%s' has no data", t->name);
            break;
        }
        if ((st = sink_put(s, src, t->nbytes))) break;
        if ((st = sink_zeros(s, pad_to(t->nbytes, align)))) break;
        if (w->progress) w->progress(w->progress_ctx, i + 1, w->n_t, t->name);
    }
    free(scratch);
    return st;
}

enum toy_status toy_gguf_writer_write_memory(struct toy_gguf_writer *w, void **out, size_t *size) {
    if (!out || !size)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_writer_write_memory: %s is NULL", out ? "size" : "out");
    struct buf b = {0};
    struct sink s = {NULL, &b, "<memory>"};
    enum toy_status st = write_all(w, &s);
    if (st) { free(b.p); return st; }
    *out = b.p;
    *size = b.len;
    return TOY_OK;
}

enum toy_status toy_gguf_writer_write(struct toy_gguf_writer *w, const char *path) {
    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(path, &r);
    if (st) return st;
    char *iobuf = malloc(1 << 20);
    if (iobuf) setvbuf(r.f, iobuf, _IOFBF, 1 << 20);
    struct sink s = {r.f, NULL, path};
    st = write_all(w, &s);
    if (st) toy_file_replace_abort(&r); /* write_all's own error names the tensor */
    else st = toy_file_replace_end(&r, true);
    free(iobuf);
    return st;
}
