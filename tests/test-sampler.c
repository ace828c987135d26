/* test-sampler.c: the sampling pipeline: greedy is the first maximum, a seed
 * reproduces a stream, draws follow softmax(logits / T) (chi-square), top-k,
 * top-p and min-p cut where they should (top-k's one-pass selection draws
 * as a full sort), and the penalties push repeated tokens down. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "toy/rng.h"
#include "toy/sampler.h"
#include "toy/status.h"

static const float L[6] = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};

Test(sampler, greedy_first_maximum_and_logprob) {
    struct toy_sampler *s = toy_sampler_new(&(struct toy_sampler_params){0}, 6);
    float lp;
    cr_assert_eq(toy_sampler_sample(s, L, &lp), 1);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(L[i]);
    cr_assert_float_eq(lp, 3.0 - log(z), 1e-5);
    toy_sampler_free(s);
}

static void histogram(struct toy_sampler_params p, int n, int *h) {
    struct toy_sampler *s = toy_sampler_new(&p, 6);
    for (int i = 0; i < 6; i++) h[i] = 0;
    for (int i = 0; i < n; i++) h[toy_sampler_sample(s, L, NULL)]++;
    toy_sampler_free(s);
}

Test(sampler, follows_softmax_with_temperature) {
    const int n = 60000;
    int h[6];
    float T = 1.5f;
    histogram((struct toy_sampler_params){.temperature = T, .seed = 7}, n, h);
    double z = 0, chi = 0;
    for (int i = 0; i < 6; i++) z += exp(L[i] / T);
    for (int i = 0; i < 6; i++) {
        double e = n * exp(L[i] / T) / z;
        chi += (h[i] - e) * (h[i] - e) / e;
    }
    cr_assert_lt(chi, 20.5, "chi-square %.2f with 5 degrees of freedom (p < 0.001 beyond 20.5)", chi);
}

Test(sampler, same_seed_same_stream) {
    int a[6], b[6];
    struct toy_sampler_params p = {.temperature = 1, .seed = 3};
    histogram(p, 1000, a);
    histogram(p, 1000, b);
    cr_assert_arr_eq(a, b, sizeof a);
}

Test(sampler, top_k_top_p_min_p) {
    int h[6];
    histogram((struct toy_sampler_params){.temperature = 1, .top_k = 2, .seed = 1}, 5000, h);
    cr_assert(h[0] == 0 && h[2] == 0 && h[4] == 0 && h[5] == 0 && h[1] > 0 && h[3] > 0, "top-k 2 keeps the two 3.0s");
    /* probabilities .052 .384 .141 .384 .007 .031: the two best reach .768 */
    histogram((struct toy_sampler_params){.temperature = 1, .top_p = 0.75f, .seed = 1}, 5000, h);
    cr_assert(h[0] + h[2] + h[4] + h[5] == 0, "top-p 0.75 keeps tokens 1 and 3");
    histogram((struct toy_sampler_params){.temperature = 1, .top_p = 0.8f, .seed = 1}, 5000, h);
    cr_assert(h[2] > 0 && h[0] + h[4] + h[5] == 0, "top-p 0.8 adds token 2");
    histogram((struct toy_sampler_params){.temperature = 1, .min_p = 0.3f, .seed = 1}, 5000, h);
    cr_assert(h[2] > 0 && h[0] == 0 && h[4] == 0, "min-p 0.3 keeps tokens >= 0.3 * best (1, 3, 2)");
}

/* top-p, then min-p, as documented (Hugging Face's order): top-p 0.8 of
 * the whole mass keeps 1, 3 and 2 (.768 < .8), and min-p 0.3 (floor .115)
 * keeps all three. The other order kept only 1 and 3: min-p first left
 * .909 of the mass, of which top-p 0.8 is .727, reached by 1 and 3. */
Test(sampler, top_p_then_min_p) {
    int h[6];
    histogram((struct toy_sampler_params){.temperature = 1, .top_p = 0.8f, .min_p = 0.3f, .seed = 1}, 5000, h);
    cr_assert(h[1] > 0 && h[2] > 0 && h[3] > 0 && h[0] + h[4] + h[5] == 0, "%d %d %d %d %d %d", h[0], h[1], h[2],
              h[3], h[4], h[5]);
}

/* A tiny temperature tends to greedy: 1e-38 sent the best logits to +inf,
 * exp(inf - inf) is NaN, and the draw fell through to an arbitrary token. */
Test(sampler, a_tiny_temperature_is_greedy) {
    int h[6];
    histogram((struct toy_sampler_params){.temperature = 1e-38f, .seed = 1}, 1000, h);
    cr_assert(h[0] + h[2] + h[4] + h[5] == 0 && h[1] + h[3] == 1000, "%d %d %d %d %d %d", h[0], h[1], h[2], h[3],
              h[4], h[5]);
    histogram((struct toy_sampler_params){.temperature = 1e-38f, .top_p = 0.9f, .seed = 1}, 1000, h);
    cr_assert(h[1] + h[3] == 1000);
}

/* top-p and min-p over a 50k vocabulary sort only the prefix they keep
 * (the best 128, then 8 times more, ...): the draws are those of a plain
 * full sort, token for token, for cut-offs inside and past the first
 * prefix. */
static int by_weight_desc(const void *a, const void *b) {
    const float *x = a, *y = b; /* (weight, id) pairs */
    if (x[0] != y[0]) return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : 1;
}

/* the reference draw: the first of the `keep` best (weight, id) pairs
 * whose running weight passes a uniform draw times their total */
static int draw_ref(const float *w, int keep, double total, struct toy_rng *r) {
    double u = (double)toy_rng_uniform(r) * total, a = 0;
    for (int i = 0; i < keep; i++)
        if ((a += w[2 * i]) > u) return (int)w[2 * i + 1];
    return (int)w[2 * (keep - 1) + 1];
}

Test(sampler, partial_sort_draws_as_a_full_sort) {
    const int V = 50000;
    float *logits = malloc(V * sizeof *logits), *w = malloc(2 * V * sizeof *w);
    struct toy_rng g;
    toy_rng_seed(&g, 5);
    for (int i = 0; i < V; i++) logits[i] = 6 * toy_rng_uniform(&g) * toy_rng_uniform(&g); /* a long tail */
    const struct { float top_p, min_p, temp; } cases[] = {{0.95f, 0, 0.8f}, {0.3f, 0, 1}, {0.999f, 0, 1.5f},
                                                          {0, 0.05f, 1}, {0, 0.9f, 0.7f}, {0.9f, 0.2f, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct toy_sampler_params p = {.temperature = cases[c].temp, .top_p = cases[c].top_p,
                                       .min_p = cases[c].min_p, .seed = 11};
        struct toy_sampler *s = toy_sampler_new(&p, V);
        struct toy_rng r;
        toy_rng_seed(&r, 11);
        float top = -INFINITY;
        for (int i = 0; i < V; i++) top = logits[i] > top ? logits[i] : top;
        double sum = 0;
        for (int i = 0; i < V; i++) {
            w[2 * i] = expf(logits[i] == top ? 0 : (logits[i] - top) / p.temperature);
            w[2 * i + 1] = (float)i;
            sum += w[2 * i];
        }
        qsort(w, V, 2 * sizeof *w, by_weight_desc);
        int keep = 0;
        double acc = 0;
        if (p.top_p > 0) while (keep < V && acc < p.top_p * sum) acc += w[2 * keep++];
        else keep = V;
        int k = 1;
        while (k < keep && w[2 * k] >= p.min_p * w[0]) k++;
        if (k < keep) keep = k;
        double kept = 0;
        for (int i = 0; i < keep; i++) kept += w[2 * i];
        for (int d = 0; d < 200; d++) {
            int want = draw_ref(w, keep, kept, &r), got = toy_sampler_sample(s, logits, NULL);
            cr_assert_eq(got, want, "case %zu (top-p %g, min-p %g, %d kept), draw %d: %d, full sort %d", c,
                         (double)p.top_p, (double)p.min_p, keep, d, got, want);
        }
        toy_sampler_free(s);
    }
    free(logits);
    free(w);
}

/* Top-k over a 50k vocabulary takes the best k in one pass over the logits
 * (sampler.c's top_k_scan) rather than a selection over all V candidates:
 * its draws are those of a plain full sort of the penalized logits (of
 * equal values the lower id first, NaN as -inf), token for token, with
 * ties at the k-th place, NaN and -inf logits, repeats in the history, and
 * top-p after it or not. Greedy with penalties is the first maximum of the
 * penalized logits. */
static float pen_ref(const struct toy_sampler_params *p, float v, int count) {
    if (!count) return v;
    if (p->repeat_penalty > 0 && p->repeat_penalty != 1) v = v > 0 ? v / p->repeat_penalty : v * p->repeat_penalty;
    return v - (p->frequency_penalty * (float)count + p->presence_penalty);
}

Test(sampler, top_k_draws_as_a_full_sort) {
    const int V = 50000;
    float *logits = malloc(V * sizeof *logits), *w = malloc(2 * V * sizeof *w);
    int *count = calloc(V, sizeof *count);
    struct toy_rng g;
    toy_rng_seed(&g, 7);
    /* a coarse grid, so values tie at the k-th place */
    for (int i = 0; i < V; i++) logits[i] = roundf(40 * toy_rng_uniform(&g) * toy_rng_uniform(&g)) / 4;
    logits[3] = NAN, logits[77] = -INFINITY, logits[49999] = 10; /* the last block, and one of the best */
    logits[49990] = 9.75f; /* ties the 40th best, after it: out of the best 40 */
    logits[12] = 10.25f;   /* in the history: 10 less a presence penalty of 0.25 ties the best, with a lower id */
    int hist[] = {49999, 12, 12, 40000, 3, 77, 500, 12};
    const struct {
        int k;
        float top_p, temp, rep, freq, pres;
    } cases[] = {{40, 0, 0.8f, 1, 0, 0},       {40, 0.95f, 0.8f, 1, 0, 0}, {40, 0.9f, 1, 1.3f, 0, 0},
                 {5, 0, 1.2f, 1, 0.5f, 0.25f}, {1000, 0.5f, 1, 2, 0, 0},   {1, 0, 1, 1, 0, 0},
                 {40, 0, 1, 1, 0, 0.25f},      {40, 0, 0, 1.5f, 0.2f, 0.1f}, {40, 0, 0, 1, 0, 0.25f},
                 {40, 0, 0, 1, 0, 0}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct toy_sampler_params p = {.temperature = cases[c].temp, .top_k = cases[c].k, .top_p = cases[c].top_p,
                                       .repeat_penalty = cases[c].rep, .frequency_penalty = cases[c].freq,
                                       .presence_penalty = cases[c].pres, .seed = 3};
        struct toy_sampler *s = toy_sampler_new(&p, V);
        memset(count, 0, V * sizeof *count);
        bool penal = cases[c].rep != 1 || cases[c].freq || cases[c].pres;
        for (size_t h = 0; h < sizeof hist / sizeof hist[0]; h++) {
            toy_sampler_accept(s, hist[h]);
            count[hist[h]] += penal;
        }
        for (int i = 0; i < V; i++) {
            float v = pen_ref(&p, logits[i], count[i]);
            w[2 * i] = isnan(v) ? -INFINITY : v;
            w[2 * i + 1] = (float)i;
        }
        qsort(w, V, 2 * sizeof *w, by_weight_desc); /* (value, id) pairs: the same order */
        struct toy_rng r;
        toy_rng_seed(&r, 3);
        if (p.temperature <= 0) {
            cr_assert_eq(toy_sampler_sample(s, logits, NULL), (int)w[1], "case %zu: greedy", c);
            toy_sampler_free(s);
            continue;
        }
        int keep = p.top_k;
        double sum = 0;
        float top = w[0];
        for (int i = 0; i < keep; i++) {
            w[2 * i] = expf(w[2 * i] == top ? 0 : (w[2 * i] - top) / p.temperature);
            sum += w[2 * i];
        }
        if (p.top_p > 0) {
            double mass = p.top_p * sum, acc = 0;
            int kp = 0;
            while (kp < keep && acc < mass) acc += w[2 * kp++];
            keep = kp;
            sum = 0;
            for (int i = 0; i < keep; i++) sum += w[2 * i];
        }
        for (int d = 0; d < 200; d++) {
            int want = draw_ref(w, keep, sum, &r), got = toy_sampler_sample(s, logits, NULL);
            cr_assert_eq(got, want, "case %zu (top-k %d, top-p %g, %d kept), draw %d: %d, full sort %d", c, p.top_k,
                         (double)p.top_p, keep, d, got, want);
        }
        toy_sampler_free(s);
    }
    free(logits);
    free(w);
    free(count);
}

Test(sampler, penalties_push_repeats_down) {
    struct toy_sampler *s = toy_sampler_new(&(struct toy_sampler_params){.repeat_penalty = 2.0f}, 6);
    toy_sampler_accept(s, 1);
    cr_assert_eq(toy_sampler_sample(s, L, NULL), 3, "token 1 (3.0 -> 1.5) loses to token 3");
    toy_sampler_accept(s, 3);
    cr_assert_eq(toy_sampler_sample(s, L, NULL), 2, "then token 2 (2.0) wins");
    toy_sampler_free(s);
    s = toy_sampler_new(&(struct toy_sampler_params){.frequency_penalty = 0.6f, .presence_penalty = 0.1f}, 6);
    toy_sampler_accept(s, 1);
    toy_sampler_accept(s, 1); /* 3.0 - 1.2 - 0.1 = 1.7 */
    cr_assert_eq(toy_sampler_sample(s, L, NULL), 3);
    toy_sampler_free(s);
}

Test(sampler, top_logprobs) {
    int32_t ids[3];
    float lp[3];
    toy_top_logprobs(L, 6, 3, ids, lp);
    cr_assert(ids[0] == 1 && ids[1] == 3 && ids[2] == 2);
    cr_assert(lp[0] >= lp[1] && lp[1] >= lp[2]);
}

/* The chosen token's log-probability and its entry among the top ones are
 * the same number (one log-sum-exp for both), and both match a double
 * log-softmax over a 49152-token vocabulary to 1e-5. */
Test(sampler, logprob_agrees_with_top_logprobs) {
    const int64_t V = 49152;
    float *x = malloc((size_t)V * sizeof *x);
    struct toy_rng r;
    toy_rng_seed(&r, 9);
    for (int64_t i = 0; i < V; i++) x[i] = 3.0f * toy_rng_normal(&r);
    struct toy_sampler *s = toy_sampler_new(&(struct toy_sampler_params){0}, V);
    float lp;
    int32_t id = toy_sampler_sample(s, x, &lp), ids[4];
    float top[4];
    toy_top_logprobs(x, V, 4, ids, top);
    cr_assert_eq(ids[0], id);
    cr_assert(memcmp(&top[0], &lp, sizeof lp) == 0, "sampler %.9g, top %.9g", lp, top[0]);
    double mx = -INFINITY, sum = 0;
    for (int64_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int64_t i = 0; i < V; i++) sum += exp((double)x[i] - mx);
    for (int j = 0; j < 4; j++)
        cr_assert(fabs(top[j] - ((double)x[ids[j]] - mx - log(sum))) < 1e-5, "top %d: %.9g", j, top[j]);
    toy_sampler_free(s);
    free(x);
}

/* The block-skipping top-k scan gives what a full sort gives: a vocabulary
 * that is no multiple of the block, repeated logits (the lower id first),
 * -inf ones (never chosen while a finite one is left), and the best ones
 * late in the vocabulary so that earlier blocks fill the list first; the
 * log-sum-exp it returns gives toy_logprob's number for any token. */
Test(sampler, top_logprobs_match_a_full_sort) {
    const int64_t V = 49157;
    float *x = malloc((size_t)V * sizeof *x);
    int32_t *ord = malloc((size_t)V * sizeof *ord);
    struct toy_rng r;
    toy_rng_seed(&r, 21);
    for (int64_t i = 0; i < V; i++) x[i] = (float)(int)(8.0f * toy_rng_normal(&r)) / 4; /* many ties */
    for (int64_t i = 0; i < V; i += 7) x[i] = -INFINITY;
    for (int64_t i = V - 40; i < V; i++) x[i] = 9.0f + (float)(i % 5);
    for (int64_t i = 0; i < V; i++) ord[i] = (int32_t)i;
    for (int64_t i = 1; i < V; i++) /* insertion sort by logit, descending, stable: ties keep id order */
        for (int64_t j = i; j > 0 && x[ord[j - 1]] < x[ord[j]]; j--) {
            int32_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
        }
    for (int k = 1; k <= 20; k += 19) {
        int32_t ids[20];
        float lp[20];
        double lse = toy_top_logprobs(x, V, k, ids, lp);
        for (int j = 0; j < k; j++) {
            cr_assert_eq(ids[j], ord[j], "k %d, place %d", k, j);
            float want = toy_logprob(x, V, ids[j]);
            cr_assert(memcmp(&lp[j], &want, sizeof want) == 0, "k %d, place %d: %.9g vs %.9g", k, j, lp[j], want);
            cr_assert(lp[j] == (float)((double)x[ids[j]] - lse));
        }
    }
    /* fewer finite logits than asked: the rest are -1, -inf */
    float few[70];
    for (int i = 0; i < 70; i++) few[i] = i == 3 ? 1.0f : i == 66 ? 2.0f : -INFINITY;
    int32_t ids[4];
    float lp[4];
    toy_top_logprobs(few, 70, 4, ids, lp);
    cr_assert(ids[0] == 66 && ids[1] == 3 && ids[2] == -1 && ids[3] == -1);
    cr_assert(lp[0] > lp[1] && isinf(lp[2]) && lp[2] < 0 && isinf(lp[3]));
    free(ord);
    free(x);
}

/* parameters that would sample garbage are refused by name */
Test(sampler, params_check) {
    struct toy_sampler_params ok = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                    .repeat_penalty = 1.1f};
    cr_expect_eq(toy_sampler_params_check(&ok), TOY_OK);
    struct toy_sampler_params greedy = {0};
    cr_expect_eq(toy_sampler_params_check(&greedy), TOY_OK);
    struct toy_sampler_params bad[] = {
        {.temperature = NAN}, {.temperature = INFINITY}, {.top_p = -0.1f}, {.min_p = 1.5f},
        {.repeat_penalty = NAN}, {.presence_penalty = -INFINITY}, {.top_k = -1},
    };
    const char *names[] = {"temperature", "temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "top_k"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(toy_sampler_params_check(&bad[i]), TOY_ERR_INVALID_ARG, "case %zu", i);
        cr_expect(strstr(toy_last_error(), names[i]), "case %zu: %s", i, toy_last_error());
    }
}

/* toy_rng_fill_normal: the draws of toy_rng_normal, in order, to the bit,
 * and the generator left where those draws leave it, on one thread and on
 * a pool (one short round; rounds of 2^18 draws with a partial last one;
 * and a thread count that does not divide a round) */
static void fill_matches_one_at_a_time(int64_t n, float scale) {
    float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    struct toy_rng a, b;
    toy_rng_seed(&a, 1234);
    toy_rng_seed(&b, 1234);
    (void)toy_rng_u64(&a); /* not at the stream's start */
    (void)toy_rng_u64(&b);
    toy_rng_fill_normal(&a, got, n, scale);
    for (int64_t i = 0; i < n; i++) want[i] = scale * toy_rng_normal(&b);
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)))
            cr_assert_fail("n %lld: draw %lld is %.9g, one at a time %.9g", (long long)n, (long long)i, got[i], want[i]);
    cr_assert_eq(toy_rng_u64(&a), toy_rng_u64(&b), "n %lld: the generator ends elsewhere", (long long)n);
    free(got);
    free(want);
}

Test(rng, fill_normal_gives_the_draws_of_rng_normal) {
    const char *threads[] = {"1", "2", "3"};
    for (int t = 0; t < 3; t++) {
        setenv("TOY_THREADS", threads[t], 1);
        fill_matches_one_at_a_time(0, 1.0f);
        fill_matches_one_at_a_time(1001, 0.02f);
        fill_matches_one_at_a_time(100003, 0.02f);
        fill_matches_one_at_a_time((2 << 18) + 12345, 0.02f);
        fill_matches_one_at_a_time(3 << 18, 1.5f);
    }
}
