/* graph.c: graph construction, the liveness memory planner and execution.
 *
 * Invariants:
 *  - nodes are in a valid execution order (every source before its reader);
 *  - a view (VIEW/RESHAPE/PERMUTE) owns no memory: its data is its base's
 *    data plus an offset, resolved when it runs;
 *  - the planner places every other op result (plus its aux bytes) in one
 *    buffer; a result's bytes are freed after the last node that reads it or
 *    any view of it; OUTPUT/LOSS results and the persistent gradients of
 *    parameters are never freed;
 *  - after the first toy_graph_compute nothing is allocated.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/backend-impl.h"
#include "toy/trace.h"
#include "toy/file.h"
#include "core/internal.h"

#define ALIGN 64

/* ---- pointer map ---------------------------------------------------------- */

static size_t hash_ptr(const void *p) {
    uintptr_t x = (uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

int toy_ptrmap_get(const struct toy_ptrmap *m, const void *k) {
    if (!m->cap) return -1;
    for (size_t i = hash_ptr(k) & (size_t)(m->cap - 1);; i = (i + 1) & (size_t)(m->cap - 1)) {
        if (!m->keys[i]) return -1;
        if (m->keys[i] == k) return m->vals[i];
    }
}

void toy_ptrmap_put(struct toy_ptrmap *m, const void *k, int v) {
    if (2 * (m->n + 1) > m->cap) {
        struct toy_ptrmap old = *m;
        m->cap = old.cap ? old.cap * 2 : 256;
        m->keys = calloc((size_t)m->cap, sizeof *m->keys);
        m->vals = calloc((size_t)m->cap, sizeof *m->vals);
        if (!m->keys || !m->vals) TOY_ABORT("out of memory (graph map)");
        m->n = 0;
        for (int i = 0; i < old.cap; i++)
            if (old.keys[i]) toy_ptrmap_put(m, old.keys[i], old.vals[i]);
        free(old.keys);
        free(old.vals);
    }
    size_t i = hash_ptr(k) & (size_t)(m->cap - 1);
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (size_t)(m->cap - 1);
    if (!m->keys[i]) m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
}

void toy_ptrmap_free(struct toy_ptrmap *m) {
    free(m->keys);
    free(m->vals);
    m->keys = NULL;
    m->vals = NULL;
    m->cap = m->n = 0;
}

/* ---- building ---------------------------------------------------------------- */

/* The graph's heap parts are freed with the context through this hook. */
struct toy_graph *toy_graph_new(struct toy_ctx *ctx) {
    struct toy_graph *g = toy_ctx_alloc(ctx, sizeof *g);
    g->ctx = ctx;
    g->buf = &g->own_buf;
    toy_ctx_register_graph(ctx, g);
    return g;
}

void toy_graph_release(struct toy_graph *g) {
    /* the gradient buffers its backward made go with its context: their parameters must not keep pointing there
     * (a second trainer on the same model reused them after they were freed) */
    for (int i = 0; i < g->n_own_grads; i++) g->own_grads[i]->grad = NULL;
    free(g->own_grads);
    free(g->nodes);
    free(g->grads);
    free(g->params);
    free(g->offsets);
    free(g->leaf_grad_list);
    toy_ptrmap_free(&g->index);
    toy_ptrmap_free(&g->visited);
    toy_ptrmap_free(&g->leaf_grads);
    toy_membuf_free(&g->own_buf);
    if (g->dev_free) g->dev_free(g);
}

void toy_graph_add_node(struct toy_graph *g, struct toy_tensor *t) {
    if (g->n_nodes == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 256;
        g->nodes = realloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
        g->grads = realloc(g->grads, (size_t)g->cap * sizeof *g->grads);
        if (!g->nodes || !g->grads) TOY_ABORT("out of memory (graph nodes)");
    }
    g->grads[g->n_nodes] = NULL;
    toy_ptrmap_put(&g->index, t, g->n_nodes);
    toy_ptrmap_put(&g->visited, t, 1);
    t->id = g->n_nodes;
    g->nodes[g->n_nodes++] = t;
    g->planned = false;
}

static void add_param(struct toy_graph *g, struct toy_tensor *t) {
    if (g->n_params == g->cap_params) {
        g->cap_params = g->cap_params ? g->cap_params * 2 : 64;
        g->params = realloc(g->params, (size_t)g->cap_params * sizeof *g->params);
        if (!g->params) TOY_ABORT("out of memory (graph params)");
    }
    g->params[g->n_params++] = t;
}

void toy_graph_build(struct toy_graph *g, struct toy_tensor *out) {
    toy_graph_expand(g, out);
    g->n_forward = g->n_nodes;
}

/* Iterative post-order DFS (graphs of big models are deep). */
void toy_graph_expand(struct toy_graph *g, struct toy_tensor *out) {
    if (toy_ptrmap_get(&g->visited, out) >= 0) return;
    int cap = 1024, sp = 0;
    struct frame { struct toy_tensor *t; int next; } *st = malloc((size_t)cap * sizeof *st);
    if (!st) TOY_ABORT("out of memory (graph build)");
    st[sp++] = (struct frame){out, 0};
    toy_ptrmap_put(&g->visited, out, 0);
    while (sp) {
        struct frame *f = &st[sp - 1];
        struct toy_tensor *t = f->t;
        struct toy_tensor *child = NULL;
        while (f->next < TOY_MAX_SRC + 1 && !child) {
            struct toy_tensor *c = f->next < TOY_MAX_SRC ? t->src[f->next] : t->view_src;
            f->next++;
            if (c && toy_ptrmap_get(&g->visited, c) < 0) child = c;
        }
        if (child) {
            toy_ptrmap_put(&g->visited, child, 0);
            if (sp == cap) {
                cap *= 2;
                st = realloc(st, (size_t)cap * sizeof *st);
                if (!st) TOY_ABORT("out of memory (graph build)");
            }
            st[sp++] = (struct frame){child, 0};
            continue;
        }
        sp--;
        if (t->op == TOY_OP_NONE) {
            if (t->flags & TOY_FLAG_PARAM) add_param(g, t);
        } else {
            toy_graph_add_node(g, t);
        }
    }
    free(st);
}

int toy_graph_n_nodes(const struct toy_graph *g) { return g->n_nodes; }
struct toy_tensor *toy_graph_node(const struct toy_graph *g, int i) {
    TOY_ASSERT(i >= 0 && i < g->n_nodes, "node %d of a graph of %d", i, g->n_nodes);
    return g->nodes[i];
}
int toy_graph_n_params(const struct toy_graph *g) { return g->n_params; }
struct toy_tensor *toy_graph_param(const struct toy_graph *g, int i) {
    TOY_ASSERT(i >= 0 && i < g->n_params, "parameter %d of a graph of %d", i, g->n_params);
    return g->params[i];
}

/* ---- planning ------------------------------------------------------------------- */

void toy_membuf_free(struct toy_membuf *m) {
    if (!m) return;
    free(m->data);
    free(m->work);
    *m = (struct toy_membuf){0};
}

struct freeblk { size_t off, size; };

struct allocator {
    struct freeblk *blk;
    int n, cap;
    size_t top;  /* high-water mark */
};

static size_t alloc_take(struct allocator *a, size_t size) {
    int best = -1;
    for (int i = 0; i < a->n; i++)
        if (a->blk[i].size >= size && (best < 0 || a->blk[i].size < a->blk[best].size)) best = i;
    if (best >= 0) {
        size_t off = a->blk[best].off;
        a->blk[best].off += size;
        a->blk[best].size -= size;
        if (!a->blk[best].size) a->blk[best] = a->blk[--a->n];
        return off;
    }
    /* grow at the top, merging a free block that ends there */
    for (int i = 0; i < a->n; i++)
        if (a->blk[i].off + a->blk[i].size == a->top) {
            size_t off = a->blk[i].off;
            a->top = off + size;
            a->blk[i] = a->blk[--a->n];
            return off;
        }
    size_t off = a->top;
    a->top += size;
    return off;
}

static void alloc_give(struct allocator *a, size_t off, size_t size) {
    /* coalesce with neighbours */
    for (int i = 0; i < a->n;) {
        if (a->blk[i].off + a->blk[i].size == off) {
            off = a->blk[i].off;
            size += a->blk[i].size;
            a->blk[i] = a->blk[--a->n];
        } else if (off + size == a->blk[i].off) {
            size += a->blk[i].size;
            a->blk[i] = a->blk[--a->n];
        } else {
            i++;
        }
    }
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 64;
        a->blk = realloc(a->blk, (size_t)a->cap * sizeof *a->blk);
        if (!a->blk) TOY_ABORT("out of memory (planner)");
    }
    a->blk[a->n++] = (struct freeblk){off, size};
}

/* A node that adds into the bytes of its last source: a parameter's
 * persistent gradient, or a planned result (a residual add folded into a
 * product, graph-fuse.c; a tensor's gradient from its views, autodiff.c). */
static bool writes_grad(const struct toy_tensor *t) {
    return t->op == TOY_OP_ACCUM || (t->op == TOY_OP_MATMUL && t->op_params[P_MM_ACCUM]) ||
           (t->op == TOY_OP_GET_ROWS_BACK && t->op_params[P_GRB_ACCUM]) ||
           (t->op == TOY_OP_VIEW_BACK && t->op_params[P_VB_ACCUM]);
}

static bool node_owns_memory(const struct toy_tensor *t) {
    if (toy_is_view_op(t->op)) return false;
    if (t->op == TOY_OP_ACCUM || t->op == TOY_OP_KV_STORE) return false;
    if (t->op == TOY_OP_MATMUL && t->op_params[P_MM_ACCUM]) return false;
    if (t->op == TOY_OP_GET_ROWS_BACK && t->op_params[P_GRB_ACCUM]) return false;
    if (t->op == TOY_OP_VIEW_BACK && t->op_params[P_VB_ACCUM]) return false;
    return true;
}

static size_t planned_size(const struct toy_tensor *t) {
    size_t n = toy_nbytes(t) + t->aux_bytes;
    return (n + ALIGN - 1) / ALIGN * ALIGN;
}

/* $TOY_FUSE=0 keeps graphs unfused (to compare) */
void toy_graph_set_fusion(struct toy_graph *g, bool on) {
    const char *e = getenv("TOY_FUSE");
    g->want_fusion = on && !(e && !strcmp(e, "0"));
}

enum toy_status toy_graph_plan(struct toy_graph *g, struct toy_membuf *buf,
                               struct toy_plan_info *info) {
    if (buf) g->buf = buf;
    int dev;
    const struct toy_backend_ops *be = toy_backend_for_graph(g, &dev);
    if (g->want_fusion && !g->fused_for && be->fuse) {
        toy_graph_fuse(g, be->fuse);
        g->fused_for = be;
    }
    int n = g->n_nodes;
    int *last = malloc((size_t)(n ? n : 1) * sizeof *last);
    free(g->offsets);
    g->offsets = malloc((size_t)(n ? n : 1) * sizeof *g->offsets);
    if (!last || !g->offsets) {
        free(last);
        return toy_error(TOY_ERR_NOMEM, "graph plan: %d nodes", n);
    }
    for (int i = 0; i < n; i++) {
        struct toy_tensor *t = g->nodes[i];
        last[i] = (t->flags & (TOY_FLAG_OUTPUT | TOY_FLAG_LOSS)) ? INT32_MAX : i;
        g->offsets[i] = SIZE_MAX;
    }
    /* a reader of t (or of a view of t) keeps t's base alive; a node a later
     * one does the work of (led_by) reads when that one runs */
    for (int i = 0; i < n; i++) {
        struct toy_tensor *t = g->nodes[i];
        int at = i, lead = t->led_by ? toy_ptrmap_get(&g->index, t->led_by) : -1;
        if (lead > at) at = lead;
        for (int s = 0; s < TOY_MAX_SRC + 1; s++) {
            struct toy_tensor *src = s < TOY_MAX_SRC ? t->src[s] : t->view_src;
            if (!src) continue;
            struct toy_tensor *base = toy_storage_of(src);
            int j = toy_ptrmap_get(&g->index, base);
            if (j >= 0 && last[j] < at) last[j] = at;
        }
        /* a view flagged as output keeps its base */
        if ((t->flags & (TOY_FLAG_OUTPUT | TOY_FLAG_LOSS)) && t->view_src) {
            int j = toy_ptrmap_get(&g->index, toy_storage_of(t));
            if (j >= 0) last[j] = INT32_MAX;
        }
    }
    /* frees due at each node */
    struct allocator al = {0};
    size_t naive = 0;
    int n_planned = 0;
    int *order = malloc((size_t)(n ? n : 1) * sizeof *order); /* nodes sorted by last use */
    int *cnt = calloc((size_t)n + 1, sizeof *cnt);
    if (!order || !cnt) {
        free(last); free(order); free(cnt);
        return toy_error(TOY_ERR_NOMEM, "graph plan");
    }
    for (int i = 0; i < n; i++)
        if (last[i] != INT32_MAX) cnt[last[i] + 1]++;
    for (int i = 0; i < n; i++) cnt[i + 1] += cnt[i];
    for (int i = 0; i < n; i++)
        if (last[i] != INT32_MAX) order[cnt[last[i]]++] = i;
    /* cnt[i] now marks the end of the nodes whose last use is i */
    int fi = 0;
    for (int i = 0; i < n; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (node_owns_memory(t)) {
            size_t sz = planned_size(t);
            g->offsets[i] = alloc_take(&al, sz);
            naive += sz;
            n_planned++;
        }
        for (; fi < cnt[i]; fi++) {
            int j = order[fi];
            if (g->offsets[j] != SIZE_MAX) alloc_give(&al, g->offsets[j], planned_size(g->nodes[j]));
        }
    }
    free(al.blk);
    free(order);
    free(cnt);
    free(last);
    size_t peak = al.top;
    /* more than the machine holds is refused here with its size, not left to the OOM killer mid-run (with
     * overcommit the allocation itself succeeds and the kill comes as the pages are touched) */
    if (g->buf->size < peak) {
        double ram = toy_ram_bytes();
        if (ram > 0 && (double)peak > ram)
            return toy_error(TOY_ERR_NOMEM, "the computation needs %.1f GiB for its intermediate values, more than "
                             "this machine's %.1f GiB of memory: make it smaller (a smaller batch or context)",
                             (double)peak / (1 << 30), ram / (1 << 30));
        void *p = NULL;
        if (posix_memalign(&p, ALIGN, peak)) return toy_error(TOY_ERR_NOMEM, "graph plan: %zu bytes", peak);
        free(g->buf->data);
        g->buf->data = p;
        g->buf->size = peak;
    }
    for (int i = 0; i < n; i++)
        if (g->offsets[i] != SIZE_MAX) g->nodes[i]->data = (char *)g->buf->data + g->offsets[i];
    g->planned_data = g->buf->data;
    g->plan = (struct toy_plan_info){peak, naive, n_planned};
    g->plan_gen++;
    if (info) *info = g->plan;
    g->planned = true;
    return TOY_OK;
}

/* ---- execution ------------------------------------------------------------------ */

struct task {
    const struct toy_backend_ops *be;
    struct toy_tensor *node;
    void *work;
    size_t work_size;
    struct toy_trace *trace;
};

static void run_node(void *arg, int ith, int nth) {
    struct task *tk = arg;
    double t0 = tk->trace ? toy_trace_now(tk->trace) : 0;
    tk->be->compute(tk->node, ith, nth, tk->work, tk->work_size);
    if (tk->trace) toy_trace_span(tk->trace, toy_op_name(tk->node->op), "op", t0, toy_trace_now(tk->trace), ith);
}

void toy_graph_set_trace(struct toy_graph *g, struct toy_trace *tr) { g->trace = tr; }

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Nodes too small to be worth the pool's synchronisation (a few us): decode
 * steps are hundreds of them on vectors of d_model floats. */
static bool is_small(const struct toy_tensor *t) {
    switch (t->op) {
    case TOY_OP_MATMUL: {
        const struct toy_tensor *a = t->src[0];
        double flops = 2.0 * (double)toy_nelements(t) * (double)(t->op_params[P_MM_TRANS_A] ? a->ne[1] : a->ne[0]);
        return flops < 2e5;
    }
    case TOY_OP_MOE_MATMUL: { /* each (token, slot) pair's product: a decode step's output is only k rows */
        const struct toy_tensor *x = t->src[0], *w = t->src[1], *r = t->src[2];
        return 2.0 * (double)toy_nelements(r) * (double)w->ne[1] * (double)x->ne[0] < 2e5;
    }
    case TOY_OP_MOE_MATMUL_BACK:
    case TOY_OP_MOE_MATMUL_BACK_W:
    case TOY_OP_MOE_ROUTE_BACK:
        return false;
    case TOY_OP_ATTENTION:
    case TOY_OP_ATTENTION_BACK:
    case TOY_OP_CROSS_ENTROPY:
    case TOY_OP_CROSS_ENTROPY_BACK:
    case TOY_OP_GET_ROWS_BACK:
    case TOY_OP_SUM_ALL:
        return false;
    case TOY_OP_KV_STORE: /* its result is the whole cache; the work is the new rows */
        return toy_nelements(t->src[1]) < 16384;
    case TOY_OP_SUM_TO: /* a bias's gradient: one row, the sum of thousands */
        return toy_nelements(t->src[0]) < 16384;
    default:
        return toy_nelements(t) < 16384;
    }
}

static enum toy_status check_leaf(const struct toy_tensor *t) {
    if (t && t->op == TOY_OP_NONE && !t->data)
        return toy_error(TOY_ERR_STATE, "tensor '%s' has no data (set it before running the graph)",
                         toy_label(t));
    return TOY_OK;
}

/* Before node t runs: its data where that is another tensor's, and (check)
 * its leaves' data (see toy_graph_compute). A pointer that already holds
 * its value is not written again: in a graph walk (walk_fn) another
 * thread may be reading it. */
static enum toy_status prepare_node(struct toy_tensor *t, bool check) {
    void *data = toy_is_view_op(t->op)           ? (char *)t->view_src->data + t->view_offs
                 : writes_grad(t)                 ? t->src[TOY_MAX_SRC - 1]->data /* the persistent gradient */
                 : t->op == TOY_OP_KV_STORE       ? t->src[0]->data /* the cache itself */
                                                  : t->data;
    if (t->data != data) t->data = data;
    if (toy_is_view_op(t->op)) return TOY_OK;
    enum toy_status st;
    for (int s = 0; check && s < TOY_MAX_SRC; s++)
        if ((st = check_leaf(t->src[s]))) return st;
    return TOY_OK;
}

enum node_kind {
    NODE_NONE,     /* a view, a node a later one does the work of, a matmul an earlier sibling did */
    NODE_SMALL,    /* run by thread 0 alone */
    NODE_PARALLEL, /* run by every thread */
};

static enum node_kind node_kind(const struct toy_tensor *t) {
    if (toy_is_view_op(t->op) || t->led_by || (t->op == TOY_OP_MATMUL && t->op_params[P_MM_LED])) return NODE_NONE;
    return is_small(t) ? NODE_SMALL : NODE_PARALLEL;
}

static int count_parallel(const struct toy_graph *g) {
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++) n += node_kind(g->nodes[i]) == NODE_PARALLEL;
    return n;
}

/* a kernel's out-of-range flag (flag_error in the CPU backend), cleared and reported */
static enum toy_status flagged(struct toy_tensor *t) {
    t->op_params[TOY_MAX_OP_PARAMS - 1] = 0;
    return toy_error(TOY_ERR_RANGE, "%s '%s': an index is out of range (ids or targets)", toy_op_name(t->op),
                     t->name);
}

/* A graph run as one pool task. Every thread walks the nodes; thread 0
 * prepares each (prepare_node) and runs the small ones alone, and all run
 * the others together, with a pool barrier before each of those and
 * before the first small node after one. A node then costs one barrier
 * (~0.25 us on 2 cores of a Zen 4 VM) instead of a pool run (~0.85 us:
 * waking the workers, then waiting for them), and a decode step has ~150
 * nodes that every thread runs.
 * Every thread takes the same barriers: the node kinds are the same for
 * all, and a stop (a leaf without data, an index out of range) is seen
 * right after a barrier by all alike (a node's flag), or is thread 0's
 * between two: it then names the barrier it takes next, the walk's last,
 * as the one after which the others stop (`stop_at`; a plain flag could
 * be read by a thread just past the barrier before, and that thread would
 * never take the last one). */
struct walk {
    struct toy_graph *g;
    const struct toy_backend_ops *be;
    struct toy_threadpool *tp;
    struct toy_membuf *mb;
    bool known;
    enum toy_status st; /* thread 0's: a leaf without data */
    int bad;            /* the node whose index flag stopped the walk, or -1 */
    atomic_int stop_at; /* the barrier (counted from 1) after which all stop; 0: none */
};

static void walk_fn(void *arg, int ith, int nth) {
    struct walk *w = arg;
    struct toy_graph *g = w->g;
    struct task tk = {w->be, NULL, w->mb->work, w->mb->work_size, g->trace};
    int last = -1; /* the last node all ran, whose flag is read after the next barrier */
    int barriers = 0;
    bool after_parallel = false;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (ith == 0 && (w->st = prepare_node(t, w->known))) break;
        enum node_kind kind = node_kind(t);
        if (kind == NODE_NONE) continue;
        if (kind == NODE_PARALLEL || after_parallel) {
            toy_threadpool_barrier(w->tp, ith);
            if (atomic_load_explicit(&w->stop_at, memory_order_relaxed) == ++barriers) return;
            if (last >= 0 && g->nodes[last]->op_params[TOY_MAX_OP_PARAMS - 1]) {
                if (ith == 0) w->bad = last;
                return;
            }
            last = -1;
        }
        after_parallel = kind == NODE_PARALLEL;
        tk.node = t;
        if (kind == NODE_PARALLEL) {
            run_node(&tk, ith, nth);
            last = i;
        } else if (ith == 0) {
            run_node(&tk, 0, 1);
            if (t->op_params[TOY_MAX_OP_PARAMS - 1]) {
                w->bad = i;
                break;
            }
        }
    }
    if (ith == 0 && (w->st || w->bad >= 0)) atomic_store_explicit(&w->stop_at, barriers + 1, memory_order_relaxed);
    toy_threadpool_barrier(w->tp, ith);
    if (ith == 0 && last >= 0 && !w->st && w->bad < 0 && g->nodes[last]->op_params[TOY_MAX_OP_PARAMS - 1])
        w->bad = last;
}

enum toy_status toy_graph_compute(struct toy_graph *g, struct toy_threadpool *tp) {
    enum toy_status st;
    int device;
    const struct toy_backend_ops *be = toy_backend_for_graph(g, &device);
    be->init();
    if (!g->planned && (st = toy_graph_plan(g, NULL, NULL))) return st;
    if (g->buf->data != g->planned_data) {
        /* a graph sharing this buffer was planned since and moved it to a bigger block: the offsets still hold
         * (a buffer only grows), the addresses do not */
        for (int i = 0; i < g->n_nodes; i++)
            if (g->offsets[i] != SIZE_MAX) g->nodes[i]->data = (char *)g->buf->data + g->offsets[i];
        g->planned_data = g->buf->data;
        g->plan_gen++;
    }
    if (be->graph_compute) { /* a device runs the whole graph */
        for (int i = 0; i < g->n_nodes; i++)
            for (int s = 0; s < TOY_MAX_SRC; s++)
                if ((st = check_leaf(g->nodes[i]->src[s]))) return st;
        return be->graph_compute(g, device);
    }
    int nth = toy_threadpool_size(tp);
    /* The nodes' scratch, taken once a run has set every view's data (a
     * kernel may size it by what it finds there) and then kept while the
     * plan, the thread count and the packed weights stay: a decode step
     * would spend 40 us of its 3 ms asking ~500 nodes again. */
    uint32_t pack_gen = toy_pack_gen();
    if (g->ws_plan_gen != g->plan_gen || g->ws_nth != nth || g->ws_pack_gen != pack_gen) g->ws_runs = 0;
    bool known = g->ws_runs >= 2; /* asked in two whole runs, the last with every view's data set */
    size_t ws = known ? g->ws : 0;
    /* Every leaf must have data. Until the scratch size is known that is
     * checked before any node runs, so a graph that has never run whole
     * (a leaf left unset) writes nothing; after, each node's leaves are
     * checked as it runs: the kernel reads those tensors there anyway, and
     * the whole graph's ~1600 sources, cold after a decode step has
     * streamed the weights, took 20-30 us of that step's start. */
    for (int i = 0; !known && i < g->n_nodes; i++) {
        /* a view computes nothing: sized as a row op, the flat dQ|dK|dV it views took ~20 bytes a value a
         * thread, all zeroed below (2.4 GiB of a ViT batch of 20000 images) */
        size_t w = toy_is_view_op(g->nodes[i]->op) ? 0 : be->work_size(g->nodes[i], nth);
        if (w > ws) ws = w;
        for (int s = 0; s < TOY_MAX_SRC; s++)
            if ((st = check_leaf(g->nodes[i]->src[s]))) return st;
    }
    if (!known) g->ws = ws, g->ws_plan_gen = g->plan_gen, g->ws_nth = nth, g->ws_pack_gen = pack_gen,
                g->ws_parallel = count_parallel(g);
    struct toy_membuf *mb = g->buf; /* its scratch outlives this graph (a prefill's, built per prompt) */
    if (ws > mb->work_size) {
        free(mb->work);
        mb->work = NULL;
        if (posix_memalign(&mb->work, ALIGN, ws)) {
            mb->work = NULL;
            mb->work_size = 0;
            return toy_error(TOY_ERR_NOMEM, "graph work buffer: %zu bytes", ws);
        }
        mb->work_size = ws;
        memset(mb->work, 0, ws); /* the kernels' shared counters start at zero (cpu-impl.h) */
    }
    if (nth > 1 && !g->timing && !g->on_node && g->ws_parallel > 1) {
        /* one task for the whole graph: a barrier between nodes instead of a pool run for each */
        struct walk w = {g, be, tp, mb, known, TOY_OK, -1, 0};
        toy_threadpool_run(tp, walk_fn, &w);
        if (w.st) return w.st;
        if (w.bad >= 0) return flagged(g->nodes[w.bad]);
    } else {
        for (int i = 0; i < g->n_nodes; i++) {
            struct toy_tensor *t = g->nodes[i];
            if ((st = prepare_node(t, known))) return st;
            enum node_kind kind = node_kind(t);
            if (toy_is_view_op(t->op) || t->led_by) continue; /* a later node does a led node's work */
            struct task tk = {be, t, mb->work, mb->work_size, g->trace};
            double t0 = g->timing ? now_us() : 0;
            if (kind == NODE_SMALL) run_node(&tk, 0, 1); /* waking the pool costs more than the work */
            else if (kind == NODE_PARALLEL) toy_threadpool_run(tp, run_node, &tk);
            /* else a led matmul, which an earlier sibling computed */
            if (g->timing) g->op_us[t->op] += now_us() - t0;
            if (t->op_params[TOY_MAX_OP_PARAMS - 1]) return flagged(t);
            if (g->on_node) g->on_node(g->on_node_ud, i);
        }
    }
    if (!known) g->ws_runs++;
    return TOY_OK;
}

static _Atomic uint32_t pack_gen;
uint32_t toy_pack_gen(void) { return atomic_load_explicit(&pack_gen, memory_order_acquire); }
void toy_pack_gen_bump(void) { atomic_fetch_add_explicit(&pack_gen, 1, memory_order_acq_rel); }

void toy_graph_set_node_callback(struct toy_graph *g, toy_graph_node_fn fn, void *ud) {
    g->on_node = fn;
    g->on_node_ud = ud;
}

void toy_graph_grad_last_writers(const struct toy_graph *g, struct toy_tensor *const *params, int n, int *out) {
    struct toy_ptrmap which = {0}; /* gradient buffer -> params index */
    for (int i = 0; i < n; i++) {
        out[i] = -1;
        if (params[i]->grad) toy_ptrmap_put(&which, params[i]->grad, i);
    }
    for (int k = 0; k < g->n_nodes; k++) {
        const struct toy_tensor *t = g->nodes[k];
        int i = writes_grad(t) ? toy_ptrmap_get(&which, t->src[TOY_MAX_SRC - 1]) : -1;
        if (i >= 0) out[i] = k;
    }
    toy_ptrmap_free(&which);
}

void toy_graph_zero_grads(struct toy_graph *g) {
    for (int i = 0; i < g->n_params; i++)
        if (g->params[i]->grad) memset(g->params[i]->grad->data, 0, toy_nbytes(g->params[i]->grad));
}

void toy_graph_set_timing(struct toy_graph *g, bool on) {
    g->timing = on;
    memset(g->op_us, 0, sizeof g->op_us);
}

const double *toy_graph_op_times_us(const struct toy_graph *g) { return g->op_us; }

void toy_graph_print(const struct toy_graph *g, void *file) {
    FILE *f = file ? file : stderr;
    char buf[96];
    for (int i = 0; i < g->n_nodes; i++) {
        const struct toy_tensor *t = g->nodes[i];
        fprintf(f, "%4d %-18s %-28s %s\n", i, toy_op_name(t->op), toy_shape_str(t, buf, sizeof buf),
                t->name);
    }
}
