/* qgemm-avx2.c: the packed int8 products (qdot.h's layouts, toy_qpack) for
 * CPUs with AVX2 but without AVX-512 VNNI: decode and prefill of Q8_0,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and
 * MXFP4 weights from the packed groups, bit for bit as toy_qgemm_ref (qdot.c)
 * and so as the VNNI kernels of qgemm-avx512.c. Without them those CPUs
 * dequantized every K-quant weight to f32 for an sgemm, at a sixth of the
 * memory bound.
 *
 * AVX2 has no vpdpbusd. Its stand-in is vpmaddubsw (unsigned times signed
 * bytes, adjacent pairs added into int16, saturating) and vpmaddwd against
 * ones (pairs of int16 added into int32): together the same sum of 4
 * products per column lane, exact while no int16 sum saturates. The
 * activations are Q8_0 values in [-127, 127], so a pair of products is at
 * most 3810 for values below 16 (Q4_0, Q4_1, Q4_K: a block's 8 quads add up
 * in int16 before one vpmaddwd), 7874 below 32 (the Q5 types: 4 quads) and
 * 16002 below 64 (Q6_K: 2 quads); Q3_K's and Q2_K's values (below 8 and 4)
 * add up 4 quads, a 16-element sub-block. Nibbles are therefore shifted
 * down, not kept 16 times their value as the VNNI kernel keeps the high
 * ones. Q8_0's values and the IQ4 codebook's are signed: |w| times x with
 * w's sign moved onto x (vpsignb), at most 2 x 128 x 127 a pair, and no
 * offset to remove. MXFP4's (-12..12) go in unsigned, value + 12 looked up
 * as the codebook's are, and each block's dot starts from -12 sum(x) (as
 * Q4_0's from -8 sum(x)): at most 6096 a pair, 4 quads in int16. Without
 * the sign moves that ran 25-30% faster than the signed form (a one-row
 * product of 4096 x 4096 from L3 on a Zen 5 core: 267 us against 348;
 * IQ4_NL's 333).
 *
 * A packed vector holds 16 columns; here it is two 32-byte halves of 8,
 * each a pass of its own over the group (kernel_half). */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "core/quant-impl.h"
#include "toy/dtype.h"

typedef int32_t __attribute__((may_alias)) toy_i32_alias;

/* the 4 bytes at x in every 32-bit lane */
static inline __m256i bcast4(const int8_t *x) { return _mm256_set1_epi32(*(const toy_i32_alias *)x); }

static inline __m256 f16x8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* 8 MXFP4 scales from their E8M0 bytes at p: 2^(e - 128) (toy_e8m0_half) */
static inline __m256 e8m0x8(const uint8_t *p) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    __m256i nrm = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(nrm, sub, _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e)));
}

static inline __m256 u8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

static inline __m256 i8x8(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Q4_K or Q5_K block blk of a packed group, columns 8h..8h+7: d x scale
 * and dmin x min (exact in f32, as toy_qgemm_ref forms them) */
static inline __attribute__((always_inline)) void q4k_scales(const uint8_t *pk, int64_t blk, size_t super, int h,
                                                             __m256 *sw, __m256 *mn) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * super;
    int sb = (int)(blk % 8);
    *sw = _mm256_mul_ps(f16x8(sup + 16 * h), u8x8(sup + 64 + 16 * sb + 8 * h));
    *mn = _mm256_mul_ps(f16x8(sup + 32 + 16 * h), u8x8(sup + 192 + 16 * sb + 8 * h));
}

/* Q2_K block blk, columns 8h..8h+7: d x scale (s0, s1) and dmin x min
 * (m0, m1) of its two 16-element sub-blocks */
static inline __attribute__((always_inline)) void q2k_scales(const uint8_t *pk, int64_t blk, int h, __m256 *s0,
                                                             __m256 *s1, __m256 *m0, __m256 *m1) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * TOY_QPACK_SUPER_Q2_K, *sm = sup + 64 + 32 * (blk % 8) + 8 * h;
    __m256 d = f16x8(sup + 16 * h), dmin = f16x8(sup + 32 + 16 * h);
    __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm));
    __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sm + 16)));
    const __m256i f = _mm256_set1_epi32(15);
    *s0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b0, f)));
    *s1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b1, f)));
    *m0 = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(b0, 4)));
    *m1 = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(b1, 4)));
}

/* IQ4_XS block blk, columns 8h..8h+7: d x (scale - 32) */
static inline __attribute__((always_inline)) __m256 iq4xs_scales(const uint8_t *pk, int64_t blk, int h) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * TOY_QPACK_SUPER_IQ4_XS;
    return _mm256_mul_ps(f16x8(sup + 16 * h), i8x8(sup + 32 + 16 * (blk % 8) + 8 * h));
}

/* Q6_K (or Q3_K: super-blocks of `super` bytes) block blk, columns
 * 8h..8h+7: d x scale of its two 16-element sub-blocks */
static inline __attribute__((always_inline)) void q6k_scales(const uint8_t *pk, int64_t blk, size_t super, int h,
                                                             __m256 *s0, __m256 *s1) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * super, *sc = sup + 32 + 32 * (blk % 8);
    __m256 d = f16x8(sup + 16 * h);
    *s0 = _mm256_mul_ps(d, i8x8(sc + 8 * h));
    *s1 = _mm256_mul_ps(d, i8x8(sc + 16 + 8 * h));
}

/* Q6_K's top bits of quad t moved to bits 4, 5 (qgemm-avx512.c's q6_top) */
static inline __attribute__((always_inline)) __m256i q6_top(__m256i h, int t) {
    __m256i v = t == 0 ? _mm256_slli_epi16(h, 4) : t == 1 ? _mm256_slli_epi16(h, 2) : t == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x30));
}

/* Q3_K's third bit of quad t moved to bit 2 (q3_third there) */
static inline __attribute__((always_inline)) __m256i q3_third(__m256i h, int t) {
    __m256i v = t < 2 ? _mm256_slli_epi16(h, 2 - t) : t == 2 ? h : _mm256_srli_epi16(h, t - 2);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x04));
}

/* the fifth bit of quad t moved to bit 4 (q5_fifth there) */
static inline __attribute__((always_inline)) __m256i q5_fifth(__m256i h, int t) {
    __m256i v = t < 4 ? _mm256_slli_epi16(h, 4 - t) : t == 4 ? h : _mm256_srli_epi16(h, t - 4);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* quad t (elements 4t..4t+3 of a block) of the 8 columns at v (a packed
 * block's values, offset to the half): unsigned, except Q8_0's (signed) */
static inline __attribute__((always_inline)) __m256i quad_at(enum toy_dtype bt, const uint8_t *v, int t, __m256i hb0,
                                                             __m256i hb1) {
    if (bt == TOY_Q8_0) /* the packed values are w + 128 */
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(v + 64 * t)), _mm256_set1_epi8((char)0x80));
    if (bt == TOY_Q3_K || bt == TOY_Q2_K) { /* the pair of quad t; Q3_K's third bit (in hb0) */
        __m256i p = _mm256_loadu_si256((const __m256i *)(v + 64 * (t / 4)));
        __m256i w = _mm256_and_si256(_mm256_srli_epi16(p, 2 * (t % 4)), _mm256_set1_epi8(3));
        return bt == TOY_Q2_K ? w : _mm256_or_si256(w, q3_third(hb0, t));
    }
    __m256i q = _mm256_loadu_si256((const __m256i *)(v + 64 * (t % 4))), lo = _mm256_set1_epi8(15);
    __m256i w = _mm256_and_si256(t < 4 ? q : _mm256_srli_epi16(q, 4), lo);
    if (bt == TOY_IQ4_NL || bt == TOY_IQ4_XS) /* the codebook's values, signed */
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)toy_iq4_codebook)), w);
    if (bt == TOY_MXFP4) { /* its values + 12, unsigned (0..24): the block's dot starts from -12 sum(x) */
        static const uint8_t v12[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};
        return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)v12)), w);
    }
    if (bt == TOY_Q6_K) return _mm256_or_si256(w, q6_top(t < 4 ? hb0 : hb1, t % 4));
    if (bt == TOY_Q5_0 || bt == TOY_Q5_K || bt == TOY_Q5_1) return _mm256_or_si256(w, q5_fifth(hb0, t));
    return w;
}

/* R (<= 4) rows of A times columns 8h..8h+7 of one packed group: one pass
 * over its blocks (the two halves of a group are two passes, so that only
 * R accumulators live across blocks; the second pass finds the group in
 * cache). Each output gets qgemm-avx512.c's float arithmetic. Quads run
 * outermost and rows inside, adding G quads' products in int16 before
 * vpmaddwd: G = 8 for values below 16, 4 below 32, 2 for Q6_K's, 1 for
 * Q8_0's. ksc: the K-quants' scales made ahead (32 floats a block), or NULL. */
static inline __attribute__((always_inline)) void kernel_half(int R, int h, enum toy_dtype bt, int64_t nb,
                                                              const int8_t *qa, int64_t ldq, const float *da,
                                                              const int32_t *sa, const float *xs,
                                                              const uint8_t *pk, const float *ksc, float *c,
                                                              int64_t ldc, int nc, bool accum,
                                                              struct toy_pf_cursor *pc, int ahead) {
    bool q8 = bt == TOY_Q8_0, q5 = bt == TOY_Q5_0, q3 = bt == TOY_Q3_K, q2 = bt == TOY_Q2_K, k5 = bt == TOY_Q5_K;
    bool q6 = bt == TOY_Q6_K || q3 || q2, qk = bt == TOY_Q4_K || k5; /* q6: two 16-element sub-blocks a block */
    bool q51 = bt == TOY_Q5_1, m1 = bt == TOY_Q4_1 || q51, five = q5 || k5 || q51;
    bool mx = bt == TOY_MXFP4, ixs = bt == TOY_IQ4_XS;
    bool sgn = q8 || ixs || bt == TOY_IQ4_NL; /* signed values: |w| x sign(x, w) */
    /* Q3_K's values are below 8, Q2_K's 4, MXFP4's + 12 at most 24 */
    const int G = sgn ? 1 : q3 || q2 ? 4 : q6 ? 2 : five || mx ? 4 : 8;
    size_t bb = q8 ? TOY_QPACK_BLOCK_Q8_0 : q5 ? TOY_QPACK_BLOCK_Q5_0 : q51 ? TOY_QPACK_BLOCK_Q5_1
              : m1 ? TOY_QPACK_BLOCK_Q4_1 : mx ? TOY_QPACK_BLOCK_MXFP4 : TOY_QPACK_BLOCK_Q4_0;
    size_t super = q2 ? TOY_QPACK_SUPER_Q2_K : q3 ? TOY_QPACK_SUPER_Q3_K : q6 ? TOY_QPACK_SUPER_Q6_K
                 : k5 ? TOY_QPACK_SUPER_Q5_K : ixs ? TOY_QPACK_SUPER_IQ4_XS : TOY_QPACK_SUPER_Q4_K;
    size_t head = q2 ? TOY_QPACK_HEAD_Q2_K : q6 ? TOY_QPACK_HEAD_Q6_K : ixs ? TOY_QPACK_HEAD_IQ4_XS : TOY_QPACK_HEAD_Q4_K;
    size_t sub = q2 ? 128 : q3 ? 192 : q6 ? 384 : k5 ? 320 : 256;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        if (!h) toy_pf_step(pc);
        const uint8_t *vals, *blkp = pk;
        if (qk || q6 || ixs) {
            int sb = (int)(blk % 8);
            const uint8_t *sup = pk + (size_t)(blk / 8) * super;
            if (!sb && ahead)
                for (size_t o = 0; o < head; o += 64) _mm_prefetch((const char *)sup + ahead + o, _MM_HINT_T0);
            vals = sup + head + sub * sb;
            if (ahead)
                for (size_t o = 0; o < sub; o += 64) _mm_prefetch((const char *)vals + ahead + o, _MM_HINT_T0);
        } else {
            if (ahead)
                for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)pk + ahead + o, _MM_HINT_T0);
            vals = pk + (m1 ? 64 : mx ? 16 : 32);
            pk += bb;
        }
        __m256 sw, mn = _mm256_setzero_ps(), mq0 = mn, mq1 = mn; /* Q2_K's mins */
        if (ksc) {
            const float *k = ksc + (q2 ? 64 : 32) * blk + 8 * h;
            sw = _mm256_loadu_ps(k);
            mn = _mm256_loadu_ps(k + 16);
            if (q2) mq0 = _mm256_loadu_ps(k + 32), mq1 = _mm256_loadu_ps(k + 48);
        } else if (q2) {
            q2k_scales(blkp, blk, h, &sw, &mn, &mq0, &mq1);
        } else if (q6) {
            q6k_scales(blkp, blk, super, h, &sw, &mn);
        } else if (ixs) {
            sw = iq4xs_scales(blkp, blk, h);
        } else if (qk) {
            q4k_scales(blkp, blk, super, h, &sw, &mn);
        } else if (mx) {
            sw = e8m0x8(blkp + 8 * h);
        } else {
            sw = f16x8(blkp + 16 * h);
            if (m1) mn = _mm256_sub_ps(mn, f16x8(blkp + 32 + 16 * h)); /* -m, as there */
        }
        const uint8_t *v = vals + 32 * h;
        __m256i hb0 = _mm256_setzero_si256(), hb1 = hb0;
        if (q3) hb0 = _mm256_loadu_si256((const __m256i *)(v + 128));
        else if (q6 || five) hb0 = _mm256_loadu_si256((const __m256i *)(v + 256));
        if (q6 && !q3) hb1 = _mm256_loadu_si256((const __m256i *)(v + 320));
        __m256i ia[4], s[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) ia[r] = _mm256_set1_epi32(sa[r * nb + blk]);
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            __m256i w = quad_at(bt, v, t, hb0, hb1), aw = sgn ? _mm256_abs_epi8(w) : w;
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m256i x = bcast4(qa + r * ldq + blk * 32 + 4 * t);
                __m256i p = _mm256_maddubs_epi16(aw, sgn ? _mm256_sign_epi8(x, w) : x);
                s[r] = t % G ? _mm256_add_epi16(s[r], p) : p;
                if (t % G == G - 1) ia[r] = _mm256_add_epi32(ia[r], _mm256_madd_epi16(s[r], ones));
            }
            if (q6 && t == 3) /* the first 16 done: scaled in, the second from -32 sum(x) of theirs */
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), _mm256_mul_ps(sw, _mm256_set1_ps(da[r * nb + blk])), acc[r]);
                    ia[r] = q2 ? _mm256_setzero_si256() : _mm256_set1_epi32(((const int32_t *)xs)[r * nb + blk]);
                }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 dx = _mm256_set1_ps(da[r * nb + blk]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[r]), _mm256_mul_ps(q6 ? mn : sw, dx), acc[r]);
            if (qk || m1) acc[r] = _mm256_fnmadd_ps(mn, _mm256_set1_ps(xs[r * nb + blk]), acc[r]);
            if (q2) { /* the mins, each against d_x sum(x) of its 16 (two int16 in xs) */
                uint32_t hs = ((const uint32_t *)xs)[r * nb + blk];
                float d1 = da[r * nb + blk];
                acc[r] = _mm256_fnmadd_ps(mq0, _mm256_set1_ps(d1 * (float)(int16_t)(hs & 0xffff)), acc[r]);
                acc[r] = _mm256_fnmadd_ps(mq1, _mm256_set1_ps(d1 * (float)(int16_t)(hs >> 16)), acc[r]);
            }
        }
    }
    int left = nc - 8 * h;
    __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        float *dst = c + r * ldc + 8 * h;
        __m256 v = acc[r];
        if (accum) v = _mm256_add_ps(v, _mm256_maskload_ps(dst, m));
        _mm256_maskstore_ps(dst, m, v);
    }
}

/* both halves of a group (the second only where it has columns) */
static inline __attribute__((always_inline)) void kernel_packed(int R, enum toy_dtype bt, int64_t nb,
                                                                const int8_t *qa, int64_t ldq, const float *da,
                                                                const int32_t *sa, const float *xs,
                                                                const uint8_t *pk, const float *ksc, float *c,
                                                                int64_t ldc, int nc, bool accum,
                                                                struct toy_pf_cursor *pc, int ahead) {
    kernel_half(R, 0, bt, nb, qa, ldq, da, sa, xs, pk, ksc, c, ldc, nc, accum, pc, ahead);
    if (nc > 8) kernel_half(R, 1, bt, nb, qa, ldq, da, sa, xs, pk, ksc, c, ldc, nc, accum, pc, 0);
}

/* Q8_0 quantization of activations, bit for bit as toy_quantize_q8_0_ref:
 * d = max|x| / 127 (f16, round to nearest even), q = roundf(x / d) as
 * x * (1 / d) with ties away from zero */
static void quantize_q8_0(const float *x, void *yv, int64_t n) {
    uint8_t *y = yv;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t blk = 0; blk < n / 32; blk++, x += 32, y += 34) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absmask), _mm256_and_ps(v[1], absmask)),
                                  _mm256_max_ps(_mm256_and_ps(v[2], absmask), _mm256_and_ps(v[3], absmask)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float amax = _mm_cvtss_f32(m4);
        float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
        uint16_t hd = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(y, &hd, 2);
        __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_mul_ps(v[i], vid);
            __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
            __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(t, r), absmask), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
            /* r + sign(t) where the dropped fraction is at least one half */
            __m256 one = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_andnot_ps(absmask, t));
            q[i] = _mm256_cvtps_epi32(_mm256_add_ps(r, _mm256_and_ps(up, one)));
        }
        /* packs interleave the 128-bit lanes: 4-byte groups come out as
         * q0a q1a q2a q3a q0b q1b q2b q3b */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(y + 2), b);
    }
}

/* scratch: qgemm-avx512.c's layout (toy_qgemm_scratch): A's int8 rows,
 * scales, corrections, d_x sum(x), one Q8_0 row, then room the K-quants'
 * scales made ahead use */
static float *scratch_layout(int64_t m, int64_t k, void *scratch, int8_t **qa, float **da, int32_t **sa,
                             float **xs) {
    int64_t nb = k / 32;
    *qa = scratch;
    *da = (float *)(*qa + m * nb * 32);
    *sa = (int32_t *)(*da + m * nb);
    *xs = (float *)(*sa + m * nb);
    uint8_t *q8 = (uint8_t *)(*xs + m * nb), *after = q8 + ((nb * 34 + 63) & ~(int64_t)63);
    return (float *)(((uintptr_t)after + 63) & ~(uintptr_t)63);
}

/* A's rows quantized to Q8_0 and split: values, scales, and the offset
 * corrections -off sum(x) (Q6_K: each 16's apart; Q8_0 has none here) */
void toy_qgemm_packed_prep_avx2(enum toy_dtype bt, int64_t m, int64_t k, const float *a, int64_t lda,
                                void *scratch) {
    int64_t nb = k / 32;
    int off = bt == TOY_Q4_0 ? 8 : bt == TOY_Q5_0 ? 16 : bt == TOY_Q6_K ? 32 : bt == TOY_Q3_K ? 4
            : bt == TOY_MXFP4 ? 12 : 0;
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    scratch_layout(m, k, scratch, &qa, &da, &sa, &xs);
    uint8_t *q8 = (uint8_t *)(xs + m * nb);
    const __m256i ones8 = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < m; i++) {
        quantize_q8_0(a + i * lda, q8, k);
        for (int64_t blk = 0; blk < nb; blk++) {
            const uint8_t *q = q8 + blk * 34;
            uint16_t hd;
            memcpy(&hd, q, 2);
            da[i * nb + blk] = _cvtsh_ss(hd);
            __m256i x = _mm256_loadu_si256((const __m256i *)(q + 2));
            _mm256_storeu_si256((__m256i *)(qa + (i * nb + blk) * 32), x);
            /* the 32 signed bytes summed: pairs, then pairs of pairs */
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, x), _mm256_set1_epi16(1));
            __m128i s0 = _mm256_castsi256_si128(s), s1 = _mm256_extracti128_si256(s, 1); /* bytes 0-15, 16-31 */
            s0 = _mm_add_epi32(s0, _mm_shuffle_epi32(s0, 0x4e));
            s0 = _mm_add_epi32(s0, _mm_shuffle_epi32(s0, 0xb1));
            s1 = _mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0x4e));
            s1 = _mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0xb1));
            toy_qgemm_block_start(bt, off, _mm_cvtsi128_si32(s0), _mm_cvtsi128_si32(s1), da[i * nb + blk],
                                  &sa[i * nb + blk], &xs[i * nb + blk]);
        }
    }
}

/* Columns [0, n) of C from the packed groups at `packed`, A prepared by
 * toy_qgemm_packed_prep_avx2; every row count runs from the groups (4
 * rows a pass) */
void toy_qgemm_packed_cols_avx2(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const void *packed, float *c,
                                int64_t ldc, bool accum, void *scratch, struct toy_pf_cursor *pcp) {
    int64_t nb = k / 32;
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    float *room = scratch_layout(m, k, scratch, &qa, &da, &sa, &xs);
    size_t group = toy_qpack_group_bytes(bt, k);
    const uint8_t *pk = packed;
    if (m > 8) pcp = NULL;
    int ahead = toy_cpu_prefetch_ahead_rows(m);
    bool kq = bt == TOY_Q4_K || bt == TOY_Q5_K || bt == TOY_Q6_K || bt == TOY_IQ4_XS || bt == TOY_Q3_K || bt == TOY_Q2_K;
    float *ksc = kq && m > 4 ? room : NULL;
    for (int64_t j = 0; j < n; j += 16, pk += group) {
        int nc = n - j < 16 ? (int)(n - j) : 16;
        int64_t i = 0;
        if (ksc)
            for (int64_t blk = 0; blk < nb; blk++)
                for (int h = 0; h < 2; h++) {
                    __m256 sw, mn;
                    if (bt == TOY_Q2_K) {
                        __m256 m0, m1;
                        q2k_scales(pk, blk, h, &sw, &mn, &m0, &m1);
                        _mm256_storeu_ps(ksc + 64 * blk + 8 * h, sw);
                        _mm256_storeu_ps(ksc + 64 * blk + 16 + 8 * h, mn);
                        _mm256_storeu_ps(ksc + 64 * blk + 32 + 8 * h, m0);
                        _mm256_storeu_ps(ksc + 64 * blk + 48 + 8 * h, m1);
                        continue;
                    }
                    if (bt == TOY_Q6_K || bt == TOY_Q3_K)
                        q6k_scales(pk, blk, bt == TOY_Q3_K ? TOY_QPACK_SUPER_Q3_K : TOY_QPACK_SUPER_Q6_K, h, &sw, &mn);
                    else if (bt == TOY_IQ4_XS) sw = iq4xs_scales(pk, blk, h), mn = _mm256_setzero_ps();
                    else q4k_scales(pk, blk, bt == TOY_Q5_K ? TOY_QPACK_SUPER_Q5_K : TOY_QPACK_SUPER_Q4_K, h, &sw, &mn);
                    _mm256_storeu_ps(ksc + 32 * blk + 8 * h, sw);
                    _mm256_storeu_ps(ksc + 32 * blk + 16 + 8 * h, mn);
                }
#define KP(R, T, K) kernel_packed(R, T, nb, qa + i * nb * 32, nb * 32, da + i * nb, sa + i * nb, xs + i * nb, pk, \
                                  K ? ksc : NULL, c + i * ldc + j, ldc, nc, accum, i ? NULL : pcp, i ? 0 : ahead)
#define KP_ROWS(T)                                          \
    do {                                                    \
        if (ksc) {                                          \
            for (; i + 4 <= m; i += 4) KP(4, T, true);      \
            for (; i < m; i++) KP(1, T, true);              \
        } else if (T == TOY_Q8_0 || T == TOY_Q4_0) {        \
            for (; i + 4 <= m; i += 4) KP(4, T, false);     \
            switch (m - i) { /* the rest in one pass */     \
            case 3: KP(3, T, false); break;                 \
            case 2: KP(2, T, false); break;                 \
            case 1: KP(1, T, false); break;                 \
            }                                               \
        } else {                                            \
            for (; i + 4 <= m; i += 4) KP(4, T, false);     \
            for (; i < m; i++) KP(1, T, false);             \
        }                                                   \
    } while (0)
        switch (bt) {
        case TOY_Q8_0: KP_ROWS(TOY_Q8_0); break;
        case TOY_Q4_0: KP_ROWS(TOY_Q4_0); break;
        case TOY_Q4_1: KP_ROWS(TOY_Q4_1); break;
        case TOY_Q5_0: KP_ROWS(TOY_Q5_0); break;
        case TOY_Q5_1: KP_ROWS(TOY_Q5_1); break;
        case TOY_Q4_K: KP_ROWS(TOY_Q4_K); break;
        case TOY_Q5_K: KP_ROWS(TOY_Q5_K); break;
        case TOY_Q6_K: KP_ROWS(TOY_Q6_K); break;
        case TOY_IQ4_NL: KP_ROWS(TOY_IQ4_NL); break;
        case TOY_IQ4_XS: KP_ROWS(TOY_IQ4_XS); break;
        case TOY_MXFP4: KP_ROWS(TOY_MXFP4); break;
        case TOY_Q3_K: KP_ROWS(TOY_Q3_K); break;
        case TOY_Q2_K: KP_ROWS(TOY_Q2_K); break;
        default: return; /* packable() admits the types above only */
        }
#undef KP_ROWS
#undef KP
    }
}

void toy_qgemm_packed_avx2(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                           const void *packed, float *c, int64_t ldc, bool accum, void *scratch,
                           const struct toy_prefetch *pf) {
    toy_qgemm_packed_prep_avx2(bt, m, k, a, lda, scratch);
    struct toy_pf_cursor pc, *pcp = toy_pf_start(&pc, m <= 8 ? pf : NULL, (k / 32) * ((n + 15) / 16));
    toy_qgemm_packed_cols_avx2(bt, m, n, k, packed, c, ldc, accum, scratch, pcp);
}

void toy_qdot_fill_qgemm_avx2(struct toy_qdot_ops *ops) {
    ops->quantize_q8_0 = quantize_q8_0;
    ops->qgemm_packed = toy_qgemm_packed_avx2;
    ops->qgemm_packed_prep = toy_qgemm_packed_prep_avx2;
    ops->qgemm_packed_cols = toy_qgemm_packed_cols_avx2;
}
