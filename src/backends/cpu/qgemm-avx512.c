/* qgemm-avx512.c: C (m x n) = Q8(A) (m x k) times B^T for Q8_0 / Q4_0
 * weight rows B (n x k), and packed Q4_1 / Q5_0 / Q5_1 / Q2_K / Q3_K / Q4_K /
 * Q5_K / Q6_K / IQ4_NL / IQ4_XS / MXFP4 ones (qdot.h's
 * layouts: kernel_packed), with AVX-512 VNNI: the decode, prefill and
 * batched-serving matmul of quantized models. Reference and the exact
 * rules: qdot.c (toy_qgemm_ref); the two agree bit for bit.
 *
 * Layouts. A's rows are quantized to Q8_0 (the same blocks the GEMV path
 * uses), then split into the int8 values, the f32 scale and a per-block
 * correction (below). B is packed 16 columns at a time into a panel that
 * puts, for every 32-element block, quad t (elements 4t..4t+3) of the 16
 * columns side by side in one 64-byte vector: one vpdpbusd against quad t of
 * an A row (broadcast) then adds 4 products to each of 16 columns, so each
 * lane holds one column's block dot product, exact in int32, and the float
 * work (convert, scale, accumulate) is one instruction per 8 vpdpbusd.
 *
 * vpdpbusd multiplies unsigned by signed bytes: the weights go in unsigned
 * (Q8_0: w + 128; Q4_0: the raw nibble, w + 8) and the activations signed,
 * and each block's dot starts from -off * sum(x) (off = 128 or 8), which
 * removes the offset exactly. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>
#include <stdlib.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "core/quant-impl.h"
#include "toy/dtype.h"

#define PANEL_BLOCK 576 /* 8 quads x 64 bytes + 16 f32 scales */

/* Packs columns [0, nc) (nc <= 16) of B (rows of k, `ldb` bytes apart) into
 * a panel of nb blocks; absent columns read as zero. */
static void pack_panel(enum toy_dtype bt, const uint8_t *b, size_t ldb, int nc, int64_t nb, uint8_t *panel) {
    __mmask16 mask = (__mmask16)((1u << nc) - 1);
    __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                      _mm512_set1_epi32((int)ldb));
    const __m512i zero = _mm512_setzero_si512();
    size_t bs = bt == TOY_Q8_0 ? 34 : 18;
    for (int64_t blk = 0; blk < nb; blk++) {
        const uint8_t *base = b + blk * bs;
        uint8_t *out = panel + blk * PANEL_BLOCK;
        __m512i d = _mm512_mask_i32gather_epi32(zero, mask, rows, base, 1);
        _mm512_storeu_ps(out + 512, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d)));
        if (bt == TOY_Q8_0) {
            const __m512i flip = _mm512_set1_epi8((char)0x80);
            for (int t = 0; t < 8; t++) {
                __m512i q = _mm512_mask_i32gather_epi32(zero, mask, rows, base + 2 + 4 * t, 1);
                _mm512_storeu_si512(out + 64 * t, _mm512_xor_si512(q, flip));
            }
        } else {
            const __m512i lo = _mm512_set1_epi8(15);
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_mask_i32gather_epi32(zero, mask, rows, base + 2 + 4 * u, 1);
                _mm512_storeu_si512(out + 64 * u, _mm512_and_si512(q, lo));
                _mm512_storeu_si512(out + 64 * (u + 4), _mm512_and_si512(_mm512_srli_epi16(q, 4), lo));
            }
        }
    }
}

/* R rows of A times P panels (16 P columns). qa: R rows of nb x 32 int8,
 * ldq bytes apart; da / sa: R rows of nb scales / corrections. */
static inline __attribute__((always_inline)) void kernel(int R, int P, int64_t nb, const int8_t *qa, int64_t ldq,
                                                         const float *da, const int32_t *sa, const uint8_t *panel,
                                                         size_t panel_bytes, float *c, int64_t ldc, int nc,
                                                         bool accum) {
    __m512 acc[4][2];
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 8
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        __m512i ia[4][2];
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512i s = _mm512_set1_epi32(sa[r * nb + blk]);
            #pragma GCC unroll 8
            for (int p = 0; p < P; p++) ia[r][p] = s;
        }
        const uint8_t *pb = panel + blk * PANEL_BLOCK;
        #pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            __m512i w[2];
            #pragma GCC unroll 8
            for (int p = 0; p < P; p++) w[p] = _mm512_loadu_si512(pb + p * panel_bytes + 64 * t);
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int32_t xq;
                memcpy(&xq, qa + r * ldq + blk * 32 + 4 * t, 4);
                __m512i x = _mm512_set1_epi32(xq);
                #pragma GCC unroll 8
                for (int p = 0; p < P; p++) ia[r][p] = _mm512_dpbusd_epi32(ia[r][p], w[p], x);
            }
        }
        #pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            __m512 sw = _mm512_loadu_ps(pb + p * panel_bytes + 512);
            #pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(da[r * nb + blk]));
                acc[r][p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia[r][p]), s, acc[r][p]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 8
        for (int p = 0; p < P; p++) {
            int left = nc - 16 * p;
            __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            float *dst = c + r * ldc + 16 * p;
            __m512 v = acc[r][p];
            if (accum) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst));
            _mm512_mask_storeu_ps(dst, m, v);
        }
}

#define KERNEL_CASE(R, P) \
    kernel(R, P, nb, qa + i * ldq, ldq, da + i * nb, sa + i * nb, panel, panel_bytes, c + i * ldc + j, ldc, nc, accum)

static void rows_times_panels(int64_t m, int P, int64_t nb, const int8_t *qa, int64_t ldq, const float *da,
                              const int32_t *sa, const uint8_t *panel, size_t panel_bytes, float *c, int64_t ldc,
                              int64_t j, int nc, bool accum) {
    int64_t i = 0;
    if (P == 2) {
        for (; i + 4 <= m; i += 4) KERNEL_CASE(4, 2);
        for (; i < m; i++) KERNEL_CASE(1, 2);
    } else {
        for (; i + 4 <= m; i += 4) KERNEL_CASE(4, 1);
        for (; i < m; i++) KERNEL_CASE(1, 1);
    }
}

/* A panel (the kernel's layout) from one packed group: the values are
 * already side by side; Q4_0 nibbles are split, scales widened to f32. */
static void panel_from_packed(enum toy_dtype bt, const uint8_t *pk, int64_t nb, uint8_t *panel) {
    bool q8 = bt == TOY_Q8_0;
    size_t bb = q8 ? TOY_QPACK_BLOCK_Q8_0 : TOY_QPACK_BLOCK_Q4_0;
    const __m512i lo = _mm512_set1_epi8(15);
    for (int64_t blk = 0; blk < nb; blk++, pk += bb, panel += PANEL_BLOCK) {
        _mm512_storeu_ps(panel + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pk)));
        if (q8) {
            for (int t = 0; t < 8; t++) _mm512_storeu_si512(panel + 64 * t, _mm512_loadu_si512(pk + 32 + 64 * t));
        } else {
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_loadu_si512(pk + 32 + 64 * u);
                _mm512_storeu_si512(panel + 64 * u, _mm512_and_si512(q, lo));
                _mm512_storeu_si512(panel + 64 * (u + 4), _mm512_and_si512(_mm512_srli_epi16(q, 4), lo));
            }
        }
    }
}

/* R (<= 4) rows of A times one packed group of 16 columns, read straight
 * from the packed weights (decode: loads and arithmetic interleave, so the
 * memory stream never pauses), with exactly the panel kernel's arithmetic
 * per output. `ahead`: prefetch the stream that many bytes ahead, on CPUs
 * where that pays (toy_cpu_prefetch_ahead; on a Zen 4 the hardware follows
 * the one stream, and prefetch instructions cost 15% of the bandwidth). */
/* Q8_0's 64 bytes of weights as two 32-byte loads, except where
 * toy_cpu_wide_loads says the CPU streams one 64-byte load faster: on an
 * Emerald Rapids Xeon Q8_0 decodes at 216 tok/s with it against 145 with
 * 16-byte loads (6 interleaved pairs). On a Zen 4, SmolLM2-135M Q8_0 decode
 * steps took 6.6-9.9% less time with 32-byte loads than with four 16-byte
 * ones (five runs, contexts 256 and 1024, the two alternated step by step
 * in each run), and 6.2% less with one 64-byte load. (Q8_0 used 16-byte
 * loads on AMD until this kernel's products ran in two chains; a Zen 5
 * measured them best then, and is not measured with 32.)
 * Nibbles (Q4_0, Q4_K) are read with one 64-byte load on every CPU: on the
 * Zen 4, Q4_0 steps took 0.3-2.5% less time than with two 32-byte loads
 * (five runs, contexts 256 and 1024); the Emerald Rapids Xeon decoded Q4_0
 * at 350 tok/s with them against 357 with 32-byte ones, within its noise. */
static inline __m512i load64_2(const uint8_t *p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p)),
                              _mm256_loadu_si256((const __m256i *)(p + 32)), 1);
}

/* acc + vpdpbusd(w, the 4 bytes at x in every lane), with the 4 bytes read
 * by the instruction itself (an embedded broadcast). GCC loads them with a
 * vpbroadcastd of their own: a micro-op more per product, and the decode
 * loop streams its weights from memory at a rate its micro-ops per line
 * bound (the fewer, the more lines in flight). On the Zen 4, decode's
 * products over SmolLM2-135M's weights went from 85-91% to 100-104% of a
 * loads-only pass over the same nodes in Q8_0, and from 80-90% to 91-95%
 * in Q4_0 (bench-llama 2 M stream, three runs each, old and new binaries
 * alternated). */
typedef int32_t __attribute__((may_alias)) toy_i32_alias;
static inline __attribute__((always_inline)) __m512i dpbusd_bcst(__m512i acc, __m512i w, const int8_t *x) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const toy_i32_alias *)x));
    return acc;
}

/* Q4_K or Q5_K block blk of a packed group (super-blocks of `super`
 * bytes): the 16 rows' d x scale and dmin x min (exact in f32, as
 * toy_qgemm_ref forms them) */
static inline __attribute__((always_inline)) void q4k_scales(const uint8_t *pk, int64_t blk, size_t super, __m512 *sw,
                                                             __m512 *mn) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * super;
    int sb = (int)(blk % 8);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sup));
    __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sup + 32)));
    *sw = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sup + 64 + 16 * sb)))));
    *mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sup + 192 + 16 * sb)))));
}

/* Q2_K block blk of a packed group: the 16 rows' d x scale (s0, s1) and
 * dmin x min (m0, m1) of its two 16-element sub-blocks (exact in f32) */
static inline __attribute__((always_inline)) void q2k_scales(const uint8_t *pk, int64_t blk, __m512 *s0, __m512 *s1,
                                                             __m512 *m0, __m512 *m1) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * TOY_QPACK_SUPER_Q2_K, *sm = sup + 64 + 32 * (blk % 8);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sup));
    __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sup + 32)));
    __m512i b0 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sm));
    __m512i b1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sm + 16)));
    const __m512i f = _mm512_set1_epi32(15);
    *s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b0, f)));
    *s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b1, f)));
    *m0 = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(b0, 4)));
    *m1 = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(b1, 4)));
}

/* IQ4_XS block blk of a packed group: the 16 rows' d x (scale - 32) */
static inline __attribute__((always_inline)) __m512 iq4xs_scales(const uint8_t *pk, int64_t blk) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * TOY_QPACK_SUPER_IQ4_XS;
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sup));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sup + 32 + 16 * (blk % 8))))));
}

/* the IQ4 codebook + 128 (unsigned, for vpdpbusd: toy_iq4_codebook ^ 0x80)
 * in every 128-bit lane */
static inline __m512i iq4_table(void) {
    static const uint8_t t[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
}

/* MXFP4's values + 128 (toy_mxfp4_values ^ 0x80), likewise */
static inline __m512i mxfp4_table(void) {
    static const uint8_t t[16] = {128, 129, 130, 131, 132, 134, 136, 140, 128, 127, 126, 125, 124, 122, 120, 116};
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
}

/* the 16 rows' MXFP4 scales from their E8M0 bytes at p: 2^(e - 128)
 * (toy_e8m0_half), the bits (e - 1) << 23, or a subnormal for e < 2 */
static inline __attribute__((always_inline)) __m512 e8m0_x16(const uint8_t *p) {
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    __m512i nrm = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), nrm, sub));
}

/* Q6_K (or Q3_K: super-blocks of `super` bytes) block blk of a packed
 * group: the 16 rows' d x scale of its two 16-element sub-blocks (exact in
 * f32) */
static inline __attribute__((always_inline)) void q6k_scales(const uint8_t *pk, int64_t blk, size_t super, __m512 *s0,
                                                             __m512 *s1) {
    const uint8_t *sup = pk + (size_t)(blk / 8) * super, *sc = sup + 32 + 32 * (blk % 8);
    __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sup));
    *s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)sc))));
    *s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(sc + 16)))));
}

/* bits 2t, 2t + 1 of each byte of h moved to bits 4, 5 (the others cleared):
 * the top bits of Q6_K's quad t (16-bit shifts; what crosses into the next
 * byte lands outside bits 4-5) */
static inline __attribute__((always_inline)) __m512i q6_top(__m512i h, int t) {
    const __m512i m = _mm512_set1_epi8(0x30);
    __m512i v = t == 0 ? _mm512_slli_epi16(h, 4) : t == 1 ? _mm512_slli_epi16(h, 2) : t == 2 ? h : _mm512_srli_epi16(h, 2);
    return _mm512_and_si512(v, m);
}

/* bit t of each byte of h moved to bit 2 (the others cleared): the third
 * bit of Q3_K's quad t (what crosses bytes lands elsewhere, as below) */
static inline __attribute__((always_inline)) __m512i q3_third(__m512i h, int t) {
    __m512i v = t < 2 ? _mm512_slli_epi16(h, 2 - t) : t == 2 ? h : _mm512_srli_epi16(h, t - 2);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x04));
}

/* bit t of each byte of h moved to bit 4 (the others cleared): the fifth
 * bit of Q5_0's and Q5_K's quad t (as q6_top, what crosses bytes lands
 * elsewhere) */
static inline __attribute__((always_inline)) __m512i q5_fifth(__m512i h, int t) {
    __m512i v = t < 4 ? _mm512_slli_epi16(h, 4 - t) : t == 4 ? h : _mm512_srli_epi16(h, t - 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x10));
}

/* ksc: the scales and mins (Q4_K) or the two sub-blocks' scales (Q6_K) of
 * the group's blocks made ahead (32 floats a block: q4k_scales' or
 * q6k_scales'; Q2_K 64: q2k_scales'), for products of many rows whose
 * passes over the group would each make them again; NULL: made as the
 * blocks come */
static inline __attribute__((always_inline)) void kernel_packed(int R, bool wide, enum toy_dtype bt, int64_t nb,
                                                                const int8_t *qa, int64_t ldq, const float *da,
                                                                const int32_t *sa, const float *xs,
                                                                const uint8_t *pk, const float *ksc, float *c,
                                                                int64_t ldc, int nc, bool accum,
                                                                struct toy_pf_cursor *pc, int ahead) {
    bool q8 = bt == TOY_Q8_0, q5 = bt == TOY_Q5_0, q3 = bt == TOY_Q3_K, q2 = bt == TOY_Q2_K, k5 = bt == TOY_Q5_K;
    bool q6 = bt == TOY_Q6_K || q3 || q2, qk = bt == TOY_Q4_K || k5; /* q6: two 16-element sub-blocks a block */
    bool q51 = bt == TOY_Q5_1, m1 = bt == TOY_Q4_1 || q51; /* with a min m: + m d_x sum(x) */
    bool ixs = bt == TOY_IQ4_XS, iq = ixs || bt == TOY_IQ4_NL; /* codebook indices */
    bool mx = bt == TOY_MXFP4; /* indices into MXFP4's values, E8M0 scales */
    /* K-quants: by super-block, below */
    size_t bb = q8 ? TOY_QPACK_BLOCK_Q8_0 : q5 ? TOY_QPACK_BLOCK_Q5_0 : q51 ? TOY_QPACK_BLOCK_Q5_1
              : m1 ? TOY_QPACK_BLOCK_Q4_1 : mx ? TOY_QPACK_BLOCK_MXFP4 : TOY_QPACK_BLOCK_Q4_0;
    /* K-quants: a super-block's bytes, its head's, and a 32-element block's values' */
    size_t super = q2 ? TOY_QPACK_SUPER_Q2_K : q3 ? TOY_QPACK_SUPER_Q3_K : q6 ? TOY_QPACK_SUPER_Q6_K
                 : k5 ? TOY_QPACK_SUPER_Q5_K : ixs ? TOY_QPACK_SUPER_IQ4_XS : TOY_QPACK_SUPER_Q4_K;
    size_t head = q2 ? TOY_QPACK_HEAD_Q2_K : q6 ? TOY_QPACK_HEAD_Q6_K : ixs ? TOY_QPACK_HEAD_IQ4_XS : TOY_QPACK_HEAD_Q4_K;
    size_t sub = q2 ? 128 : q3 ? 192 : q6 ? 384 : k5 ? 320 : 256;
    const __m512i lo = _mm512_set1_epi8(15), hi = _mm512_set1_epi8((char)0xF0);
    const __m512i tbl = iq ? iq4_table() : mx ? mxfp4_table() : lo;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < nb; blk++) {
        toy_pf_step(pc);
        /* the block's scales (sw; Q4_K: mins mn; Q6_K: sw for the first 16
         * elements, mn the second 16's) and value vectors */
        const uint8_t *vals;
        __m512 sw, mn = _mm512_setzero_ps(), mq0 = mn, mq1 = mn; /* Q2_K's mins */
        if (qk || q6 || ixs) {
            int sb = (int)(blk % 8);
            const uint8_t *sup = pk + (size_t)(blk / 8) * super; /* the super-block's head */
            if (!sb && ahead)
                for (size_t o = 0; o < head; o += 64) _mm_prefetch((const char *)sup + ahead + o, _MM_HINT_T0);
            if (ksc) {
                const float *k = ksc + (q2 ? 64 : 32) * blk;
                sw = _mm512_loadu_ps(k);
                mn = _mm512_loadu_ps(k + 16);
                if (q2) mq0 = _mm512_loadu_ps(k + 32), mq1 = _mm512_loadu_ps(k + 48);
            } else if (q2) {
                q2k_scales(pk, blk, &sw, &mn, &mq0, &mq1);
            } else if (q6) {
                q6k_scales(pk, blk, super, &sw, &mn);
            } else if (ixs) {
                sw = iq4xs_scales(pk, blk);
            } else {
                q4k_scales(pk, blk, super, &sw, &mn);
            }
            vals = sup + head + sub * sb;
            if (ahead)
                for (size_t o = 0; o < sub; o += 64) _mm_prefetch((const char *)vals + ahead + o, _MM_HINT_T0);
        } else {
            if (ahead)
                for (size_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)pk + ahead + o, _MM_HINT_T0);
            sw = mx ? e8m0_x16(pk) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)pk));
            if (m1) /* -m, for the fnmadd of the mins below (exact) */
                mn = _mm512_sub_ps(mn, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pk + 32))));
            vals = pk + (m1 ? 64 : mx ? 16 : 32);
            pk += bb;
        }
        /* Q8_0: w[t] the values of quad t. Nibbles: w[u] the low ones
         * (quad u), w[u + 4] the high ones left in place, 16 times their
         * value (quad u + 4): their products sum apart, exact in int32 and
         * a multiple of 16, and are shifted down once a block. That spares
         * a shift per vector: a one-row Q4_0 product from L2 went from 55 to
         * 63 GB/s on a Zen 4 core (Q8_0, two chains instead of one: 68 to
         * 70). Decode from memory did not change measurably (-0.2 +- 0.7%,
         * steps alternated in one run); a model whose weights stay in
         * cache gains the compute. */
        __m512i w[8];
        if (q2) { /* the values: pairs */
            __m512i p0 = _mm512_loadu_si512(vals), p1 = _mm512_loadu_si512(vals + 64);
            const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                w[u] = _mm512_and_si512(_mm512_srli_epi16(p0, 2 * u), three);
                w[u + 4] = _mm512_and_si512(_mm512_srli_epi16(p1, 2 * u), three);
            }
        } else if (q3) { /* u = q + 4: the low 2 bits from the pairs, the third from its vector */
            __m512i p0 = _mm512_loadu_si512(vals), p1 = _mm512_loadu_si512(vals + 64), h = _mm512_loadu_si512(vals + 128);
            const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                w[u] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p0, 2 * u), three), q3_third(h, u));
                w[u + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(p1, 2 * u), three), q3_third(h, u + 4));
            }
        } else if (q6) { /* u = q + 32: the low 4 bits from the nibbles, the top 2 from their vectors */
            __m512i h0 = _mm512_loadu_si512(vals + 256), h1 = _mm512_loadu_si512(vals + 320);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_loadu_si512(vals + 64 * u);
                w[u] = _mm512_or_si512(_mm512_and_si512(q, lo), q6_top(h0, u));
                w[u + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), lo), q6_top(h1, u));
            }
        } else if (q5 || k5 || q51) { /* the low 4 bits from the nibbles, the fifth from the vector after them */
            __m512i h = _mm512_loadu_si512(vals + 256);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_loadu_si512(vals + 64 * u);
                w[u] = _mm512_or_si512(_mm512_and_si512(q, lo), q5_fifth(h, u));
                w[u + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), lo), q5_fifth(h, u + 4));
            }
        } else if (iq || mx) { /* the indices looked up: codebook value + 128 */
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_loadu_si512(vals + 64 * u);
                w[u] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(q, lo));
                w[u + 4] = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(q, 4), lo));
            }
        } else if (q8) {
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) w[t] = wide ? _mm512_loadu_si512(vals + 64 * t) : load64_2(vals + 64 * t);
        } else {
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) {
                __m512i q = _mm512_loadu_si512(vals + 64 * u);
                w[u] = _mm512_and_si512(q, lo);
                w[u + 4] = _mm512_and_si512(q, hi);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            /* Q6_K, Q3_K: each half starts from -off sum(x) of its 16 (quantize_rows) */
            __m512i ia = _mm512_set1_epi32(sa[r * nb + blk]),
                    ib = q6 && !q2 ? _mm512_set1_epi32(((const int32_t *)xs)[r * nb + blk]) : _mm512_setzero_si512();
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                ia = dpbusd_bcst(ia, w[t], qa + r * ldq + blk * 32 + 4 * t);
                ib = dpbusd_bcst(ib, w[t + 4], qa + r * ldq + blk * 32 + 16 + 4 * t);
            }
            if (q6) { /* the two sub-blocks in turn, each with its scale */
                __m512 dx = _mm512_set1_ps(da[r * nb + blk]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_mul_ps(sw, dx), acc[r]);
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ib), _mm512_mul_ps(mn, dx), acc[r]);
                if (q2) { /* the mins, each against d_x sum(x) of its 16 (two int16 in xs) */
                    uint32_t hs = ((const uint32_t *)xs)[r * nb + blk];
                    float d1 = da[r * nb + blk];
                    acc[r] = _mm512_fnmadd_ps(mq0, _mm512_set1_ps(d1 * (float)(int16_t)(hs & 0xffff)), acc[r]);
                    acc[r] = _mm512_fnmadd_ps(mq1, _mm512_set1_ps(d1 * (float)(int16_t)(hs >> 16)), acc[r]);
                }
                continue;
            }
            ia = _mm512_add_epi32(ia, q8 || q5 || k5 || q51 || iq || mx ? ib : _mm512_srai_epi32(ib, 4));
            __m512 s = _mm512_mul_ps(sw, _mm512_set1_ps(da[r * nb + blk]));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), s, acc[r]);
            if (qk || m1) acc[r] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(xs[r * nb + blk]), acc[r]);
        }
    }
    __mmask16 m = nc >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nc) - 1);
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *dst = c + r * ldc;
        __m512 v = acc[r];
        if (accum) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, dst));
        _mm512_mask_storeu_ps(dst, m, v);
    }
}

/* scratch layout shared by the entry points: A's int8 rows, scales and
 * corrections, one Q8_0 row, two panels */
static uint8_t *scratch_layout(int64_t m, int64_t k, void *scratch, int8_t **qa, float **da, int32_t **sa,
                               float **xs) {
    int64_t nb = k / 32;
    *qa = scratch;
    *da = (float *)(*qa + m * nb * 32);
    *sa = (int32_t *)(*da + m * nb);
    *xs = (float *)(*sa + m * nb); /* d_x sum(x), for Q4_K's mins; Q6_K: -32 sum(x) of a block's second 16, int32 */
    uint8_t *q8 = (uint8_t *)(*xs + m * nb);
    return q8; /* the Q8_0 row; the panels follow it */
}

static uint8_t *panels_of(int64_t k, uint8_t *q8) { return q8 + (((k / 32) * 34 + 63) & ~(int64_t)63); }

static uint8_t *quantize_rows(enum toy_dtype bt, int64_t m, int64_t k, const float *a, int64_t lda, void *scratch,
                              int8_t **qap, float **dap, int32_t **sap, float **xsp) {
    int64_t nb = k / 32;
    /* Q4_K, Q5_K: unsigned values, no offset; Q6_K: 32, for each 16 apart */
    int off = bt == TOY_Q8_0 || bt == TOY_IQ4_NL || bt == TOY_IQ4_XS || bt == TOY_MXFP4 ? 128
            : bt == TOY_Q4_0 ? 8 : bt == TOY_Q5_0 ? 16 : bt == TOY_Q6_K ? 32 : bt == TOY_Q3_K ? 4 : 0;
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    uint8_t *q8 = scratch_layout(m, k, scratch, &qa, &da, &sa, &xs);
    uint8_t *panel = panels_of(k, q8);
    for (int64_t i = 0; i < m; i++) {
        toy_qdot.quantize_q8_0(a + i * lda, q8, k);
        for (int64_t blk = 0; blk < nb; blk++) {
            const uint8_t *q = q8 + blk * 34;
            toy_f16 h;
            memcpy(&h, q, 2);
            da[i * nb + blk] = _cvtsh_ss(h);
            __m256i x = _mm256_loadu_si256((const __m256i *)(q + 2));
            _mm256_storeu_si256((__m256i *)(qa + (i * nb + blk) * 32), x);
            /* sum of the 32 signed bytes: vpdpbusd of ones (unsigned) with x */
            __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), x);
            __m128i s0 = _mm256_castsi256_si128(s), s1 = _mm256_extracti128_si256(s, 1); /* bytes 0-15, 16-31 */
            s0 = _mm_add_epi32(s0, _mm_shuffle_epi32(s0, 0x4e));
            s0 = _mm_add_epi32(s0, _mm_shuffle_epi32(s0, 0xb1));
            s1 = _mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0x4e));
            s1 = _mm_add_epi32(s1, _mm_shuffle_epi32(s1, 0xb1));
            toy_qgemm_block_start(bt, off, _mm_cvtsi128_si32(s0), _mm_cvtsi128_si32(s1), da[i * nb + blk],
                                  &sa[i * nb + blk], &xs[i * nb + blk]);
        }
    }
    *qap = qa;
    *dap = da;
    *sap = sa;
    *xsp = xs;
    return panel;
}

/* A's rows quantized into scratch, once per thread, for any number of
 * toy_qgemm_packed_cols_avx512 calls over column groups */
void toy_qgemm_packed_prep_avx512(enum toy_dtype bt, int64_t m, int64_t k, const float *a, int64_t lda,
                                  void *scratch) {
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    quantize_rows(bt, m, k, a, lda, scratch, &qa, &da, &sa, &xs);
}

/* Q8_0 or Q4_0 over 9 to 16 rows (a speculative pass over as many tokens): each group of 16 columns 8 rows a
 * pass, the second from cache (converting panels, as more rows do, took a 9-token pass of SmolLM2-135M 9.3 ms
 * against 6.8 this way). A function of its own: its instances inlined beside the few-row ones made one-row
 * passes 5-10% slower. */
static __attribute__((noinline)) void cols_9_to_16(enum toy_dtype bt, int64_t m, int64_t n, int64_t nb,
                                                   const int8_t *qa, const float *da, const int32_t *sa,
                                                   const float *xs, const uint8_t *pk, size_t group, float *c,
                                                   int64_t ldc, bool accum) {
    bool wide = bt == TOY_Q8_0 && toy_cpu_wide_loads();
    int ahead = toy_cpu_prefetch_ahead_rows(m);
    for (int64_t j = 0; j < n; j += 16, pk += group) {
        int nc = n - j < 16 ? (int)(n - j) : 16;
#define KP(R, W, T, i) kernel_packed(R, W, T, nb, qa + (i) * nb * 32, nb * 32, da + (i) * nb, sa + (i) * nb, \
                                     xs + (i) * nb, pk, NULL, c + (i) * ldc + j, ldc, nc, accum, NULL, (i) ? 0 : ahead)
#define ROWS(W, T)                        \
    do {                                  \
        KP(8, W, T, 0);                   \
        switch (m - 8) {                  \
        case 8: KP(8, W, T, 8); break;    \
        case 7: KP(7, W, T, 8); break;    \
        case 6: KP(6, W, T, 8); break;    \
        case 5: KP(5, W, T, 8); break;    \
        case 4: KP(4, W, T, 8); break;    \
        case 3: KP(3, W, T, 8); break;    \
        case 2: KP(2, W, T, 8); break;    \
        case 1: KP(1, W, T, 8); break;    \
        }                                 \
    } while (0)
        if (bt == TOY_Q4_0) ROWS(false, TOY_Q4_0);
        else if (wide) ROWS(true, TOY_Q8_0);
        else ROWS(false, TOY_Q8_0);
#undef ROWS
#undef KP
    }
}

/* Columns [0, n) of C from the packed groups at `packed` (group-aligned:
 * n is a multiple of 32 unless it ends the matrix), A prepared in scratch
 * by toy_qgemm_packed_prep_avx512. pc: the side stream the first row group
 * carries, or NULL. */
void toy_qgemm_packed_cols_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const void *packed, float *c,
                                  int64_t ldc, bool accum, void *scratch, struct toy_pf_cursor *pcp) {
    int64_t nb = k / 32;
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    uint8_t *panel = panels_of(k, scratch_layout(m, k, scratch, &qa, &da, &sa, &xs));
    size_t panel_bytes = (size_t)nb * PANEL_BLOCK, group = toy_qpack_group_bytes(bt, k);
    const uint8_t *pk = packed;
    if (m > 8 && m <= 16 && (bt == TOY_Q8_0 || bt == TOY_Q4_0)) {
        cols_9_to_16(bt, m, n, nb, qa, da, sa, xs, pk, group, c, ldc, accum);
        return;
    }
    /* few rows (decode), or types without a panel kernel: from the packed groups */
    if (m <= 8 || (bt != TOY_Q8_0 && bt != TOY_Q4_0)) {
        bool wide = bt == TOY_Q8_0 && toy_cpu_wide_loads(); /* nibbles: 64-byte loads everywhere (see load64_2) */
        if (m > 8) pcp = NULL;
        int ahead = toy_cpu_prefetch_ahead_rows(m); /* the first row group's pass brings the group in */
        /* Q4_K over more than one pass of rows: the scales made once a group,
         * into the panels' scratch (which Q4_K does not use) */
        bool kq = bt == TOY_Q4_K || bt == TOY_Q5_K || bt == TOY_Q6_K || bt == TOY_IQ4_XS || bt == TOY_Q3_K ||
                  bt == TOY_Q2_K;
        float *ksc = kq && m > 4 ? (float *)(((uintptr_t)panel + 63) & ~(uintptr_t)63) : NULL; /* 64-aligned: whole-line loads */
        for (int64_t j = 0; j < n; j += 16, pk += group) {
            int nc = n - j < 16 ? (int)(n - j) : 16;
            int64_t i = 0;
            if (ksc)
                for (int64_t blk = 0; blk < nb; blk++) {
                    __m512 sw, mn;
                    if (bt == TOY_Q2_K) {
                        __m512 m0, m1;
                        q2k_scales(pk, blk, &sw, &mn, &m0, &m1);
                        _mm512_storeu_ps(ksc + 64 * blk + 32, m0);
                        _mm512_storeu_ps(ksc + 64 * blk + 48, m1);
                        _mm512_storeu_ps(ksc + 64 * blk, sw);
                        _mm512_storeu_ps(ksc + 64 * blk + 16, mn);
                        continue;
                    }
                    if (bt == TOY_Q6_K || bt == TOY_Q3_K)
                        q6k_scales(pk, blk, bt == TOY_Q3_K ? TOY_QPACK_SUPER_Q3_K : TOY_QPACK_SUPER_Q6_K, &sw, &mn);
                    else if (bt == TOY_IQ4_XS) sw = iq4xs_scales(pk, blk), mn = _mm512_setzero_ps();
                    else q4k_scales(pk, blk, bt == TOY_Q5_K ? TOY_QPACK_SUPER_Q5_K : TOY_QPACK_SUPER_Q4_K, &sw, &mn);
                    _mm512_storeu_ps(ksc + 32 * blk, sw);
                    _mm512_storeu_ps(ksc + 32 * blk + 16, mn);
                }
            /* one loop per block type, so that the type's tests leave the loop */
#define KP(R, W, T, K) kernel_packed(R, W, T, nb, qa + i * nb * 32, nb * 32, da + i * nb, sa + i * nb, xs + i * nb, \
                                    pk, K ? ksc : NULL, c + i * ldc + j, ldc, nc, accum, i ? NULL : pcp, i ? 0 : ahead)
#define KP_ROWS(W, T)                                                \
    do {                                                             \
        if (ksc) { /* (a constant in each instance: no test a block) */ \
            for (; i + 4 <= m; i += 4) KP(4, W, T, true);            \
            for (; i < m; i++) KP(1, W, T, true);                    \
        } else if (T == TOY_Q8_0 || T == TOY_Q4_0) { /* m <= 8 here: all rows in one pass */ \
            switch (m) {                                             \
            case 8: KP(8, W, T, false); break;                       \
            case 7: KP(7, W, T, false); break;                       \
            case 6: KP(6, W, T, false); break;                       \
            case 5: KP(5, W, T, false); break;                       \
            case 4: KP(4, W, T, false); break;                       \
            case 3: KP(3, W, T, false); break;                       \
            case 2: KP(2, W, T, false); break;                       \
            case 1: KP(1, W, T, false); break;                       \
            }                                                        \
        } else {                                                     \
            for (; i + 4 <= m; i += 4) KP(4, W, T, false);           \
            for (; i < m; i++) KP(1, W, T, false);                   \
        }                                                            \
    } while (0)
            if (bt == TOY_Q4_0) KP_ROWS(false, TOY_Q4_0);
            else if (bt == TOY_Q4_K) KP_ROWS(false, TOY_Q4_K);
            else if (bt == TOY_Q6_K) KP_ROWS(false, TOY_Q6_K);
            else if (bt == TOY_Q5_K) KP_ROWS(false, TOY_Q5_K);
            else if (bt == TOY_Q5_0) KP_ROWS(false, TOY_Q5_0);
            else if (bt == TOY_Q4_1) KP_ROWS(false, TOY_Q4_1);
            else if (bt == TOY_Q5_1) KP_ROWS(false, TOY_Q5_1);
            else if (bt == TOY_IQ4_NL) KP_ROWS(false, TOY_IQ4_NL);
            else if (bt == TOY_IQ4_XS) KP_ROWS(false, TOY_IQ4_XS);
            else if (bt == TOY_MXFP4) KP_ROWS(false, TOY_MXFP4);
            else if (bt == TOY_Q3_K) KP_ROWS(false, TOY_Q3_K);
            else if (bt == TOY_Q2_K) KP_ROWS(false, TOY_Q2_K);
            else if (wide) KP_ROWS(true, TOY_Q8_0);
            else KP_ROWS(false, TOY_Q8_0);
#undef KP_ROWS
#undef KP
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 32, pk += 2 * group) {
        int nc = n - j < 32 ? (int)(n - j) : 32;
        panel_from_packed(bt, pk, nb, panel);
        if (nc > 16) panel_from_packed(bt, pk + group, nb, panel + panel_bytes);
        rows_times_panels(m, nc > 16 ? 2 : 1, nb, qa, nb * 32, da, sa, panel, panel_bytes, c, ldc, j, nc, accum);
    }
}

void toy_qgemm_packed_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                             const void *packed, float *c, int64_t ldc, bool accum, void *scratch,
                             const struct toy_prefetch *pf) {
    toy_qgemm_packed_prep_avx512(bt, m, k, a, lda, scratch);
    struct toy_pf_cursor pc, *pcp = toy_pf_start(&pc, m <= 8 ? pf : NULL, (k / 32) * ((n + 15) / 16));
    toy_qgemm_packed_cols_avx512(bt, m, n, k, packed, c, ldc, accum, scratch, pcp);
}

void toy_qgemm_avx512(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                      const void *bv, size_t ldb, float *c, int64_t ldc, bool accum, void *scratch) {
    int64_t nb = k / 32;
    int8_t *qa;
    float *da, *xs;
    int32_t *sa;
    uint8_t *panel = quantize_rows(bt, m, k, a, lda, scratch, &qa, &da, &sa, &xs);
    size_t panel_bytes = (size_t)nb * PANEL_BLOCK;
    const uint8_t *b = bv;
    int64_t ldq = nb * 32;
    for (int64_t j = 0; j < n; j += 32) {
        int nc = n - j < 32 ? (int)(n - j) : 32;
        pack_panel(bt, b + j * ldb, ldb, nc < 16 ? nc : 16, nb, panel);
        if (nc > 16) pack_panel(bt, b + (j + 16) * ldb, ldb, nc - 16, nb, panel + panel_bytes);
        rows_times_panels(m, nc > 16 ? 2 : 1, nb, qa, ldq, da, sa, panel, panel_bytes, c, ldc, j, nc, accum);
    }
}
