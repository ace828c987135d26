/* gemm-f32-avx512.c: C = beta C + op(A) op(B) in f32 with AVX-512 FMAs, one
 * thread: toy's own SGEMM, for CPUs whose OpenBLAS runs kernels of an older
 * ISA than the CPU has (matmul.c: toy_cpu_sgemm_own says when). The case it
 * was written for: a Zen 5 EPYC whose environment pins OpenBLAS 0.3.21 to
 * its Haswell (AVX2) kernels (OPENBLAS_CORETYPE, set for that release's
 * sake), where they reach 197 GFLOPS on 2 cores of a 455 GFLOPS FP32 peak
 * and this kernel 380-400 (in cache; 350-360 with the weights streaming).
 *
 * Blocks in the usual way: a block of op(B) (KC x NC) packed into panels of
 * 32 columns that hold, for every k, the 32 values side by side (128 bytes);
 * a tile of R x 32 of C in registers (2 R accumulators), each k step two
 * panel loads and R broadcasts of op(A) for 2 R FMAs. op(A) is read where
 * it lies: its rows (stride lda, k contiguous) or, transposed, its columns
 * (the R values of one k contiguous): both stream from L1/L2 within a
 * block. Rows past m read row m - 1 and are not written; columns past n are
 * zero in the panels and not written. The reference is BLAS (or plain
 * loops): the sums run in k order per block, so they differ from it only in
 * rounding. Only called when the CPU reports AVX-512F. */
#include <immintrin.h>
#include <stdbool.h>
#include <stdint.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/transpose-avx512.h"

/* rows of a tile: 8 (16 accumulators) over op(A)'s rows, 12 (24) over its
 * columns. Zen 5, 2 threads, SmolLM2's shapes, interleaved: 8 rows run A B^T
 * 2-9% faster than 12 with the weights out of cache; 12 run A^T B 2-4%
 * faster (its 12 values of one k are one stream). */
#define R_N 8
#define R_T 12
#define R_MAX 12

/* Panels of op(B) rows [q0, q0 + kc), columns [j0, j0 + nc) into `pk`
 * (panel p at pk + p kc 32). tb: B is (n, k), column c of op(B) is row c of
 * B (transposed 16 x 16 in registers); else B is (k, n) and each k is 32
 * consecutive values. */
static void pack_b(bool tb, const float *b, int64_t ldb, int64_t q0, int64_t kc, int64_t j0, int64_t nc, float *pk) {
    int64_t np = (nc + 31) / 32;
    for (int64_t p = 0; p < np; p++) {
        float *out = pk + p * kc * 32;
        int64_t c0 = j0 + 32 * p, cn = nc - 32 * p < 32 ? nc - 32 * p : 32;
        if (!tb) {
            __mmask16 lo = (__mmask16)(cn >= 16 ? 0xffff : (1u << cn) - 1);
            __mmask16 hi = (__mmask16)(cn >= 32 ? 0xffff : cn > 16 ? (1u << (cn - 16)) - 1 : 0);
            for (int64_t q = 0; q < kc; q++) {
                const float *row = b + (q0 + q) * ldb + c0;
                _mm512_storeu_ps(out + q * 32, _mm512_maskz_loadu_ps(lo, row));
                _mm512_storeu_ps(out + q * 32 + 16, _mm512_maskz_loadu_ps(hi, row + 16));
            }
            continue;
        }
        for (int h = 0; h < 2; h++) { /* 16 columns at a time */
            int64_t hn = cn - 16 * h;
            for (int64_t q = 0; q < kc; q += 16) {
                int64_t qn = kc - q < 16 ? kc - q : 16;
                __mmask16 km = (__mmask16)(qn >= 16 ? 0xffff : (1u << qn) - 1);
                __m512i r[16];
                for (int c = 0; c < 16; c++)
                    r[c] = c < hn ? _mm512_castps_si512(
                                        _mm512_maskz_loadu_ps(km, b + (c0 + 16 * h + c) * ldb + q0 + q))
                                  : _mm512_setzero_si512();
                transpose16(r);
                for (int t = 0; t < qn; t++) _mm512_storeu_ps(out + (q + t) * 32 + 16 * h, _mm512_castsi512_ps(r[t]));
            }
        }
    }
}

/* One R x 32 tile: C rows [0, rows), columns [0, nc) (ldc apart) from kc
 * steps of op(A) (row r's value q at a[r rs + q ks]) and the panel. mode 0:
 * C = sum; 1: C += sum; 2: C = beta C + sum. */
static inline __attribute__((always_inline)) void tile(int R, bool ta, int64_t kc, const float *a, int64_t lda,
                                                       int rows, const float *panel, float *c, int64_t ldc, int nc,
                                                       int mode, float alpha, float beta) {
    __m512 acc[R_MAX][2];
    const float *ar[R_MAX];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) {
        int rr = r < rows ? r : rows - 1;
        ar[r] = ta ? a + rr : a + rr * lda;
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t q = 0; q < kc; q++) {
        __m512 w0 = _mm512_loadu_ps(panel + q * 32), w1 = _mm512_loadu_ps(panel + q * 32 + 16);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            __m512 x = _mm512_set1_ps(ta ? ar[r][q * lda] : ar[r][q]);
            acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
        }
    }
    __mmask16 m0 = (__mmask16)(nc >= 16 ? 0xffff : (1u << nc) - 1);
    __mmask16 m1 = (__mmask16)(nc >= 32 ? 0xffff : nc > 16 ? (1u << (nc - 16)) - 1 : 0);
    for (int r = 0; r < rows; r++) {
        float *d = c + r * ldc;
        __m512 v0 = acc[r][0], v1 = acc[r][1];
        if (alpha != 1.0f) v0 = _mm512_mul_ps(v0, _mm512_set1_ps(alpha)), v1 = _mm512_mul_ps(v1, _mm512_set1_ps(alpha));
        if (mode == 1) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, d));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, d + 16));
        } else if (mode == 2) {
            v0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, d), _mm512_set1_ps(beta), v0);
            v1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, d + 16), _mm512_set1_ps(beta), v1);
        }
        _mm512_mask_storeu_ps(d, m0, v0);
        _mm512_mask_storeu_ps(d + 16, m1, v1);
    }
}

static void tile_n(int64_t kc, const float *a, int64_t lda, int rows, const float *panel, float *c, int64_t ldc,
                   int nc, int mode, float alpha, float beta) {
    tile(R_N, false, kc, a, lda, rows, panel, c, ldc, nc, mode, alpha, beta);
}

static void tile_t(int64_t kc, const float *a, int64_t lda, int rows, const float *panel, float *c, int64_t ldc,
                   int nc, int mode, float alpha, float beta) {
    tile(R_T, true, kc, a, lda, rows, panel, c, ldc, nc, mode, alpha, beta);
}

/* the size of ceil(n / max) equal blocks of n, rounded up to a multiple of
 * `to` (at most max, max being one) */
static int64_t even_block(int64_t n, int64_t max, int64_t to) {
    int64_t blocks = (n + max - 1) / max, b = (n + blocks - 1) / blocks;
    b = (b + to - 1) / to * to;
    return b < max ? b : max;
}

/* A walk over nseg segments of `bytes`, `stride` apart, `per` lines of 64
 * bytes a step, prefetched (T0: 1-4% faster than into L2 only, measured as
 * above) */
struct fetch {
    const char *base;
    int64_t stride, bytes, nseg, per, seg, off;
};

static inline void fetch_step(struct fetch *f) {
    for (int64_t l = 0; l < f->per && f->seg < f->nseg; l++) {
        _mm_prefetch(f->base + f->seg * f->stride + f->off, _MM_HINT_T0);
        if ((f->off += 64) >= f->bytes) f->off = 0, f->seg++;
    }
}

size_t toy_sgemm_avx512_pack_floats(void) {
    return (size_t)TOY_SGEMM_KC * (TOY_SGEMM_NC > TOY_SGEMM_NC_TA ? TOY_SGEMM_NC : TOY_SGEMM_NC_TA);
}

/* C (m x n, ldc) = beta C + alpha op(A) (m x k) op(B) (k x n), row-major
 * as cblas_sgemm's CblasRowMajor: A is (m, k) or, ta, (k, m); B is (k, n)
 * or, tb, (n, k). pack: toy_sgemm_avx512_pack_floats() floats. With beta 0,
 * C is not read. */
void toy_sgemm_avx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc, float *pack) {
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* no products: C = beta C */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) C[i * ldc + j] = beta != 0 ? beta * C[i * ldc + j] : 0.0f;
        return;
    }
    void (*run)(int64_t, const float *, int64_t, int, const float *, float *, int64_t, int, int, float, float) =
        ta ? tile_t : tile_n;
    /* blocks of equal size (576 = 3 x 192, not 256 + 256 + 64): a short
     * last block of k would pay a whole pass over C for little work */
    int64_t ncb = even_block(n, ta ? TOY_SGEMM_NC_TA : TOY_SGEMM_NC, 32), kcb = even_block(k, TOY_SGEMM_KC, 16);
    int R = ta ? R_T : R_N;
    int64_t row_tiles = (m + R - 1) / R;
    for (int64_t jc = 0; jc < n; jc += ncb) {
        int64_t nc = n - jc < ncb ? n - jc : ncb;
        for (int64_t pc = 0; pc < k; pc += kcb) {
            int64_t kc = k - pc < kcb ? k - pc : kcb;
            pack_b(tb, B, ldb, pc, kc, jc, nc, pack);
            /* the next block's op(B), fetched while this one computes:
             * weights come from memory, and the packer's 16 strided rows
             * would otherwise wait on it (Zen 5, 2 threads, weights out of
             * cache: 326-333 GFLOPS with, 300-311 without; F32 prefill of
             * SmolLM2-135M +5%, 25 interleaved rounds) */
            struct fetch f = {0};
            int64_t nj = pc + kcb < k ? jc : jc + ncb, nq = pc + kcb < k ? pc + kcb : 0;
            if (nj < n) {
                int64_t nn = n - nj < ncb ? n - nj : ncb, nk = k - nq < kcb ? k - nq : kcb;
                f.base = (const char *)(tb ? B + nj * ldb + nq : B + nq * ldb + nj);
                f.stride = ldb * 4, f.bytes = (tb ? nk : nn) * 4, f.nseg = tb ? nn : nk;
                int64_t lines = f.nseg * ((f.bytes + 63) / 64), steps = row_tiles * ((nc + 31) / 32);
                f.per = (lines + steps - 1) / steps + 1; /* spread over this block's tiles */
            }
            int mode = pc ? 1 : beta == 0 ? 0 : beta == 1 ? 1 : 2;
            for (int64_t ic = 0; ic < m; ic += TOY_SGEMM_MC) {
                int64_t mc = m - ic < TOY_SGEMM_MC ? m - ic : TOY_SGEMM_MC;
                for (int64_t j = 0; j < nc; j += 32) {
                    const float *panel = pack + (j / 32) * kc * 32;
                    int cols = nc - j < 32 ? (int)(nc - j) : 32;
                    for (int64_t i = ic; i < ic + mc; i += R) {
                        int rows = ic + mc - i < R ? (int)(ic + mc - i) : R;
                        const float *a = ta ? A + pc * lda + i : A + i * lda + pc;
                        fetch_step(&f);
                        run(kc, a, lda, rows, panel, C + i * ldc + jc + j, ldc, cols, mode, alpha, beta);
                    }
                }
            }
        }
    }
}
