/* sampler.c: the sampling pipeline of toy/sampler.h. A draw is from the
 * tokens in the order of their weights (the heavier first, of equal
 * weights the lower id), but nothing is sorted over the vocabulary: a small
 * top-k is taken in one pass over the logits, the weights come through the
 * CPU's vector exp, a plain temperature draws straight from them, and the
 * top-p and min-p sets and the drawn token are found by partitions that sum
 * weights (cut_by_mass) over the few candidates that can be kept. */
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

#define BLOCK 256 /* weights summed a block at a time (block_sums) */

struct toy_sampler {
    struct toy_sampler_params p;
    int64_t V;
    struct toy_rng rng;
    struct cand *c;        /* V */
    float *w;              /* V: weights */
    double *bs;            /* V / BLOCK + 1: the sums of their blocks */
    int32_t *hist;         /* ring of recent tokens */
    int64_t hist_cap, hist_n, hist_at;
    int32_t *count;        /* V: occurrences in the window */
};

enum toy_status toy_sampler_params_check(const struct toy_sampler_params *p) {
    if (!p) return TOY_OK; /* the defaults */
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
    static const struct toy_sampler_params defaults = {0};
    if (!p) p = &defaults;
    if (V <= 0) return NULL;
    struct toy_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->p = *p;
    s->V = V;
    s->hist_cap = p->penalty_last_n == 0 ? 64 : p->penalty_last_n < 0 ? (1 << 20) : p->penalty_last_n;
    s->c = malloc((size_t)V * sizeof *s->c);
    s->w = malloc((size_t)V * sizeof *s->w);
    s->bs = malloc((size_t)(V / BLOCK + 1) * sizeof *s->bs);
    s->hist = malloc((size_t)s->hist_cap * sizeof *s->hist);
    s->count = calloc((size_t)V, sizeof *s->count);
    if (!s->c || !s->w || !s->bs || !s->hist || !s->count) {
        toy_sampler_free(s);
        return NULL;
    }
    toy_rng_seed(&s->rng, p->seed);
    return s;
}

void toy_sampler_free(struct toy_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->w);
    free(s->bs);
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

/* The order of a draw: the heavier first, of equal weights the lower id. */
static bool before(struct cand a, struct cand b) { return a.v > b.v || (a.v == b.v && a.id < b.id); }

static void swap_cand(struct cand *c, int64_t i, int64_t j) {
    struct cand t = c[i];
    c[i] = c[j];
    c[j] = t;
}

/* Rearranges c[0, n) so that its first k are, in some order, the first k of the draw's order, k the fewest whose
 * weights sum to at least `mass` (over: to more than it), with the k-th of that order at c[k - 1]; n when all of
 * them do not. A quickselect whose partitions sum the weight of the side ahead instead of counting it: the
 * cut-off of a top-p over a flat 50k vocabulary took 2 ms of sorting, and a draw from its thousands of tokens
 * needs no order either, only the token where the running weight passes the draw. */
static int64_t cut_by_mass(struct cand *c, int64_t n, double mass, bool over) {
    int64_t lo = 0, hi = n;
    double ahead = 0; /* the weight of c[0, lo), all ahead of c[lo, hi) */
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2, last = hi - 1; /* the median of three as the pivot, at last */
        if (before(c[mid], c[lo])) swap_cand(c, mid, lo);
        if (before(c[last], c[lo])) swap_cand(c, last, lo);
        if (before(c[mid], c[last])) swap_cand(c, mid, last);
        const struct cand pv = c[last];
        int64_t b = lo;
        double w = 0;
        for (int64_t i = lo; i < last; i++)
            if (before(c[i], pv)) {
                w += c[i].v;
                swap_cand(c, i, b++);
            }
        swap_cand(c, b, last);
        if (over ? ahead + w > mass : ahead + w >= mass) { /* in [lo, b) */
            hi = b;
            continue;
        }
        ahead += w + pv.v;
        if (over ? ahead > mass : ahead >= mass) return b + 1;
        lo = b + 1;
    }
    return n;
}

/* A weight below which no token of the top-p set lies (the fewest of the heaviest whose weights reach `mass`):
 * the weights' sums by binary exponent, from the heaviest, until they reach it, one exponent lower for the
 * rounding of those sums. Weights in [0, 1]. Only the tokens above it need to be candidates: over a flat 50k
 * vocabulary, a few thousand. */
static float mass_floor(const float *w, int64_t n, double mass) {
    double m[4][128] = {{0}}; /* four by turns: a run of one exponent is not one chain of adds */
    for (int64_t i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &w[i], sizeof b);
        m[i & 3][(b >> 23) & 127] += w[i];
    }
    double acc = 0;
    for (int e = 127; e >= 0; e--) {
        acc += (m[0][e] + m[1][e]) + (m[2][e] + m[3][e]);
        if (acc >= mass) {
            uint32_t b = e >= 2 ? (uint32_t)(e - 1) << 23 : 0;
            float f;
            memcpy(&f, &b, sizeof f);
            return f;
        }
    }
    return 0;
}

/* Top-p, then min-p (Hugging Face's order), on candidates whose weights
 * (exp of the scaled logits; the best is 1) sum to *sum: moves to the front
 * the tokens within both cut-offs, the smallest set of the best ones whose
 * weight reaches `mass` (top_p times the sum) and those of at least min_p
 * times the best's weight, and returns how many, with *sum their weight. */
static int64_t nucleus(struct cand *c, int64_t n, double mass, float min_p, double *sum) {
    int64_t keep = isinf(mass) ? n : cut_by_mass(c, n, mass, false);
    if (min_p > 0) {
        float best = c[0].v, floor;
        for (int64_t i = 1; i < n; i++) best = c[i].v > best ? c[i].v : best;
        floor = min_p * best;
        int64_t k = 0; /* the tokens above the floor, the best ones: within the top-p set when fewer */
        for (int64_t i = 0; i < n; i++) k += c[i].v >= floor;
        if (k < keep) {
            int64_t b = 0;
            for (int64_t i = 0; i < keep; i++)
                if (c[i].v >= floor) swap_cand(c, i, b++);
            keep = k;
        }
    }
    double acc = 0;
    for (int64_t i = 0; i < keep; i++) acc += c[i].v;
    *sum = acc;
    return keep;
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

/* The logit a token has after the penalties (it is in the history). */
static float penalized(const struct toy_sampler *s, const float *logits, int32_t t) {
    const struct toy_sampler_params *p = &s->p;
    float v = logits[t];
    if (p->repeat_penalty > 0 && p->repeat_penalty != 1) v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
    return v - (p->frequency_penalty * (float)s->count[t] + p->presence_penalty);
}

/* Blocks of SCAN floats are first only compared against the best so far,
 * all at once (the compiler's vector compares), and looked at one by one
 * only where one beats it: after the first few blocks of a vocabulary that
 * is rare. A plain loop over 49152 logits took 46 us on a Zen 4, 1.3% of a
 * SmolLM2-135M Q4_0 decode step, before the pool's worker had to be woken. */
#define SCAN 64
static bool any_above(const float *x, float th) {
    int any = 0;
    for (int j = 0; j < SCAN; j++) any |= x[j] > th;
    return any;
}

/* The first index of the largest logit, skipping those `skip` marks (may be
 * NULL); NaN never wins. -1 when every logit looked at is NaN or skipped. */
static int64_t argmax_from(const float *x, int64_t n, const int32_t *skip) {
    int64_t best = -1;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i += SCAN) {
        int64_t e = n - i < SCAN ? n : i + SCAN;
        if (e - i == SCAN && !any_above(x + i, bv) && best >= 0) continue;
        for (int64_t j = i; j < e; j++)
            if ((x[j] > bv || (best < 0 && x[j] == bv)) && !(skip && skip[j])) bv = x[j], best = j;
    }
    return best;
}

/* a min-heap of candidates, the worst at the root: the lower value, or of
 * equal values the higher id (the lower ids are kept, as a full sort does) */
static bool worse(struct cand a, struct cand b) { return a.v < b.v || (a.v == b.v && a.id > b.id); }
static void sift_down(struct cand *h, int64_t k, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, m = i;
        if (l < k && worse(h[l], h[m])) m = l;
        if (l + 1 < k && worse(h[l + 1], h[m])) m = l + 1;
        if (m == i) return;
        struct cand t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}
static void heap_offer(struct cand *h, int64_t k, struct cand c) {
    if (!worse(h[0], c)) return;
    h[0] = c;
    sift_down(h, k, 0);
}

/* The k (< V) best candidates, penalties applied, NaN as -inf, into c[0, k)
 * sorted best first (of equal values the lower id first): one pass over the
 * logits (the tokens in the history are skipped there and offered with
 * their penalized values after), instead of V candidates and a selection. */
static void top_k_scan(struct toy_sampler *s, const float *logits, bool penal, int64_t k, struct cand *c) {
    int64_t V = s->V, n = 0, i = 0;
    const int32_t *skip = penal ? s->count : NULL;
    for (; n < k; i++) /* the first k tokens not in the history (the history holds fewer than V - k: k < V - hist) */
        if (!(skip && skip[i])) c[n++] = (struct cand){(int32_t)i, isnan(logits[i]) ? -INFINITY : logits[i]};
    for (int64_t j = k / 2 - 1; j >= 0; j--) sift_down(c, k, j);
    for (; i < V; i += SCAN) {
        int64_t e = V - i < SCAN ? V : i + SCAN;
        if (e - i == SCAN && !any_above(logits + i, c[0].v)) continue;
        for (int64_t j = i; j < e; j++)
            if (logits[j] > c[0].v && !(skip && skip[j])) heap_offer(c, k, (struct cand){(int32_t)j, logits[j]});
    }
    if (penal)
        for (int64_t h = 0; h < s->hist_n; h++) {
            int32_t t = s->hist[h];
            if (s->count[t] < 0) continue; /* offered already (a token may repeat in the history) */
            float v = penalized(s, logits, t);
            heap_offer(c, k, (struct cand){t, isnan(v) ? -INFINITY : v});
            s->count[t] = -s->count[t];
        }
    if (penal)
        for (int64_t h = 0; h < s->hist_n; h++)
            if (s->count[s->hist[h]] < 0) s->count[s->hist[h]] = -s->count[s->hist[h]];
    qsort(c, (size_t)k, sizeof *c, by_value_desc);
}

/* w[0, n) (logits, NaN as -inf) into their weights exp((v - top) / temperature), the best's 1: relative to the
 * best first, so a tiny temperature sends the others towards 0 and tends to greedy (scaling first sent the best to
 * +inf, whose exp is NaN). Every value -inf: all weigh 1 (a uniform draw); +inf values: they weigh 1, the rest 0.
 * Through the CPU's vector exp: libm's expf over a 49152-token vocabulary took 170 us of a 325 us draw. */
static void to_weights(float *w, int64_t n, float temperature) {
    toy_cpu_init();
    float top = toy_vec.max(w, n);
    if (isinf(top)) {
        for (int64_t i = 0; i < n; i++) w[i] = w[i] == top ? 1.0f : 0.0f;
        return;
    }
    int64_t i = 0; /* (blocks of a fixed count: loops GCC's -O2 vectorizes) */
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) w[i + j] = (w[i + j] - top) / temperature;
    for (; i < n; i++) w[i] = (w[i] - top) / temperature;
    toy_vec.exp_sum(w, w, 0, n);
}

/* the sum of w[0, n) in double, in 8 running sums (a single one is a chain of n dependent adds) */
static double sum_weights(const float *w, int64_t n) {
    double a[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) a[j] += w[i + j];
    for (; i < n; i++) a[0] += w[i];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* the sums of w[0, n)'s blocks of BLOCK into bs, and their total */
static double block_sums(const float *w, int64_t n, double *bs) {
    double t = 0;
    for (int64_t i = 0; i < n; i += BLOCK) t += bs[i / BLOCK] = sum_weights(w + i, n - i < BLOCK ? n - i : BLOCK);
    return t;
}

/* the first i whose running weight w[0] + ... + w[i] passes u (the last when rounding leaves u unreached): the
 * blocks' sums bs until one holds the crossing, then that block one by one */
static int64_t draw_index(const float *w, int64_t n, const double *bs, double u) {
    double acc = 0;
    int64_t i = 0;
    for (; i + BLOCK <= n && acc + bs[i / BLOCK] <= u; i += BLOCK) acc += bs[i / BLOCK];
    for (; i < n; i++)
        if ((acc += w[i]) > u) return i;
    return n - 1;
}

int32_t toy_sampler_sample(struct toy_sampler *s, const float *logits, float *logprob) {
    const struct toy_sampler_params *p = &s->p;
    int64_t V = s->V, n = V;
    bool penal = ((p->repeat_penalty > 0 && p->repeat_penalty != 1) || p->frequency_penalty || p->presence_penalty) &&
                 s->hist_n;
    int32_t pick;
    if (p->temperature <= 0) { /* greedy: the first of the best, penalties applied to the tokens in the history */
        int64_t best = argmax_from(logits, V, penal ? s->count : NULL);
        float bv = best >= 0 ? logits[best] : -INFINITY;
        for (int64_t h = 0; penal && h < s->hist_n; h++) {
            int32_t t = s->hist[h];
            float v = penalized(s, logits, t);
            if (v > bv || (v == bv && (best < 0 || t < best))) bv = v, best = t;
        }
        pick = (int32_t)(best >= 0 ? best : 0);
        if (logprob) *logprob = log_softmax_at(logits, V, pick);
        return pick;
    }
    /* the best k straight from the logits when top-k keeps few of them (the
     * history is small beside the vocabulary, so k tokens outside it exist) */
    bool scanned = p->top_k > 0 && p->top_k <= 1024 && p->top_k < V - (penal ? s->hist_n : 0);
    if (scanned) {
        top_k_scan(s, logits, penal, p->top_k, s->c);
        n = p->top_k;
        scanned = s->c[0].v > -INFINITY; /* else every logit is -inf or NaN: the full path's uniform draw */
    }
    bool top_p = p->top_p > 0 && p->top_p < 1, min_p = p->min_p > 0, top_k = !scanned && p->top_k > 0 && p->top_k < V;
    double total = -1; /* all the tokens' weight, when the candidates are fewer */
    if (!scanned) { /* every token: the penalized logits as weights, in token order */
        n = V;
        float *w = s->w;
        int64_t i = 0;
        for (; i + 16 <= V; i += 16)
            for (int j = 0; j < 16; j++) w[i + j] = logits[i + j] != logits[i + j] ? -INFINITY : logits[i + j];
        for (; i < V; i++) w[i] = isnan(logits[i]) ? -INFINITY : logits[i];
        for (int64_t h = 0; penal && h < s->hist_n; h++) {
            int32_t t = s->hist[h];
            float v = penalized(s, logits, t);
            w[t] = isnan(v) ? -INFINITY : v;
        }
        to_weights(w, V, p->temperature);
        if (!top_k && !top_p && !min_p) { /* the draw straight from the weights */
            double all = block_sums(w, V, s->bs);
            pick = (int32_t)draw_index(w, V, s->bs, (double)toy_rng_uniform(&s->rng) * all);
            if (logprob) *logprob = log_softmax_at(logits, V, pick);
            return pick;
        }
        /* candidates: the tokens the cut-offs may keep (each keeps a heaviest few: those of at least the
         * lightest weight the top-p set can hold, and of min_p times the best's, which is 1) */
        float floor = 0;
        if (!top_k) {
            total = block_sums(w, V, s->bs);
            if (top_p) floor = mass_floor(w, V, p->top_p * total);
            if (min_p && p->min_p > floor) floor = p->min_p;
        }
        n = 0;
        for (int64_t i = 0; i < V; i++)
            if (w[i] >= floor) s->c[n++] = (struct cand){(int32_t)i, w[i]};
        if (top_k) {
            select_top(s->c, n, p->top_k);
            n = p->top_k;
        }
    } else { /* the best k, sorted: their weights */
        for (int64_t i = 0; i < n; i++) s->w[i] = isnan(s->c[i].v) ? -INFINITY : s->c[i].v;
        to_weights(s->w, n, p->temperature);
        for (int64_t i = 0; i < n; i++) s->c[i].v = s->w[i];
    }
    double sum = total;
    if (sum < 0)
        for (int64_t i = (sum = 0); i < n; i++) sum += s->c[i].v;
    if (top_p || min_p) n = nucleus(s->c, n, top_p ? p->top_p * sum : INFINITY, p->min_p, &sum);
    /* the token where the running weight, in the draw's order, passes u; the last one when rounding leaves u
     * unreached */
    double u = (double)toy_rng_uniform(&s->rng) * sum;
    int64_t k = cut_by_mass(s->c, n, u, true);
    if (k == n)
        for (int64_t i = 0; i < n; i++)
            if (before(s->c[k - 1], s->c[i])) swap_cand(s->c, i, k - 1);
    pick = s->c[k - 1].id;
    if (logprob) *logprob = log_softmax_at(logits, V, pick);
    return pick;
}

float toy_logprob(const float *logits, int64_t V, int32_t id) { return log_softmax_at(logits, V, id); }

/* The best k raw logits decide the best k log-probabilities (ties: the lower id first). Blocks of SCAN logits are
 * first compared, all at once, against the k-th best so far and looked at one by one only where one beats it. */
double toy_top_logprobs(const float *logits, int64_t V, int k, int32_t *ids, float *lps) {
    double lse = log_sum_exp(logits, V);
    for (int j = 0; j < k; j++) { ids[j] = -1; lps[j] = -INFINITY; }
    if (k <= 0) return lse;
    float kth = -INFINITY;
    for (int64_t b = 0; b < V; b += SCAN) {
        int64_t e = b + SCAN < V ? b + SCAN : V;
        if (e - b == SCAN && !any_above(logits + b, kth)) continue;
        for (int64_t i = b; i < e; i++) {
            float v = logits[i];
            if (!(v > kth)) continue;
            int j = k - 1;
            while (j > 0 && lps[j - 1] < v) { lps[j] = lps[j - 1]; ids[j] = ids[j - 1]; j--; }
            lps[j] = v;
            ids[j] = (int32_t)i;
            kth = lps[k - 1];
        }
    }
    for (int j = 0; j < k && ids[j] >= 0; j++) lps[j] = (float)((double)lps[j] - lse);
    return lse;
}
