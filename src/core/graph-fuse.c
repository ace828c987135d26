/* graph-fuse.c: folding small elementwise nodes into the matrix products
 * of an inference graph (toy_graph_set_fusion), for the backend's kernels.
 *
 * A decode step is ~200 matrix products that stream the weights and, around
 * them, ~150 nodes on vectors of d_model floats (RMSNorm, SwiGLU, residual
 * adds) that run on one thread while the others wait. Three rewrites remove
 * most of them, for products of at most FUSE_MAX_ROWS rows:
 *
 *   MATMUL(RMS_NORM(x, w), W)  ->  MATMUL with prologue RMS:    src[0] = x, src[2] = w
 *   MATMUL(SWIGLU(g, u), W)    ->  MATMUL with prologue SWIGLU: src[0] = g, src[2] = u
 *   ADD(r, MATMUL(..))         ->  the ADD node becomes the MATMUL, accumulating
 *                                  into r's buffer in place (P_MM_ACCUM, src[5] = r)
 *
 * Each thread of a fused product computes the prologue's rows itself (a few
 * KB, with the same vector functions as the RMS_NORM and SWIGLU ops, so the
 * products are bit for bit the unfused ones); the residual add is the
 * kernels' accumulate, one rounding, as ADD's. The in-place add needs r to
 * be a planned intermediate that nothing reads after the ADD, and not an
 * input of the product (the threads would read it while others write it).
 * Norm and SwiGLU nodes whose every reader was fused are dropped.
 *
 * One-row products of the same input over packed weights (q, k and v; gate
 * and up) then run as one pass over all their columns (t->siblings; the
 * others are marked P_MM_LED and skipped).
 *
 * Then each decode attention is linked (t->prefetch) to the products just
 * before it, its q, k and v projections (packed quantized, F32, F16 or BF16
 * weights; one product with its siblings where they run as one): their
 * threads fetch the first cache rows they will read in the attention while
 * they stream the weights (cpu/matmul.c and the decode kernels, a few lines
 * per weight block or row), so the attention starts from cache rather than
 * waiting on memory; it fetches the rest ahead of itself as it goes
 * (cpu/attn-decode-avx512.c). Results do not change.
 *
 * A decode attention whose query and new key come straight from their
 * ROPEs and whose caches from their KV_STOREs, which nothing else reads,
 * does their work itself (P_AT_FUSED; the four are led_by it and skipped):
 * each thread rotates the query heads into the scaled copy it makes anyway,
 * and the thread whose keys hold the new position rotates and stores its
 * key and value before it reads them. Those ran on one thread while the
 * others waited, ~2 us a layer: SmolLM2-135M's decode steps took 1.4-2.6%
 * less time in Q4_0 and 0.7% in Q8_0 (Zen 4, 2 threads, steps alternated
 * in one run). Same bits.
 *
 * The pass runs once, when the graph is planned, with the rewrites the
 * backend's kernels run (toy_fuse_target): the CPU does all of the above;
 * CUDA (cuda-graph.c) the prologues, the residual adds, siblings over
 * weights its GEMV kernels stream and the attention prologues (a kernel
 * of their own there), where each rewrite is a kernel launch saved (a
 * decode step there is bound by launches, not bytes). Over those weights
 * its kernels also take GPT-2's nodes (toy_fuse_target.epilogue):
 *
 *   MATMUL(LAYER_NORM(x, w, b), W) ->  prologue LAYER: src[0] = x, src[2] = w, src[3] = b
 *   MATMUL(GELU(x), W)             ->  prologue GELU:  src[0] = x
 *   ADD(MATMUL(..), b)             ->  the ADD node becomes the MATMUL with
 *                                      bias row b (src[4]), added to each sum
 *                                      as ADD adds it, before a residual
 *
 * so a GPT-2 layer's decode is four products, two cache stores and an
 * attention. The CPU does not take these: a prologue there runs on every
 * thread where the node ran on one, and measured no faster on a GPT-2
 * decode. A fused graph cannot move to another backend afterwards
 * (toy_graph_set_device refuses).
 */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define FUSE_MAX_ROWS 8

static bool f32_rows(const struct toy_tensor *t) {
    return t->type == TOY_F32 && t->nb[0] == sizeof(float) && t->ne[2] == 1 && t->ne[3] == 1;
}

static bool is_output(const struct toy_tensor *t) { return (t->flags & (TOY_FLAG_OUTPUT | TOY_FLAG_LOSS)) != 0; }

/* a small inference product, not accumulating (a prologue and a bias may be set) */
static bool small_product(const struct toy_tensor *t) {
    return t->op == TOY_OP_MATMUL && !t->op_params[P_MM_TRANS_A] && !t->op_params[P_MM_ACCUM] &&
           t->ne[1] <= FUSE_MAX_ROWS && t->ne[2] == 1 && t->ne[3] == 1 && t->type == TOY_F32 && !t->src[5];
}

/* an f32 row of n values (a norm's weight or bias, a bias row) */
static bool f32_row(const struct toy_tensor *t, int64_t n) {
    return t->type == TOY_F32 && t->ne[0] == n && t->ne[1] == 1 && t->ne[2] == 1 && t->ne[3] == 1 &&
           toy_is_contiguous(t);
}

/* the backend's kernels take t's LayerNorm and GELU prologues and bias */
static bool epilogue_ok(const struct toy_fuse_target *tg, const struct toy_tensor *t) {
    return tg->epilogue && tg->epilogue(t);
}

/* a planned result that owns its bytes (the root of a residual chain) */
static bool owns_bytes(const struct toy_tensor *t) {
    return !t->view_src && !toy_is_view_op(t->op) && t->op != TOY_OP_KV_STORE && t->op != TOY_OP_ACCUM &&
           !(t->op == TOY_OP_MATMUL && t->op_params[P_MM_ACCUM]) &&
           !(t->op == TOY_OP_GET_ROWS_BACK && t->op_params[P_GRB_ACCUM]);
}

static int refs_of(struct toy_tensor *const *nodes, int n, const bool *drop, const struct toy_tensor *x) {
    int c = 0;
    for (int i = 0; i < n; i++) {
        if (drop[i]) continue;
        for (int s = 0; s < TOY_MAX_SRC; s++) c += nodes[i]->src[s] == x;
        c += nodes[i]->view_src == x;
    }
    return c;
}

/* prologue: the norm, SwiGLU or GELU node feeding product t becomes t's
 * prologue (LayerNorm and GELU where the backend takes them) */
static bool fuse_prologue(struct toy_tensor *t, const struct toy_fuse_target *tg) {
    struct toy_tensor *a = t->src[0];
    if (is_output(a) || !f32_rows(a)) return false;
    if (a->op == TOY_OP_LAYER_NORM && epilogue_ok(tg, t)) {
        struct toy_tensor *x = a->src[0], *w = a->src[1], *b = a->src[2];
        if (!f32_rows(x) || !toy_same_shape(x, a) || (w && !f32_row(w, x->ne[0])) || (b && !f32_row(b, x->ne[0])))
            return false;
        t->src[0] = x;
        t->src[2] = w;
        t->src[3] = b;
        t->op_params[P_MM_PRE] = TOY_MM_PRE_LAYER;
        t->op_params[P_MM_EPS] = a->op_params[P_EPS];
        return true;
    }
    if (a->op == TOY_OP_GELU && epilogue_ok(tg, t)) {
        struct toy_tensor *x = a->src[0];
        if (!f32_rows(x) || !toy_same_shape(x, a)) return false;
        t->src[0] = x;
        t->op_params[P_MM_PRE] = TOY_MM_PRE_GELU;
        return true;
    }
    if (a->op == TOY_OP_RMS_NORM) {
        struct toy_tensor *x = a->src[0], *w = a->src[1];
        if (!f32_rows(x) || !toy_same_shape(x, a) || (w && !toy_is_contiguous(w))) return false;
        t->src[0] = x;
        t->src[2] = w;
        t->op_params[P_MM_PRE] = TOY_MM_PRE_RMS;
        t->op_params[P_MM_EPS] = a->op_params[P_EPS];
        return true;
    }
    if (a->op == TOY_OP_SWIGLU) {
        struct toy_tensor *g = a->src[0], *u = a->src[1];
        if (!f32_rows(g) || !f32_rows(u) || !toy_same_shape(g, a) || !toy_same_shape(u, a)) return false;
        t->src[0] = g;
        t->src[2] = u;
        t->op_params[P_MM_PRE] = TOY_MM_PRE_SWIGLU;
        return true;
    }
    return false;
}

/* bias: ADD node t = mm + b, for a bias row b broadcast over mm's rows,
 * becomes mm with b added to its results (src[4]), where the backend's
 * kernels add it (the add's rounding: then t's bits). Returns the product
 * fused away, or NULL. */
static struct toy_tensor *fuse_bias(struct toy_graph *g, int ti, const int *refs, const struct toy_fuse_target *tg) {
    struct toy_tensor *t = g->nodes[ti];
    if (t->op != TOY_OP_ADD || is_output(t) || !f32_rows(t) || !toy_is_contiguous(t)) return NULL;
    for (int side = 0; side < 2; side++) {
        struct toy_tensor *mm = t->src[side], *b = t->src[1 - side];
        int mi = toy_ptrmap_get(&g->index, mm);
        if (mi < 0 || !small_product(mm) || mm->src[4] || is_output(mm) || refs[mi] != 1 || !toy_same_shape(mm, t) ||
            !f32_row(b, t->ne[0]) || !epilogue_ok(tg, mm))
            continue;
        t->op = TOY_OP_MATMUL;
        memcpy(t->op_params, mm->op_params, sizeof t->op_params);
        for (int s = 0; s < TOY_MAX_SRC; s++) t->src[s] = s < 4 ? mm->src[s] : NULL;
        t->src[4] = b;
        return mm;
    }
    return NULL;
}

/* residual: ADD node t = r + mm becomes mm accumulating in place into r's
 * bytes (r itself, or the root its earlier fused adds accumulated into).
 * last[i]: the last node reading node i's bytes. Returns the product
 * fused away, or NULL. */
static struct toy_tensor *fuse_residual(struct toy_graph *g, int ti, int *last, const int *refs) {
    struct toy_tensor *t = g->nodes[ti];
    if (t->op != TOY_OP_ADD || is_output(t) || !f32_rows(t) || !toy_is_contiguous(t)) return NULL;
    for (int side = 0; side < 2; side++) {
        struct toy_tensor *mm = t->src[side], *r = t->src[1 - side], *root = toy_storage_of(r);
        int mi = toy_ptrmap_get(&g->index, mm), ri = toy_ptrmap_get(&g->index, root);
        if (mi < 0 || ri < 0 || !small_product(mm) || is_output(mm) || refs[mi] != 1 || !toy_same_shape(mm, t))
            continue;
        if (!owns_bytes(root) || is_output(root) || is_output(r) || !toy_same_shape(r, t) || !f32_rows(r) ||
            !toy_is_contiguous(r) || r->view_offs || last[ri] != ti)
            continue;
        bool reads_root = false;
        for (int s = 0; s < 5; s++) reads_root |= mm->src[s] && toy_storage_of(mm->src[s]) == root;
        if (reads_root) continue;
        t->op = TOY_OP_MATMUL;
        memcpy(t->op_params, mm->op_params, sizeof t->op_params);
        t->op_params[P_MM_ACCUM] = 1;
        for (int s = 0; s < TOY_MAX_SRC; s++) t->src[s] = s < 5 ? mm->src[s] : NULL;
        t->src[TOY_MAX_SRC - 1] = r; /* the accumulation target: its data is t's (graph.c) */
        t->view_src = root;         /* t's bytes are root's: t's readers keep them alive */
        t->view_offs = 0;
        if (last[ti] > last[ri]) last[ri] = last[ti];
        return mm;
    }
    return NULL;
}

/* Siblings: one-row products of the same input over packed weights of one
 * type (a layer's q, k and v projections; its gate and up) run as one
 * product, its threads dealt units of all of their columns: two fewer
 * passes of the pool and two fewer short memory streams to start (a
 * 62 KB product streams at half the rate of a 500 KB one). The others move
 * up to right after the first, are marked P_MM_LED, and the graph skips
 * them; each result is still its own tensor, bit for bit the same. */
static bool sibling_ok(const struct toy_fuse_target *tg, const struct toy_tensor *t) {
    return small_product(t) && t->ne[1] <= tg->sibling_rows && !t->op_params[P_MM_LED] && !is_output(t) &&
           tg->siblings(t);
}
static bool siblings_of(const struct toy_fuse_target *tg, const struct toy_tensor *a, const struct toy_tensor *b) {
    return sibling_ok(tg, b) && b->src[0] == a->src[0] && b->src[2] == a->src[2] && b->src[3] == a->src[3] &&
           b->src[1]->type == a->src[1]->type &&
           b->src[1]->ne[0] == a->src[1]->ne[0] && b->op_params[P_MM_PRE] == a->op_params[P_MM_PRE] &&
           b->op_params[P_MM_EPS] == a->op_params[P_MM_EPS];
}
static void link_siblings(struct toy_graph *g, const struct toy_fuse_target *tg) {
    bool moved = false;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *t = g->nodes[i];
        if (!sibling_ok(tg, t)) continue;
        int n = 0;
        /* as far as the next attention or accumulating product (which may write the input's bytes) */
        for (int j = i + 1; j < g->n_nodes && n < 2; j++) {
            struct toy_tensor *s = g->nodes[j];
            if (s->op == TOY_OP_ATTENTION || (s->op == TOY_OP_MATMUL && s->op_params[P_MM_ACCUM])) break;
            if (!siblings_of(tg, t, s)) continue;
            /* up to right after t (and its siblings so far): it reads only what t reads */
            memmove(&g->nodes[i + 2 + n], &g->nodes[i + 1 + n], (size_t)(j - i - 1 - n) * sizeof *g->nodes);
            memmove(&g->grads[i + 2 + n], &g->grads[i + 1 + n], (size_t)(j - i - 1 - n) * sizeof *g->grads);
            g->nodes[i + 1 + n] = s;
            g->grads[i + 1 + n] = NULL;
            s->op_params[P_MM_LED] = 1;
            t->siblings[n++] = s;
            moved = true;
        }
        i += n;
    }
    if (!moved) return;
    toy_ptrmap_free(&g->index);
    for (int i = 0; i < g->n_nodes; i++) {
        g->nodes[i]->id = i;
        toy_ptrmap_put(&g->index, g->nodes[i], i);
    }
}

/* The products right before a decode attention (its q, k and v
 * projections, over weights a decode kernel can stream) fetch the first
 * cache rows it will read (toy_cpu_attention_prefetch) while they stream
 * their weights, each a share by its weight bytes (the earliest the keys).
 * They used to fetch all of them; with the attention fetching ahead of
 * itself, a SmolLM2-135M Q4_0 decode at a 1900-token context took 4.4 ms a
 * step that way against 5.4 fetching all (the products stream at the
 * memory's rate, so every byte they fetch costs them its time). */
#define PF_PRODUCTS 3
static void link_prefetch(struct toy_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *at = g->nodes[i];
        if (at->op != TOY_OP_ATTENTION || at->src[0]->ne[2] != 1 || at->src[0]->ne[3] != 1) continue;
        struct toy_tensor *mm[PF_PRODUCTS];
        double bytes[PF_PRODUCTS], total = 0;
        int n = 0, covered = 0; /* products, counting those a sibling computes */
        for (int j = i - 1; j >= 0 && covered < PF_PRODUCTS && g->nodes[j]->op != TOY_OP_ATTENTION; j--) {
            struct toy_tensor *t = g->nodes[j];
            if (t->op != TOY_OP_MATMUL || t->ne[1] > FUSE_MAX_ROWS || t->prefetch || t->op_params[P_MM_LED])
                continue;
            enum toy_dtype wt = t->src[1]->type;
            if (!t->src[1]->packed && wt != TOY_F32 && wt != TOY_F16 && wt != TOY_BF16) continue;
            mm[n] = t;
            bytes[n] = (double)toy_nbytes(t->src[1]);
            covered++;
            for (int s = 0; s < 2 && t->siblings[s]; s++, covered++)
                bytes[n] += (double)toy_nbytes(t->siblings[s]->src[1]);
            total += bytes[n++];
        }
        double done = 0;
        for (int q = n - 1; q >= 0 && total > 0; q--) {
            toy_param_f32_set(mm[q], P_MM_PF_LO, (float)(done / total));
            done += bytes[q];
            toy_param_f32_set(mm[q], P_MM_PF_HI, q ? (float)(done / total) : 1.0f);
            mm[q]->prefetch = at;
        }
    }
}

/* node x feeds only its reader (refs: readers by node index) and is not an output */
static bool only_read_once(struct toy_graph *g, const int *refs, const struct toy_tensor *x, enum toy_op op) {
    int j = toy_ptrmap_get(&g->index, x);
    return x->op == op && j >= 0 && refs[j] == 1 && !is_output(x) && !x->led_by;
}

static int fuse_attention_prologues(struct toy_graph *g, const int *refs, const struct toy_fuse_target *tg) {
    int fused = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        struct toy_tensor *at = g->nodes[i];
        if (at->op != TOY_OP_ATTENTION || at->op_params[P_AT_FUSED]) continue;
        struct toy_tensor *rq = at->src[0], *ks = at->src[1], *vs = at->src[2];
        if (!only_read_once(g, refs, rq, TOY_OP_ROPE) || !only_read_once(g, refs, ks, TOY_OP_KV_STORE) ||
            !only_read_once(g, refs, vs, TOY_OP_KV_STORE) || !only_read_once(g, refs, ks->src[1], TOY_OP_ROPE) ||
            ks->src[2] != vs->src[2] || !tg->attention(at))
            continue;
        at->op_params[P_AT_FUSED] = 1;
        rq->led_by = ks->src[1]->led_by = ks->led_by = vs->led_by = at;
        fused += 4;
    }
    return fused;
}

const struct toy_fuse_target toy_cpu_fuse_target = {toy_cpu_matmul_packed, FUSE_MAX_ROWS, toy_cpu_attention_fusable, true, NULL};

/* readers of every node (refs) and the last node reading its bytes
 * through views (last; outputs: INT32_MAX), the dropped nodes left out */
static void count_uses(const struct toy_graph *g, const bool *drop, int *refs, int *last) {
    int n = g->n_nodes;
    for (int i = 0; i < n; i++) {
        refs[i] = 0;
        last[i] = is_output(g->nodes[i]) ? INT32_MAX : -1;
    }
    for (int i = 0; i < n; i++)
        for (int s = 0; s < TOY_MAX_SRC + 1 && !drop[i]; s++) {
            struct toy_tensor *x = s < TOY_MAX_SRC ? g->nodes[i]->src[s] : g->nodes[i]->view_src;
            if (!x) continue;
            int j = toy_ptrmap_get(&g->index, x);
            if (j >= 0) refs[j]++;
            int b = toy_ptrmap_get(&g->index, toy_storage_of(x));
            if (b >= 0 && last[b] != INT32_MAX && last[b] < i) last[b] = i;
        }
}

int toy_graph_fuse(struct toy_graph *g, const struct toy_fuse_target *tg) {
    int n = g->n_nodes, fused = 0;
    if (g->n_forward != n) return 0; /* a backward pass differentiates the unfused ops */
    for (int i = 0; i < n; i++)
        if (small_product(g->nodes[i]) && !g->nodes[i]->op_params[P_MM_PRE] && !g->nodes[i]->src[2] &&
            fuse_prologue(g->nodes[i], tg))
            fused++;
    int *refs = malloc((size_t)(n ? n : 1) * sizeof *refs), *last = malloc((size_t)(n ? n : 1) * sizeof *last);
    bool *drop = calloc((size_t)(n ? n : 1), sizeof *drop);
    if (!refs || !last || !drop) {
        free(refs);
        free(last);
        free(drop);
        return fused; /* the prologues alone are complete rewrites */
    }
    count_uses(g, drop, refs, last);
    if (tg->epilogue) {
        int biased = 0;
        for (int i = 0; i < n; i++) {
            struct toy_tensor *gone = fuse_bias(g, i, refs, tg);
            if (!gone) continue;
            drop[toy_ptrmap_get(&g->index, gone)] = true;
            biased++;
        }
        if (biased) count_uses(g, drop, refs, last); /* the products' reads moved to their adds' places */
        fused += biased;
    }
    for (int i = 0; i < n; i++) {
        struct toy_tensor *gone = fuse_residual(g, i, last, refs);
        if (!gone) continue;
        drop[toy_ptrmap_get(&g->index, gone)] = true;
        fused++;
    }
    /* norms and activations that no one reads any more */
    for (int i = 0; i < n; i++) {
        struct toy_tensor *t = g->nodes[i];
        enum toy_op op = t->op;
        if ((op == TOY_OP_RMS_NORM || op == TOY_OP_SWIGLU || op == TOY_OP_LAYER_NORM || op == TOY_OP_GELU) &&
            !is_output(t) && !drop[i] && !refs_of(g->nodes, n, drop, t))
            drop[i] = true;
    }
    if (tg->attention) /* refs and the index still by the nodes' first positions */
        fused += fuse_attention_prologues(g, refs, tg);
    int k = 0;
    toy_ptrmap_free(&g->index);
    for (int i = 0; i < n; i++) {
        if (drop[i]) continue;
        g->nodes[k] = g->nodes[i];
        g->grads[k] = g->grads[i];
        g->nodes[k]->id = k;
        toy_ptrmap_put(&g->index, g->nodes[k], k);
        k++;
    }
    g->n_nodes = g->n_forward = k;
    free(drop);
    free(refs);
    free(last);
    if (tg->siblings) link_siblings(g, tg);
    if (tg->prefetch) link_prefetch(g);
    g->planned = false;
    return fused;
}
