/* test-hf-import.c: safetensors reading (src/io/safetensors.c) and toy
 * convert / toy quantize (src/io/hf-import.c). A PyTorch script
 * (tests/torch/make-hf-models.py) writes random Hugging Face-style folders
 * for every supported architecture plus, for each, the tensors llama.cpp's
 * converter would store; the converted GGUFs must hold exactly those. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/quant.h"
#include "toy/safetensors.h"

#define TESTDATA "../shared/testdata"

/* ---- safetensors on hand-made images ------------------------------------------------ */

static size_t mk_st(uint8_t *buf, const char *json, size_t data_bytes) {
    uint64_t n = strlen(json);
    memcpy(buf, &n, 8);
    memcpy(buf + 8, json, n);
    for (size_t i = 0; i < data_bytes; i++) buf[8 + n + i] = (uint8_t)i;
    return 8 + n + data_bytes;
}

static enum toy_status open_st(const char *json, size_t data_bytes) {
    static uint8_t buf[4096];
    size_t n = mk_st(buf, json, data_bytes);
    void *p = malloc(n);
    memcpy(p, buf, n);
    struct toy_safetensors *st = NULL;
    enum toy_status e = toy_safetensors_open_memory(p, n, "t.safetensors", &st);
    toy_safetensors_close(st);
    free(p);
    return e;
}

Test(safetensors, valid_and_hostile) {
    const char *ok = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[8,12]},"
                     "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint8_t buf[512];
    size_t n = mk_st(buf, ok, 12);
    float one = 1.5f;
    memcpy(buf + n - 12, &one, 4);
    struct toy_safetensors *st;
    cr_assert_eq(toy_safetensors_open_memory(buf, n, "ok", &st), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_safetensors_n_tensors(st), 2);
    cr_expect_str_eq(toy_safetensors_tensor(st, 0)->name, "a"); /* sorted */
    cr_expect_str_eq(toy_safetensors_metadata(st, "format"), "pt");
    float x[2];
    cr_expect_eq(toy_safetensors_read_f32(st, toy_safetensors_find(st, "a"), x, 2), TOY_OK);
    cr_expect_eq(x[0], 1.5f);
    cr_expect_eq(toy_safetensors_find(st, "zz"), -1);
    toy_safetensors_close(st);

    /* every truncation fails cleanly */
    for (size_t cut = 0; cut < n; cut++) {
        void *p = malloc(cut ? cut : 1);
        memcpy(p, buf, cut);
        cr_expect_neq(toy_safetensors_open_memory(p, cut, "cut", &st), TOY_OK, "cut %zu", cut);
        free(p);
    }
    struct { const char *json; size_t data; const char *msg; } bad[] = {
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, "span 4 bytes"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "cover 8 of the 12"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "a hole"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,800]}}", 8, "outside"},
        {"{\"a\":{\"dtype\":\"Q9\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype Q9"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "overflows"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "data_offsets"},
        {"{\"a\":1,\"a\":2}", 0, "header JSON"},
        {"[1,2]", 0, "not a JSON object"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}", 8, "header JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_neq(open_st(bad[i].json, bad[i].data), TOY_OK, "case %zu", i);
        cr_expect(strstr(toy_last_error(), bad[i].msg), "case %zu: %s", i, toy_last_error());
    }
    /* header length past the end */
    uint64_t huge = 1ull << 40;
    memcpy(buf, &huge, 8);
    cr_expect_eq(toy_safetensors_open_memory(buf, n, "huge", &st), TOY_ERR_FORMAT);
    cr_expect_eq(toy_safetensors_open("/nonexistent/model.safetensors", &st), TOY_ERR_NOT_FOUND);
}

/* Inputs that crashed fuzz/fuzz-safetensors.c stay as regressions. */
Test(safetensors, fuzz_regressions) {
    DIR *d = opendir("tests/data/safetensors-crashes");
    if (!d) cr_skip("no tests/data/safetensors-crashes");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/data/safetensors-crashes/%s", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        uint8_t *buf = malloc(1 << 20);
        size_t n = fread(buf, 1, 1 << 20, f);
        fclose(f);
        void *p = malloc(n ? n : 1);
        memcpy(p, buf, n);
        struct toy_safetensors *st = NULL;
        if (toy_safetensors_open_memory(p, n, path, &st) == TOY_OK) toy_safetensors_close(st);
        free(p);
        free(buf);
    }
    closedir(d);
}

/* ---- conversion ---------------------------------------------------------------------- */

static char model_root[256];

static bool make_models(void) {
    snprintf(model_root, sizeof model_root, "/tmp/toy-hf-test-%d", (int)getpid());
    char cmd[1024];
    const char *tok = TESTDATA "/tokenizer-smollm2/tokenizer.json";
    struct stat sb;
    snprintf(cmd, sizeof cmd, "rm -rf %s && /usr/bin/python3 tests/torch/make-hf-models.py %s %s", model_root,
             model_root, stat(tok, &sb) == 0 ? tok : "");
    int rc = system(cmd);
    return rc == 0;
}

static void cleanup_models(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf %s", model_root);
    if (system(cmd)) {}
}

/* Every tensor of expected.safetensors is in the GGUF with the reversed
 * shape; as f32 it is bit-identical, otherwise it equals toy_quantize_row
 * of the expected values (type `want` for 2-D weights). */
static void compare(const char *model, const char *gguf_path, enum toy_dtype want) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s/expected.safetensors", model_root, model);
    struct toy_safetensors *ex;
    cr_assert_eq(toy_safetensors_open(path, &ex), TOY_OK, "%s", toy_last_error());
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(gguf_path, &g), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_gguf_n_tensors(g), toy_safetensors_n_tensors(ex), "%s: tensor count", model);
    for (int64_t i = 0; i < toy_safetensors_n_tensors(ex); i++) {
        const struct toy_st_tensor *e = toy_safetensors_tensor(ex, i);
        int64_t k = toy_gguf_find_tensor(g, e->name);
        cr_assert(k >= 0, "%s: %s missing", model, e->name);
        const struct toy_gguf_tensor *t = toy_gguf_tensor(g, k);
        cr_assert_eq(t->n_dims, e->n_dims, "%s %s", model, e->name);
        for (int d = 0; d < e->n_dims; d++) cr_assert_eq(t->ne[d], e->shape[e->n_dims - 1 - d], "%s %s", model, e->name);
        float *x = malloc((size_t)e->n_elements * 4);
        cr_assert_eq(toy_safetensors_read_f32(ex, i, x, e->n_elements), TOY_OK);
        if (!strcmp(e->name, "rope_freqs.weight")) {
            const float *y = t->data;
            for (int64_t j = 0; j < e->n_elements; j++) cr_expect(fabsf(x[j] - y[j]) <= 1e-6f * fabsf(x[j]), "rope_freqs[%lld]", (long long)j);
        } else if (e->n_dims == 1 || want == TOY_F32) {
            cr_expect_eq(t->type, TOY_F32, "%s %s", model, e->name);
            cr_expect(!memcmp(t->data, x, (size_t)e->n_elements * 4), "%s %s differs", model, e->name);
        } else {
            /* rows that do not fit the block fall back to q8_0 (documented) */
            enum toy_dtype w = t->ne[0] % toy_dtype_block_size(want) == 0 ? want : TOY_Q8_0;
            cr_expect_eq(t->type, w, "%s %s is %s", model, e->name, toy_dtype_name(t->type));
            void *q = malloc(t->nbytes);
            cr_assert_eq(toy_quantize_row(t->type, x, q, e->n_elements), TOY_OK);
            cr_expect(!memcmp(q, t->data, t->nbytes), "%s %s (%s) differs", model, e->name, toy_dtype_name(t->type));
            free(q);
        }
        free(x);
    }
    toy_gguf_close(g);
    toy_safetensors_close(ex);
}

static void convert(const char *model, enum toy_dtype type, char *out, size_t outn, struct toy_convert_report *r) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", model_root, model);
    snprintf(out, outn, "%s/%s-%s.gguf", model_root, model, toy_dtype_name(type));
    struct toy_convert_opts o = {.type = type};
    cr_assert_eq(toy_hf_convert(dir, out, &o, r), TOY_OK, "%s: %s", model, toy_last_error());
}

Test(hf_import, every_architecture_converts_exactly, .timeout = 300) {
    if (!make_models()) cr_skip("python3 with torch not available");
    const char *models[] = {"llama",   "mistral",   "qwen2",     "qwen3", "gemma2",      "gpt2",
                            "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v2", "deepseek_v3", "gemma3",
                            "smollm3", "olmo2",  "granite", "phi3", "phi3_long", "phi3_mini"};
    const char *archs[] = {"llama", "llama",    "qwen2",    "qwen3", "gemma2",    "gpt2",
                           "llama", "qwen2moe", "qwen3moe", "olmoe", "deepseek2", "deepseek2", "gemma3", "smollm3",
                           "olmo2", "granite", "phi3", "phi3", "phi3"};
    const uint32_t experts[] = {0, 0, 0, 0, 0, 0, 4, 6, 8, 4, 6, 6, 0, 0, 0, 0, 0, 0, 0};
    const uint32_t used[] = {0, 0, 0, 0, 0, 0, 2, 2, 3, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0};
    char out[512];
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        struct toy_convert_report r;
        convert(models[m], TOY_F32, out, sizeof out, &r);
        cr_expect_str_eq(r.arch, archs[m]);
        compare(models[m], out, TOY_F32);
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(out, &g), TOY_OK);
        const char *arch;
        cr_expect_eq(toy_gguf_get_str(g, "general.architecture", &arch, NULL), TOY_OK);
        cr_expect_str_eq(arch, archs[m]);
        char key[128];
        uint32_t u;
        bool deepseek = !strcmp(arch, "deepseek2"), gemma3 = !strcmp(arch, "gemma3"), smollm3 = !strcmp(arch, "smollm3");
        snprintf(key, sizeof key, "%s.block_count", arch);
        cr_expect_eq(toy_gguf_get_u32(g, key, &u), TOY_OK);
        cr_expect_eq(u, deepseek ? 3 : gemma3 || smollm3 ? 4 : 2);
        snprintf(key, sizeof key, "%s.attention.head_count", arch);
        cr_expect_eq(toy_gguf_get_u32(g, key, &u), TOY_OK);
        cr_expect_eq(u, 4);
        if (strcmp(arch, "gpt2")) {
            snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
            cr_expect_eq(toy_gguf_get_u32(g, key, &u), TOY_OK);
            /* llama.cpp's OLMoE has no GQA; DeepSeek's latent is one kv head; the Gemma 3 has one too */
            cr_expect_eq(u, deepseek || gemma3 ? 1 : strcmp(models[m], "olmoe") ? 2 : 4);
            float f;
            snprintf(key, sizeof key, "%s.rope.freq_base", arch);
            cr_expect_eq(toy_gguf_get_f32(g, key, &f), TOY_OK);
            cr_expect_eq(f, gemma3 ? 1000000.0f : smollm3 ? 5000000.0f : !strcmp(arch, "olmo2") ? 500000.0f : 100000.0f);
        }
        cr_expect_eq(toy_gguf_get_u32(g, "general.file_type", &u), TOY_OK);
        cr_expect_eq(u, 0);
        struct stat sb;
        if (!strcmp(models[m], "llama") && stat(TESTDATA "/tokenizer-smollm2/tokenizer.json", &sb) == 0) {
            cr_expect(r.tokenizer, "tokenizer not written: %s", r.note);
            int64_t ki;
            uint64_t n;
            cr_expect_eq(toy_gguf_get_arr(g, "tokenizer.ggml.tokens", &ki, NULL, &n), TOY_OK);
            cr_expect_eq(n, 49152);
            const char *model;
            cr_expect_eq(toy_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL), TOY_OK);
            cr_expect_str_eq(model, "gpt2");
        }
        if (!strcmp(models[m], "qwen3")) {
            cr_expect_eq(toy_gguf_get_u32(g, "qwen3.attention.key_length", &u), TOY_OK);
            cr_expect_eq(u, 32);
        }
        if (gemma3) { /* a period of 3 is no llama.cpp default (6): its key; no softcaps; the global layers' scaling */
            cr_expect(toy_gguf_get_u32(g, "gemma3.attention.sliding_window", &u) == TOY_OK && u == 3);
            cr_expect(toy_gguf_get_u32(g, "gemma3.attention.sliding_window_pattern", &u) == TOY_OK && u == 3);
            cr_expect(toy_gguf_find_key(g, "gemma3.rope.freq_base_swa") < 0, "10000, llama.cpp's own: no key");
            cr_expect(toy_gguf_find_key(g, "gemma3.attn_logit_softcapping") < 0);
            cr_expect(toy_gguf_find_key(g, "gemma3.final_logit_softcapping") < 0);
            float f;
            cr_expect(toy_gguf_get_f32(g, "gemma3.rope.scaling.factor", &f) == TOY_OK && f == 2.0f);
        }
        if (!strcmp(arch, "granite")) { /* its multipliers under llama.cpp's keys */
            const char *keys[] = {"granite.embedding_scale", "granite.residual_scale", "granite.attention.scale",
                                  "granite.logit_scale"};
            const float want[] = {12.0f, 0.22f, 0.015625f, 8.0f};
            for (int i = 0; i < 4; i++) {
                float f;
                cr_expect(toy_gguf_get_f32(g, keys[i], &f) == TOY_OK && f == want[i], "%s", keys[i]);
            }
        }
        if (!strcmp(arch, "phi3")) { /* llama.cpp's Phi3MiniModel: its keys, LongRoPE's tables, the fused projections */
            const bool mini = !strcmp(models[m], "phi3_mini"), lng = !strcmp(models[m], "phi3_long");
            const char *keys[] = {"context_length", "rope.scaling.original_context_length", "rope.dimension_count",
                                  "attention.sliding_window", "vocab_size", "feed_forward_length"};
            /* 3/4 of 16-dim heads rotated (phi3_mini: whole heads); Phi-4-mini's window is none: 0 */
            const uint32_t want[] = {64, mini ? 64 : 16, mini ? 16 : 12, lng ? 8 : mini ? 6 : 0, 320, 96};
            for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
                snprintf(key, sizeof key, "phi3.%s", keys[i]);
                cr_expect(toy_gguf_get_u32(g, key, &u) == TOY_OK && u == want[i], "%s: %s %u, not %u", models[m], key,
                          u, want[i]);
            }
            cr_expect(toy_gguf_find_key(g, "phi3.rope.scaling.type") < 0, "%s: llama.cpp writes no scaling type",
                      models[m]);
            /* the config's attention_factor, or sqrt(1 + ln(64 / 16) / ln 16); none without LongRoPE */
            float f = 0;
            bool has = toy_gguf_get_f32(g, "phi3.rope.scaling.attn_factor", &f) == TOY_OK;
            cr_expect(mini ? !has : has && fabs(f - (lng ? 1.1 : sqrt(1 + log(4.0) / log(16.0)))) < 1e-6,
                      "%s: attn_factor %g", models[m], f);
            const char *tables[] = {"rope_factors_long.weight", "rope_factors_short.weight"};
            for (int i = 0; i < 2; i++) { /* their values: compare() against the config's */
                int64_t k = toy_gguf_find_tensor(g, tables[i]);
                cr_expect_eq(k >= 0, !mini, "%s: %s", models[m], tables[i]);
                if (k >= 0) {
                    const struct toy_gguf_tensor *t = toy_gguf_tensor(g, k);
                    cr_expect(t->type == TOY_F32 && t->n_dims == 1 && t->ne[0] == 6, "%s: %s", models[m], tables[i]);
                }
            }
            /* q, k, v of 4 + 2 + 2 heads of 16 as one; gate and up (96 each) as one; nothing split */
            const char *fused[] = {"blk.1.attn_qkv.weight", "blk.1.ffn_up.weight"};
            const int64_t rows[] = {128, 192};
            for (int i = 0; i < 2; i++) {
                int64_t k = toy_gguf_find_tensor(g, fused[i]);
                cr_assert(k >= 0, "%s: %s", models[m], fused[i]);
                const struct toy_gguf_tensor *t = toy_gguf_tensor(g, k);
                cr_expect(t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == rows[i], "%s: %s", models[m], fused[i]);
            }
            cr_expect(toy_gguf_find_tensor(g, "blk.1.attn_q.weight") < 0 &&
                      toy_gguf_find_tensor(g, "blk.1.ffn_gate.weight") < 0, "%s: q, k, v or gate, up split", models[m]);
            cr_expect_eq(toy_gguf_find_tensor(g, "output.weight") >= 0, !!strcmp(models[m], "phi3"), "%s: tied or not",
                         models[m]);
        }
        if (deepseek) { /* the latent's keys, as llama.cpp's DeepseekV2Model writes them */
            const char *keys[] = {"attention.kv_lora_rank", "attention.key_length", "attention.value_length",
                                  "attention.key_length_mla", "attention.value_length_mla", "rope.dimension_count",
                                  "leading_dense_block_count", "expert_shared_count", "expert_feed_forward_length",
                                  "expert_gating_func"};
            const uint32_t want[] = {32, 40, 32, 24, 16, 8, 1, m == 10 ? 2 : 1, 32, m == 10 ? 1 : 2};
            for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
                snprintf(key, sizeof key, "deepseek2.%s", keys[i]);
                cr_expect(toy_gguf_get_u32(g, key, &u) == TOY_OK && u == want[i], "%s: %s %u, not %u", models[m], key,
                          u, want[i]);
            }
            snprintf(key, sizeof key, "deepseek2.attention.q_lora_rank");
            cr_expect_eq(toy_gguf_get_u32(g, key, &u) == TOY_OK, m == 11, "%s: %s", models[m], key);
        } else if (experts[m]) { /* a mixture: its counts, and each expert width where llama.cpp reads it */
            snprintf(key, sizeof key, "%s.expert_count", arch);
            cr_expect(toy_gguf_get_u32(g, key, &u) == TOY_OK && u == experts[m], "%s: %s", models[m], key);
            snprintf(key, sizeof key, "%s.expert_used_count", arch);
            cr_expect(toy_gguf_get_u32(g, key, &u) == TOY_OK && u == used[m], "%s: %s", models[m], key);
            const uint32_t want_ff[] = {96, 32, 64, 96}, want_shared = 80;
            size_t mi = m - 6;
            snprintf(key, sizeof key, "%s.%s", arch, mi == 1 || mi == 2 ? "expert_feed_forward_length" : "feed_forward_length");
            cr_expect(toy_gguf_get_u32(g, key, &u) == TOY_OK && u == want_ff[mi], "%s: %s %u", models[m], key, u);
            snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", arch);
            bool has = toy_gguf_get_u32(g, key, &u) == TOY_OK;
            cr_expect(mi == 1 ? has && u == want_shared : !has, "%s: %s", models[m], key);
        }
        toy_gguf_close(g);
    }

    /* a mixture's stacked experts quantized as the rest */
    convert("qwen3_moe", TOY_Q8_0, out, sizeof out, NULL);
    compare("qwen3_moe", out, TOY_Q8_0);

    /* quantized and half-precision outputs: every 2-D weight of qwen3
     * (rows of 256 and 512) equals toy_quantize_row of the original */
    enum toy_dtype types[] = {TOY_F16, TOY_BF16, TOY_Q8_0, TOY_Q4_0, TOY_Q4_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        convert("qwen3", types[i], out, sizeof out, NULL);
        compare("qwen3", out, types[i]);
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(out, &g), TOY_OK);
        uint32_t ft;
        cr_expect_eq(toy_gguf_get_u32(g, "general.file_type", &ft), TOY_OK);
        cr_expect_eq(ft, toy_file_type_for(types[i]));
        toy_gguf_close(g);
    }

    /* toy quantize of the f32 file gives the same bytes as converting
     * straight to q8_0 */
    char f32[512], q8[512], rq[512];
    snprintf(f32, sizeof f32, "%s/qwen3-f32.gguf", model_root);
    snprintf(q8, sizeof q8, "%s/qwen3-q8_0.gguf", model_root);
    snprintf(rq, sizeof rq, "%s/qwen3-requant.gguf", model_root);
    cr_assert_eq(toy_gguf_quantize(f32, rq, TOY_Q8_0, NULL, NULL), TOY_OK, "%s", toy_last_error());
    struct toy_gguf *a, *b;
    cr_assert_eq(toy_gguf_open(q8, &a), TOY_OK);
    cr_assert_eq(toy_gguf_open(rq, &b), TOY_OK);
    cr_expect_eq(toy_gguf_n_tensors(a), toy_gguf_n_tensors(b));
    for (int64_t i = 0; i < toy_gguf_n_tensors(a); i++) {
        const struct toy_gguf_tensor *ta = toy_gguf_tensor(a, i), *tb = toy_gguf_tensor(b, i);
        cr_expect_str_eq(ta->name, tb->name);
        cr_expect(ta->type == tb->type && ta->nbytes == tb->nbytes && !memcmp(ta->data, tb->data, ta->nbytes), "%s", ta->name);
    }
    uint32_t ft;
    cr_expect_eq(toy_gguf_get_u32(b, "general.file_type", &ft), TOY_OK);
    cr_expect_eq(ft, 7);
    toy_gguf_close(a);
    toy_gguf_close(b);

    /* errors name what is wrong */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/none", model_root);
    cr_expect_eq(toy_hf_convert(dir, rq, NULL, NULL), TOY_ERR_NOT_FOUND);
    cr_expect(strstr(toy_last_error(), "config.json"));
    /* the output is never one of the model's own files (it replaced the weights) */
    snprintf(dir, sizeof dir, "%s/qwen2", model_root);
    char own[600];
    snprintf(own, sizeof own, "%s/config.json", dir);
    cr_expect_eq(toy_hf_convert(dir, own, NULL, NULL), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "own files"), "%s", toy_last_error());
    /* a RoPE scaling the graph does not run is refused, not dropped */
    json_t *cfg = json_load_file(own, 0, NULL);
    cr_assert(cfg);
    json_object_set_new(cfg, "rope_scaling", json_pack("{s:s,s:f}", "rope_type", "longrope", "factor", 4.0));
    cr_assert_eq(json_dump_file(cfg, own, 0), 0);
    json_decref(cfg);
    cr_expect_eq(toy_hf_convert(dir, rq, NULL, NULL), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "longrope"), "%s", toy_last_error());
    /* a config the tensors do not match (3 layers of 2) is refused before the file replaces what was there */
    cfg = json_load_file(own, 0, NULL);
    json_object_del(cfg, "rope_scaling");
    json_object_set_new(cfg, "num_hidden_layers", json_integer(3));
    cr_assert_eq(json_dump_file(cfg, own, 0), 0);
    json_decref(cfg);
    struct stat before, after;
    cr_assert_eq(stat(rq, &before), 0);
    cr_expect_neq(toy_hf_convert(dir, rq, NULL, NULL), TOY_OK);
    cr_expect(strstr(toy_last_error(), "does not load"), "%s", toy_last_error());
    cr_assert_eq(stat(rq, &after), 0);
    cr_expect(before.st_ino == after.st_ino && before.st_size == after.st_size, "the file at -o was replaced");
    cleanup_models();
}

/* Gemma 2's query_pre_attn_scalar has no GGUF key: every reader scales attention by 1/sqrt(head_dim) (by
 * 1/sqrt(d_model / n_heads) for the 46-layer 27B). A config with another value is refused, naming it, before
 * any weight is read; it was dropped, and the model then ran with a scale it was not trained with */
Test(hf_import, gemma2_attention_scalar_a_gguf_cannot_hold_is_refused) {
    th_mkdir("g2q");
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", th_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"architectures\":[\"Gemma2ForCausalLM\"],\"model_type\":\"gemma2\",\"hidden_size\":64,"
          "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":16,"
          "\"intermediate_size\":128,\"vocab_size\":100,\"max_position_embeddings\":64,\"rms_norm_eps\":1e-6,"
          "\"query_pre_attn_scalar\":64,\"sliding_window\":16}", f);
    fclose(f);
    snprintf(path, sizeof path, "%s/out.gguf", th_dir);
    struct toy_convert_opts o = {.type = TOY_F32};
    cr_expect_eq(toy_hf_convert(th_dir, path, &o, NULL), TOY_ERR_UNSUPPORTED, "%s", toy_last_error());
    cr_expect(strstr(toy_last_error(), "query_pre_attn_scalar 64, not 16"), "%s", toy_last_error());
    cr_expect(access(path, F_OK) != 0, "an output was written");
    th_rmdir();
}

/* Converts a folder under th_dir holding only config.json, made of `base` and `extra` (JSON members): the status it
 * ends with and the error's message must be `st` and hold `want`, and no output is written */
static void refused(const char *base, const char *extra, enum toy_status st, const char *want) {
    char path[300];
    snprintf(path, sizeof path, "%s/config.json", th_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "{%s,%s}", base, extra);
    fclose(f);
    snprintf(path, sizeof path, "%s/out.gguf", th_dir);
    struct toy_convert_opts o = {.type = TOY_F32};
    cr_expect_eq(toy_hf_convert(th_dir, path, &o, NULL), st, "%s: %s", extra, toy_last_error());
    cr_expect(strstr(toy_last_error(), want), "%s: %s", extra, toy_last_error());
    cr_expect(access(path, F_OK) != 0, "%s: an output was written", extra);
}

/* OLMo 3 becomes what llama.cpp's converter makes of it: GGUF olmo2 with its window and a bool per layer (true: it
 * slides; 3 of each 4), and YaRN's keys; its layer_types must repeat a period whose last layer alone is global */
Test(hf_import, olmo3_keeps_llama_cpps_window_keys, .timeout = 300) {
    if (!make_models()) cr_skip("python3 with torch not available");
    char out[512];
    struct toy_convert_report r;
    convert("olmo3", TOY_F32, out, sizeof out, &r);
    cr_expect_str_eq(r.arch, "olmo2");
    compare("olmo3", out, TOY_F32);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(out, &g), TOY_OK);
    uint32_t u = 0;
    cr_expect(toy_gguf_get_u32(g, "olmo2.attention.sliding_window", &u) == TOY_OK && u == 4, "window %u", u);
    int64_t k = toy_gguf_find_key(g, "olmo2.attention.sliding_window_pattern");
    cr_assert(k >= 0 && toy_gguf_kv_type(g, k) == TOY_GGUF_ARRAY && toy_gguf_arr_type(g, k) == TOY_GGUF_BOOL &&
              toy_gguf_arr_len(g, k) == 4, "the pattern: a bool per layer");
    const uint8_t *b = toy_gguf_arr_data(g, k);
    cr_expect(b[0] && b[1] && b[2] && !b[3], "pattern %d %d %d %d", b[0], b[1], b[2], b[3]);
    const char *type;
    cr_expect(toy_gguf_get_str(g, "olmo2.rope.scaling.type", &type, NULL) == TOY_OK && !strcmp(type, "yarn"));
    float f = 0;
    cr_expect(toy_gguf_get_f32(g, "olmo2.rope.scaling.attn_factor", &f) == TOY_OK && f == 1.2f, "%g", f);
    cr_expect(toy_gguf_get_u32(g, "olmo2.rope.scaling.original_context_length", &u) == TOY_OK && u == 4096, "%u", u);
    cr_expect(toy_gguf_get_f32(g, "olmo2.rope.scaling.yarn_beta_fast", &f) == TOY_OK && f == 8.0f, "%g", f);
    cr_expect(toy_gguf_find_key(g, "olmo2.rope.scaling.yarn_beta_slow") < 0, "1, the default: no key");
    toy_gguf_close(g);
    cleanup_models();
    th_mkdir("o3r");
    refused("\"hidden_size\":64,\"num_hidden_layers\":4,\"num_attention_heads\":4,\"intermediate_size\":96,"
            "\"vocab_size\":100,\"model_type\":\"olmo3\",\"sliding_window\":8",
            "\"layer_types\":[\"sliding_attention\",\"full_attention\",\"sliding_attention\",\"sliding_attention\"]",
            TOY_ERR_UNSUPPORTED, "layer_types[3] is 'sliding_attention'");
    th_rmdir();
}

/* Gemma 3 and SmolLM3 configs a GGUF cannot hold are refused, naming what, before any weight is read: layer_types
 * whose global layers are not the last of each period (GGUF's sliding_window_pattern), the multimodal Gemma 3
 * without its text_config, SmolLM3 layers without RoPE other than llama.cpp's every fourth, and a SmolLM3 sliding
 * window */
Test(hf_import, gemma3_and_smollm3_layouts_a_gguf_cannot_hold_are_refused) {
    th_mkdir("g3r");
    const char *extra[] = {("\"model_type\":\"gemma3_text\",\"layer_types\":[\"full_attention\",\"sliding_attention\","
                            "\"full_attention\"]"),
                           ("\"model_type\":\"gemma3_text\",\"layer_types\":[\"sliding_attention\",\"chunked_attention\","
                            "\"full_attention\"]"),
                           "\"model_type\":\"gemma3_text\",\"layer_types\":[\"sliding_attention\"]",
                           "\"model_type\":\"gemma3\"",
                           "\"model_type\":\"smollm3\",\"no_rope_layers\":[1,0,1]",
                           "\"model_type\":\"smollm3\",\"no_rope_layers\":[1,1,1],\"use_sliding_window\":true"};
    const char *want[] = {"layer_types[1] is 'sliding_attention'", "layer_types[1] is 'chunked_attention'",
                          "not a list of 3 layers", "model_type 'gemma3' without a text_config object",
                          "no_rope_layers[1] is not 1",
                          "use_sliding_window"};
    const enum toy_status st[] = {TOY_ERR_UNSUPPORTED, TOY_ERR_UNSUPPORTED, TOY_ERR_FORMAT, TOY_ERR_FORMAT,
                                  TOY_ERR_UNSUPPORTED, TOY_ERR_UNSUPPORTED};
    for (int i = 0; i < 6; i++)
        refused("\"hidden_size\":64,\"num_hidden_layers\":3,\"num_attention_heads\":4,\"num_key_value_heads\":1,"
                "\"head_dim\":32,\"intermediate_size\":128,\"vocab_size\":100,\"query_pre_attn_scalar\":32,"
                "\"sliding_window\":16", extra[i], st[i], want[i]);
    th_rmdir();
}

/* Gemma 3 with its vision tower (model_type gemma3, the 4B/12B/27B): its text model, whose config is text_config with
 * Gemma3TextConfig's defaults where it is silent (8 heads, 4 kv heads, RoPE bases 1e6 and 1e4, eps 1e-6, 5 of each 6
 * layers sliding, tied), under language_model.model.* (the released checkpoints) or model.language_model.* (newer
 * transformers); the vision tower and projector are left out. The tensors as a gemma3_text folder's; its keys. */
Test(hf_import, gemma3_with_its_vision_tower_imports_its_text_model, .timeout = 300) {
    if (!make_models()) cr_skip("python3 with torch not available");
    const char *models[] = {"gemma3_mm", "gemma3_mm_new"};
    char out[512];
    for (int m = 0; m < 2; m++) {
        struct toy_convert_report r;
        convert(models[m], TOY_F32, out, sizeof out, &r);
        cr_expect_str_eq(r.arch, "gemma3");
        cr_expect(strstr(r.note, "the vision tower and projector (4 tensors) are left out"), "%s", r.note);
        compare(models[m], out, TOY_F32); /* (the tensor count too: no vision tensor) */
        struct toy_gguf *g;
        cr_assert_eq(toy_gguf_open(out, &g), TOY_OK);
        const struct { const char *key; uint32_t v; } want[] = {
            {"gemma3.block_count", 7},         {"gemma3.attention.head_count", 8}, {"gemma3.attention.head_count_kv", 4},
            {"gemma3.attention.key_length", 16}, {"gemma3.attention.sliding_window", 4},
            {"gemma3.context_length", 131072}};
        for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
            uint32_t u = 0;
            cr_expect(toy_gguf_get_u32(g, want[i].key, &u) == TOY_OK && u == want[i].v, "%s: %s %u, not %u",
                      models[m], want[i].key, u, want[i].v);
        }
        float f = 0;
        cr_expect(toy_gguf_get_f32(g, "gemma3.rope.freq_base", &f) == TOY_OK && f == 1000000.0f, "%g", f);
        cr_expect(toy_gguf_get_f32(g, "gemma3.attention.layer_norm_rms_epsilon", &f) == TOY_OK && f == 1e-6f, "%g", f);
        cr_expect(toy_gguf_get_f32(g, "gemma3.rope.scaling.factor", &f) == TOY_OK && f == 8.0f, "%g", f);
        cr_expect(toy_gguf_find_key(g, "gemma3.attention.sliding_window_pattern") < 0, "6, llama.cpp's own: no key");
        cr_expect(toy_gguf_find_tensor(g, "output.weight") < 0, "tied by default");
        toy_gguf_close(g);
    }
    cleanup_models();
}

/* DeepSeek routing and YaRN that GGUF's keys cannot hold are refused, naming the keys, before any weight is read:
 * routing within a few of the expert groups (DeepSeek-V2 and V3 at full size), a rotation correction (mscale)
 * unlike the attention's (mscale_all_dim), and V2's renormalised weights with a scale (V2 applies one, readers
 * both) */
Test(hf_import, deepseek_routing_a_gguf_cannot_hold_is_refused) {
    th_mkdir("dsr");
    const char *extra[] = {"\"model_type\":\"deepseek_v3\",\"topk_method\":\"noaux_tc\",\"n_group\":8,\"topk_group\":4",
                           ("\"model_type\":\"deepseek_v3\",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":40,"
                            "\"original_max_position_embeddings\":4096,\"mscale\":1.0,\"mscale_all_dim\":0.707}"),
                           "\"model_type\":\"deepseek_v2\",\"norm_topk_prob\":true,\"routed_scaling_factor\":16"};
    const char *want[] = {"within 4 of 8 expert groups", "mscale 1 and mscale_all_dim 0.707", "routed_scaling_factor 16"};
    for (int i = 0; i < 3; i++)
        refused("\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":128,"
                "\"vocab_size\":100,\"kv_lora_rank\":32,\"qk_rope_head_dim\":8,\"qk_nope_head_dim\":16,"
                "\"v_head_dim\":16,\"n_routed_experts\":8,\"num_experts_per_tok\":2,\"moe_intermediate_size\":32,"
                "\"n_shared_experts\":1,\"first_k_dense_replace\":1", extra[i], TOY_ERR_UNSUPPORTED, want[i]);
    th_rmdir();
}

/* Phi-3 configs a GGUF cannot hold are refused, naming what, before any weight is read: LongRoPE tables not one
 * factor per rotated pair (6 for 12 of 16 dims) or not numbers, RoPE scalings llama.cpp's phi3 has no keys for
 * (it runs longrope and su), a partial rotary of an odd count of dims (a member given twice: the last counts); and
 * a relative with a model type of its own (phimoe) is not taken for it, the error listing phi3 */
Test(hf_import, phi3_configs_a_gguf_cannot_hold_are_refused) {
    th_mkdir("phr");
    const char *six = "[1,1.5,2,2.5,3,3.5]";
    char extra[6][300];
    snprintf(extra[0], sizeof extra[0], "\"model_type\":\"phi3\",\"rope_scaling\":{\"type\":\"longrope\","
             "\"long_factor\":[1,2,3,4,5],\"short_factor\":%s}", six);
    snprintf(extra[1], sizeof extra[1], "\"model_type\":\"phi3\",\"rope_scaling\":{\"type\":\"su\","
             "\"long_factor\":%s,\"short_factor\":[1,1,\"2\",1,1,1]}", six);
    snprintf(extra[2], sizeof extra[2], "\"model_type\":\"phi3\",\"rope_scaling\":{\"type\":\"yarn\",\"factor\":4,"
             "\"long_factor\":%s,\"short_factor\":%s}", six, six);
    snprintf(extra[3], sizeof extra[3], "\"model_type\":\"phi3\",\"rope_scaling\":{\"rope_type\":\"dynamic\","
             "\"factor\":2}");
    snprintf(extra[4], sizeof extra[4], "\"model_type\":\"phi3\",\"partial_rotary_factor\":0.5625");
    snprintf(extra[5], sizeof extra[5], "\"model_type\":\"phimoe\"");
    const char *want[] = {"rope_scaling.long_factor has 5 entries, not 6", "rope_scaling.short_factor[2] is not",
                          "rope_scaling type 'yarn' for phi3", "rope_scaling type 'dynamic' for phi3",
                          "partial_rotary_factor 0.5625 rotates 9 of the 16", "granite, phi3, gpt2"};
    const enum toy_status st[] = {TOY_ERR_FORMAT, TOY_ERR_FORMAT, TOY_ERR_UNSUPPORTED, TOY_ERR_UNSUPPORTED,
                                  TOY_ERR_UNSUPPORTED, TOY_ERR_UNSUPPORTED};
    for (int i = 0; i < 6; i++)
        refused("\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
                "\"intermediate_size\":96,\"vocab_size\":100,\"max_position_embeddings\":64,"
                "\"original_max_position_embeddings\":16,\"partial_rotary_factor\":0.75", extra[i], st[i], want[i]);
    th_rmdir();
}

/* A sentence-transformers model's pooling (1_Pooling/config.json) becomes pooling_type, which the loader reads
 * (last token: Qwen3-Embedding's); a mode toy cannot pool by is refused, naming it */
Test(hf_import, sentence_transformers_pooling_becomes_pooling_type, .timeout = 300) {
    if (!make_models()) cr_skip("python3 with torch not available");
    char path[600], out[512];
    snprintf(path, sizeof path, "%s/qwen3/1_Pooling", model_root);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof path, "%s/qwen3/1_Pooling/config.json", model_root);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"word_embedding_dimension\": 64, \"pooling_mode_cls_token\": false, \"pooling_mode_mean_tokens\": false,"
          " \"pooling_mode_max_tokens\": false, \"pooling_mode_lasttoken\": true}", f);
    fclose(f);
    struct toy_convert_report r;
    convert("qwen3", TOY_F32, out, sizeof out, &r);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(out, &g), TOY_OK);
    uint32_t u = 0;
    cr_expect(toy_gguf_get_u32(g, "qwen3.pooling_type", &u) == TOY_OK && u == TOY_POOLING_LAST, "pooling_type %u", u);
    toy_gguf_close(g);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(out, false, &m), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(m->cfg.pooling, TOY_POOLING_LAST);
    char again[600]; /* and toy's own writer keeps it */
    snprintf(again, sizeof again, "%s/again.gguf", model_root);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_llama_write_gguf(m, w, TOY_F32), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, again), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    toy_llama_free(m);
    cr_assert_eq(toy_llama_load(again, false, &m), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(m->cfg.pooling, TOY_POOLING_LAST);
    toy_llama_free(m);
    const char *bin = getenv("TOY_BIN");
    char cmd[1200], text[8192] = "";
    snprintf(cmd, sizeof cmd, "%s describe %s", bin && *bin ? bin : "build/toy", again);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    size_t got = fread(text, 1, sizeof text - 1, p);
    text[got] = 0;
    cr_expect_eq(pclose(p), 0, "%s", text);
    cr_expect(strstr(text, "embeddings     last pooling"), "%s", text);
    f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"pooling_mode_mean_tokens\": false, \"pooling_mode_max_tokens\": true}", f);
    fclose(f);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/qwen3", model_root);
    snprintf(out, sizeof out, "%s/qwen3-max.gguf", model_root);
    cr_expect_eq(toy_hf_convert(dir, out, NULL, NULL), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "pooling_mode_max_tokens"), "%s", toy_last_error());
    cr_expect(access(out, F_OK) != 0, "an output was written");
    unlink(path);
    snprintf(path, sizeof path, "%s/qwen3/1_Pooling", model_root);
    rmdir(path);
    cleanup_models();
}
