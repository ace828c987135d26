/* toy/rng.h: a small, seedable, reproducible random generator
 * (xoshiro256** seeded through splitmix64). The same seed gives the same
 * stream on every machine and thread count.
 *
 *     struct toy_rng r;
 *     toy_rng_seed(&r, 42);
 *     float x = toy_rng_normal(&r);   // N(0, 1)
 */
#ifndef TOY_RNG_H
#define TOY_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct toy_rng {
    uint64_t s[4];
};

void toy_rng_seed(struct toy_rng *r, uint64_t seed);
uint64_t toy_rng_u64(struct toy_rng *r);
/* uniform in [0, 1) with 24 random bits */
float toy_rng_uniform(struct toy_rng *r);
/* uniform integer in [0, n) without modulo bias */
uint64_t toy_rng_below(struct toy_rng *r, uint64_t n);
/* standard normal (Box-Muller, no cached pair: one call, one draw) */
float toy_rng_normal(struct toy_rng *r);
/* x[i] = scale * toy_rng_normal(r) for i in [0, n), in order: the same
 * values and the same state of r afterwards, however many threads do the
 * arithmetic (large fills use a short-lived pool of TOY_THREADS or the
 * usable cores) */
void toy_rng_fill_normal(struct toy_rng *r, float *x, int64_t n, float scale);

#ifdef __cplusplus
}
#endif
#endif
