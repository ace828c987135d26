/* generate.c: prefill + decode loop over a KV cache (toy/generate.h), for
 * any model family behind toy/model.h's inference functions (Llama, GPT-2).
 * The decode graph (one token) is built once per generator; a prefill graph
 * is built per prompt length and freed after use. Stop strings are matched
 * on the generated text; the text before a stop string is what the callback
 * has seen only if it came before the match (held-back text is dropped). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/gen-text.h"
#include "toy/generate.h"
#include "toy/graph.h"
#include "toy/json-grammar.h"
#include "toy/trace.h"

struct toy_generator {
    struct toy_lm lm;
    const struct toy_tokenizer *tok;
    struct toy_threadpool *tp;
    struct toy_kv_cache kv;
    struct toy_ctx *dctx;               /* decode graph */
    struct toy_graph *dg;
    struct toy_tensor *dtok, *dpos, *dlogits;
    struct toy_membuf buf;              /* shared by prefill and decode graphs */
    struct toy_trace *trace;
    int32_t *cache_ids;                 /* (n_ctx) the tokens whose keys and values the cache holds */
    int64_t n_cache;                    /* ... at positions 0..n_cache-1 */
};

void toy_generator_set_trace(struct toy_generator *g, struct toy_trace *tr) {
    g->trace = tr;
    toy_graph_set_trace(g->dg, tr);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

enum toy_status toy_generator_new(struct toy_llama *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                  struct toy_threadpool *tp, struct toy_generator **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_new: out is NULL");
    return toy_generator_new_kv(m, tok, n_ctx, TOY_F32, tp, out);
}

enum toy_status toy_generator_new_kv(struct toy_llama *m, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, struct toy_generator **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_new_kv: out is NULL");
    *out = NULL;
    if (!m) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_new: NULL model");
    struct toy_lm lm = toy_llama_lm(m);
    return toy_generator_new_lm(&lm, tok, n_ctx, kv_type, tp, out);
}

enum toy_status toy_generator_new_lm(const struct toy_lm *lm, const struct toy_tokenizer *tok, int64_t n_ctx,
                                     enum toy_dtype kv_type, struct toy_threadpool *tp, struct toy_generator **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_new_lm: out is NULL");
    *out = NULL;
    if (!lm || !lm->self) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_new: NULL model");
    if (!lm->cache_init || !lm->forward_cached)
        return toy_error(TOY_ERR_UNSUPPORTED, "toy_generator_new: %s models have no KV-cache inference",
                         lm->arch ? lm->arch : "these");
    struct toy_generator *g = calloc(1, sizeof *g);
    if (!g) return toy_error(TOY_ERR_NOMEM, "generator");
    g->lm = *lm;
    g->tok = tok;
    g->tp = tp;
    if (n_ctx <= 0 || n_ctx > lm->max_ctx) n_ctx = lm->max_ctx;
    enum toy_status st = lm->pack_weights ? lm->pack_weights(lm->self) : TOY_OK;
    if (!st) st = lm->cache_init(lm->self, &g->kv, n_ctx, 1, kv_type);
    if (st) { free(g); return st; }
    if (!(g->cache_ids = malloc((size_t)n_ctx * sizeof *g->cache_ids))) {
        toy_kv_cache_free(&g->kv);
        free(g);
        return toy_error(TOY_ERR_NOMEM, "generator");
    }
    g->dctx = toy_ctx_init(true);
    g->dtok = toy_new_tensor_2d(g->dctx, TOY_I32, 1, 1);
    g->dpos = toy_new_tensor_1d(g->dctx, TOY_I32, 1);
    g->dlogits = lm->forward_cached(lm->self, g->dctx, &g->kv, g->dtok, g->dpos, false);
    toy_set_output(g->dlogits);
    g->dg = toy_graph_new(g->dctx);
    toy_graph_build(g->dg, g->dlogits);
    toy_graph_set_fusion(g->dg, true);
    *out = g;
    return TOY_OK;
}

void toy_generator_free(struct toy_generator *g) {
    if (!g) return;
    toy_ctx_free(g->dctx);
    toy_kv_cache_free(&g->kv);
    toy_membuf_free(&g->buf);
    free(g->cache_ids);
    free(g);
}

/* logits of the last prompt position after prefilling prompt[0..n) at positions from..from+n-1 (the cache
 * holding the first `from`) */
static enum toy_status prefill(struct toy_generator *g, const int32_t *prompt, int64_t n, int64_t from, float *last) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, n, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, n);
    memcpy(tok->data, prompt, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) ((int32_t *)pos->data)[i] = (int32_t)(from + i);
    struct toy_tensor *lg = g->lm.forward_cached(g->lm.self, ctx, &g->kv, tok, pos, true);
    toy_set_output(lg);
    struct toy_graph *gr = toy_graph_new(ctx);
    toy_graph_build(gr, lg);
    *(int32_t *)g->kv.n_past->data = (int32_t)from;
    toy_graph_set_trace(gr, g->trace);
    double t0 = g->trace ? toy_trace_now(g->trace) : 0;
    enum toy_status st = toy_graph_plan(gr, &g->buf, NULL);
    if (!st) st = toy_graph_compute(gr, g->tp);
    if (g->trace) toy_trace_span(g->trace, "prefill", "phase", t0, toy_trace_now(g->trace), 0);
    if (!st) memcpy(last, lg->data, (size_t)g->lm.vocab * sizeof(float));
    toy_ctx_free(ctx);
    return st;
}

enum toy_status toy_generate(struct toy_generator *g, const int32_t *prompt, int64_t n_prompt,
                             const struct toy_generate_params *p, toy_token_fn fn, void *ud,
                             struct toy_generate_result *res) {
    struct toy_generate_result r = {.n_prompt = n_prompt};
    if (res) *res = r; /* a failure still leaves a defined result */
    static const struct toy_generate_params defaults = {0};
    if (!p) p = &defaults;
    if (!g) return toy_error(TOY_ERR_INVALID_ARG, "toy_generate: NULL generator");
    if (n_prompt > 0 && !prompt) return toy_error(TOY_ERR_INVALID_ARG, "toy_generate: NULL prompt of %lld tokens", (long long)n_prompt);
    int64_t V = g->lm.vocab;
    if (n_prompt <= 0) return toy_error(TOY_ERR_INVALID_ARG, "empty prompt (add a BOS token)");
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return toy_error(TOY_ERR_INVALID_ARG, "%d stop strings and stop %s", p->n_stop,
                         p->stop ? "given" : "NULL");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) /* "" is found at once: every generation would end on its first token */
            return toy_error(TOY_ERR_INVALID_ARG, "stop string %d is %s", i, p->stop[i] ? "empty" : "NULL");
    if (n_prompt >= g->kv.n_ctx)
        return toy_error(TOY_ERR_RANGE, "prompt of %lld tokens does not fit the context of %lld",
                         (long long)n_prompt, (long long)g->kv.n_ctx);
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return toy_error(TOY_ERR_RANGE, "prompt token %lld is id %d, vocabulary has %lld", (long long)i,
                             prompt[i], (long long)V);
    enum toy_status pst = toy_sampler_params_check(&p->sampling);
    if (pst) return pst;
    if (p->grammar && !g->tok) return toy_error(TOY_ERR_INVALID_ARG, "a JSON grammar needs the model's tokenizer");
    float *logits = malloc((size_t)V * sizeof(float));
    float *masked = p->grammar ? malloc((size_t)V * sizeof(float)) : NULL;
    struct toy_sampler *s = toy_sampler_new(&p->sampling, V);
    struct toy_json_matcher *jm = NULL;
    struct toy_decoder *dec = NULL;
    struct gen_text text = {0};
    enum toy_status st = TOY_OK;
    if (!logits || !s || (p->grammar && !masked)) { st = toy_error(TOY_ERR_NOMEM, "generate"); goto done; }
    if (p->grammar && (st = toy_json_matcher_new(p->grammar, &jm))) goto done;
    if (g->tok && (st = toy_decoder_init(g->tok, p->keep_special ? 0 : TOY_DECODE_SKIP_SPECIAL, &dec))) goto done;
    if (dec) toy_decoder_continue(dec, prompt, n_prompt); /* the text goes on from the prompt's */
    for (int64_t i = 0; i < n_prompt; i++) toy_sampler_accept(s, prompt[i]);
    double t0 = now_s();
    /* what the cache holds from the last call and this prompt starts with stays (a chat's earlier turns); at
     * least the last prompt token runs, for its logits */
    int64_t keep = 0;
    while (p->reuse_cache && keep < g->n_cache && keep < n_prompt - 1 && g->cache_ids[keep] == prompt[keep]) keep++;
    g->n_cache = 0; /* until this prefill is done */
    r.n_cached = keep;
    if ((st = prefill(g, prompt + keep, n_prompt - keep, keep, logits))) goto done;
    memcpy(g->cache_ids, prompt, (size_t)n_prompt * sizeof *prompt);
    g->n_cache = n_prompt;
    if ((st = toy_graph_plan(g->dg, &g->buf, NULL))) goto done;
    r.prefill_s = now_s() - t0;
    t0 = now_s();
    int64_t pos = n_prompt;
    size_t max_stop = 0;
    for (int i = 0; i < p->n_stop; i++) max_stop = strlen(p->stop[i]) > max_stop ? strlen(p->stop[i]) : max_stop;
    r.reason = TOY_STOP_LENGTH;
    const float *cur = logits; /* the prompt's, then each step's output */
    for (;;) {
        float lp;
        const float *from = cur;
        if (jm) { /* only what the grammar takes next */
            memcpy(masked, cur, (size_t)V * sizeof(float));
            toy_json_matcher_mask(jm, g->tok, masked, V);
            from = masked;
        }
        int32_t id = toy_sampler_sample(s, from, &lp);
        toy_sampler_accept(s, id);
        if (jm) toy_json_matcher_take(jm, g->tok, id);
        r.n_generated++;
        bool eog = g->tok && toy_tokenizer_is_eog(g->tok, id) && !p->ignore_eos;
        if (eog) { r.reason = TOY_STOP_EOS; fn ? (void)fn(ud, id, "", 0, lp) : (void)0; break; }
        const char *piece = "";
        size_t plen = 0;
        if (dec) toy_decoder_push(dec, id, &piece, &plen);
        /* text so far, to find stop strings; emit all but a stop-sized tail */
        if ((st = gen_text_add(&text, piece, plen))) goto done;
        const char *first = gen_text_stop(&text, p->stop, p->n_stop, max_stop);
        if (first) {
            size_t upto = (size_t)(first - text.s);
            if (fn && upto > text.emitted) fn(ud, id, text.s + text.emitted, upto - text.emitted, lp);
            text.emitted = upto;
            r.reason = TOY_STOP_STRING;
            break;
        }
        /* hold back what could still become a stop string, on a UTF-8 boundary */
        size_t hold = max_stop ? max_stop - 1 : 0;
        size_t safe = text.len > hold ? text.len - hold : 0;
        while (safe > text.emitted && safe < text.len && ((unsigned char)text.s[safe] & 0xC0) == 0x80) safe--;
        if (fn) {
            bool go = fn(ud, id, text.s + text.emitted, safe > text.emitted ? safe - text.emitted : 0, lp);
            if (safe > text.emitted) text.emitted = safe;
            if (!go) { r.reason = TOY_STOP_CALLER; break; }
        }
        if (p->n_predict > 0 && r.n_generated >= p->n_predict) break;
        if (pos + 1 >= g->kv.n_ctx) { r.reason = TOY_STOP_CONTEXT; break; }
        *(int32_t *)g->dtok->data = id;
        *(int32_t *)g->dpos->data = (int32_t)pos;
        *(int32_t *)g->kv.n_past->data = (int32_t)pos;
        double td = g->trace ? toy_trace_now(g->trace) : 0;
        g->n_cache = pos; /* the step writes position pos */
        if ((st = toy_graph_compute(g->dg, g->tp))) goto done;
        g->cache_ids[pos] = id;
        g->n_cache = pos + 1;
        if (g->trace) toy_trace_span(g->trace, "decode", "phase", td, toy_trace_now(g->trace), 0);
        cur = g->dlogits->data; /* read before the next step writes it */
        pos++;
    }
    if (r.reason != TOY_STOP_STRING && (st = gen_text_flush(&text, dec))) goto done;
    if (fn && r.reason != TOY_STOP_STRING && text.emitted < text.len)
        fn(ud, -1, text.s + text.emitted, text.len - text.emitted, 0);
    r.decode_s = now_s() - t0;
done:
    if (res) *res = r;
    free(text.s);
    toy_decoder_free(dec);
    toy_sampler_free(s);
    toy_json_matcher_free(jm);
    free(masked);
    free(logits);
    return st;
}
