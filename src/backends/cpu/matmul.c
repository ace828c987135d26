/* matmul.c: batched matrix products on the CPU.
 *
 * F32 x F32 goes to BLAS (cblas_sgemm, single-threaded per call: the pool
 * splits the work, so OpenBLAS's own threads never compete with ours).
 * Other B types (F16, BF16, quantized weights) are dequantized a chunk of
 * rows at a time into per-thread scratch and multiplied with sgemm: the full
 * dequantized matrix is never materialised.
 *
 * Shapes (PyTorch order): op(A) is (m, k), op(B) is (k, n), C is (m, n);
 * A: ne = {k, m} or {m, k} (trans_a); B: ne = {n, k} or {k, n} (trans_b).
 * Batch dims broadcast by ratio (GQA: query head h uses kv head h / group).
 */
#include <cblas.h>

#include "backends/cpu/cpu-impl.h"
#include "toy/quant.h"

#define CHUNK_ROWS 64

size_t toy_cpu_matmul_work(const struct toy_tensor *dst, int nth) {
    const struct toy_tensor *a = dst->src[0], *b = dst->src[1];
    if (b->type == TOY_F32) return TOY_WORK_HEAD;
    int64_t kb = b->ne[0]; /* row length of B */
    (void)a;
    return TOY_WORK_HEAD + (size_t)nth * ((size_t)CHUNK_ROWS * (size_t)kb * sizeof(float) + 256);
}

static inline int64_t bidx(int64_t i, int64_t n_out, int64_t n_src) {
    return n_src == n_out ? i : n_src == 1 ? 0 : i / (n_out / n_src);
}

void toy_cpu_matmul(struct toy_tensor *dst, int ith, int nth, void *work, size_t ws) {
    const struct toy_tensor *A = dst->src[0], *B = dst->src[1];
    bool ta = dst->op_params[P_MM_TRANS_A], tb = dst->op_params[P_MM_TRANS_B];
    float beta = dst->op_params[P_MM_ACCUM] ? 1.0f : 0.0f;
    int64_t n = dst->ne[0], m = dst->ne[1];
    int64_t k = ta ? A->ne[1] : A->ne[0];
    int64_t nbatch = dst->ne[2] * dst->ne[3];
    int lda = (int)(A->nb[1] / sizeof(float));
    int ldc = (int)n;
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;

    if (B->type == TOY_F32) {
        int ldb = (int)(B->nb[1] / sizeof(float));
        /* work items: whole batches when there are enough, else slices of m or n */
        int64_t nsplit = nbatch >= nth ? 1 : nth;
        bool split_m = m >= n;
        int64_t items = nbatch * nsplit;
        int64_t w0, w1;
        toy_split(items, ith, nth, &w0, &w1);
        for (int64_t w = w0; w < w1; w++) {
            int64_t bi = w / nsplit, part = w % nsplit;
            int64_t i2 = bi % dst->ne[2], i3 = bi / dst->ne[2];
            const float *a = (const float *)((const char *)A->data + bidx(i2, dst->ne[2], A->ne[2]) * A->nb[2] +
                                             bidx(i3, dst->ne[3], A->ne[3]) * A->nb[3]);
            const float *b = (const float *)((const char *)B->data + bidx(i2, dst->ne[2], B->ne[2]) * B->nb[2] +
                                             bidx(i3, dst->ne[3], B->ne[3]) * B->nb[3]);
            float *c = (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
            int64_t lo, hi;
            toy_split(split_m ? m : n, (int)part, (int)nsplit, &lo, &hi);
            if (hi <= lo) continue;
            if (split_m) {
                const float *as = ta ? a + lo : a + lo * lda;
                cblas_sgemm(CblasRowMajor, TA, TB, (int)(hi - lo), (int)n, (int)k, 1.0f, as, lda, b, ldb,
                            beta, c + lo * ldc, ldc);
            } else {
                const float *bs = tb ? b + lo * ldb : b + lo;
                cblas_sgemm(CblasRowMajor, TA, TB, (int)m, (int)(hi - lo), (int)k, 1.0f, a, lda, bs, ldb,
                            beta, c + lo, ldc);
            }
        }
        return;
    }

    /* B of another type: dequantize CHUNK_ROWS rows of B at a time */
    float *scratch = toy_work_slice((char *)work + TOY_WORK_HEAD, ws - TOY_WORK_HEAD, ith, nth);
    int64_t bk = B->ne[0]; /* elements per B row */
    for (int64_t bi = 0; bi < nbatch; bi++) {
        int64_t i2 = bi % dst->ne[2], i3 = bi / dst->ne[2];
        const float *a = (const float *)((const char *)A->data + bidx(i2, dst->ne[2], A->ne[2]) * A->nb[2] +
                                         bidx(i3, dst->ne[3], A->ne[3]) * A->nb[3]);
        const char *b = (const char *)B->data + bidx(i2, dst->ne[2], B->ne[2]) * B->nb[2] +
                        bidx(i3, dst->ne[3], B->ne[3]) * B->nb[3];
        float *c = (float *)((char *)dst->data + i2 * dst->nb[2] + i3 * dst->nb[3]);
        if (tb) {
            /* B rows are C's columns: threads own column ranges */
            int64_t j0, j1;
            toy_split(n, ith, nth, &j0, &j1);
            for (int64_t j = j0; j < j1; j += CHUNK_ROWS) {
                int64_t jn = j + CHUNK_ROWS < j1 ? CHUNK_ROWS : j1 - j;
                for (int64_t r = 0; r < jn; r++)
                    toy_cpu_row_f32(B, b + (j + r) * B->nb[1], scratch + r * bk);
                /* row pointers returned may alias B when F32; here B is not F32 */
                cblas_sgemm(CblasRowMajor, TA, CblasTrans, (int)m, (int)jn, (int)k, 1.0f, a, lda, scratch,
                            (int)bk, beta, c + j, ldc);
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
                cblas_sgemm(CblasRowMajor, TA, CblasNoTrans, (int)(i1 - i0), (int)n, (int)kn, 1.0f, as, lda,
                            scratch, (int)bk, kk == 0 ? beta : 1.0f, c + i0 * ldc, ldc);
            }
        }
    }
}
