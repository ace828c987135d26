/* test-quant.c: the block formats of src/core/quant.c: bit-exact against
 * reference vectors (tests/data/quant-refs.bin, made by
 * tests/quant/gen-quant-refs.py, a float32-exact numpy transcription of
 * ggml's quantize_row_*_ref and dequantize_row_*), hand-checked known
 * answers, and quantize -> dequantize error bounds. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/quant.h"
#include "core/quant-impl.h"

static uint8_t *slurp(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)n);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(p); return NULL; }
    fclose(f);
    *size = (size_t)n;
    return p;
}

static uint32_t rd32(const uint8_t **p) { uint32_t v; memcpy(&v, *p, 4); *p += 4; return v; }

Test(quant, reference_vectors_bit_exact) {
    size_t size;
    uint8_t *buf = slurp("tests/data/quant-refs.bin", &size);
    cr_assert(buf, "tests/data/quant-refs.bin missing (run tests/quant/gen-quant-refs.py)");
    cr_assert(!memcmp(buf, "TQR1", 4));
    const uint8_t *p = buf + 4, *end = buf + size;
    uint32_t n_cases = rd32(&p);
    int seen_q[TOY_DTYPE_COUNT] = {0}, seen_d[TOY_DTYPE_COUNT] = {0};
    for (uint32_t c = 0; c < n_cases; c++) {
        uint32_t kind = rd32(&p), type = rd32(&p), n = rd32(&p);
        cr_assert(p < end);
        const char *name = toy_dtype_name((enum toy_dtype)type);
        if (kind == 0) {
            float *x = malloc((size_t)n * 4); /* the file's floats are unaligned */
            memcpy(x, p, (size_t)n * 4);
            p += (size_t)n * 4;
            uint32_t nbytes = rd32(&p);
            cr_assert_eq(nbytes, toy_row_bytes((enum toy_dtype)type, n), "%s", name);
            uint8_t *got = malloc(nbytes);
            cr_assert_eq(toy_quantize_row((enum toy_dtype)type, x, got, n), TOY_OK, "%s", name);
            size_t first = nbytes;
            for (size_t k = 0; k < nbytes; k++)
                if (got[k] != p[k]) { first = k; break; }
            cr_expect_eq(first, nbytes, "quantize %s case %u: first differing byte %zu (%02x vs %02x)",
                         name, c, first, first < nbytes ? got[first] : 0, first < nbytes ? p[first] : 0);
            p += nbytes;
            free(got);
            free(x);
            seen_q[type]++;
        } else {
            uint32_t nbytes = rd32(&p);
            const uint8_t *blocks = p;
            p += nbytes;
            float *got = malloc((size_t)n * 4);
            cr_assert_eq(toy_dequantize_row((enum toy_dtype)type, blocks, got, n), TOY_OK, "%s", name);
            cr_expect(!memcmp(got, p, (size_t)n * 4), "dequantize %s differs", name);
            p += (size_t)n * 4;
            free(got);
            seen_d[type]++;
        }
    }
    cr_expect_eq(p, end);
    enum toy_dtype q[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q2_K, TOY_Q3_K, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K,
                          TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) cr_expect(seen_q[q[i]] > 0, "%s", toy_dtype_name(q[i]));
    enum toy_dtype d[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q2_K, TOY_Q3_K, TOY_Q4_K, TOY_Q5_K, TOY_Q6_K, TOY_Q8_K,
                          TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) cr_expect(seen_d[d[i]] > 0, "%s", toy_dtype_name(d[i]));
    free(buf);
}

/* The dispatched kernels (AVX2 where the CPU has it) give the reference
 * kernels' bits on random blocks of every dequantizable type. */
Test(quant, fast_kernels_match_reference) {
    enum toy_dtype types[] = {TOY_Q8_0, TOY_Q4_0, TOY_Q4_1, TOY_Q5_0, TOY_Q5_1, TOY_Q2_K, TOY_Q3_K, TOY_Q4_K,
                              TOY_Q5_K, TOY_Q6_K, TOY_Q8_K, TOY_IQ4_NL, TOY_IQ4_XS, TOY_MXFP4, TOY_F16, TOY_BF16};
    enum { N = 256 * 64 };
    uint8_t *q = malloc(N * 4);
    float *a = malloc(N * 4), *b = malloc(N * 4);
    uint64_t s = 12345;
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        enum toy_dtype t = types[k];
        size_t bytes = toy_row_bytes(t, N);
        for (size_t i = 0; i < bytes; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            q[i] = (uint8_t)(s >> 56);
        }
        /* keep every f16/f32 field finite: clear the top exponent bit of each
         * odd byte (f16 high bytes) for the half types, and of the scales */
        if (t == TOY_F16 || t == TOY_BF16)
            for (size_t i = 1; i < bytes; i += 2) q[i] &= 0xBF;
        const size_t bs = toy_dtype_type_size(t);
        for (size_t blk = 0; blk < bytes / bs; blk++) {
            uint8_t *p = q + blk * bs;
            size_t at = t == TOY_Q2_K ? 80 : t == TOY_Q3_K ? 108 : t == TOY_Q6_K ? 208 : 0;
            if (t == TOY_F16 || t == TOY_BF16) break;
            if (t == TOY_Q8_K) { float d = 0.01f; memcpy(p, &d, 4); continue; }
            if (t == TOY_MXFP4) continue; /* every E8M0 byte is a finite scale */
            p[at + 1] &= 0xBF; /* f16 d: exponent < 16, finite */
            if (t == TOY_Q4_1 || t == TOY_Q5_1 || t == TOY_Q4_K || t == TOY_Q5_K || t == TOY_Q2_K) p[at + 3] &= 0xBF;
        }
        cr_assert_eq(toy_dequantize_row(t, q, a, N), TOY_OK, "%s", toy_dtype_name(t));
        cr_assert_eq(toy_dequantize_row_ref(t, q, b, N), TOY_OK, "%s", toy_dtype_name(t));
        cr_expect(!memcmp(a, b, (size_t)N * 4), "%s: fast kernel differs from the reference", toy_dtype_name(t));
    }
    free(q);
    free(a);
    free(b);
}

/* The iq4 quantizers' search (iq4_fit: 16 trial scales over a block's 32
 * values) and their final indices on AVX2 give the scalar loops' sums bit
 * for bit and the same indices: random values
 * and scales; values on the codebook's grid and halfway between at scale
 * 1 and -1 (exact ties, which go to the larger value); values past both
 * ends of the codebook, zeros, subnormals, huge values, NaN. */
Test(quant, iq4_search_matches_scalar) {
    if (!__builtin_cpu_supports("avx2")) cr_skip_test("no AVX2");
    const int8_t *cb = toy_iq4_codebook;
    uint64_t s = 99;
    for (int rep = 0; rep < 400; rep++) {
        float x[32], id[16], a[2][16], b[2][16];
        for (int i = 0; i < 32; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            const float u = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
            const int c = (int)(s >> 60) % 15;
            switch (rep % 6) {
            case 0: x[i] = u; break;
            case 1: x[i] = i % 2 ? (float)cb[c] : 0.5f * (float)(cb[c] + cb[c + 1]); break; /* grid and ties */
            case 2: x[i] = 300 * u; break;                                                /* past the ends */
            case 3: x[i] = i % 4 == 0 ? 0.0f : u * 1e-39f; break;                          /* zeros, subnormals */
            case 4: x[i] = u * 1e35f; break;
            default: x[i] = i == 5 ? NAN : u; break;
            }
        }
        for (int t = 0; t < 16; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            id[t] = rep % 6 == 1 ? (t % 2 ? 1.0f : -1.0f) : (float)((double)(s >> 11) / 9007199254740992.0 * 4 - 2);
        }
        toy_iq4_sums_ref(x, id, a[0], b[0]);
        toy_iq4_sums_avx2(x, id, a[1], b[1]);
        for (int t = 0; t < 16; t++) {
            cr_assert(!memcmp(&a[0][t], &a[1][t], 4) && !memcmp(&b[0][t], &b[1][t], 4),
                      "case %d, trial %d: sums %a %a (scalar) vs %a %a", rep, t, a[0][t], b[0][t], a[1][t], b[1][t]);
            uint8_t L[2][32]; /* the indices written at the end, with each trial scale */
            toy_iq4_indices_ref(x, id[t], L[0]);
            toy_iq4_indices_avx2(x, id[t], L[1]);
            cr_assert(!memcmp(L[0], L[1], 32), "case %d, trial %d: indices differ", rep, t);
        }
    }
}

/* Worked by hand from the block definitions. */
Test(quant, known_answers) {
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16); /* -16 .. 15 */
    uint8_t b[34];
    cr_assert_eq(toy_quantize_row(TOY_Q8_0, x, b, 32), TOY_OK);
    /* d = 16/127, stored as f16 */
    uint16_t dh;
    memcpy(&dh, b, 2);
    cr_expect_eq(dh, toy_f32_to_f16(16.0f / 127));
    cr_expect_eq((int8_t)b[2], -127);         /* -16 -> -127 */
    cr_expect_eq((int8_t)b[2 + 16], 0);       /*   0 -> 0 */
    cr_expect_eq((int8_t)b[2 + 31], 119);     /*  15 -> round(15*127/16 = 119.06) */

    /* q4_0: max |x| is -16, d = -16 / -8 = 2; q = x/2 + 8.5 truncated */
    uint8_t q4[18];
    cr_assert_eq(toy_quantize_row(TOY_Q4_0, x, q4, 32), TOY_OK);
    memcpy(&dh, q4, 2);
    cr_expect_eq(toy_f16_to_f32(dh), 2.0f);
    cr_expect_eq(q4[2] & 0xF, 0);             /* x0 = -16 -> 0 */
    cr_expect_eq(q4[2] >> 4, 8);              /* x16 = 0 -> 8 */
    cr_expect_eq(q4[2 + 15] >> 4, 15);        /* x31 = 15 -> 7.5+8.5 = 16 -> clamped 15 */
    float y[32];
    cr_assert_eq(toy_dequantize_row(TOY_Q4_0, q4, y, 32), TOY_OK);
    cr_expect_eq(y[0], -16.0f);
    cr_expect_eq(y[16], 0.0f);
    cr_expect_eq(y[31], 14.0f);

    /* q8_k: f32 d, then int8 */
    uint8_t k8[292] = {0};
    float d = 0.5f;
    memcpy(k8, &d, 4);
    k8[4] = (uint8_t)-3;
    k8[4 + 255] = 7;
    float z[256];
    cr_assert_eq(toy_dequantize_row(TOY_Q8_K, k8, z, 256), TOY_OK);
    cr_expect_eq(z[0], -1.5f);
    cr_expect_eq(z[255], 3.5f);
    cr_expect_eq(z[1], 0.0f);

    /* f16/bf16 rows at an odd address convert the same */
    uint8_t raw[2 * 32 + 1];
    toy_f32_to_f16_row(x, (toy_f16 *)(void *)y, 32); /* y as scratch */
    memcpy(raw + 1, y, 64);
    float z16[32];
    cr_assert_eq(toy_dequantize_row(TOY_F16, raw + 1, z16, 32), TOY_OK);
    for (int i = 0; i < 32; i++) cr_expect_eq(z16[i], x[i]);
    cr_assert_eq(toy_dequantize_row(TOY_BF16, raw + 1, z16, 16), TOY_OK);

    cr_expect_eq(toy_quantize_row(TOY_Q8_0, x, b, 31), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_quantize_row(TOY_IQ2_XXS, x, b, 256), TOY_ERR_UNSUPPORTED);
    cr_expect(toy_can_dequantize(TOY_Q6_K));
    cr_expect(toy_can_quantize(TOY_Q4_K));
    cr_expect(toy_can_quantize(TOY_IQ4_NL));
    cr_expect(toy_can_quantize(TOY_MXFP4));
    cr_expect(toy_can_dequantize(TOY_MXFP4));
    cr_expect(!toy_can_quantize(TOY_Q8_K)); /* read, never written */
    cr_expect(toy_can_dequantize(TOY_IQ4_XS));
    cr_expect(!toy_can_dequantize(TOY_IQ2_XXS));
}

/* MXFP4 by hand: the E8M0 scale byte at its edges (0 and 1 the f32
 * subnormals 2^-128 and 2^-127, 255 the largest, 2^127) times each of the
 * 16 values, with the nibble order of Q4_0 (element j the low nibble of
 * byte j, j + 16 the high one); then the quantizer's scale rule and its
 * ties, which go to the first value in the table's order. */
Test(quant, mxfp4_e8m0_edges_and_ties) {
    static const int vals[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    const int es[] = {0, 1, 2, 127, 128, 254, 255};
    const size_t ne = sizeof es / sizeof es[0];
    uint8_t blk[sizeof es / sizeof es[0] * 17];
    for (size_t b = 0; b < ne; b++) {
        blk[17 * b] = (uint8_t)es[b];
        for (int j = 0; j < 16; j++) blk[17 * b + 1 + j] = (uint8_t)(j | (15 - j) << 4);
    }
    float y[sizeof es / sizeof es[0] * 32];
    cr_assert_eq(toy_dequantize_row(TOY_MXFP4, blk, y, (int64_t)ne * 32), TOY_OK);
    for (size_t b = 0; b < ne; b++) {
        const float d = ldexpf(1.0f, es[b] - 128);
        cr_assert(d > 0 && isfinite(d));
        for (int j = 0; j < 32; j++) {
            const float want = (float)vals[j < 16 ? j : 15 - (j - 16)] * d; /* exact, or inf past 2^128 */
            cr_expect(!memcmp(&y[32 * b + j], &want, 4), "e = %d, element %d: %a, want %a", es[b], j, y[32 * b + j],
                      want);
        }
    }
    cr_expect_eq(y[0 * 32 + 1], 0x1p-128f); /* the subnormal scales themselves, the value 1 */
    cr_expect_eq(y[1 * 32 + 1], 0x1p-127f);
    cr_expect_eq(y[3 * 32 + 7], 6.0f);       /* e = 127: d = 1/2, 12 d */
    cr_expect_eq(y[6 * 32 + 1], 0x1p127f);
    cr_expect(isinf(y[6 * 32 + 7]) && y[6 * 32 + 7] > 0); /* 12 x 2^127 */

    /* amax 7: e = floor(log2 7) - 2 + 127 = 127, d = 1/2, the grid
     * 0, .5, 1, 1.5, 2, 3, 4, 6. Values halfway between two grid points go
     * to the first in table order: the smaller magnitude, and +0 (index 0)
     * over -0 (index 8) */
    const float x[32] = {7, 5, -5, 3.5f, -3.5f, 2.5f, -2.5f, 1.25f, -1.25f, 0.75f, -0.75f, 0.25f, -0.25f, 0, -0.0f,
                         6.5f, -7, 1, -1, 0.5f, 0.3f, -0.2f, 5.1f, -4.9f, 100.0f / 17, 0.1f, 2, 3, 4, 6, -6, -0.5f};
    const int want[32] = {7, 6, 14, 5, 13, 4, 12, 2, 10, 1, 9, 0, 0, 0, 0,
                          7, 15, 2, 10, 1, 1, 0, 7, 14, 7, 0, 4, 5, 6, 7, 15, 9};
    uint8_t q[17];
    cr_assert_eq(toy_quantize_row(TOY_MXFP4, x, q, 32), TOY_OK);
    cr_expect_eq(q[0], 127);
    for (int j = 0; j < 32; j++) {
        const int got = j < 16 ? q[1 + j] & 15 : q[1 + j - 16] >> 4;
        cr_expect_eq(got, want[j], "x = %g: index %d, want %d", x[j], got, want[j]);
    }
    /* the scale: amax 8 -> e 128; 0.999 -> 124; zeros -> 0 (all indices 0); 1e-45 (2^-149) -> 0, not negative */
    const struct { float amax; int e; } sc[] = {{8, 128}, {7.99f, 127}, {0.999f, 124}, {1, 125}, {0, 0}, {1e-45f, 0},
                                                 {3e38f, 252}};
    for (size_t i = 0; i < sizeof sc / sizeof sc[0]; i++) {
        float z[32] = {0};
        z[17] = -sc[i].amax;
        cr_assert_eq(toy_quantize_row(TOY_MXFP4, z, q, 32), TOY_OK);
        cr_expect_eq(q[0], sc[i].e, "amax %g: e %d, want %d", sc[i].amax, q[0], sc[i].e);
        if (sc[i].amax == 0)
            for (int j = 1; j < 17; j++) cr_expect_eq(q[j], 0);
    }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double urand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float nrand(void) {
    double u = urand(), v = urand();
    return (float)(sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

/* Quantize -> dequantize on N(0,1) data: the per-element error of the
 * legacy formats is bounded by their step, and the RMS error of every
 * format stays under its known level (measured values in comments). */
Test(quant, round_trip_error_bounds) {
    enum { N = 256 * 64 };
    float *x = malloc(N * 4), *y = malloc(N * 4);
    uint8_t *q = malloc(N * 2);
    for (int i = 0; i < N; i++) x[i] = nrand();
    struct { enum toy_dtype t; double max_rel_rmse; } cases[] = {
        {TOY_F16, 0.0003}, {TOY_BF16, 0.003},
        /* measured: q8_0 .0054, q4_0 .086, q4_1 .078, q5_0 .043, q5_1 .038,
         * q4_k .072, q5_k .036, q6_k .018, mxfp4 .115 (its scale a power of two) */
        {TOY_Q8_0, 0.006}, {TOY_Q4_0, 0.095}, {TOY_Q4_1, 0.086}, {TOY_Q5_0, 0.048}, {TOY_Q5_1, 0.042},
        {TOY_Q4_K, 0.08}, {TOY_Q5_K, 0.04}, {TOY_Q6_K, 0.02}, {TOY_MXFP4, 0.125},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        enum toy_dtype t = cases[c].t;
        cr_assert_eq(toy_quantize_row(t, x, q, N), TOY_OK);
        cr_assert_eq(toy_dequantize_row(t, q, y, N), TOY_OK);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) { se += (double)(x[i] - y[i]) * (x[i] - y[i]); sx += (double)x[i] * x[i]; }
        double rel = sqrt(se / sx);
        fprintf(stderr, "round trip %-5s relative RMS error %.5f\n", toy_dtype_name(t), rel);
        cr_expect(rel < cases[c].max_rel_rmse, "%s: relative RMS error %.5f >= %.5f", toy_dtype_name(t), rel,
                  cases[c].max_rel_rmse);
        if (t == TOY_Q8_0 || t == TOY_Q4_0 || t == TOY_Q5_0) {
            /* symmetric formats: |err| <= step/2 inside the range, one step at the clamp */
            double steps = t == TOY_Q8_0 ? 127 : t == TOY_Q4_0 ? 8 : 16;
            for (int b = 0; b < N / 32; b++) {
                float amax = 0;
                for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[b * 32 + i]));
                double step = amax / steps;
                /* plus |q| * (f16 rounding of d): q up to `steps`, d off by <= 2^-11 relative */
                double bound = (t == TOY_Q8_0 ? step / 2 : step) + steps * step / 2048 + 1e-7;
                for (int i = 0; i < 32; i++) {
                    double e = fabs(x[b * 32 + i] - y[b * 32 + i]);
                    cr_assert(e <= bound, "%s block %d: err %g bound %g", toy_dtype_name(t), b, e, bound);
                }
            }
        }
    }
    /* zeros stay zeros in every format */
    memset(x, 0, N * 4);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cr_assert_eq(toy_quantize_row(cases[c].t, x, q, 512), TOY_OK);
        cr_assert_eq(toy_dequantize_row(cases[c].t, q, y, 512), TOY_OK);
        for (int i = 0; i < 512; i++) cr_expect_eq(y[i], 0.0f, "%s", toy_dtype_name(cases[c].t));
    }
    free(x);
    free(y);
    free(q);
}

/* f16 rows (F16C where the CPU has it, dtype.c) give the scalar
 * conversions' bits: every one of the 65536 halves to f32, and to f16 from
 * random f32 bit patterns plus the edges (ties, subnormal and overflow
 * boundaries, inf, NaN), at every length's 8-wide tail. */
Test(quant, f16_rows_match_scalar) {
    enum { N = 65536 };
    toy_f16 *h = malloc(N * sizeof *h), *h2 = malloc(N * sizeof *h2);
    float *f = malloc(N * sizeof *f);
    for (int i = 0; i < N; i++) h[i] = (toy_f16)i;
    toy_f16_to_f32_row(h, f, N);
    for (int i = 0; i < N; i++) {
        float e = toy_f16_to_f32(h[i]);
        cr_assert(!memcmp(&f[i], &e, 4), "f16 %#06x: row %a, scalar %a", i, f[i], e);
    }
    uint32_t s = 12345;
    const uint32_t edges[] = {0x477fe000u, 0x477ff000u, 0x477fefffu, 0x38800000u, 0x387fffffu, 0x33000000u,
                              0x33000001u, 0x32ffffffu, 0x7f800000u, 0x7fc00000u, 0x7f800001u, 0xff812345u,
                              0x3f801000u, 0x3f803000u, 0x3f801001u, 0x00000001u, 0x80000000u, 0x34000000u};
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        uint32_t u = i < (int)(sizeof edges / sizeof edges[0]) ? edges[i] : s;
        memcpy(&f[i], &u, 4);
    }
    for (int n = N - 7; n <= N; n++) {
        toy_f32_to_f16_row(f, h2, n);
        for (int i = n - 16; i < n; i++)
            cr_assert_eq(h2[i], toy_f32_to_f16(f[i]), "n %d: f32 %a -> row %#06x, scalar %#06x", n, f[i], h2[i],
                         toy_f32_to_f16(f[i]));
    }
    toy_f32_to_f16_row(f, h2, N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(h2[i], toy_f32_to_f16(f[i]), "f32 %a (%#010x) -> row %#06x, scalar %#06x", f[i],
                     *(uint32_t *)&f[i], h2[i], toy_f32_to_f16(f[i]));
    free(h);
    free(h2);
    free(f);
}

/* bf16 rows (the vector path, 16 at a time, and its tail) give the scalar
 * conversions' bits for every kind of value: ties either way, the largest
 * finite values (rounding to inf), subnormals, zeros, infinities, NaNs with
 * payloads of both signs, and random bit patterns. */
Test(quant, bf16_rows_match_scalar_bit_for_bit) {
    enum { N = 4096 + 13 };
    static uint32_t u[N];
    static const uint32_t special[] = {0x00000000, 0x80000000, 0x00000001, 0x807fffff, 0x00400000, 0x3f808000,
                                       0x3f818000, 0x3f80ffff, 0x3f817fff, 0x7f7fffff, 0xff7fffff, 0x7f7f8000,
                                       0x7f800000, 0xff800000, 0x7f800001, 0x7fc00000, 0xffc12345, 0x7fffffff,
                                       0xff800001, 0x7f80ffff, 0x00008000, 0x3effff80};
    size_t ns = sizeof special / sizeof special[0];
    for (int i = 0; i < N; i++) {
        rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = i < (int)(4 * ns) ? special[i % ns] ^ (i >= (int)ns ? (uint32_t)(i / ns) : 0u) : (uint32_t)(rng_state >> 32);
    }
    static float x[N], back[N];
    static toy_bf16 h[N];
    memcpy(x, u, sizeof x);
    for (int n = 1; n <= N; n = n < 40 ? n + 1 : n * 2 + 1) {
        toy_f32_to_bf16_row(x, h, n);
        toy_bf16_to_f32_row(h, back, n);
        for (int i = 0; i < n; i++) {
            cr_assert_eq(h[i], toy_f32_to_bf16(x[i]), "n %d: 0x%08x -> 0x%04x, scalar 0x%04x", n, u[i], h[i],
                         toy_f32_to_bf16(x[i]));
            uint32_t b;
            memcpy(&b, &back[i], 4);
            cr_assert_eq(b, (uint32_t)h[i] << 16, "n %d: 0x%04x widened to 0x%08x", n, h[i], b);
        }
    }
}
