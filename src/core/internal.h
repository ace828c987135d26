/* internal.h: what the core files share and the public headers do not show. */
#ifndef TOY_CORE_INTERNAL_H
#define TOY_CORE_INTERNAL_H

#include <stdint.h>
#include <string.h>

#include "toy/graph.h"
#include "toy/tensor.h"

/* one N(0, 1) draw from two words of a toy_rng stream (rng.c) */
float toy_rng_normal_of(uint64_t a, uint64_t b);

/* the CPU converts f16 with F16C (and has AVX): CPUID, since clang lacks __builtin_cpu_supports("f16c") */
bool toy_cpu_has_f16c(void);

/* Tensor metadata in the arena, contiguous strides, no data. */
struct toy_tensor *toy_tensor_alloc_meta(struct toy_ctx *ctx, enum toy_dtype type, int n_dims,
                                         const int64_t *ne);
bool toy_ctx_allocs_data(const struct toy_ctx *ctx);
struct toy_graph;
void toy_ctx_register_graph(struct toy_ctx *ctx, struct toy_graph *g);
void toy_graph_release(struct toy_graph *g);
void toy_graph_expand(struct toy_graph *g, struct toy_tensor *t);

static inline void toy_param_f32_set(struct toy_tensor *t, int i, float v) {
    memcpy(&t->op_params[i], &v, sizeof v);
}
static inline float toy_param_f32(const struct toy_tensor *t, int i) {
    float v;
    memcpy(&v, &t->op_params[i], sizeof v);
    return v;
}

/* t's name for messages: "(unnamed)" when it has none */
static inline const char *toy_label(const struct toy_tensor *t) { return t->name[0] ? t->name : "(unnamed)"; }

/* the tensor whose bytes t uses: its view base, or for an add fused into a
 * product (graph-fuse.c) the result it accumulates into */
static inline struct toy_tensor *toy_storage_of(struct toy_tensor *t) {
    while (t && t->view_src) t = t->view_src;
    return t;
}

/* a VIEW's byte offset into its source, which toy_view keeps in
 * op_params[0..1] (31 bits each) */
static inline size_t toy_view_offset(const struct toy_tensor *v) {
    return (size_t)(uint32_t)v->op_params[0] | ((size_t)(uint32_t)v->op_params[1] << 31);
}

static inline bool toy_is_view_op(enum toy_op op) {
    return op == TOY_OP_VIEW || op == TOY_OP_RESHAPE || op == TOY_OP_PERMUTE;
}

/* op_params layouts (indices) */
enum {
    /* MATMUL (EXACT: in a graph with a backward pass, so no int8 fast path
     * that quantizes the activations) */
    P_MM_TRANS_A = 0, P_MM_TRANS_B = 1, P_MM_ACCUM = 2, P_MM_EXACT = 3,
    /* fused prologue (graph-fuse.c): kind, and the norm's eps; its second
     * input in src[2] (a LayerNorm's bias in src[3]). A fused bias row,
     * added to each result row before any accumulation, is src[4]. */
    P_MM_PRE = 4, P_MM_EPS = 5,
    /* the share [LO, HI) of dst->prefetch's reads this product fetches ahead (floats) */
    P_MM_PF_LO = 6, P_MM_PF_HI = 7,
    /* products in bf16 over a quantized B (mixed precision over a quantized
     * base: B dequantized to bf16 as it is packed, A rounded); the CPU's
     * BF16 kernels take it where they are not the sgemm route */
    P_MM_BF16 = 8,
    /* computed by an earlier product of the same input, one of whose
     * siblings it is (graph-fuse.c): the graph skips it */
    P_MM_LED = 9,
    /* SUM, MEAN, CONCAT */ P_DIM = 0,
    /* SCALE */ P_SCALE = 0,
    /* norms */ P_EPS = 0,
    /* SOFTMAX */ P_SM_SCALE = 0,
    /* SWIGLU_OAI, SWIGLU_OAI_BACK: alpha and limit (floats; limit <= 0: no clamp) */
    P_SWO_ALPHA = 0, P_SWO_LIMIT = 1,
    /* ATTENTION: scale, causal, window, softcap, cached (n_past in src[3]),
     * segmented (seg ids in src[4]; ATTENTION_BACK: src[5]), products in
     * bf16 (toy_attn_params.bf16); sinks, when given, in src[5] (its lse
     * includes them, so ATTENTION_BACK needs no more; ATTN_SINKS_BACK
     * (dO, the ATTENTION, the sinks) is their gradient) */
    P_AT_SCALE = 0, P_AT_CAUSAL = 1, P_AT_WINDOW = 2, P_AT_SOFTCAP = 3, P_AT_DYNKV = 4, P_AT_SEG = 5,
    P_AT_BF16 = 6,
    /* a decode attention that rotates its query and its new key itself and
     * stores the new key and value in the caches (graph-fuse.c): src[0] is
     * the query's ROPE, src[1] and src[2] the KV_STOREs, all led_by it */
    P_AT_FUSED = 7,
    /* query rows of many sequences (toy_attention_rows): positions in
     * src[3], sequences in src[4] */
    P_AT_ROWS = 8,
    /* KV_STORE: rows at positions of their own (toy_kv_store_rows): positions
     * in src[2], sequences in src[3] */
    P_KV_ROWS = 0,
    /* ROPE: n_dims, mode, base, scaling, factor, orig_ctx, low, high, beta_fast,
     * beta_slow, attn_factor, inverse */
    P_RP_NDIMS = 0, P_RP_MODE, P_RP_BASE, P_RP_SCALING, P_RP_FACTOR, P_RP_ORIG,
    P_RP_LOW, P_RP_HIGH, P_RP_BFAST, P_RP_BSLOW, P_RP_ATTN, P_RP_INVERSE,
    /* CROSS_ENTROPY */ P_CE_IGNORE = 0,
    /* MOE_ROUTE: experts per row, renormalised; MOE_MATMUL: slots summed,
     * and f32 activations (the autodiff sets it: no int8 products); its
     * backward ops (MOE_MATMUL_BACK, _BACK_W) take P_MM_COMBINE too */
    P_MR_K = 0, P_MR_NORM = 1, P_MR_SIGMOID = 2, P_MM_COMBINE = 0, P_MOE_EXACT = 1,
    /* GET_ROWS_BACK */ P_GRB_ACCUM = 0,
    /* VIEW_BACK: adds into the bytes of src[TOY_MAX_SRC - 1], an earlier
     * VIEW_BACK of the same tensor (autodiff.c), instead of zeros */
    P_VB_ACCUM = 0,
    /* VIEW_BACK: the views of its chain tile the tensor (each element in
     * exactly one): each stores its part, and nothing is zeroed first */
    P_VB_STORE = 1,
};


/* MATMUL's P_MM_PRE */
enum { TOY_MM_PRE_NONE, TOY_MM_PRE_RMS, TOY_MM_PRE_SWIGLU, TOY_MM_PRE_LAYER, TOY_MM_PRE_GELU };

struct toy_tensor *toy_rope_impl(struct toy_ctx *ctx, struct toy_tensor *x, struct toy_tensor *pos,
                                 const int32_t *params, bool inverse);

/* ---- graph internals shared by graph.c and autodiff.c ---- */

struct toy_ptrmap {            /* open addressing: tensor pointer -> int */
    const void **keys;
    int *vals;
    int cap, n;
};
int toy_ptrmap_get(const struct toy_ptrmap *m, const void *k);     /* -1 if absent */
void toy_ptrmap_put(struct toy_ptrmap *m, const void *k, int v);
void toy_ptrmap_free(struct toy_ptrmap *m);

struct toy_graph {
    struct toy_ctx *ctx;
    struct toy_tensor **nodes;
    int n_nodes, cap;
    struct toy_ptrmap index;       /* node -> position */
    struct toy_ptrmap visited;     /* leaves and nodes seen by build */
    struct toy_tensor **grads;     /* gradient of node i (by position), or NULL */
    struct toy_ptrmap leaf_grads;  /* leaf tensor -> index into leaf_grad_list */
    struct toy_tensor **leaf_grad_list;
    int n_leaf_grads, cap_leaf_grads;
    struct toy_tensor **params;
    int n_params, cap_params;
    struct toy_tensor **own_grads; /* parameters whose p->grad this graph's backward made (in its context) */
    int n_own_grads, cap_own_grads;
    int n_forward;                 /* nodes before toy_graph_backward */

    struct toy_membuf own_buf;
    struct toy_membuf *buf;
    size_t *offsets;               /* planned offset of node i, or SIZE_MAX */
    void *planned_data;            /* buf->data when the offsets were bound (another graph's plan may move it) */
    bool planned;
    struct toy_plan_info plan;

    bool timing;
    double op_us[TOY_OP_COUNT];
    struct toy_trace *trace;
    toy_graph_node_fn on_node;     /* after each node that runs (NULL: none) */
    void *on_node_ud;

    /* device selection (backends/registry.c): be NULL = the process default */
    const struct toy_backend_ops *be;
    int device;
    uint32_t plan_gen;             /* bumped by every toy_graph_plan */
    /* the scratch the last run's nodes needed, and what it depends on
     * (toy_graph_compute): the plan, the thread count, the packed weights */
    size_t ws;
    uint32_t ws_plan_gen, ws_pack_gen;
    int ws_nth, ws_runs, ws_parallel; /* ws_parallel: nodes all threads run (toy_graph_compute) */
    bool want_fusion;              /* toy_graph_set_fusion */
    const struct toy_backend_ops *fused_for; /* the backend whose kernels the graph was fused for (once) */
    void *dev_state;               /* a device backend's copies of this graph */
    void (*dev_free)(struct toy_graph *g); /* frees dev_state */
};

void toy_graph_add_node(struct toy_graph *g, struct toy_tensor *t);
/* Bumped whenever a weight is packed or unpacked (toy_tensor_pack), which
 * changes the kernels, and so the scratch, of the products over it. */
uint32_t toy_pack_gen(void);
void toy_pack_gen_bump(void);
/* graph-fuse.c: folds norms, SwiGLUs and residual adds into the small
 * products of an inference graph; returns the number of rewrites. What
 * else it does depends on what the backend's kernels can run: */
struct toy_fuse_target {
    /* products a single pass can compute with their siblings (NULL:
     * none), of at most sibling_rows rows */
    bool (*siblings)(const struct toy_tensor *mm);
    int sibling_rows;
    /* decode attentions that do their ROPEs and KV_STOREs themselves
     * (NULL: none) */
    bool (*attention)(const struct toy_tensor *at);
    /* the products before a decode attention fetch its first cache rows */
    bool prefetch;
    /* products whose kernels also take a LayerNorm or GELU prologue and
     * add a bias row to their results (NULL: none) */
    bool (*epilogue)(const struct toy_tensor *mm);
};
extern const struct toy_fuse_target toy_cpu_fuse_target;
int toy_graph_fuse(struct toy_graph *g, const struct toy_fuse_target *tg);

/* CPU backend entry points (src/backends/cpu/), used through
 * backends/registry.c. */
size_t toy_cpu_work_size(const struct toy_tensor *node, int nth);
void toy_cpu_compute(struct toy_tensor *node, int ith, int nth, void *work, size_t work_size);
void toy_cpu_init(void);
/* whether the CPU runs this product with its packed decode kernel (the one
 * that computes a product's siblings too: graph-fuse.c) */
bool toy_cpu_matmul_packed(const struct toy_tensor *node);
/* whether this decode attention can do its ROPEs and KV_STOREs itself
 * (attention.c; graph-fuse.c checks the graph's side) */
bool toy_cpu_attention_fusable(const struct toy_tensor *node);

#endif
