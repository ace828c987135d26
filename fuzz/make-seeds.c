/* make-seeds.c: writes seed files for the fuzzers: a small GGUF (every
 * metadata type, tensors of several block types) with toy's own writer, and
 * (given a second folder) a small safetensors file. */
#include <stdio.h>
#include <string.h>

#include "toy/gguf.h"
#include "toy/quant.h"

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) { fprintf(stderr, "usage: make-seeds GGUF_DIR [SAFETENSORS_DIR]\n"); return 2; }
    char path[4096];
    struct toy_gguf_writer *w;
    toy_gguf_writer_init(&w);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    toy_gguf_writer_set_u32(w, "llama.block_count", 1);
    toy_gguf_writer_set_i8(w, "t.i8", -1);
    toy_gguf_writer_set_u16(w, "t.u16", 7);
    toy_gguf_writer_set_i64(w, "t.i64", -5);
    toy_gguf_writer_set_f64(w, "t.f64", 0.5);
    toy_gguf_writer_set_bool(w, "t.bool", true);
    const char *toks[3] = {"<s>", "a", "b"};
    toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, NULL, 3);
    float sc[3] = {0, -1, -2};
    toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, sc, 3);
    static float x[512];
    static uint8_t q8[544], q4k[288], f16[1024];
    for (int i = 0; i < 512; i++) x[i] = (float)((i * 37) % 101) / 50.0f - 1;
    toy_quantize_row(TOY_Q8_0, x, q8, 512);
    toy_quantize_row(TOY_Q4_K, x, q4k, 512);
    toy_quantize_row(TOY_F16, x, f16, 512);
    int64_t ne[2] = {256, 2};
    toy_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", TOY_Q8_0, 2, ne, q8);
    toy_gguf_writer_add_tensor(w, "blk.0.ffn_up.weight", TOY_Q4_K, 2, ne, q4k);
    toy_gguf_writer_add_tensor(w, "output.weight", TOY_F16, 2, ne, f16);
    int64_t ne1[1] = {8};
    toy_gguf_writer_add_tensor(w, "output_norm.weight", TOY_F32, 1, ne1, x);
    snprintf(path, sizeof path, "%s/seed-model.gguf", argv[1]);
    if (toy_gguf_writer_write(w, path)) { fprintf(stderr, "%s\n", toy_last_error()); return 1; }
    toy_gguf_writer_free(w);
    if (argc == 3) {
        const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                          "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                          "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]},"
                          "\"c\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[22,24]}}";
        uint64_t n = strlen(hdr);
        snprintf(path, sizeof path, "%s/seed.safetensors", argv[2]);
        FILE *f = fopen(path, "wb");
        if (!f) { perror(path); return 1; }
        fwrite(&n, 8, 1, f);
        fwrite(hdr, 1, n, f);
        fwrite(x, 1, 24, f);
        fclose(f);
    }
    return 0;
}
