/* toy/graph.h: graphs of ops, reverse-mode autodiff, the memory planner and
 * graph execution.
 *
 * A graph is built once per shape and run many times:
 *   toy_graph_build     collects the ops that produce a tensor, in order;
 *   toy_graph_backward  appends the gradient ops of a scalar loss; every
 *                       trainable parameter p gets p->grad, a persistent
 *                       buffer that runs ADD into (gradient accumulation
 *                       across runs; clear it with toy_graph_zero_grads);
 *   toy_graph_plan      gives every op result a place in one buffer by
 *                       liveness (a result's bytes are reused once its last
 *                       reader has run), reserved once: nothing is allocated
 *                       by toy_graph_compute;
 *   toy_graph_compute   runs the nodes on a thread pool.
 *
 * Ownership: the graph lives in the context that made it.
 */
#ifndef TOY_GRAPH_H
#define TOY_GRAPH_H

#include "toy/tensor.h"
#include "toy/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_graph;

/* An empty graph in ctx (nodes are recorded by toy_graph_build). */
struct toy_graph *toy_graph_new(struct toy_ctx *ctx);
/* Appends the ops needed for `out` that are not already in g. */
void toy_graph_build(struct toy_graph *g, struct toy_tensor *out);
/* Appends gradient ops of `loss` (1 element) with d loss = 1, once per
 * graph (a second call is a checked error). Allocates the persistent grad
 * buffers of the parameters in the graph's context (which must have
 * alloc_data) unless they already exist; freeing that context sets those
 * p->grad back to NULL, so free it before the parameters' own context. */
void toy_graph_backward(struct toy_graph *g, struct toy_tensor *loss);
/* The gradient node of t after toy_graph_backward (NULL if none). For
 * parameters this is p->grad. */
struct toy_tensor *toy_graph_grad(const struct toy_graph *g, const struct toy_tensor *t);

int toy_graph_n_nodes(const struct toy_graph *g);
struct toy_tensor *toy_graph_node(const struct toy_graph *g, int i);
/* The trainable parameters reached by the graph, in node order. */
int toy_graph_n_params(const struct toy_graph *g);
struct toy_tensor *toy_graph_param(const struct toy_graph *g, int i);

/* A reusable memory block for planned graphs: grows to the largest plan it
 * has seen, never shrinks; graphs of several shapes can share one (a graph
 * planned earlier follows the block when a later plan moves it; their
 * results share the bytes, so read one graph's outputs before running
 * another). The kernels' scratch is kept with it the same way, so a graph
 * built per request (a prompt's prefill) finds it ready. */
struct toy_membuf {
    void *data;
    size_t size;
    void *work; /* the kernels' per-thread scratch (graph.c) */
    size_t work_size;
};
void toy_membuf_free(struct toy_membuf *m);

struct toy_plan_info {
    size_t peak_bytes;   /* bytes of the planned buffer */
    size_t naive_bytes;  /* sum of all planned results, if none were reused */
    int n_planned;       /* results placed by the planner */
};

/* Plans memory for every op result. buf: where the block lives (NULL: the
 * graph keeps its own). Returns TOY_ERR_NOMEM if the block cannot grow, or
 * TOY_ERR_STATE naming a leaf tensor without data. */
enum toy_status toy_graph_plan(struct toy_graph *g, struct toy_membuf *buf,
                               struct toy_plan_info *info);

/* Inference graphs: fold RMSNorm, SwiGLU and residual adds into the small
 * matrix products next to them (rows <= 8: decode steps), run products of
 * the same input in one pass, and let a decode attention do its ROPEs and
 * KV stores. On the CPU each thread then computes them for its own share
 * instead of one thread running them while the others wait (and the
 * products before a decode attention fetch its cache rows ahead); on CUDA
 * a decode step launches far fewer kernels. Same results, bit for bit.
 * Applied once, when the graph is next planned, for the backend it runs on
 * then, if the graph has no backward pass; a fused graph cannot move to
 * another backend afterwards. Off by default ($TOY_FUSE=0 keeps it off);
 * build the whole graph before the first plan. */
void toy_graph_set_fusion(struct toy_graph *g, bool on);

/* Runs the graph (planned first). tp NULL: single-threaded. */
enum toy_status toy_graph_compute(struct toy_graph *g, struct toy_threadpool *tp);
/* Sets every parameter gradient in g to zero. */
void toy_graph_zero_grads(struct toy_graph *g);

/* Called on the calling thread after each node of toy_graph_compute has run
 * (every worker is done with it), with the node's index; views, which are
 * resolved rather than run, are skipped. For consumers that act as soon as
 * a result is final, e.g. the all-reduce of the gradients the backward pass
 * has finished (toy/collective.h, toy_grad_sync_on_node). The callback must
 * not touch results that later nodes read or write. NULL turns it off (the
 * default; then compute pays one untaken branch per node). */
typedef void (*toy_graph_node_fn)(void *ud, int node);
void toy_graph_set_node_callback(struct toy_graph *g, toy_graph_node_fn fn, void *ud);

/* For each params[i], the index of the last node that writes its
 * persistent gradient (an ACCUM, accumulating MATMUL or GET_ROWS_BACK node
 * whose last source is params[i]->grad), or -1 when no node does: once
 * that node has run, the gradient is final for this run of the graph.
 * Nodes run in index order, so sorting parameters by it gives the order in
 * which the backward pass finishes them (the output layer first). */
void toy_graph_grad_last_writers(const struct toy_graph *g, struct toy_tensor *const *params, int n, int *out);

/* Optional per-op timing: when on, compute adds each node's wall time to
 * the op's bucket (microseconds). */
void toy_graph_set_timing(struct toy_graph *g, bool on);
const double *toy_graph_op_times_us(const struct toy_graph *g); /* [TOY_OP_COUNT] */

/* Records every node's run, per thread, into a Chrome trace (toy/trace.h);
 * NULL turns it off. */
struct toy_trace;
void toy_graph_set_trace(struct toy_graph *g, struct toy_trace *tr);

/* Prints the nodes (op, shape, name) for debugging. */
void toy_graph_print(const struct toy_graph *g, void *file /* FILE* */);

#ifdef __cplusplus
}
#endif
#endif
