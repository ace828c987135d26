/* autodiff.c: reverse-mode differentiation by appending gradient ops.
 *
 * toy_graph_backward walks the forward nodes from the loss back to the
 * parameters. For each node with an incoming gradient dy it builds the ops
 * giving each source's contribution (the rules below, one per op) and sums
 * contributions with ADD. A parameter's contributions go into its persistent
 * gradient buffer p->grad: a MATMUL or GET_ROWS_BACK contribution writes
 * into it directly (accumulating), anything else through an ACCUM node. Runs
 * therefore add to p->grad: that is gradient accumulation.
 *
 * A tensor read through several views (GPT-2's q, k and v of one qkv
 * product) gets its gradient as one buffer: the first view's VIEW_BACK
 * zeroes it and adds its part, each later one adds its own part in place
 * (P_VB_ACCUM), where an ADD of whole-size contributions would read and
 * write the whole tensor once per view. Where the views tile the tensor
 * (each element in exactly one), each stores its part and nothing is
 * zeroed (P_VB_STORE).
 */
#include <math.h>
#include <stdlib.h>

#include "core/internal.h"

static struct toy_tensor *backward_node(struct toy_ctx *ctx, enum toy_op op, const int64_t *ne) {
    struct toy_tensor *t = toy_tensor_alloc_meta(ctx, TOY_F32, 4, ne);
    t->op = op;
    return t;
}

static struct toy_tensor *contig(struct toy_ctx *ctx, struct toy_tensor *t) {
    return toy_is_contiguous(t) ? t : toy_cont(ctx, t);
}

/* Bring a broadcast-shaped gradient down to the shape of x. Size-1 dims
 * broadcast by repetition (sum_to); batch dims of matmul may broadcast by
 * ratio (index i reads i / group): those sum over each group of `group`
 * consecutive indices, through a reshape that splits the dim. */
static struct toy_tensor *reduce_like(struct toy_ctx *ctx, struct toy_tensor *d, struct toy_tensor *x) {
    if (toy_same_shape(d, x)) return d;
    for (int dim = 2; dim < 4; dim++) {
        if (x->ne[dim] == 1 || x->ne[dim] == d->ne[dim]) continue;
        int64_t grp = d->ne[dim] / x->ne[dim];
        d = contig(ctx, d);
        int64_t inner = d->ne[0] * d->ne[1] * (dim == 3 ? d->ne[2] : 1);
        int64_t outer = dim == 2 ? d->ne[3] : 1;
        struct toy_tensor *r = toy_reshape_4d(ctx, d, inner, grp, x->ne[dim], outer);
        struct toy_tensor *s = toy_sum(ctx, r, 1); /* {inner, 1, x->ne[dim], outer} */
        int64_t ne[4] = {d->ne[0], d->ne[1], d->ne[2], d->ne[3]};
        ne[dim] = x->ne[dim];
        d = toy_reshape(ctx, s, 4, ne);
    }
    return toy_same_shape(d, x) ? d : toy_sum_to(ctx, d, x);
}

struct bw {
    struct toy_graph *g;
    struct toy_ctx *ctx;
    bool *needs;   /* needs[i]: node i depends on a parameter */
    bool *views;   /* views[i]: node i's gradient so far is a VIEW_BACK chain nothing else reads */
};

static bool wants_grad(struct bw *b, struct toy_tensor *s) {
    if (!s) return false;
    if (s->op == TOY_OP_NONE) return (s->flags & TOY_FLAG_PARAM) && s->type == TOY_F32;
    int j = toy_ptrmap_get(&b->g->index, s);
    return j >= 0 && j < b->g->n_forward && b->needs[j];
}

static void add_contribution(struct bw *b, struct toy_tensor *s, struct toy_tensor *c) {
    struct toy_graph *g = b->g;
    TOY_ASSERT(toy_same_shape(s, c), "gradient shape of '%s' (op %s) differs", toy_label(s),
               toy_op_name(s->op));
    if (s->op == TOY_OP_NONE) {
        if (!s->grad) {
            TOY_ASSERT(toy_ctx_allocs_data(b->ctx), "toy_graph_backward needs a context with alloc_data");
            s->grad = toy_new_tensor(b->ctx, TOY_F32, 4, s->ne);
            s->grad->flags |= TOY_FLAG_GRAD;
            toy_set_name(s->grad, "%s.grad", s->name);
            if (g->n_own_grads == g->cap_own_grads) {
                g->cap_own_grads = g->cap_own_grads ? 2 * g->cap_own_grads : 64;
                g->own_grads = realloc(g->own_grads, (size_t)g->cap_own_grads * sizeof *g->own_grads);
                if (!g->own_grads) TOY_ABORT("out of memory (backward)");
            }
            g->own_grads[g->n_own_grads++] = s;
        }
        bool fresh = toy_ptrmap_get(&g->visited, c) < 0;
        if (fresh && c->op == TOY_OP_MATMUL) {
            c->op_params[P_MM_ACCUM] = 1;
            c->src[TOY_MAX_SRC - 1] = s->grad;
            toy_graph_expand(g, c);
            return;
        }
        if (fresh && c->op == TOY_OP_GET_ROWS_BACK) {
            c->op_params[P_GRB_ACCUM] = 1;
            c->src[TOY_MAX_SRC - 1] = s->grad;
            toy_graph_expand(g, c);
            return;
        }
        struct toy_tensor *acc = backward_node(b->ctx, TOY_OP_ACCUM, s->ne);
        acc->src[0] = c;
        acc->src[TOY_MAX_SRC - 1] = s->grad;
        toy_graph_expand(g, acc);
        return;
    }
    int j = toy_ptrmap_get(&g->index, s);
    TOY_ASSERT(j >= 0, "gradient for a tensor outside the graph");
    g->grads[j] = g->grads[j] ? toy_add(b->ctx, g->grads[j], c) : c;
    b->views[j] = false;
}

/* the contribution of view y (gradient dy) to its source a: a VIEW_BACK,
 * added in place to a's gradient where that is already a chain of them
 * (only those nodes hold it, so writing into it is safe) */
static void view_contribution(struct bw *b, struct toy_tensor *a, struct toy_tensor *y, struct toy_tensor *dy) {
    struct toy_tensor *d = backward_node(b->ctx, TOY_OP_VIEW_BACK, a->ne);
    d->src[0] = dy;
    d->src[1] = y; /* gives the view's strides and offset */
    int j = a->op == TOY_OP_NONE ? -1 : toy_ptrmap_get(&b->g->index, a);
    if (j < 0 || !b->g->grads[j]) {
        add_contribution(b, a, d);
        if (j >= 0) b->views[j] = true;
        return;
    }
    if (!b->views[j]) {
        add_contribution(b, a, d);
        return;
    }
    struct toy_tensor *prev = b->g->grads[j];
    d->op_params[P_VB_ACCUM] = 1;
    d->src[TOY_MAX_SRC - 1] = prev;
    d->view_src = toy_storage_of(prev); /* d's bytes are the chain's first: d's readers keep them alive */
    d->view_offs = 0;
    b->g->grads[j] = d;
}

/* the columns [*c0, *c0 + *w) of every row of contiguous a that view y
 * covers, if y is such a slice (dims of y after the first, or after the
 * first two where those are contiguous, walking a's rows as a does) */
static bool row_slice(const struct toy_tensor *a, const struct toy_tensor *y, int64_t *c0, int64_t *w) {
    size_t off = toy_view_offset(y);
    if (y->nb[0] != sizeof(float) || off % sizeof(float)) return false;
    int k = 1;
    *w = y->ne[0];
    if (y->nb[1] == (size_t)y->ne[0] * sizeof(float)) *w *= y->ne[k++];
    int64_t yne[4], ane[4];
    size_t ynb[4], anb[4];
    int ny = 0, na = 0;
    for (; k < 4; k++)
        if (y->ne[k] > 1) yne[ny] = y->ne[k], ynb[ny++] = y->nb[k];
    for (int d = 1; d < 4; d++)
        if (a->ne[d] > 1) ane[na] = a->ne[d], anb[na++] = a->nb[d];
    if (ny != na) return false;
    for (int i = 0; i < ny; i++)
        if (yne[i] != ane[i] || ynb[i] != anb[i]) return false;
    *c0 = (int64_t)(off / sizeof(float));
    return *c0 + *w <= a->ne[0];
}

/* a's gradient is a chain of VIEW_BACKs (view_contribution): where their
 * views tile a's rows, mark them to store their parts, with no zeroing */
static void mark_tiling(struct toy_tensor *a, struct toy_tensor *last) {
    int64_t lo[64], hi[64];
    int n = 0;
    for (struct toy_tensor *d = last; d; d = d->op_params[P_VB_ACCUM] ? d->src[TOY_MAX_SRC - 1] : NULL) {
        int64_t c0, w;
        if (n == 64 || !row_slice(a, d->src[1], &c0, &w)) return;
        lo[n] = c0, hi[n++] = c0 + w;
    }
    for (int64_t at = 0; at < a->ne[0];) { /* the slices, in column order, must meet end to start */
        int i = 0;
        while (i < n && lo[i] != at) i++;
        if (i == n || hi[i] <= at) return;
        at = hi[i];
        lo[i] = -1; /* used */
    }
    for (int i = 0; i < n; i++)
        if (lo[i] != -1) return; /* an extra slice overlaps */
    for (struct toy_tensor *d = last; d; d = d->op_params[P_VB_ACCUM] ? d->src[TOY_MAX_SRC - 1] : NULL)
        d->op_params[P_VB_STORE] = 1;
}

static void matmul_backward(struct bw *b, struct toy_tensor *y, struct toy_tensor *dy) {
    struct toy_ctx *ctx = b->ctx;
    struct toy_tensor *A = y->src[0], *B = y->src[1];
    bool ta = y->op_params[P_MM_TRANS_A], tb = y->op_params[P_MM_TRANS_B];
    if (wants_grad(b, A)) {
        struct toy_tensor *dA = ta ? toy_matmul(ctx, B->type == TOY_F32 ? B : toy_cast(ctx, B, TOY_F32), dy, tb, true)
                                   : toy_matmul(ctx, dy, B, false, !tb);
        if (!ta && y->op_params[P_MM_BF16]) dA->op_params[P_MM_BF16] = 1; /* in bf16 as the forward */
        add_contribution(b, A, reduce_like(ctx, dA, A));
    }
    if (wants_grad(b, B)) {
        /* mixed precision: the weight gradient's product is marked bf16 as
         * the forward's (f32 sums), over f32 master weights or over a
         * weight cast to bf16; the backend rounds both f32 operands as it
         * packs them, so no bf16 copy of an activation is made */
        struct toy_tensor *dB = tb ? toy_matmul(ctx, dy, A, true, ta) : toy_matmul(ctx, A, dy, !ta, false);
        if ((y->op_params[P_MM_BF16] && B->type == TOY_F32) || (tb && B->type == TOY_BF16 && A->type == TOY_F32))
            dB->op_params[P_MM_BF16] = 1;
        add_contribution(b, B, reduce_like(ctx, dB, B));
    }
}

/* A mixture's product (moe.c): the input's gradient per (token, slot) pair,
 * summed over the slots where every slot read the token's one row; the
 * route's weights' gradient with it when the forward combined the slots,
 * carried on to the router logits; the experts' gradient where trainable */
static void moe_matmul_backward(struct bw *b, struct toy_tensor *y, struct toy_tensor *dy) {
    struct toy_ctx *ctx = b->ctx;
    struct toy_tensor *x = y->src[0], *w = y->src[1], *route = y->src[2], *logits = route->src[0];
    bool combine = y->op_params[P_MM_COMBINE], dw = combine && wants_grad(b, logits);
    int64_t K = x->ne[0], k = route->ne[0], N = route->ne[1];
    if (wants_grad(b, x) || dw) {
        struct toy_tensor *d = backward_node(ctx, TOY_OP_MOE_MATMUL_BACK, (int64_t[]){K * k * N + (combine ? k * N : 0), 1, 1, 1});
        d->src[0] = contig(ctx, dy);
        d->src[1] = w;
        d->src[2] = route;
        d->src[3] = x;
        d->op_params[P_MM_COMBINE] = combine;
        if (wants_grad(b, x)) {
            struct toy_tensor *shape = toy_tensor_alloc_meta(ctx, TOY_F32, 3, (int64_t[]){K, k, N});
            struct toy_tensor *dx = toy_view(ctx, d, 3, shape->ne, shape->nb, 0);
            add_contribution(b, x, x->ne[1] == 1 && k > 1 ? toy_sum(ctx, dx, 1) : dx);
        }
        if (dw) {
            struct toy_tensor *shape = toy_tensor_alloc_meta(ctx, TOY_F32, 2, (int64_t[]){k, N});
            struct toy_tensor *r = backward_node(ctx, TOY_OP_MOE_ROUTE_BACK, logits->ne);
            r->src[0] = toy_view(ctx, d, 2, shape->ne, shape->nb, (size_t)(K * k * N) * sizeof(float));
            r->src[1] = route;
            r->src[2] = logits;
            r->op_params[P_MR_NORM] = route->op_params[P_MR_NORM];
            r->op_params[P_MR_SIGMOID] = route->op_params[P_MR_SIGMOID];
            add_contribution(b, logits, r);
        }
    }
    if (wants_grad(b, w)) {
        struct toy_tensor *d = backward_node(ctx, TOY_OP_MOE_MATMUL_BACK_W, w->ne);
        d->src[0] = contig(ctx, dy);
        d->src[1] = x;
        d->src[2] = route;
        d->op_params[P_MM_COMBINE] = combine;
        add_contribution(b, w, d);
    }
}

static void node_backward(struct bw *b, struct toy_tensor *y, struct toy_tensor *dy) {
    struct toy_ctx *ctx = b->ctx;
    struct toy_tensor *a = y->src[0], *s1 = y->src[1], *s2 = y->src[2];
    switch (y->op) {
    case TOY_OP_VIEW: {
        if (!wants_grad(b, a)) break;
        TOY_ASSERT(toy_is_contiguous(a), "backward of a view of non-contiguous '%s'", toy_label(a));
        view_contribution(b, a, y, dy);
        break;
    }
    case TOY_OP_RESHAPE:
        if (wants_grad(b, a)) add_contribution(b, a, toy_reshape(ctx, contig(ctx, dy), 4, a->ne));
        break;
    case TOY_OP_PERMUTE: {
        if (!wants_grad(b, a)) break;
        int inv[4];
        for (int i = 0; i < 4; i++) inv[y->op_params[i]] = i;
        add_contribution(b, a, toy_cont(ctx, toy_permute(ctx, dy, inv[0], inv[1], inv[2], inv[3])));
        break;
    }
    case TOY_OP_CONT:
        if (wants_grad(b, a)) add_contribution(b, a, dy);
        break;
    case TOY_OP_CAST:
        if (wants_grad(b, a)) add_contribution(b, a, dy);
        break;
    case TOY_OP_ADD:
    case TOY_OP_SUB:
        if (wants_grad(b, a)) add_contribution(b, a, dy);
        if (wants_grad(b, s1)) {
            struct toy_tensor *d = reduce_like(ctx, dy, s1);
            add_contribution(b, s1, y->op == TOY_OP_SUB ? toy_neg(ctx, d) : d);
        }
        break;
    case TOY_OP_MUL:
        if (wants_grad(b, a)) add_contribution(b, a, toy_mul(ctx, dy, s1));
        if (wants_grad(b, s1)) add_contribution(b, s1, reduce_like(ctx, toy_mul(ctx, dy, a), s1));
        break;
    case TOY_OP_DIV:
        if (wants_grad(b, a)) add_contribution(b, a, toy_div(ctx, dy, s1));
        if (wants_grad(b, s1))
            add_contribution(b, s1, reduce_like(ctx, toy_neg(ctx, toy_div(ctx, toy_mul(ctx, dy, y), s1)), s1));
        break;
    case TOY_OP_SCALE:
        if (wants_grad(b, a)) add_contribution(b, a, toy_scale(ctx, dy, toy_param_f32(y, P_SCALE)));
        break;
    case TOY_OP_SQR:
        if (wants_grad(b, a)) add_contribution(b, a, toy_scale(ctx, toy_mul(ctx, dy, a), 2.0f));
        break;
    case TOY_OP_SQRT:
        if (wants_grad(b, a)) add_contribution(b, a, toy_div(ctx, toy_scale(ctx, dy, 0.5f), y));
        break;
    case TOY_OP_TANH: /* dx = dy (1 - y^2) */
        if (wants_grad(b, a)) add_contribution(b, a, toy_sub(ctx, dy, toy_mul(ctx, toy_mul(ctx, dy, y), y)));
        break;
    case TOY_OP_NEG:
        if (wants_grad(b, a)) add_contribution(b, a, toy_neg(ctx, dy));
        break;
    case TOY_OP_MATMUL:
        matmul_backward(b, y, dy);
        break;
    case TOY_OP_GET_ROWS: {
        if (!wants_grad(b, a)) break;
        struct toy_tensor *d = backward_node(ctx, TOY_OP_GET_ROWS_BACK, a->ne);
        d->src[0] = contig(ctx, dy);
        d->src[1] = s1;
        add_contribution(b, a, d);
        break;
    }
    case TOY_OP_SUM:
    case TOY_OP_MEAN:
    case TOY_OP_SUM_ALL:
    case TOY_OP_SUM_TO: {
        if (!wants_grad(b, a)) break;
        struct toy_tensor *d = toy_repeat(ctx, dy, a);
        if (y->op == TOY_OP_MEAN) d = toy_scale(ctx, d, 1.0f / (float)a->ne[y->op_params[P_DIM]]);
        add_contribution(b, a, d);
        break;
    }
    case TOY_OP_REPEAT:
        if (wants_grad(b, a)) add_contribution(b, a, toy_sum_to(ctx, dy, a));
        break;
    case TOY_OP_CONCAT: {
        int dim = y->op_params[P_DIM];
        struct toy_tensor *dc = contig(ctx, dy);
        for (int part = 0; part < 2; part++) {
            struct toy_tensor *x = y->src[part];
            if (!wants_grad(b, x)) continue;
            size_t off = part ? (size_t)a->ne[dim] * dc->nb[dim] : 0;
            struct toy_tensor *v = toy_view(ctx, dc, 4, x->ne, dc->nb, off);
            add_contribution(b, x, toy_cont(ctx, v));
        }
        break;
    }
    case TOY_OP_RMS_NORM:
    case TOY_OP_LAYER_NORM: {
        bool rms = y->op == TOY_OP_RMS_NORM;
        if (wants_grad(b, a)) {
            struct toy_tensor *d = backward_node(ctx, rms ? TOY_OP_RMS_NORM_BACK : TOY_OP_LAYER_NORM_BACK, a->ne);
            d->src[0] = contig(ctx, dy);
            d->src[1] = a;
            d->src[2] = s1;
            d->op_params[P_EPS] = y->op_params[P_EPS];
            add_contribution(b, a, d);
        }
        if (wants_grad(b, s1)) {
            struct toy_tensor *d = backward_node(ctx, rms ? TOY_OP_RMS_NORM_BACK_W : TOY_OP_LAYER_NORM_BACK_W, s1->ne);
            d->src[0] = contig(ctx, dy);
            d->src[1] = a;
            d->op_params[P_EPS] = y->op_params[P_EPS];
            add_contribution(b, s1, d);
        }
        if (!rms && wants_grad(b, s2)) add_contribution(b, s2, toy_sum_to(ctx, dy, s2));
        break;
    }
    case TOY_OP_SILU:
    case TOY_OP_GELU: {
        if (!wants_grad(b, a)) break;
        struct toy_tensor *d = backward_node(ctx, y->op == TOY_OP_SILU ? TOY_OP_SILU_BACK : TOY_OP_GELU_BACK, a->ne);
        d->src[0] = contig(ctx, dy);
        d->src[1] = a;
        add_contribution(b, a, d);
        break;
    }
    case TOY_OP_SWIGLU:
    case TOY_OP_SWIGLU_OAI: { /* one node gives [dgate | dup] (the clamped form: its alpha and limit with it) */
        if (!wants_grad(b, a) && !wants_grad(b, s1)) break;
        int64_t n = toy_nelements(a);
        enum toy_op op = y->op == TOY_OP_SWIGLU ? TOY_OP_SWIGLU_BACK : TOY_OP_SWIGLU_OAI_BACK;
        struct toy_tensor *d = backward_node(ctx, op, (int64_t[]){2 * n, 1, 1, 1});
        d->src[0] = contig(ctx, dy);
        d->src[1] = a;
        d->src[2] = s1;
        memcpy(d->op_params, y->op_params, sizeof d->op_params);
        for (int which = 0; which < 2; which++) {
            struct toy_tensor *x = y->src[which];
            if (!wants_grad(b, x)) continue;
            struct toy_tensor *shape = toy_tensor_alloc_meta(ctx, TOY_F32, 4, x->ne);
            add_contribution(b, x, toy_view(ctx, d, 4, x->ne, shape->nb, which ? (size_t)n * 4 : 0));
        }
        break;
    }
    case TOY_OP_SOFTMAX: {
        if (!wants_grad(b, a)) break;
        struct toy_tensor *d = backward_node(ctx, TOY_OP_SOFTMAX_BACK, a->ne);
        d->src[0] = contig(ctx, dy);
        d->src[1] = y;
        d->op_params[P_SM_SCALE] = y->op_params[P_SM_SCALE];
        add_contribution(b, a, d);
        break;
    }
    case TOY_OP_ATTENTION: {
        struct toy_tensor *q = a, *k = s1, *v = s2;
        TOY_ASSERT(!y->op_params[P_AT_DYNKV] && !y->op_params[P_AT_ROWS], "no gradient through cached (KV) attention '%s'",
                   toy_label(y));
        struct toy_tensor *sinks = y->src[5];
        if (sinks && wants_grad(b, sinks)) { /* d s_h = -sum over rows of exp(s_h - lse) rowsum(dO O) */
            struct toy_tensor *ds = backward_node(ctx, TOY_OP_ATTN_SINKS_BACK, sinks->ne);
            ds->src[0] = contig(ctx, dy);
            ds->src[1] = y;
            ds->src[2] = sinks;
            add_contribution(b, sinks, ds);
        }
        if (!wants_grad(b, q) && !wants_grad(b, k) && !wants_grad(b, v)) break;
        int64_t nq = toy_nelements(q), nk = toy_nelements(k);
        struct toy_tensor *d = backward_node(ctx, TOY_OP_ATTENTION_BACK, (int64_t[]){nq + 2 * nk, 1, 1, 1});
        d->src[0] = contig(ctx, dy);
        d->src[1] = q;
        d->src[2] = k;
        d->src[3] = v;
        d->src[4] = y;
        d->src[5] = y->src[4]; /* segment ids or NULL */
        memcpy(d->op_params, y->op_params, sizeof d->op_params);
        struct toy_tensor *parts[3] = {q, k, v};
        size_t offs[3] = {0, (size_t)nq * 4, (size_t)(nq + nk) * 4};
        for (int i = 0; i < 3; i++) {
            if (!wants_grad(b, parts[i])) continue;
            struct toy_tensor *shape = toy_tensor_alloc_meta(ctx, TOY_F32, 4, parts[i]->ne);
            struct toy_tensor *view = toy_view(ctx, d, 4, parts[i]->ne, shape->nb, offs[i]);
            add_contribution(b, parts[i], view);
        }
        break;
    }
    case TOY_OP_MOE_MATMUL:
        moe_matmul_backward(b, y, dy);
        break;
    case TOY_OP_MOE_ROUTE: /* the ids have no gradient; the weights' reaches the logits from MOE_MATMUL's */
        break;
    case TOY_OP_ROPE:
        if (wants_grad(b, a))
            {
                struct toy_tensor *d = toy_rope_impl(ctx, contig(ctx, dy), s1, y->op_params, !y->op_params[P_RP_INVERSE]);
                d->src[2] = s2; /* the same frequency factors */
                add_contribution(b, a, d);
            }
        break;
    case TOY_OP_CROSS_ENTROPY: {
        if (!wants_grad(b, a)) break;
        struct toy_tensor *d = backward_node(ctx, TOY_OP_CROSS_ENTROPY_BACK, a->ne);
        d->src[0] = dy;
        d->src[1] = a;
        d->src[2] = s1;
        d->src[3] = y;
        d->op_params[P_CE_IGNORE] = y->op_params[P_CE_IGNORE];
        add_contribution(b, a, d);
        break;
    }
    default:
        TOY_ABORT("no gradient for op %s (tensor '%s')", toy_op_name(y->op), toy_label(y));
    }
}

void toy_graph_backward(struct toy_graph *g, struct toy_tensor *loss) {
    struct toy_ctx *ctx = g->ctx;
    TOY_ASSERT(toy_nelements(loss) == 1, "loss '%s' must have one element", toy_label(loss));
    int li = toy_ptrmap_get(&g->index, loss);
    TOY_ASSERT(li >= 0, "loss is not in the graph (call toy_graph_build first)");
    /* a second call would append a second set of gradient ops, and every gradient would count twice */
    TOY_ASSERT(!g->grads[li], "the graph already has the gradient ops of '%s' (toy_graph_backward runs once)",
               loss->name);
    loss->flags |= TOY_FLAG_LOSS;
    int nf = g->n_forward = g->n_nodes;
    struct bw b = {g, ctx, calloc((size_t)(nf ? nf : 1), sizeof(bool)), calloc((size_t)(nf ? nf : 1), sizeof(bool))};
    if (!b.needs || !b.views) TOY_ABORT("out of memory (backward)");
    for (int i = 0; i < nf; i++) {
        struct toy_tensor *t = g->nodes[i];
        for (int s = 0; s < TOY_MAX_SRC && !b.needs[i]; s++) b.needs[i] = wants_grad(&b, t->src[s]);
    }
    /* d loss / d loss = 1 */
    struct toy_tensor *one = toy_new_tensor(ctx, TOY_F32, 4, loss->ne);
    TOY_ASSERT(one->data, "toy_graph_backward needs a context with alloc_data");
    *(float *)one->data = 1.0f;
    toy_set_name(one, "d_loss");
    g->grads[li] = one;
    for (int i = li; i >= 0; i--) {
        struct toy_tensor *dy = g->grads[i];
        if (!dy || !b.needs[i]) continue;
        /* A parameter's low-precision copy (mixed precision) passes its
         * gradient straight on: dy stays out of the graph until then, so a
         * lone weight-gradient MATMUL can accumulate into the parameter's
         * gradient itself rather than into a buffer an ACCUM then adds */
        struct toy_tensor *y = g->nodes[i];
        if (b.views[i] && toy_is_contiguous(y)) mark_tiling(y, dy);
        if (!(y->op == TOY_OP_CAST && y->src[0]->op == TOY_OP_NONE)) toy_graph_expand(g, dy);
        node_backward(&b, y, dy);
    }
    free(b.needs);
    free(b.views);
    /* what is differentiated must be what runs: no activation quantization */
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i]->op == TOY_OP_MATMUL) g->nodes[i]->op_params[P_MM_EXACT] = 1;
        if (g->nodes[i]->op == TOY_OP_MOE_MATMUL) g->nodes[i]->op_params[P_MOE_EXACT] = 1;
    }
    g->planned = false;
}

struct toy_tensor *toy_graph_grad(const struct toy_graph *g, const struct toy_tensor *t) {
    if (t->op == TOY_OP_NONE) return t->grad;
    int j = toy_ptrmap_get(&g->index, t);
    return j >= 0 && j < g->cap ? g->grads[j] : NULL;
}
