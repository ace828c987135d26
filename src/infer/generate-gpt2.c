/* generate-gpt2.c: toy_gpt2_generate (toy/gpt2.h): GPT-2 through the
 * generic generator (generate.c) over toy_gpt2_lm: the prompt prefilled in
 * one graph, then one token a run of a decode graph built once, with the
 * sampler and stop conditions of toy/generate.h. GPT-2's end of text is the
 * tokenizer's end-of-generation token. */
#include "toy/generate.h"
#include "toy/gpt2.h"

enum toy_status toy_gpt2_generate(struct toy_gpt2 *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                  struct toy_threadpool *tp, const int32_t *prompt, int64_t n_prompt,
                                  const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                                  struct toy_generate_result *res) {
    return toy_gpt2_generate_kv(m, tok, n_ctx, TOY_F32, tp, prompt, n_prompt, p, fn, ud, res);
}

enum toy_status toy_gpt2_generate_kv(struct toy_gpt2 *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, const int32_t *prompt,
                                     int64_t n_prompt, const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                                     struct toy_generate_result *res) {
    if (res) *res = (struct toy_generate_result){.n_prompt = n_prompt};
    if (!m) return toy_error(TOY_ERR_INVALID_ARG, "toy_gpt2_generate: NULL model");
    struct toy_lm lm = toy_gpt2_lm(m);
    struct toy_generator *g;
    enum toy_status st = toy_generator_new_lm(&lm, tok, n_ctx, kv_type, tp, &g);
    if (!st) st = toy_generate(g, prompt, n_prompt, p, fn, ud, res);
    toy_generator_free(g);
    return st;
}
