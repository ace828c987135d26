/* gemm-bf16-avx512.c: C = A B^T over bfloat16 operands with f32
 * accumulation, using AVX-512 BF16 dot products (vdpbf16ps: 32 products of
 * bf16 pairs summed into 16 f32 lanes per instruction).
 *
 * A is packed as rows of kp bf16 (k zero-padded to an even kp), B as panels
 * of 16 columns holding, for every pair of k, the 16 columns' two values
 * side by side (64 bytes). One vdpbf16ps of a broadcast A pair against a
 * panel vector then adds 2 products to each of 16 outputs, so the
 * accumulators are C itself: a 6x32 tile keeps 12 of them in registers
 * and needs 2 loads and 6 broadcasts per 12 vdpbf16ps, with no horizontal
 * sums. Only valid C entries are written.
 * Only called when the CPU reports avx512_bf16 (see matmul.c).
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "backends/cpu/transpose-avx512.h"

#define TILE_R 6

/* Panels of B for columns [0, nc): colp(c) gives column c's kp values
 * (contiguous, stride 1) when B rows are C's columns; otherwise B is (k, n)
 * with rows ldb elements apart and column c is strided. B is bf16, or f32
 * rounded to nearest even as toy_pack_f32_bf16 rounds (mixed precision over
 * f32 master weights: no bf16 copy of them is made). The reference: one
 * value at a time. */
static void pack_ref(const void *b, bool f32, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                     uint16_t *panels) {
    int64_t np = (nc + 15) / 16, pairs = kp / 2;
    memset(panels, 0, (size_t)(np * pairs * 32) * sizeof(uint16_t));
    for (int64_t c = 0; c < nc; c++) {
        uint16_t *out = panels + (c / 16) * pairs * 32 + (c % 16) * 2;
        for (int64_t q = 0; q < k; q++) {
            int64_t i = rows_are_cols ? c * ldb + q : q * ldb + c;
            out[q / 2 * 32 + q % 2] = f32 ? toy_f32_to_bf16(((const float *)b)[i]) : ((const uint16_t *)b)[i];
        }
    }
}

void toy_pack_bf16_panels_ref(const uint16_t *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                              uint16_t *panels) {
    pack_ref(b, false, ldb, rows_are_cols, nc, k, kp, panels);
}

void toy_pack_f32_bf16_panels_ref(const float *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                                  uint16_t *panels) {
    pack_ref(b, true, ldb, rows_are_cols, nc, k, kp, panels);
}

/* Loaders of the fast packer: 32 consecutive values from element i on, of
 * which the first `left` are real (the rest read as zero), and 16 values
 * under a mask, as bf16 whichever type B holds */
static inline __attribute__((always_inline)) __m512i load32(const void *b, bool f32, int64_t i, int64_t left) {
    if (f32) {
        const float *row = (const float *)b + i;
        __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : left > 0 ? (1u << left) - 1 : 0);
        __mmask16 hi = (__mmask16)(left >= 32 ? 0xffff : left > 16 ? (1u << (left - 16)) - 1 : 0);
        return (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, row + 16), _mm512_maskz_loadu_ps(lo, row));
    }
    __mmask32 km = left >= 32 ? (__mmask32)~0u : left > 0 ? (__mmask32)((1u << left) - 1) : 0;
    return _mm512_maskz_loadu_epi16(km, (const uint16_t *)b + i);
}

static inline __attribute__((always_inline)) __m256i load16(const void *b, bool f32, int64_t i, __mmask16 m) {
    if (f32) return (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, (const float *)b + i));
    return _mm256_maskz_loadu_epi16(m, (const uint16_t *)b + i);
}

/* The same panels, 16 x 16 blocks at a time: B's rows (pairs of k as one
 * 32-bit element) transposed in registers, or two rows of a (k, n) B
 * interleaved by one permute. Bytes identical to the reference. */
static inline __attribute__((always_inline)) void pack(const void *b, bool f32, int64_t ldb, bool rows_are_cols,
                                                       int64_t nc, int64_t k, int64_t kp, uint16_t *panels) {
    int64_t np = (nc + 15) / 16, pairs = kp / 2;
    for (int64_t p = 0; p < np; p++) {
        uint16_t *out = panels + p * pairs * 32;
        int64_t c0 = p * 16, cn = nc - c0 < 16 ? nc - c0 : 16;
        if (rows_are_cols) {
            for (int64_t q0 = 0; q0 < kp; q0 += 32) { /* 16 pairs */
                __m512i r[16];
                for (int c = 0; c < 16; c++)
                    r[c] = c < cn ? load32(b, f32, (c0 + c) * ldb + q0, k - q0) : _mm512_setzero_si512();
                transpose16(r);
                for (int q = 0; q < 16; q++) _mm512_storeu_si512(out + (q0 / 2 + q) * 32, r[q]);
            }
        } else {
            __mmask16 cm = (__mmask16)((1u << cn) - 1);
            const __m512i idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7,
                                                 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
            for (int64_t q = 0; q < pairs; q++) {
                __m256i lo = 2 * q < k ? load16(b, f32, 2 * q * ldb + c0, cm) : _mm256_setzero_si256();
                __m256i hi = 2 * q + 1 < k ? load16(b, f32, (2 * q + 1) * ldb + c0, cm) : _mm256_setzero_si256();
                __m512i v = _mm512_permutex2var_epi16(_mm512_castsi256_si512(lo), idx, _mm512_castsi256_si512(hi));
                _mm512_storeu_si512(out + q * 32, v);
            }
        }
    }
}

void toy_pack_bf16_panels(const uint16_t *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                          uint16_t *panels) {
    pack(b, false, ldb, rows_are_cols, nc, k, kp, panels);
}

void toy_pack_f32_bf16_panels(const float *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                              uint16_t *panels) {
    pack(b, true, ldb, rows_are_cols, nc, k, kp, panels);
}

static inline __attribute__((always_inline)) void tile(int R, int P, int64_t pairs, const uint16_t *a, int64_t kp,
                                                       const uint16_t *panel, int64_t panel_elems, float *c,
                                                       int64_t ldc, int rows, int nc, float beta) {
    __m512 acc[TILE_R][2];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t q = 0; q < pairs; q++) {
        __m512bh w[2];
#pragma GCC unroll 2
        for (int p = 0; p < P; p++) w[p] = (__m512bh)_mm512_loadu_si512(panel + p * panel_elems + q * 32);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, a + r * kp + 2 * q, 4);
            __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 2
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], x, w[p]);
        }
    }
    for (int r = 0; r < R && r < rows; r++)
        for (int p = 0; p < P; p++) {
            int left = nc - 16 * p;
            if (left <= 0) break;
            __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
            float *dst = c + r * ldc + 16 * p;
            __m512 v = acc[r][p];
            if (beta != 0) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, dst), _mm512_set1_ps(beta), v);
            _mm512_mask_storeu_ps(dst, m, v);
        }
}

/* C (m x nc, ldc) = beta C + A (m rows of kp bf16, zero rows up to a
 * multiple of 6 present) times the panels of nc columns, pe elements apart
 * (kp / 2 * 32 when they hold just these kp values) */
void toy_gemm_bf16_panels(int64_t m, int64_t nc, int64_t kp, const uint16_t *A, const uint16_t *panels, int64_t pe,
                          float *C, int64_t ldc, float beta) {
    int64_t pairs = kp / 2;
    for (int64_t i = 0; i < m; i += TILE_R) {
        int rows = m - i < TILE_R ? (int)(m - i) : TILE_R;
        for (int64_t j = 0; j < nc; j += 32) {
            int cols = nc - j < 32 ? (int)(nc - j) : 32;
            const uint16_t *pn = panels + (j / 16) * pe;
            if (cols > 16) tile(TILE_R, 2, pairs, A + i * kp, kp, pn, pe, C + i * ldc + j, ldc, rows, cols, beta);
            else tile(TILE_R, 1, pairs, A + i * kp, kp, pn, pe, C + i * ldc + j, ldc, rows, cols, beta);
        }
    }
}

/* f32 row -> bf16 row, rounded to nearest even, zero padded to kp */
void toy_pack_f32_bf16(const float *x, int64_t k, uint16_t *y, int64_t kp) {
    int64_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, (__m512i)v);
    }
    for (; i < kp; i += 32) { /* the last values and the zeros after them, masked */
        int64_t left = k - i > 0 ? k - i : 0, room = kp - i < 32 ? kp - i : 32;
        __mmask16 lo = (__mmask16)(left >= 16 ? 0xffff : (1u << left) - 1);
        __mmask16 hi = (__mmask16)(left >= 32 ? 0xffff : left > 16 ? (1u << (left - 16)) - 1 : 0);
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + i + 16), _mm512_maskz_loadu_ps(lo, x + i));
        _mm512_mask_storeu_epi16(y + i, (__mmask32)(room >= 32 ? ~0u : (1u << room) - 1), (__m512i)v);
    }
}

/* f32 -> f32 rounded to bf16 (the same rounding as toy_pack_f32_bf16): op(A)
 * of the BF16 path through sgemm (its B widens with toy_bf16_to_f32_row) */
void toy_round_f32_bf16(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
        _mm512_storeu_si512(y + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    for (; i < n; i++) y[i] = toy_bf16_to_f32(toy_f32_to_bf16(x[i]));
}

/* Columns c0 .. c0+nc of a (k rows of lda f32) as nc bf16 rows of kp (a
 * transposed operand, e.g. dY in dW = dY^T X), rounded to nearest even,
 * zero padded to kp. The reference: one value at a time. */
void toy_pack_f32_bf16_cols_ref(const float *a, int64_t lda, int64_t c0, int64_t nc, int64_t k, uint16_t *y,
                                int64_t kp) {
    for (int64_t r = 0; r < nc; r++)
        for (int64_t q = 0; q < kp; q++) y[r * kp + q] = q < k ? toy_f32_to_bf16(a[q * lda + c0 + r]) : 0;
}

/* The same, 16 x 16 blocks transposed in registers, each row then rounded
 * as toy_pack_f32_bf16 rounds */
void toy_pack_f32_bf16_cols(const float *a, int64_t lda, int64_t c0, int64_t nc, int64_t k, uint16_t *y, int64_t kp) {
    for (int64_t r0 = 0; r0 < nc; r0 += 16) {
        int64_t rn = nc - r0 < 16 ? nc - r0 : 16;
        __mmask16 rm = (__mmask16)((1u << rn) - 1);
        for (int64_t q0 = 0; q0 < kp; q0 += 16) {
            int64_t qn = k - q0 < 16 ? (k - q0 > 0 ? k - q0 : 0) : 16;
            __m512i t[16];
            for (int q = 0; q < 16; q++)
                t[q] = q < qn ? _mm512_castps_si512(_mm512_maskz_loadu_ps(rm, a + (q0 + q) * lda + c0 + r0))
                              : _mm512_setzero_si512();
            transpose16(t);
            for (int r = 0; r < rn; r++)
                _mm256_storeu_si256((__m256i *)(y + (r0 + r) * kp + q0),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(t[r])));
        }
    }
}

/* 64 bytes as four 16-byte loads: streaming from memory, narrower loads let
 * this Zen 4's prefetchers run further ahead (see qgemm-avx512.c) */
static inline __m512i load64(const uint16_t *p) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)p));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 8)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 16)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + 24)), 3);
}

/* Decode (one activation row) against bf16 weight rows: y[j] (+)= w_j . x
 * for j < n, w_j the k bf16 values at w + j ldw, x the activations already
 * rounded to bf16 (toy_pack_f32_bf16) and zero-padded to a multiple of 32.
 * The same products and f32 sums (vdpbf16ps) as toy_gemm_bf16_panels, read
 * straight from the rows: no panel copy of B. `wide`: one 64-byte load per
 * 32 weights, for CPUs that stream those faster (toy_cpu_wide_loads). */
static inline __attribute__((always_inline)) void gemv_bf16(bool wide, const uint16_t *w, int64_t ldw,
                                                            const uint16_t *x, int64_t k, float *y, int64_t n,
                                                            bool accum, struct toy_pf_cursor *pc) {
    int64_t kb = k / 32 * 32;
    __mmask32 tail = (__mmask32)((1ull << (k - kb)) - 1);
    int ahead = toy_cpu_prefetch_ahead();
    for (int64_t j = 0; j < n; j++) {
        toy_pf_step(pc);
        const uint16_t *r = w + j * ldw;
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;
        int64_t i = 0;
#define LOADW(p) (wide ? _mm512_loadu_si512(p) : load64(p))
        for (; i + 64 <= kb; i += 64) {
            if (ahead) {
                _mm_prefetch((const char *)(r + i) + ahead, _MM_HINT_T0);
                _mm_prefetch((const char *)(r + i) + ahead + 64, _MM_HINT_T0);
            }
            s0 = _mm512_dpbf16_ps(s0, (__m512bh)LOADW(r + i), (__m512bh)_mm512_loadu_si512(x + i));
            s1 = _mm512_dpbf16_ps(s1, (__m512bh)LOADW(r + i + 32), (__m512bh)_mm512_loadu_si512(x + i + 32));
        }
        for (; i < kb; i += 32) s0 = _mm512_dpbf16_ps(s0, (__m512bh)LOADW(r + i), (__m512bh)_mm512_loadu_si512(x + i));
#undef LOADW
        if (tail)
            s1 = _mm512_dpbf16_ps(s1, (__m512bh)_mm512_maskz_loadu_epi16(tail, r + kb),
                                  (__m512bh)_mm512_loadu_si512(x + kb));
        float v = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
        y[j] = accum ? y[j] + v : v;
    }
}

void toy_gemv_bf16_avx512(const uint16_t *w, int64_t ldw, const uint16_t *x, int64_t k, float *y, int64_t n,
                          bool accum, struct toy_pf_cursor *pc) {
    gemv_bf16(false, w, ldw, x, k, y, n, accum, pc);
}

void toy_gemv_bf16_wide_avx512(const uint16_t *w, int64_t ldw, const uint16_t *x, int64_t k, float *y, int64_t n,
                               bool accum, struct toy_pf_cursor *pc) {
    gemv_bf16(true, w, ldw, x, k, y, n, accum, pc);
}
