/* BERT encoders (toy/bert.h): hidden states against a PyTorch reference
 * (tests/torch/ref_bert.py, float64) through GGUF files toy writes, in f32,
 * f16 and Q8_0 (toy quantize); pooling; and files that are refused with a
 * message naming what is wrong. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "toy/bert.h"
#include "toy/convert.h"
#include "toy/gguf.h"
#include "toy/tokenizer.h"
#include "toy/rng.h"

static struct toy_bert_config base_config(void) {
    return (struct toy_bert_config){.vocab = 61, .d_model = 64, .n_layers = 2, .n_heads = 4, .d_ff = 128,
                                    .max_ctx = 32, .n_types = 2, .norm_eps = 1e-12f, .pooling = TOY_POOLING_MEAN};
}

/* a random model with weights large enough that attention is far from uniform */
static struct toy_bert *random_model(uint64_t seed) {
    struct toy_bert_config c = base_config();
    struct toy_bert *m = toy_bert_new(&c, seed);
    cr_assert(m, "%s", toy_last_error());
    for (int i = 0; i < toy_bert_n_tensors(m); i++) {
        struct toy_tensor *t = toy_bert_tensor(m, i);
        if (t->n_dims < 2) continue;
        for (int64_t k = 0; k < toy_nelements(t); k++) ((float *)t->data)[k] *= 8;
    }
    return m;
}

static void save(struct toy_bert *m, const char *path, enum toy_dtype type) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(m, w, type), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

static struct toy_tensor *fwd(struct toy_ctx *ctx, void *m, struct toy_tensor *tok, struct toy_tensor *pos) {
    return toy_bert_forward(ctx, m, tok, pos);
}

enum { T = 11, B = 2 };

static void tokens(int32_t *t) {
    for (int i = 0; i < T * B; i++) t[i] = (i * 37 + 5) % 61;
}

static float *hidden_of(const char *path, int32_t *tok) {
    struct toy_bert *m;
    cr_assert_eq(toy_bert_load(path, &m), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_bert_pack_weights(m), TOY_OK, "%s", toy_last_error());
    float *h = th_logits(fwd, m, tok, T, B);
    toy_bert_free(m);
    return h;
}

static double worst_rel(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (1 + fabs((double)b[i]));
        if (!(e <= w)) w = e;
    }
    return w;
}

Test(bert, hidden_states_match_pytorch_in_f32_f16_and_q8_0, .timeout = 300) {
    th_mkdir("bert");
    int32_t tok[T * B];
    tokens(tok);
    char f32[400], f16[400], q8[400], cmd[1400];
    snprintf(f32, sizeof f32, "%s/f32.gguf", th_dir);
    snprintf(f16, sizeof f16, "%s/f16.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/q8.gguf", th_dir);
    struct toy_bert *m = random_model(7);
    save(m, f32, TOY_F32);
    save(m, f16, TOY_F16);
    toy_bert_free(m);
    const char *bin = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    snprintf(cmd, sizeof cmd, "%s quantize '%s' '%s' q8_0 > /dev/null 2>&1", bin, f32, q8);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    float *h32 = hidden_of(f32, tok), *h16 = hidden_of(f16, tok), *hq = hidden_of(q8, tok);

    json_t *tk = json_array();
    for (int b = 0; b < B; b++) {
        json_t *row = json_array();
        for (int t = 0; t < T; t++) json_array_append_new(row, json_integer(tok[b * T + t]));
        json_array_append_new(tk, row);
    }
    json_t *specs = json_array();
    json_array_append_new(specs, json_pack("{s:s,s:o}", "gguf", f32, "tokens", tk));
    json_t *res = th_torch("ref_bert.py", specs);
    json_t *c0 = json_array_get(json_object_get(res, "cases"), 0), *ref = json_object_get(c0, "hidden");
    const size_t n = (size_t)T * B * 64;
    cr_assert_eq(json_array_size(ref), n);
    double e32 = th_worst_rel(h32, ref);
    double e16 = worst_rel(h16, h32, n), eq = worst_rel(hq, h32, n), cq = 1;
    for (int b = 0; b < B; b++) { /* what an embedding is: the mean-pooled states, compared by cosine */
        double dot = 0, na = 0, nb = 0;
        for (int i = 0; i < 64; i++) {
            double x = 0, y = 0;
            for (int t = 0; t < T; t++) x += hq[(b * T + t) * 64 + i], y += h32[(b * T + t) * 64 + i];
            dot += x * y, na += x * x, nb += y * y;
        }
        if (dot / sqrt(na * nb) < cq) cq = dot / sqrt(na * nb);
    }
    json_t *cos = json_object_get(c0, "cos_erf");
    cr_log_info("bert: f32 vs torch %.2e; f16 vs f32 %.2e; q8_0 vs f32 %.2e (embedding cosine %.6f); mean-pooled tanh "
                "vs erf GELU cosine %.8f", e32, e16, eq, cq, json_number_value(json_array_get(cos, 0)));
    cr_assert_leq(e32, 1e-4);
    cr_assert_leq(e16, 2e-2);
    cr_assert_leq(eq, 0.15);
    cr_assert_geq(cq, 0.999);
    cr_assert_gt(e16, 0); /* the file's type is what ran */
    /* every position depends on every other: changing the last token moves the first position's state */
    int32_t tok2[T * B];
    memcpy(tok2, tok, sizeof tok2);
    tok2[T - 1] = (tok2[T - 1] + 1) % 61;
    float *h2 = hidden_of(f32, tok2);
    cr_assert_gt(worst_rel(h2, h32, 64), 1e-3);
    free(h2);
    json_decref(res);
    free(h32), free(h16), free(hq);
    th_rmdir();
}

/* pooling: mean over the positions, the first's (CLS) or the last's; the file's pooling_type is read back */
Test(bert, pooling_and_config_round_trip) {
    th_mkdir("bert");
    char path[400];
    snprintf(path, sizeof path, "%s/m.gguf", th_dir);
    struct toy_bert *w = random_model(3);
    w->cfg.pooling = TOY_POOLING_CLS;
    save(w, path, TOY_F32);
    toy_bert_free(w);
    struct toy_bert *m;
    cr_assert_eq(toy_bert_load(path, &m), TOY_OK, "%s", toy_last_error());
    struct toy_bert_config c = base_config();
    cr_assert_eq(m->cfg.pooling, TOY_POOLING_CLS);
    uint32_t types = 0;
    cr_assert(toy_gguf_get_u32(m->gguf, "tokenizer.ggml.token_type_count", &types) == TOY_OK && types == 2);
    cr_assert(m->cfg.d_model == c.d_model && m->cfg.n_layers == c.n_layers && m->cfg.n_heads == c.n_heads &&
              m->cfg.d_ff == c.d_ff && m->cfg.max_ctx == c.max_ctx && m->cfg.n_types == 2 && m->cfg.vocab == 61 &&
              m->cfg.norm_eps == c.norm_eps);
    int32_t tok[T * B];
    tokens(tok);
    float *h = th_logits(fwd, m, tok, T, B);
    const enum toy_pooling kinds[] = {TOY_POOLING_MEAN, TOY_POOLING_CLS, TOY_POOLING_LAST};
    for (int k = 0; k < 3; k++) {
        struct toy_ctx *ctx = toy_ctx_init(true);
        struct toy_tensor *tt = toy_new_tensor_2d(ctx, TOY_I32, T, B), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
        memcpy(tt->data, tok, sizeof tok);
        for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
        struct toy_tensor *e = toy_cont(ctx, toy_bert_pool(ctx, toy_bert_forward(ctx, m, tt, pos), kinds[k]));
        toy_set_output(e);
        struct toy_graph *g = toy_graph_new(ctx);
        toy_graph_build(g, e);
        cr_assert_eq(toy_graph_compute(g, NULL), TOY_OK, "%s", toy_last_error());
        cr_assert(e->ne[0] == 64 && e->ne[1] == 1 && e->ne[2] == B);
        for (int b = 0; b < B; b++)
            for (int i = 0; i < 64; i++) {
                double want = 0;
                if (kinds[k] == TOY_POOLING_MEAN) {
                    for (int t = 0; t < T; t++) want += h[(b * T + t) * 64 + i];
                    want /= T;
                } else {
                    want = h[(b * T + (kinds[k] == TOY_POOLING_CLS ? 0 : T - 1)) * 64 + i];
                }
                cr_assert(fabs(((float *)e->data)[b * 64 + i] - want) < 1e-5, "pooling %d, row %d, %d", (int)kinds[k],
                          b, i);
            }
        toy_ctx_free(ctx);
    }
    free(h);
    toy_bert_free(m);
    th_rmdir();
}

/* files that are not a BERT toy reads: refused, naming the file and what is wrong */
Test(bert, refuses_other_files_by_name) {
    th_mkdir("bert");
    char path[400];
    snprintf(path, sizeof path, "%s/bad.gguf", th_dir);
    struct toy_bert *m = random_model(5);
    struct toy_gguf_writer *w;
    /* a missing tensor (written under another name) */
    toy_set_name(m->layers[1].b_down, "blk.1.ffn_down.bias_gone");
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(m, w, TOY_F32), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK);
    toy_gguf_writer_free(w);
    toy_set_name(m->layers[1].b_down, "blk.1.ffn_down.bias");
    struct toy_bert *out = (struct toy_bert *)1;
    cr_assert_eq(toy_bert_load(path, &out), TOY_ERR_FORMAT);
    cr_assert_null(out);
    cr_assert(strstr(toy_last_error(), "blk.1.ffn_down.bias") && strstr(toy_last_error(), "bad.gguf"), "%s",
              toy_last_error());
    /* a fused qkv (another BERT family) */
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(m, w, TOY_F32), TOY_OK);
    int64_t ne[2] = {64, 192};
    float *qkv = calloc(64 * 192, sizeof *qkv);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.attn_qkv.weight", TOY_F32, 2, ne, qkv), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK);
    toy_gguf_writer_free(w);
    free(qkv);
    cr_assert_eq(toy_bert_load(path, &out), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "attn_qkv"), "%s", toy_last_error());
    /* a shape the config does not give */
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(m, w, TOY_F32), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_u32(w, "bert.feed_forward_length", 100), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK);
    toy_gguf_writer_free(w);
    cr_assert_eq(toy_bert_load(path, &out), TOY_ERR_SHAPE);
    cr_assert(strstr(toy_last_error(), "blk.0.ffn_up.weight"), "%s", toy_last_error());
    /* another architecture */
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    cr_assert_eq(toy_bert_write_gguf(m, w, TOY_F32), TOY_OK);
    cr_assert_eq(toy_gguf_writer_set_str(w, "general.architecture", "llama"), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK);
    toy_gguf_writer_free(w);
    cr_assert_eq(toy_bert_load(path, &out), TOY_ERR_UNSUPPORTED);
    cr_assert(strstr(toy_last_error(), "not 'bert'"), "%s", toy_last_error());
    toy_bert_free(m);
    th_rmdir();
}

/* A sentence-transformers BERT folder (tests/torch/make-hf-bert.py: BertModel names, the pooler and the int64
 * position_ids buffer, mean pooling, a WordPiece tokenizer.json) through `toy convert`: the GGUF loads as a BERT
 * with mean pooling, its tokenizer gives Hugging Face's ids for each text, and its hidden states over those ids are
 * the float64 reference's; a q8_0 conversion embeds at cosine > 0.999 */
Test(bert, converted_hf_folder_tokenizes_and_encodes_as_pytorch, .timeout = 300) {
    th_mkdir("bert");
    char cmd[1024], dir[400], f32[400], q8[400];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/torch/make-hf-bert.py '%s' >/dev/null 2>&1", th_dir);
    if (system(cmd)) {
        th_rmdir();
        cr_skip_test("python3 with torch not available");
    }
    snprintf(dir, sizeof dir, "%s/bert", th_dir);
    snprintf(f32, sizeof f32, "%s/bert-f32.gguf", th_dir);
    snprintf(q8, sizeof q8, "%s/bert-q8.gguf", th_dir);
    struct toy_convert_opts co = {.type = TOY_F32};
    struct toy_convert_report rep;
    cr_assert_eq(toy_hf_convert(dir, f32, &co, &rep), TOY_OK, "%s", toy_last_error());
    cr_assert_str_eq(rep.arch, "bert");
    cr_assert(rep.tokenizer, "%s", rep.note);
    co.type = TOY_Q8_0;
    cr_assert_eq(toy_hf_convert(dir, q8, &co, NULL), TOY_OK, "%s", toy_last_error());
    snprintf(cmd, sizeof cmd, "%s/expected.json", dir);
    json_error_t je;
    json_t *exp = json_load_file(cmd, 0, &je);
    cr_assert(exp, "%s", je.text);
    struct toy_bert *m, *mq;
    cr_assert_eq(toy_bert_load(f32, &m), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_bert_load(q8, &mq), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(m->cfg.pooling, TOY_POOLING_MEAN);
    cr_assert_eq(m->cfg.max_ctx, 40);
    cr_assert_eq(mq->layers[0].wq->type, TOY_Q8_0);
    uint32_t types = 0; /* llama.cpp's loader sizes token_types by it */
    cr_assert(toy_gguf_get_u32(m->gguf, "tokenizer.ggml.token_type_count", &types) == TOY_OK && types == 2);
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_load_gguf(m->gguf, &tok), TOY_OK, "%s", toy_last_error());
    json_t *cases = json_object_get(exp, "cases");
    cr_assert_eq(json_array_size(cases), 4);
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        const char *text = json_string_value(json_object_get(cs, "text"));
        json_t *want_ids = json_object_get(cs, "ids");
        struct toy_tokens ids = {0};
        cr_assert_eq(toy_tokenizer_encode(tok, text, strlen(text), TOY_ENCODE_MODEL_DEFAULTS, &ids), TOY_OK);
        cr_assert_eq((size_t)ids.n, json_array_size(want_ids), "'%s': %lld ids", text, (long long)ids.n);
        for (int64_t i = 0; i < ids.n; i++)
            cr_assert_eq(ids.ids[i], json_integer_value(json_array_get(want_ids, (size_t)i)), "'%s', id %lld", text,
                         (long long)i);
        int T = (int)ids.n;
        float *h = th_logits(fwd, m, ids.ids, T, 1), *hq = th_logits(fwd, mq, ids.ids, T, 1);
        json_t *ref = json_object_get(cs, "hidden");
        cr_assert_eq(json_array_size(ref), (size_t)T * 64);
        double e = th_worst_rel(h, ref), dot = 0, na = 0, nb = 0;
        for (int i = 0; i < 64; i++) {
            double x = 0, y = 0;
            for (int t = 0; t < T; t++) x += hq[t * 64 + i], y += h[t * 64 + i];
            dot += x * y, na += x * x, nb += y * y;
        }
        cr_log_info("bert from HF, '%s': %d tokens, f32 vs torch %.2e, q8_0 embedding cosine %.6f, tanh vs erf GELU "
                    "cosine %.8f", text, T, e, dot / sqrt(na * nb),
                    json_number_value(json_object_get(cs, "cos_erf")));
        cr_assert_leq(e, 1e-4);
        cr_assert_geq(dot / sqrt(na * nb), 0.999);
        free(h), free(hq);
        toy_tokens_free(&ids);
    }
    toy_tokenizer_free(tok);
    toy_bert_free(m);
    toy_bert_free(mq);
    json_decref(exp);
    th_rmdir();
}
