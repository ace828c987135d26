/* cuda-graph.c: running a planned graph on a CUDA device.
 *
 * Device memory mirrors the host plan: one device buffer of the plan's peak
 * size holds every op result at the same offset the planner gave it on the
 * host; views, accumulating gradient nodes and KV stores resolve to their
 * base exactly as on the CPU. Leaves (tensors with host data) get device
 * copies by kind:
 *
 *   resident  constant data: uploaded once, shared by graphs (counted):
 *             leaves in read-only memory (a mmapped GGUF) and F16 / BF16 /
 *             quantized leaves that are not parameters (weights);
 *   kv        a KV cache (written by KV_STORE): uploaded once, shared by
 *             the graphs that use it (prefill and decode), stays on the
 *             device; the rows a run stores are copied back to the host;
 *   grad      a persistent gradient: uploaded before (the host may have
 *             zeroed it) and downloaded after every run;
 *   upload    everything else (inputs, ids, positions, parameters the
 *             host optimizer updates): uploaded before every run; small
 *             ones through a pinned staging buffer;
 *   bound     a parameter or gradient a device-resident optimizer keeps
 *             on this device (cuda-optim.c): the graph reads and writes
 *             the optimizer's copy in place, never uploads or downloads
 *             it. A graph notices a change of the bound table (its
 *             generation) on its next run and builds its state again.
 *
 * After the kernels, OUTPUT / LOSS results and the last node are copied back
 * into their host addresses, so host code reads t->data as on the CPU.
 * Everything above is built once per plan (descriptors of every node
 * included); a run is uploads, one launch sequence on the device's stream,
 * downloads and one synchronisation. Compiled only with TOY_CUDA.
 */
#ifdef TOY_CUDA
#include <cuda_runtime_api.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend-impl.h"
#include "backends/cuda/cuda-impl.h"
#include "core/internal.h"

#define STAGE_MAX ((size_t)4 << 20) /* leaves up to this size go through pinned staging */

enum { L_UPLOAD, L_RESIDENT, L_KV, L_GRAD };

struct leaf {
    struct toy_tensor *t;
    char *d;
    size_t size;
    int kind;
    bool owned;        /* allocated here (not a resident copy) */
    bool bound;        /* a device-resident optimizer's copy (cuda-optim.c) */
    const void *host;  /* t->data when the copy was made */
};

struct staged { void *host; size_t off, size; };
struct range { uintptr_t lo, hi; };

struct cu_graph {
    int dev;
    uint32_t plan_gen;
    int n_nodes;
    struct toy_cu_device *cd;
    char *dbuf;                  /* plan peak bytes */
    struct leaf *leaves;
    int n_leaves;
    struct toy_ptrmap lmap;      /* leaf tensor -> index in leaves */
    struct toy_cu_node *cn;      /* per node (views: unused) */
    char *work;
    size_t work_size;
    int32_t *err;                /* device word */
    double *rope;                /* device table of every ROPE node's frequencies */
    char *stage;                 /* pinned host staging */
    size_t stage_size;
    struct staged *down;         /* staged downloads of one run */
    int n_down, cap_down;
    struct range *pinned;        /* host ranges this graph page-locked */
    int n_pinned;
    bool capturable;             /* forward only: the kernels replay as a CUDA graph */
    int runs;                    /* runs so far (the first one runs uncaptured) */
    cudaGraphExec_t exec;        /* the captured kernels, once captured */
    uint64_t bound_gen;          /* toy_cu_bound_gen() when prepared */
    struct cu_graph *prev, *next; /* every live graph (toy_cuda_graph_grad_device) */
};

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cu_graph *live;

static void live_add(struct cu_graph *cg) {
    pthread_mutex_lock(&live_lock);
    cg->prev = NULL;
    cg->next = live;
    if (live) live->prev = cg;
    live = cg;
    pthread_mutex_unlock(&live_lock);
}

static void live_remove(struct cu_graph *cg) {
    pthread_mutex_lock(&live_lock);
    if (cg->prev) cg->prev->next = cg->next;
    else if (live == cg) live = cg->next;
    if (cg->next) cg->next->prev = cg->prev;
    cg->prev = cg->next = NULL;
    pthread_mutex_unlock(&live_lock);
}

/* a node that adds into the bytes of src[TOY_MAX_SRC - 1]: a persistent
 * gradient (autodiff), or the planned result it adds to: for a residual
 * add folded into a product (graph-fuse.c), or for a view's gradient, the
 * earlier VIEW_BACK of the same tensor (autodiff.c) */
static bool accum_node(const struct toy_tensor *t) {
    return t->op == TOY_OP_ACCUM || (t->op == TOY_OP_MATMUL && t->op_params[P_MM_ACCUM]) ||
           (t->op == TOY_OP_GET_ROWS_BACK && t->op_params[P_GRB_ACCUM]) ||
           (t->op == TOY_OP_VIEW_BACK && t->op_params[P_VB_ACCUM]);
}
static bool writes_grad_node(const struct toy_tensor *t) {
    return accum_node(t) && t->src[TOY_MAX_SRC - 1]->op == TOY_OP_NONE;
}

/* a node whose work another one does (graph-fuse.c): a sibling product,
 * or a ROPE or KV_STORE its attention does */
static bool led_node(const struct toy_tensor *t) {
    return t->led_by || (t->op == TOY_OP_MATMUL && t->op_params[P_MM_LED]);
}
static bool no_kernel(const struct toy_tensor *t) { return toy_is_view_op(t->op) || led_node(t); }

/* Products over weights the GEMV kernels (kernels-matmul.cu) stream:
 * quantized, or F16/BF16 with 16-byte aligned rows. One-row ones run with
 * their siblings in one launch, and all take a LayerNorm or GELU prologue
 * and a bias row (GPT-2's). Others stay apart. */
static bool cuda_gemv_weights(const struct toy_tensor *mm) {
    const struct toy_tensor *b = mm->src[1];
    if (!mm->op_params[P_MM_TRANS_B] || b->ne[2] != 1 || b->ne[3] != 1 || !toy_is_contiguous(b)) return false;
    if (b->type == TOY_F16 || b->type == TOY_BF16) return b->ne[0] % 8 == 0;
    switch (b->type) {
    case TOY_Q8_0: case TOY_Q4_0: case TOY_Q4_1: case TOY_Q5_0: case TOY_Q5_1: case TOY_Q4_K: case TOY_Q5_K:
    case TOY_Q6_K: case TOY_Q2_K: case TOY_Q3_K: case TOY_IQ4_NL: case TOY_IQ4_XS: case TOY_MXFP4: return true;
    default: return false;
    }
}
/* Decode attentions that do their ROPEs and KV_STOREs in a prologue kernel
 * (kernels-ops.cu: one launch for four), over F16 or F32 caches. */
static bool cuda_attention(const struct toy_tensor *at) {
    enum toy_dtype kt = at->src[1]->src[0]->type, vt = at->src[2]->src[0]->type;
    return at->op_params[P_AT_DYNKV] && (kt == TOY_F16 || kt == TOY_F32) && (vt == TOY_F16 || vt == TOY_F32);
}
const struct toy_fuse_target toy_cuda_fuse_target = {cuda_gemv_weights, 1, cuda_attention, false, cuda_gemv_weights};

static void cg_free(struct cu_graph *cg) {
    if (!cg) return;
    live_remove(cg);
    cudaSetDevice(cg->dev);
    if (cg->cd) cudaStreamSynchronize((cudaStream_t)cg->cd->stream);
    for (int i = 0; i < cg->n_leaves; i++) {
        struct leaf *l = &cg->leaves[i];
        if (l->owned) toy_cu_free(cg->dev, l->d);
        else if (l->d && !l->bound) toy_cu_resident_release(cg->dev, l->host, l->size);
    }
    toy_cu_free(cg->dev, cg->dbuf);
    toy_cu_free(cg->dev, cg->work);
    toy_cu_free(cg->dev, cg->err);
    toy_cu_free(cg->dev, cg->rope);
    if (cg->stage) cudaFreeHost(cg->stage);
    if (cg->exec) cudaGraphExecDestroy(cg->exec);
    for (int i = 0; i < cg->n_pinned; i++) cudaHostUnregister((void *)cg->pinned[i].lo);
    free(cg->pinned);
    cudaGetLastError();
    free(cg->leaves);
    free(cg->cn);
    free(cg->down);
    toy_ptrmap_free(&cg->lmap);
    free(cg);
}

void toy_cuda_graph_free(struct toy_graph *g) {
    cg_free(g->dev_state);
    g->dev_state = NULL;
    g->dev_free = NULL;
}

int toy_cuda_graph_grad_device(const struct toy_tensor *grad) {
    int dev = -1;
    pthread_mutex_lock(&live_lock);
    for (struct cu_graph *cg = live; cg && dev < 0; cg = cg->next) {
        int li = toy_ptrmap_get(&cg->lmap, grad);
        if (li >= 0 && cg->leaves[li].kind == L_GRAD) dev = cg->dev;
    }
    pthread_mutex_unlock(&live_lock);
    return dev;
}

/* ---- read-only memory (a mmapped GGUF cannot change under us) -------------------------------- */

static int read_only_ranges(struct range **out) {
    *out = NULL;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    int n = 0, cap = 0;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) != 3 || perm[1] == 'w') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct range *r = realloc(*out, (size_t)cap * sizeof *r);
            if (!r) break;
            *out = r;
        }
        (*out)[n++] = (struct range){lo, hi};
    }
    fclose(f);
    return n;
}

static bool in_ranges(const struct range *r, int n, const void *p, size_t size) {
    uintptr_t a = (uintptr_t)p;
    for (int i = 0; i < n; i++)
        if (a >= r[i].lo && a + size <= r[i].hi) return true;
    return false;
}

/* Page-locks the host memory of the large per-run copies (parameters,
 * gradients, big inputs) so they move by DMA at full bus speed instead of
 * through the driver's pageable staging. Best effort: a range someone else
 * registered, or a refusal, leaves it pageable (still correct).
 * TOY_CUDA_PIN=0 turns it off. */
static int cmp_range(const void *a, const void *b) {
    uintptr_t x = ((const struct range *)a)->lo, y = ((const struct range *)b)->lo;
    return x < y ? -1 : x > y;
}

static void pin_large(struct cu_graph *cg) {
    const char *e = getenv("TOY_CUDA_PIN");
    if (e && !strcmp(e, "0")) return;
    uintptr_t page = 4096;
    struct range *r = malloc((size_t)(cg->n_leaves ? cg->n_leaves : 1) * sizeof *r);
    if (!r) return;
    int n = 0;
    for (int i = 0; i < cg->n_leaves; i++) {
        struct leaf *l = &cg->leaves[i];
        if ((l->kind != L_UPLOAD && l->kind != L_GRAD) || l->bound || l->size <= STAGE_MAX) continue;
        uintptr_t lo = (uintptr_t)l->t->data / page * page, hi = ((uintptr_t)l->t->data + l->size + page - 1) / page * page;
        r[n++] = (struct range){lo, hi};
    }
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    int m = 0; /* merge overlapping or touching ranges */
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    cg->pinned = malloc((size_t)(m ? m : 1) * sizeof *cg->pinned);
    if (!cg->pinned) {
        free(r);
        return;
    }
    for (int i = 0; i < m; i++) {
        if (cudaHostRegister((void *)r[i].lo, r[i].hi - r[i].lo, cudaHostRegisterDefault) == cudaSuccess)
            cg->pinned[cg->n_pinned++] = r[i];
        else
            cudaGetLastError(); /* already registered by another graph, or refused: stays pageable */
    }
    free(r);
}

/* ---- building the device mirror of a plan ------------------------------------------------------ */

#if defined(TOY_CUDA_EMU) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
/* The emulator under ASan: while a node's kernels run, the plan's buffer is
 * poisoned except the node's result and the tensors its sources live in, so
 * a kernel that reaches past its tensors into a neighbour's bytes is
 * reported (a GPU would read or clobber the neighbour silently). */
static void arena_open(struct cu_graph *cg, struct toy_graph *g, const struct toy_tensor *t) {
    if (t && toy_is_view_op(t->op)) t = t->view_src;
    if (t && accum_node(t) && !writes_grad_node(t)) t = toy_storage_of((struct toy_tensor *)t); /* a folded add */
    if (!t || t->op == TOY_OP_NONE || t->op == TOY_OP_KV_STORE || writes_grad_node(t)) return;
    int j = toy_ptrmap_get(&g->index, t);
    if (j >= 0 && g->offsets[j] != SIZE_MAX)
        ASAN_UNPOISON_MEMORY_REGION(cg->dbuf + g->offsets[j], toy_nbytes(t) + t->aux_bytes);
}
/* the sources of x, and of the nodes x leads in turn, when node t does x's work */
static void arena_open_led(struct cu_graph *cg, struct toy_graph *g, const struct toy_tensor *t,
                           const struct toy_tensor *x) {
    if (!x || x->led_by != t) return;
    for (int s = 0; s < TOY_MAX_SRC; s++) {
        arena_open(cg, g, x->src[s]);
        arena_open_led(cg, g, t, x->src[s]);
    }
}
static void arena_guard(struct cu_graph *cg, struct toy_graph *g, const struct toy_tensor *t) {
    if (!cg->dbuf) return;
    ASAN_POISON_MEMORY_REGION(cg->dbuf, g->plan.peak_bytes);
    arena_open(cg, g, t);
    for (int s = 0; s < TOY_MAX_SRC; s++) {
        arena_open(cg, g, t->src[s]);
        arena_open_led(cg, g, t, t->src[s]);
    }
    for (int s = 0; s < 2; s++) arena_open(cg, g, t->siblings[s]);
}
static void arena_unguard(struct cu_graph *cg, struct toy_graph *g) {
    if (cg->dbuf) ASAN_UNPOISON_MEMORY_REGION(cg->dbuf, g->plan.peak_bytes);
}
#else
static void arena_guard(struct cu_graph *cg, struct toy_graph *g, const struct toy_tensor *t) {
    (void)cg, (void)g, (void)t;
}
static void arena_unguard(struct cu_graph *cg, struct toy_graph *g) { (void)cg, (void)g; }
#endif

static char *dev_ptr(struct cu_graph *cg, struct toy_graph *g, const struct toy_tensor *t) {
    if (t->op == TOY_OP_NONE) {
        int li = toy_ptrmap_get(&cg->lmap, t);
        return li >= 0 ? cg->leaves[li].d : NULL;
    }
    if (toy_is_view_op(t->op)) {
        char *b = dev_ptr(cg, g, t->view_src);
        return b ? b + t->view_offs : NULL;
    }
    if (accum_node(t)) return dev_ptr(cg, g, t->src[TOY_MAX_SRC - 1]);
    if (t->op == TOY_OP_KV_STORE) return dev_ptr(cg, g, t->src[0]);
    int j = toy_ptrmap_get(&g->index, t);
    if (j < 0 || g->offsets[j] == SIZE_MAX) return NULL;
    return cg->dbuf + g->offsets[j];
}

static void describe(struct toy_cu_tensor *d, const struct toy_tensor *t, char *ptr) {
    d->data = ptr;
    d->type = (int32_t)t->type;
    for (int i = 0; i < 4; i++) {
        d->ne[i] = t->ne[i];
        d->nb[i] = (int64_t)t->nb[i];
    }
}

/* The inverse frequencies of a ROPE node (as the CPU computes them, from
 * the Hugging Face definitions of linear, llama3 and YaRN scaling). */
static void rope_freqs(const struct toy_tensor *dst, int n_dims, double *inv_freq) {
    float base = toy_param_f32(dst, P_RP_BASE), factor = toy_param_f32(dst, P_RP_FACTOR);
    int scaling = dst->op_params[P_RP_SCALING];
    int orig = dst->op_params[P_RP_ORIG];
    for (int i = 0; i < n_dims / 2; i++) {
        double f = 1.0 / pow((double)base, (double)(2 * i) / n_dims);
        if (scaling == TOY_ROPE_SCALING_LINEAR) {
            f /= factor;
        } else if (scaling == TOY_ROPE_SCALING_LLAMA3) {
            double low = toy_param_f32(dst, P_RP_LOW), high = toy_param_f32(dst, P_RP_HIGH);
            double low_wl = orig / low, high_wl = orig / high, wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f /= factor;
            } else if (wl >= high_wl) {
                double smooth = (orig / wl - low) / (high - low);
                f = (1 - smooth) * f / factor + smooth * f;
            }
        } else if (scaling == TOY_ROPE_SCALING_YARN) {
            double bf = toy_param_f32(dst, P_RP_BFAST), bs = toy_param_f32(dst, P_RP_BSLOW);
            double lo = floor(n_dims * log(orig / (bf * 2 * M_PI)) / (2 * log(base)));
            double hi = ceil(n_dims * log(orig / (bs * 2 * M_PI)) / (2 * log(base)));
            if (lo < 0) lo = 0;
            if (hi > n_dims - 1) hi = n_dims - 1;
            if (hi == lo) hi += 0.001;
            double ramp = (i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double extrap = 1 - ramp;
            f = (f / factor) * (1 - extrap) + f * extrap;
        }
        inv_freq[i] = f;
    }
}

static enum toy_status add_leaf(struct cu_graph *cg, struct toy_tensor *t, int kind, int *cap) {
    int li = toy_ptrmap_get(&cg->lmap, t);
    if (li >= 0) {
        if (kind == L_KV || kind == L_GRAD) cg->leaves[li].kind = kind; /* written beats read */
        return TOY_OK;
    }
    if (cg->n_leaves == *cap) {
        *cap = *cap ? 2 * *cap : 128;
        struct leaf *nl = realloc(cg->leaves, (size_t)*cap * sizeof *nl);
        if (!nl) return toy_error(TOY_ERR_NOMEM, "cuda graph: leaf table");
        cg->leaves = nl;
    }
    cg->leaves[cg->n_leaves] = (struct leaf){t, NULL, toy_nbytes(t), kind, false, false, t->data};
    toy_ptrmap_put(&cg->lmap, t, cg->n_leaves++);
    return TOY_OK;
}

static enum toy_status prepare(struct toy_graph *g, int dev, struct cu_graph **out) {
    enum toy_status st;
    struct cu_graph *cg = calloc(1, sizeof *cg);
    if (!cg) return toy_error(TOY_ERR_NOMEM, "cuda graph");
    cg->dev = dev;
    cg->plan_gen = g->plan_gen;
    cg->n_nodes = g->n_nodes;
    cg->bound_gen = toy_cu_bound_gen(); /* before the lookups: a change after them is seen at the next run */
    if ((st = toy_cu_device_get(dev, &cg->cd))) goto fail;
    /* leaves, and which of them the graph writes */
    int cap = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        for (int s = 0; s < TOY_MAX_SRC + 1; s++) {
            struct toy_tensor *x = s < TOY_MAX_SRC ? t->src[s] : t->view_src;
            if (!x || x->op != TOY_OP_NONE) continue;
            int kind = L_UPLOAD;
            if (t->op == TOY_OP_KV_STORE && s == 0) kind = L_KV;
            else if ((writes_grad_node(t) && s == TOY_MAX_SRC - 1) || (x->flags & TOY_FLAG_GRAD)) kind = L_GRAD;
            if ((st = add_leaf(cg, x, kind, &cap))) goto fail;
        }
    }
    struct range *ro = NULL;
    int n_ro = read_only_ranges(&ro);
    size_t stage_need = 64; /* the error word */
    for (int i = 0; i < cg->n_leaves; i++) {
        struct leaf *l = &cg->leaves[i];
        struct toy_tensor *t = l->t;
        void *bd;
        if ((l->kind == L_UPLOAD || l->kind == L_GRAD) && toy_cu_bound_find(dev, t->data, l->size, &bd)) {
            l->d = bd; /* the device-resident optimizer's copy: the truth */
            l->bound = true;
            continue;
        }
        if (l->kind == L_UPLOAD && !(t->flags & (TOY_FLAG_PARAM | TOY_FLAG_INPUT)) &&
            ((t->type != TOY_F32 && t->type != TOY_I32) || in_ranges(ro, n_ro, t->data, l->size)))
            l->kind = L_RESIDENT;
        if (l->kind == L_RESIDENT || l->kind == L_KV) {
            /* one device copy per host buffer, shared by every graph on the
             * device: the prefill and the decode graph of a generation write
             * and read the same KV cache */
            void *d;
            if ((st = toy_cu_resident_acquire(dev, t->data, l->size, &d))) {
                free(ro);
                goto fail;
            }
            l->d = d;
        } else {
            void *d;
            if ((st = toy_cu_alloc(dev, l->size, &d))) {
                free(ro);
                goto fail;
            }
            l->d = d;
            l->owned = true;
            if ((l->kind == L_UPLOAD || l->kind == L_GRAD) && l->size <= STAGE_MAX)
                stage_need += (l->kind == L_GRAD ? 2 : 1) * ((l->size + 63) / 64 * 64); /* grads: up and down */
        }
    }
    free(ro);
    /* the planned results */
    if (g->plan.peak_bytes && (st = toy_cu_alloc(dev, g->plan.peak_bytes, (void **)&cg->dbuf))) goto fail;
    if ((st = toy_cu_alloc(dev, 64, (void **)&cg->err))) goto fail;
    /* node descriptors, rope tables, work size */
    cg->cn = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *cg->cn);
    if (!cg->cn) {
        st = toy_error(TOY_ERR_NOMEM, "cuda graph: node table");
        goto fail;
    }
    size_t rope_n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i]->op == TOY_OP_ROPE) rope_n += (size_t)g->nodes[i]->op_params[P_RP_NDIMS] / 2 + 1;
    double *rope_h = rope_n ? malloc(rope_n * sizeof *rope_h) : NULL;
    if (rope_n && (!rope_h || (st = toy_cu_alloc(dev, rope_n * sizeof(double), (void **)&cg->rope)))) {
        free(rope_h);
        if (!st) st = toy_error(TOY_ERR_NOMEM, "cuda graph: rope table");
        goto fail;
    }
    size_t rope_at = 0, ws = 0, ws_lean = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        struct toy_cu_node *c = &cg->cn[i];
        if (toy_is_view_op(t->op) || (t->op == TOY_OP_MATMUL && t->op_params[P_MM_LED])) continue;
        c->op = (int32_t)t->op;
        c->index = i;
        memcpy(c->op_params, t->op_params, sizeof c->op_params);
        char *d = dev_ptr(cg, g, t);
        if (!d && toy_nbytes(t)) {
            free(rope_h);
            st = toy_error(TOY_ERR_STATE, "cuda graph: node %d (%s '%s') has no device memory", i, toy_op_name(t->op),
                           t->name);
            goto fail;
        }
        describe(&c->dst, t, d);
        c->dst_nbytes = toy_nbytes(t);
        for (int s = 0; s < TOY_MAX_SRC; s++) {
            if (!t->src[s]) continue;
            char *sp = dev_ptr(cg, g, t->src[s]);
            if (!sp && toy_nbytes(t->src[s])) {
                free(rope_h);
                st = toy_error(TOY_ERR_STATE, "cuda graph: source %d of node %d (%s) is outside the graph", s, i,
                               toy_op_name(t->op));
                goto fail;
            }
            describe(&c->src[s], t->src[s], sp);
            c->has_src[s] = true;
        }
        if (t->op == TOY_OP_ATTENTION && t->op_params[P_AT_FUSED]) { /* the nodes it does the work of */
            const struct toy_tensor *led[4] = {t->src[0], t->src[1], t->src[1]->src[1], t->src[2]};
            for (int k = 0; k < 4; k++) {
                int j = toy_ptrmap_get(&g->index, led[k]);
                c->led[k] = j >= 0 ? &cg->cn[j] : NULL; /* NULL: an error when it runs */
            }
        }
        for (int s = 0; s < 2 && t->op == TOY_OP_MATMUL && t->siblings[s]; s++, c->n_sib++) {
            const struct toy_tensor *sb = t->siblings[s];
            describe(&c->sib_dst[s], sb, dev_ptr(cg, g, sb));
            describe(&c->sib_b[s], sb->src[1], dev_ptr(cg, g, sb->src[1]));
            if (sb->src[4]) describe(&c->sib_bias[s], sb->src[4], dev_ptr(cg, g, sb->src[4]));
        }
        c->stream = cg->cd->stream;
        c->cublas = cg->cd->cublas;
        c->err = cg->err;
        c->n_past = -1;
        c->math = cg->cd->math;
        /* products marked bf16 (mixed precision: toy_linear_bf16 and its
         * gradients, attention under toy_attn_params.bf16) run in BF16 math
         * whatever the device's, as on the CPU */
        if ((t->op == TOY_OP_MATMUL && t->op_params[P_MM_BF16]) ||
            ((t->op == TOY_OP_ATTENTION || t->op == TOY_OP_ATTENTION_BACK) && t->op_params[P_AT_BF16]))
            c->math = TOY_CU_MATH_BF16;
        if (t->op == TOY_OP_VIEW_BACK) {
            const struct toy_tensor *v = t->src[1];
            c->view_off = (int64_t)toy_view_offset(v);
        }
        if (t->op == TOY_OP_ROPE) {
            int nd = t->op_params[P_RP_NDIMS];
            rope_freqs(t, nd, rope_h + rope_at);
            c->rope_freq = cg->rope + rope_at;
            rope_at += (size_t)nd / 2 + 1;
        }
        size_t w = toy_cu_work_size(c, false), wl = toy_cu_work_size(c, true);
        if (w > ws) ws = w;
        if (wl > ws_lean) ws_lean = wl;
    }
    if (rope_n) {
        st = toy_cu_check(cudaMemcpy(cg->rope, rope_h, rope_n * sizeof(double), cudaMemcpyHostToDevice), "rope table");
        free(rope_h);
        if (st) goto fail;
    }
    if (ws && (st = toy_cu_alloc(dev, ws, (void **)&cg->work)) == TOY_ERR_NOMEM && ws_lean < ws) {
        /* what only speeds a node up (the attention backward's stored dS)
         * is not worth failing for: those nodes see the smaller work and
         * do without */
        ws = ws_lean;
        st = ws ? toy_cu_alloc(dev, ws, (void **)&cg->work) : TOY_OK;
    }
    if (st) goto fail;
    cg->work_size = ws;
    for (int i = 0; i < g->n_nodes; i++) {
        cg->cn[i].work = cg->work;
        cg->cn[i].work_size = ws;
    }
    /* pinned staging for the small per-run copies (inputs, logits, loss);
     * without it (pinning refused) every copy goes direct */
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (t->op == TOY_OP_KV_STORE) {
            size_t n = (size_t)t->src[1]->ne[2] * t->src[0]->nb[2];
            if (n <= STAGE_MAX) stage_need += (size_t)t->src[0]->ne[3] * ((n + 63) / 64 * 64);
        } else if ((t->flags & (TOY_FLAG_OUTPUT | TOY_FLAG_LOSS)) || i == g->n_nodes - 1) {
            size_t n = toy_nbytes(t) + (toy_is_view_op(t->op) ? 0 : t->aux_bytes);
            if (n <= STAGE_MAX) stage_need += (n + 63) / 64 * 64;
        }
    }
    pin_large(cg);
    /* A graph without a backward pass (inference: prefill, decode) has
     * kernels whose arguments never change between runs (n_past is read on
     * the device), so from the second run on they replay as one captured
     * CUDA graph instead of hundreds of launches. TOY_CUDA_GRAPH=0 turns
     * it off; any capture failure falls back to plain launches. */
    const char *ge = getenv("TOY_CUDA_GRAPH");
    cg->capturable = !(ge && !strcmp(ge, "0"));
    for (int i = 0; i < g->n_nodes && cg->capturable; i++)
        if (writes_grad_node(g->nodes[i]) ||
            (g->nodes[i]->op >= TOY_OP_GET_ROWS_BACK && g->nodes[i]->op != TOY_OP_KV_STORE)) /* a backward pass */
            cg->capturable = false;
    if (cudaMallocHost((void **)&cg->stage, stage_need) == cudaSuccess) cg->stage_size = stage_need;
    else {
        cudaGetLastError();
        cg->stage = NULL;
    }
    live_add(cg);
    *out = cg;
    return TOY_OK;
fail:
    cg_free(cg);
    return st;
}

/* ---- one run ------------------------------------------------------------------------------------------ */

static enum toy_status h2d(struct cu_graph *cg, void *d, const void *h, size_t n, size_t *stage_at) {
    cudaStream_t s = (cudaStream_t)cg->cd->stream;
    if (cg->stage && n <= STAGE_MAX && *stage_at + n <= cg->stage_size) {
        memcpy(cg->stage + *stage_at, h, n);
        enum toy_status st = toy_cu_check(cudaMemcpyAsync(d, cg->stage + *stage_at, n, cudaMemcpyHostToDevice, s),
                                          "upload");
        *stage_at += (n + 63) / 64 * 64;
        return st;
    }
    return toy_cu_check(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, s), "upload");
}

static enum toy_status d2h(struct cu_graph *cg, void *h, const void *d, size_t n, size_t *stage_at) {
    cudaStream_t s = (cudaStream_t)cg->cd->stream;
    if (cg->stage && n <= STAGE_MAX && *stage_at + n <= cg->stage_size) {
        if (cg->n_down == cg->cap_down) {
            int nc = cg->cap_down ? 2 * cg->cap_down : 16;
            struct staged *nd = realloc(cg->down, (size_t)nc * sizeof *nd);
            if (!nd) return toy_error(TOY_ERR_NOMEM, "cuda graph: download list");
            cg->down = nd;
            cg->cap_down = nc;
        }
        cg->down[cg->n_down++] = (struct staged){h, *stage_at, n};
        enum toy_status st = toy_cu_check(cudaMemcpyAsync(cg->stage + *stage_at, d, n, cudaMemcpyDeviceToHost, s),
                                          "download");
        *stage_at += (n + 63) / 64 * 64;
        return st;
    }
    return toy_cu_check(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, s), "download");
}

/* host data pointers of the nodes that alias (as toy_graph_compute sets them on the CPU) */
static void host_aliases(struct toy_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (toy_is_view_op(t->op)) t->data = (char *)t->view_src->data + t->view_offs;
        else if (accum_node(t)) t->data = t->src[TOY_MAX_SRC - 1]->data;
        else if (t->op == TOY_OP_KV_STORE) t->data = t->src[0]->data;
    }
}

/* Records the node kernels into cg->exec. A node that reports an error
 * while recording is an error of the run (as it would be uncaptured); a
 * capture the runtime refuses leaves cg->exec NULL and turns capturing off
 * for this graph. */
static enum toy_status capture(struct cu_graph *cg, struct toy_graph *g, int device) {
    cudaStream_t s = (cudaStream_t)cg->cd->stream;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        cg->capturable = false;
        return TOY_OK;
    }
    char msg[256];
    int rc = 0, bad = -1;
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        if (no_kernel(g->nodes[i])) continue;
        msg[0] = 0;
        rc = toy_cu_run(&cg->cn[i], msg, sizeof msg);
        if (rc) bad = i;
    }
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(s, &graph);
    if (!rc && e == cudaSuccess && graph) {
        if (cudaGraphInstantiate(&cg->exec, graph, 0) != cudaSuccess) cg->exec = NULL;
    }
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    if (!cg->exec) cg->capturable = false;
    if (rc && bad >= 0) {
        struct toy_tensor *t = g->nodes[bad];
        return toy_error((enum toy_status)rc, "cuda:%d: node %d (%s '%s'): %s", device, bad, toy_op_name(t->op),
                         t->name, msg);
    }
    return TOY_OK;
}

/* TOY_CUDA_PROFILE=N: after a run timed node by node (each node's launch
 * and kernels, synchronised: no CUDA graph replay), the time per op kind
 * and the N slowest nodes, on stderr */
static void profile_print(const struct toy_graph *g, const double *us, int top, int device) {
    double by_op[TOY_OP_COUNT] = {0}, total = 0;
    int count[TOY_OP_COUNT] = {0};
    for (int i = 0; i < g->n_nodes; i++) {
        by_op[g->nodes[i]->op] += us[i];
        count[g->nodes[i]->op] += us[i] > 0;
        total += us[i];
    }
    fprintf(stderr, "cuda:%d profile: %d nodes, %.3f ms\n", device, g->n_nodes, total * 1e-3);
    for (;;) { /* op kinds, slowest first */
        int best = -1;
        for (int o = 0; o < TOY_OP_COUNT; o++)
            if (by_op[o] > 0 && (best < 0 || by_op[o] > by_op[best])) best = o;
        if (best < 0 || by_op[best] < total * 0.005) break;
        fprintf(stderr, "  %-22s %9.3f ms %5.1f%%  %5d nodes\n", toy_op_name((enum toy_op)best), by_op[best] * 1e-3,
                100 * by_op[best] / total, count[best]);
        by_op[best] = 0;
    }
    bool *shown = calloc((size_t)g->n_nodes, 1);
    for (int k = 0; shown && k < top; k++) {
        int best = -1;
        for (int i = 0; i < g->n_nodes; i++)
            if (!shown[i] && us[i] > 0 && (best < 0 || us[i] > us[best])) best = i;
        if (best < 0) break;
        shown[best] = true;
        const struct toy_tensor *t = g->nodes[best];
        fprintf(stderr, "  #%-5d %-18s %9.3f ms  [%lld %lld %lld %lld] %s%s", best, toy_op_name(t->op), us[best] * 1e-3,
                (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3], t->name,
                t->src[0] ? " <-" : "");
        for (int j = 0; j < 3 && t->src[j]; j++)
            fprintf(stderr, " [%lld %lld %lld %lld]%s", (long long)t->src[j]->ne[0], (long long)t->src[j]->ne[1],
                    (long long)t->src[j]->ne[2], (long long)t->src[j]->ne[3], toy_dtype_name(t->src[j]->type));
        fputc('\n', stderr);
    }
    free(shown);
}

enum toy_status toy_cuda_graph_compute(struct toy_graph *g, int device) {
    enum toy_status st;
    struct cu_graph *cg = g->dev_state;
    bool moved = false; /* a resident leaf or KV cache now points elsewhere: copy again */
    for (int i = 0; cg && i < cg->n_leaves && !moved; i++) /* (uploaded leaves are read where they are now) */
        moved = !cg->leaves[i].owned && cg->leaves[i].host != cg->leaves[i].t->data;
    if (cg && (moved || cg->dev != device || cg->plan_gen != g->plan_gen || cg->n_nodes != g->n_nodes ||
               cg->bound_gen != toy_cu_bound_gen())) {
        toy_cuda_graph_free(g);
        cg = NULL;
    }
    if (!cg) {
        if ((st = prepare(g, device, &cg))) return st;
        g->dev_state = cg;
        g->dev_free = toy_cuda_graph_free;
    }
    if ((st = toy_cu_check(cudaSetDevice(device), "cudaSetDevice"))) return st;
    host_aliases(g);
    cudaStream_t s = (cudaStream_t)cg->cd->stream;
    /* host-side checks of the run-time scalars (n_past), before any work */
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        struct toy_cu_node *c = &cg->cn[i];
        if ((t->op == TOY_OP_KV_STORE && t->op_params[P_KV_ROWS]) || (t->op == TOY_OP_ATTENTION && t->op_params[P_AT_ROWS]))
            return toy_error(TOY_ERR_UNSUPPORTED, "%s '%s': rows of many sequences (toy_kv_store_rows, "
                             "toy_attention_rows) run on the CPU only", toy_op_name(t->op), t->name);
        if (t->op == TOY_OP_KV_STORE) {
            int64_t np = *(const int32_t *)t->src[2]->data;
            if (np < 0 || np + t->src[1]->ne[2] > t->src[0]->ne[2])
                return toy_error(TOY_ERR_RANGE, "%s '%s': an index is out of range (ids or targets)",
                                 toy_op_name(t->op), t->name);
            c->n_past = np;
        } else if (t->op == TOY_OP_ATTENTION && t->op_params[P_AT_DYNKV]) {
            c->n_past = *(const int32_t *)t->src[3]->data;
        }
    }
    size_t stage_at = 64;
    for (int i = 0; i < cg->n_leaves; i++) {
        struct leaf *l = &cg->leaves[i];
        if ((l->kind == L_UPLOAD || l->kind == L_GRAD) && !l->bound)
            if ((st = h2d(cg, l->d, l->t->data, l->size, &stage_at))) return st;
    }
    if ((st = toy_cu_check(cudaMemsetAsync(cg->err, 0, sizeof(int32_t), s), "cudaMemsetAsync"))) return st;
    char msg[256];
    /* per-node synchronisation: with timing on (per-op times, as on the CPU)
     * or TOY_CUDA_SYNC=1, which names the node whose kernel failed */
    static int sync_env = -1, prof_top = -1;
    if (sync_env < 0) {
        const char *e = getenv("TOY_CUDA_SYNC");
        sync_env = e && *e && strcmp(e, "0");
        e = getenv("TOY_CUDA_PROFILE");
        prof_top = e && *e ? atoi(e) : 0;
    }
    bool per_node = g->timing || sync_env || prof_top > 0;
    double *prof = NULL; /* TOY_CUDA_PROFILE=N: every node's time, the N slowest printed */
    if (prof_top > 0 && !(prof = calloc((size_t)g->n_nodes, sizeof *prof)))
        return toy_error(TOY_ERR_NOMEM, "cuda graph: profile");
    bool launched = false;
    if (cg->capturable && !per_node && cg->runs > 0) {
        if (!cg->exec && (st = capture(cg, g, device))) return st;
        if (cg->exec) {
            if ((st = toy_cu_check(cudaGraphLaunch(cg->exec, s), "cudaGraphLaunch"))) return st;
            launched = true;
        }
    }
    cg->runs++;
    for (int i = 0; i < g->n_nodes && !launched; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (no_kernel(t)) continue;
        msg[0] = 0;
        struct timespec t0, t1;
        if (per_node) clock_gettime(CLOCK_MONOTONIC, &t0);
        arena_guard(cg, g, t);
        int rc = toy_cu_run(&cg->cn[i], msg, sizeof msg);
        arena_unguard(cg, g);
        if (!rc && per_node) {
            cudaError_t e = cudaStreamSynchronize(s);
            if (e != cudaSuccess) {
                snprintf(msg, sizeof msg, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
                rc = e == cudaErrorMemoryAllocation ? TOY_ERR_NOMEM : TOY_ERR_BACKEND;
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double us = (t1.tv_sec - t0.tv_sec) * 1e6 + (t1.tv_nsec - t0.tv_nsec) * 1e-3;
            if (g->timing) g->op_us[t->op] += us;
            if (prof) prof[i] = us;
        }
        if (rc) {
            free(prof);
            cudaStreamSynchronize(s);
            return toy_error((enum toy_status)rc, "cuda:%d: node %d (%s '%s'): %s", device, i, toy_op_name(t->op),
                             t->name, msg);
        }
    }
    if (prof) {
        profile_print(g, prof, prof_top, device);
        free(prof);
    }
    /* results back to the host */
    cg->n_down = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (!((t->flags & (TOY_FLAG_OUTPUT | TOY_FLAG_LOSS)) || i == g->n_nodes - 1)) continue;
        if (writes_grad_node(t) || t->op == TOY_OP_KV_STORE) continue; /* their leaf comes back below */
        size_t n = toy_nbytes(t) + (toy_is_view_op(t->op) ? 0 : t->aux_bytes);
        if (n && (st = d2h(cg, t->data, dev_ptr(cg, g, t), n, &stage_at))) return st;
    }
    for (int i = 0; i < cg->n_leaves; i++) {
        struct leaf *l = &cg->leaves[i];
        if (l->kind == L_GRAD && !l->bound && (st = d2h(cg, l->t->data, l->d, l->size, &stage_at))) return st;
    }
    for (int i = 0; i < g->n_nodes; i++) { /* the rows each KV_STORE wrote, per batch row */
        struct toy_tensor *t = g->nodes[i];
        if (t->op != TOY_OP_KV_STORE) continue;
        const struct toy_tensor *cache = t->src[0];
        int li = toy_ptrmap_get(&cg->lmap, cache);
        size_t row = cache->nb[2], off0 = (size_t)cg->cn[i].n_past * row, n = (size_t)t->src[1]->ne[2] * row;
        for (int64_t b = 0; b < cache->ne[3]; b++) {
            size_t off = (size_t)b * cache->nb[3] + off0;
            if ((st = d2h(cg, (char *)cache->data + off, cg->leaves[li].d + off, n, &stage_at))) return st;
        }
    }
    int32_t *errw = NULL;
    int32_t err_direct = 0;
    if (cg->stage) {
        errw = (int32_t *)cg->stage;
        if ((st = toy_cu_check(cudaMemcpyAsync(errw, cg->err, 4, cudaMemcpyDeviceToHost, s), "download"))) return st;
    } else {
        errw = &err_direct;
        if ((st = toy_cu_check(cudaMemcpyAsync(errw, cg->err, 4, cudaMemcpyDeviceToHost, s), "download"))) return st;
    }
    if ((st = toy_cu_check(cudaStreamSynchronize(s), "running the graph"))) return st;
    for (int i = 0; i < cg->n_down; i++) memcpy(cg->down[i].host, cg->stage + cg->down[i].off, cg->down[i].size);
    if (*errw > 0 && *errw <= g->n_nodes) {
        struct toy_tensor *t = g->nodes[*errw - 1];
        return toy_error(TOY_ERR_RANGE, "%s '%s': an index is out of range (ids or targets)", toy_op_name(t->op),
                         t->name);
    }
    /* node callbacks (gradient all-reduce as the backward pass finishes a
     * gradient): every node has run and its host results are final, so
     * they are called now, in node order, after the whole graph */
    if (g->on_node)
        for (int i = 0; i < g->n_nodes; i++)
            if (!toy_is_view_op(g->nodes[i]->op)) g->on_node(g->on_node_ud, i);
    return TOY_OK;
}
#endif
