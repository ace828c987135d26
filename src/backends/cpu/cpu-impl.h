/* cpu-impl.h: what the CPU kernel files share. */
#ifndef TOY_CPU_IMPL_H
#define TOY_CPU_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "core/internal.h"

#define TOY_ROW(t, i1, i2, i3) \
    ((char *)(t)->data + (size_t)(i1) * (t)->nb[1] + (size_t)(i2) * (t)->nb[2] + (size_t)(i3) * (t)->nb[3])

/* rows [*r0, *r1) of nr for thread ith of nth */
static inline void toy_split(int64_t nr, int ith, int nth, int64_t *r0, int64_t *r1) {
    int64_t per = (nr + nth - 1) / nth;
    *r0 = per * ith < nr ? per * ith : nr;
    *r1 = *r0 + per < nr ? *r0 + per : nr;
}

static inline void toy_unravel(int64_t r, const struct toy_tensor *t, int64_t *i1, int64_t *i2, int64_t *i3) {
    *i1 = r % t->ne[1];
    r /= t->ne[1];
    *i2 = r % t->ne[2];
    *i3 = r / t->ne[2];
}

/* The work buffer starts with one cache line of reduction slots per thread
 * (up to 256 threads), then one line per thread for toy_share (zero when
 * the buffer is made); kernels' scratch slices follow. */
#define TOY_WORK_SHARED (64 * 256)
#define TOY_WORK_HEAD (64 * 512)

/* Bytes of each thread's slice of the work buffer, and the slice. */
static inline size_t toy_work_slice_bytes(size_t work_size, int nth) { return work_size / (size_t)nth / 64 * 64; }
static inline void *toy_work_slice(void *work, size_t work_size, int ith, int nth) {
    return (char *)work + toy_work_slice_bytes(work_size, nth) * (size_t)ith;
}

/* The "last thread out" of a kernel: returns true in exactly one thread,
 * after every other thread's writes before its call are visible. The counter
 * is reset for the next run. */
static inline bool toy_last_thread(atomic_int *ctr, int nth) {
    if (nth == 1) return true;
    if (atomic_fetch_add_explicit(ctr, 1, memory_order_acq_rel) == nth - 1) {
        atomic_store_explicit(ctr, 0, memory_order_relaxed);
        return true;
    }
    return false;
}

/* Units [0, n) (in multiples of `unit`, each streaming about unit_bytes of
 * memory) shared out among the threads (decode's matrix-vector products).
 * Thread ith owns the ith of nth equal runs and claims it front to back, a
 * piece at a time (half of what is left of it), so it reads one unbroken
 * stream. A thread whose run is done takes the back half of what is left
 * unclaimed of the run with most left, as long as that is at least
 * TOY_SHARE_STEAL_MIN bytes, and again until none is: so a thread that runs
 * slow (a VM's busy core, a neighbour on the memory bus) is helped at the
 * end of the node instead of being waited for, and the helper starts a new
 * stream (whose first lines wait on memory with no prefetcher ahead of
 * them) only where it would otherwise wait.
 * Why: on a Zen 4, 2 threads, SmolLM2-135M Q4_0 decode, the two threads'
 * times for the same product differed by 11% (standard deviation; a third
 * of it lasting over many products), and the faster one waited 3-6 us at
 * the end of a 15-30 us product, ~0.45 ms of a 3 ms step. (Before, three
 * quarters were split in equal runs and the rest dealt in chunks, only
 * where those were at least 64 KB: 10 KB chunks, one stream each, had
 * cost 10% of that decode.)
 * A run's unclaimed units are one word, front | back << 32 (its thread's
 * line at TOY_WORK_SHARED), changed only by compare-and-swap: the owner
 * moves the front, helpers the back. Every thread empties its own run
 * before it leaves the node, so a run left from an earlier node (or the
 * zeroed buffer) reads as empty, and a helper that looks at a run before
 * its owner has set it takes nothing from it. So every thread calls
 * toy_share_next until it returns false, and a node uses at most one
 * toy_share (a second would reset runs a helper may still be taking from).
 * Units are counted in 32 bits. */
#define TOY_SHARE_STEAL_MIN ((size_t)8 << 10)
struct toy_share {
    _Atomic uint64_t *words; /* thread t's run: words[8 t] */
    int64_t n, unit, steal_min; /* elements; elements per unit; the fewest units worth taking */
    int ith, nth;
    bool own_done;
};

static inline uint64_t toy_share_word(uint64_t front, uint64_t back) { return front | back << 32; }

static inline void toy_share_init(struct toy_share *s, void *work, int64_t n, int64_t unit, size_t unit_bytes,
                                  int ith, int nth) {
    int64_t units = (n + unit - 1) / unit;
    *s = (struct toy_share){(_Atomic uint64_t *)((char *)work + TOY_WORK_SHARED), n, unit,
                            (int64_t)((TOY_SHARE_STEAL_MIN + unit_bytes - 1) / (unit_bytes ? unit_bytes : 1)), ith,
                            nth, false};
    if (nth > 1)
        atomic_store_explicit(&s->words[8 * ith],
                              toy_share_word((uint64_t)(units * ith / nth), (uint64_t)(units * (ith + 1) / nth)),
                              memory_order_relaxed);
}

static inline bool toy_share_next(struct toy_share *s, int64_t *u0, int64_t *u1) {
    uint64_t f = 0, b = 0, take = 0;
    if (s->nth == 1) {
        if (s->own_done) return false;
        s->own_done = true;
        *u0 = 0;
        *u1 = s->n;
        return s->n > 0;
    }
    if (!s->own_done) { /* the front of this thread's run */
        _Atomic uint64_t *w = &s->words[8 * s->ith];
        uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
        for (;;) {
            f = (uint32_t)v, b = v >> 32;
            if (f >= b) break;
            take = (b - f + 1) / 2;
            if (atomic_compare_exchange_weak_explicit(w, &v, toy_share_word(f + take, b), memory_order_relaxed,
                                                      memory_order_relaxed))
                goto got; /* [f, f + take) */
        }
        s->own_done = true;
    }
    for (;;) { /* the back half of the run with most left */
        _Atomic uint64_t *w = NULL;
        uint64_t v = 0, most = 0;
        for (int t = 0; t < s->nth; t++) {
            uint64_t x = atomic_load_explicit(&s->words[8 * t], memory_order_relaxed), xf = (uint32_t)x, xb = x >> 32;
            if (xb > xf && xb - xf > most) most = xb - xf, w = &s->words[8 * t], v = x;
        }
        if (!w || most < (uint64_t)s->steal_min) return false;
        f = (uint32_t)v, b = v >> 32, take = (most + 1) / 2;
        if (atomic_compare_exchange_strong_explicit(w, &v, toy_share_word(f, b - take), memory_order_relaxed,
                                                    memory_order_relaxed)) {
            f = b - take;
            goto got;
        }
    }
got:
    *u0 = (int64_t)f * s->unit;
    *u1 = (int64_t)(f + take) * s->unit < s->n ? (int64_t)(f + take) * s->unit : s->n;
    return true;
}

/* Loads a row of any plain or block dtype as f32 (tmp: ne0 floats scratch
 * when the row is not f32 contiguous). Returns a pointer to f32 data. */
const float *toy_cpu_row_f32(const struct toy_tensor *t, const char *row, float *tmp);

/* kernels in other files */
/* y (n) = W (n rows of k, ldw apart) x, or += with accum (gemv-avx2.c; the
 * CPU must have AVX2 + FMA); pc: a side stream to fetch ahead, a few lines
 * a row (qdot.h), or NULL */
struct toy_pf_cursor;
void toy_gemv_f32_avx2(const float *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                       struct toy_pf_cursor *pc);
/* the same over f16 weight rows (AVX2 + F16C) */
void toy_gemv_f16_avx2(const uint16_t *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                       struct toy_pf_cursor *pc);
/* and over bf16 ones (AVX2), where the CPU has no AVX-512 BF16 */
void toy_gemv_bf16_avx2(const uint16_t *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                        struct toy_pf_cursor *pc);
/* bf16 weight rows against activations rounded to bf16 and zero-padded to
 * a multiple of 32 (gemm-bf16-avx512.c; AVX-512 BF16) */
void toy_gemv_bf16_avx512(const uint16_t *w, int64_t ldw, const uint16_t *x, int64_t k, float *y, int64_t n,
                          bool accum, struct toy_pf_cursor *pc);
/* The f32 and bf16 ones with one 64-byte weight load at a time
 * (gemv-avx512.c, gemm-bf16-avx512.c), for CPUs whose prefetchers stream
 * wide loads faster than narrow ones: toy_cpu_wide_loads (simd.c) says
 * which kind this is. */
void toy_gemv_f32_avx512(const float *w, int64_t ldw, const float *x, int64_t k, float *y, int64_t n, bool accum,
                         struct toy_pf_cursor *pc);
void toy_gemv_bf16_wide_avx512(const uint16_t *w, int64_t ldw, const uint16_t *x, int64_t k, float *y, int64_t n,
                               bool accum, struct toy_pf_cursor *pc);
bool toy_cpu_wide_loads(void);
/* the same for the f32 GEMV, which also runs wide on AMD's Zen 5 (simd.c) */
bool toy_cpu_wide_loads_f32(void);
/* How far ahead of its loads (bytes; 0: not at all) a decode GEMV
 * prefetches its weight stream on this CPU (simd.c); _rows: a pass over
 * that many rows of activations (the packed int8 kernels', further ahead
 * on AMD from 2 rows on); and the rule behind both: by vendor and rows, or
 * $TOY_PREFETCH (env; *bad when it was not a valid value). */
int toy_cpu_prefetch_ahead(void);
int toy_cpu_prefetch_ahead_rows(int64_t rows);
int toy_cpu_prefetch_choice(bool intel, const char *env, int64_t rows, bool *bad);
/* The row loop the f32 and f16 decode GEMVs share: y[j] (+)= DOT(w_j, x)
 * for j < n (w_j at w + j ldw), the side stream pc stepped once a row, DOT
 * given the prefetch distance (qdot.h's toy_pf_step at the use site). */
#define TOY_GEMV_ROWS(DOT, w, ldw, x, k, y, n, accum, pc)   \
    do {                                                     \
        int ahead_ = toy_cpu_prefetch_ahead();               \
        for (int64_t j_ = 0; j_ < (n); j_++) {               \
            toy_pf_step(pc);                                 \
            float v_ = DOT((w) + j_ * (ldw), x, k, ahead_);  \
            (y)[j_] = (accum) ? (y)[j_] + v_ : v_;           \
        }                                                    \
    } while (0)
/* how bf16 GEMMs run on this CPU (matmul.c), in words */
const char *toy_cpu_bf16_route(void);
void toy_cpu_matmul(struct toy_tensor *dst, int ith, int nth, void *work, size_t work_size);
size_t toy_cpu_matmul_work(const struct toy_tensor *dst, int nth);
/* the mixture-of-experts kernels (moe.c) */
/* the bytes from one packed matrix of t to the next (a 3-d tensor packs
 * its matrices one after another: toy_tensor_pack) */
size_t toy_cpu_pack_stride(const struct toy_tensor *t);
void toy_cpu_moe_route(struct toy_tensor *t, int ith, int nth, float *tmp);
void toy_cpu_moe_matmul(struct toy_tensor *t, int ith, int nth, void *work, size_t ws);
size_t toy_cpu_moe_work(const struct toy_tensor *t, int nth);
void toy_cpu_moe_matmul_back(struct toy_tensor *t, int ith, int nth, void *work, size_t ws);
void toy_cpu_moe_matmul_back_w(struct toy_tensor *t, int ith, int nth, void *work, size_t ws);
size_t toy_cpu_moe_back_work(const struct toy_tensor *t, int nth);
void toy_cpu_moe_route_back(struct toy_tensor *t, int ith, int nth, float *tmp);
void toy_cpu_attention(struct toy_tensor *dst, int ith, int nth, void *work, size_t work_size);
void toy_cpu_attention_back(struct toy_tensor *dst, int ith, int nth, void *work, size_t work_size);
void toy_cpu_attn_sinks_back(struct toy_tensor *dst, int ith, int nth);
size_t toy_cpu_attention_work(const struct toy_tensor *dst, int nth);
/* Row h of ROPE node dst (one position: T = B = 1) into y, exactly as the
 * node computes it (tmp: 2 ne0 + 16 floats and ne0 doubles of scratch), and
 * one new row (head h, position p, batch b; n values) into a KV cache as
 * KV_STORE writes it: the decode attention's fused prologue (attention.c) */
void toy_cpu_rope_decode_row(const struct toy_tensor *dst, int64_t h, float *y, float *tmp);
void toy_cpu_kv_put(const struct toy_tensor *cache, int64_t h, int64_t p, int64_t b, const float *row, int64_t n);
/* The cache bytes (K rows, then V rows) thread ith of nth will read in the
 * decode step `dst` before its own fetches ahead take over (at most the
 * first TOY_ATTN_K_AHEAD and TOY_ATTN_V_AHEAD bytes), for the products
 * before it to fetch; returns 0 when dst is no decode step of the fast path.
 * The distances are those of the decode kernels (attn-decode-avx512.c). */
#define TOY_ATTN_K_AHEAD 4096
#define TOY_ATTN_V_AHEAD 8192
struct toy_prefetch;
int toy_cpu_attention_prefetch(const struct toy_tensor *dst, int ith, int nth, struct toy_prefetch *pf);

/* vector primitives with run-time ISA dispatch (simd.c) */
struct toy_vec_ops {
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, const float *x, float a, int64_t n);        /* y += a x */
    void (*scale)(float *y, const float *x, float s, int64_t n);       /* y = s x */
    float (*sumsq)(const float *x, int64_t n);
    float (*max)(const float *x, int64_t n);
    float (*exp_sum)(float *y, const float *x, float shift, int64_t n); /* y = exp(x - shift), returns sum */
    void (*silu_mul)(float *y, const float *g, const float *u, int64_t n);
    void (*rms_apply)(float *y, const float *x, const float *w, float r, int64_t n);
    void (*add)(float *y, const float *a, const float *b, int64_t n);
    void (*mul)(float *y, const float *a, const float *b, int64_t n);
    /* s = sigmoid(g): du = dy g s, dg = dy u s (1 + g (1 - s)) */
    void (*swiglu_back)(float *dg, float *du, const float *dy, const float *g, const float *u, int64_t n);
    /* GELU (tanh form) and its backward: y = gelu(x); dx = dy gelu'(x) */
    void (*gelu)(float *y, const float *x, int64_t n);
    void (*gelu_back)(float *dx, const float *dy, const float *x, int64_t n);
    void (*adamw)(float *p, const float *g, float *m, float *v, int64_t n, float lr, float b1,
                  float b2, float eps, float wd, float bc1, float bc2sqrt);
    /* acc += s a (b - mu), in double: a norm's weight gradient over rows */
    void (*acc_scaled_prod)(double *acc, const float *a, const float *b, double mu, double s, int64_t n);
    /* d = (s p) (d - di): a softmax row's backward from its probabilities p */
    void (*softmax_back)(float *d, const float *p, float di, float s, int64_t n);
    /* acc += x, in double (per element the reference's one add: the same bits) */
    void (*add_d)(double *acc, const float *x, int64_t n);
    /* a layer norm's row, its statistics in double: sum x, and sum (x - mu)^2 */
    double (*sum_d)(const float *x, int64_t n);
    double (*sqdev_d)(const float *x, double mu, int64_t n);
    /* y = (x - mu) r, times w and plus b where given */
    void (*layer_apply)(float *y, const float *x, const float *w, const float *b, float mu, float r, int64_t n);
    /* its backward, in double, with g = dy w (dy without w) and xh = (x - mu) r:
     * s = {sum g, sum g xh}, then y = r (g - mg - xh mgx) */
    void (*layer_back_sums)(double s[2], const float *dy, const float *w, const float *x, double mu, double r,
                            int64_t n);
    void (*layer_back_apply)(float *y, const float *dy, const float *w, const float *x, double mu, double r,
                             double mg, double mgx, int64_t n);
};
extern struct toy_vec_ops toy_vec;
void toy_simd_init(void);
bool toy_cpu_has_avx512bf16(void);
bool toy_cpu_has_avx512(void); /* F, BW, VL and DQ: what the *-avx512.c files need */
/* AMX-BF16 tiles usable by this process: the CPU has them, the OS saves
 * them and has granted this process their state (once; simd.c) */
bool toy_cpu_amx_bf16(void);
bool toy_amx_request(void);
/* toy's own single-threaded SGEMM (gemm-f32-avx512.c), row-major with
 * alpha 1, for CPUs where OpenBLAS runs kernels of an older ISA than the
 * CPU has; pack: toy_sgemm_avx512_pack_floats() floats of scratch. Blocks:
 * KC values of k by NC columns of op(B) packed (NC_TA where op(A) is
 * transposed: its strided columns are then read fewer times), MC rows of
 * op(A) a pass. Measured on a Zen 5 (2 threads, SmolLM2's and stories15M's
 * product shapes, interleaved): 64 columns rather than 512 gain 2-7% on
 * A B^T, and lose up to 11% on A^T B, hence the two widths.
 * toy_cpu_sgemm_own (matmul.c) says whether to use it. */
#ifndef TOY_SGEMM_KC
#define TOY_SGEMM_KC 384
#define TOY_SGEMM_NC 64
#define TOY_SGEMM_NC_TA 512
#define TOY_SGEMM_MC 256
#endif
void toy_sgemm_avx512(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc, float *pack);
size_t toy_sgemm_avx512_pack_floats(void);
bool toy_cpu_sgemm_own(void);
/* One thread's row-major sgemm: toy's kernel when `pack` (its scratch, of
 * toy_cpu_sgemm_pack_bytes(), 0 where BLAS runs) is given, else BLAS */
void toy_cpu_sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                   const float *b, int64_t ldb, float beta, float *c, int64_t ldc, float *pack);
size_t toy_cpu_sgemm_pack_bytes(void);
/* BF16 packing (gemm-bf16-avx512.c): the AVX-512 versions and their
 * one-value-at-a-time references */
void toy_pack_bf16_panels(const uint16_t *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                          uint16_t *panels);
void toy_pack_bf16_panels_ref(const uint16_t *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                              uint16_t *panels);
void toy_pack_f32_bf16_panels(const float *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                              uint16_t *panels);
void toy_pack_f32_bf16_panels_ref(const float *b, int64_t ldb, bool rows_are_cols, int64_t nc, int64_t k, int64_t kp,
                                  uint16_t *panels);
void toy_pack_f32_bf16_cols(const float *a, int64_t lda, int64_t c0, int64_t nc, int64_t k, uint16_t *y, int64_t kp);
void toy_pack_f32_bf16_cols_ref(const float *a, int64_t lda, int64_t c0, int64_t nc, int64_t k, uint16_t *y,
                                int64_t kp);
/* C = beta C + A B over bf16 operands (A: m rows of kp, zero rows up to the
 * kernel's tile rows; B: panels of 16 columns, pe elements apart), summed
 * in f32: AMX tiles (gemm-bf16-amx.c) or AVX-512 BF16 dot products
 * (gemm-bf16-avx512.c) */
typedef void (*toy_bf16_kernel)(int64_t m, int64_t nc, int64_t kp, const uint16_t *A, const uint16_t *panels,
                                int64_t pe, float *C, int64_t ldc, float beta);
void toy_gemm_bf16_amx(int64_t m, int64_t nc, int64_t kp, const uint16_t *A, const uint16_t *panels, int64_t pe,
                       float *C, int64_t ldc, float beta);
void toy_gemm_bf16_panels(int64_t m, int64_t nc, int64_t kp, const uint16_t *A, const uint16_t *panels, int64_t pe,
                          float *C, int64_t ldc, float beta);
/* The kernel bf16 products run on here and its rows per tile (*rows: 16
 * for AMX, 6 for dot products), or NULL where they run as sgemm over
 * widened values or not at all (matmul.c: the BF16 route) */
toy_bf16_kernel toy_cpu_bf16_kernel(int64_t *rows);
void toy_pack_f32_bf16(const float *x, int64_t k, uint16_t *y, int64_t kp);
const char *toy_simd_name(void);
/* blas.c: repairs OpenBLAS's fallback to generic kernels on a CPU it does
 * not know (once, from toy_cpu_init); the core to switch to from `picked`
 * given the CPU's ISA, or NULL to keep it */
void toy_blas_init(void);
/* the widest vector ISA of the OpenBLAS kernels running: 2 AVX-512, 1 AVX2,
 * 0 older, -1 a core name blas.c does not know */
int toy_blas_core_isa(void);
const char *toy_blas_better_core(const char *picked, bool avx2, bool avx512, bool avx512bf16);

#endif
