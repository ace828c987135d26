/* sampler.c: the sampling pipeline of toy/sampler.h. Candidates are kept as
 * (id, logit) pairs; sorting happens only when top-k/top-p/min-p need it,
 * and top-k uses a partial selection first so large vocabularies stay
 * cheap. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "toy/rng.h"
#include "toy/sampler.h"

struct cand {
    int32_t id;
    float v;
};

struct toy_sampler {
    struct toy_sampler_params p;
    int64_t V;
    struct toy_rng rng;
    struct cand *c;        /* V */
    int32_t *hist;         /* ring of recent tokens */
    int64_t hist_cap, hist_n, hist_at;
    int32_t *count;        /* V: occurrences in the window */
};

enum toy_status toy_sampler_params_check(const struct toy_sampler_params *p) {
    const struct {
        const char *name;
        float v, lo, hi;
    } f[] = {
        {"temperature", p->temperature, -INFINITY, INFINITY},
        {"top_p", p->top_p, 0, INFINITY},
        {"min_p", p->min_p, 0, 1},
        {"repeat_penalty", p->repeat_penalty, -INFINITY, INFINITY},
        {"frequency_penalty", p->frequency_penalty, -INFINITY, INFINITY},
        {"presence_penalty", p->presence_penalty, -INFINITY, INFINITY},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!isfinite(f[i].v) || f[i].v < f[i].lo || f[i].v > f[i].hi)
            return toy_error(TOY_ERR_INVALID_ARG, "sampling: %s is %g, not a finite number in [%g, %g]", f[i].name,
                             (double)f[i].v, (double)f[i].lo, (double)f[i].hi);
    if (p->top_k < 0) return toy_error(TOY_ERR_INVALID_ARG, "sampling: top_k is %d, not >= 0", (int)p->top_k);
    if (p->penalty_last_n < -1)
        return toy_error(TOY_ERR_INVALID_ARG, "sampling: penalty_last_n is %d (a count, 0: 64, -1: all)",
                         (int)p->penalty_last_n);
    return TOY_OK;
}

struct toy_sampler *toy_sampler_new(const struct toy_sampler_params *p, int64_t V) {
    if (V <= 0) return NULL;
    struct toy_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->V = V;
    s->hist_cap = p->penalty_last_n == 0 ? 64 : p->penalty_last_n < 0 ? (1 << 20) : p->penalty_last_n;
    s->c = malloc((size_t)V * sizeof *s->c);
    s->hist = malloc((size_t)s->hist_cap * sizeof *s->hist);
    s->count = calloc((size_t)V, sizeof *s->count);
    if (!s->c || !s->hist || !s->count) {
        toy_sampler_free(s);
        return NULL;
    }
    toy_rng_seed(&s->rng, p->seed);
    return s;
}

void toy_sampler_free(struct toy_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->hist);
    free(s->count);
    free(s);
}

void toy_sampler_reset(struct toy_sampler *s, uint64_t seed) {
    memset(s->count, 0, (size_t)s->V * sizeof *s->count);
    s->hist_n = s->hist_at = 0;
    toy_rng_seed(&s->rng, seed);
}

void toy_sampler_accept(struct toy_sampler *s, int32_t tok) {
    if (tok < 0 || tok >= s->V) return;
    if (s->hist_n == s->hist_cap) { /* drop the oldest */
        int32_t old = s->hist[s->hist_at];
        s->count[old]--;
    } else {
        s->hist_n++;
    }
    s->hist[s->hist_at] = tok;
    s->hist_at = (s->hist_at + 1) % s->hist_cap;
    s->count[tok]++;
}

static int by_value_desc(const void *a, const void *b) {
    float x = ((const struct cand *)a)->v, y = ((const struct cand *)b)->v;
    if (x > y) return -1;
    if (x < y) return 1;
    return ((const struct cand *)a)->id - ((const struct cand *)b)->id; /* stable: lower id first */
}

/* moves the k largest to the front (unordered): quickselect */
static void select_top(struct cand *c, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = c[(lo + hi) / 2].v;
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (c[i].v > pivot) i++;
            while (c[j].v < pivot) j--;
            if (i <= j) {
                struct cand t = c[i];
                c[i++] = c[j];
                c[j--] = t;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else break;
    }
}

/* Top-p, then min-p (Hugging Face's order), on candidates whose weights
 * (exp of the scaled logits; the best is 1) sum to *sum: sorts the smallest
 * prefix that holds both cut-offs, the `mass` (top_p times the sum) and the
 * min_p floor, and returns its length, with *sum its weight. The prefix is
 * found by sorting the best 128, then 8 times more, ..., so that a top-p of
 * a few hundred tokens does not sort a 50k vocabulary every token. */
static int64_t nucleus(struct cand *c, int64_t n, double mass, float min_p, double *sum) {
    for (int64_t m = n < 128 ? n : 128;; m = m * 8 < n ? m * 8 : n) {
        select_top(c, n, m);
        qsort(c, (size_t)m, sizeof *c, by_value_desc);
        int64_t kp = 0, kmin = 1; /* the top-p set: the smallest whose weight reaches the mass (at least one) */
        double acc = 0;
        while (kp < m && acc < mass) acc += c[kp++].v;
        bool p_found = acc >= mass;
        while (kmin < m && c[kmin].v >= min_p * c[0].v) kmin++; /* then the tokens of min_p times the best's weight */
        bool min_found = kmin < m;
        if (!p_found && !min_found && m < n) continue;
        int64_t keep = kp < kmin ? kp : kmin;
        acc = 0;
        for (int64_t i = 0; i < keep; i++) acc += c[i].v;
        *sum = acc;
        return keep;
    }
}

/* log sum exp(x) with the CPU's vector exp (the vocabulary is ~50k logits
 * a token; libm's exp made this 5% of a decode step), in chunks through a
 * stack buffer; the sampler's log-probability and the top log-probabilities
 * both use it, so the same token gets the same value from both. */
static double log_sum_exp(const float *x, int64_t n) {
    toy_cpu_init();
    float mx = toy_vec.max(x, n), buf[1024];
    double sum = 0;
    for (int64_t i = 0; i < n; i += 1024) sum += toy_vec.exp_sum(buf, x + i, mx, n - i < 1024 ? n - i : 1024);
    return (double)mx + log(sum);
}

static float log_softmax_at(const float *x, int64_t n, int64_t at) { return (float)((double)x[at] - log_sum_exp(x, n)); }

int32_t toy_sampler_sample(struct toy_sampler *s, const float *logits, float *logprob) {
    const struct toy_sampler_params *p = &s->p;
    int64_t V = s->V, n = V;
    bool penal = (p->repeat_penalty > 0 && p->repeat_penalty != 1) || p->frequency_penalty || p->presence_penalty;
    if (p->temperature <= 0 && !(penal && s->hist_n)) { /* greedy on the logits as they are */
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        if (logprob) *logprob = log_softmax_at(logits, V, best);
        return (int32_t)best;
    }
    for (int64_t i = 0; i < V; i++) s->c[i] = (struct cand){(int32_t)i, logits[i]};
    if (penal && s->hist_n) {
        for (int64_t h = 0; h < s->hist_n; h++) {
            int32_t t = s->hist[h];
            if (s->count[t] < 0) continue;
            float v = logits[t];
            if (p->repeat_penalty > 0 && p->repeat_penalty != 1) v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
            v -= p->frequency_penalty * (float)s->count[t] + p->presence_penalty;
            s->c[t].v = v;
            s->count[t] = -s->count[t]; /* mark done (a token may repeat in the history) */
        }
        for (int64_t h = 0; h < s->hist_n; h++)
            if (s->count[s->hist[h]] < 0) s->count[s->hist[h]] = -s->count[s->hist[h]];
    }
    int32_t pick;
    if (p->temperature <= 0) {
        int64_t best = 0;
        for (int64_t i = 1; i < V; i++)
            if (s->c[i].v > s->c[best].v) best = i;
        pick = s->c[best].id;
    } else {
        /* logits relative to the best, then scaled: a tiny temperature sends the others towards -inf (it sent
         * the best to +inf, whose exp is NaN, and the draw to an arbitrary token), so it tends to greedy */
        float top = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(s->c[i].v)) s->c[i].v = -INFINITY;
            if (s->c[i].v > top) top = s->c[i].v;
        }
        for (int64_t i = 0; i < n; i++) s->c[i].v = s->c[i].v == top ? 0 : (s->c[i].v - top) / p->temperature;
        if (p->top_k > 0 && p->top_k < n) {
            select_top(s->c, n, p->top_k);
            n = p->top_k;
        }
        double sum = 0;
        for (int64_t i = 0; i < n; i++) {
            s->c[i].v = expf(s->c[i].v); /* the best is 1 */
            sum += s->c[i].v;
        }
        bool top_p = p->top_p > 0 && p->top_p < 1, min_p = p->min_p > 0;
        if (top_p || min_p) n = nucleus(s->c, n, top_p ? p->top_p * sum : INFINITY, p->min_p, &sum);
        double u = (double)toy_rng_uniform(&s->rng) * sum, acc = 0;
        pick = s->c[n - 1].id;
        for (int64_t i = 0; i < n; i++) {
            acc += s->c[i].v;
            if (acc > u) {
                pick = s->c[i].id;
                break;
            }
        }
    }
    if (logprob) *logprob = log_softmax_at(logits, V, pick);
    return pick;
}

void toy_top_logprobs(const float *logits, int64_t V, int k, int32_t *ids, float *lps) {
    double lse = log_sum_exp(logits, V);
    for (int j = 0; j < k; j++) { ids[j] = -1; lps[j] = -INFINITY; }
    for (int64_t i = 0; i < V; i++) {
        float v = (float)((double)logits[i] - lse);
        if (k <= 0 || v <= lps[k - 1]) continue;
        int j = k - 1;
        while (j > 0 && lps[j - 1] < v) { lps[j] = lps[j - 1]; ids[j] = ids[j - 1]; j--; }
        lps[j] = v;
        ids[j] = (int32_t)i;
    }
}
