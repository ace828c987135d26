/* rng-fill.c: toy_rng_fill_normal, a tensor's normal draws on a pool of
 * threads (apart from rng.c, which the fuzzers link alone). */
#include <stdlib.h>

#include "core/internal.h"
#include "toy/rng.h"
#include "toy/threadpool.h"

/* Filling in rounds of up to FILL_ROUND draws: the stream's two words a
 * draw are taken in order on the calling thread (~3 ns), and the rest of a
 * draw (~23 ns on a Zen 4 core, nearly all of it the logarithm and cosine)
 * is shared by a pool of threads. One draw at a time, the random init of a
 * 1B-parameter model took 44 s on a Zen 4 core; on 2 cores it takes 24-36. */
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
    for (int64_t i = i0; i < i1; i++) f->x[i] = f->scale * toy_rng_normal_of(f->u[2 * i], f->u[2 * i + 1]);
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
