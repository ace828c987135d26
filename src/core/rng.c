/* rng.c: xoshiro256** (Blackman & Vigna, 2018) seeded by splitmix64. */
#include <math.h>

#include "toy/rng.h"
#include "core/internal.h"

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
 * toy_rng_normal and toy_rng_fill_normal (rng-fill.c) share it, so they
 * give the same bits */
float toy_rng_normal_of(uint64_t a, uint64_t b) {
    double u1 = ((double)(a >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

float toy_rng_normal(struct toy_rng *r) {
    uint64_t a = toy_rng_u64(r);
    return toy_rng_normal_of(a, toy_rng_u64(r));
}
