/* toy/trainer.h: the training loop for Llama-family models: batches from a
 * token stream, AdamW with warmup + cosine (or linear/constant) schedule,
 * true gradient accumulation (moments updated once per optimizer step),
 * global-norm clipping, periodic held-out evaluation, checkpoints that resume
 * bit-identically, the toy/v1 event stream, and a clean stop on request.
 *
 * A checkpoint is two files in <run>/weights/:
 *   step_<N>.gguf        a standard GGUF (llama.cpp names and keys, the
 *                        tokenizer in its metadata) that `toy generate` and
 *                        llama.cpp load;
 *   step_<N>.state.gguf  the rest of the training state: AdamW moments
 *                        (tensors opt.m.<name>, opt.v.<name>), the step, the
 *                        data sampler's state, and the options as JSON
 *                        (toy.train.opts), so `--resume` needs no flags;
 * and `latest` points at the newest step_<N>.gguf. Both are written to a
 * temporary name and renamed, the state first.
 *
 *     struct toy_trainer *t;
 *     toy_trainer_new(model, tok, data, &opts, "runs/llama-20261129-001", events, 0, &t); // 0: all cores
 *     toy_trainer_run(t, &result);   // until opts.steps or *opts.stop
 *     toy_trainer_free(t);
 */
#ifndef TOY_TRAINER_H
#define TOY_TRAINER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "toy/data.h"
#include "toy/events.h"
#include "toy/llama.h"
#include "toy/optim.h"
#include "toy/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_train_opts {
    int64_t steps;           /* optimizer steps in total (a resumed run continues to it) */
    int64_t accum;           /* micro-batches per optimizer step (0 counts as 1) */
    float lr, lr_min;        /* peak and floor */
    int64_t warmup;
    enum toy_lr_kind schedule;
    float weight_decay, beta1, beta2, eps;
    float clip;              /* global gradient norm limit; 0: off */
    uint64_t seed;
    int64_t eval_every;      /* steps between held-out evaluations; 0: only at the end */
    int64_t eval_batches;    /* batches per evaluation (0: all held-out windows) */
    int64_t ckpt_every;      /* steps between checkpoints; 0: only at the end */
    bool bf16;               /* bf16 matmuls over f32 master weights */
    const char *sample_prompt; /* text generated at the end ("" none) */
    int32_t sample_tokens;
    volatile sig_atomic_t *stop; /* set (e.g. by SIGINT) to stop after the current step */
    struct toy_trace *trace;     /* Chrome trace of every op and step (toy/trace.h), or NULL */
    bool op_timing;              /* an op_timing event per step (time per op kind) */
    /* a mixture of experts: the weight of its load-balancing term
     * (toy_llama_moe_ffn) in the loss that is differentiated; the loss
     * reported stays the cross-entropy. 0: off */
    float moe_aux;
};

struct toy_step_info {
    int64_t step, steps;
    float loss, lr, grad_norm;
    int64_t tokens_done;    /* this run */
    double elapsed_s;       /* this run */
    float eval_loss;        /* NAN unless this step evaluated */
};

typedef void (*toy_step_fn)(void *ud, const struct toy_step_info *info);

struct toy_train_result {
    enum toy_run_reason reason;
    int64_t final_step;
    float final_loss, final_eval_loss;
    double seconds;
    double tokens_per_s;
    char checkpoint[1200];  /* the last checkpoint written */
};

struct toy_trainer;

/* The trainer borrows the model, tok (may be NULL), data and events (may be
 * NULL) and builds the training graph once. run_dir is made if missing. */
enum toy_status toy_trainer_new(struct toy_llama *m, const struct toy_tokenizer *tok, struct toy_data *data,
                                const struct toy_train_opts *o, const char *run_dir, struct toy_events *ev,
                                int n_threads, struct toy_trainer **out);
/* The same for any language-model family (toy/model.h); lm is copied. */
enum toy_status toy_trainer_new_lm(const struct toy_lm *lm, const struct toy_tokenizer *tok, struct toy_data *data,
                                   const struct toy_train_opts *o, const char *run_dir, struct toy_events *ev,
                                   int n_threads, struct toy_trainer **out);
void toy_trainer_free(struct toy_trainer *t);
void toy_trainer_on_step(struct toy_trainer *t, toy_step_fn fn, void *ud);
/* Restores the optimizer, step and data state from a step_<N>.state.gguf. */
enum toy_status toy_trainer_load_state(struct toy_trainer *t, const char *state_path);
/* Trains until opts.steps, a stop request, or a non-finite loss (which
 * checkpoints the last good weights and reports TOY_RUN_ABORTED). Writes
 * step, eval, sample and run_end events. */
enum toy_status toy_trainer_run(struct toy_trainer *t, struct toy_train_result *res);
/* Mean held-out cross-entropy over up to n_batches batches (0: all). */
enum toy_status toy_trainer_eval(struct toy_trainer *t, int64_t n_batches, float *loss);
/* Writes a checkpoint of the current step now. */
enum toy_status toy_trainer_checkpoint(struct toy_trainer *t, char *path, size_t path_size);
int64_t toy_trainer_step(const struct toy_trainer *t);
/* The prompt + text generated at the end of the last run ("" if none). */
const char *toy_trainer_sample_text(const struct toy_trainer *t);

/* Data parallelism: called once per optimizer step, after the gradients of
 * all micro-batches are in the parameters' grad buffers (already scaled by
 * 1/accum) and before clipping; it must replace each gradient by the mean
 * over all ranks (an all-reduce). params are the trainable tensors in a fixed
 * order (the same on every rank). Return non-OK to stop the run (a rank
 * died, a timeout). rank 0 alone writes events and checkpoints. */
typedef enum toy_status (*toy_allreduce_fn)(void *ud, struct toy_tensor *const *params, int n_params);
void toy_trainer_set_collective(struct toy_trainer *t, toy_allreduce_fn fn, void *ud, int rank, int world);

/* Optional, after toy_trainer_set_collective: fn(ud, v, n) sums v[0..n)
 * element-wise over the ranks, in place on every rank (toy/collective.h's
 * toy_collective_reduce_sum). With it, each step's reported loss is the mean
 * over the global batch (the same on every rank, so a NaN on one rank stops
 * all), evaluation covers every rank's held-out windows, a stop request
 * (opts.stop) on any rank stops all after the same step, and rank 0's step
 * events carry extra {world, rank_tokens_per_s[world], allreduce_us}. A
 * failed collective ends the run TOY_RUN_ERRORED with the data sampler
 * rewound to the start of the failed step, so the final checkpoint resumes
 * exactly. Before each checkpoint the ranks check that their weights hash
 * to rank 0's (a mismatch ends the run TOY_RUN_ERRORED, TOY_ERR_STATE,
 * "the replicas diverged"). Errors: TOY_ERR_NOMEM. */
typedef enum toy_status (*toy_reduce_sum_fn)(void *ud, double *v, int n);
enum toy_status toy_trainer_set_reduce(struct toy_trainer *t, toy_reduce_sum_fn fn);

/* Data parallelism driven by the trainer itself over a collective (instead
 * of the two hooks above, which it sets): the gradients are all-reduced in
 * buckets in the order the backward pass finishes them (toy_grad_sync,
 * toy/collective.h).
 *   overlap: each bucket's all-reduce starts as soon as the last
 *            micro-batch's backward pass has finished writing it (a node
 *            callback of the training graph); the optimizer waits only for
 *            what is still in flight. Off: the same buckets after the
 *            backward pass. Both give the same bits.
 *   zero 1:  ZeRO-1: the AdamW moments are sharded over the ranks; the
 *            gradients are reduce-scattered, each rank updates its part of
 *            the parameters, the parameters are all-gathered. Checkpoints
 *            gather the moments to rank 0 and are the same files as without
 *            it (they resume on any number of ranks, with or without ZeRO).
 *            The update equals plain data parallelism's but for the order
 *            of the gradient norm's sum (bit-identical with clip 0).
 * Call it after toy_trainer_new and before toy_trainer_load_state (a
 * sharded optimizer reads its part of the state). One rank: does nothing.
 * The step events' allreduce_us is then the time the step waited for the
 * gradients after the backward pass (all of the all-reduce without
 * overlap, what overlap did not hide with it).
 * Errors: TOY_ERR_NOMEM, TOY_ERR_UNSUPPORTED (a non-f32 gradient; ZeRO-1
 * over a transport without reduce-scatter), TOY_ERR_STATE (called twice). */
struct toy_collective;
struct toy_dp_opts {
    bool overlap;
    int zero; /* 0 or 1 */
};
enum toy_status toy_trainer_use_collective(struct toy_trainer *t, struct toy_collective *c, const struct toy_dp_opts *o);
/* The optimizer state this rank holds (sharded by ZeRO-1: its part). */
size_t toy_trainer_optim_state_bytes(const struct toy_trainer *t);

/* The trainable tensors in the fixed order the all-reduce gets them (to
 * broadcast rank 0's initial weights); *params is valid until free. */
int toy_trainer_params(const struct toy_trainer *t, struct toy_tensor *const **params);

/* The options as JSON and back (what the state file keeps). */
json_t *toy_train_opts_to_json(const struct toy_train_opts *o);
void toy_train_opts_from_json(struct toy_train_opts *o, const json_t *j);

#ifdef __cplusplus
}
#endif
#endif
