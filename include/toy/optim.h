/* toy/optim.h: optimizers over trainable tensors, gradient clipping and
 * learning-rate schedules.
 *
 * An optimizer holds its own state (AdamW moments, SGD momentum) for the
 * parameters added to it; each parameter belongs to a group with its own
 * settings (e.g. no weight decay for norms and biases). A step reads p->grad
 * (filled by running a graph after toy_graph_backward) and updates p->data
 * with fused kernels over each parameter's buffer, on the thread pool.
 *
 *     struct toy_optim *opt = toy_optim_new(TOY_OPTIM_ADAMW);
 *     int decay = toy_optim_add_group(opt, &(struct toy_optim_group){
 *         .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f});
 *     toy_optim_add_param(opt, w, decay);
 *     ...  toy_graph_compute(g, tp);                  // accumulates w->grad
 *     float norm = toy_optim_clip_grad_norm(opt, 1.0f, tp);
 *     toy_optim_step(opt, toy_lr_at(&sched, step), tp);
 *     toy_optim_zero_grad(opt);
 *
 * AdamW follows torch.optim.AdamW exactly (bias correction, decoupled weight
 * decay, eps added after the bias-corrected sqrt); SGD follows torch.optim.SGD
 * (momentum buffer = gradient at the first step, L2 weight decay).
 *
 * On a device. When the graph that computes the gradients runs on a CUDA
 * device (toy/device.h), an AdamW optimizer that is not sharded moves to
 * that device at its first call after such a run (one upload of the
 * parameters, gradients and moments) and stays there: zero_grad,
 * scale_grads, the norm and clipping, and the step run on the device, and
 * graphs on it read the parameters and accumulate the gradients in the
 * optimizer's copies, so a training step copies neither parameters nor
 * gradients. The device holds the truth; host copies (p->data,
 * p->grad->data, the moments) are stale until something brings them up to
 * date: toy_optim_sync_host, a checkpoint write (toy_optim_write_gguf*,
 * which also refreshes the parameters), toy_optim_state,
 * toy_optim_release_device or toy_optim_free. Writes on the host do not
 * reach the device, except the moments read by toy_optim_read_gguf: to
 * change parameters or gradients on the host (or reduce gradients there,
 * as data parallelism does), release the device first or turn it off with
 * toy_optim_set_device_resident(opt, false) (TOY_CUDA_OPTIM=0 in the
 * environment does that for every optimizer; so does starting under a
 * launcher of several ranks, unless TOY_CUDA_OPTIM=1). The results are
 * the CPU's within float rounding: AdamW is the same arithmetic in the
 * same order, the norm's double sum adds in another order. In a CPU-only
 * build none of this happens.
 */
#ifndef TOY_OPTIM_H
#define TOY_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/tensor.h"
#include "toy/threadpool.h"

#ifdef __cplusplus
extern "C" {
#endif

enum toy_optim_kind { TOY_OPTIM_ADAMW = 0, TOY_OPTIM_SGD = 1 };

struct toy_optim_group {
    float lr_scale;      /* multiplies the step's lr; 0 means 1 */
    float beta1, beta2;  /* AdamW (0.9, 0.999 when both 0) */
    float eps;           /* AdamW; 0 means 1e-8 */
    float weight_decay;  /* AdamW: decoupled; SGD: L2 */
    float momentum;      /* SGD */
};

struct toy_optim;

/* Checks a run's optimizer settings before anything is built: TOY_OK, or
 * TOY_ERR_INVALID_ARG naming the first that is out of range (lr, lr_min,
 * weight_decay, eps, clip: finite and >= 0; beta1, beta2 in [0, 1)). The
 * trainer, the finetuner and the classifier call it. */
enum toy_status toy_optim_check_settings(float lr, float lr_min, float weight_decay, float beta1, float beta2,
                                         float eps, float clip);

struct toy_optim *toy_optim_new(enum toy_optim_kind kind);
/* On a device, copies the parameters back to the host first (not the
 * gradients, which their owner may have released already). */
void toy_optim_free(struct toy_optim *opt);
/* Returns the new group's index. */
int toy_optim_add_group(struct toy_optim *opt, const struct toy_optim_group *g);
/* p must be F32 and trainable; its state is zero-initialised. */
void toy_optim_add_param(struct toy_optim *opt, struct toy_tensor *p, int group);
int toy_optim_n_params(const struct toy_optim *opt);
struct toy_tensor *toy_optim_param(const struct toy_optim *opt, int i);

/* One update with base learning rate lr. TOY_ERR_STATE if a parameter has no
 * gradient buffer. */
enum toy_status toy_optim_step(struct toy_optim *opt, float lr, struct toy_threadpool *tp);
/* Global L2 norm of all gradients (double accumulation); if max_norm > 0 and
 * the norm exceeds it, scales every gradient by max_norm / (norm + 1e-6)
 * (torch.nn.utils.clip_grad_norm_). Returns the norm before clipping.
 * Sharded, "all" means the owned ranges: use the two halves below with the
 * sum over the ranks in between. */
float toy_optim_clip_grad_norm(struct toy_optim *opt, float max_norm, struct toy_threadpool *tp);
/* The halves of toy_optim_clip_grad_norm: the sum of squares of the
 * gradients (owned ranges, when sharded), and the clipping given the sum
 * over everything (returns the norm). */
double toy_optim_grad_sumsq(struct toy_optim *opt, struct toy_threadpool *tp);
float toy_optim_clip_to(struct toy_optim *opt, double sumsq, float max_norm, struct toy_threadpool *tp);
/* Multiplies every gradient by s (e.g. 1/accumulation steps). */
void toy_optim_scale_grads(struct toy_optim *opt, float s, struct toy_threadpool *tp);
void toy_optim_zero_grad(struct toy_optim *opt);

/* On a device (see the top): whether the optimizer works there now; copy
 * parameters, gradients and moments to the host (the device stays the
 * truth); or come back to the host (copies first; the next call may move
 * again). Allowing the device (the default, unless TOY_CUDA_OPTIM=0 or
 * several ranks) or not; turning it off releases. Errors: TOY_ERR_BACKEND / TOY_ERR_NOMEM
 * with the CUDA error string. */
bool toy_optim_on_device(const struct toy_optim *opt);
enum toy_status toy_optim_sync_host(struct toy_optim *opt);
enum toy_status toy_optim_release_device(struct toy_optim *opt);
enum toy_status toy_optim_set_device_resident(struct toy_optim *opt, bool on);

/* Steps taken so far, and the state buffers of parameter i (NULL when the
 * optimizer has none): for checkpoints and resume. On a device the buffers
 * are brought up to date first; read them, do not write them. */
int64_t toy_optim_step_count(const struct toy_optim *opt);
void toy_optim_set_step_count(struct toy_optim *opt, int64_t steps);
float *toy_optim_state(struct toy_optim *opt, int i, int which /* 0: m or momentum, 1: v */);
/* Bytes of state this optimizer holds (sharded: its ranges only). */
size_t toy_optim_state_bytes(const struct toy_optim *opt);

/* ZeRO-1: keep state and update only for these ranges of the parameters
 * (param = index in add order), e.g. this rank's part of the gradient
 * buckets (toy_grad_sync_shard, toy/collective.h); the other elements are
 * updated by other ranks and all-gathered. The state becomes one flat block
 * per moment, the ranges in the given order (toy_optim_shard_state), reset
 * to zero: shard before loading a checkpoint (toy_optim_read_gguf then
 * reads the owned ranges). The per-parameter state is freed
 * (toy_optim_state returns NULL). Step, clip and scale_grads then touch
 * only the owned ranges. Errors: TOY_ERR_INVALID_ARG (a range outside its
 * parameter), TOY_ERR_NOMEM. */
struct toy_optim_range {
    int param;
    int64_t off, count;
};
enum toy_status toy_optim_shard(struct toy_optim *opt, const struct toy_optim_range *r, int n);
bool toy_optim_sharded(const struct toy_optim *opt);
/* The flat state of a sharded optimizer (*elems floats; NULL unsharded). */
float *toy_optim_shard_state(struct toy_optim *opt, int which, int64_t *elems);

/* The optimizer's state as GGUF tensors (what checkpoints' .state.gguf
 * files hold): opt.m.<param name> (AdamW first moment / SGD momentum) and,
 * for AdamW, opt.v.<param name>, f32, shaped like the parameter. Reading
 * checks every tensor's presence, type and size (TOY_ERR_FORMAT / _SHAPE
 * naming the file and tensor) and leaves the step count to the caller. */
struct toy_gguf;
struct toy_gguf_writer;
enum toy_status toy_optim_write_gguf(struct toy_optim *opt, struct toy_gguf_writer *w);
/* The same from whole-parameter arrays m[i], v[i] (param i's elements; v
 * unused by SGD), e.g. a sharded state gathered on one rank. The arrays
 * must stay valid until the write. */
enum toy_status toy_optim_write_gguf_state(struct toy_optim *opt, struct toy_gguf_writer *w, float *const *m,
                                           float *const *v);
enum toy_status toy_optim_read_gguf(struct toy_optim *opt, const struct toy_gguf *g);

/* ---- learning-rate schedules ---- */

enum toy_lr_kind { TOY_LR_CONSTANT = 0, TOY_LR_COSINE = 1, TOY_LR_LINEAR = 2 };

struct toy_lr_schedule {
    enum toy_lr_kind kind;
    float lr;            /* peak */
    float lr_min;        /* floor: the value at step total (cosine, linear); the last step,
                            total - 1, is just above it, as in PyTorch */
    int64_t warmup;      /* linear warmup steps from lr/warmup to lr */
    int64_t total;       /* total steps */
};

/* The learning rate of step `step` (0-based). */
float toy_lr_at(const struct toy_lr_schedule *s, int64_t step);
/* Parses "constant" / "cosine" / "linear"; -1 if unknown. */
int toy_lr_kind_from_name(const char *name);

#ifdef __cplusplus
}
#endif
#endif
