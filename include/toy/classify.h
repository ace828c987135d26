/* toy/classify.h: training and evaluating a ViT image classifier
 * (toy/vit.h) on labelled image sets (toy/images.h): random batches with
 * optional crop/flip augmentation, AdamW (no weight decay on LayerNorms,
 * biases, class token and position embeddings), warmup + cosine schedule,
 * global-norm clipping, held-out accuracy, the toy/v1 event stream, and
 * checkpoints that resume exactly.
 *
 * A checkpoint is <run>/weights/step_<N>.gguf (the ViT GGUF, with the
 * normalisation and class names, that `toy classify` reads) plus
 * step_<N>.state.gguf (AdamW moments opt.m.<name>/opt.v.<name>, the step
 * and the batch sampler's generator), and `latest` points at the newest.
 *
 *     struct toy_classifier *t;
 *     toy_classifier_new(vit, train, test, &opts, "runs/vit-1", events, 0, &t);
 *     toy_classifier_run(t, &res);        // res.test_acc
 *     toy_classifier_free(t);
 *
 * Events: the classifier writes step and eval (with "accuracy" in extra)
 * events; the caller writes run_start and run_end around the run.
 *
 * Batches: each step draws opts.batch training images uniformly with
 * replacement from a toy_rng seeded with opts.seed (the only sampler state).
 * Inputs are normalised with the model's mean/std (toy_classifier_new sets
 * them from the training set's statistics when the model has none, i.e.
 * mean 0 and std 1).
 */
#ifndef TOY_CLASSIFY_H
#define TOY_CLASSIFY_H

#include <signal.h>
#include <stdint.h>

#include "toy/events.h"
#include "toy/images.h"
#include "toy/optim.h"
#include "toy/threadpool.h"
#include "toy/vit.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_classify_opts {
    int64_t steps, batch;
    float lr, lr_min;
    int64_t warmup;
    enum toy_lr_kind schedule;
    float weight_decay, beta1, beta2, eps, clip;
    uint64_t seed;
    int64_t eval_every;      /* steps between held-out evaluations; 0: only at the end */
    int64_t ckpt_every;      /* steps between checkpoints; 0: only at the end */
    struct toy_image_aug aug;
    volatile sig_atomic_t *stop; /* set to stop after the current step (with a checkpoint) */
};

struct toy_classify_step {
    int64_t step, steps;
    float loss, lr, grad_norm;
    double elapsed_s;
    float test_loss, test_acc; /* NAN unless this step evaluated */
};

typedef void (*toy_classify_step_fn)(void *ud, const struct toy_classify_step *s);

struct toy_classify_result {
    enum toy_run_reason reason;
    int64_t final_step;
    float final_loss, test_loss, test_acc;
    double seconds, images_per_s;
    char checkpoint[1200];
};

struct toy_classifier;

/* Borrows m, the sets and ev (may be NULL); run_dir may be NULL (then no
 * checkpoints). The image shape must match the model's. */
enum toy_status toy_classifier_new(struct toy_vit *m, const struct toy_image_set *train,
                                   const struct toy_image_set *test, const struct toy_classify_opts *o,
                                   const char *run_dir, struct toy_events *ev, int n_threads,
                                   struct toy_classifier **out);
void toy_classifier_free(struct toy_classifier *t);
void toy_classifier_on_step(struct toy_classifier *t, toy_classify_step_fn fn, void *ud);
enum toy_status toy_classifier_run(struct toy_classifier *t, struct toy_classify_result *res);
enum toy_status toy_classifier_checkpoint(struct toy_classifier *t, char *path, size_t path_size);
enum toy_status toy_classifier_load_state(struct toy_classifier *t, const char *state_path);
int64_t toy_classifier_step(const struct toy_classifier *t);

/* Mean cross-entropy and accuracy of m over every image of s (batches of
 * `batch`; normalised with m's mean/std). tp may be NULL. */
enum toy_status toy_vit_evaluate(struct toy_vit *m, const struct toy_image_set *s, int64_t batch,
                                 struct toy_threadpool *tp, float *loss, float *acc);

#ifdef __cplusplus
}
#endif
#endif
