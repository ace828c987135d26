/* gguf.c: the GGUF reader (versions 2 and 3) with mmap'd, zero-copy tensor
 * data. Format: ../shared/testdata/gguf-spec/gguf.md (ggml docs/gguf.md).
 *
 * Invariants: the parser never reads a byte before checking it is inside
 * the image (every count/length is compared with the bytes left, with
 * overflow-safe arithmetic); every allocation is sized by a count that was
 * first bounded by the image size (a KV needs >= 13 bytes, a string >= 8,
 * a tensor info >= 24). Rejected like ggml's gguf.cpp: nested arrays,
 * duplicate keys or tensor names, empty names or names of 64+ bytes, more than 4
 * dims, unknown types, alignments that are not powers of two >= 8, tensor data
 * that is misaligned or past the end of the file. Values of metadata are
 * kept as offsets into the image (strings of scalar values are copied with
 * a NUL so that callers get C strings). */
#include "toy/gguf.h"
#include "toy/quant.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct kv {
    char *key;                 /* NUL-terminated copy */
    enum toy_gguf_type type;
    union {
        uint64_t u;            /* U8..U64, BOOL */
        int64_t i;             /* I8..I64 */
        double f;              /* F32, F64 */
    } v;
    char *str;                 /* STRING: NUL-terminated copy */
    size_t str_len;
    enum toy_gguf_type arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;   /* first element (fixed-size) / first string */
    size_t *str_offs;          /* string arrays: offset of each length field */
};

struct toy_gguf {
    char *path;
    const uint8_t *data;       /* the image */
    size_t size;
    void *map;                 /* non-NULL when we own a mapping */
    size_t map_size;
    uint32_t version;
    size_t alignment;
    size_t header_end;
    size_t data_offset;
    int64_t n_kv;
    struct kv *kvs;
    int64_t n_tensors;
    struct toy_gguf_tensor *tensors;
    int64_t *key_hash;         /* open addressing, -1 = empty */
    size_t key_hash_cap;
    int64_t *tensor_hash;
    size_t tensor_hash_cap;
};

/* ---- small helpers --------------------------------------------------------- */

static const char *const type_names[TOY_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
};
static const size_t type_sizes[TOY_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *toy_gguf_type_name(enum toy_gguf_type t) {
    return (unsigned)t < TOY_GGUF_TYPE_COUNT ? type_names[t] : "invalid";
}

size_t toy_gguf_type_size(enum toy_gguf_type t) {
    return (unsigned)t < TOY_GGUF_TYPE_COUNT ? type_sizes[t] : 0;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static size_t hash_cap_for(int64_t n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    return cap;
}

/* Reading cursor over the image. */
struct rd {
    const uint8_t *p;
    size_t size;
    size_t pos;
    const char *name;
};

static enum toy_status need(struct rd *r, uint64_t n, const char *what) {
    if (n > r->size - r->pos)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: %s: needs %" PRIu64 " bytes at offset %zu but only %zu remain "
                         "(file size %zu)",
                         r->name, what, n, r->pos, r->size - r->pos, r->size);
    return TOY_OK;
}

static uint32_t ld32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t ld64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static enum toy_status rd_u32(struct rd *r, uint32_t *v, const char *what) {
    enum toy_status st = need(r, 4, what);
    if (st) return st;
    *v = ld32(r->p + r->pos);
    r->pos += 4;
    return TOY_OK;
}

static enum toy_status rd_u64(struct rd *r, uint64_t *v, const char *what) {
    enum toy_status st = need(r, 8, what);
    if (st) return st;
    *v = ld64(r->p + r->pos);
    r->pos += 8;
    return TOY_OK;
}

/* A GGUF string: u64 length then bytes. Leaves *s pointing into the image. */
static enum toy_status rd_str(struct rd *r, const char **s, uint64_t *len, const char *what) {
    size_t at = r->pos;
    enum toy_status st = rd_u64(r, len, what);
    if (st) return st;
    if (*len > r->size - r->pos)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: %s: string length %" PRIu64 " at offset %zu exceeds the %zu bytes "
                         "left in the file",
                         r->name, what, *len, at, r->size - r->pos);
    *s = (const char *)r->p + r->pos;
    r->pos += (size_t)*len;
    return TOY_OK;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* ---- lookup tables ------------------------------------------------------------ */

static int64_t key_lookup(const struct toy_gguf *g, const char *key, size_t len) {
    if (!g->key_hash) return -1;
    size_t m = g->key_hash_cap - 1;
    for (size_t h = hash_bytes(key, len) & m;; h = (h + 1) & m) {
        int64_t i = g->key_hash[h];
        if (i < 0) return -1;
        if (strlen(g->kvs[i].key) == len && !memcmp(g->kvs[i].key, key, len)) return i;
    }
}

static void key_insert(struct toy_gguf *g, int64_t i) {
    size_t m = g->key_hash_cap - 1;
    const char *k = g->kvs[i].key;
    size_t h = hash_bytes(k, strlen(k)) & m;
    while (g->key_hash[h] >= 0) h = (h + 1) & m;
    g->key_hash[h] = i;
}

static int64_t tensor_lookup(const struct toy_gguf *g, const char *name, size_t len) {
    if (!g->tensor_hash) return -1;
    size_t m = g->tensor_hash_cap - 1;
    for (size_t h = hash_bytes(name, len) & m;; h = (h + 1) & m) {
        int64_t i = g->tensor_hash[h];
        if (i < 0) return -1;
        if (strlen(g->tensors[i].name) == len && !memcmp(g->tensors[i].name, name, len)) return i;
    }
}

static void tensor_insert(struct toy_gguf *g, int64_t i) {
    size_t m = g->tensor_hash_cap - 1;
    const char *k = g->tensors[i].name;
    size_t h = hash_bytes(k, strlen(k)) & m;
    while (g->tensor_hash[h] >= 0) h = (h + 1) & m;
    g->tensor_hash[h] = i;
}

/* ---- parsing -------------------------------------------------------------------- */

static void scalar_store(struct kv *kv, enum toy_gguf_type t, const uint8_t *p) {
    switch (t) {
    case TOY_GGUF_U8: kv->v.u = p[0]; break;
    case TOY_GGUF_I8: kv->v.i = (int8_t)p[0]; break;
    case TOY_GGUF_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case TOY_GGUF_I16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case TOY_GGUF_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case TOY_GGUF_I32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case TOY_GGUF_F32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case TOY_GGUF_BOOL: kv->v.u = p[0]; break;
    case TOY_GGUF_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case TOY_GGUF_I64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case TOY_GGUF_F64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: break;
    }
}

static enum toy_status parse_value(struct toy_gguf *g, struct rd *r, struct kv *kv, size_t kv_at) {
    enum toy_status st;
    const char *key = kv->key;
    size_t at = r->pos;
    if ((unsigned)kv->type >= TOY_GGUF_TYPE_COUNT)
        return toy_error(TOY_ERR_FORMAT, "%s: key '%s' (offset %zu): unknown value type %u",
                         r->name, key, kv_at, (unsigned)kv->type);
    if (kv->type == TOY_GGUF_STRING) {
        const char *s;
        uint64_t len;
        char what[160];
        snprintf(what, sizeof what, "key '%.100s' string value", key);
        if ((st = rd_str(r, &s, &len, what))) return st;
        kv->str = dup_n(s, (size_t)len);
        if (!kv->str) return toy_error(TOY_ERR_NOMEM, "%s: key '%s': out of memory", r->name, key);
        kv->str_len = (size_t)len;
        return TOY_OK;
    }
    if (kv->type != TOY_GGUF_ARRAY) {
        size_t sz = type_sizes[kv->type];
        char what[160];
        snprintf(what, sizeof what, "key '%.100s' %s value", key, type_names[kv->type]);
        if ((st = need(r, sz, what))) return st;
        if (kv->type == TOY_GGUF_BOOL && r->p[r->pos] > 1)
            return toy_error(TOY_ERR_FORMAT, "%s: key '%s': bool value %u at offset %zu (must be 0 or 1)",
                             r->name, key, r->p[r->pos], r->pos);
        scalar_store(kv, kv->type, r->p + r->pos);
        r->pos += sz;
        return TOY_OK;
    }
    /* array: element type, count, elements */
    uint32_t et;
    uint64_t n;
    char what[160];
    snprintf(what, sizeof what, "key '%.100s' array header", key);
    if ((st = rd_u32(r, &et, what))) return st;
    if ((st = rd_u64(r, &n, what))) return st;
    if (et >= TOY_GGUF_TYPE_COUNT)
        return toy_error(TOY_ERR_FORMAT, "%s: key '%s' (offset %zu): unknown array element type %u",
                         r->name, key, at, et);
    if (et == TOY_GGUF_ARRAY)
        return toy_error(TOY_ERR_UNSUPPORTED,
                         "%s: key '%s' (offset %zu): nested arrays are not supported", r->name, key,
                         at);
    kv->arr_type = (enum toy_gguf_type)et;
    kv->arr_n = n;
    kv->arr_data = r->p + r->pos;
    size_t left = r->size - r->pos;
    if (et == TOY_GGUF_STRING) {
        /* every string needs at least its 8-byte length */
        if (n > left / 8)
            return toy_error(TOY_ERR_FORMAT,
                             "%s: key '%s' (offset %zu): array of %" PRIu64
                             " strings cannot fit in the %zu bytes left",
                             r->name, key, at, n, left);
        kv->str_offs = malloc((size_t)(n ? n : 1) * sizeof(size_t));
        if (!kv->str_offs) return toy_error(TOY_ERR_NOMEM, "%s: key '%s': out of memory", r->name, key);
        for (uint64_t j = 0; j < n; j++) {
            const char *s;
            uint64_t len;
            kv->str_offs[j] = r->pos;
            snprintf(what, sizeof what, "key '%.100s' element %" PRIu64, key, j);
            if ((st = rd_str(r, &s, &len, what))) return st;
        }
        return TOY_OK;
    }
    size_t sz = type_sizes[et];
    if (n > left / sz)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: key '%s' (offset %zu): array of %" PRIu64 " %s (%zu bytes each) "
                         "exceeds the %zu bytes left",
                         r->name, key, at, n, type_names[et], sz, left);
    if (et == TOY_GGUF_BOOL)
        for (uint64_t j = 0; j < n; j++)
            if (r->p[r->pos + j] > 1)
                return toy_error(TOY_ERR_FORMAT,
                                 "%s: key '%s': bool element %" PRIu64 " is %u at offset %zu (must be 0 or 1)",
                                 r->name, key, j, r->p[r->pos + j], (size_t)(r->pos + j));
    r->pos += (size_t)(n * sz);
    (void)g;
    return TOY_OK;
}

static enum toy_status parse(struct toy_gguf *g) {
    struct rd r = {g->data, g->size, 0, g->path};
    enum toy_status st;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;

    if (g->size < 4 || memcmp(g->data, "GGUF", 4))
        return toy_error(TOY_ERR_FORMAT, "%s: not a GGUF file (bad magic at offset 0)", g->path);
    if ((st = rd_u32(&r, &magic, "magic"))) return st;
    if ((st = rd_u32(&r, &version, "version"))) return st;
    if (version == 1)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (offset 4)", g->path);
    if (version != 2 && version != 3) {
        if ((version & 0xffffu) == 0 && (version >> 24) >= 1 && (version >> 24) <= 3)
            return toy_error(TOY_ERR_UNSUPPORTED, "%s: big-endian GGUF is not supported (offset 4)",
                             g->path);
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: GGUF version %u at offset 4 (supported: 2, 3)",
                         g->path, version);
    }
    g->version = version;
    if ((st = rd_u64(&r, &n_tensors, "tensor count"))) return st;
    if ((st = rd_u64(&r, &n_kv, "metadata KV count"))) return st;
    /* bound both counts by the bytes left before allocating anything */
    size_t left = r.size - r.pos;
    if (n_kv > left / 13)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: metadata KV count %" PRIu64 " (offset 16) cannot fit in the %zu bytes of the file",
                         g->path, n_kv, r.size);
    if (n_tensors > left / 24)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: tensor count %" PRIu64 " (offset 8) cannot fit in the %zu bytes of the file",
                         g->path, n_tensors, r.size);

    g->kvs = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kvs);
    g->key_hash_cap = hash_cap_for((int64_t)n_kv);
    g->key_hash = malloc(g->key_hash_cap * sizeof(int64_t));
    if (!g->kvs || !g->key_hash) return toy_error(TOY_ERR_NOMEM, "%s: out of memory", g->path);
    memset(g->key_hash, 0xff, g->key_hash_cap * sizeof(int64_t));

    for (uint64_t i = 0; i < n_kv; i++) {
        struct kv *kv = &g->kvs[i];
        size_t kv_at = r.pos;
        const char *k;
        uint64_t klen;
        char what[64];
        snprintf(what, sizeof what, "key of KV %" PRIu64, i);
        if ((st = rd_str(&r, &k, &klen, what))) return st;
        if (klen == 0 || klen > 65535)
            return toy_error(TOY_ERR_FORMAT, "%s: KV %" PRIu64 " (offset %zu): key length %" PRIu64
                             " (must be 1..65535)", g->path, i, kv_at, klen);
        if (memchr(k, 0, (size_t)klen))
            return toy_error(TOY_ERR_FORMAT, "%s: KV %" PRIu64 " (offset %zu): key contains a NUL byte",
                             g->path, i, kv_at);
        if (key_lookup(g, k, (size_t)klen) >= 0)
            return toy_error(TOY_ERR_FORMAT, "%s: duplicate key '%.*s' (offset %zu)", g->path,
                             (int)(klen > 200 ? 200 : klen), k, kv_at);
        kv->key = dup_n(k, (size_t)klen);
        if (!kv->key) return toy_error(TOY_ERR_NOMEM, "%s: out of memory", g->path);
        g->n_kv = (int64_t)i + 1; /* owned now: freed on error */
        uint32_t t;
        snprintf(what, sizeof what, "value type of KV %" PRIu64, i);
        if ((st = rd_u32(&r, &t, what))) return st;
        kv->type = (enum toy_gguf_type)t;
        if ((st = parse_value(g, &r, kv, kv_at))) return st;
        key_insert(g, (int64_t)i);
    }

    /* general.alignment */
    g->alignment = TOY_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = key_lookup(g, "general.alignment", strlen("general.alignment"));
    if (ai >= 0) {
        const struct kv *kv = &g->kvs[ai];
        if (kv->type != TOY_GGUF_U32)
            return toy_error(TOY_ERR_FORMAT, "%s: general.alignment is %s, expected u32", g->path,
                             toy_gguf_type_name(kv->type));
        uint64_t a = kv->v.u;
        /* the spec asks for a multiple of 8, ggml for a power of two; both
         * keep every tensor's data aligned for its element type */
        if (a < 8 || (a & (a - 1)) || a > (1u << 30))
            return toy_error(TOY_ERR_FORMAT, "%s: general.alignment %" PRIu64 " is not a power of two >= 8",
                             g->path, a);
        g->alignment = (size_t)a;
    }

    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    g->tensor_hash_cap = hash_cap_for((int64_t)n_tensors);
    g->tensor_hash = malloc(g->tensor_hash_cap * sizeof(int64_t));
    if (!g->tensors || !g->tensor_hash) return toy_error(TOY_ERR_NOMEM, "%s: out of memory", g->path);
    memset(g->tensor_hash, 0xff, g->tensor_hash_cap * sizeof(int64_t));

    for (uint64_t i = 0; i < n_tensors; i++) {
        struct toy_gguf_tensor *t = &g->tensors[i];
        size_t at = r.pos;
        const char *name;
        uint64_t nlen;
        char what[160];
        snprintf(what, sizeof what, "name of tensor %" PRIu64, i);
        if ((st = rd_str(&r, &name, &nlen, what))) return st;
        if (nlen == 0 || nlen >= TOY_GGUF_NAME_MAX)
            return toy_error(TOY_ERR_FORMAT, "%s: tensor %" PRIu64 " (offset %zu): name length %" PRIu64
                             " (must be 1..%d)", g->path, i, at, nlen, TOY_GGUF_NAME_MAX - 1);
        if (memchr(name, 0, (size_t)nlen))
            return toy_error(TOY_ERR_FORMAT, "%s: tensor %" PRIu64 " (offset %zu): name contains a NUL byte",
                             g->path, i, at);
        memcpy(t->name, name, (size_t)nlen);
        t->name[nlen] = 0;
        if (tensor_lookup(g, t->name, (size_t)nlen) >= 0)
            return toy_error(TOY_ERR_FORMAT, "%s: duplicate tensor name '%s' (offset %zu)", g->path,
                             t->name, at);
        uint32_t nd;
        snprintf(what, sizeof what, "tensor '%s' n_dims", t->name);
        if ((st = rd_u32(&r, &nd, what))) return st;
        if (nd > TOY_GGUF_MAX_DIMS)
            return toy_error(TOY_ERR_FORMAT, "%s: tensor '%s' (offset %zu): %u dims (at most %d)",
                             g->path, t->name, at, nd, TOY_GGUF_MAX_DIMS);
        t->n_dims = (int32_t)nd;
        int64_t n_el = 1;
        for (int d = 0; d < TOY_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t v;
            snprintf(what, sizeof what, "tensor '%s' dim %u", t->name, d);
            if ((st = rd_u64(&r, &v, what))) return st;
            if (v > (uint64_t)INT64_MAX)
                return toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': dim %u is %" PRIu64 " (offset %zu)",
                                 g->path, t->name, d, v, r.pos - 8);
            t->ne[d] = (int64_t)v;
            if (v && n_el > INT64_MAX / (int64_t)v)
                return toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': element count overflows (offset %zu)",
                                 g->path, t->name, r.pos - 8);
            n_el *= (int64_t)v;
        }
        t->n_elements = n_el;
        uint32_t type;
        snprintf(what, sizeof what, "tensor '%s' type", t->name);
        if ((st = rd_u32(&r, &type, what))) return st;
        const struct toy_dtype_info *info = toy_dtype_info((int)(type > 1000 ? 1000 : type));
        if (!info->name || info->block_size <= 0 || info->type_size == 0)
            return toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': unknown ggml type %u (offset %zu)",
                             g->path, t->name, type, r.pos - 4);
        t->type = (enum toy_dtype)type;
        if (t->ne[0] % info->block_size)
            return toy_error(TOY_ERR_FORMAT,
                             "%s: tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64,
                             g->path, t->name, t->ne[0], info->name, info->block_size);
        uint64_t blocks = (uint64_t)(n_el / info->block_size);
        if (blocks > SIZE_MAX / info->type_size)
            return toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': byte size overflows", g->path, t->name);
        t->nbytes = (size_t)blocks * info->type_size;
        snprintf(what, sizeof what, "tensor '%s' offset", t->name);
        if ((st = rd_u64(&r, &t->offset, what))) return st;
        if (t->offset % g->alignment)
            return toy_error(TOY_ERR_FORMAT,
                             "%s: tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %zu "
                             "(offset %zu)",
                             g->path, t->name, t->offset, g->alignment, r.pos - 8);
        g->n_tensors = (int64_t)i + 1;
        tensor_insert(g, (int64_t)i);
    }

    g->header_end = r.pos;
    size_t pad = (g->alignment - r.pos % g->alignment) % g->alignment;
    if (r.pos > SIZE_MAX - pad) return toy_error(TOY_ERR_FORMAT, "%s: header size overflows", g->path);
    g->data_offset = r.pos + pad;

    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct toy_gguf_tensor *t = &g->tensors[i];
        uint64_t start = (uint64_t)g->data_offset + t->offset;
        if (t->offset > (uint64_t)SIZE_MAX - g->data_offset || start > g->size ||
            t->nbytes > g->size - start)
            return toy_error(TOY_ERR_FORMAT,
                             "%s: tensor '%s': data [%" PRIu64 ", +%zu) lies past the end of the file "
                             "(size %zu, data section at %zu)",
                             g->path, t->name, start, t->nbytes, g->size, g->data_offset);
        t->file_offset = (size_t)start;
        t->data = g->data + start;
    }
    return TOY_OK;
}

static enum toy_status open_common(struct toy_gguf *g, struct toy_gguf **out) {
    enum toy_status st = parse(g);
    if (st) {
        toy_gguf_close(g);
        return st;
    }
    *out = g;
    return TOY_OK;
}

enum toy_status toy_gguf_open_memory(const void *data, size_t size, const char *name,
                                     struct toy_gguf **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_open_memory: data is NULL");
    struct toy_gguf *g = calloc(1, sizeof *g);
    if (!g) return toy_error(TOY_ERR_NOMEM, "toy_gguf_open_memory: out of memory");
    g->path = dup_n(name ? name : "<memory>", strlen(name ? name : "<memory>"));
    if (!g->path) { free(g); return toy_error(TOY_ERR_NOMEM, "toy_gguf_open_memory: out of memory"); }
    g->data = data ? data : (const uint8_t *)"";
    g->size = size;
    return open_common(g, out);
}

enum toy_status toy_gguf_open(const char *path, struct toy_gguf **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_open: out is NULL");
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_open: NULL path");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return toy_error(errno == ENOENT ? TOY_ERR_NOT_FOUND : TOY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) {
        int e = errno;
        close(fd);
        return toy_error(TOY_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return toy_error(TOY_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 24) {
        close(fd);
        return toy_error(TOY_ERR_FORMAT, "%s: %lld bytes is too small for a GGUF header (24 bytes)",
                         path, (long long)sb.st_size);
    }
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return toy_error(TOY_ERR_IO, "%s: mmap: %s", path, strerror(e));
    struct toy_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        munmap(map, size);
        return toy_error(TOY_ERR_NOMEM, "%s: out of memory", path);
    }
    g->path = dup_n(path, strlen(path));
    g->map = map;
    g->map_size = size;
    g->data = map;
    g->size = size;
    if (!g->path) {
        toy_gguf_close(g);
        return toy_error(TOY_ERR_NOMEM, "%s: out of memory", path);
    }
    return open_common(g, out);
}

void toy_gguf_close(struct toy_gguf *g) {
    if (!g) return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].str);
        free(g->kvs[i].str_offs);
    }
    free(g->kvs);
    free(g->tensors);
    free(g->key_hash);
    free(g->tensor_hash);
    if (g->map) munmap(g->map, g->map_size);
    free(g->path);
    free(g);
}

/* ---- accessors ------------------------------------------------------------------- */

uint32_t toy_gguf_version(const struct toy_gguf *g) { return g->version; }
size_t toy_gguf_alignment(const struct toy_gguf *g) { return g->alignment; }
size_t toy_gguf_data_offset(const struct toy_gguf *g) { return g->data_offset; }
size_t toy_gguf_header_end(const struct toy_gguf *g) { return g->header_end; }
size_t toy_gguf_file_size(const struct toy_gguf *g) { return g->size; }
const char *toy_gguf_path(const struct toy_gguf *g) { return g->path; }
int64_t toy_gguf_n_kv(const struct toy_gguf *g) { return g->n_kv; }

static const struct kv *kv_at(const struct toy_gguf *g, int64_t i) {
    TOY_ASSERT(i >= 0 && i < g->n_kv, "KV index %lld of %lld", (long long)i, (long long)g->n_kv);
    return &g->kvs[i];
}

const char *toy_gguf_kv_key(const struct toy_gguf *g, int64_t i) { return kv_at(g, i)->key; }
enum toy_gguf_type toy_gguf_kv_type(const struct toy_gguf *g, int64_t i) { return kv_at(g, i)->type; }

int64_t toy_gguf_find_key(const struct toy_gguf *g, const char *key) {
    return key_lookup(g, key, strlen(key));
}

static bool is_unsigned(enum toy_gguf_type t) {
    return t == TOY_GGUF_U8 || t == TOY_GGUF_U16 || t == TOY_GGUF_U32 || t == TOY_GGUF_U64 ||
           t == TOY_GGUF_BOOL;
}
static bool is_signed(enum toy_gguf_type t) {
    return t == TOY_GGUF_I8 || t == TOY_GGUF_I16 || t == TOY_GGUF_I32 || t == TOY_GGUF_I64;
}
static bool is_float(enum toy_gguf_type t) { return t == TOY_GGUF_F32 || t == TOY_GGUF_F64; }

static enum toy_status kind_error(const struct toy_gguf *g, const struct kv *kv, const char *want) {
    return toy_error(TOY_ERR_FORMAT, "%s: key '%s' is %s, expected %s", g->path, kv->key,
                     toy_gguf_type_name(kv->type), want);
}

enum toy_status toy_gguf_kv_int(const struct toy_gguf *g, int64_t i, int64_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_kv_int: v is NULL");
    const struct kv *kv = kv_at(g, i);
    if (is_signed(kv->type)) { *v = kv->v.i; return TOY_OK; }
    if (is_unsigned(kv->type)) {
        if (kv->v.u > (uint64_t)INT64_MAX)
            return toy_error(TOY_ERR_RANGE, "%s: key '%s' = %" PRIu64 " does not fit in i64", g->path,
                             kv->key, kv->v.u);
        *v = (int64_t)kv->v.u;
        return TOY_OK;
    }
    return kind_error(g, kv, "an integer");
}

enum toy_status toy_gguf_kv_uint(const struct toy_gguf *g, int64_t i, uint64_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_kv_uint: v is NULL");
    const struct kv *kv = kv_at(g, i);
    if (is_unsigned(kv->type)) { *v = kv->v.u; return TOY_OK; }
    if (is_signed(kv->type)) {
        if (kv->v.i < 0)
            return toy_error(TOY_ERR_RANGE, "%s: key '%s' = %" PRId64 " is negative", g->path, kv->key,
                             kv->v.i);
        *v = (uint64_t)kv->v.i;
        return TOY_OK;
    }
    return kind_error(g, kv, "an unsigned integer");
}

enum toy_status toy_gguf_kv_float(const struct toy_gguf *g, int64_t i, double *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_kv_float: v is NULL");
    const struct kv *kv = kv_at(g, i);
    if (is_float(kv->type)) *v = kv->v.f;
    else if (is_signed(kv->type)) *v = (double)kv->v.i;
    else if (is_unsigned(kv->type) && kv->type != TOY_GGUF_BOOL) *v = (double)kv->v.u;
    else return kind_error(g, kv, "a number");
    return TOY_OK;
}

enum toy_status toy_gguf_kv_str(const struct toy_gguf *g, int64_t i, const char **s, size_t *len) {
    if (!s) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_kv_str: s is NULL");
    const struct kv *kv = kv_at(g, i);
    if (kv->type != TOY_GGUF_STRING) return kind_error(g, kv, "str");
    *s = kv->str;
    if (len) *len = kv->str_len;
    return TOY_OK;
}

static enum toy_status find(const struct toy_gguf *g, const char *key, int64_t *i) {
    *i = toy_gguf_find_key(g, key);
    if (*i < 0) return toy_error(TOY_ERR_NOT_FOUND, "%s: key '%s' not found", g->path, key);
    return TOY_OK;
}

enum toy_status toy_gguf_get_u64(const struct toy_gguf *g, const char *key, uint64_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_u64: v is NULL");
    int64_t i;
    enum toy_status st = find(g, key, &i);
    return st ? st : toy_gguf_kv_uint(g, i, v);
}

enum toy_status toy_gguf_get_i64(const struct toy_gguf *g, const char *key, int64_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_i64: v is NULL");
    int64_t i;
    enum toy_status st = find(g, key, &i);
    return st ? st : toy_gguf_kv_int(g, i, v);
}

enum toy_status toy_gguf_get_u32(const struct toy_gguf *g, const char *key, uint32_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_u32: v is NULL");
    uint64_t u;
    enum toy_status st = toy_gguf_get_u64(g, key, &u);
    if (st) return st;
    if (u > UINT32_MAX)
        return toy_error(TOY_ERR_RANGE, "%s: key '%s' = %" PRIu64 " does not fit in u32", g->path, key, u);
    *v = (uint32_t)u;
    return TOY_OK;
}

enum toy_status toy_gguf_get_i32(const struct toy_gguf *g, const char *key, int32_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_i32: v is NULL");
    int64_t x;
    enum toy_status st = toy_gguf_get_i64(g, key, &x);
    if (st) return st;
    if (x < INT32_MIN || x > INT32_MAX)
        return toy_error(TOY_ERR_RANGE, "%s: key '%s' = %" PRId64 " does not fit in i32", g->path, key, x);
    *v = (int32_t)x;
    return TOY_OK;
}

enum toy_status toy_gguf_get_f64(const struct toy_gguf *g, const char *key, double *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_f64: v is NULL");
    int64_t i;
    enum toy_status st = find(g, key, &i);
    return st ? st : toy_gguf_kv_float(g, i, v);
}

enum toy_status toy_gguf_get_f32(const struct toy_gguf *g, const char *key, float *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_f32: v is NULL");
    double d;
    enum toy_status st = toy_gguf_get_f64(g, key, &d);
    if (!st) *v = (float)d;
    return st;
}

enum toy_status toy_gguf_get_bool(const struct toy_gguf *g, const char *key, bool *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_bool: v is NULL");
    int64_t i;
    enum toy_status st = find(g, key, &i);
    if (st) return st;
    const struct kv *kv = &g->kvs[i];
    if (kv->type == TOY_GGUF_BOOL) { *v = kv->v.u != 0; return TOY_OK; }
    if (is_signed(kv->type) || is_unsigned(kv->type)) {
        int64_t x;
        if ((st = toy_gguf_kv_int(g, i, &x))) return st;
        if (x != 0 && x != 1)
            return toy_error(TOY_ERR_RANGE, "%s: key '%s' = %" PRId64 " is not a bool", g->path, key, x);
        *v = x != 0;
        return TOY_OK;
    }
    return kind_error(g, kv, "bool");
}

enum toy_status toy_gguf_get_str(const struct toy_gguf *g, const char *key, const char **s, size_t *len) {
    if (!s) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_get_str: s is NULL");
    int64_t i;
    enum toy_status st = find(g, key, &i);
    return st ? st : toy_gguf_kv_str(g, i, s, len);
}

enum toy_status toy_gguf_get_arr(const struct toy_gguf *g, const char *key, int64_t *kv_index,
                                 enum toy_gguf_type *elem, uint64_t *n) {
    int64_t i;
    enum toy_status st = find(g, key, &i);
    if (st) return st;
    const struct kv *kv = &g->kvs[i];
    if (kv->type != TOY_GGUF_ARRAY) return kind_error(g, kv, "arr");
    if (kv_index) *kv_index = i;
    if (elem) *elem = kv->arr_type;
    if (n) *n = kv->arr_n;
    return TOY_OK;
}

static const struct kv *arr_at(const struct toy_gguf *g, int64_t i) {
    const struct kv *kv = kv_at(g, i);
    TOY_ASSERT(kv->type == TOY_GGUF_ARRAY, "key '%s' is not an array", kv->key);
    return kv;
}

enum toy_gguf_type toy_gguf_arr_type(const struct toy_gguf *g, int64_t i) { return arr_at(g, i)->arr_type; }
uint64_t toy_gguf_arr_len(const struct toy_gguf *g, int64_t i) { return arr_at(g, i)->arr_n; }

const void *toy_gguf_arr_data(const struct toy_gguf *g, int64_t i) {
    const struct kv *kv = arr_at(g, i);
    return kv->arr_type == TOY_GGUF_STRING ? NULL : kv->arr_data;
}

const char *toy_gguf_arr_str(const struct toy_gguf *g, int64_t i, uint64_t j, size_t *len) {
    const struct kv *kv = arr_at(g, i);
    TOY_ASSERT(kv->arr_type == TOY_GGUF_STRING && j < kv->arr_n, "key '%s': string element %llu",
               kv->key, (unsigned long long)j);
    size_t off = kv->str_offs[j];
    if (len) *len = (size_t)ld64(g->data + off);
    return (const char *)g->data + off + 8;
}

enum toy_status toy_gguf_arr_int(const struct toy_gguf *g, int64_t i, uint64_t j, int64_t *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_arr_int: v is NULL");
    const struct kv *kv = arr_at(g, i);
    TOY_ASSERT(j < kv->arr_n, "key '%s': element %llu of %llu", kv->key, (unsigned long long)j,
               (unsigned long long)kv->arr_n);
    enum toy_gguf_type t = kv->arr_type;
    if (!is_signed(t) && !is_unsigned(t)) return kind_error(g, kv, "an integer array");
    struct kv tmp = {0};
    scalar_store(&tmp, t, kv->arr_data + j * type_sizes[t]);
    if (is_signed(t)) { *v = tmp.v.i; return TOY_OK; }
    if (tmp.v.u > (uint64_t)INT64_MAX)
        return toy_error(TOY_ERR_RANGE, "%s: key '%s' element %llu does not fit in i64", g->path,
                         kv->key, (unsigned long long)j);
    *v = (int64_t)tmp.v.u;
    return TOY_OK;
}

enum toy_status toy_gguf_arr_float(const struct toy_gguf *g, int64_t i, uint64_t j, double *v) {
    if (!v) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_arr_float: v is NULL");
    const struct kv *kv = arr_at(g, i);
    TOY_ASSERT(j < kv->arr_n, "key '%s': element %llu of %llu", kv->key, (unsigned long long)j,
               (unsigned long long)kv->arr_n);
    enum toy_gguf_type t = kv->arr_type;
    struct kv tmp = {0};
    if (t == TOY_GGUF_STRING || t == TOY_GGUF_BOOL) return kind_error(g, kv, "a numeric array");
    scalar_store(&tmp, t, kv->arr_data + j * type_sizes[t]);
    *v = is_float(t) ? tmp.v.f : is_signed(t) ? (double)tmp.v.i : (double)tmp.v.u;
    return TOY_OK;
}

int64_t toy_gguf_n_tensors(const struct toy_gguf *g) { return g->n_tensors; }

bool toy_gguf_is_model(const struct toy_gguf *g, const char **what) {
    const char *s;
    size_t n;
    const char *w = NULL;
    if (!toy_gguf_get_str(g, "general.type", &s, &n)) {
        if (n == 7 && !memcmp(s, "adapter", 7)) w = "a LoRA adapter (toy generate --lora runs it over its base; toy merge folds it in)";
        else if (n > 10 && !memcmp(s, "toy-", 4) && !memcmp(s + n - 6, "-state", 6))
            w = "a toy training state (optimizer and data position, for --resume), not weights";
    }
    if (what) *what = w;
    return !w;
}

const struct toy_gguf_tensor *toy_gguf_tensor(const struct toy_gguf *g, int64_t i) {
    TOY_ASSERT(i >= 0 && i < g->n_tensors, "tensor index %lld of %lld", (long long)i,
               (long long)g->n_tensors);
    return &g->tensors[i];
}

int64_t toy_gguf_find_tensor(const struct toy_gguf *g, const char *name) {
    return tensor_lookup(g, name, strlen(name));
}

enum toy_status toy_gguf_tensor_read(const struct toy_gguf *g, int64_t i, void *dst, size_t dst_bytes) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_tensor_read: dst is NULL");
    const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
    if (dst_bytes < t->nbytes)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: tensor '%s' has %zu bytes, buffer holds %zu",
                         g->path, t->name, t->nbytes, dst_bytes);
    memcpy(dst, t->data, t->nbytes);
    return TOY_OK;
}

enum toy_status toy_gguf_tensor_read_f32(const struct toy_gguf *g, int64_t i, float *dst, int64_t n) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_gguf_tensor_read_f32: dst is NULL");
    const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
    if (n < t->n_elements)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: tensor '%s' has %lld elements, buffer holds %lld",
                         g->path, t->name, (long long)t->n_elements, (long long)n);
    if (!toy_can_dequantize(t->type))
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: tensor '%s': cannot dequantize %s", g->path, t->name,
                         toy_dtype_name(t->type));
    if (t->n_elements == 0) return TOY_OK;
    return toy_dequantize_row(t->type, t->data, dst, t->n_elements);
}

bool toy_gguf_maps(const struct toy_gguf *g, const void *p, size_t n) {
    if (!g || !g->map || !p) return false;
    uintptr_t lo = (uintptr_t)g->map, a = (uintptr_t)p;
    return a >= lo && n <= g->map_size && a - lo <= g->map_size - n;
}

void toy_gguf_release(struct toy_gguf *g, const void *p, size_t n) {
    if (!g || !g->map || !p || !n) return;
    uintptr_t lo = (uintptr_t)g->map, hi = lo + g->map_size, a = (uintptr_t)p, e = a + n;
    if (a < lo || e > hi) return;
    uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
    a = (a + ps - 1) & ~(ps - 1);
    e &= ~(ps - 1);
    if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
}
