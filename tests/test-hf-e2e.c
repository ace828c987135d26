/* test-hf-e2e.c: Hugging Face folder -> toy convert -> toy's Llama engine
 * -> logits, against the Hugging Face forward pass computed in float64 by
 * tests/torch/make-hf-models.py from the original (unpermuted) weights.
 * This checks the converter's tensor transforms (Llama q/k permutation,
 * Gemma 1 + w norms, Llama-3 rope_freqs) against the meaning the weights
 * had in Hugging Face, not just against llama.cpp's recipe. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "toy/convert.h"
#include "toy/toy.h"
#include "toy/llama.h"

static float *run_logits(struct toy_llama *m, const int32_t *tokens, int T, int64_t *n_out) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    memcpy(tok->data, tokens, sizeof(int32_t) * (size_t)T);
    for (int t = 0; t < T; t++) ((int32_t *)pos->data)[t] = t;
    struct toy_tensor *lg = toy_llama_forward(ctx, m, tok, pos); /* {vocab, T, 1} */
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    *n_out = toy_nelements(lg);
    float *out = malloc((size_t)*n_out * sizeof *out);
    memcpy(out, lg->data, (size_t)*n_out * sizeof *out);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return out;
}

Test(hf_e2e, converted_models_match_huggingface_logits, .timeout = 300) {
    char root[256], cmd[1024];
    snprintf(root, sizeof root, "/tmp/toy-hf-e2e-%d", (int)getpid());
    struct stat sb;
    const char *tok = "../shared/testdata/tokenizer-smollm2/tokenizer.json";
    snprintf(cmd, sizeof cmd, "rm -rf %s && /usr/bin/python3 tests/torch/make-hf-models.py %s %s", root, root,
             stat(tok, &sb) == 0 ? tok : "");
    if (system(cmd) != 0) cr_skip("python3 with torch not available");
    const char *models[] = {"llama",     "mistral",   "qwen2", "qwen3",       "gemma2",      "gemma3",      "smollm3",
                            "olmo2",     "olmo3",     "granite",   "phi3",      "phi3_long", "phi3_mini",   "gemma3_mm", "gemma3_mm_new", "mixtral",     "qwen2_moe",
                            "qwen3_moe", "olmoe",     "deepseek_v2", "deepseek_v3"};
    int failures = 0;
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char dir[300], out[400], ref[400];
        snprintf(dir, sizeof dir, "%s/%s", root, models[i]);
        snprintf(out, sizeof out, "%s/%s.gguf", root, models[i]);
        snprintf(ref, sizeof ref, "%s/logits.json", dir);
        struct toy_convert_opts o = {.type = TOY_F32, .skip_tokenizer = true};
        cr_assert_eq(toy_hf_convert(dir, out, &o, NULL), TOY_OK, "%s: %s", models[i], toy_last_error());
        struct toy_llama *m;
        cr_assert_eq(toy_llama_load(out, false, &m), TOY_OK, "%s: %s", models[i], toy_last_error());
        json_error_t err;
        json_t *j = json_load_file(ref, 0, &err);
        cr_assert(j, "%s: %s", ref, err.text);
        json_t *tk = json_object_get(j, "tokens"), *lg = json_object_get(j, "logits");
        int T = (int)json_array_size(tk);
        int32_t tokens[64];
        for (int t = 0; t < T; t++) tokens[t] = (int32_t)json_integer_value(json_array_get(tk, (size_t)t));
        int64_t n;
        float *ours = run_logits(m, tokens, T, &n);
        cr_assert_eq((size_t)n, json_array_size(lg), "%s: %lld logits vs %zu", models[i], (long long)n, json_array_size(lg));
        double worst = 0;
        for (int64_t k = 0; k < n; k++) {
            double r = json_number_value(json_array_get(lg, (size_t)k));
            double e = fabs(ours[k] - r) / (1 + fabs(r));
            if (!(e <= worst)) worst = e;
        }
        cr_log_info("%-8s max |toy - HF| / (1 + |HF|) = %.2e", models[i], worst);
        if (!(worst <= 1e-4)) {
            failures++;
            fprintf(stderr, "%s: logits differ from Hugging Face (worst %.3e)\n", models[i], worst);
        }
        free(ours);
        json_decref(j);
        toy_llama_free(m);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd)) {}
    cr_assert_eq(failures, 0, "%d converted models differ from the Hugging Face forward pass", failures);
}
