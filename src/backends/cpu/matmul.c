/* matmul.c: batched matrix products on the CPU.
 *
 * F32 x F32 goes to BLAS (cblas_sgemm, single-threaded per call: the pool
 * splits the work, so OpenBLAS's own threads never compete with ours), or
 * to toy's own SGEMM where that is the faster (toy_cpu_sgemm_own).
 * Other B types (F16, BF16, quantized weights) are dequantized a chunk of
 * rows at a time into per-thread scratch and multiplied with sgemm: the full
 * dequantized matrix is never materialised.
 *
 * Shapes (PyTorch order): op(A) is (m, k), op(B) is (k, n), C is (m, n);
 * A: ne = {k, m} or {m, k} (trans_a); B: ne = {n, k} or {k, n} (trans_b).
 * Batch dims broadcast by ratio (GQA: query head h uses kv head h / group).
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu-impl.h"
#include "backends/cpu/qdot.h"
#include "toy/quant.h"

#define CHUNK_ROWS 64

/* toy's own SGEMM (gemm-f32-avx512.c) for F32 x F32 products (and the
 * dequantized chunks below) where the CPU has AVX-512 and OpenBLAS runs
 * AVX2 kernels: on a Zen 5 EPYC with OpenBLAS pinned to Haswell's, 2-thread
 * products of SmolLM2's shapes ran at about 200 GFLOPS through OpenBLAS
 * and 380-400 through toy's kernel (of a 455 peak), and an f32 training
 * step of that model took 2.9 s instead of 4.2. Where OpenBLAS runs its
 * AVX-512 kernels it is left to them. $TOY_SGEMM=own or =blas overrides. */
bool toy_cpu_sgemm_own(void) {
    static int own = -1;
    if (own < 0) {
        const char *e = getenv("TOY_SGEMM");
        bool avx512 = toy_cpu_has_avx512();
        if (e && *e && strcmp(e, "own") && strcmp(e, "blas"))
            fprintf(stderr, "toy: ignoring TOY_SGEMM=%s (want own or blas)\n", e);
        own = avx512 && (e && !strcmp(e, "own") ? 1 : e && !strcmp(e, "blas") ? 0 : toy_blas_core_isa() == 1);
    }
    return own;
}

void toy_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float beta, float *c, int64_t ldc, float *pack) {
    if (pack) toy_sgemm_avx512(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, pack);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)m, (int)n,
                    (int)k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

size_t toy_cpu_sgemm_pack_bytes(void) {
    return toy_cpu_sgemm_own() ? (toy_sgemm_avx512_pack_floats() * sizeof(float) + 63) / 64 * 64 : 0;
}

/* f32 decode rows through gemv-avx2.c where the CPU has AVX2 + FMA
 * ($TOY_SIMD=scalar keeps BLAS's sgemv, the reference) */
static bool use_gemv_f32(void) {
    static int have = -1;
    if (have < 0) {
        const char *e = getenv("TOY_SIMD");
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && !(e && !strcmp(e, "scalar"));
    }
    return have;
}

#define BF16_CHUNK 128 /* columns of C per packed block of B (kept in L2 while A streams) */
#define BF16_TILE_R 6
#define BF16_MC 480  /* rows per packed block of A: a multiple of both kernels' tile rows (6, 16) */
#define BF16_KC 1024 /* k per packed block: A's block (at most 480 x 1024 bf16) stays in L2 */
#define BF16_SG_M 1024 /* blocks of the BF16 path through sgemm (matmul_bf16_sgemm) */
#define BF16_SG_K 1024
#define BF16_SG_N 1024
void toy_round_f32_bf16(const float *x, float *y, int64_t n);

/* AVX-512 BF16 path: B is bf16 and the CPU has vdpbf16ps ($TOY_BF16_GEMM=0
 * turns it off, to compare with the dequantize + sgemm path). */
static bool use_bf16_gemm_cpu(void) {
    static int have = -1;
    if (have < 0) {
        const char *e = getenv("TOY_BF16_GEMM");
        __builtin_cpu_init();
        have = __builtin_cpu_supports("avx512f") && !(e && !strcmp(e, "0")) && toy_cpu_has_avx512bf16();
    }
    return have;
}
#define QDOT_MAX_ROWS 8 /* at most this many rows: the integer row kernels (use_qdot) */
static bool bf16_via_sgemm(void);
/* An F32, F16, Q8_0, Q4_0 or Q4_K B in a product marked bf16
 * (toy_linear_bf16 and its gradients: mixed precision over f32 master
 * weights, a quantized base, or a model's f32 or f16 weights in inference),
 * rounded or dequantized to bf16 as it is packed, so no bf16 copy of it is
 * ever made. Not on the sgemm route, which would widen
 * it straight back (there the product stays f32), nor for a few rows (a
 * decode step sampled during fine-tuning), where converting every weight
 * would cost far more than the products. */
static bool bf16_convert_b(const struct toy_tensor *dst) {
    const struct toy_tensor *b = dst->src[1];
    bool dequant = b->type == TOY_Q8_0 || b->type == TOY_Q4_0 || b->type == TOY_Q4_K || b->type == TOY_F16;
    /* an f32 B not on b->data: a view (an activation reshaped) gets its data
     * only as the graph runs, after the work sizes are taken */
    return dst->op_params[P_MM_BF16] && !bf16_via_sgemm() && dst->ne[1] * dst->ne[2] * dst->ne[3] > QDOT_MAX_ROWS &&
           (b->type == TOY_F32 || (dequant && b->data && !dst->op_params[P_MM_TRANS_A]));
}
static bool use_gemv_f32(void);
/* bf16 weights of several batches times a few rows each (latent attention's per-head products in a decode step):
 * a matrix-vector product a row (matmul_run), whose bits do not depend on the row count, as the BF16 GEMM's do */
static bool bf16_rows(const struct toy_tensor *dst) {
    return dst->src[1]->type == TOY_BF16 && dst->ne[2] * dst->ne[3] > 1 && dst->ne[1] <= QDOT_MAX_ROWS &&
           !dst->op_params[P_MM_TRANS_A] && dst->op_params[P_MM_TRANS_B] && !dst->op_params[P_MM_BF16] &&
           use_gemv_f32();
}
static bool use_bf16_gemm(const struct toy_tensor *dst) {
    return use_bf16_gemm_cpu() && dst->src[0]->type == TOY_F32 && !bf16_rows(dst) &&
           (dst->src[1]->type == TOY_BF16 || bf16_convert_b(dst));
}

/* How the BF16 path multiplies, once both operands are rounded to bf16.
 * - AMX tiles (gemm-bf16-amx.c) where the CPU has AMX-BF16 (Xeons since
 *   Sapphire Rapids): tdpbf16ps runs at about ten times the f32 FMA rate.
 * - vdpbf16ps, the AVX-512 BF16 dot products, on AMD (Zen 4: twice the
 *   products of an FMA per cycle).
 * - sgemm over the same bf16 values widened to f32 (exactly) on Intel
 *   without AMX, where vdpbf16ps issues once every two cycles (an Emerald
 *   Rapids Xeon's 6x32 tile kernel: 84 GFLOPS a core, OpenBLAS's sgemm
 *   140): the same products, summed in f32 in another order.
 * Chosen by vendor and flags, not by timing, so one machine always runs
 * the same arithmetic; $TOY_BF16_GEMM=amx, =dot or =sgemm overrides (amx
 * only where the CPU and OS allow it). Decode (one row) keeps the dot
 * kernel on every route: it is bound by memory, not by products. */
enum bf16_route { BF16_DOT, BF16_SGEMM, BF16_AMX };
static enum bf16_route bf16_route(void) {
    static int route = -1;
    if (route < 0) {
        const char *e = getenv("TOY_BF16_GEMM");
        __builtin_cpu_init();
        bool amx = toy_cpu_amx_bf16();
        if (e && !strcmp(e, "amx") && !amx)
            fprintf(stderr, "toy: TOY_BF16_GEMM=amx, but this CPU or OS has no AMX-BF16 tiles: using the default\n");
        else if (e && *e && strcmp(e, "amx") && strcmp(e, "dot") && strcmp(e, "sgemm") && strcmp(e, "0"))
            fprintf(stderr, "toy: ignoring TOY_BF16_GEMM=%s (want amx, dot or sgemm)\n", e);
        route = e && !strcmp(e, "sgemm") ? BF16_SGEMM
                : e && !strcmp(e, "dot") ? BF16_DOT
                : amx                    ? BF16_AMX
                : __builtin_cpu_is("intel") ? BF16_SGEMM
                                            : BF16_DOT;
    }
    return (enum bf16_route)route;
}
static bool bf16_via_sgemm(void) { return bf16_route() == BF16_SGEMM; }
/* rows of packed A per kernel tile: AMX tiles are 16 rows */
static int64_t bf16_tile_rows(void) { return bf16_route() == BF16_AMX ? 16 : BF16_TILE_R; }

toy_bf16_kernel toy_cpu_bf16_kernel(int64_t *rows) {
    if (!use_bf16_gemm_cpu() || bf16_via_sgemm()) return NULL;
    *rows = bf16_tile_rows();
    return bf16_route() == BF16_AMX ? toy_gemm_bf16_amx : toy_gemm_bf16_panels;
}

const char *toy_cpu_bf16_route(void) {
    if (!use_bf16_gemm_cpu()) return "dequantize + sgemm";
    switch (bf16_route()) {
    case BF16_AMX: return "AMX tiles";
    case BF16_SGEMM: return "sgemm";
    default: return "AVX-512 BF16 dot products";
    }
}

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
/* the length of each of the fewest equal parts (a multiple of r) of n that
 * are at most max long (max a multiple of r) */
static int64_t even_block_of(int64_t n, int64_t max, int64_t r) {
    int64_t parts = (n + max - 1) / max;
    int64_t b = round_up((n + parts - 1) / parts, r);
    return b < max ? b : max;
}

/* Few rows times Q8_0/Q4_0 weight rows (decode, short prompts): quantize the
 * activations to Q8_0 and use integer block dot products; the weights
 * stream once, never dequantized to f32. */
static bool use_qdot(const struct toy_tensor *dst) {
    const struct toy_tensor *b = dst->src[1];
    return (b->type == TOY_Q8_0 || b->type == TOY_Q4_0) && dst->op_params[P_MM_TRANS_B] &&
           !dst->op_params[P_MM_TRANS_A] && !dst->op_params[P_MM_EXACT] && dst->ne[1] <= QDOT_MAX_ROWS &&
           b->ne[0] % 32 == 0;
}

/* $TOY_QGEMM=0 turns the int8 GEMM off (to compare with dequantize + sgemm) */
static bool qgemm_off(void) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("TOY_QGEMM");
        off = e && !strcmp(e, "0");
    }
    return off;
}

static inline int64_t bidx(int64_t i, int64_t n_out, int64_t n_src) {
    return n_src == n_out ? i : n_src == 1 ? 0 : i / (n_out / n_src);
}

/* batch bi (of dst's ne[2] x ne[3]): A's and B's matrices (a broadcast one
 * serves several) and C's */
struct mm_batch {
    const char *a, *b;
    float *c;
};
static inline struct mm_batch batch_at(const struct toy_tensor *dst, int64_t bi) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    int64_t i2 = bi % dst->ne[2], i3 = bi / dst->ne[2];
    return (struct mm_batch){
        (const char *)A->data + bidx(i2, dst->ne[2], A->ne[2]) * A->nb[2] + bidx(i3, dst->ne[3], A->ne[3]) * A->nb[3],
        (const char *)B->data + bidx(i2, dst->ne[2], B->ne[2]) * B->nb[2] + bidx(i3, dst->ne[3], B->ne[3]) * B->nb[3],
        (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3])};
}

static bool packable(const struct toy_tensor *t) {
    toy_cpu_init();
    return !t->packed &&
           (t->type == TOY_Q8_0 || t->type == TOY_Q4_0 || t->type == TOY_Q4_1 || t->type == TOY_Q5_0 ||
            t->type == TOY_Q5_1 || t->type == TOY_Q4_K || t->type == TOY_Q5_K || t->type == TOY_Q6_K ||
            t->type == TOY_IQ4_NL || t->type == TOY_IQ4_XS || t->type == TOY_Q3_K || t->type == TOY_Q2_K ||
            t->type == TOY_MXFP4) &&
           toy_qdot.qgemm_packed && t->data && t->ne[0] % 32 == 0 && t->ne[3] == 1 &&
           t->nb[2] == t->nb[1] * (size_t)t->ne[1] && !(t->flags & TOY_FLAG_PARAM);
}

/* one matrix's packed bytes; a 3-d tensor (a mixture's experts) packs its
 * matrices one after another, each this far from the last */
size_t toy_cpu_pack_stride(const struct toy_tensor *t) {
    return (toy_qpack_bytes(t->type, t->ne[1], t->ne[0]) + 63) / 64 * 64;
}

size_t toy_tensor_pack_bytes(const struct toy_tensor *t) {
    return packable(t) ? toy_cpu_pack_stride(t) * (size_t)t->ne[2] : 0;
}

static void pack_all(struct toy_tensor *t, void *dst) {
    for (int64_t e = 0; e < t->ne[2]; e++)
        toy_qpack(t->type, t->ne[1], t->ne[0], (const char *)t->data + (size_t)e * t->nb[2], t->nb[1],
                  (char *)dst + (size_t)e * toy_cpu_pack_stride(t));
}

void toy_tensor_pack_into(struct toy_tensor *t, void *dst) {
    if (!packable(t)) return;
    pack_all(t, dst);
    t->packed = dst;
    t->flags |= TOY_FLAG_PACK_BORROWED;
    toy_pack_gen_bump();
}

enum toy_status toy_tensor_pack(struct toy_tensor *t) {
    size_t bytes = toy_tensor_pack_bytes(t);
    if (!bytes) return TOY_OK;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes))
        return toy_error(TOY_ERR_NOMEM, "packing weight '%s': %zu bytes", toy_label(t), bytes);
    pack_all(t, p);
    t->packed = p;
    toy_pack_gen_bump();
    return TOY_OK;
}

void toy_tensor_unpack(struct toy_tensor *t) {
    if (!(t->flags & TOY_FLAG_PACK_BORROWED)) free(t->packed);
    t->flags &= ~(uint32_t)TOY_FLAG_PACK_BORROWED;
    if (t->packed) toy_pack_gen_bump();
    t->packed = NULL;
}

/* A packed weight (toy_tensor_pack) in an inference matmul: the int8 GEMM
 * over its packed groups, rows split between threads when there are enough
 * of them, else column groups (decode). */
static bool use_qpacked(const struct toy_tensor *dst) {
    const struct toy_tensor *b = dst->src[1], *a = dst->src[0];
    return b->packed && dst->op_params[P_MM_TRANS_B] && !dst->op_params[P_MM_TRANS_A] &&
           !dst->op_params[P_MM_EXACT] && a->nb[0] == sizeof(float) && toy_qdot.qgemm_packed && !qgemm_off() &&
           b->ne[2] == 1 && b->ne[3] == 1 && a->nb[2] == a->nb[1] * (size_t)a->ne[1] &&
           a->nb[3] == a->nb[2] * (size_t)a->ne[2];
}

bool toy_cpu_matmul_packed(const struct toy_tensor *dst) {
    toy_cpu_init();
    return dst->op == TOY_OP_MATMUL && use_qpacked(dst);
}

static int64_t qpacked_rows(const struct toy_tensor *dst) { return dst->ne[1] * dst->ne[2] * dst->ne[3]; }
/* Threads split the rows (each streams all the weights) where the rows are many (a prompt: A quantized once,
 * not once per thread) or the columns too few to deal out; else the columns, reading each weight once, in
 * kernels that hold up to 8 rows a pass (a 576 x 12288 Q8_0 product on 2 Zen 4 threads, columns against rows:
 * 8 rows 122 against 174 us, 24 rows 326 against 416, 64 rows 784 against 922, 256 rows even) */
#define QPACKED_COLS_MAX_ROWS 64
/* the product's and its siblings' groups of 32 columns (the column split's units): first_unit[s] is product s's
 * first, first_unit[n] (returned n) their number */
static int qpacked_units(const struct toy_tensor *dst, int64_t first_unit[4]) {
    const struct toy_tensor *seg[3] = {dst, dst->siblings[0], dst->siblings[1]};
    int n = 0;
    first_unit[0] = 0;
    for (; n < 3 && seg[n]; n++) first_unit[n + 1] = first_unit[n] + (seg[n]->ne[0] + 31) / 32;
    return n;
}
static bool qpacked_split_rows(const struct toy_tensor *dst, int64_t m, int64_t units, int nth) {
    return !dst->siblings[0] && m >= 4 * (int64_t)nth && (m > QPACKED_COLS_MAX_ROWS || units < 4 * (int64_t)nth);
}

/* This thread's share of what the decode attention dst->prefetch will read
 * (graph-fuse.c): the fraction [P_MM_PF_LO, P_MM_PF_HI) of its K then V
 * bytes, so the products before it fetch them in turn while they stream. */
static bool prefetch_share(const struct toy_tensor *dst, int ith, int nth, struct toy_prefetch *pf) {
    struct toy_prefetch all;
    if (!toy_cpu_attention_prefetch(dst->prefetch, ith, nth, &all)) return false;
    size_t total = all.n[0] + all.n[1];
    size_t lo = (size_t)((double)total * toy_param_f32(dst, P_MM_PF_LO)) & ~(size_t)63;
    size_t hi = (size_t)((double)total * toy_param_f32(dst, P_MM_PF_HI));
    if (hi > total) hi = total;
    for (int s = 0; s < 2; s++) { /* [lo, hi) of the concatenation, cut at the span boundary */
        size_t b0 = s ? all.n[0] : 0, b1 = b0 + all.n[s];
        size_t x0 = lo > b0 ? lo : b0, x1 = hi < b1 ? hi : b1;
        pf->p[s] = x1 > x0 ? all.p[s] + (x0 - b0) : NULL;
        pf->n[s] = x1 > x0 ? x1 - x0 : 0;
    }
    return pf->n[0] + pf->n[1] > 0;
}

/* that share as the side stream of a GEMV over `rows` weight rows, or NULL */
static struct toy_pf_cursor *side_cursor(const struct toy_tensor *dst, int ith, int nth, int64_t rows,
                                         struct toy_pf_cursor *pc) {
    struct toy_prefetch pf;
    return dst->prefetch && prefetch_share(dst, ith, nth, &pf) ? toy_pf_start(pc, &pf, rows) : NULL;
}

static void matmul_qpacked(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool accum = dst->op_params[P_MM_ACCUM];
    int64_t n = dst->ne[0], k = A->ne[0], m = qpacked_rows(dst);
    int64_t lda = (int64_t)(A->nb[1] / sizeof(float));
    void *scratch = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    const float *a = A->data;
    float *c = dst->data;
    const struct toy_tensor *seg[3] = {dst, dst->siblings[0], dst->siblings[1]};
    int64_t first_unit[4];
    int nseg = qpacked_units(dst, first_unit);
    int64_t units = first_unit[nseg], u0, u1;
    if (qpacked_split_rows(dst, m, units, nth)) {
        int64_t i0, i1;
        toy_split(m, ith, nth, &i0, &i1);
        if (i1 > i0)
            toy_qdot.qgemm_packed(B->type, i1 - i0, n, k, a + i0 * lda, lda, B->packed, c + i0 * n, n, accum, scratch,
                                  NULL);
        return;
    }
    /* groups of 32 columns (two packed groups, the kernel's unit) of this
     * product and its siblings (graph-fuse.c: the same A, so quantized
     * once), dealt out as threads get to them; A's rows quantized once
     * per thread */
    size_t group = toy_qpack_group_bytes(B->type, k);
    struct toy_share sh;
    toy_share_init(&sh, work, units, 1, 2 * group, ith, nth);
    struct toy_prefetch pf;
    struct toy_pf_cursor pc, *pcp = NULL;
    if (dst->prefetch && m <= 8 && prefetch_share(dst, ith, nth, &pf))
        pcp = toy_pf_start(&pc, &pf, (k / 32) * 2 * ((units + nth - 1) / nth));
    bool prepared = false;
    while (toy_share_next(&sh, &u0, &u1)) {
        if (!prepared) toy_qdot.qgemm_packed_prep(B->type, m, k, a, lda, scratch);
        prepared = true;
        for (int s = 0; s < nseg && u0 < u1; s++) { /* the run cut where one product ends */
            if (u0 >= first_unit[s + 1]) continue;
            const struct toy_tensor *p = seg[s];
            int64_t e = u1 < first_unit[s + 1] ? u1 : first_unit[s + 1], ns = p->ne[0];
            int64_t j0 = (u0 - first_unit[s]) * 32, j1 = (e - first_unit[s]) * 32 < ns ? (e - first_unit[s]) * 32 : ns;
            toy_qdot.qgemm_packed_cols(B->type, m, j1 - j0, k, (const char *)p->src[1]->packed + (size_t)(j0 / 16) * group,
                                       (float *)p->data + j0, ns, accum, scratch, pcp);
            u0 = e;
        }
    }
}

/* More rows (prefill, batched serving): the int8 GEMM (qgemm-avx512.c) over
 * rows split between threads. Not in graphs with a backward pass
 * (P_MM_EXACT): training differentiates the f32 math, so it must run it. */
static bool use_qgemm(const struct toy_tensor *dst) {
    const struct toy_tensor *b = dst->src[1], *a = dst->src[0];
    return (b->type == TOY_Q8_0 || b->type == TOY_Q4_0) && dst->op_params[P_MM_TRANS_B] &&
           !dst->op_params[P_MM_TRANS_A] && !dst->op_params[P_MM_EXACT] && dst->ne[1] > QDOT_MAX_ROWS &&
           b->ne[0] % 32 == 0 && a->nb[0] == sizeof(float) && toy_qdot.qgemm && !qgemm_off();
}

/* rows of A that qgemm sees as one matrix: all batches when B is shared and
 * A's and C's rows are evenly spaced across them, else one batch's */
static bool qgemm_flat(const struct toy_tensor *dst) {
    const struct toy_tensor *a = dst->src[0], *b = dst->src[1];
    return b->ne[2] == 1 && b->ne[3] == 1 && a->ne[2] == dst->ne[2] && a->ne[3] == dst->ne[3] &&
           a->nb[2] == a->nb[1] * (size_t)a->ne[1] && a->nb[3] == a->nb[2] * (size_t)a->ne[2];
}

static void matmul_qgemm(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool accum = dst->op_params[P_MM_ACCUM];
    int64_t n = dst->ne[0], k = A->ne[0];
    void *scratch = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    bool flat = qgemm_flat(dst);
    int64_t m = flat ? dst->ne[1] * dst->ne[2] * dst->ne[3] : dst->ne[1];
    int64_t nbatch = flat ? 1 : dst->ne[2] * dst->ne[3];
    int64_t i0, i1;
    toy_split(m, ith, nth, &i0, &i1);
    if (i1 <= i0) return;
    for (int64_t bi = 0; bi < nbatch; bi++) {
        struct mm_batch bt = batch_at(dst, bi);
        const char *a = bt.a;
        const char *b = bt.b;
        float *c = bt.c;
        toy_qdot.qgemm(B->type, i1 - i0, n, k, (const float *)(a + i0 * A->nb[1]), (int64_t)(A->nb[1] / sizeof(float)),
                       b, B->nb[1], c + i0 * n, n, accum, scratch);
    }
}

static void matmul_qdot(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool accum = dst->op_params[P_MM_ACCUM];
    int64_t n = dst->ne[0], m = dst->ne[1], k = A->ne[0];
    size_t qrow = (size_t)(k / 32) * 34, qrow_b = toy_row_bytes(B->type, k);
    uint8_t *qa = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    float (*dot)(const void *, const void *, int64_t) = B->type == TOY_Q8_0 ? toy_qdot.q8_0 : toy_qdot.q4_0;
    for (int64_t bi = 0; bi < dst->ne[2] * dst->ne[3]; bi++) {
        struct mm_batch bt = batch_at(dst, bi);
        const char *a = bt.a, *b = bt.b;
        float *c = bt.c;
        for (int64_t i = 0; i < m; i++) toy_qdot.quantize_q8_0((const float *)(a + i * A->nb[1]), qa + i * qrow, k);
        int64_t j0, j1;
        toy_split(n, ith, nth, &j0, &j1);
        /* the weight stream ahead of the dots, where that pays (on the Xeon
         * of simd.c with TOY_SIMD=avx2, 2 threads: Q8_0 78 -> 105 tok/s,
         * Q4_0 113 -> 140) */
        int ahead = toy_cpu_prefetch_ahead();
        for (int64_t j = j0; j < j1; j++) {
            const char *brow = b + j * B->nb[1];
            if (ahead)
                for (size_t o = 0; o < qrow_b; o += 64) __builtin_prefetch(brow + ahead + o, 0, 3);
            for (int64_t i = 0; i < m; i++) {
                float v = dot(brow, qa + i * qrow, k);
                c[i * n + j] = accum ? c[i * n + j] + v : v;
            }
        }
    }
}

/* How the BF16 path cuts op(B): k blocks of at most *kc (the thread's
 * column split and chunks of *cw columns), for a quantized B at whole
 * blocks of its type (32 values, 256 for Q4_K): along k where its rows are
 * C's columns, along the columns where they are k. */
static void bf16_blocks(const struct toy_tensor *dst, int64_t k, int64_t *kc, int64_t *cw, int64_t *unit) {
    bool tb = dst->op_params[P_MM_TRANS_B], quant = dst->src[1]->type != TOY_BF16;
    int64_t qb = quant ? toy_dtype_block_size(dst->src[1]->type) : 1;
    *kc = even_block_of(k, BF16_KC, quant && tb && qb > 32 ? qb : 32);
    *cw = quant && !tb && qb > BF16_CHUNK ? qb : BF16_CHUNK;
    *unit = quant && !tb ? (qb > 32 ? qb : 32) : 16;
}

static size_t matmul_work(const struct toy_tensor *dst, int nth) {
    const struct toy_tensor *a = dst->src[0], *b = dst->src[1];
    if (use_bf16_gemm(dst)) {
        int64_t m = dst->ne[1], k = dst->op_params[P_MM_TRANS_B] ? b->ne[0] : b->ne[1];
        int64_t kp = round_up(k, 32);
        if (bf16_via_sgemm() && !(m == 1 && dst->op_params[P_MM_TRANS_B] && !dst->op_params[P_MM_TRANS_A])) {
            int64_t kb = k < BF16_SG_K ? k : BF16_SG_K;
            return TOY_WORK_HEAD + (size_t)nth * ((size_t)(BF16_SG_M + BF16_SG_N) * (size_t)kb * 4 + 512);
        }
        int64_t tr = bf16_tile_rows(), rows = round_up(m, tr) < BF16_MC ? round_up(m, tr) : BF16_MC;
        int64_t kc, cw, unit;
        bf16_blocks(dst, k, &kc, &cw, &unit);
        int64_t elems = (rows + cw) * kc;
        if (bf16_convert_b(dst) && b->type != TOY_F32) /* dequantized rows */
            elems += cw * kc + 2 * (kc > cw ? kc : cw);
        return TOY_WORK_HEAD + (size_t)nth * ((size_t)(elems > kp ? elems : kp) * 2 + 512);
    }
    if (use_qpacked(dst)) {
        int64_t fu[4], m = qpacked_rows(dst);
        int64_t per = qpacked_split_rows(dst, m, fu[qpacked_units(dst, fu)], nth) ? (m + nth - 1) / nth : m;
        return TOY_WORK_HEAD + (size_t)nth * (toy_qgemm_scratch(per, a->ne[0]) + 128);
    }
    if (use_qdot(dst))
        return TOY_WORK_HEAD + (size_t)nth * ((size_t)QDOT_MAX_ROWS * (size_t)(a->ne[0] / 32) * 34 + 512);
    if (use_qgemm(dst)) {
        int64_t m = qgemm_flat(dst) ? dst->ne[1] * dst->ne[2] * dst->ne[3] : dst->ne[1];
        return TOY_WORK_HEAD + (size_t)nth * (toy_qgemm_scratch((m + nth - 1) / nth, a->ne[0]) + 128);
    }
    if (b->type == TOY_F32)
        return TOY_WORK_HEAD + (size_t)nth * toy_cpu_sgemm_pack_bytes();
    int64_t kb = b->ne[0]; /* row length of B */
    (void)a;
    return TOY_WORK_HEAD + (size_t)nth * ((size_t)CHUNK_ROWS * (size_t)kb * sizeof(float) + 256 +
                                          toy_cpu_sgemm_pack_bytes() + 64);
}

/* This thread's part of C in the BF16 path: row ranges of C when op(A)
 * is stored transposed (a weight gradient dY^T X: each thread converts
 * only its rows of A) or has more rows than B has columns (each thread then
 * packs its own rows of the larger operand and all of the smaller one);
 * else column ranges, in units of 16 so panels never straddle threads.
 * False when the thread has nothing to do. */
static bool bf16_share(const struct toy_tensor *dst, int ith, int nth, int64_t *i0, int64_t *i1, int64_t *j0,
                       int64_t *j1) {
    int64_t n = dst->ne[0], m = dst->ne[1];
    *i0 = 0, *i1 = m, *j0 = 0, *j1 = n;
    if (dst->op_params[P_MM_TRANS_A] || m > n) {
        int64_t tr = bf16_tile_rows();
        toy_split((m + tr - 1) / tr, ith, nth, i0, i1);
        *i0 *= tr;
        *i1 = *i1 * tr < m ? *i1 * tr : m;
    } else { /* a quantized (k, n) B is dequantized in whole blocks of columns */
        int64_t kc, cw, u;
        bf16_blocks(dst, dst->op_params[P_MM_TRANS_B] ? dst->src[1]->ne[0] : dst->src[1]->ne[1], &kc, &cw, &u);
        toy_split((n + u - 1) / u, ith, nth, j0, j1);
        *j0 *= u;
        *j1 = *j1 * u < n ? *j1 * u : n;
    }
    return *i1 > *i0 && *j1 > *j0;
}

/* The BF16 path through sgemm (bf16_via_sgemm). Threads split the longer
 * side of C, so the operand each converts in full is the smaller one;
 * blocks of op(A) rounded to bf16 and widened back, and of op(B) widened to
 * f32, are multiplied by OpenBLAS on this thread. Blocks of at most
 * BF16_SG_M x BF16_SG_K of A and BF16_SG_K x BF16_SG_N of B bound the
 * scratch whatever the shape (the logits' backward has k = vocabulary);
 * they are cut into equal parts (576 columns are one block, not 512 + 64),
 * sums over k blocks accumulate in C, and a B that is one block (a weight
 * gradient's activations, a layer's weight) is widened once, not once per
 * block of A. */
static bool bf16_sgemm_split_m(const struct toy_tensor *dst) { return dst->ne[1] >= dst->ne[0]; }

static int64_t even_block(int64_t n, int64_t max) { return even_block_of(n, max, 16); }

static void matmul_bf16_sgemm(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool ta = dst->op_params[P_MM_TRANS_A], tb = dst->op_params[P_MM_TRANS_B];
    float beta = dst->op_params[P_MM_ACCUM] ? 1.0f : 0.0f;
    int64_t n = dst->ne[0], m = dst->ne[1], k = ta ? A->ne[1] : A->ne[0];
    int64_t i0 = 0, i1 = m, j0 = 0, j1 = n;
    if (bf16_sgemm_split_m(dst)) toy_split(m, ith, nth, &i0, &i1);
    else toy_split(n, ith, nth, &j0, &j1);
    if (i1 <= i0 || j1 <= j0) return;
    int64_t bm = even_block(i1 - i0, BF16_SG_M), bk = even_block(k, BF16_SG_K), bn = even_block(j1 - j0, BF16_SG_N);
    bool b_once = bk >= k && bn >= j1 - j0; /* op(B) is one block */
    float *pa = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    float *pb = pa + BF16_SG_M * (k < BF16_SG_K ? k : BF16_SG_K);
    for (int64_t bi = 0; bi < dst->ne[2] * dst->ne[3]; bi++) {
        struct mm_batch bt = batch_at(dst, bi);
        for (int64_t i = i0; i < i1; i += bm) {
            int64_t mc = i1 - i < bm ? i1 - i : bm;
            for (int64_t q = 0; q < k; q += bk) {
                int64_t kc = k - q < bk ? k - q : bk;
                if (ta) /* A is (k, m): rows q .. q+kc, their columns i .. i+mc */
                    for (int64_t r = 0; r < kc; r++)
                        toy_round_f32_bf16((const float *)(bt.a + (q + r) * A->nb[1]) + i, pa + r * mc, mc);
                else
                    for (int64_t r = 0; r < mc; r++)
                        toy_round_f32_bf16((const float *)(bt.a + (i + r) * A->nb[1]) + q, pa + r * kc, kc);
                for (int64_t j = j0; j < j1; j += bn) {
                    int64_t jn = j1 - j < bn ? j1 - j : bn;
                    if (!b_once || i == i0) {
                        if (tb) /* B is (n, k): rows j .. j+jn, their columns q .. q+kc */
                            for (int64_t r = 0; r < jn; r++)
                                toy_bf16_to_f32_row((const uint16_t *)(bt.b + (j + r) * B->nb[1]) + q, pb + r * kc, kc);
                        else /* B is (k, n): rows q .. q+kc, their columns j .. j+jn */
                            for (int64_t r = 0; r < kc; r++)
                                toy_bf16_to_f32_row((const uint16_t *)(bt.b + (q + r) * B->nb[1]) + j, pb + r * jn, jn);
                    }
                    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                                (int)mc, (int)jn, (int)kc, 1.0f, pa, ta ? (int)mc : (int)kc, pb,
                                tb ? (int)kc : (int)jn, q ? 1.0f : beta, bt.c + i * n + j, (int)n);
                }
            }
        }
    }
}

/* C (m x n) = A (m x k, f32 rows) times op(B) with B bf16: A packed to
 * bf16 rows of kp, B to column panels (gemm-bf16-avx512.c); threads own
 * column chunks of C. */
static void matmul_bf16(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool ta = dst->op_params[P_MM_TRANS_A], tb = dst->op_params[P_MM_TRANS_B];
    float beta = dst->op_params[P_MM_ACCUM] ? 1.0f : 0.0f;
    int64_t m = dst->ne[1], k = ta ? A->ne[1] : A->ne[0], kp = round_up(k, 32);
    if (bf16_via_sgemm() && !(m == 1 && tb && !ta)) {
        matmul_bf16_sgemm(dst, ith, nth, work, ws);
        return;
    }
    int64_t n = dst->ne[0], i0, i1, j0, j1;
    uint16_t *pa = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    bool quant = B->type != TOY_BF16; /* bf16_convert_b: rounded or dequantized as it is packed */
    if (m == 1 && tb && !ta && !quant && dst->ne[2] * dst->ne[3] == 1) {
        /* decode: each weight row once, straight from memory, rows dealt out
         * as threads get to them */
        int64_t ldb = (int64_t)(B->nb[1] / 2), r0, r1;
        struct toy_share sh;
        toy_share_init(&sh, work, n, 16, (size_t)(16 * k) * 2, ith, nth);
        struct toy_pf_cursor pc, *pcp = side_cursor(dst, ith, nth, (n + nth - 1) / nth, &pc);
        bool packed = false;
        while (toy_share_next(&sh, &r0, &r1)) {
            if (!packed) toy_pack_f32_bf16(A->data, k, pa, kp);
            packed = true;
            (toy_cpu_wide_loads() ? toy_gemv_bf16_wide_avx512 : toy_gemv_bf16_avx512)(
                (const uint16_t *)B->data + r0 * ldb, ldb, pa, k, (float *)dst->data + r0, r1 - r0, beta != 0, pcp);
        }
        return;
    }
    if (!bf16_share(dst, ith, nth, &i0, &i1, &j0, &j1)) return;
    if (m == 1 && tb && !ta && !quant) { /* batches of one row: each weight row once, straight from memory */
        for (int64_t bi = 0; bi < dst->ne[2] * dst->ne[3]; bi++) {
            struct mm_batch bt = batch_at(dst, bi);
            const float *a = (const float *)bt.a;
            const char *b = bt.b;
            float *c = bt.c;
            toy_pack_f32_bf16(a, k, pa, kp);
            struct toy_pf_cursor pc;
            (toy_cpu_wide_loads() ? toy_gemv_bf16_wide_avx512 : toy_gemv_bf16_avx512)(
                (const uint16_t *)(b + j0 * B->nb[1]), (int64_t)(B->nb[1] / 2), pa, k, c + j0, j1 - j0, beta != 0,
                bi ? NULL : side_cursor(dst, ith, nth, j1 - j0, &pc));
        }
        return;
    }
    /* blocks of k (A's block and B's chunk stay in L2 whatever k is: the
     * logits' backward has k = vocabulary) and of this thread's rows; the
     * sums over k blocks accumulate in C */
    int64_t tr = bf16_tile_rows();
    int64_t mc_max = even_block_of(i1 - i0, BF16_MC, tr), kc_max, cw, unit;
    bf16_blocks(dst, k, &kc_max, &cw, &unit);
    uint16_t *pb = pa + mc_max * kc_max, *pq = pb + cw * kc_max; /* pq: dequantized B rows */
    float *frow = (float *)(pq + cw * kc_max);
    int64_t qb = quant ? toy_dtype_block_size(B->type) : 1;
    size_t bq = quant ? toy_dtype_type_size(B->type) : 0; /* bytes per block of qb values */
    int64_t lda = (int64_t)(A->nb[1] / sizeof(float)), ldb = (int64_t)(B->nb[1] / sizeof(uint16_t));
    toy_bf16_kernel kernel = bf16_route() == BF16_AMX ? toy_gemm_bf16_amx : toy_gemm_bf16_panels;
    for (int64_t bi = 0; bi < dst->ne[2] * dst->ne[3]; bi++) {
        struct mm_batch bt = batch_at(dst, bi);
        const float *a = (const float *)bt.a;
        const uint16_t *b = (const uint16_t *)bt.b;
        for (int64_t q = 0; q < k; q += kc_max) {
            int64_t kc = k - q < kc_max ? k - q : kc_max, kcp = round_up(kc, 32);
            for (int64_t i = i0; i < i1; i += mc_max) {
                int64_t mc = i1 - i < mc_max ? i1 - i : mc_max, mcp = round_up(mc, tr);
                if (ta) toy_pack_f32_bf16_cols(a + q * lda, lda, i, mc, kc, pa, kcp);
                else
                    for (int64_t r = 0; r < mc; r++) toy_pack_f32_bf16(a + (i + r) * lda + q, kc, pa + r * kcp, kcp);
                memset(pa + mc * kcp, 0, (size_t)((mcp - mc) * kcp) * 2);
                for (int64_t j = j0; j < j1; j += cw) {
                    int64_t jn = j + cw < j1 ? cw : j1 - j;
                    if (!quant) toy_pack_bf16_panels(tb ? b + j * ldb + q : b + q * ldb + j, ldb, tb, jn, kc, kcp, pb);
                    else if (B->type == TOY_F32) { /* f32 master weights or activations, rounded */
                        const float *f = (const float *)bt.b;
                        int64_t ldf = (int64_t)(B->nb[1] / sizeof(float));
                        toy_pack_f32_bf16_panels(tb ? f + j * ldf + q : f + q * ldf + j, ldf, tb, jn, kc, kcp, pb);
                    } else if (tb) { /* rows j.. of B, their values q .. q+kc (whole blocks: bf16_blocks) */
                        for (int64_t r = 0; r < jn; r++) {
                            toy_dequantize_row(B->type, bt.b + (j + r) * B->nb[1] + q / qb * bq, frow, kc);
                            toy_pack_f32_bf16(frow, kc, pq + r * kcp, kcp);
                        }
                        toy_pack_bf16_panels(pq, kcp, true, jn, kc, kcp, pb);
                    } else { /* rows q .. q+kc of a (k, n) B, their columns j .. j+jn (whole blocks) */
                        for (int64_t r = 0; r < kc; r++) {
                            toy_dequantize_row(B->type, bt.b + (q + r) * B->nb[1] + j / qb * bq, frow, jn);
                            toy_pack_f32_bf16(frow, jn, pq + r * jn, jn);
                        }
                        toy_pack_bf16_panels(pq, jn, false, jn, kc, kcp, pb);
                    }
                    kernel(mc, jn, kcp, pa, pb, kcp / 2 * 32, bt.c + i * n + j, n, q ? 1.0f : beta);
                }
            }
        }
    }
}

static void matmul_run(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool ta = dst->op_params[P_MM_TRANS_A], tb = dst->op_params[P_MM_TRANS_B];
    float beta = dst->op_params[P_MM_ACCUM] ? 1.0f : 0.0f;
    int64_t n = dst->ne[0], m = dst->ne[1];
    int64_t k = ta ? A->ne[1] : A->ne[0];
    int64_t nbatch = dst->ne[2] * dst->ne[3];
    int lda = (int)(A->nb[1] / sizeof(float));
    int ldc = (int)n;
    if (use_bf16_gemm(dst)) {
        matmul_bf16(dst, ith, nth, work, ws);
        return;
    }
    if (use_qpacked(dst)) {
        matmul_qpacked(dst, ith, nth, work, ws);
        return;
    }
    if (use_qdot(dst)) {
        matmul_qdot(dst, ith, nth, work, ws);
        return;
    }
    if (use_qgemm(dst)) {
        matmul_qgemm(dst, ith, nth, work, ws);
        return;
    }

    if (B->type == TOY_F32 && m == 1 && !ta && tb && nbatch == 1 && use_gemv_f32()) {
        /* one row (decode): a matrix-vector product (sgemm would pack B),
         * rows dealt out as threads get to them */
        int64_t ldb = (int64_t)(B->nb[1] / sizeof(float)), r0, r1;
        struct toy_share sh;
        toy_share_init(&sh, work, n, 4, (size_t)(4 * k) * sizeof(float), ith, nth);
        struct toy_pf_cursor pc, *pcp = side_cursor(dst, ith, nth, (n + nth - 1) / nth, &pc);
        while (toy_share_next(&sh, &r0, &r1))
            (toy_cpu_wide_loads_f32() ? toy_gemv_f32_avx512 : toy_gemv_f32_avx2)(
                (const float *)B->data + r0 * ldb, ldb, A->data, k, (float *)dst->data + r0, r1 - r0, beta != 0, pcp);
        return;
    }
    if (B->type == TOY_F32) {
        int ldb = (int)(B->nb[1] / sizeof(float));
        float *pack = toy_cpu_sgemm_own() ? toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth)
                                          : NULL;
        /* work items: whole batches when there are enough, else slices of m or n */
        int64_t nsplit = nbatch >= nth ? 1 : nth;
        bool split_m = m >= n;
        int64_t items = nbatch * nsplit;
        int64_t w0, w1;
        toy_split(items, ith, nth, &w0, &w1);
        for (int64_t w = w0; w < w1; w++) {
            int64_t bi = w / nsplit, part = w % nsplit;
            struct mm_batch bt = batch_at(dst, bi);
            const float *a = (const float *)bt.a;
            const float *b = (const float *)bt.b;
            float *c = bt.c;
            int64_t lo, hi;
            toy_split(split_m ? m : n, (int)part, (int)nsplit, &lo, &hi);
            if (hi <= lo) continue;
            if (!ta && tb && use_gemv_f32() && !split_m && m > 1 && m <= QDOT_MAX_ROWS && nbatch > 1) {
                /* a few rows of several batches (latent attention's per-head products in a batched decode step):
                 * each row a matrix-vector product, the bits of its product alone, whatever the row count */
                for (int64_t i = 0; i < m; i++)
                    (toy_cpu_wide_loads_f32() ? toy_gemv_f32_avx512 : toy_gemv_f32_avx2)(
                        b + lo * ldb, ldb, a + i * lda, k, c + i * ldc + lo, hi - lo, beta != 0, NULL);
                continue;
            }
            if (m == 1 && !ta) {
                /* one row of several batches: a matrix-vector product each */
                if (tb && use_gemv_f32()) {
                    (toy_cpu_wide_loads_f32() ? toy_gemv_f32_avx512 : toy_gemv_f32_avx2)(b + lo * ldb, ldb, a, k, c + lo,
                                                                                      hi - lo, beta != 0, NULL);
                    continue;
                }
                if (tb)
                    cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)(hi - lo), (int)k, 1.0f, b + lo * ldb, ldb, a, 1,
                                beta, c + lo, 1);
                else
                    cblas_sgemv(CblasRowMajor, CblasTrans, (int)k, (int)(hi - lo), 1.0f, b + lo, ldb, a, 1, beta,
                                c + lo, 1);
                continue;
            }
            if (split_m) {
                const float *as = ta ? a + lo : a + lo * lda;
                toy_cpu_sgemm(ta, tb, hi - lo, n, k, 1.0f, as, lda, b, ldb, beta, c + lo * ldc, ldc, pack);
            } else {
                const float *bs = tb ? b + lo * ldb : b + lo;
                toy_cpu_sgemm(ta, tb, m, hi - lo, k, 1.0f, a, lda, bs, ldb, beta, c + lo, ldc, pack);
            }
        }
        return;
    }

    /* f16 or bf16 rows (bf16 here: no AVX-512 BF16) for one activation row */
    void (*gemv_half)(const uint16_t *, int64_t, const float *, int64_t, float *, int64_t, bool,
                      struct toy_pf_cursor *) = NULL;
    if (use_gemv_f32() && B->type == TOY_F16 && toy_cpu_has_f16c()) gemv_half = toy_gemv_f16_avx2;
    if (use_gemv_f32() && B->type == TOY_BF16) gemv_half = toy_gemv_bf16_avx2;
    if (gemv_half && m == 1 && !ta && tb && nbatch == 1) {
        /* decode: no f32 copy, rows dealt out as threads get to them */
        int64_t ldb = (int64_t)(B->nb[1] / 2), r0, r1;
        struct toy_share sh;
        toy_share_init(&sh, work, n, 4, (size_t)(4 * k) * 2, ith, nth);
        struct toy_pf_cursor pc, *pcp = side_cursor(dst, ith, nth, (n + nth - 1) / nth, &pc);
        while (toy_share_next(&sh, &r0, &r1))
            gemv_half((const uint16_t *)B->data + r0 * ldb, ldb, A->data, k, (float *)dst->data + r0, r1 - r0,
                      beta != 0, pcp);
        return;
    }
    /* B of another type: dequantize CHUNK_ROWS rows of B at a time */
    float *scratch = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    int64_t bk = B->ne[0]; /* elements per B row */
    /* toy's sgemm's own scratch after the rows, 64-byte aligned */
    float *pack = toy_cpu_sgemm_own()
                      ? (float *)(((uintptr_t)(scratch + CHUNK_ROWS * bk) + 63) & ~(uintptr_t)63)
                      : NULL;
    for (int64_t bi = 0; bi < nbatch; bi++) {
        struct mm_batch bt = batch_at(dst, bi);
        const float *a = (const float *)bt.a;
        const char *b = bt.b;
        float *c = bt.c;
        if (tb) {
            /* B rows are C's columns: threads own column ranges */
            int64_t j0, j1;
            toy_split(n, ith, nth, &j0, &j1);
            if (!ta && gemv_half && (m == 1 || (nbatch > 1 && m <= QDOT_MAX_ROWS))) {
                /* batches of one row, or of a few (as above: a row's bits do not depend on the others) */
                for (int64_t i = 0; i < m && j1 > j0; i++)
                    gemv_half((const uint16_t *)(b + j0 * B->nb[1]), (int64_t)(B->nb[1] / 2), a + i * lda, k,
                              c + i * ldc + j0, j1 - j0, beta != 0, NULL);
                continue;
            }
            for (int64_t j = j0; j < j1; j += CHUNK_ROWS) {
                int64_t jn = j + CHUNK_ROWS < j1 ? CHUNK_ROWS : j1 - j;
                for (int64_t r = 0; r < jn; r++)
                    toy_cpu_row_f32(B, b + (j + r) * B->nb[1], scratch + r * bk);
                /* row pointers returned may alias B when F32; here B is not F32 */
                toy_cpu_sgemm(ta, true, m, jn, k, 1.0f, a, lda, scratch, bk, beta, c + j, ldc, pack);
            }
        } else {
            /* B rows are the k index: threads own row ranges of C, and walk k */
            int64_t i0, i1;
            toy_split(m, ith, nth, &i0, &i1);
            if (i1 <= i0) continue;
            for (int64_t kk = 0; kk < k; kk += CHUNK_ROWS) {
                int64_t kn = kk + CHUNK_ROWS < k ? CHUNK_ROWS : k - kk;
                for (int64_t r = 0; r < kn; r++)
                    toy_cpu_row_f32(B, b + (kk + r) * B->nb[1], scratch + r * bk);
                const float *as = ta ? a + kk * lda + i0 : a + i0 * lda + kk;
                toy_cpu_sgemm(ta, false, i1 - i0, n, kn, 1.0f, as, lda, scratch, bk, kk == 0 ? beta : 1.0f,
                              c + i0 * ldc, ldc, pack);
            }
        }
    }
}

/* ---- fused prologue (graph-fuse.c) ----------------------------------------------
 *
 * A product whose A is RMSNorm(src[0]) with weight src[2], or
 * SiLU(src[0]) * src[2]: each thread computes A's rows (at most a few KB:
 * decode) into its own scratch after the product's own work area, with the
 * vector functions of the RMS_NORM and SWIGLU ops, then runs the product on
 * them. */

static size_t pre_bytes(const struct toy_tensor *dst) {
    return ((size_t)dst->src[0]->ne[0] * (size_t)dst->src[0]->ne[1] * sizeof(float) + 63) & ~(size_t)63;
}

/* the product as it runs after the prologue: A = contiguous rows at data */
static void pre_views(const struct toy_tensor *dst, float *data, struct toy_tensor *A, struct toy_tensor *d) {
    *A = *dst->src[0];
    A->op = TOY_OP_NONE;
    A->view_src = NULL;
    A->data = data;
    A->nb[0] = sizeof(float);
    A->nb[1] = (size_t)A->ne[0] * sizeof(float);
    A->nb[2] = A->nb[1] * (size_t)A->ne[1];
    A->nb[3] = A->nb[2] * (size_t)A->ne[2];
    *d = *dst;
    d->src[0] = A;
    d->src[2] = NULL;
    d->op_params[P_MM_PRE] = TOY_MM_PRE_NONE;
}

static size_t pre_base(const struct toy_tensor *dst, int nth) {
    struct toy_tensor A, d;
    pre_views(dst, NULL, &A, &d);
    return (matmul_work(&d, nth) + 63) & ~(size_t)63;
}

size_t toy_cpu_matmul_work(const struct toy_tensor *dst, int nth) {
    if (!dst->op_params[P_MM_PRE]) return matmul_work(dst, nth);
    return pre_base(dst, nth) + (size_t)nth * pre_bytes(dst);
}

void toy_cpu_matmul(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    int pre = dst->op_params[P_MM_PRE];
    if (!pre) {
        matmul_run(dst, ith, nth, work, ws);
        return;
    }
    const struct toy_tensor *x = dst->src[0], *y = dst->src[2];
    size_t base = pre_base(dst, nth);
    float *a = (float *)((char *)work + base + (size_t)ith * pre_bytes(dst));
    int64_t k = x->ne[0];
    for (int64_t i = 0; i < x->ne[1]; i++) {
        const float *xr = (const float *)((const char *)x->data + i * x->nb[1]);
        if (pre == TOY_MM_PRE_RMS) {
            float rstd = 1.0f / sqrtf(toy_vec.sumsq(xr, k) / (float)k + toy_param_f32(dst, P_MM_EPS));
            toy_vec.rms_apply(a + i * k, xr, y ? (const float *)y->data : NULL, rstd, k);
        } else {
            toy_vec.silu_mul(a + i * k, xr, (const float *)((const char *)y->data + i * y->nb[1]), k);
        }
    }
    struct toy_tensor A, d;
    pre_views(dst, a, &A, &d);
    matmul_run(&d, ith, nth, work, base);
}
