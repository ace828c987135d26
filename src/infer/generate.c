/* generate.c: prefill + decode loop over a KV cache (toy/generate.h), for
 * any model family behind toy/model.h's inference functions (Llama, GPT-2).
 * The decode graph (one token) is built once per generator; a prefill graph
 * is built per prompt length and freed after use. Stop strings are matched
 * on the generated text; the text before a stop string is what the callback
 * has seen only if it came before the match (held-back text is dropped). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "infer/gen-text.h"
#include "infer/speculative.h"
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
    /* prompt lookup: the graphs that read 2..MAX_LOOKUP+1 tokens at once (built when first needed), and the
     * graph last planned into buf (the others' places there may be stale) */
    struct verify {
        struct toy_ctx *ctx;
        struct toy_graph *g;
        struct toy_tensor *tok, *pos, *logits;
    } verify[TOY_GENERATE_MAX_LOOKUP + 1];
    struct toy_graph *planned;
};

void toy_generator_set_trace(struct toy_generator *g, struct toy_trace *tr) {
    g->trace = tr;
    toy_graph_set_trace(g->dg, tr);
    for (int i = 0; i <= TOY_GENERATE_MAX_LOOKUP; i++)
        if (g->verify[i].g) toy_graph_set_trace(g->verify[i].g, tr);
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
    for (int i = 0; i <= TOY_GENERATE_MAX_LOOKUP; i++) toy_ctx_free(g->verify[i].ctx);
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

/* runs gr (planned into buf first when another graph was planned there since) */
static enum toy_status run(struct toy_generator *g, struct toy_graph *gr) {
    enum toy_status st = TOY_OK;
    if (g->planned != gr) {
        g->planned = NULL;
        if ((st = toy_graph_plan(gr, &g->buf, NULL))) return st;
        g->planned = gr;
    }
    return toy_graph_compute(gr, g->tp);
}

/* the graph that reads m (2..MAX_LOOKUP+1) tokens at once and gives each one's logits; NULL when it cannot be
 * built (out of memory) */
static struct verify *verify_graph(struct toy_generator *g, int m) {
    struct verify *v = &g->verify[m - 1];
    if (v->g) return v;
    v->ctx = toy_ctx_init(true);
    v->tok = v->ctx ? toy_new_tensor_2d(v->ctx, TOY_I32, m, 1) : NULL;
    v->pos = v->ctx ? toy_new_tensor_1d(v->ctx, TOY_I32, m) : NULL;
    v->logits = v->tok && v->pos ? g->lm.forward_cached(g->lm.self, v->ctx, &g->kv, v->tok, v->pos, false) : NULL;
    if (!v->logits) {
        toy_ctx_free(v->ctx);
        memset(v, 0, sizeof *v);
        return NULL;
    }
    toy_set_output(v->logits);
    v->g = toy_graph_new(v->ctx);
    toy_graph_build(v->g, v->logits);
    toy_graph_set_fusion(v->g, true);
    toy_graph_set_trace(v->g, g->trace);
    return v;
}

/* Drafts up to k_max tokens to follow h[0..n): what followed the latest earlier place of h's last 4, 3 or 2
 * tokens, copied on past h's end as an overlapping copy does (what follows the place is, from there on, the
 * draft itself: a text that repeats a stretch of its own goes on repeating it). Returns how many (0: no such
 * place). */
int toy_lookup_draft(const int32_t *h, int64_t n, int k_max, int32_t *out) {
    for (int ng = 4; ng >= 2; ng--) {
        if (n <= ng) continue;
        const int32_t *tail = h + n - ng;
        for (int64_t s = n - ng - 1; s >= 0; s--) {
            if (h[s] != tail[0] || memcmp(h + s, tail, (size_t)ng * sizeof *h)) continue;
            int c = 0;
            for (int64_t from = s + ng; c < k_max; c++) out[c] = from + c < n ? h[from + c] : out[from + c - n];
            return c;
        }
    }
    return 0;
}

/* the sizes may differ by padding rows no text uses, as a family's small and large models' often do */
enum toy_status toy_draft_vocab_check(const struct toy_tokenizer *t, int64_t V, const struct toy_tokenizer *td,
                                      int64_t Vd) {
    if ((V > Vd ? V - Vd : Vd - V) > 256)
        return toy_error(TOY_ERR_INVALID_ARG, "the draft model's vocabulary has %lld tokens, the model's %lld",
                         (long long)Vd, (long long)V);
    if (!t || !td) return TOY_OK;
    int64_t n = toy_tokenizer_n_vocab(t), nd = toy_tokenizer_n_vocab(td);
    for (int64_t i = 0; i < n && i < nd; i++) {
        const char *a = toy_tokenizer_piece(t, (int32_t)i), *b = toy_tokenizer_piece(td, (int32_t)i);
        if (strcmp(a ? a : "", b ? b : ""))
            return toy_error(TOY_ERR_INVALID_ARG, "the draft model's vocabulary is not the model's: token %lld is "
                             "'%.40s' there and '%.40s' here", (long long)i, b ? b : "", a ? a : "");
    }
    return TOY_OK;
}

enum toy_status toy_generator_check_draft(const struct toy_generator *g, const struct toy_generator *d) {
    if (!g || !d) return toy_error(TOY_ERR_INVALID_ARG, "toy_generator_check_draft: NULL generator");
    if (d == g) return toy_error(TOY_ERR_INVALID_ARG, "the draft generator is the generator itself (a draft needs a cache of its own)");
    return toy_draft_vocab_check(g->tok, g->lm.vocab, d->tok, d->lm.vocab);
}

int32_t toy_draft_pick(const float *lg, int64_t Vd, int64_t V, float p_min) {
    int64_t best = 0, n = Vd < V ? Vd : V;
    for (int64_t i = 1; i < n; i++)
        if (lg[i] > lg[best]) best = i;
    if (p_min > 0) { /* the softmax's largest probability (over the draft's whole vocabulary) under p_min? */
        /* its sum of exp(l - max) past 1 / p_min; logits 20 below the best are left out (each under 2e-9: a 150k
         * vocabulary of them moves the sum by 3e-4), so a sure token costs compares, not exps */
        float sum = 0, limit = 1.0f / p_min, top = lg[best];
        for (int64_t i = 0; i < Vd && sum <= limit; i++)
            if (lg[i] > top - 20.0f) sum += expf(lg[i] - top);
        if (sum > limit) return -1;
    }
    return (int32_t)best;
}

/* Makes the draft generator d's cache hold h[0..n) (keeping what it holds of it; at least h[n-1] runs) and points
 * *lg at the logits after h[n-1] (buf: room for d's vocabulary, used after a long stretch) */
static enum toy_status draft_sync(struct toy_generator *d, const int32_t *h, int64_t n, float *buf, const float **lg,
                                  struct toy_generate_result *r) {
    int64_t c = 0;
    while (c < d->n_cache && c < n - 1 && d->cache_ids[c] == h[c]) c++;
    int64_t m = n - c;
    d->n_cache = c; /* until the pass is done */
    double t0 = now_s(), td = d->trace ? toy_trace_now(d->trace) : 0;
    enum toy_status st;
    if (m == 1) {
        *(int32_t *)d->dtok->data = h[c];
        *(int32_t *)d->dpos->data = (int32_t)c;
        *(int32_t *)d->kv.n_past->data = (int32_t)c;
        st = run(d, d->dg);
        *lg = d->dlogits->data;
    } else if (m <= TOY_GENERATE_MAX_LOOKUP + 1) { /* a few tokens kept since the last draft */
        struct verify *v = verify_graph(d, (int)m);
        if (!v) return toy_error(TOY_ERR_NOMEM, "generate: the draft model's graph of %d tokens", (int)m);
        for (int64_t i = 0; i < m; i++) ((int32_t *)v->tok->data)[i] = h[c + i], ((int32_t *)v->pos->data)[i] = (int32_t)(c + i);
        *(int32_t *)d->kv.n_past->data = (int32_t)c;
        st = run(d, v->g);
        *lg = (const float *)v->logits->data + (size_t)(m - 1) * (size_t)d->lm.vocab;
    } else { /* the prompt */
        d->planned = NULL;
        st = prefill(d, h + c, m, c, buf);
        *lg = buf;
    }
    if (st) return st;
    memcpy(d->cache_ids + c, h + c, (size_t)m * sizeof *h);
    d->n_cache = n;
    r->n_draft_steps++;
    r->draft_s += now_s() - t0;
    if (d->trace) toy_trace_span(d->trace, "draft", "phase", td, toy_trace_now(d->trace), 0);
    return TOY_OK;
}

/* Up to k_max tokens the draft model d writes greedily after h[0..n) into out (and h[n..]), stopping before one it
 * gives less than p_min; ids at or past V (the model's vocabulary) are never drafted. *k: how many. */
static enum toy_status draft_tokens(struct toy_generator *d, int32_t *h, int64_t n, int k_max, float p_min, int64_t V,
                                    float *buf, int32_t *out, int *k, struct toy_generate_result *r) {
    *k = 0;
    while (*k < k_max) {
        const float *lg;
        enum toy_status st = draft_sync(d, h, n + *k, buf, &lg, r);
        if (st) return st;
        int32_t best = toy_draft_pick(lg, d->lm.vocab, V, p_min);
        if (best < 0) break;
        out[*k] = h[n + *k] = best;
        ++*k;
    }
    return TOY_OK;
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
    struct toy_generator *d = p->draft;
    if (d) {
        if ((pst = toy_generator_check_draft(g, d))) return pst;
        if (p->draft_max < 0 || p->draft_max > TOY_GENERATE_MAX_LOOKUP)
            return toy_error(TOY_ERR_RANGE, "draft_max %d is not 0..%d", p->draft_max, TOY_GENERATE_MAX_LOOKUP);
        if (!(p->draft_p_min >= 0 && p->draft_p_min <= 1))
            return toy_error(TOY_ERR_RANGE, "draft_p_min %g is not a probability", (double)p->draft_p_min);
    }
    int draft_max = !d ? 0 : p->draft_max ? p->draft_max : TOY_GENERATE_DRAFT_MAX;
    float *logits = malloc((size_t)V * sizeof(float));
    float *masked = p->grammar ? malloc((size_t)V * sizeof(float)) : NULL;
    float *dbuf = d ? malloc((size_t)d->lm.vocab * sizeof(float)) : NULL;
    struct toy_sampler *s = toy_sampler_new(&p->sampling, V);
    struct toy_json_matcher *jm = NULL;
    struct toy_decoder *dec = NULL;
    struct gen_text text = {0};
    enum toy_status st = TOY_OK;
    if (!logits || !s || (p->grammar && !masked) || (d && !dbuf)) { st = toy_error(TOY_ERR_NOMEM, "generate"); goto done; }
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
    g->planned = NULL; /* the prefill plans its own graph into buf */
    if ((st = prefill(g, prompt + keep, n_prompt - keep, keep, logits))) goto done;
    memcpy(g->cache_ids, prompt, (size_t)n_prompt * sizeof *prompt);
    g->n_cache = n_prompt;
    if (d) { /* the draft model reads the prompt too (what its cache holds of it stays, as the model's does) */
        const float *unused;
        if (!p->reuse_cache) d->n_cache = 0;
        if (n_prompt < d->kv.n_ctx && (st = draft_sync(d, prompt, n_prompt, dbuf, &unused, &r))) goto done;
    }
    r.prefill_s = now_s() - t0;
    t0 = now_s();
    size_t max_stop = 0;
    for (int i = 0; i < p->n_stop; i++) max_stop = strlen(p->stop[i]) > max_stop ? strlen(p->stop[i]) : max_stop;
    int lookup = p->lookup < 0 ? 0 : p->lookup > TOY_GENERATE_MAX_LOOKUP ? TOY_GENERATE_MAX_LOOKUP : p->lookup;
    r.reason = TOY_STOP_LENGTH;
    /* rows[i] (of n_rows) are the logits for the token at position base + i: the prompt's last, then each
     * pass's; a pass reads fed[0..n_rows) at positions base - 1.., fed[0] the token sampled last and the rest
     * a draft, which holds as far as each sampled token is the drafted one */
    const float *rows = logits;
    int n_rows = 1;
    int64_t base = n_prompt;
    int32_t fed[TOY_GENERATE_MAX_LOOKUP + 1];
    struct toy_draft_pace pace;
    toy_draft_pace_init(&pace, d && draft_max > lookup ? draft_max : lookup);
    bool ran_model = false; /* the draft model ran for the last pass's draft */
    for (;;) {
        int32_t id = -1;
        int64_t at = base; /* the position of id */
        bool stop = false;
        const int64_t accepted0 = r.n_accepted;
        for (int i = 0; i < n_rows && !stop; i++) {
            float lp;
            const float *from = rows + (size_t)i * (size_t)V;
            if (jm) { /* only what the grammar takes next */
                memcpy(masked, from, (size_t)V * sizeof(float));
                toy_json_matcher_mask(jm, g->tok, masked, V);
                from = masked;
            }
            id = toy_sampler_sample(s, from, &lp);
            at = base + i;
            toy_sampler_accept(s, id);
            if (jm) toy_json_matcher_take(jm, g->tok, id);
            r.n_generated++;
            bool eog = g->tok && toy_tokenizer_is_eog(g->tok, id) && !p->ignore_eos;
            if (eog) { r.reason = TOY_STOP_EOS; fn ? (void)fn(ud, id, "", 0, lp) : (void)0; stop = true; break; }
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
                stop = true;
                break;
            }
            /* hold back what could still become a stop string, on a UTF-8 boundary */
            size_t hold = max_stop ? max_stop - 1 : 0;
            size_t safe = text.len > hold ? text.len - hold : 0;
            while (safe > text.emitted && safe < text.len && ((unsigned char)text.s[safe] & 0xC0) == 0x80) safe--;
            if (fn) {
                bool go = fn(ud, id, text.s + text.emitted, safe > text.emitted ? safe - text.emitted : 0, lp);
                if (safe > text.emitted) text.emitted = safe;
                if (!go) { r.reason = TOY_STOP_CALLER; stop = true; break; }
            }
            if (p->n_predict > 0 && r.n_generated >= p->n_predict) { stop = true; break; }
            if (i + 1 < n_rows && id == fed[i + 1]) r.n_accepted++; /* drafted: the pass has read it already */
            else break;
        }
        g->n_cache = at; /* the cache holds what came before id (a draft past it is dropped) */
        if (stop) break;
        toy_draft_pace_done(&pace, ran_model, n_rows - 1, (int)(r.n_accepted - accepted0));
        ran_model = false;
        if (at + 1 >= g->kv.n_ctx) { r.reason = TOY_STOP_CONTEXT; break; }
        /* the next pass: id, and a draft of what may follow it when one is found and there is room */
        fed[0] = id;
        int k = 0;
        int64_t room = g->kv.n_ctx - 2 - at,
                left = p->n_predict > 0 ? p->n_predict - r.n_generated - 1 : TOY_GENERATE_MAX_LOOKUP;
        int cap = (int)(room < left ? room : left), pc = lookup || d ? toy_draft_pace_next(&pace) : 0;
        if (cap > pc) cap = pc;
        if (cap > 0) {
            g->cache_ids[at] = id;
            if (lookup) k = toy_lookup_draft(g->cache_ids, at + 1, lookup < cap ? lookup : cap, fed + 1);
            int64_t droom = d ? d->kv.n_ctx - at : 0; /* the draft's last pass reads at + k - 1 */
            int dk = draft_max < cap ? draft_max : cap;
            if (dk > droom) dk = (int)droom;
            if (!k && dk > 0) {
                ran_model = true;
                if ((st = draft_tokens(d, g->cache_ids, at + 1, dk, p->draft_p_min, V, dbuf, fed + 1, &k, &r))) goto done;
            }
            r.n_drafted += k;
        }
        double td = g->trace ? toy_trace_now(g->trace) : 0;
        const struct toy_tensor *out;
        if (k == 0) { /* one token: the decode graph */
            *(int32_t *)g->dtok->data = id;
            *(int32_t *)g->dpos->data = (int32_t)at;
            *(int32_t *)g->kv.n_past->data = (int32_t)at;
            if ((st = run(g, g->dg))) goto done;
            out = g->dlogits;
        } else {
            struct verify *v = verify_graph(g, k + 1);
            if (!v) { st = toy_error(TOY_ERR_NOMEM, "generate: the graph of a %d-token lookup pass", k + 1); goto done; }
            for (int i = 0; i <= k; i++) ((int32_t *)v->tok->data)[i] = fed[i], ((int32_t *)v->pos->data)[i] = (int32_t)(at + i);
            *(int32_t *)g->kv.n_past->data = (int32_t)at;
            if ((st = run(g, v->g))) goto done;
            out = v->logits;
        }
        memcpy(g->cache_ids + at, fed, (size_t)(k + 1) * sizeof *fed);
        g->n_cache = at + k + 1;
        r.n_steps++;
        if (g->trace) toy_trace_span(g->trace, k ? "verify" : "decode", "phase", td, toy_trace_now(g->trace), 0);
        rows = out->data; /* read before the next pass writes it */
        n_rows = k + 1;
        base = at + 1;
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
    free(dbuf);
    free(logits);
    return st;
}
