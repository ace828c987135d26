/* attn-decode-avx512.c: the two products of one decode query head (one
 * query row against nk cached f32 key and value rows of D, D a multiple of
 * 16 up to 256): s_j = scale q.k_j and o = sum_j p_j v_j, with the query
 * and the output held in registers and four keys per step, so no call per
 * key (BLAS's m = 1 paths spend more on setup than on the 64-wide rows).
 * Reference: the BLAS calls of attention.c. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

void toy_attn_decode_scores_avx512(const float *q, const float *K, int64_t ldk, int64_t nk, int64_t D, float scale,
                                   float *s) {
    __m512 qv[16];
    int nv = (int)(D / 16);
    for (int c = 0; c < nv; c++) qv[c] = _mm512_mul_ps(_mm512_loadu_ps(q + 16 * c), _mm512_set1_ps(scale));
    int64_t j = 0;
    for (; j + 4 <= nk; j += 4) {
        const float *k0 = K + j * ldk, *k1 = k0 + ldk, *k2 = k1 + ldk, *k3 = k2 + ldk;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int c = 0; c < nv; c++) {
            a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k0 + 16 * c), a0);
            a1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k1 + 16 * c), a1);
            a2 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k2 + 16 * c), a2);
            a3 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k3 + 16 * c), a3);
        }
        s[j] = _mm512_reduce_add_ps(a0);
        s[j + 1] = _mm512_reduce_add_ps(a1);
        s[j + 2] = _mm512_reduce_add_ps(a2);
        s[j + 3] = _mm512_reduce_add_ps(a3);
    }
    for (; j < nk; j++) {
        __m512 a0 = _mm512_setzero_ps();
        for (int c = 0; c < nv; c++) a0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(K + j * ldk + 16 * c), a0);
        s[j] = _mm512_reduce_add_ps(a0);
    }
}

void toy_attn_decode_values_avx512(const float *p, const float *V, int64_t ldv, int64_t nk, int64_t D, float *o) {
    __m512 acc[16], acc2[16];
    int nv = (int)(D / 16);
    for (int c = 0; c < nv; c++) acc[c] = acc2[c] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) { /* two independent chains per output vector */
        __m512 p0 = _mm512_set1_ps(p[j]), p1 = _mm512_set1_ps(p[j + 1]);
        const float *v0 = V + j * ldv, *v1 = v0 + ldv;
        for (int c = 0; c < nv; c++) {
            acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(v0 + 16 * c), acc[c]);
            acc2[c] = _mm512_fmadd_ps(p1, _mm512_loadu_ps(v1 + 16 * c), acc2[c]);
        }
    }
    for (; j < nk; j++) {
        __m512 p0 = _mm512_set1_ps(p[j]);
        for (int c = 0; c < nv; c++) acc[c] = _mm512_fmadd_ps(p0, _mm512_loadu_ps(V + j * ldv + 16 * c), acc[c]);
    }
    for (int c = 0; c < nv; c++) _mm512_storeu_ps(o + 16 * c, _mm512_add_ps(acc[c], acc2[c]));
}
