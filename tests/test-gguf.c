/* test-gguf.c: the GGUF reader and writer (src/io/gguf.c, gguf-write.c)
 * against real files from other writers (../shared/testdata, with the
 * metadata recorded by two independent parsers), hostile inputs (every
 * truncation, byte flips in counts and lengths, hand-made bad headers),
 * write -> read -> write byte identity and atomic writes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/file.h"
#include "toy/gguf.h"
#include "toy/quant.h"

#define TESTDATA "../shared/testdata"

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static void *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(n ? (size_t)n : 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) { free(p); fclose(f); return NULL; }
    fclose(f);
    *size = (size_t)n;
    return p;
}

/* A fresh allocation of exactly n bytes, so ASan sees any read past it. */
static void *copy_exact(const void *p, size_t n) {
    void *q = malloc(n ? n : 1);
    memcpy(q, p, n);
    return q;
}

/* ---- metadata equal to expected_metadata.json ----------------------------------- */

static const char *kv_type_str(const struct toy_gguf *g, int64_t i, char *buf, size_t n) {
    enum toy_gguf_type t = toy_gguf_kv_type(g, i);
    if (t == TOY_GGUF_ARRAY)
        snprintf(buf, n, "arr[%s]", toy_gguf_type_name(toy_gguf_arr_type(g, i)));
    else
        snprintf(buf, n, "%s", toy_gguf_type_name(t));
    return buf;
}

static void expect_value(const struct toy_gguf *g, int64_t i, json_t *want, const char *file) {
    const char *key = toy_gguf_kv_key(g, i);
    enum toy_gguf_type t = toy_gguf_kv_type(g, i);
    if (t == TOY_GGUF_STRING) {
        const char *s;
        size_t len;
        cr_assert_eq(toy_gguf_kv_str(g, i, &s, &len), TOY_OK);
        cr_assert(json_is_string(want), "%s %s", file, key);
        cr_expect_eq(len, json_string_length(want), "%s %s", file, key);
        cr_expect(!memcmp(s, json_string_value(want), len), "%s %s", file, key);
    } else if (t == TOY_GGUF_BOOL) {
        cr_assert(json_is_boolean(want), "%s %s", file, key);
        bool b;
        cr_assert_eq(toy_gguf_get_bool(g, key, &b), TOY_OK);
        cr_expect_eq(b, json_is_true(want), "%s %s", file, key);
    } else if (t == TOY_GGUF_F32 || t == TOY_GGUF_F64) {
        double d;
        cr_assert_eq(toy_gguf_kv_float(g, i, &d), TOY_OK);
        cr_expect_eq(d, json_number_value(want), "%s %s: %.17g vs %.17g", file, key, d,
                     json_number_value(want));
    } else if (t == TOY_GGUF_ARRAY) {
        uint64_t n = toy_gguf_arr_len(g, i);
        cr_expect_eq(n, (uint64_t)json_integer_value(json_object_get(want, "array_len")), "%s %s", file, key);
        json_t *first = json_object_get(want, "first");
        size_t j;
        json_t *e;
        json_array_foreach(first, j, e) {
            cr_assert(j < n);
            enum toy_gguf_type et = toy_gguf_arr_type(g, i);
            if (et == TOY_GGUF_STRING) {
                size_t len;
                const char *s = toy_gguf_arr_str(g, i, j, &len);
                cr_expect_eq(len, json_string_length(e), "%s %s[%zu]", file, key, j);
                cr_expect(!memcmp(s, json_string_value(e), len), "%s %s[%zu]", file, key, j);
            } else {
                double d;
                cr_assert_eq(toy_gguf_arr_float(g, i, j, &d), TOY_OK);
                cr_expect_eq(d, json_number_value(e), "%s %s[%zu]", file, key, j);
            }
        }
    } else {
        int64_t v;
        cr_assert_eq(toy_gguf_kv_int(g, i, &v), TOY_OK);
        cr_expect_eq(v, json_integer_value(want), "%s %s", file, key);
    }
}

static int check_expected(const char *dir, const char *json_name) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, json_name);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    cr_assert(root, "%s: %s", path, err.text);
    const char *fname;
    json_t *exp;
    int n_files = 0;
    json_object_foreach(root, fname, exp) {
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        if (!exists(path)) continue; /* listed but too large to ship */
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(path, &g), TOY_OK, "%s: %s", path, toy_last_error());
        n_files++;
        cr_expect_eq(toy_gguf_version(g), json_integer_value(json_object_get(exp, "version")));
        cr_expect_eq(toy_gguf_file_size(g), (size_t)json_integer_value(json_object_get(exp, "file_size")));
        cr_expect_eq(toy_gguf_n_kv(g), json_integer_value(json_object_get(exp, "n_kv")), "%s", fname);
        cr_expect_eq(toy_gguf_header_end(g), (size_t)json_integer_value(json_object_get(exp, "header_end_bytes")),
                     "%s header_end %zu", fname, toy_gguf_header_end(g));
        cr_expect_eq(toy_gguf_data_offset(g), (size_t)json_integer_value(json_object_get(exp, "tensor_data_offset")),
                     "%s", fname);
        json_t *meta = json_object_get(exp, "metadata");
        json_t *types = json_object_get(exp, "kv_types");
        cr_expect_eq((int64_t)json_object_size(types), toy_gguf_n_kv(g));
        const char *key;
        json_t *tv;
        json_object_foreach(types, key, tv) {
            int64_t i = toy_gguf_find_key(g, key);
            cr_assert(i >= 0, "%s: key %s missing", fname, key);
            char buf[32];
            cr_expect_str_eq(kv_type_str(g, i, buf, sizeof buf), json_string_value(tv), "%s %s", fname, key);
            expect_value(g, i, json_object_get(meta, key), fname);
        }
        /* tensor table */
        json_t *tinfo = json_object_get(exp, "tensorInfo");
        cr_expect_eq(toy_gguf_n_tensors(g), (int64_t)json_array_size(tinfo));
        size_t ti;
        json_t *te;
        json_array_foreach(tinfo, ti, te) {
            const struct toy_gguf_tensor *t = toy_gguf_tensor(g, (int64_t)ti);
            cr_expect_str_eq(t->name, json_string_value(json_object_get(te, "name")));
            json_t *dims = json_object_get(te, "dims");
            cr_expect_eq(t->n_dims, (int32_t)json_array_size(dims));
            for (size_t d = 0; d < json_array_size(dims); d++)
                cr_expect_eq(t->ne[d], json_integer_value(json_array_get(dims, d)));
            cr_expect_eq((int)t->type, json_integer_value(json_object_get(te, "ggmlType")));
            cr_expect_eq(t->offset, (uint64_t)json_integer_value(json_object_get(te, "offset")));
            cr_expect_eq(toy_gguf_find_tensor(g, t->name), (int64_t)ti);
        }
        /* tensor sums */
        json_t *stats = json_object_get(exp, "tensor_stats_float64");
        json_array_foreach(stats, ti, te) {
            const char *name = json_string_value(json_object_get(te, "name"));
            int64_t idx = toy_gguf_find_tensor(g, name);
            cr_assert(idx >= 0, "%s", name);
            const struct toy_gguf_tensor *t = toy_gguf_tensor(g, idx);
            /* zero copy: the data pointer lies inside the file image */
            cr_expect_eq(t->file_offset, toy_gguf_data_offset(g) + t->offset);
            float *x = malloc((size_t)t->n_elements * sizeof(float));
            cr_assert_eq(toy_gguf_tensor_read_f32(g, idx, x, t->n_elements), TOY_OK, "%s", toy_last_error());
            double sum = 0, asum = 0;
            for (int64_t k = 0; k < t->n_elements; k++) { sum += x[k]; asum += fabs(x[k]); }
            double ws = json_number_value(json_object_get(te, "sum"));
            double wa = json_number_value(json_object_get(te, "abs_sum"));
            cr_expect(fabs(sum - ws) <= 1e-9 * (1 + fabs(wa)), "%s sum %.12g vs %.12g", name, sum, ws);
            cr_expect(fabs(asum - wa) <= 1e-9 * (1 + wa), "%s abs_sum %.12g vs %.12g", name, asum, wa);
            json_t *f4 = json_object_get(te, "first4");
            for (size_t k = 0; k < json_array_size(f4); k++)
                cr_expect_eq((double)x[k], json_number_value(json_array_get(f4, k)), "%s[%zu]", name, k);
            /* the read-into-buffer path gives the same bytes */
            void *copy = malloc(t->nbytes);
            cr_assert_eq(toy_gguf_tensor_read(g, idx, copy, t->nbytes), TOY_OK);
            cr_expect(!memcmp(copy, t->data, t->nbytes));
            free(copy);
            free(x);
        }
        toy_gguf_close(g);
    }
    json_decref(root);
    return n_files;
}

Test(gguf, llamacpp_vocab_metadata) {
    if (!exists(TESTDATA "/llamacpp-vocab-gguf")) cr_skip("testdata absent");
    cr_expect_eq(check_expected(TESTDATA "/llamacpp-vocab-gguf", "expected_metadata.json"), 6);
}

Test(gguf, llama2_tiny_random_tensors) {
    if (!exists(TESTDATA "/model-gguf-llama2-tiny-random")) cr_skip("testdata absent");
    cr_expect_eq(check_expected(TESTDATA "/model-gguf-llama2-tiny-random", "expected_metadata.json"), 1);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(TESTDATA "/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf", &g), TOY_OK);
    uint32_t u;
    int32_t i32;
    uint64_t u64;
    int64_t i64;
    float f;
    cr_expect_eq(toy_gguf_get_u32(g, "llama.block_count", &u), TOY_OK);
    cr_expect_eq(u, 1);
    cr_expect_eq(toy_gguf_get_i32(g, "llama.embedding_length", &i32), TOY_OK);
    cr_expect_eq(i32, 8);
    cr_expect_eq(toy_gguf_get_u64(g, "llama.context_length", &u64), TOY_OK);
    cr_expect_eq(u64, 4096);
    cr_expect_eq(toy_gguf_get_i64(g, "llama.feed_forward_length", &i64), TOY_OK);
    cr_expect_eq(i64, 32);
    cr_expect_eq(toy_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &f), TOY_OK);
    cr_expect_eq(f, 1e-5f);
    cr_expect_eq(toy_gguf_get_u32(g, "no.such.key", &u), TOY_ERR_NOT_FOUND);
    cr_expect(strstr(toy_last_error(), "no.such.key"));
    cr_expect_eq(toy_gguf_get_u32(g, "general.name", &u), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "general.name"));
    const char *s;
    cr_expect_eq(toy_gguf_get_str(g, "general.architecture", &s, NULL), TOY_OK);
    cr_expect_str_eq(s, "llama");
    int64_t ki;
    enum toy_gguf_type et;
    uint64_t n;
    cr_expect_eq(toy_gguf_get_arr(g, "tokenizer.ggml.tokens", &ki, &et, &n), TOY_OK);
    cr_expect_eq(et, TOY_GGUF_STRING);
    cr_expect_eq(n, 32000);
    size_t len;
    const char *tok = toy_gguf_arr_str(g, ki, 1, &len);
    cr_expect(len == 3 && !memcmp(tok, "<s>", 3));
    cr_expect_eq(toy_gguf_get_arr(g, "tokenizer.ggml.token_type", &ki, &et, &n), TOY_OK);
    cr_expect_eq(et, TOY_GGUF_I32);
    cr_expect_eq(toy_gguf_arr_int(g, ki, 0, &i64), TOY_OK);
    cr_expect_eq(i64, 2);
    toy_gguf_close(g);
}

Test(gguf, testvectors_parse_results) {
    const char *dir = TESTDATA "/gguf-testvectors";
    if (!exists(dir)) cr_skip("testdata absent");
    json_error_t err;
    json_t *root = json_load_file(TESTDATA "/gguf-testvectors/parse_results.json", 0, &err);
    cr_assert(root, "%s", err.text);
    const char *fname;
    json_t *exp;
    int n = 0;
    json_object_foreach(root, fname, exp) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, fname);
        json_t *py = json_object_get(exp, "helper_python_parser");
        struct toy_gguf *g;
        enum toy_status st = toy_gguf_open(path, &g);
        if (!json_is_true(json_object_get(py, "ok"))) {
            cr_expect_neq(st, TOY_OK, "%s should fail", fname);
            continue;
        }
        cr_assert_eq(st, TOY_OK, "%s: %s", fname, toy_last_error());
        n++;
        cr_expect_eq(toy_gguf_version(g), json_integer_value(json_object_get(py, "version")));
        cr_expect_eq(toy_gguf_n_tensors(g), json_integer_value(json_object_get(py, "n_tensors")));
        cr_expect_eq(toy_gguf_n_kv(g), json_integer_value(json_object_get(py, "n_kv")));
        cr_expect_eq(toy_gguf_header_end(g), (size_t)json_integer_value(json_object_get(py, "header_end")),
                     "%s", fname);
        json_t *keys = json_object_get(py, "keys");
        for (size_t k = 0; k < json_array_size(keys); k++)
            cr_expect_str_eq(toy_gguf_kv_key(g, (int64_t)k), json_string_value(json_array_get(keys, k)));
        /* every value is reachable through the accessors */
        for (int64_t k = 0; k < toy_gguf_n_kv(g); k++) {
            if (toy_gguf_kv_type(g, k) != TOY_GGUF_ARRAY) continue;
            uint64_t len = toy_gguf_arr_len(g, k);
            if (toy_gguf_arr_type(g, k) == TOY_GGUF_STRING && len) {
                size_t sl;
                toy_gguf_arr_str(g, k, len - 1, &sl);
            }
        }
        toy_gguf_close(g);
    }
    cr_expect_eq(n, 12);
    json_decref(root);
}

/* ---- hostile input ------------------------------------------------------------------- */

/* The smallest prefix of the file that still parses (header and all data). */
static size_t required_end(const void *buf, size_t size) {
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open_memory(buf, size, "full", &g), TOY_OK, "%s", toy_last_error());
    size_t end = toy_gguf_header_end(g);
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        if (t->nbytes && t->file_offset + t->nbytes > end) end = t->file_offset + t->nbytes;
    }
    toy_gguf_close(g);
    return end;
}

static void truncations(const char *path, size_t max_cuts) {
    size_t size;
    uint8_t *buf = slurp(path, &size);
    cr_assert(buf, "%s", path);
    size_t need = required_end(buf, size);
    size_t step = size / max_cuts + 1;
    for (size_t cut = 0; cut < size; cut += (cut < 512 ? 1 : step)) {
        void *p = copy_exact(buf, cut);
        struct toy_gguf *g = NULL;
        toy_clear_error();
        enum toy_status st = toy_gguf_open_memory(p, cut, path, &g);
        if (cut < need) {
            cr_assert_neq(st, TOY_OK, "%s cut at %zu parsed", path, cut);
            cr_assert_null(g);
            cr_assert(strlen(toy_last_error()) > 10, "%s cut %zu: no message", path, cut);
        } else {
            cr_assert_eq(st, TOY_OK, "%s cut at %zu: %s", path, cut, toy_last_error());
            toy_gguf_close(g);
        }
        free(p);
    }
    free(buf);
}

Test(gguf, truncated_files_fail_cleanly) {
    if (!exists(TESTDATA "/gguf-testvectors")) cr_skip("testdata absent");
    DIR *d = opendir(TESTDATA "/gguf-testvectors/valid");
    cr_assert(d);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".gguf")) continue;
        char path[512];
        snprintf(path, sizeof path, TESTDATA "/gguf-testvectors/valid/%s", e->d_name);
        truncations(path, 300);
        n++;
    }
    closedir(d);
    cr_expect_eq(n, 12);
    truncations(TESTDATA "/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf", 300);
    truncations(TESTDATA "/llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf", 200);
}

/* Flip bytes of the header (counts, lengths, types): never a crash, and a
 * failure always says why. */
static void flips(const char *path, size_t max_positions) {
    size_t size;
    uint8_t *buf = slurp(path, &size);
    cr_assert(buf);
    size_t hdr = required_end(buf, size);
    if (hdr > 4096) hdr = 4096; /* the counts and first KVs */
    static const uint8_t vals[] = {0x00, 0xff, 0x7f, 0x80, 0x01, 0x40};
    size_t step = hdr / max_positions + 1;
    for (size_t pos = 0; pos < hdr; pos += step) {
        for (size_t v = 0; v < sizeof vals; v++) {
            uint8_t *p = copy_exact(buf, size);
            if (p[pos] == vals[v]) p[pos] ^= 0x55;
            else p[pos] = vals[v];
            struct toy_gguf *g = NULL;
            toy_clear_error();
            enum toy_status st = toy_gguf_open_memory(p, size, path, &g);
            if (st) {
                cr_assert_null(g);
                cr_assert(strlen(toy_last_error()) > 10, "%s flip at %zu: no message", path, pos);
            } else {
                /* walk everything the parse accepted */
                for (int64_t i = 0; i < toy_gguf_n_kv(g); i++)
                    if (toy_gguf_kv_type(g, i) == TOY_GGUF_ARRAY && toy_gguf_arr_type(g, i) == TOY_GGUF_STRING)
                        for (uint64_t j = 0; j < toy_gguf_arr_len(g, i) && j < 64; j++) {
                            size_t len;
                            const char *s = toy_gguf_arr_str(g, i, j, &len);
                            volatile char c = len ? s[len - 1] : 0;
                            (void)c;
                        }
                toy_gguf_close(g);
            }
            free(p);
        }
    }
    free(buf);
}

Test(gguf, byte_flips_fail_cleanly) {
    if (!exists(TESTDATA "/gguf-testvectors")) cr_skip("testdata absent");
    flips(TESTDATA "/gguf-testvectors/valid/bitnet-rs__llama2-32k.gguf", 1000);
    flips(TESTDATA "/gguf-testvectors/valid/gridcore-runner__vocab-bpe-qwen2.gguf", 1000);
    flips(TESTDATA "/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf", 400);
}

/* Hand-made headers, built byte by byte. */
struct mk {
    uint8_t b[4096];
    size_t n;
};
static void mk_put(struct mk *m, const void *p, size_t n) { memcpy(m->b + m->n, p, n); m->n += n; }
static void mk_u32(struct mk *m, uint32_t v) { mk_put(m, &v, 4); }
static void mk_u64(struct mk *m, uint64_t v) { mk_put(m, &v, 8); }
static void mk_str(struct mk *m, const char *s) { mk_u64(m, strlen(s)); mk_put(m, s, strlen(s)); }
static void mk_hdr(struct mk *m, uint32_t version, uint64_t nt, uint64_t nkv) {
    m->n = 0;
    mk_put(m, "GGUF", 4);
    mk_u32(m, version);
    mk_u64(m, nt);
    mk_u64(m, nkv);
}

static enum toy_status parse_mk(struct mk *m) {
    void *p = copy_exact(m->b, m->n);
    struct toy_gguf *g = NULL;
    enum toy_status st = toy_gguf_open_memory(p, m->n, "mk.gguf", &g);
    toy_gguf_close(g);
    free(p);
    return st;
}

Test(gguf, hostile_headers) {
    struct mk m;
    /* nested array */
    mk_hdr(&m, 3, 0, 1);
    mk_str(&m, "a.b");
    mk_u32(&m, TOY_GGUF_ARRAY);
    mk_u32(&m, TOY_GGUF_ARRAY);
    mk_u64(&m, 1);
    mk_u32(&m, TOY_GGUF_U8);
    mk_u64(&m, 1);
    uint8_t one = 1;
    mk_put(&m, &one, 1);
    cr_expect_eq(parse_mk(&m), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "nested arrays") && strstr(toy_last_error(), "a.b"), "%s", toy_last_error());

    /* huge KV count */
    mk_hdr(&m, 3, 0, UINT64_MAX);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "KV count"), "%s", toy_last_error());

    /* huge tensor count */
    mk_hdr(&m, 3, 1ull << 60, 0);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "tensor count"), "%s", toy_last_error());

    /* string length past the end */
    mk_hdr(&m, 3, 0, 1);
    mk_str(&m, "general.name");
    mk_u32(&m, TOY_GGUF_STRING);
    mk_u64(&m, 1000);
    mk_put(&m, "abc", 3);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "general.name") && strstr(toy_last_error(), "offset 48"),
              "%s", toy_last_error());

    /* array count * element size overflow */
    mk_hdr(&m, 3, 0, 1);
    mk_str(&m, "x.y");
    mk_u32(&m, TOY_GGUF_ARRAY);
    mk_u32(&m, TOY_GGUF_U64);
    mk_u64(&m, 1ull << 61);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "x.y"), "%s", toy_last_error());

    /* unknown value type */
    mk_hdr(&m, 3, 0, 1);
    mk_str(&m, "x.y");
    mk_u32(&m, 13);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);

    /* duplicate key */
    mk_hdr(&m, 3, 0, 2);
    for (int i = 0; i < 2; i++) { mk_str(&m, "k"); mk_u32(&m, TOY_GGUF_U8); mk_put(&m, &one, 1); }
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "duplicate key"), "%s", toy_last_error());

    /* bad bool */
    mk_hdr(&m, 3, 0, 1);
    mk_str(&m, "k");
    mk_u32(&m, TOY_GGUF_BOOL);
    uint8_t two = 2;
    mk_put(&m, &two, 1);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);

    /* versions */
    mk_hdr(&m, 1, 0, 0);
    cr_expect_eq(parse_mk(&m), TOY_ERR_UNSUPPORTED);
    mk_hdr(&m, 0x03000000u, 0, 0);
    cr_expect_eq(parse_mk(&m), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "big-endian"), "%s", toy_last_error());
    mk_hdr(&m, 2, 0, 0);
    cr_expect_eq(parse_mk(&m), TOY_OK);

    /* alignment: not a power of two, or below 8 (tensor data could then be
     * misaligned for its type: found by the fuzzer) */
    uint32_t bad_align[] = {48, 0, 1, 2, 4};
    for (size_t i = 0; i < sizeof bad_align / sizeof bad_align[0]; i++) {
        mk_hdr(&m, 3, 0, 1);
        mk_str(&m, "general.alignment");
        mk_u32(&m, TOY_GGUF_U32);
        mk_u32(&m, bad_align[i]);
        cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT, "alignment %u", bad_align[i]);
        cr_expect(strstr(toy_last_error(), "general.alignment"), "%s", toy_last_error());
    }

    /* tensors: too many dims, bad type, misaligned, past the end, duplicate, block */
    struct { uint32_t nd; uint64_t ne0; uint32_t type; uint64_t off; const char *msg; } bad[] = {
        {5, 4, TOY_F32, 0, "5 dims"},
        {1, 4, 4, 0, "unknown ggml type"},
        {1, 4, 99, 0, "unknown ggml type"},
        {1, 4, TOY_F32, 8, "not a multiple of the alignment"},
        {1, 1000, TOY_F32, 0, "past the end"},
        {1, 4, TOY_F32, 1ull << 63, "past the end"},
        {1, 16, TOY_Q8_0, 0, "block size"},
        {2, 1ull << 62, TOY_F32, 0, "overflows"},
    };
    for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        mk_hdr(&m, 3, 1, 0);
        mk_str(&m, "blk.0.attn_q.weight");
        mk_u32(&m, bad[b].nd);
        for (uint32_t d = 0; d < bad[b].nd && d < 8; d++) mk_u64(&m, d == 0 ? bad[b].ne0 : 4);
        mk_u32(&m, bad[b].type);
        mk_u64(&m, bad[b].off);
        while (m.n % 32) mk_put(&m, "", 1);
        for (int k = 0; k < 64; k++) mk_put(&m, "", 1);
        cr_expect_neq(parse_mk(&m), TOY_OK, "case %zu", b);
        cr_expect(strstr(toy_last_error(), bad[b].msg) && strstr(toy_last_error(), "blk.0.attn_q.weight"),
                  "case %zu: %s", b, toy_last_error());
    }
    mk_hdr(&m, 3, 2, 0);
    for (int i = 0; i < 2; i++) { mk_str(&m, "t"); mk_u32(&m, 1); mk_u64(&m, 4); mk_u32(&m, TOY_F32); mk_u64(&m, 0); }
    while (m.n % 32) mk_put(&m, "", 1);
    for (int k = 0; k < 32; k++) mk_put(&m, "", 1);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "duplicate tensor"), "%s", toy_last_error());

    /* name of 64 bytes */
    mk_hdr(&m, 3, 1, 0);
    mk_str(&m, "0123456789012345678901234567890123456789012345678901234567890123");
    mk_u32(&m, 1); mk_u64(&m, 4); mk_u32(&m, TOY_F32); mk_u64(&m, 0);
    cr_expect_eq(parse_mk(&m), TOY_ERR_FORMAT);
}

/* Crash inputs found by the fuzzer (fuzz/fuzz-gguf.c) stay as regressions. */
Test(gguf, fuzz_regressions) {
    DIR *d = opendir("tests/data/gguf-crashes");
    if (!d) cr_skip("no tests/data/gguf-crashes");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/data/gguf-crashes/%s", e->d_name);
        size_t size;
        void *buf = slurp(path, &size);
        if (!buf) continue;
        void *p = copy_exact(buf, size);
        struct toy_gguf *g = NULL;
        if (toy_gguf_open_memory(p, size, path, &g) == TOY_OK) toy_gguf_close(g);
        else cr_expect(strlen(toy_last_error()) > 0);
        free(p);
        free(buf);
    }
    closedir(d);
}

/* ---- writing ------------------------------------------------------------------------- */

static struct toy_gguf_writer *every_type_writer(float *f32, toy_f16 *f16, uint8_t *q8) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_str(w, "general.architecture", "llama"), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_u32(w, "general.alignment", 64), TOY_OK);
    toy_gguf_writer_set_u8(w, "t.u8", 200);
    toy_gguf_writer_set_i8(w, "t.i8", -100);
    toy_gguf_writer_set_u16(w, "t.u16", 60000);
    toy_gguf_writer_set_i16(w, "t.i16", -30000);
    toy_gguf_writer_set_u32(w, "t.u32", 4000000000u);
    toy_gguf_writer_set_i32(w, "t.i32", -2000000000);
    toy_gguf_writer_set_u64(w, "t.u64", 18000000000000000000ull);
    toy_gguf_writer_set_i64(w, "t.i64", -9000000000000000000ll);
    toy_gguf_writer_set_f32(w, "t.f32", 0.1f);
    toy_gguf_writer_set_f64(w, "t.f64", 0.1);
    toy_gguf_writer_set_bool(w, "t.bool", true);
    toy_gguf_writer_set_strn(w, "t.str0", "a\0b", 3);
    toy_gguf_writer_set_str(w, "t.replaced", "old");
    toy_gguf_writer_set_str(w, "t.replaced", "new");
    int32_t ai[3] = {-1, 0, 7};
    float af[2] = {1.5f, -2.25f};
    uint8_t ab[2] = {1, 0};
    double ad[1] = {3.0};
    cr_assert_eq(toy_gguf_writer_set_arr(w, "a.i32", TOY_GGUF_I32, ai, 3), TOY_OK);
    toy_gguf_writer_set_arr(w, "a.f32", TOY_GGUF_F32, af, 2);
    toy_gguf_writer_set_arr(w, "a.bool", TOY_GGUF_BOOL, ab, 2);
    toy_gguf_writer_set_arr(w, "a.f64", TOY_GGUF_F64, ad, 1);
    toy_gguf_writer_set_arr(w, "a.empty", TOY_GGUF_U8, NULL, 0);
    const char *strs[3] = {"hello", "", "wörld"};
    cr_assert_eq(toy_gguf_writer_set_arr_str(w, "a.str", strs, NULL, 3), TOY_OK);
    cr_expect_eq(toy_gguf_writer_set_arr(w, "a.bad", TOY_GGUF_ARRAY, ai, 1), TOY_ERR_INVALID_ARG);
    for (int i = 0; i < 96; i++) f32[i] = (float)i * 0.25f - 3;
    toy_f32_to_f16_row(f32, f16, 96);
    cr_assert_eq(toy_quantize_row(TOY_Q8_0, f32, q8, 64), TOY_OK);
    int64_t ne_a[2] = {8, 12}, ne_b[1] = {96}, ne_c[2] = {32, 2};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "a", TOY_F32, 2, ne_a, f32), TOY_OK);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "b", TOY_F16, 1, ne_b, f16), TOY_OK);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "c", TOY_Q8_0, 2, ne_c, q8), TOY_OK);
    cr_expect_eq(toy_gguf_writer_add_tensor(w, "c", TOY_F32, 1, ne_b, f32), TOY_ERR_INVALID_ARG);
    int64_t ne_bad[1] = {10};
    cr_expect_eq(toy_gguf_writer_add_tensor(w, "d", TOY_Q8_0, 1, ne_bad, q8), TOY_ERR_INVALID_ARG);
    return w;
}

static void *rewrite(const void *a, size_t na, size_t *nb) {
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open_memory(a, na, "a", &g), TOY_OK, "%s", toy_last_error());
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++) cr_assert_eq(toy_gguf_writer_copy_kv(w, g, i), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), TOY_OK);
    }
    void *b;
    cr_assert_eq(toy_gguf_writer_write_memory(w, &b, nb), TOY_OK);
    toy_gguf_writer_free(w);
    toy_gguf_close(g);
    return b;
}

Test(gguf, write_read_write_identical) {
    float f32[96];
    toy_f16 f16[96];
    uint8_t q8[68];
    struct toy_gguf_writer *w = every_type_writer(f32, f16, q8);
    void *a;
    size_t na;
    cr_assert_eq(toy_gguf_writer_write_memory(w, &a, &na), TOY_OK);
    toy_gguf_writer_free(w);

    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open_memory(a, na, "a", &g), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_gguf_alignment(g), 64);
    cr_expect_eq(toy_gguf_data_offset(g) % 64, 0);
    uint32_t u32; int32_t i32; uint64_t u64; int64_t i64; float f; double d; bool b;
    cr_expect_eq(toy_gguf_get_u32(g, "t.u8", &u32), TOY_OK); cr_expect_eq(u32, 200);
    cr_expect_eq(toy_gguf_get_i32(g, "t.i8", &i32), TOY_OK); cr_expect_eq(i32, -100);
    cr_expect_eq(toy_gguf_get_u32(g, "t.u16", &u32), TOY_OK); cr_expect_eq(u32, 60000);
    cr_expect_eq(toy_gguf_get_i64(g, "t.i16", &i64), TOY_OK); cr_expect_eq(i64, -30000);
    cr_expect_eq(toy_gguf_get_u32(g, "t.u32", &u32), TOY_OK); cr_expect_eq(u32, 4000000000u);
    cr_expect_eq(toy_gguf_get_i32(g, "t.u32", &i32), TOY_ERR_RANGE);
    cr_expect_eq(toy_gguf_get_i32(g, "t.i32", &i32), TOY_OK); cr_expect_eq(i32, -2000000000);
    cr_expect_eq(toy_gguf_get_u32(g, "t.i32", &u32), TOY_ERR_RANGE);
    cr_expect_eq(toy_gguf_get_u64(g, "t.u64", &u64), TOY_OK); cr_expect_eq(u64, 18000000000000000000ull);
    cr_expect_eq(toy_gguf_get_u32(g, "t.u64", &u32), TOY_ERR_RANGE);
    cr_expect_eq(toy_gguf_get_i64(g, "t.i64", &i64), TOY_OK); cr_expect_eq(i64, -9000000000000000000ll);
    cr_expect_eq(toy_gguf_get_f32(g, "t.f32", &f), TOY_OK); cr_expect_eq(f, 0.1f);
    cr_expect_eq(toy_gguf_get_f64(g, "t.f64", &d), TOY_OK); cr_expect_eq(d, 0.1);
    cr_expect_eq(toy_gguf_get_bool(g, "t.bool", &b), TOY_OK); cr_expect(b);
    const char *s;
    size_t len;
    cr_expect_eq(toy_gguf_get_str(g, "t.str0", &s, &len), TOY_OK);
    cr_expect(len == 3 && !memcmp(s, "a\0b", 4));
    cr_expect_eq(toy_gguf_get_str(g, "t.replaced", &s, NULL), TOY_OK);
    cr_expect_str_eq(s, "new");
    cr_expect_eq(toy_gguf_find_key(g, "t.replaced"), 14); /* kept its first position */
    int64_t k;
    enum toy_gguf_type et;
    uint64_t n;
    cr_expect_eq(toy_gguf_get_arr(g, "a.i32", &k, &et, &n), TOY_OK);
    cr_expect(et == TOY_GGUF_I32 && n == 3);
    cr_expect_eq(toy_gguf_arr_int(g, k, 0, &i64), TOY_OK); cr_expect_eq(i64, -1);
    cr_expect_eq(toy_gguf_arr_int(g, k, 2, &i64), TOY_OK); cr_expect_eq(i64, 7);
    cr_expect_eq(toy_gguf_get_arr(g, "a.f32", &k, &et, &n), TOY_OK);
    cr_expect_eq(toy_gguf_arr_float(g, k, 1, &d), TOY_OK); cr_expect_eq(d, -2.25);
    cr_expect_eq(toy_gguf_get_arr(g, "a.empty", &k, &et, &n), TOY_OK); cr_expect_eq(n, 0);
    cr_expect_eq(toy_gguf_get_arr(g, "a.str", &k, &et, &n), TOY_OK);
    cr_expect(et == TOY_GGUF_STRING && n == 3);
    s = toy_gguf_arr_str(g, k, 2, &len);
    cr_expect(len == strlen("wörld") && !memcmp(s, "wörld", len));
    toy_gguf_arr_str(g, k, 1, &len);
    cr_expect_eq(len, 0);
    cr_expect_eq(toy_gguf_n_tensors(g), 3);
    const struct toy_gguf_tensor *t = toy_gguf_tensor(g, toy_gguf_find_tensor(g, "c"));
    cr_expect(t->type == TOY_Q8_0 && t->ne[0] == 32 && t->ne[1] == 2 && t->nbytes == 68);
    cr_expect_eq(t->offset % 64, 0);
    cr_expect(!memcmp(t->data, q8, 68));
    float back[96];
    t = toy_gguf_tensor(g, toy_gguf_find_tensor(g, "b"));
    cr_expect_eq(toy_gguf_tensor_read_f32(g, toy_gguf_find_tensor(g, "b"), back, 96), TOY_OK);
    for (int i = 0; i < 96; i++) cr_expect_eq(back[i], f32[i]);
    toy_gguf_close(g);

    size_t nb;
    void *bb = rewrite(a, na, &nb);
    cr_expect_eq(nb, na);
    cr_expect(!memcmp(a, bb, na), "write -> read -> write differs");
    free(bb);
    free(a);
}

/* A file written by llama.cpp's converter, re-written by toy, is the same
 * file byte for byte (same KV order, tensor order, offsets and padding). */
Test(gguf, llamacpp_file_rewrites_identically) {
    const char *path = TESTDATA "/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf";
    if (!exists(path)) cr_skip("testdata absent");
    size_t na, nb;
    void *a = slurp(path, &na);
    void *b = rewrite(a, na, &nb);
    cr_expect_eq(nb, na);
    cr_expect(nb == na && !memcmp(a, b, na), "re-written file differs");
    free(a);
    free(b);
}

static enum toy_status failing_fill(void *ctx, void *dst, size_t nbytes) {
    (void)ctx; (void)dst; (void)nbytes;
    return toy_error(TOY_ERR_IO, "simulated failure");
}

static enum toy_status ramp_fill(void *ctx, void *dst, size_t nbytes) {
    (void)ctx;
    float *x = dst;
    for (size_t i = 0; i < nbytes / 4; i++) x[i] = (float)i;
    return TOY_OK;
}

Test(gguf, atomic_write) {
    char dir[] = "/tmp/toy-gguf-test-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    int64_t ne[1] = {1000};
    toy_gguf_writer_add_tensor_fn(w, "ramp", TOY_F32, 1, ne, ramp_fill, NULL);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK);
    const float *x = toy_gguf_tensor(g, 0)->data;
    cr_expect_eq(x[999], 999.0f);
    size_t size_before = toy_gguf_file_size(g);
    toy_gguf_close(g);

    /* a write that fails midway leaves the old file and no temp file */
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", "gpt2");
    toy_gguf_writer_add_tensor_fn(w, "bad", TOY_F32, 1, ne, failing_fill, NULL);
    cr_expect_eq(toy_gguf_writer_write(w, path), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "simulated"));
    toy_gguf_writer_free(w);
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK);
    const char *arch;
    toy_gguf_get_str(g, "general.architecture", &arch, NULL);
    cr_expect_str_eq(arch, "llama");
    cr_expect_eq(toy_gguf_file_size(g), size_before);
    toy_gguf_close(g);
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) if (e->d_name[0] != '.') n++;
    closedir(d);
    cr_expect_eq(n, 1, "temp file left behind");

    /* a missing directory fails without creating anything */
    toy_gguf_writer_init(&w);
    snprintf(path, sizeof path, "%s/missing/x.gguf", dir);
    cr_expect_eq(toy_gguf_writer_write(w, path), TOY_ERR_IO);
    toy_gguf_writer_free(w);
    snprintf(path, sizeof path, "%s/model.gguf", dir);
    unlink(path);
    rmdir(dir);
}

Test(gguf, open_errors) {
    struct toy_gguf *g = (void *)1;
    cr_expect_eq(toy_gguf_open("/nonexistent/x.gguf", &g), TOY_ERR_NOT_FOUND);
    cr_expect_null(g);
    cr_expect(strstr(toy_last_error(), "/nonexistent/x.gguf"));
    cr_expect_eq(toy_gguf_open("/tmp", &g), TOY_ERR_IO);
    toy_gguf_close(NULL);
    toy_gguf_writer_free(NULL);
}

/* What a caller plausibly passes as NULL to the writer (an optional string
 * that is absent, a name or shape not filled in) is TOY_ERR_INVALID_ARG
 * naming the key or tensor; each of these crashed. */
Test(gguf, writer_null_arguments) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_expect_eq(toy_gguf_writer_set_str(w, "tokenizer.chat_template", NULL), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "'tokenizer.chat_template': NULL string"), "%s", toy_last_error());
    cr_expect_eq(toy_gguf_writer_set_strn(w, "k", NULL, 3), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_gguf_writer_set_arr(w, "k", TOY_GGUF_U32, NULL, 2), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_gguf_writer_set_arr_str(w, "k", NULL, NULL, 2), TOY_ERR_INVALID_ARG);
    const char *strs[] = {"a", NULL};
    cr_expect_eq(toy_gguf_writer_set_arr_str(w, "k", strs, NULL, 2), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "string 1 is NULL"), "%s", toy_last_error());
    float data[4] = {0};
    int64_t ne[1] = {4};
    cr_expect_eq(toy_gguf_writer_add_tensor(w, NULL, TOY_F32, 1, ne, data), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "NULL tensor name"), "%s", toy_last_error());
    cr_expect_eq(toy_gguf_writer_add_tensor(w, "x", TOY_F32, 1, NULL, data), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "'x': NULL shape"), "%s", toy_last_error());
    /* nothing was added by the failed calls; empty values stay allowed */
    cr_expect_eq(toy_gguf_writer_n_kv(w), 0);
    cr_expect_eq(toy_gguf_writer_n_tensors(w), 0);
    cr_expect_eq(toy_gguf_writer_set_strn(w, "empty", NULL, 0), TOY_OK);
    cr_expect_eq(toy_gguf_writer_set_arr_str(w, "none", NULL, NULL, 0), TOY_OK);
    toy_gguf_writer_free(w);
}

/* toy_file_replace (every writer's last step): a symbolic link is written
 * through and stays a link, an existing file keeps its mode, a device or a
 * pipe is refused and left as it is (as root, /dev/full became a plain
 * file), and a failed write leaves the old file and no temp file. */
Test(gguf, file_replace_keeps_links_modes_and_devices) {
    char dir[] = "/tmp/toy-replace-XXXXXX", path[600], link[600], fifo[600];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/real.bin", dir);
    snprintf(link, sizeof link, "%s/link.bin", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    FILE *f = fopen(path, "w");
    fputs("old", f);
    fclose(f);
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(symlink("real.bin", link), 0);
    struct toy_file_replace r;
    cr_assert_eq(toy_file_replace_begin(link, &r), TOY_OK, "%s", toy_last_error());
    fputs("new", r.f);
    cr_assert_eq(toy_file_replace_end(&r, true), TOY_OK, "%s", toy_last_error());
    struct stat sb;
    cr_assert_eq(lstat(link, &sb), 0);
    cr_expect(S_ISLNK(sb.st_mode), "the link was replaced by a file");
    cr_assert_eq(stat(path, &sb), 0);
    cr_expect_eq(sb.st_mode & 0777, 0600, "mode %o", sb.st_mode & 0777);
    char buf[8] = {0};
    f = fopen(path, "r");
    cr_assert(fread(buf, 1, 7, f) == 3);
    fclose(f);
    cr_expect_str_eq(buf, "new");
    /* a failed write: the old content stays, no temp file */
    cr_assert_eq(toy_file_replace_begin(path, &r), TOY_OK);
    fputs("partial", r.f);
    cr_expect_eq(toy_file_replace_end(&r, false), TOY_ERR_IO);
    f = fopen(path, "r");
    memset(buf, 0, sizeof buf);
    cr_assert(fread(buf, 1, 7, f) == 3);
    fclose(f);
    cr_expect_str_eq(buf, "new");
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    cr_expect_eq(n, 2, "a temp file was left");
    /* not regular files: refused, untouched */
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_expect_eq(toy_file_replace_begin(fifo, &r), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "a pipe"), "%s", toy_last_error());
    cr_assert_eq(stat(fifo, &sb), 0);
    cr_expect(S_ISFIFO(sb.st_mode));
    cr_expect_eq(toy_file_replace_begin("/dev/null", &r), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "not a regular file"), "%s", toy_last_error());
    cr_expect_eq(toy_file_replace_begin(dir, &r), TOY_ERR_IO);
    cr_expect_eq(toy_file_replace_begin("-", &r), TOY_ERR_INVALID_ARG);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}
