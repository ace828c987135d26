/* toy/tensor.h: tensors, arenas (contexts), views, and the op constructors.
 *
 * A tensor has up to 4 dims. ne[0] is the innermost (fastest varying) dim,
 * as in GGUF and ggml: a PyTorch tensor of shape (B, T, C) is ne = {C, T, B, 1}.
 * nb[i] is the byte stride of dim i; a tensor is contiguous when
 * nb[0] = type size and nb[i] = nb[i-1] * ne[i-1] (block types: rows).
 *
 * Tensors, views and graph nodes are bump-allocated in a context (an arena);
 * toy_ctx_free releases all of them at once. A context made with
 * alloc_data = true also allocates the data of the leaf tensors created in it
 * (parameters, inputs); op results never get data from the arena: the graph
 * memory planner (toy/graph.h) assigns it by liveness.
 *
 * Building ops records a graph; nothing is computed until the graph runs:
 *
 *     struct toy_ctx *ctx = toy_ctx_init(true);
 *     struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, 64, 8); // (8, 64)
 *     struct toy_tensor *w = toy_new_tensor_2d(ctx, TOY_F32, 64, 32); // (32, 64)
 *     toy_set_param(w);                              // trainable
 *     struct toy_tensor *y = toy_linear(ctx, x, w, NULL);    // (8, 32) = x w^T
 *     struct toy_tensor *loss = toy_sum_all(ctx, toy_silu(ctx, y));
 *     struct toy_graph *g = toy_graph_new(ctx);
 *     toy_graph_build(g, loss);
 *     toy_graph_backward(g, loss);                   // appends gradient ops
 *     toy_graph_plan(g, NULL, NULL);                 // memory by liveness
 *     toy_graph_compute(g, pool);                    // forward + backward
 *     // w->grad->data now holds d loss / d w (accumulated across runs)
 *
 * Shape or dtype errors while building ops abort with file:line (they are
 * programming errors); run-time errors come back as toy_status.
 */
#ifndef TOY_TENSOR_H
#define TOY_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/dtype.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_MAX_DIMS 4
#define TOY_MAX_SRC 6
#define TOY_MAX_OP_PARAMS 16
#define TOY_NAME_MAX 64

/* Ops. Forward ops first, then the ops the autodiff appends. Not serialized. */
#define TOY_OP_LIST(X)                                                       \
    X(NONE) X(VIEW) X(RESHAPE) X(PERMUTE) X(CONT) X(CAST)                    \
    X(ADD) X(SUB) X(MUL) X(DIV) X(SCALE) X(SQR) X(SQRT) X(NEG) X(TANH)               \
    X(MATMUL) X(GET_ROWS) X(SUM) X(MEAN) X(SUM_ALL) X(REPEAT) X(SUM_TO)      \
    X(RMS_NORM) X(LAYER_NORM) X(SILU) X(GELU) X(SWIGLU) X(SOFTMAX)           \
    X(ATTENTION) X(ROPE) X(CONCAT) X(CROSS_ENTROPY) X(MOE_ROUTE) X(MOE_MATMUL)   \
    X(SWIGLU_OAI)                                                            \
    X(GET_ROWS_BACK) X(VIEW_BACK) X(RMS_NORM_BACK) X(RMS_NORM_BACK_W)        \
    X(LAYER_NORM_BACK) X(LAYER_NORM_BACK_W) X(SILU_BACK) X(GELU_BACK)        \
    X(SWIGLU_BACK) X(SOFTMAX_BACK) X(ATTENTION_BACK) X(CROSS_ENTROPY_BACK)   \
    X(MOE_MATMUL_BACK) X(MOE_MATMUL_BACK_W) X(MOE_ROUTE_BACK) X(ATTN_SINKS_BACK) \
    X(SWIGLU_OAI_BACK)                                                       \
    X(ACCUM) X(KV_STORE)

enum toy_op {
#define TOY_X_OP(n) TOY_OP_##n,
    TOY_OP_LIST(TOY_X_OP)
#undef TOY_X_OP
    TOY_OP_COUNT
};

const char *toy_op_name(enum toy_op op);

enum toy_tensor_flag {
    TOY_FLAG_PARAM = 1 << 0,  /* trainable: the autodiff gives it a gradient */
    TOY_FLAG_INPUT = 1 << 1,  /* data set by the caller before each run */
    TOY_FLAG_OUTPUT = 1 << 2, /* kept after the run (never reused by the planner) */
    TOY_FLAG_LOSS = 1 << 3,
    TOY_FLAG_GRAD = 1 << 4,   /* a persistent gradient buffer of a parameter */
    TOY_FLAG_STATE = 1 << 5,  /* a parameter whose training value the model file does not hold as it is
                                 (folded there): the trainer's state file keeps it, for exact resume */
    TOY_FLAG_PACK_BORROWED = 1 << 6, /* t->packed lies in memory the caller owns (toy_tensor_pack_into) */
};

struct toy_tensor {
    enum toy_dtype type;
    int32_t n_dims;               /* 1..4, informational (ne beyond are 1) */
    int64_t ne[TOY_MAX_DIMS];     /* elements per dim, innermost first */
    size_t nb[TOY_MAX_DIMS];      /* byte strides */

    enum toy_op op;
    int32_t op_params[TOY_MAX_OP_PARAMS]; /* op-specific ints/floats */
    uint32_t flags;
    struct toy_tensor *src[TOY_MAX_SRC];

    struct toy_tensor *view_src;  /* the tensor whose data this one views */
    size_t view_offs;             /* byte offset into view_src's data */

    struct toy_tensor *grad;      /* params: the persistent gradient buffer */

    void *data;                   /* NULL until set, allocated or planned */
    size_t aux_bytes;             /* op scratch kept after the result (planned) */

    int32_t id;                   /* index in the graph (internal) */
    int32_t n_uses;               /* internal (planner) */
    char name[TOY_NAME_MAX];
    void *packed;                 /* a weight re-laid out for inference matmuls (toy_tensor_pack), or NULL */
    struct toy_tensor *prefetch;  /* CPU inference: a later node whose inputs this node's threads
                                     fetch ahead while they stream their own (toy_graph_set_fusion), or NULL */
    struct toy_tensor *siblings[2]; /* inference (CPU, CUDA): products of the same input that this product
                                       computes in its own pass (toy_graph_set_fusion), or NULL */
    struct toy_tensor *led_by;    /* inference (CPU, CUDA): the later node that does this one's work (the graph
                                     skips it, and its inputs live until then: toy_graph_set_fusion), or NULL */
};

/* ---- contexts ------------------------------------------------------------ */

struct toy_ctx;

/* A new arena. alloc_data: leaf tensors made here get zeroed data (64-byte
 * aligned). NULL on out-of-memory. */
struct toy_ctx *toy_ctx_init(bool alloc_data);
/* Frees every tensor, graph and data block made in ctx. NULL is a no-op. */
void toy_ctx_free(struct toy_ctx *ctx);
/* Bytes of tensor data allocated in the arena so far. */
size_t toy_ctx_data_bytes(const struct toy_ctx *ctx);
/* Bump allocation from the arena (64-byte aligned, zeroed); aborts on OOM. */
void *toy_ctx_alloc(struct toy_ctx *ctx, size_t bytes);

/* ---- creating tensors ----------------------------------------------------- */

struct toy_tensor *toy_new_tensor(struct toy_ctx *ctx, enum toy_dtype type, int n_dims,
                                  const int64_t *ne);
struct toy_tensor *toy_new_tensor_1d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0);
struct toy_tensor *toy_new_tensor_2d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1);
struct toy_tensor *toy_new_tensor_3d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1, int64_t ne2);
struct toy_tensor *toy_new_tensor_4d(struct toy_ctx *ctx, enum toy_dtype type, int64_t ne0,
                                     int64_t ne1, int64_t ne2, int64_t ne3);

/* Marks t trainable (it gets a persistent gradient in toy_graph_backward). */
void toy_set_param(struct toy_tensor *t);
/* Marks t frozen again (no gradient). */
void toy_set_frozen(struct toy_tensor *t);
void toy_set_input(struct toy_tensor *t);
void toy_set_output(struct toy_tensor *t);
struct toy_tensor *toy_set_name(struct toy_tensor *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Points t at external memory (an mmapped file, a caller buffer). */
void toy_tensor_set_data(struct toy_tensor *t, void *data);

/* ---- queries ---------------------------------------------------------------- */

int64_t toy_nelements(const struct toy_tensor *t);
int64_t toy_nrows(const struct toy_tensor *t);  /* ne1*ne2*ne3 */
size_t toy_nbytes(const struct toy_tensor *t);  /* bytes spanned by the data */
bool toy_is_contiguous(const struct toy_tensor *t);
bool toy_same_shape(const struct toy_tensor *a, const struct toy_tensor *b);
/* "(8, 64) f32" style description into buf (PyTorch order); returns buf. */
const char *toy_shape_str(const struct toy_tensor *t, char *buf, size_t n);

/* Element access for tests and small tools (F32/F16/BF16/I32 tensors with
 * data; any strides). */
float toy_get_f32(const struct toy_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3);
void toy_set_f32(struct toy_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3, float v);
/* Copies the tensor's elements, in logical order, into dst as f32. */
void toy_tensor_to_f32(const struct toy_tensor *t, float *dst);
/* Fills the tensor (any strides, F32/F16/BF16) from n = nelements floats. */
void toy_tensor_from_f32(struct toy_tensor *t, const float *src);

/* Prepares a frozen Q8_0/Q4_0/Q4_K weight (2-D) for fast
 * inference on this CPU: a private copy of its values re-laid out for the
 * int8 matmul kernels, which inference matmuls (graphs without a backward
 * pass) then read instead of t->data — decode streams it front to back and
 * results no longer depend on how many rows run together. t->data stays
 * valid for everything else. TOY_OK without a copy where nothing is gained
 * (other dtypes, a CPU without AVX-512 VNNI). toy_tensor_unpack frees it. */
enum toy_status toy_tensor_pack(struct toy_tensor *t);
void toy_tensor_unpack(struct toy_tensor *t);
/* The bytes toy_tensor_pack would allocate for t (a multiple of 64), or 0
 * where it packs nothing. */
size_t toy_tensor_pack_bytes(const struct toy_tensor *t);
/* toy_tensor_pack into the caller's memory (64-byte aligned, at least
 * toy_tensor_pack_bytes long), which must outlive the packing: a model packs
 * all its matrices into one toy_stream_alloc block. toy_tensor_unpack then
 * only forgets the pointer. */
void toy_tensor_pack_into(struct toy_tensor *t, void *dst);

/* Memory for large buffers that kernels stream front to back (packed
 * weights): whole pages, 2 MiB aligned once the size reaches 2 MiB, with
 * the kernel asked for transparent huge pages there (madvise), since a
 * 4 KiB page walk and prefetcher restart every 4 KiB cost a single thread
 * ~20% of its read bandwidth. Zeroed. NULL when the memory is not there.
 * toy_stream_free takes the size given to toy_stream_alloc. */
void *toy_stream_alloc(size_t bytes);
void toy_stream_free(void *p, size_t bytes);

/* ---- views (share data; no copy) -------------------------------------------- */

struct toy_tensor *toy_view(struct toy_ctx *ctx, struct toy_tensor *a, int n_dims,
                            const int64_t *ne, const size_t *nb, size_t offset);
struct toy_tensor *toy_reshape(struct toy_ctx *ctx, struct toy_tensor *a, int n_dims,
                               const int64_t *ne);
struct toy_tensor *toy_reshape_2d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1);
struct toy_tensor *toy_reshape_3d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1, int64_t ne2);
struct toy_tensor *toy_reshape_4d(struct toy_ctx *ctx, struct toy_tensor *a, int64_t ne0,
                                  int64_t ne1, int64_t ne2, int64_t ne3);
/* Result dim i is a's dim axes[i] (like torch.permute on reversed dims). */
struct toy_tensor *toy_permute(struct toy_ctx *ctx, struct toy_tensor *a, int ax0, int ax1,
                               int ax2, int ax3);
/* Swaps dims 0 and 1. */
struct toy_tensor *toy_transpose(struct toy_ctx *ctx, struct toy_tensor *a);
/* A contiguous copy (of any view), optionally changing the dtype. */
struct toy_tensor *toy_cont(struct toy_ctx *ctx, struct toy_tensor *a);
struct toy_tensor *toy_cast(struct toy_ctx *ctx, struct toy_tensor *a, enum toy_dtype type);

/* ---- elementwise -------------------------------------------------------------- */

/* b broadcasts to a: each b->ne[i] is 1 or a->ne[i]. Result has a's shape. */
struct toy_tensor *toy_add(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b);
struct toy_tensor *toy_sub(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b);
struct toy_tensor *toy_mul(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b);
struct toy_tensor *toy_div(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b);
struct toy_tensor *toy_scale(struct toy_ctx *ctx, struct toy_tensor *a, float s);
struct toy_tensor *toy_sqr(struct toy_ctx *ctx, struct toy_tensor *a);
struct toy_tensor *toy_sqrt(struct toy_ctx *ctx, struct toy_tensor *a);
struct toy_tensor *toy_neg(struct toy_ctx *ctx, struct toy_tensor *a);
struct toy_tensor *toy_tanh(struct toy_ctx *ctx, struct toy_tensor *a);
struct toy_tensor *toy_silu(struct toy_ctx *ctx, struct toy_tensor *a);
/* GELU, tanh approximation (GPT-2, ViT). */
struct toy_tensor *toy_gelu(struct toy_ctx *ctx, struct toy_tensor *a);
/* silu(gate) * up; same shapes. */
struct toy_tensor *toy_swiglu(struct toy_ctx *ctx, struct toy_tensor *gate, struct toy_tensor *up);
/* gpt-oss's clamped SwiGLU (ggml's swiglu_oai), elementwise over gate and up
 * of one shape (f32, any strides, as toy_swiglu):
 *     g' = min(gate, limit), u' = clamp(up, -limit, limit),
 *     y  = g' * sigmoid(alpha * g') * (u' + 1).
 * gpt-oss uses alpha = 1.702, limit = 7; limit <= 0 clamps nothing. The
 * gradients are PyTorch's: dgate is 0 where gate > limit, dup is 0 where
 * |up| > limit (the bounds themselves pass it). Never fused into a matmul. */
struct toy_tensor *toy_swiglu_oai(struct toy_ctx *ctx, struct toy_tensor *gate, struct toy_tensor *up, float alpha,
                                  float limit);

/* ---- matrix products ------------------------------------------------------------ */

/* Batched C = op(A) op(B), PyTorch-style: A is (.., m, k) i.e. ne = {k, m, ..}
 * (or {m, k} with trans_a), B is (.., k, n) i.e. ne = {n, k, ..} (or {k, n}
 * with trans_b). Result ne = {n, m, batch...}. B's batch dims broadcast to A's
 * (each 1 or a multiple: GQA). A must be F32; B may be F32, F16, BF16 or a
 * quantized type (fast with trans_b, as weights are stored: rows of k). */
struct toy_tensor *toy_matmul(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b,
                              bool trans_a, bool trans_b);
/* y = x W^T (+ bias): x (.., in), W (out, in) i.e. ne = {in, out}, bias (out). */
struct toy_tensor *toy_linear(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                              struct toy_tensor *bias);
/* The same with the product and its gradients in bf16 when bf16 (mixed
 * precision): x rounded to bf16, an F32 W rounded (f32 master weights) or
 * a Q8_0, Q4_0 or Q4_K W dequantized (a QLoRA base) to bf16 as the kernel
 * packs it, sums in f32 -- where a cast would hold a bf16 copy of every
 * weight from the forward to the backward. A BF16 W is bf16 anyway.
 * Products of at most 8 rows, and CPUs without bf16 products or whose
 * BF16 route is sgemm, run as toy_linear. */
struct toy_tensor *toy_linear_bf16(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                   struct toy_tensor *bias, bool bf16);

/* ---- indexing, reductions ------------------------------------------------------- */

/* Rows of `table` (ne = {d, n_rows}) picked by I32 `ids` (any shape up to 3-D):
 * result ne = {d, ids->ne0, ids->ne1, ids->ne2}. Table may be F32/F16/BF16/quantized. */
struct toy_tensor *toy_get_rows(struct toy_ctx *ctx, struct toy_tensor *table,
                                struct toy_tensor *ids);
/* Sum / mean along dim (kept with size 1). */
struct toy_tensor *toy_sum(struct toy_ctx *ctx, struct toy_tensor *a, int dim);
struct toy_tensor *toy_mean(struct toy_ctx *ctx, struct toy_tensor *a, int dim);
/* Sum of every element: a 1-element tensor. */
struct toy_tensor *toy_sum_all(struct toy_ctx *ctx, struct toy_tensor *a);
/* Broadcast a to like's shape (each a->ne[i] is 1 or like->ne[i]). */
struct toy_tensor *toy_repeat(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *like);
/* Sum a down to like's shape (the reverse of repeat). */
struct toy_tensor *toy_sum_to(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *like);
/* Concatenate along dim (other dims equal). */
struct toy_tensor *toy_concat(struct toy_ctx *ctx, struct toy_tensor *a, struct toy_tensor *b,
                              int dim);

/* ---- normalisation, softmax ------------------------------------------------------- */

/* x / sqrt(mean(x^2) + eps) * w over ne0; w (ne0) may be NULL. */
struct toy_tensor *toy_rms_norm(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                float eps);
/* (x - mean) / sqrt(var + eps) * w + b over ne0; w, b may be NULL. */
struct toy_tensor *toy_layer_norm(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                  struct toy_tensor *b, float eps);
/* softmax(x * scale + mask) over ne0; mask (F32, broadcast to x) may be NULL. */
struct toy_tensor *toy_softmax(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *mask,
                               float scale);

/* ---- attention, rope ------------------------------------------------------------------ */

struct toy_attn_params {
    float scale;        /* 0: 1/sqrt(head_dim) */
    bool causal;        /* query t attends keys <= t (keys offset by kv_len - q_len) */
    int32_t window;     /* >0: sliding window, key within the last `window` positions */
    float softcap;      /* >0: scores -> softcap * tanh(scores / softcap) */
    bool bf16;          /* products over bf16-rounded operands with f32 sums (mixed-precision
                         * training), where the CPU multiplies bf16 natively (AMX, AVX-512 BF16);
                         * elsewhere, and over an f16 KV cache, f32 as without it */
    /* F32 {Hq} or NULL: attention sinks (gpt-oss), a learned logit per query
     * head that joins every row's softmax as one more key whose value is
     * zero: the weights sum to less than 1 (exp(s_h) takes the rest). It
     * gets a gradient when it is a parameter. */
    struct toy_tensor *sinks;
};

/* Fused scaled-dot-product attention with grouped-query heads.
 * q: {D, Hq, Tq, B}, k and v: {D, Hkv, Tk, B} (Hq a multiple of Hkv; views ok
 * when rows are contiguous). Result {D, Hq, Tq, B}, contiguous. Never
 * materialises the Tq x Tk matrix; keeps the softmax statistics for backward. */
struct toy_tensor *toy_attention(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k,
                                 struct toy_tensor *v, const struct toy_attn_params *p);
/* The same over packed rows (several documents in one row): seg is an I32
 * {T, B} tensor of segment ids, T = Tq = Tk, read when the graph runs. Query
 * t of row b attends key j of row b only if seg[b][j] == seg[b][t], on top of
 * the causal / sliding-window rule (those compare indices in the row; within
 * one document they differ from the document's own positions by a constant,
 * so both agree; pass the restarted positions to RoPE). Ids are arbitrary
 * int32 values compared for equality; documents are usually contiguous runs
 * (0, 0, 0, 1, 1, 2, ...), and padding gets an id of its own. A query always
 * sees itself, so no row is empty. Cost: a query block computes scores only
 * from the first to the last key of its own id inside its causal range (no
 * key block of another document is computed); keys of another id in between
 * are masked. seg gets no gradient. NULL seg is toy_attention. */
struct toy_tensor *toy_attention_seg(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k,
                                     struct toy_tensor *v, struct toy_tensor *seg, const struct toy_attn_params *p);

/* ---- KV cache ---------------------------------------------------------------- */

/* Writes x {D, H, Tn, B} into cache {D, H, Tmax, B} (a persistent F32 leaf)
 * at positions n_past .. n_past+Tn-1, n_past being an I32 1-element tensor
 * read when the graph runs (so one decode graph serves every step). Returns
 * a tensor that aliases the cache, to pass to toy_attention_cached. A run
 * that would pass Tmax fails with TOY_ERR_RANGE. */
struct toy_tensor *toy_kv_store(struct toy_ctx *ctx, struct toy_tensor *cache, struct toy_tensor *x,
                                struct toy_tensor *n_past);
/* Attention of q {D, Hq, Tq, B} over the first n_past + Tq positions of the
 * stored caches (causal: query i sits at position n_past + i). */
struct toy_tensor *toy_attention_cached(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k_store,
                                        struct toy_tensor *v_store, struct toy_tensor *n_past,
                                        const struct toy_attn_params *p);
/* Rows of many sequences at once, each at a position of its own (a server's
 * decode step over its slots): row r of x {D, H, R, 1} goes to position
 * pos[r] of sequence seq[r] of cache {D, H, Tmax, S}; pos and seq are I32
 * {R} tensors read when the graph runs. A row outside the cache fails the
 * run with TOY_ERR_RANGE. Returns a tensor that aliases the cache, to pass
 * to toy_attention_rows. */
struct toy_tensor *toy_kv_store_rows(struct toy_ctx *ctx, struct toy_tensor *cache, struct toy_tensor *x,
                                     struct toy_tensor *seq, struct toy_tensor *pos);
/* Attention of query rows q {D, Hq, R, 1}, row r over the keys and values
 * at positions 0 .. pos[r] of sequence seq[r] of the stored caches (causal,
 * the window counted back from pos[r]). Each row gets the bits a decode step
 * of its sequence alone (toy_attention_cached, one query) gives on the same
 * threads. No gradient. */
struct toy_tensor *toy_attention_rows(struct toy_ctx *ctx, struct toy_tensor *q, struct toy_tensor *k_store,
                                      struct toy_tensor *v_store, struct toy_tensor *seq, struct toy_tensor *pos,
                                      const struct toy_attn_params *p);

/* ---- mixture of experts ----------------------------------------------------------------
 *
 * A token's router logits {E} pick its k experts (toy_moe_route) and each
 * expert's matrix multiplies the token's row (toy_moe_matmul), so a decode
 * step reads k of the E expert matrices, not all of them. */

/* The top k of E experts for each row of logits {E, rows...} (F32): the
 * softmax over all E, the k largest (ties to the lower index), their
 * probabilities renormalised to sum 1 when `norm` (Mixtral, Qwen3-MoE) or
 * kept as they are (OLMoE, Qwen2-MoE). Result I32 {k, rows}: the experts'
 * ids, best first; their weights follow the ids as k x rows floats. */
struct toy_tensor *toy_moe_route(struct toy_ctx *ctx, struct toy_tensor *logits, int k, bool norm);
/* The same with DeepSeek-V3's scoring: the experts' scores are sigmoids of
 * the logits instead of their softmax when `sigmoid`, and a bias {E} (F32;
 * NULL: none) is added to the scores to choose the k, not to weigh them:
 * the weights are the chosen ones' unbiased scores (renormalised when
 * `norm`). */
struct toy_tensor *toy_moe_route_scored(struct toy_ctx *ctx, struct toy_tensor *logits, int k, bool norm, bool sigmoid,
                                        struct toy_tensor *bias);
/* Row r of x {K, R, N} (R = 1: one row for all k slots; R = k: one per
 * slot) times expert route[s, n]'s matrix of w {K, n_out, E} (weights as a
 * MATMUL's B, any weight dtype), for every slot s < k of route {k, N}:
 * {n_out, k, N}; with `combine`, the slots' results summed with the
 * route's weights: {n_out, N}. */
struct toy_tensor *toy_moe_matmul(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *w,
                                  struct toy_tensor *route, bool combine);

enum toy_rope_mode { TOY_ROPE_NORMAL = 0, TOY_ROPE_NEOX = 2 };
enum toy_rope_scaling { TOY_ROPE_SCALING_NONE = 0, TOY_ROPE_SCALING_LINEAR = 1,
                        TOY_ROPE_SCALING_LLAMA3 = 2, TOY_ROPE_SCALING_YARN = 3 };

struct toy_rope_params {
    int32_t n_dims;         /* rotated dims (<= head dim, even); 0 = head dim */
    enum toy_rope_mode mode;
    float freq_base;        /* theta, e.g. 10000 */
    enum toy_rope_scaling scaling;
    float factor;           /* linear/llama3/yarn scaling factor */
    int32_t orig_ctx;       /* llama3/yarn: original context length */
    float low_freq_factor, high_freq_factor;  /* llama3 (1, 4) */
    float beta_fast, beta_slow;               /* yarn (32, 1) */
    /* multiplies cos and sin (the rotated pairs' length), under any scaling
     * (llama.cpp's rope.scaling.attn_factor: Phi-3's LongRoPE); 0 = YaRN's
     * 0.1 ln(factor) + 1 under yarn, else 1 */
    float attn_factor;
};

/* Rotary embedding of x {D, H, T, B} at I32 positions pos {T} (shared by the
 * batch) or {T*B}. */
struct toy_tensor *toy_rope(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                            const struct toy_rope_params *p);
/* The same with per-frequency divisors (F32 {n_dims/2}: GGUF rope_freqs.weight
 * of Llama 3.1+), applied on top of p's scaling. */
struct toy_tensor *toy_rope_ff(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                               const struct toy_rope_params *p, struct toy_tensor *freq_factors);

/* ---- losses ---------------------------------------------------------------------------- */

/* Mean softmax cross-entropy of logits {V, N...} against I32 targets {N...};
 * targets equal to ignore_index are skipped (-100 as in PyTorch). A 1-element
 * result. Never materialises the softmax. */
struct toy_tensor *toy_cross_entropy(struct toy_ctx *ctx, struct toy_tensor *logits,
                                     struct toy_tensor *targets, int32_t ignore_index);

#ifdef __cplusplus
}
#endif
#endif
