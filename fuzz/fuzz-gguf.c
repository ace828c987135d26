/* fuzz-gguf.c: libFuzzer harness for the GGUF reader (src/io/gguf.c) and
 * writer (src/io/gguf-write.c). Format: ../shared/testdata/gguf-spec.
 *
 * Every input is parsed from an exact-size heap copy (so ASan sees any read
 * past the end). Accepted inputs are walked through every accessor, small
 * tensors are dequantized, and the file is re-written and re-parsed: the
 * re-written image must parse and re-write to itself byte for byte. Any
 * violation aborts, and libFuzzer keeps the input. Build: make fuzz;
 * bounded run: fuzz/run.sh SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/gguf.h"
#include "toy/quant.h"

static void walk(const struct toy_gguf *g) {
    volatile uint64_t sink = 0;
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++) {
        const char *key = toy_gguf_kv_key(g, i);
        sink += strlen(key);
        int64_t iv;
        uint64_t uv;
        double fv;
        const char *s;
        size_t len;
        bool b;
        toy_gguf_kv_int(g, i, &iv);
        toy_gguf_kv_uint(g, i, &uv);
        toy_gguf_kv_float(g, i, &fv);
        toy_gguf_get_bool(g, key, &b);
        uint32_t u32;
        toy_gguf_get_u32(g, key, &u32);
        if (toy_gguf_kv_str(g, i, &s, &len) == TOY_OK) sink += len ? (uint8_t)s[len - 1] : 0;
        if (toy_gguf_kv_type(g, i) != TOY_GGUF_ARRAY) continue;
        uint64_t n = toy_gguf_arr_len(g, i);
        for (uint64_t j = 0; j < n && j < 4096; j++) {
            if (toy_gguf_arr_type(g, i) == TOY_GGUF_STRING) {
                s = toy_gguf_arr_str(g, i, j, &len);
                sink += len ? (uint8_t)s[len - 1] : 0;
            } else {
                toy_gguf_arr_int(g, i, j, &iv);
                toy_gguf_arr_float(g, i, j, &fv);
            }
        }
    }
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        if (toy_gguf_find_tensor(g, t->name) != i) abort();
        if (t->nbytes && (t->file_offset + t->nbytes > toy_gguf_file_size(g))) abort();
        if (t->nbytes) sink += ((const uint8_t *)t->data)[t->nbytes - 1];
        if (t->n_elements > 0 && t->n_elements <= 1 << 16 && toy_can_dequantize(t->type)) {
            float *y = malloc((size_t)t->n_elements * sizeof(float));
            if (toy_gguf_tensor_read_f32(g, i, y, t->n_elements)) abort();
            free(y);
        }
    }
    (void)sink;
}

static void *rewrite(const struct toy_gguf *g, size_t *size) {
    struct toy_gguf_writer *w;
    if (toy_gguf_writer_init(&w)) abort();
    for (int64_t i = 0; i < toy_gguf_n_kv(g); i++)
        if (toy_gguf_writer_copy_kv(w, g, i)) {
            fprintf(stderr, "writer refused a KV the reader accepted: %s\n", toy_last_error());
            abort();
        }
    for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, i);
        int nd = t->n_dims ? t->n_dims : 1;
        if (toy_gguf_writer_add_tensor(w, t->name, t->type, nd, t->ne, t->data)) {
            fprintf(stderr, "writer refused a tensor the reader accepted: %s\n", toy_last_error());
            abort();
        }
    }
    void *out = NULL;
    if (toy_gguf_writer_write_memory(w, &out, size)) abort();
    toy_gguf_writer_free(w);
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    struct toy_gguf *g = NULL;
    if (toy_gguf_open_memory(copy, size, "fuzz", &g) == TOY_OK) {
        walk(g);
        /* keep the re-write cheap: skip inputs whose tensors are large */
        size_t total = 0;
        for (int64_t i = 0; i < toy_gguf_n_tensors(g); i++) total += toy_gguf_tensor(g, i)->nbytes;
        if (total <= (1u << 20)) {
            size_t na, nb;
            void *a = rewrite(g, &na);
            struct toy_gguf *ga = NULL;
            if (toy_gguf_open_memory(a, na, "rewrite", &ga) != TOY_OK) {
                fprintf(stderr, "re-written file does not parse: %s\n", toy_last_error());
                abort();
            }
            void *b = rewrite(ga, &nb);
            if (na != nb || memcmp(a, b, na)) {
                fprintf(stderr, "re-write is not stable\n");
                abort();
            }
            toy_gguf_close(ga);
            free(a);
            free(b);
        }
        toy_gguf_close(g);
    } else if (g != NULL || toy_last_error()[0] == 0) {
        abort(); /* a failure must leave no handle and say why */
    }
    free(copy);
    return 0;
}
