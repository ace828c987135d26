/* serve-engine.c: the generation engine of `toy serve`: a bounded queue of
 * jobs, n_slots KV-cache slots, and one thread that runs them with
 * continuous batching.
 *
 * Each loop of the engine thread:
 *   1. admits queued jobs in order: a generation job while a slot is free
 *      (the free slot whose cached tokens share the longest prefix with its
 *      prompt: prefix cache; ties and misses go to the least recently used
 *      slot), which will prefill only the rest; an embedding job when none
 *      is running;
 *   2. computes one input of the embedding job, or one chunk (at most
 *      SRV_PREFILL_CHUNK tokens, through a KV cache of its own) of a longer
 *      one, so that the streams move on between chunks;
 *   3. prefills one chunk (at most SRV_PREFILL_CHUNK tokens) of the oldest
 *      prompt still prefilling; when a prompt is complete, its first token
 *      is sampled. Chunks interleave with decode steps, so a long prompt
 *      delays the running streams by one chunk per step, not by its whole
 *      prefill;
 *   4. runs one decode step for every decoding slot together: one graph over
 *      the B sequences (serve-forward.c), rebuilt only when the set of
 *      decoding slots changes;
 *   5. samples each sequence's next token with its own sampler, emits text,
 *      and retires finished, cancelled or timed-out jobs, freeing their slot.
 *
 * Invariants: a slot's cache_ids[0..n_cache) are the tokens whose keys and
 * values sit at positions 0..n_cache-1 of its cache; a failed compute
 * clears n_cache. Only this thread touches the model, the slots and the
 * thread pool. Output is appended to a job under job->mu; the HTTP side
 * reads it. Text is held back while it could still become a stop string
 * (the same rule as src/infer/generate.c), and emitted on UTF-8 boundaries.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend-impl.h"
#include "infer/speculative.h"
#include "serve/serve-internal.h"
#include "toy/device.h"
#include "toy/graph.h"
#include "toy/threadpool.h"

#define SRV_PREFILL_CHUNK 256
#define SRV_LOOKUP_MAX TOY_GENERATE_MAX_LOOKUP /* drafted tokens per slot and step */
#define SRV_LOOKUP_ROWS 16                     /* rows of a step with drafts, in all */
#define SRV_STEP_GRAPHS 8                      /* decode step graphs kept, for each model */
#define SRV_DRAFT_MAX 8                        /* a draft model's drafts by default */
#define SRV_PRED_MAX 8                         /* a prediction's drafts at most, where --lookup/--draft-max allow fewer */
#define SRV_DRAFT_SYNC 4                       /* tokens a draft cache takes in a step's pass; more: a prefill */

const double toy_srv_buckets[12] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

double toy_srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct srv_job *toy_srv_job_new(enum srv_job_kind kind) {
    struct srv_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    j->kind = kind;
    j->stop_hit = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, false);
    atomic_init(&j->refs, 1);
    return j;
}

void toy_srv_job_unref(struct srv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1) return;
    free(j->prompt);
    free(j->pred);
    free(j->bias_id);
    free(j->bias);
    toy_json_grammar_free(j->grammar);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    for (int i = 0; i < j->n_inputs; i++) free(j->inputs[i]);
    free(j->inputs);
    free(j->n_input);
    free(j->toks);
    free(j->ptoks);
    free(j->text);
    free(j->embeddings);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

struct slot {
    struct toy_kv_cache kv;       /* n_seq 1, its own n_past */
    int32_t *cache_ids;           /* (n_ctx) tokens in the cache */
    int64_t n_cache;
    struct srv_job *job;          /* NULL: free */
    struct toy_sampler *smp;
    struct toy_decoder *dec;
    struct toy_json_matcher *jm;  /* the job's grammar: where the reply is in it */
    bool jm_on;                   /* the grammar applies (its job's grammar_after texts have come) */
    char *gen;                    /* generated text so far (for stop strings) */
    size_t gen_len, gen_cap, emitted, max_stop;
    size_t gen_chars;             /* characters in gen (for logprobs' text_offset) */
    struct srv_token *pend;       /* tokens whose text is still held back (text_off: their first byte in gen) */
    int n_pend, cap_pend;
    double deadline;              /* toy_srv_now() by which the job must end; 0: none */
    int32_t last;                 /* the token to feed next */
    int64_t pos;                  /* its position */
    int64_t n_gen;
    int64_t pf;                   /* prompt tokens in the cache so far */
    struct toy_draft_pace pace;   /* how long its next draft may be, and whether to draft at all */
    bool ran_model;               /* this step's draft model ran for it */
    bool from_pred;               /* this step's draft is the job's prediction's */
    bool pred_on;                 /* the reply follows the prediction: its next token is pred[pred_at] */
    int64_t pred_at;
    struct toy_kv_cache dkv;      /* the draft model's cache (--draft) */
    int32_t *dcache_ids;          /* (its n_ctx) the tokens in it */
    int64_t dn_cache;
    bool prefilling;              /* pf < the prompt's length */
    uint64_t order;               /* admission order (prefill FIFO) */
    uint64_t stamp;               /* last use, for LRU */
};

/* a decode step's graph: slots idx[0..n), slot idx[b] reading rows [off[b], off[b+1]) (its last token, then its
 * draft), each row's logits out */
struct step_graph {
    struct toy_ctx *ctx;          /* NULL: none built */
    struct toy_graph *g;
    struct toy_tensor *tok, *pos, *logits; /* {R, 1}, {R}, {vocab, R, 1} */
    int *idx, n;
    int64_t *off;                 /* (n_slots + 1) */
    uint64_t used;                /* the step that last ran it (LRU) */
};

/* the graphs of one model's decode steps, kept for the batches (the slots and their row counts) of the latest
 * steps and all planned in buf (a graph takes ~0.4 ms to build and plan, a tenth of a step) */
struct step_set {
    const struct srv_model *m;
    bool draft;                   /* through the slots' draft caches */
    struct toy_kv_cache pool;     /* the slots' caches, slot i's sequence i of it (toy_kv_cache_view_seq) */
    bool rows;                    /* steps of several slots read it whole (toy_attention_rows: the CPU's) */
    int64_t row_group;
    struct step_graph g[SRV_STEP_GRAPHS];
    uint64_t n_runs;
    struct toy_membuf buf;
};

struct srv_engine {
    const struct srv_model *m;
    const struct toy_tokenizer *tok;
    struct toy_threadpool *tp;
    struct srv_metrics *met;
    int n_slots;
    int64_t n_ctx, vocab;
    bool prefix_cache;
    struct slot *slots;
    uint64_t clock;
    float *logits;                /* (vocab) */

    /* the decode steps' graphs: one token per slot, or with drafts (which come and go from step to step) the
     * slot's token and its draft; and the draft model's */
    struct step_set steps, dsteps;
    struct toy_membuf pbuf;       /* prefill and embedding graphs */
    int lookup;                   /* prompt lookup's drafts: at most this many tokens per slot and step (0: none) */
    const struct srv_model *dm;   /* the draft model (NULL: none) */
    int64_t dn_ctx;               /* its caches' positions */
    int model_max;                /* the draft model's drafts: at most this many tokens (0: no model) */
    int draft_max;                /* the longest draft of either */
    float draft_p_min;
    int32_t *drafts;              /* (n_slots x SRV_LOOKUP_MAX): this step's, by batch index */

    /* the embedding job running (one at a time): an input longer than a chunk goes through its own KV cache
     * one chunk per loop, as a prompt's prefill does, so the streams move on between chunks */
    struct {
        struct srv_job *job;
        int input;                /* the input being computed */
        int64_t off;              /* its tokens done */
        double *sum;              /* (d) final-norm hidden states summed over those */
        float *out;               /* (n_inputs x d) */
        struct toy_kv_cache kv;   /* 1 sequence; held for the job's longest input when one is over a chunk */
        bool has_kv;
    } emb;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct srv_job **q;           /* ring of q_cap = q_max + n_slots */
    int q_cap, q_max, q_head, q_len, n_running;
    bool stopping;
    pthread_t th;
    bool started;
};

/* ---- output ------------------------------------------------------------------------ */

static void job_fail(struct srv_job *j, enum toy_status st, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->err = st ? st : TOY_ERR_STATE;
    snprintf(j->errmsg, sizeof j->errmsg, "%s", msg && *msg ? msg : toy_status_str(j->err));
    j->done = true;
    j->t_end = toy_srv_now();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

/* appends a token record with text[0..n) (under j->mu); char_off and eog as in struct srv_token */
static bool job_push(struct srv_job *j, int32_t id, float lp, const char *text, size_t n, size_t char_off, bool eog,
                     int n_top, const int32_t *top_id, const float *top_lp) {
    bool ok = true;
    pthread_mutex_lock(&j->mu);
    if (j->n_toks == j->cap_toks) {
        int64_t cap = j->cap_toks ? j->cap_toks * 2 : 64;
        struct srv_token *nt = realloc(j->toks, (size_t)cap * sizeof *nt);
        if (nt) j->toks = nt, j->cap_toks = cap;
        else ok = false;
    }
    if (ok && j->text_len + n + 1 > j->text_cap) {
        size_t cap = (j->text_len + n + 1) * 2;
        char *nt = realloc(j->text, cap);
        if (nt) j->text = nt, j->text_cap = cap;
        else ok = false;
    }
    if (ok) {
        struct srv_token *t = &j->toks[j->n_toks++];
        t->id = id;
        t->logprob = lp;
        t->text_off = j->text_len;
        t->text_len = n;
        t->char_off = char_off;
        t->eog = eog;
        t->n_top = n_top;
        for (int i = 0; i < n_top; i++) t->top_id[i] = top_id[i], t->top_lp[i] = top_lp[i];
        memcpy(j->text + j->text_len, text, n);
        j->text_len += n;
        j->text[j->text_len] = 0;
        if (id >= 0) j->n_generated++;
        if (id >= 0 && j->t_first == 0) j->t_first = toy_srv_now();
        /* a whole answer's reader waits for the end only: woken a token, its thread would take a core from the
         * decode's threads for nothing */
        if (j->streamed) pthread_cond_broadcast(&j->cv);
    }
    pthread_mutex_unlock(&j->mu);
    return ok;
}

/* Tokens wait in the slot while their text is held back (it may yet be a stop string's start): a token's record,
 * with its logprob, goes out with its text, so a stop string that cuts the text also drops the tokens that start at
 * or after the cut (as llama.cpp does), in a stream as in a whole answer. */
static bool pend_add(struct slot *s, int32_t id, float lp, size_t byte_off, size_t char_off, int n_top,
                     const int32_t *top_id, const float *top_lp) {
    if (s->n_pend == s->cap_pend) {
        int cap = s->cap_pend ? 2 * s->cap_pend : 16;
        struct srv_token *np = realloc(s->pend, (size_t)cap * sizeof *np);
        if (!np) return false;
        s->pend = np, s->cap_pend = cap;
    }
    struct srv_token *t = &s->pend[s->n_pend++];
    *t = (struct srv_token){.id = id, .logprob = lp, .text_off = byte_off, .char_off = char_off, .n_top = n_top};
    for (int i = 0; i < n_top; i++) t->top_id[i] = top_id[i], t->top_lp[i] = top_lp[i];
    return true;
}

/* releases the text up to byte upto of gen, with the waiting tokens that start before it (all: every one), each
 * with its own bytes; then, with drop, forgets the tokens still waiting (a stop string cut them off) */
static void pend_release(struct slot *s, struct srv_job *j, size_t upto, bool all, bool drop) {
    int k = 0;
    while (k < s->n_pend && (all || s->pend[k].text_off < upto)) k++;
    for (int i = 0; i < k; i++) {
        const struct srv_token *t = &s->pend[i];
        size_t end = i + 1 < k && s->pend[i + 1].text_off < upto ? s->pend[i + 1].text_off : upto;
        if (end < s->emitted) end = s->emitted;
        job_push(j, t->id, t->logprob, s->gen + s->emitted, end - s->emitted, t->char_off, false, t->n_top, t->top_id,
                 t->top_lp);
        s->emitted = end;
    }
    if (upto > s->emitted) { /* the rest of a token already out */
        job_push(j, -1, 0, s->gen + s->emitted, upto - s->emitted, s->gen_chars, false, 0, NULL, NULL);
        s->emitted = upto;
    }
    if (drop && s->n_pend > k) { /* not listed, but generated: usage counts them */
        pthread_mutex_lock(&j->mu);
        j->n_generated += s->n_pend - k;
        if (j->t_first == 0) j->t_first = toy_srv_now();
        pthread_mutex_unlock(&j->mu);
    }
    s->n_pend = drop ? 0 : s->n_pend - k;
    if (!drop && k) memmove(s->pend, s->pend + k, (size_t)s->n_pend * sizeof *s->pend);
}

static void hist_add(int64_t *b, double v) {
    for (int i = 0; i < 12; i++)
        if (v <= toy_srv_buckets[i]) b[i]++;
}

/* ends the slot's job: flushes held text (not after a stop string), wakes the reader, frees the slot */
static void slot_finish(struct srv_engine *e, struct slot *s, enum toy_stop_reason reason) {
    struct srv_job *j = s->job;
    if (reason != TOY_STOP_STRING) pend_release(s, j, s->gen_len, true, true);
    s->n_pend = 0;
    if (reason != TOY_STOP_STRING && s->dec) {
        const char *t;
        size_t n;
        toy_decoder_flush(s->dec, &t, &n);
        if (n) job_push(j, -1, 0, t, n, s->gen_chars, false, 0, NULL, NULL);
    }
    pthread_mutex_lock(&j->mu);
    j->reason = reason;
    j->done = true;
    j->t_end = toy_srv_now();
    double ttft = j->t_first > 0 ? j->t_first - j->t_submit : -1, lat = j->t_end - j->t_submit;
    int64_t ngen = j->n_generated;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    struct srv_metrics *met = e->met;
    atomic_fetch_add(&met->jobs_done, 1);
    if (reason == TOY_STOP_CALLER) atomic_fetch_add(&met->jobs_cancelled, 1);
    atomic_fetch_add(&met->completion_tokens, ngen);
    pthread_mutex_lock(&met->mu);
    if (ttft >= 0) met->ttft_sum += ttft, met->ttft_count++, hist_add(met->ttft_buckets, ttft);
    met->latency_sum += lat, met->latency_count++, hist_add(met->latency_buckets, lat);
    pthread_mutex_unlock(&met->mu);
    toy_sampler_free(s->smp);
    toy_decoder_free(s->dec);
    toy_json_matcher_free(s->jm);
    s->smp = NULL;
    s->dec = NULL;
    s->jm = NULL;
    s->job = NULL;
    s->prefilling = false;
    s->stamp = ++e->clock;
    toy_srv_job_unref(j);
    pthread_mutex_lock(&e->mu);
    e->n_running--;
    atomic_store(&met->active, e->n_running);
    pthread_mutex_unlock(&e->mu);
}

/* Samples from logits (vocab; logit_bias is added in place) for slot s, emits, and says whether the job is over. */
/* the grammar's turn: it starts once the texts it waits for were generated (a reasoning block, gpt-oss's final
 * channel), from what follows them; then every token whose text it does not take is masked out */
static void grammar_mask(struct srv_engine *e, struct slot *s, float *logits) {
    struct srv_job *j = s->job;
    if (!s->jm_on) {
        const char *p = s->gen;
        for (int k = 0; k < 2 && p && j->grammar_after[k]; k++)
            if ((p = strstr(p, j->grammar_after[k]))) p += strlen(j->grammar_after[k]);
        if (!p) return;
        s->jm_on = true;
        toy_json_matcher_feed(s->jm, p, strlen(p)); /* what came with the last marker; if not JSON, JSON starts here */
    }
    toy_json_matcher_mask(s->jm, e->tok, logits, e->vocab);
}

static bool slot_step(struct srv_engine *e, struct slot *s, float *logits) {
    struct srv_job *j = s->job;
    for (int i = 0; i < j->n_bias; i++) logits[j->bias_id[i]] += j->bias[i];
    if (s->jm) grammar_mask(e, s, logits);
    /* the token's log-probability only where it is sent or ranks a choice: a pass over the vocabulary, ~13 us
     * of a 49152-token one; with top_logprobs their pass gives it */
    float lp = 0;
    int32_t id = toy_sampler_sample(s->smp, logits, j->want_logprob && !j->top_logprobs ? &lp : NULL);
    if (s->jm_on) toy_json_matcher_take(s->jm, e->tok, id);
    toy_sampler_accept(s->smp, id);
    s->n_gen++;
    int n_top = 0;
    int32_t top_id[SRV_MAX_TOP_LOGPROBS];
    float top_lp[SRV_MAX_TOP_LOGPROBS];
    if (j->top_logprobs > 0) {
        n_top = j->top_logprobs < e->vocab ? j->top_logprobs : (int)e->vocab;
        lp = (float)((double)logits[id] - toy_top_logprobs(logits, e->vocab, n_top, top_id, top_lp));
    }
    if (e->tok && !j->ignore_eos && toy_tokenizer_is_eog(e->tok, id)) {
        pend_release(s, j, s->gen_len, true, true); /* the text so far, then the end */
        job_push(j, id, lp, "", 0, s->gen_chars, true, n_top, top_id, top_lp);
        slot_finish(e, s, TOY_STOP_EOS);
        return true;
    }
    const char *piece = "";
    size_t plen = 0;
    if (s->dec) toy_decoder_push(s->dec, id, &piece, &plen);
    if (s->gen_len + plen + 1 > s->gen_cap) {
        size_t cap = (s->gen_len + plen + 1) * 2;
        char *ng = realloc(s->gen, cap);
        if (!ng) {
            job_fail(j, TOY_ERR_NOMEM, "out of memory");
            slot_finish(e, s, TOY_STOP_CALLER);
            return true;
        }
        s->gen = ng, s->gen_cap = cap;
    }
    size_t char_off = s->gen_chars;
    if (!pend_add(s, id, lp, s->gen_len, char_off, n_top, top_id, top_lp)) {
        job_fail(j, TOY_ERR_NOMEM, "out of memory");
        slot_finish(e, s, TOY_STOP_CALLER);
        return true;
    }
    memcpy(s->gen + s->gen_len, piece, plen);
    s->gen_len += plen;
    s->gen[s->gen_len] = 0;
    s->gen_chars += toy_utf8_chars(piece, plen);
    size_t from = s->emitted > s->max_stop ? s->emitted - s->max_stop : 0;
    const char *hit = NULL;
    for (int i = 0; i < j->n_stop; i++) {
        const char *h = strstr(s->gen + from, j->stop[i]);
        if (h && (!hit || h < hit)) hit = h, j->stop_hit = i;
    }
    if (hit) {
        size_t upto = (size_t)(hit - s->gen);
        pend_release(s, j, upto > s->emitted ? upto : s->emitted, false, true);
        slot_finish(e, s, TOY_STOP_STRING);
        return true;
    }
    size_t hold = s->max_stop ? s->max_stop - 1 : 0;
    size_t safe = s->gen_len > hold ? s->gen_len - hold : 0;
    while (safe > s->emitted && safe < s->gen_len && ((unsigned char)s->gen[safe] & 0xC0) == 0x80) safe--;
    if (safe < s->emitted) safe = s->emitted;
    pend_release(s, j, safe, false, false);
    s->last = id;
    if (j->max_tokens >= 0 && s->n_gen >= j->max_tokens) { slot_finish(e, s, TOY_STOP_LENGTH); return true; }
    /* the token just sampled is the sequence's (pos + 1)-th; prompt + completion stay within the context */
    if (s->pos + 1 >= e->n_ctx) { slot_finish(e, s, TOY_STOP_CONTEXT); return true; }
    return false;
}

/* Predicted Outputs, after a token: tok, the slot's next token, keeps the reply on its prediction or takes it off */
static void pred_follow(struct slot *s, int32_t tok) {
    if (!s->pred_on) return;
    if (s->pred_at < s->job->n_pred && s->job->pred[s->pred_at] == tok) s->pred_at++;
    else s->pred_on = false;
}

/* ---- prefill and embeddings ------------------------------------------------------------------ */

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = 0;
    while (n < na && n < nb && a[n] == b[n]) n++;
    return n;
}

/* One forward pass of tokens[0..n) at positions off.., its output (out: a {vocab} or {d} vector, or n x vocab
 * logits for SRV_OUT_LOGITS_ALL) into dst: through
 * cache kv (which then holds positions 0..off) when given, else in one graph over the tokens (off 0). The prompt
 * prefill's and the embeddings' graph, planned in e->pbuf. */
static enum toy_status forward_into(struct srv_engine *e, const struct srv_model *m, const int32_t *tokens, int64_t n,
                                    int64_t off, struct toy_kv_cache *kv, enum srv_out out, float *dst, int64_t n_dst) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    if (!ctx) return toy_error(TOY_ERR_NOMEM, "forward pass");
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, n, 1), *pos = toy_new_tensor_1d(ctx, TOY_I32, n);
    memcpy(tok->data, tokens, (size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) ((int32_t *)pos->data)[i] = (int32_t)(off + i);
    int64_t rg = out != SRV_OUT_LOGITS_LAST && out != SRV_OUT_LOGITS_ALL ? 0
                 : m == e->dm                                          ? e->dsteps.row_group
                                                                       : e->steps.row_group;
    const struct srv_seqs sq = {.caches = &kv, .n = 1};
    struct toy_tensor *y = toy_srv_forward(ctx, m, tok, pos, kv ? &sq : NULL, out, rg);
    toy_set_output(y);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    if (kv) *(int32_t *)kv->n_past->data = (int32_t)off;
    enum toy_status st = toy_graph_plan(g, &e->pbuf, NULL);
    if (!st) st = toy_graph_compute(g, e->tp);
    if (!st) memcpy(dst, y->data, (size_t)n_dst * sizeof(float));
    toy_ctx_free(ctx);
    return st;
}

/* The prompt scored (echo with logprobs): prompt[from..to) through slot s's cache with every position's logits,
 * each scoring the prompt token after it (into j->ptoks: its log-probability and the top alternatives the request
 * asks for), the last one's logits into e->logits when it ends the prompt. */
static enum toy_status score_prompt(struct srv_engine *e, struct slot *s, int64_t from, int64_t to) {
    struct srv_job *j = s->job;
    const int64_t n = to - from, V = e->vocab;
    float *lg = malloc((size_t)n * (size_t)V * sizeof *lg);
    if (!j->ptoks) j->ptoks = calloc((size_t)j->n_prompt, sizeof *j->ptoks);
    if (!lg || !j->ptoks) {
        free(lg);
        return toy_error(TOY_ERR_NOMEM, "prompt log-probabilities (%lld x %lld logits)", (long long)n, (long long)V);
    }
    enum toy_status st = forward_into(e, e->m, j->prompt + from, n, from, &s->kv, SRV_OUT_LOGITS_ALL, lg, n * V);
    for (int64_t i = 0; !st && i < n; i++) {
        const float *row = lg + (size_t)i * (size_t)V;
        int64_t p = from + i + 1; /* the token these logits predict */
        if (p == j->n_prompt) {
            memcpy(e->logits, row, (size_t)V * sizeof(float));
            continue;
        }
        struct srv_token *t = &j->ptoks[p];
        t->id = j->prompt[p];
        t->n_top = j->top_logprobs < V ? j->top_logprobs : (int)V;
        t->logprob = t->n_top > 0 ? (float)((double)row[t->id] - toy_top_logprobs(row, V, t->n_top, t->top_id, t->top_lp))
                                  : toy_logprob(row, V, t->id);
    }
    if (!st && from == 0) j->ptoks[0] = (struct srv_token){.id = j->prompt[0]};
    free(lg);
    return st;
}

/* prefills prompt[keep..n) into slot s at positions keep.. (its cache already holds prompt[0..keep)), logits
 * of the last into e->logits */
static enum toy_status prefill(struct srv_engine *e, struct slot *s, const int32_t *prompt, int64_t n, int64_t keep) {
    s->n_cache = 0; /* until the compute succeeds */
    enum toy_status st = s->job->score_prompt
                             ? score_prompt(e, s, keep, n)
                             : forward_into(e, e->m, prompt + keep, n - keep, keep, &s->kv, SRV_OUT_LOGITS_LAST,
                                            e->logits, e->vocab);
    if (!st) {
        memcpy(s->cache_ids + keep, prompt + keep, (size_t)(n - keep) * sizeof(int32_t));
        s->n_cache = n;
    }
    return st;
}

static void embed_end(struct srv_engine *e) {
    free(e->emb.sum);
    free(e->emb.out);
    if (e->emb.has_kv) toy_kv_cache_free(&e->emb.kv);
    toy_srv_job_unref(e->emb.job);
    memset(&e->emb, 0, sizeof e->emb);
}

static void embed_fail(struct srv_engine *e, enum toy_status st, const char *msg) {
    job_fail(e->emb.job, st, msg);
    embed_end(e);
}

/* takes embedding job j (the engine's one) */
static void embed_start(struct srv_engine *e, struct srv_job *j) {
    int64_t d = e->m->d_model, longest = 0;
    e->emb.job = j;
    for (int i = 0; i < j->n_inputs; i++)
        if (j->n_input[i] > longest) longest = j->n_input[i];
    e->emb.out = malloc((size_t)(j->n_inputs > 0 ? j->n_inputs : 1) * (size_t)d * sizeof(float));
    e->emb.sum = calloc((size_t)d, sizeof(double));
    if (!e->emb.out || !e->emb.sum) { embed_fail(e, TOY_ERR_NOMEM, "out of memory"); return; }
    if (longest > SRV_PREFILL_CHUNK && !e->m->bert) { /* an encoder takes each input whole */
        enum toy_status st = toy_srv_cache_init(e->m, &e->emb.kv, longest, 1, TOY_F32);
        if (st) { embed_fail(e, st, toy_last_error()); return; }
        e->emb.has_kv = true;
    }
}

/* one step of the running embedding job: a whole input of at most a chunk, or the next chunk of a longer one */
static void embed_step(struct srv_engine *e) {
    struct srv_job *j = e->emb.job;
    if (!j) return;
    if (atomic_load(&j->cancel)) { /* the client went away: the rest would be computed for nobody */
        atomic_fetch_add(&e->met->jobs_cancelled, 1);
        embed_fail(e, TOY_ERR_INTERRUPTED, "cancelled");
        return;
    }
    int64_t d = e->m->d_model;
    if (e->emb.input < j->n_inputs) {
        int i = e->emb.input;
        int64_t n = j->n_input[i], off = e->emb.off;
        float *row = e->emb.out + (size_t)i * (size_t)d;
        bool whole = n <= SRV_PREFILL_CHUNK || e->m->bert; /* in one graph, without a cache (an encoder's
                                                               * positions all see each other: always) */
        int64_t end = whole || n - off <= SRV_PREFILL_CHUNK ? n : off + SRV_PREFILL_CHUNK;
        /* the final-norm hidden states of the chunk: averaged, or its first or last position's */
        enum toy_pooling pool = e->m->pooling;
        enum srv_out out = pool == TOY_POOLING_CLS ? SRV_OUT_FIRST_HIDDEN
                           : pool == TOY_POOLING_LAST ? SRV_OUT_LAST_HIDDEN
                                                      : SRV_OUT_MEAN_HIDDEN;
        enum toy_status st = forward_into(e, e->m, j->inputs[i] + off, end - off, off, whole ? NULL : &e->emb.kv, out, row, d);
        if (st) { embed_fail(e, st, toy_last_error()); return; }
        atomic_fetch_add(&e->met->embed_tokens, end - off);
        if (!whole && out == SRV_OUT_MEAN_HIDDEN) { /* the chunk's mean, weighted by its length; the input's mean
                                                     * once it is all done */
            for (int64_t k = 0; k < d; k++) e->emb.sum[k] += (double)row[k] * (double)(end - off);
            if (end == n)
                for (int64_t k = 0; k < d; k++) row[k] = (float)(e->emb.sum[k] / (double)n), e->emb.sum[k] = 0;
        }
        /* the first position's state is known after the first chunk (attention is causal): the rest would not
         * change it; the last position's is the last chunk's */
        if (out == SRV_OUT_FIRST_HIDDEN) end = n;
        e->emb.off = end;
        if (end < n) return;
        e->emb.input++;
        e->emb.off = 0;
        if (e->emb.input < j->n_inputs) return;
    }
    pthread_mutex_lock(&j->mu);
    j->embeddings = e->emb.out;
    e->emb.out = NULL;
    j->dim = d;
    j->done = true;
    j->t_end = toy_srv_now();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_add(&e->met->jobs_done, 1);
    embed_end(e);
}

/* takes slot s for job j; prefill_step then fills in what the cache lacks */
static void slot_start(struct srv_engine *e, struct slot *s, struct srv_job *j) {
    int64_t lcp = e->prefix_cache ? common_prefix(s->cache_ids, s->n_cache, j->prompt, j->n_prompt) : 0;
    int64_t keep = lcp < j->n_prompt ? lcp : j->n_prompt - 1; /* at least one token runs, for its logits */
    if (j->score_prompt) keep = 0; /* every prompt position's logits */
    s->job = j;
    s->gen_len = s->emitted = s->gen_chars = 0;
    s->n_pend = 0;
    s->n_gen = 0;
    s->deadline = j->timeout_s > 0 ? toy_srv_now() + j->timeout_s : 0;
    s->max_stop = 0;
    for (int i = 0; i < j->n_stop; i++)
        if (strlen(j->stop[i]) > s->max_stop) s->max_stop = strlen(j->stop[i]);
    s->smp = toy_sampler_new(&j->sp, e->vocab);
    s->jm_on = false;
    if (j->grammar && e->tok && !toy_json_matcher_new(j->grammar, &s->jm)) s->jm_on = !j->grammar_after[0];
    if (e->tok && !toy_decoder_init(e->tok, j->keep_special ? 0 : TOY_DECODE_SKIP_SPECIAL, &s->dec) && j->continues)
        toy_decoder_continue(s->dec, j->prompt, j->n_prompt);
    pthread_mutex_lock(&j->mu);
    j->t_start = toy_srv_now();
    j->n_cached = keep;
    pthread_mutex_unlock(&j->mu);
    atomic_fetch_add(&e->met->prompt_tokens, j->n_prompt);
    atomic_fetch_add(&e->met->cached_tokens, keep);
    if (!s->smp || (j->grammar && !s->jm)) {
        job_fail(j, TOY_ERR_NOMEM, "out of memory (sampler)");
        slot_finish(e, s, TOY_STOP_CALLER);
        return;
    }
    toy_draft_pace_init(&s->pace, j->n_pred && e->draft_max < SRV_PRED_MAX ? SRV_PRED_MAX : e->draft_max);
    s->ran_model = s->from_pred = false;
    s->pred_on = true; /* a reply starts where its prediction does, until a token says otherwise */
    s->pred_at = 0;
    s->n_cache = keep; /* what the prefix cache keeps; the rest is overwritten */
    s->pf = keep;
    s->prefilling = true;
    s->order = ++e->clock;
    if (j->max_tokens == 0 && !j->score_prompt) slot_finish(e, s, TOY_STOP_LENGTH); /* nothing to run */
}

/* a job that has been cancelled or ran out of time ends here (true) */
static bool slot_expired(struct srv_engine *e, struct slot *s, double now) {
    struct srv_job *j = s->job;
    bool late = s->deadline > 0 && now > s->deadline;
    if (!late && !atomic_load(&j->cancel)) return false;
    if (late) {
        pthread_mutex_lock(&j->mu);
        j->timed_out = true;
        pthread_mutex_unlock(&j->mu);
    }
    slot_finish(e, s, TOY_STOP_CALLER);
    return true;
}

/* one chunk of the oldest prompt still prefilling; its first token when the prompt is complete */
static void prefill_step(struct srv_engine *e) {
    struct slot *s = NULL;
    for (int i = 0; i < e->n_slots; i++) {
        struct slot *c = &e->slots[i];
        if (c->job && c->prefilling && (!s || c->order < s->order)) s = c;
    }
    if (!s || slot_expired(e, s, toy_srv_now())) return;
    struct srv_job *j = s->job;
    /* a scored prompt in smaller chunks: every position's logits are kept (64 x 128k floats: 32 MiB) */
    const int64_t chunk = j->score_prompt ? SRV_PREFILL_CHUNK / 4 : SRV_PREFILL_CHUNK;
    int64_t end = j->n_prompt - s->pf > chunk ? s->pf + chunk : j->n_prompt;
    enum toy_status st = prefill(e, s, j->prompt, end, s->pf);
    if (st) {
        job_fail(j, st, toy_last_error());
        slot_finish(e, s, TOY_STOP_CALLER);
        return;
    }
    s->pf = end;
    if (end < j->n_prompt) return;
    s->prefilling = false;
    if (j->score_prompt) { /* the prompt's scores, whole, before any token */
        pthread_mutex_lock(&j->mu);
        j->n_ptoks = j->n_prompt;
        pthread_mutex_unlock(&j->mu);
        if (j->max_tokens == 0) {
            slot_finish(e, s, TOY_STOP_LENGTH);
            return;
        }
    }
    for (int64_t i = 0; i < j->n_prompt; i++) toy_sampler_accept(s->smp, j->prompt[i]);
    s->pos = j->n_prompt;
    if (!slot_step(e, s, e->logits)) pred_follow(s, s->last);
}

/* ---- the decode step -------------------------------------------------------------------------- */

/* set's graph of a step over slots idx[0..n) reading rows off[0..n] into *out: a kept one, else built in place of
 * the one least recently run */
static enum toy_status step_graph(struct srv_engine *e, struct step_set *set, const int *idx, int n, const int64_t *off,
                                  struct step_graph **out) {
    struct step_graph *sg = &set->g[0];
    for (int i = 0; i < SRV_STEP_GRAPHS; i++) {
        struct step_graph *c = &set->g[i];
        if (c->ctx && c->n == n && !memcmp(idx, c->idx, (size_t)n * sizeof *idx) &&
            !memcmp(off, c->off, (size_t)(n + 1) * sizeof *off)) {
            c->used = ++set->n_runs;
            *out = c;
            return TOY_OK;
        }
        if (c->used < sg->used) sg = c;
    }
    toy_ctx_free(sg->ctx);
    sg->ctx = NULL;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_kv_cache **caches = malloc((size_t)n * sizeof *caches);
    if (!ctx || !caches) {
        toy_ctx_free(ctx);
        free(caches);
        return toy_error(TOY_ERR_NOMEM, "decode graph");
    }
    for (int b = 0; b < n; b++) caches[b] = set->draft ? &e->slots[idx[b]].dkv : &e->slots[idx[b]].kv;
    struct toy_tensor *seq = toy_new_tensor_1d(ctx, TOY_I32, off[n]); /* each row's slot: its sequence in the pool */
    for (int b = 0; b < n; b++)
        for (int64_t r = off[b]; r < off[b + 1]; r++) ((int32_t *)seq->data)[r] = idx[b];
    const struct srv_seqs sq = {.caches = caches, .off = off, .n = n, .pool = set->rows ? &set->pool : NULL, .seq = seq};
    sg->tok = toy_new_tensor_2d(ctx, TOY_I32, off[n], 1);
    sg->pos = toy_new_tensor_1d(ctx, TOY_I32, off[n]);
    sg->logits = toy_srv_forward(ctx, set->m, sg->tok, sg->pos, &sq, SRV_OUT_LOGITS_ALL, set->row_group);
    free(caches);
    toy_set_output(sg->logits);
    sg->g = toy_graph_new(ctx);
    toy_graph_build(sg->g, sg->logits);
    toy_graph_set_fusion(sg->g, true);
    enum toy_status st = toy_graph_plan(sg->g, &set->buf, NULL);
    if (st) {
        toy_ctx_free(ctx);
        return st;
    }
    sg->ctx = ctx;
    memcpy(sg->idx, idx, (size_t)n * sizeof *idx);
    memcpy(sg->off, off, (size_t)(n + 1) * sizeof *off);
    sg->n = n;
    sg->used = ++set->n_runs;
    *out = sg;
    return TOY_OK;
}

/* The draft model's drafts for slots idx[0..n): up to give[b] tokens for each slot b with one, written greedily
 * and stopping before a token it gives less than draft_p_min, into e->drafts; got[b]: how many. Each slot's draft
 * cache first takes what its text holds that the cache lacks (a prefill for a new prompt, else the token or two
 * the last step kept), then the slots draft a token a pass, together. A failed pass leaves the slots it ran
 * without drafts, and their draft caches empty: the step runs as it would without. */
static void model_drafts(struct srv_engine *e, const int *idx, int n, const int *give, int *got) {
    int act[n], na = 0;                /* the slots still drafting, by batch index */
    int32_t feed[n][SRV_DRAFT_SYNC];    /* what each feeds next */
    int64_t nfeed[n], at[n], off[n + 1];
    for (int b = 0; b < n; b++) {
        got[b] = 0;
        if (give[b] <= 0) continue;
        struct slot *s = &e->slots[idx[b]];
        const int32_t *h = s->cache_ids; /* the text, h[pos] the token to feed */
        int64_t nh = s->pos + 1, c = 0;
        if (nh + give[b] > e->dn_ctx) continue; /* past the draft model's context */
        while (c < s->dn_cache && c < nh - 1 && s->dcache_ids[c] == h[c]) c++;
        s->dn_cache = c;
        /* a long stretch (a new prompt) goes in chunks through the prefill graph, its logits unused */
        while (nh - 1 - c > SRV_DRAFT_SYNC - 1) {
            int64_t m = nh - 1 - c > SRV_PREFILL_CHUNK ? SRV_PREFILL_CHUNK : nh - 1 - c;
            if (forward_into(e, e->dm, h + c, m, c, &s->dkv, SRV_OUT_LOGITS_LAST, e->logits, 1)) break;
            memcpy(s->dcache_ids + c, h + c, (size_t)m * sizeof *h);
            s->dn_cache = c += m;
        }
        if (nh - 1 - c > SRV_DRAFT_SYNC - 1) continue; /* failed: no draft */
        nfeed[b] = nh - c;
        memcpy(feed[b], h + c, (size_t)nfeed[b] * sizeof *h);
        at[b] = c;
        act[na++] = b;
    }
    while (na > 0) {
        int sidx[na];
        off[0] = 0;
        for (int a = 0; a < na; a++) sidx[a] = idx[act[a]], off[a + 1] = off[a] + nfeed[act[a]];
        struct step_graph *sg = NULL;
        enum toy_status st = step_graph(e, &e->dsteps, sidx, na, off, &sg);
        if (!st) {
            int32_t *tok = sg->tok->data, *pos = sg->pos->data;
            for (int a = 0; a < na; a++) {
                int b = act[a];
                struct slot *s = &e->slots[idx[b]];
                for (int64_t i = 0; i < nfeed[b]; i++) tok[off[a] + i] = feed[b][i], pos[off[a] + i] = (int32_t)(at[b] + i);
                *(int32_t *)s->dkv.n_past->data = (int32_t)at[b];
            }
            st = toy_graph_compute(sg->g, e->tp);
        }
        int still = 0;
        for (int a = 0; a < na; a++) {
            int b = act[a];
            struct slot *s = &e->slots[idx[b]];
            if (st) { /* the cache may hold anything from at[b] on */
                s->dn_cache = 0;
                got[b] = 0;
                continue;
            }
            memcpy(s->dcache_ids + at[b], feed[b], (size_t)nfeed[b] * sizeof(int32_t));
            s->dn_cache = at[b] += nfeed[b];
            const float *lg = (const float *)sg->logits->data + (size_t)(off[a + 1] - 1) * (size_t)e->dm->vocab;
            int32_t id = toy_draft_pick(lg, e->dm->vocab, e->vocab, e->draft_p_min);
            if (id < 0) continue;
            e->drafts[b * SRV_LOOKUP_MAX + got[b]++] = id;
            if (got[b] == give[b]) continue; /* its last token is fed at the next step, if kept */
            feed[b][0] = id;
            nfeed[b] = 1;
            act[still++] = b;
        }
        na = still;
    }
}

/* Predicted Outputs: up to k_max tokens of slot s's prediction to follow its text h[0..n): from where the reply
 * follows it, else from after the first place at or past the last one (else the latest before) where the text's
 * last 4, 3 or 2 tokens occur in it, which the reply then follows. Returns how many. */
static int pred_draft(struct slot *s, const int32_t *h, int64_t n, int k_max, int32_t *out) {
    const int32_t *p = s->job->pred;
    const int64_t np = s->job->n_pred;
    for (int ng = 4; !s->pred_on && ng >= 2; ng--) {
        if (n < ng) continue;
        int64_t after = -1;
        for (int64_t i = 0; i + ng <= np; i++)
            if (!memcmp(p + i, h + n - ng, (size_t)ng * sizeof *p)) {
                after = i + ng;
                if (after >= s->pred_at) break;
            }
        if (after >= 0) s->pred_on = true, s->pred_at = after;
    }
    int k = 0;
    while (s->pred_on && k < k_max && s->pred_at + k < np) out[k] = p[s->pred_at + k], k++;
    return k;
}

/* The drafts of the decoding slots idx[0..n) into e->drafts, and each slot's rows (its last token and its draft)
 * into off: its job's prediction's where the reply follows it, else prompt lookup's where it finds one, else the
 * draft model's. Drafts stop short of the context's end
 * and of the job's max_tokens, and all the rows of a step are at most SRV_LOOKUP_ROWS (a pass of more rows costs
 * more than it tends to save): they are dealt a token at a time round the slots. Returns the tokens drafted. */
static int draft_step(struct srv_engine *e, const int *idx, int n, int64_t *off) {
    int want[n], give[n], got[n], left = SRV_LOOKUP_ROWS - n, drafted = 0;
    bool model[n], any_model = false;
    for (int b = 0; b < n; b++) {
        struct slot *s = &e->slots[idx[b]];
        int64_t cap = e->n_ctx - 1 - s->pos; /* the draft's positions stay inside the context */
        if (s->job->max_tokens >= 0 && cap > s->job->max_tokens - s->n_gen - 1) cap = s->job->max_tokens - s->n_gen - 1;
        int pace = toy_draft_pace_next(&s->pace);
        if (cap > pace) cap = pace;
        s->cache_ids[s->pos] = s->last;
        int32_t *out = e->drafts + b * SRV_LOOKUP_MAX;
        want[b] = cap > 0 && left > 0 && s->job->n_pred ? pred_draft(s, s->cache_ids, s->pos + 1, (int)cap, out) : 0;
        s->from_pred = want[b] > 0;
        if (!want[b] && cap > 0 && left > 0 && e->lookup)
            want[b] = toy_lookup_draft(s->cache_ids, s->pos + 1, (int)(cap < e->lookup ? cap : e->lookup), out);
        model[b] = !want[b] && cap > 0 && left > 0 && e->dm;
        if (model[b]) want[b] = (int)(cap < e->model_max ? cap : e->model_max), any_model = true;
        give[b] = 0;
    }
    for (bool more = true; more && left > 0;) {
        more = false;
        for (int b = 0; b < n && left > 0; b++)
            if (give[b] < want[b]) give[b]++, left--, more = true;
    }
    if (any_model) {
        int mgive[n];
        for (int b = 0; b < n; b++) mgive[b] = model[b] ? give[b] : 0;
        model_drafts(e, idx, n, mgive, got);
        for (int b = 0; b < n; b++)
            if (model[b]) e->slots[idx[b]].ran_model = give[b] > 0, give[b] = got[b];
    }
    off[0] = 0;
    for (int b = 0; b < n; b++) off[b + 1] = off[b] + 1 + give[b], drafted += give[b];
    return drafted;
}

static void decode_step(struct srv_engine *e) {
    int idx[e->n_slots], n = 0;
    double now = toy_srv_now();
    for (int i = 0; i < e->n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (!s->job || slot_expired(e, s, now) || s->prefilling) continue;
        idx[n++] = i;
    }
    if (!n) return;
    int64_t off[n + 1];
    int drafted = draft_step(e, idx, n, off);
    struct step_graph *sg = NULL;
    enum toy_status st = step_graph(e, &e->steps, idx, n, off, &sg);
    double t0 = toy_srv_now();
    if (!st) {
        int32_t *tok = sg->tok->data, *pos = sg->pos->data;
        for (int b = 0; b < n; b++) {
            struct slot *s = &e->slots[idx[b]];
            for (int64_t r = off[b]; r < off[b + 1]; r++) {
                int64_t i = r - off[b];
                tok[r] = i ? e->drafts[b * SRV_LOOKUP_MAX + i - 1] : s->last;
                pos[r] = (int32_t)(s->pos + i);
                s->cache_ids[s->pos + i] = tok[r];
            }
            *(int32_t *)s->kv.n_past->data = (int32_t)s->pos;
            s->n_cache = s->pos + (off[b + 1] - off[b]);
        }
        st = toy_graph_compute(sg->g, e->tp);
    }
    double dt = toy_srv_now() - t0;
    if (st) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", toy_last_error());
        for (int b = 0; b < n; b++) {
            struct slot *s = &e->slots[idx[b]];
            s->n_cache = 0;
            job_fail(s->job, st, msg);
            slot_finish(e, s, TOY_STOP_CALLER);
        }
        return;
    }
    /* each slot samples from its rows in turn while the token it samples is its draft's next: the text is the one
     * decoding a token a step gives, and the slot's cache keeps the positions of the tokens kept */
    int64_t made = 0, accepted = 0;
    for (int b = 0; b < n; b++) {
        struct slot *s = &e->slots[idx[b]];
        const int32_t *draft = e->drafts + b * SRV_LOOKUP_MAX;
        int64_t k = off[b + 1] - off[b] - 1, kept = 0;
        /* a draft counts as refused until a token keeps it: the job may end at any token */
        if (k) {
            pthread_mutex_lock(&s->job->mu);
            s->job->n_drafted += k;
            if (s->from_pred) s->job->pred_rejected += k;
            pthread_mutex_unlock(&s->job->mu);
        }
        for (int64_t r = off[b];; r++) {
            s->pos++;
            made++;
            if (slot_step(e, s, (float *)sg->logits->data + (size_t)r * (size_t)e->vocab)) break;
            pred_follow(s, s->last);
            if (r - off[b] == k || s->last != draft[r - off[b]]) break;
            kept++;
            pthread_mutex_lock(&s->job->mu);
            s->job->n_draft_kept++;
            if (s->from_pred) s->job->pred_accepted++, s->job->pred_rejected--;
            pthread_mutex_unlock(&s->job->mu);
        }
        s->n_cache = s->pos;
        accepted += kept;
        toy_draft_pace_done(&s->pace, s->ran_model, (int)k, (int)kept); /* the next draft's length, or none */
        s->ran_model = false;
    }
    struct srv_metrics *met = e->met;
    atomic_fetch_add(&met->decode_steps, 1);
    atomic_fetch_add(&met->decode_rows, n);
    atomic_fetch_add(&met->draft_tokens, drafted);
    atomic_fetch_add(&met->draft_accepted, accepted);
    pthread_mutex_lock(&met->mu);
    met->decode_s += dt;
    double rate = dt > 0 ? made / dt : 0;
    met->tokens_per_s = met->tokens_per_s > 0 ? 0.9 * met->tokens_per_s + 0.1 * rate : rate;
    pthread_mutex_unlock(&met->mu);
}

/* ---- the engine thread --------------------------------------------------------------------------- */

static struct slot *pick_slot(struct srv_engine *e, const struct srv_job *j) {
    struct slot *best = NULL;
    int64_t best_lcp = -1;
    for (int i = 0; i < e->n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (s->job) continue;
        int64_t lcp = e->prefix_cache ? common_prefix(s->cache_ids, s->n_cache, j->prompt, j->n_prompt) : 0;
        if (lcp > best_lcp || (lcp == best_lcp && s->stamp < best->stamp)) best = s, best_lcp = lcp;
    }
    return best;
}

/* drops the queued jobs whose client went away, wherever they wait (under e->mu): they would otherwise hold a
 * place in the queue, and their connection, until every job ahead of them got a slot */
static void purge_cancelled(struct srv_engine *e) {
    int kept = 0;
    for (int i = 0; i < e->q_len; i++) {
        struct srv_job *j = e->q[(e->q_head + i) % e->q_cap];
        if (!atomic_load(&j->cancel)) {
            e->q[(e->q_head + kept++) % e->q_cap] = j;
            continue;
        }
        job_fail(j, TOY_ERR_INTERRUPTED, "cancelled");
        atomic_fetch_add(&e->met->jobs_cancelled, 1);
        toy_srv_job_unref(j);
    }
    e->q_len = kept;
    atomic_store(&e->met->queue_depth, e->q_len);
}

static void *engine_main(void *arg) {
    struct srv_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stopping && e->q_len == 0 && e->n_running == 0 && !e->emb.job) pthread_cond_wait(&e->cv, &e->mu);
        if (e->stopping) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        purge_cancelled(e);
        /* admit, in order: generations while a slot is free, an embedding job when none runs */
        while (e->q_len > 0) {
            struct srv_job *j = e->q[e->q_head];
            bool cancelled = atomic_load(&j->cancel);
            struct slot *s = NULL;
            if (!cancelled && j->kind == SRV_JOB_GENERATE && !(s = pick_slot(e, j))) break;
            if (!cancelled && j->kind != SRV_JOB_GENERATE && e->emb.job) break;
            e->q_head = (e->q_head + 1) % e->q_cap;
            e->q_len--;
            atomic_store(&e->met->queue_depth, e->q_len);
            if (s) {
                s->job = j; /* taken now, so pick_slot skips it */
                e->n_running++;
                atomic_store(&e->met->active, e->n_running);
            }
            pthread_mutex_unlock(&e->mu);
            if (cancelled) {
                job_fail(j, TOY_ERR_INTERRUPTED, "cancelled");
                atomic_fetch_add(&e->met->jobs_cancelled, 1);
                toy_srv_job_unref(j);
            } else if (s) {
                slot_start(e, s, j);
            } else {
                embed_start(e, j); /* the engine's reference now: embed_end drops it */
            }
            pthread_mutex_lock(&e->mu);
        }
        pthread_mutex_unlock(&e->mu);
        embed_step(e);
        prefill_step(e);
        decode_step(e);
    }
    /* stopping: whatever still runs or waits ends now, as an error (not a finished completion) */
    if (e->emb.job) embed_fail(e, TOY_ERR_INTERRUPTED, "the server is shutting down");
    for (int i = 0; i < e->n_slots; i++)
        if (e->slots[i].job) {
            struct srv_job *j = e->slots[i].job;
            pthread_mutex_lock(&j->mu);
            j->err = TOY_ERR_INTERRUPTED;
            snprintf(j->errmsg, sizeof j->errmsg, "the server stopped before this generation finished");
            pthread_mutex_unlock(&j->mu);
            atomic_store(&j->cancel, true);
            slot_finish(e, &e->slots[i], TOY_STOP_CALLER);
        }
    pthread_mutex_lock(&e->mu);
    while (e->q_len) {
        struct srv_job *j = e->q[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_cap;
        e->q_len--;
        job_fail(j, TOY_ERR_INTERRUPTED, "the server is shutting down");
        toy_srv_job_unref(j);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------------------------------ */

enum toy_status toy_srv_engine_new(const struct srv_model *m, const struct toy_tokenizer *tok,
                                   const struct srv_engine_opts *o, struct srv_metrics *metrics,
                                   struct srv_engine **out) {
    *out = NULL;
    if (o->n_slots < 1 || o->n_slots > 256 || o->queue_size < 0 || o->queue_size > 1 << 20)
        return toy_error(TOY_ERR_INVALID_ARG, "%d slots, queue %d (slots 1..256, queue 0..1048576)",
                         o->n_slots, o->queue_size);
    if (o->lookup < 0 || o->lookup > SRV_LOOKUP_MAX)
        return toy_error(TOY_ERR_INVALID_ARG, "lookup %d is not 0..%d", o->lookup, SRV_LOOKUP_MAX);
    if (o->draft && (o->draft_max < 0 || o->draft_max > SRV_LOOKUP_MAX || !(o->draft_p_min >= 0 && o->draft_p_min <= 1)))
        return toy_error(TOY_ERR_INVALID_ARG, "draft_max %d (0..%d), draft_p_min %g (0..1)", o->draft_max,
                         SRV_LOOKUP_MAX, (double)o->draft_p_min);
    struct srv_engine *e = calloc(1, sizeof *e);
    if (!e) return toy_error(TOY_ERR_NOMEM, "serve engine");
    e->m = m;
    e->tok = tok;
    e->met = metrics;
    e->n_slots = o->n_slots;
    e->n_ctx = o->n_ctx > 0 && o->n_ctx <= m->max_ctx ? o->n_ctx : m->max_ctx;
    e->vocab = m->vocab;
    e->prefix_cache = o->prefix_cache;
    enum toy_status pst = toy_srv_pack(m); /* before row_group: packed weights need no grouping */
    if (!pst && o->draft) pst = toy_srv_pack(o->draft);
    e->steps.m = m;
    e->steps.row_group = toy_srv_row_group(m);
    e->dm = o->draft;
    e->dsteps.m = o->draft;
    e->dsteps.draft = true;
    e->dsteps.row_group = o->draft ? toy_srv_row_group(o->draft) : 0;
    /* one cache pool and one attention op over the slots' rows where the backend has that op; else (CUDA) each
     * slot's cache is its own and each slot's rows are attended apart */
    e->steps.rows = e->dsteps.rows = toy_backend_default_has(TOY_BACKEND_ROWS_ATTENTION);
    e->dn_ctx = o->draft ? (e->n_ctx < o->draft->max_ctx ? e->n_ctx : o->draft->max_ctx) : 0;
    e->model_max = o->draft ? (o->draft_max ? o->draft_max : SRV_DRAFT_MAX) : 0;
    e->draft_max = e->model_max > o->lookup ? e->model_max : o->lookup;
    e->draft_p_min = o->draft_p_min;
    e->q_max = o->queue_size > 0 ? o->queue_size : 1; /* at least one waits for a slot */
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->slots = calloc((size_t)e->n_slots, sizeof *e->slots);
    e->lookup = o->lookup;
    e->drafts = calloc((size_t)e->n_slots * SRV_LOOKUP_MAX, sizeof *e->drafts);
    bool steps_ok = true;
    for (int i = 0; i < 2 * SRV_STEP_GRAPHS; i++) {
        struct step_graph *sg = i < SRV_STEP_GRAPHS ? &e->steps.g[i] : &e->dsteps.g[i - SRV_STEP_GRAPHS];
        sg->idx = calloc((size_t)e->n_slots, sizeof *sg->idx);
        sg->off = calloc((size_t)e->n_slots + 1, sizeof *sg->off);
        steps_ok = steps_ok && sg->idx && sg->off;
    }
    e->q_cap = e->q_max + e->n_slots; /* the ring also holds jobs about to take a free slot */
    e->q = calloc((size_t)e->q_cap, sizeof *e->q);
    e->logits = malloc((size_t)e->vocab * sizeof(float));
    e->tp = toy_threadpool_new(o->n_threads);
    enum toy_status st = pst ? pst : e->slots && e->drafts && steps_ok && e->q && e->logits && e->tp ? TOY_OK
                                                                                    : toy_error(TOY_ERR_NOMEM, "serve engine");
    const enum toy_dtype kv_type = o->kv_f32 ? TOY_F32 : TOY_F16;
    /* the slots' caches: sequences of one pool for the batched rows' ops, else (a GPU's graphs) each its own */
    const bool rows = e->steps.rows;
    if (!st && m->bert && o->draft) st = toy_error(TOY_ERR_INVALID_ARG, "a BERT encoder only embeds: it takes no draft");
    if (!st && rows && !m->bert) st = toy_srv_cache_init(m, &e->steps.pool, e->n_ctx, e->n_slots, kv_type);
    if (!st && rows && e->dm) st = toy_srv_cache_init(e->dm, &e->dsteps.pool, e->dn_ctx, e->n_slots, kv_type);
    for (int i = 0; i < e->n_slots && !st; i++) {
        struct slot *s = &e->slots[i];
        /* (an encoder embeds, which takes no slot: its slots stay empty, without caches) */
        st = m->bert ? TOY_OK
             : rows  ? toy_kv_cache_view_seq(&s->kv, &e->steps.pool, i)
                     : toy_srv_cache_init(m, &s->kv, e->n_ctx, 1, kv_type);
        if (!st && !(s->cache_ids = malloc((size_t)e->n_ctx * sizeof(int32_t))))
            st = toy_error(TOY_ERR_NOMEM, "KV cache of slot %d", i);
        if (!st && e->dm)
            st = rows ? toy_kv_cache_view_seq(&s->dkv, &e->dsteps.pool, i)
                      : toy_srv_cache_init(e->dm, &s->dkv, e->dn_ctx, 1, kv_type);
        if (!st && e->dm && !(s->dcache_ids = malloc((size_t)e->dn_ctx * sizeof(int32_t))))
            st = toy_error(TOY_ERR_NOMEM, "draft KV cache of slot %d", i);
    }
    if (!st && pthread_create(&e->th, NULL, engine_main, e)) st = toy_error(TOY_ERR_STATE, "cannot start the engine thread");
    if (st) { toy_srv_engine_free(e); return st; }
    e->started = true;
    *out = e;
    return TOY_OK;
}

void toy_srv_engine_stop(struct srv_engine *e) {
    if (!e || !e->started) return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->th, NULL);
    e->started = false;
}

void toy_srv_engine_free(struct srv_engine *e) {
    if (!e) return;
    toy_srv_engine_stop(e);
    for (int i = 0; e->slots && i < e->n_slots; i++) {
        toy_kv_cache_free(&e->slots[i].kv);
        free(e->slots[i].cache_ids);
        toy_kv_cache_free(&e->slots[i].dkv);
        free(e->slots[i].dcache_ids);
        free(e->slots[i].gen);
        free(e->slots[i].pend);
        toy_sampler_free(e->slots[i].smp);
        toy_decoder_free(e->slots[i].dec);
    }
    for (int i = 0; i < 2 * SRV_STEP_GRAPHS; i++) {
        struct step_graph *sg = i < SRV_STEP_GRAPHS ? &e->steps.g[i] : &e->dsteps.g[i - SRV_STEP_GRAPHS];
        toy_ctx_free(sg->ctx);
        free(sg->idx);
        free(sg->off);
    }
    free(e->drafts);
    toy_membuf_free(&e->steps.buf);
    toy_membuf_free(&e->dsteps.buf);
    toy_kv_cache_free(&e->steps.pool); /* after the slots' views of it */
    toy_kv_cache_free(&e->dsteps.pool);
    toy_membuf_free(&e->pbuf);
    toy_threadpool_free(e->tp);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e->slots);
    free(e->q);
    free(e->logits);
    free(e);
}

enum toy_status toy_srv_engine_submit(struct srv_engine *e, struct srv_job *j) {
    pthread_mutex_lock(&e->mu);
    enum toy_status st = TOY_OK;
    if (e->stopping) st = toy_error(TOY_ERR_STATE, "the server is shutting down");
    /* room: the queue plus the slots that are free but not yet taken (the engine admits between steps) */
    else if (e->q_len >= e->q_max + (e->n_slots - e->n_running))
        st = toy_error(TOY_ERR_RANGE, "the request queue is full (%d waiting)", e->q_len);
    if (!st) {
        atomic_fetch_add(&j->refs, 1);
        j->t_submit = toy_srv_now();
        e->q[(e->q_head + e->q_len) % e->q_cap] = j;
        e->q_len++;
        atomic_store(&e->met->queue_depth, e->q_len);
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

int toy_srv_engine_load(struct srv_engine *e) {
    pthread_mutex_lock(&e->mu);
    int n = e->q_len + e->n_running;
    pthread_mutex_unlock(&e->mu);
    return n;
}

int64_t toy_srv_engine_n_ctx(const struct srv_engine *e) { return e->n_ctx; }

size_t toy_srv_engine_kv_bytes(const struct srv_engine *e) {
    size_t n = 0;
    for (int i = 0; i < e->n_slots; i++)
        n += toy_kv_cache_bytes(&e->slots[i].kv) + (e->dm ? toy_kv_cache_bytes(&e->slots[i].dkv) : 0);
    return n;
}
