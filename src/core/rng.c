/* rng.c: xoshiro256** (Blackman & Vigna, 2018) seeded by splitmix64. */
#include <math.h>
#include <stdlib.h>

#include "toy/rng.h"
#include "toy/threadpool.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void toy_rng_seed(struct toy_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t toy_rng_u64(struct toy_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float toy_rng_uniform(struct toy_rng *r) { return (float)(toy_rng_u64(r) >> 40) * (1.0f / 16777216.0f); }

uint64_t toy_rng_below(struct toy_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = toy_rng_u64(r); while (x >= lim);
    return x % n;
}

/* one N(0, 1) draw from two words of the stream (Box-Muller's cosine half):
 * toy_rng_normal and toy_rng_fill_normal share it, so they give the same
 * bits */
static inline float normal_of(uint64_t a, uint64_t b) {
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float toy_rng_normal(struct toy_rng *r) {
    uint64_t a = toy_rng_u64(r);
    return normal_of(a, toy_rng_u64(r));
}

/* Filling in rounds of up to FILL_ROUND draws: the stream's two words a
 * draw are taken in order on the calling thread (~3 ns), and the rest of a
 * draw (~23 ns on a Zen 4 core, nearly all of it the logarithm and cosine)
 * is shared by a pool of threads. One draw at a time, the random init of a
 * 1B-parameter model took 35-44 s. */
#define FILL_ROUND ((int64_t)1 << 18) /* draws per round: 4 MiB of words */
#define FILL_POOL ((int64_t)1 << 16)  /* fewer draws (~1.5 ms) run on the calling thread alone */

struct fill_round {
    const uint64_t *u;
    float *x;
    int64_t n;
    float scale;
};

static void fill_part(void *arg, int ith, int nth) {
    const struct fill_round *f = arg;
    int64_t i0 = f->n * ith / nth, i1 = f->n * (ith + 1) / nth;
    for (int64_t i = i0; i < i1; i++) f->x[i] = f->scale * normal_of(f->u[2 * i], f->u[2 * i + 1]);
}

void toy_rng_fill_normal(struct toy_rng *r, float *x, int64_t n, float scale) {
    int nth = n >= FILL_POOL ? toy_threads_resolve(0) : 1;
    int64_t round = n < FILL_ROUND ? n : FILL_ROUND;
    uint64_t *u = nth > 1 ? malloc((size_t)(2 * round) * sizeof *u) : NULL;
    struct toy_threadpool *tp = u ? toy_threadpool_new(nth) : NULL;
    if (!tp) { /* small, one core, or no memory for the rounds: one draw at a time */
        free(u);
        for (int64_t i = 0; i < n; i++) x[i] = scale * toy_rng_normal(r);
        return;
    }
    for (int64_t i = 0; i < n; i += round) {
        struct fill_round f = {u, x + i, n - i < round ? n - i : round, scale};
        for (int64_t j = 0; j < 2 * f.n; j++) u[j] = toy_rng_u64(r);
        toy_threadpool_run(tp, fill_part, &f);
    }
    toy_threadpool_free(tp);
    free(u);
}
