/* qdot.h: quantized dot products for GEMV over Q8_0 / Q4_0 weights (qdot.c). */
#ifndef TOY_QDOT_H
#define TOY_QDOT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <xmmintrin.h>

#include "toy/dtype.h"

/* A second stream a decode product fetches ahead for a later node (the
 * cache rows of the attention it feeds, graph-fuse.c): up to two byte
 * spans, a few lines per weight block. */
struct toy_prefetch {
    const char *p[2];
    size_t n[2];
};

/* A side stream on its way: `per_blk` lines fetched ahead per step of the
 * kernel that carries it, through the spans in order. */
struct toy_pf_cursor {
    const char *cur, *end, *next;
    size_t next_n;
    int per_blk;
};

/* the cursor for pf spread over `steps` kernel steps; NULL when there is none */
static inline struct toy_pf_cursor *toy_pf_start(struct toy_pf_cursor *pc, const struct toy_prefetch *pf, int64_t steps) {
    if (!pf || pf->n[0] + pf->n[1] == 0 || steps <= 0) return NULL;
    int64_t lines = (int64_t)((pf->n[0] + 63) / 64 + (pf->n[1] + 63) / 64);
    *pc = (struct toy_pf_cursor){pf->p[0], pf->p[0] + pf->n[0], pf->n[1] ? pf->p[1] : NULL, pf->n[1],
                                 (int)((lines + steps - 1) / steps)};
    return pc;
}

static inline __attribute__((always_inline)) void toy_pf_step(struct toy_pf_cursor *pc) {
    if (!pc) return;
    for (int i = 0; i < pc->per_blk; i++) {
        if (pc->cur >= pc->end) {
            if (!pc->next) {
                pc->per_blk = 0;
                return;
            }
            pc->cur = pc->next;
            pc->end = pc->next + pc->next_n;
            pc->next = NULL;
        }
        _mm_prefetch(pc->cur, _MM_HINT_T0);
        pc->cur += 64;
    }
}

struct toy_qdot_ops {
    float (*q8_0)(const void *w, const void *x_q8, int64_t n); /* n: multiple of 32 */
    float (*q4_0)(const void *w, const void *x_q8, int64_t n);
    void (*quantize_q8_0)(const float *x, void *y, int64_t n);
    /* C (m x n, ldc floats) = or += Q8_0(A) (m x k, lda floats) times B^T,
     * B: n rows of k Q8_0/Q4_0 elements, ldb bytes apart; k a multiple of
     * 32; scratch: toy_qgemm_scratch(m, k) bytes, 64-aligned. NULL where the
     * CPU has no AVX-512 VNNI (then dequantize + sgemm is the fast way). */
    void (*qgemm)(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                  size_t ldb, float *c, int64_t ldc, bool accum, void *scratch);
    /* The same over B in the packed layout (toy_qpack), starting at a group
     * boundary; any m (decode included): B streams front to back once, and
     * every output is computed exactly as qgemm computes it, so results do
     * not depend on how many rows run together. pf: bytes to prefetch along
     * the way (m <= 8), or NULL. */
    void (*qgemm_packed)(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                         const void *packed, float *c, int64_t ldc, bool accum, void *scratch,
                         const struct toy_prefetch *pf);
    /* qgemm_packed in two steps, for threads that take column groups as
     * they go (decode): A's rows prepared in scratch once, then columns
     * [0, n) of C from the groups at `packed` (n a multiple of 32 unless it
     * ends the matrix) as often as needed; pc: the side stream, or NULL. */
    void (*qgemm_packed_prep)(enum toy_dtype bt, int64_t m, int64_t k, const float *a, int64_t lda, void *scratch);
    void (*qgemm_packed_cols)(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const void *packed, float *c,
                              int64_t ldc, bool accum, void *scratch, struct toy_pf_cursor *pc);
};
extern struct toy_qdot_ops toy_qdot;
void toy_qdot_init(void);

float toy_qdot_q8_0_ref(const void *w, const void *x, int64_t n);
float toy_qdot_q4_0_ref(const void *w, const void *x, int64_t n);
void toy_quantize_q8_0_ref(const float *x, void *y, int64_t n);
/* What qgemm computes, element by element: A's rows quantized with
 * quantize_q8_0, then c_ij = sum over blocks in order of
 * fmaf((float)dot_int(w_jb, x_ib), d_w * d_x, c) — qgemm matches it exactly.
 * Q4_K and Q5_K (packed only): per 32-element sub-block
 * c = fmaf(dot(q, x), s d_x, c) then c = fmaf(-mn, d_x sum(x), c). Q6_K (packed only): per 32 elements,
 * for each of its two 16-element sub-blocks in turn,
 * c = fmaf(dot(q, x), (d sc) d_x, c); Q3_K the same; Q2_K too, then
 * for each c = fmaf(-(dmin m), d_x sum(x), c) over its 16. Q4_1 and Q5_1 (packed only):
 * c = fmaf(dot(u, x), d d_x, c) then c = fmaf(m, d_x sum(x), c). IQ4_NL as
 * Q8_0 over the codebook's values; IQ4_XS per 32 elements
 * c = fmaf(dot(v, x), (d (scale - 32)) d_x, c). MXFP4 as IQ4_NL over its
 * values (the E2M1 ones doubled, -12..12), d = 2^(e - 128) (as ggml's
 * vec_dot_mxfp4_q8_0: the int8 dot times d d_x). */
void toy_qgemm_ref(enum toy_dtype bt, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda, const void *b,
                   size_t ldb, float *c, int64_t ldc, bool accum);
size_t toy_qgemm_scratch(int64_t m, int64_t k);

/* The packed layout of n Q8_0/Q4_0/Q4_K weight rows of k: groups of 16 rows
 * (the last padded with zero rows), each group nb = k/32 blocks in order,
 * each block the 16 rows' f16 scales (32 bytes) and then their values by
 * quad (4 consecutive elements): vector t (64 bytes) holds quad t of the 16
 * rows side by side. Q8_0: 8 vectors of the values + 128 (unsigned); Q4_0:
 * 4 vectors of the raw bytes (low nibbles: quad t, high: quad t + 4). */
#define TOY_QPACK_BLOCK_Q8_0 (32 + 512)
#define TOY_QPACK_BLOCK_Q4_0 (32 + 256)
/* Q4_K: per 256-element super-block the 16 rows' f16 d and dmin (64
 * bytes), their 6-bit scales and then their mins a byte each, sub-block by
 * sub-block (8 x 16 each), then each 32-element sub-block's 4 vectors of
 * nibbles as for Q4_0. 4.625 bits a weight, as the file's 4.5 nearly; the
 * kernels form d x scale and dmin x min (exact in f32). */
#define TOY_QPACK_HEAD_Q4_K (64 + 128 + 128)
#define TOY_QPACK_SUPER_Q4_K (TOY_QPACK_HEAD_Q4_K + 8 * 256)
/* Q6_K: per 256-element super-block the 16 rows' f16 d (32 bytes) and
 * their int8 scales, sub-block (16 elements) by sub-block (16 x 16), padded
 * to 320; then per 32 elements, of the values u = q + 32 (0..63): their
 * low 4 bits as Q4_0's nibbles (4 vectors: quad u low, quad u + 4 high)
 * and their top 2 bits, quads 0-3 then quads 4-7 (2 vectors, quad t at
 * bits 2t of its lane). 6.625 bits a weight (the file's 6.5625). */
/* Q5_0: Q4_0's block and a vector of the values' fifth bits (quad t at
 * bit t of its lane, t = 0..7): 5.5 bits a weight, as the file. Q5_K:
 * Q4_K's layout with such a vector after each 32 elements' nibbles
 * (5.625 bits a weight, the file's 5.5). Both hold u = q + 16 (Q5_0) or
 * q (Q5_K), 0..31. */
#define TOY_QPACK_BLOCK_Q5_0 (32 + 256 + 64)
/* Q4_1, Q5_1: the 16 rows' f16 d, then their f16 m (32 bytes each), then
 * as Q4_0 and Q5_0 (u = the unsigned value): 5 and 6 bits a weight, as
 * the files */
#define TOY_QPACK_BLOCK_Q4_1 (64 + 256)
#define TOY_QPACK_BLOCK_Q5_1 (64 + 256 + 64)
#define TOY_QPACK_SUPER_Q5_K (TOY_QPACK_HEAD_Q4_K + 8 * 320)
/* IQ4_NL: Q4_0's block, the nibbles codebook indices (4.5 bits a weight,
 * as the file). IQ4_XS: per 256-element super-block the 16 rows' f16 d (32
 * bytes) and their scales - 32 as int8, sub-block by sub-block (8 x 16),
 * padded to 192; then each 32 elements' index nibbles as Q4_0's (4.375 bits
 * a weight, the file's 4.25). The kernels look the indices up in the
 * codebook (+ 128 for vpdpbusd, which the activations' -128 sum(x) undoes,
 * as for Q8_0). */
/* MXFP4: the 16 rows' E8M0 scale bytes (16), then Q4_0's 4 vectors of
 * nibbles, here indices into its values: 4.25 bits a weight, as the file.
 * The kernels form 2^(e - 128) from the bytes, and look the values up
 * (+ 128 for vpdpbusd, as IQ4_NL's; + 12 for AVX2's vpmaddubsw). */
#define TOY_QPACK_BLOCK_MXFP4 (16 + 256)
#define TOY_QPACK_HEAD_IQ4_XS 192
#define TOY_QPACK_SUPER_IQ4_XS (TOY_QPACK_HEAD_IQ4_XS + 8 * 256)
#define TOY_QPACK_HEAD_Q6_K 320
#define TOY_QPACK_SUPER_Q6_K (TOY_QPACK_HEAD_Q6_K + 8 * 384)
/* Q3_K: Q6_K's head (the 16 rows' f16 d and their int8 scales - 32 per 16
 * elements); then per 32 elements of u = q + 4 (0..7): the low 2 bits in
 * two vectors of pairs (quads 0-3, then 4-7; quad t at bits 2t of its
 * lane) and the third bits in a vector as Q5_0's fifth ones (3.625 bits a
 * weight, the file's 3.4375) */
#define TOY_QPACK_SUPER_Q3_K (TOY_QPACK_HEAD_Q6_K + 8 * 192)
/* Q2_K: per 256-element super-block the 16 rows' f16 d, then f16 dmin (64
 * bytes), then their scale-and-min bytes as the file holds them (scale in
 * the low 4 bits, min in the high), sub-block (16 elements) by sub-block
 * (16 x 16); then per 32 elements the values (0..3) as Q3_K's two vectors
 * of pairs (2.625 bits a weight, as the file) */
#define TOY_QPACK_HEAD_Q2_K 320
#define TOY_QPACK_SUPER_Q2_K (TOY_QPACK_HEAD_Q2_K + 8 * 128)
/* What a packed kernel starts block blk of A's row from (qgemm-avx512.c,
 * qgemm-avx2.c): sa, the integer dot's start, -off times the block's sum
 * (its Q8_0 values' first 16, lo, and last 16, hi), and xs, the float
 * correction: d_x sum(x) for the mins of Q4_K, Q5_K, Q4_1 and Q5_1. Q6_K
 * and Q3_K start each 16 apart (sa, and xs as int32); Q2_K starts from 0 and
 * keeps both sums for its mins (xs: two int16). */
static inline void toy_qgemm_block_start(enum toy_dtype bt, int off, int32_t lo, int32_t hi, float dx, int32_t *sa,
                                         float *xs) {
    if (bt == TOY_Q2_K) {
        uint32_t both = (uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16;
        *sa = 0;
        memcpy(xs, &both, 4);
    } else if (bt == TOY_Q6_K || bt == TOY_Q3_K) {
        int32_t second = -off * hi;
        *sa = -off * lo;
        memcpy(xs, &second, 4);
    } else {
        *sa = -off * (lo + hi);
        *xs = dx * (float)(lo + hi);
    }
}

size_t toy_qpack_group_bytes(enum toy_dtype bt, int64_t k);
size_t toy_qpack_bytes(enum toy_dtype bt, int64_t n, int64_t k);
void toy_qpack(enum toy_dtype bt, int64_t n, int64_t k, const void *b, size_t ldb, void *out);

#endif
