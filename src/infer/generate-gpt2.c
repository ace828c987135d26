/* generate-gpt2.c: prefill + decode over a KV cache for GPT-2
 * (toy_gpt2_generate in toy/gpt2.h). The same loop as generate.c (the
 * Llama generator): the prompt is prefilled in one graph, then one graph of
 * a single token, built once, runs per new token with the cache's n_past
 * advanced. Sampling is toy/sampler.h's; GPT-2's end of text is the
 * tokenizer's end-of-generation token. Stop strings as in generate.c: the
 * text is held back by (longest stop - 1) bytes so that what the callback
 * saw never runs into a stop string; the held-back tail is flushed at the
 * end (id -1). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/gen-text.h"
#include "toy/gpt2.h"
#include "toy/graph.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* logits of the last of n tokens fed at positions n0 .. n0+n-1 */
static enum toy_status run_chunk(struct toy_gpt2 *m, struct toy_kv_cache *kv, struct toy_membuf *buf,
                                 struct toy_threadpool *tp, const int32_t *ids, int64_t n, float *last) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    if (!ctx) return toy_error(TOY_ERR_NOMEM, "generate");
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, n, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, n);
    memcpy(tok->data, ids, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) ((int32_t *)pos->data)[i] = (int32_t)i;
    struct toy_tensor *lg = toy_gpt2_forward_cached(ctx, m, kv, tok, pos);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    *(int32_t *)kv->n_past->data = 0;
    enum toy_status st = toy_graph_plan(g, buf, NULL);
    if (!st) st = toy_graph_compute(g, tp);
    if (!st) memcpy(last, (float *)lg->data + (n - 1) * m->cfg.vocab, (size_t)m->cfg.vocab * sizeof(float));
    toy_ctx_free(ctx);
    return st;
}

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
    struct toy_generate_result r = {.n_prompt = n_prompt};
    const int64_t V = m->cfg.vocab;
    if (n_ctx <= 0 || n_ctx > m->cfg.max_ctx) n_ctx = m->cfg.max_ctx;
    if (n_prompt <= 0) return toy_error(TOY_ERR_INVALID_ARG, "empty prompt");
    if (n_prompt >= n_ctx)
        return toy_error(TOY_ERR_RANGE, "prompt of %lld tokens does not fit the context of %lld",
                         (long long)n_prompt, (long long)n_ctx);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return toy_error(TOY_ERR_RANGE, "prompt token %lld is id %d, vocabulary has %lld", (long long)i,
                             prompt[i], (long long)V);
    enum toy_status pst = toy_sampler_params_check(&p->sampling);
    if (pst) return pst;
    if ((pst = toy_gpt2_pack_weights(m))) return pst; /* as the Llama generator: the int8 kernels' layout */
    struct toy_kv_cache kv;
    enum toy_status st = toy_gpt2_cache_init_type(&kv, m, n_ctx, 1, kv_type);
    if (st) return st;
    struct toy_membuf buf = {0};
    struct toy_ctx *dctx = toy_ctx_init(true);
    float *logits = malloc((size_t)V * sizeof(float));
    struct toy_sampler *s = toy_sampler_new(&p->sampling, V);
    struct toy_decoder *dec = NULL;
    struct gen_text text = {0};
    if (!dctx || !logits || !s) { st = toy_error(TOY_ERR_NOMEM, "generate"); goto done; }
    if (tok && (st = toy_decoder_init(tok, TOY_DECODE_SKIP_SPECIAL, &dec))) goto done;
    /* the one-token decode graph */
    struct toy_tensor *dtok = toy_new_tensor_2d(dctx, TOY_I32, 1, 1), *dpos = toy_new_tensor_1d(dctx, TOY_I32, 1);
    struct toy_tensor *dlogits = toy_gpt2_forward_cached(dctx, m, &kv, dtok, dpos);
    toy_set_output(dlogits);
    struct toy_graph *dg = toy_graph_new(dctx);
    toy_graph_build(dg, dlogits);
    for (int64_t i = 0; i < n_prompt; i++) toy_sampler_accept(s, prompt[i]);
    double t0 = now_s();
    if ((st = run_chunk(m, &kv, &buf, tp, prompt, n_prompt, logits))) goto done;
    if ((st = toy_graph_plan(dg, &buf, NULL))) goto done;
    r.prefill_s = now_s() - t0;
    t0 = now_s();
    r.reason = TOY_STOP_LENGTH;
    size_t max_stop = 0;
    for (int i = 0; i < p->n_stop; i++) max_stop = strlen(p->stop[i]) > max_stop ? strlen(p->stop[i]) : max_stop;
    for (int64_t pos = n_prompt;; pos++) {
        float lp;
        int32_t id = toy_sampler_sample(s, logits, &lp);
        toy_sampler_accept(s, id);
        r.n_generated++;
        if (tok && toy_tokenizer_is_eog(tok, id) && !p->ignore_eos) {
            r.reason = TOY_STOP_EOS;
            if (fn) fn(ud, id, "", 0, lp);
            break;
        }
        const char *piece = "";
        size_t plen = 0;
        if (dec) toy_decoder_push(dec, id, &piece, &plen);
        /* the text so far, to find stop strings; all but a stop-sized tail is emitted */
        if ((st = gen_text_add(&text, piece, plen))) goto done;
        const char *hit = gen_text_stop(&text, p->stop, p->n_stop, max_stop);
        if (hit) {
            size_t upto = (size_t)(hit - text.s);
            if (fn && upto > text.emitted) fn(ud, id, text.s + text.emitted, upto - text.emitted, lp);
            text.emitted = text.len;
            r.reason = TOY_STOP_STRING;
            break;
        }
        size_t hold = max_stop ? max_stop - 1 : 0;
        size_t safe = text.len > hold ? text.len - hold : 0;
        while (safe > text.emitted && safe < text.len && ((unsigned char)text.s[safe] & 0xC0) == 0x80) safe--;
        if (fn) {
            bool go = fn(ud, id, text.s + text.emitted, safe > text.emitted ? safe - text.emitted : 0, lp);
            if (safe > text.emitted) text.emitted = safe;
            if (!go) { r.reason = TOY_STOP_CALLER; break; }
        }
        if (p->n_predict > 0 && r.n_generated >= p->n_predict) break;
        if (pos + 1 >= n_ctx) { r.reason = TOY_STOP_CONTEXT; break; }
        *(int32_t *)dtok->data = id;
        *(int32_t *)dpos->data = (int32_t)pos;
        *(int32_t *)kv.n_past->data = (int32_t)pos;
        if ((st = toy_graph_compute(dg, tp))) goto done;
        memcpy(logits, dlogits->data, (size_t)V * sizeof(float));
    }
    if (r.reason != TOY_STOP_STRING && (st = gen_text_flush(&text, dec))) goto done;
    if (fn && text.emitted < text.len) fn(ud, -1, text.s + text.emitted, text.len - text.emitted, 0); /* held back */
    r.decode_s = now_s() - t0;
done:
    if (res) *res = r;
    free(text.s);
    toy_decoder_free(dec);
    toy_sampler_free(s);
    free(logits);
    toy_ctx_free(dctx);
    toy_membuf_free(&buf);
    toy_kv_cache_free(&kv);
    return st;
}
