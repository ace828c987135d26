/* safetensors.c: the safetensors reader (mmap, zero copy) and sharded
 * checkpoints (model.safetensors.index.json). Format: the
 * huggingface/safetensors README (header length u64 LE, JSON header,
 * data), summarised in include/toy/safetensors.h.
 *
 * Validation, as the reference implementation does it: the header length
 * fits the file (and is at most 100 MB), the JSON parses with no duplicate
 * keys, each tensor has a known dtype, a non-negative shape whose element
 * count does not overflow, and data_offsets [begin, end] with
 * end - begin == elements * size; together the tensors cover the data
 * exactly (no holes, no overlaps). Index files may only name shards in
 * their own directory. */
#include "toy/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100u << 20)

struct shard {
    char *path;
    void *map;
    size_t map_size;
};

struct toy_safetensors {
    struct shard *shards;
    int n_shards;
    struct toy_st_tensor *t;
    int64_t n, cap;
    json_t *meta; /* __metadata__ of shard 0 */
};

static const struct { const char *name; enum toy_dtype type; } dtypes[] = {
    {"F32", TOY_F32}, {"F16", TOY_F16}, {"BF16", TOY_BF16}, {"F64", TOY_F64},
    {"I8", TOY_I8}, {"I16", TOY_I16}, {"I32", TOY_I32}, {"I64", TOY_I64},
};

struct span {
    uint64_t begin, end;
    const char *name;
};

static int span_cmp(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int tensor_cmp(const void *a, const void *b) {
    return strcmp(((const struct toy_st_tensor *)a)->name, ((const struct toy_st_tensor *)b)->name);
}

static enum toy_status push_tensor(struct toy_safetensors *st, struct toy_st_tensor *t) {
    if (st->n == st->cap) {
        int64_t cap = st->cap ? st->cap * 2 : 64;
        struct toy_st_tensor *p = realloc(st->t, (size_t)cap * sizeof *p);
        if (!p) return toy_error(TOY_ERR_NOMEM, "safetensors: out of memory");
        st->t = p;
        st->cap = cap;
    }
    st->t[st->n++] = *t;
    return TOY_OK;
}

/* Parses one file image; appends its tensors. */
static enum toy_status parse_image(struct toy_safetensors *st, int shard, const uint8_t *img, size_t size,
                                   const char *name) {
    if (size < 8)
        return toy_error(TOY_ERR_FORMAT, "%s: %zu bytes is too small for a safetensors header", name, size);
    uint64_t hlen;
    memcpy(&hlen, img, 8);
    if (hlen > size - 8)
        return toy_error(TOY_ERR_FORMAT, "%s: header length %llu (offset 0) exceeds the %zu bytes after it",
                         name, (unsigned long long)hlen, size - 8);
    if (hlen > ST_MAX_HEADER)
        return toy_error(TOY_ERR_FORMAT, "%s: header length %llu exceeds the 100 MB limit", name,
                         (unsigned long long)hlen);
    const uint8_t *data = img + 8 + hlen;
    const size_t data_size = size - 8 - (size_t)hlen;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)img + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return toy_error(TOY_ERR_FORMAT, "%s: header JSON at offset %d: %s", name, jerr.position + 8, jerr.text);
    enum toy_status stt = TOY_OK;
    struct span *spans = NULL;
    size_t n_spans = 0;
    if (!json_is_object(root)) {
        stt = toy_error(TOY_ERR_FORMAT, "%s: header is not a JSON object", name);
        goto done;
    }
    spans = malloc((json_object_size(root) + 1) * sizeof *spans);
    if (!spans) { stt = toy_error(TOY_ERR_NOMEM, "safetensors: out of memory"); goto done; }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                stt = toy_error(TOY_ERR_FORMAT, "%s: __metadata__ is not an object", name);
                goto done;
            }
            if (shard == 0 && !st->meta) st->meta = json_incref(v);
            continue;
        }
        struct toy_st_tensor t = {0};
        t.shard = shard;
        json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
               *offs = json_object_get(v, "data_offsets");
        if (!json_is_object(v) || !json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
            json_array_size(offs) != 2) {
            stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': needs dtype, shape and data_offsets [begin, end]",
                            name, key);
            goto done;
        }
        size_t k;
        for (k = 0; k < sizeof dtypes / sizeof dtypes[0]; k++)
            if (!strcmp(json_string_value(dt), dtypes[k].name)) break;
        if (k == sizeof dtypes / sizeof dtypes[0]) {
            stt = toy_error(TOY_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s is not supported", name, key,
                            json_string_value(dt));
            goto done;
        }
        t.type = dtypes[k].type;
        if (json_array_size(shape) > TOY_ST_MAX_DIMS) {
            stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': %zu dims (at most %d)", name, key,
                            json_array_size(shape), TOY_ST_MAX_DIMS);
            goto done;
        }
        t.n_dims = (int)json_array_size(shape);
        int64_t n = 1;
        for (int d = 0; d < t.n_dims; d++) {
            json_t *e = json_array_get(shape, (size_t)d);
            json_int_t x = json_is_integer(e) ? json_integer_value(e) : -1;
            if (x < 0) {
                stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                name, key, d);
                goto done;
            }
            if (x && n > INT64_MAX / x) {
                stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': element count overflows", name, key);
                goto done;
            }
            t.shape[d] = x;
            n *= x;
        }
        t.n_elements = n;
        size_t es = toy_dtype_type_size(t.type);
        if ((uint64_t)n > SIZE_MAX / es) {
            stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': byte size overflows", name, key);
            goto done;
        }
        t.nbytes = (size_t)n * es;
        json_t *b = json_array_get(offs, 0), *e = json_array_get(offs, 1);
        json_int_t bi = json_is_integer(b) ? json_integer_value(b) : -1;
        json_int_t ei = json_is_integer(e) ? json_integer_value(e) : -1;
        if (bi < 0 || ei < bi || (uint64_t)ei > data_size) {
            stt = toy_error(TOY_ERR_FORMAT,
                            "%s: tensor '%s': data_offsets [%lld, %lld] outside the %zu data bytes (data at offset %llu)",
                            name, key, (long long)bi, (long long)ei, data_size, (unsigned long long)(8 + hlen));
            goto done;
        }
        if ((uint64_t)(ei - bi) != t.nbytes) {
            stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s': data_offsets span %lld bytes, %s shape needs %zu",
                            name, key, (long long)(ei - bi), json_string_value(dt), t.nbytes);
            goto done;
        }
        t.data = data + bi;
        t.name = strdup(key);
        if (!t.name) { stt = toy_error(TOY_ERR_NOMEM, "safetensors: out of memory"); goto done; }
        if ((stt = push_tensor(st, &t))) { free((void *)t.name); goto done; }
        spans[n_spans++] = (struct span){(uint64_t)bi, (uint64_t)ei, st->t[st->n - 1].name};
    }
    /* the tensors must tile the data exactly */
    if (n_spans > 1) qsort(spans, n_spans, sizeof *spans, span_cmp);
    uint64_t at = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].begin != at) {
            stt = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s' starts at data byte %llu, expected %llu (%s)", name,
                            spans[i].name, (unsigned long long)spans[i].begin, (unsigned long long)at,
                            spans[i].begin > at ? "a hole" : "overlap");
            goto done;
        }
        at = spans[i].end;
    }
    if (at != data_size)
        stt = toy_error(TOY_ERR_FORMAT, "%s: tensors cover %llu of the %zu data bytes", name,
                        (unsigned long long)at, data_size);
done:
    free(spans);
    json_decref(root);
    return stt;
}

static enum toy_status map_file(const char *path, struct shard *sh) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return toy_error(errno == ENOENT ? TOY_ERR_NOT_FOUND : TOY_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) || !S_ISREG(sb.st_mode)) {
        close(fd);
        return toy_error(TOY_ERR_IO, "%s: not a regular file", path);
    }
    sh->map_size = (size_t)sb.st_size;
    sh->map = NULL;
    if (sh->map_size) {
        void *m = mmap(NULL, sh->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return toy_error(TOY_ERR_IO, "%s: mmap: %s", path, strerror(e));
        }
        sh->map = m;
    }
    close(fd);
    sh->path = strdup(path);
    return sh->path ? TOY_OK : toy_error(TOY_ERR_NOMEM, "safetensors: out of memory");
}

static enum toy_status add_shard(struct toy_safetensors *st, const char *path) {
    struct shard *s = realloc(st->shards, (size_t)(st->n_shards + 1) * sizeof *s);
    if (!s) return toy_error(TOY_ERR_NOMEM, "safetensors: out of memory");
    st->shards = s;
    struct shard *sh = &st->shards[st->n_shards];
    memset(sh, 0, sizeof *sh);
    enum toy_status e = map_file(path, sh);
    if (e) return e;
    st->n_shards++;
    return parse_image(st, st->n_shards - 1, sh->map ? sh->map : (const void *)"", sh->map_size, path);
}

static enum toy_status finish(struct toy_safetensors *st) {
    if (st->n > 1) qsort(st->t, (size_t)st->n, sizeof *st->t, tensor_cmp); /* t is NULL when empty */
    for (int64_t i = 1; i < st->n; i++)
        if (!strcmp(st->t[i].name, st->t[i - 1].name))
            return toy_error(TOY_ERR_FORMAT, "safetensors: tensor '%s' appears in two shards (%s, %s)",
                             st->t[i].name, st->shards[st->t[i - 1].shard].path, st->shards[st->t[i].shard].path);
    return TOY_OK;
}

static enum toy_status open_index(struct toy_safetensors *st, const char *index_path) {
    json_error_t jerr;
    json_t *root = json_load_file(index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return toy_error(TOY_ERR_FORMAT, "%s: line %d: %s", index_path, jerr.line, jerr.text);
    enum toy_status e = TOY_OK;
    json_t *map = json_object_get(root, "weight_map");
    char dir[4096];
    const char *slash = strrchr(index_path, '/');
    if (slash) snprintf(dir, sizeof dir, "%.*s", (int)(slash - index_path), index_path);
    else snprintf(dir, sizeof dir, ".");
    if (!json_is_object(map)) {
        e = toy_error(TOY_ERR_FORMAT, "%s: no weight_map object", index_path);
        goto done;
    }
    /* open each distinct shard once, in first-mention order */
    const char *name;
    json_t *file;
    json_t *opened = json_object();
    json_object_foreach(map, name, file) {
        const char *f = json_string_value(file);
        if (!f || !*f || strchr(f, '/') || !strcmp(f, "..") || !strcmp(f, ".")) {
            e = toy_error(TOY_ERR_FORMAT, "%s: weight_map['%s'] is not a file name in this directory", index_path, name);
            break;
        }
        if (json_object_get(opened, f)) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, f);
        if ((e = add_shard(st, path))) break;
        json_object_set_new(opened, f, json_integer(st->n_shards - 1));
    }
    if (!e) e = finish(st);
    if (!e) {
        json_object_foreach(map, name, file) {
            int64_t i = toy_safetensors_find(st, name);
            int want = (int)json_integer_value(json_object_get(opened, json_string_value(file)));
            if (i < 0 || st->t[i].shard != want) {
                e = toy_error(TOY_ERR_FORMAT, "%s: tensor '%s' is not in %s", index_path, name, json_string_value(file));
                break;
            }
        }
    }
    json_decref(opened);
done:
    json_decref(root);
    return e;
}

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

enum toy_status toy_safetensors_open(const char *path, struct toy_safetensors **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_safetensors_open: out is NULL");
    *out = NULL;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_safetensors_open: NULL path");
    struct toy_safetensors *st = calloc(1, sizeof *st);
    if (!st) return toy_error(TOY_ERR_NOMEM, "safetensors: out of memory");
    enum toy_status e;
    char buf[8192];
    if (is_dir(path)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (is_file(buf)) {
            e = open_index(st, buf);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (!is_file(buf)) {
                toy_safetensors_close(st);
                return toy_error(TOY_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", path);
            }
            e = add_shard(st, buf);
            if (!e) e = finish(st);
        }
    } else if (ends_with(path, ".json")) {
        e = open_index(st, path);
    } else {
        e = add_shard(st, path);
        if (!e) e = finish(st);
    }
    if (e) {
        toy_safetensors_close(st);
        return e;
    }
    *out = st;
    return TOY_OK;
}

enum toy_status toy_safetensors_open_memory(const void *data, size_t size, const char *name,
                                            struct toy_safetensors **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_safetensors_open_memory: out is NULL");
    *out = NULL;
    struct toy_safetensors *st = calloc(1, sizeof *st);
    if (!st) return toy_error(TOY_ERR_NOMEM, "safetensors: out of memory");
    st->shards = calloc(1, sizeof *st->shards);
    if (!st->shards) { free(st); return toy_error(TOY_ERR_NOMEM, "safetensors: out of memory"); }
    st->shards[0].path = strdup(name ? name : "<memory>");
    st->n_shards = 1;
    enum toy_status e = parse_image(st, 0, data ? data : (const void *)"", size, st->shards[0].path);
    if (!e) e = finish(st);
    if (e) {
        toy_safetensors_close(st);
        return e;
    }
    *out = st;
    return TOY_OK;
}

void toy_safetensors_close(struct toy_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n; i++) free((void *)st->t[i].name);
    free(st->t);
    for (int i = 0; i < st->n_shards; i++) {
        if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].map_size);
        free(st->shards[i].path);
    }
    free(st->shards);
    json_decref(st->meta);
    free(st);
}

int64_t toy_safetensors_n_tensors(const struct toy_safetensors *st) { return st->n; }
int toy_safetensors_n_shards(const struct toy_safetensors *st) { return st->n_shards; }

const struct toy_st_tensor *toy_safetensors_tensor(const struct toy_safetensors *st, int64_t i) {
    TOY_ASSERT(i >= 0 && i < st->n, "tensor index %lld of %lld", (long long)i, (long long)st->n);
    return &st->t[i];
}

int64_t toy_safetensors_find(const struct toy_safetensors *st, const char *name) {
    int64_t lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->t[mid].name, name);
        if (!c) return mid;
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

const char *toy_safetensors_metadata(const struct toy_safetensors *st, const char *key) {
    return st->meta ? json_string_value(json_object_get(st->meta, key)) : NULL;
}

enum toy_status toy_safetensors_read_f32(const struct toy_safetensors *st, int64_t i, float *dst, int64_t n) {
    if (!dst) return toy_error(TOY_ERR_INVALID_ARG, "toy_safetensors_read_f32: dst is NULL");
    const struct toy_st_tensor *t = toy_safetensors_tensor(st, i);
    if (n < t->n_elements)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: buffer of %lld floats for %lld elements", t->name,
                         (long long)n, (long long)t->n_elements);
    const uint8_t *p = t->data;
    switch (t->type) {
    case TOY_F32: memcpy(dst, p, t->nbytes); return TOY_OK;
    case TOY_F16:
        for (int64_t k = 0; k < t->n_elements; k++) { uint16_t h; memcpy(&h, p + 2 * k, 2); dst[k] = toy_f16_to_f32(h); }
        return TOY_OK;
    case TOY_BF16:
        for (int64_t k = 0; k < t->n_elements; k++) { uint16_t h; memcpy(&h, p + 2 * k, 2); dst[k] = toy_bf16_to_f32(h); }
        return TOY_OK;
    case TOY_F64:
        for (int64_t k = 0; k < t->n_elements; k++) { double d; memcpy(&d, p + 8 * k, 8); dst[k] = (float)d; }
        return TOY_OK;
    default:
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: %s tensor is not a float type", t->name, toy_dtype_name(t->type));
    }
}
