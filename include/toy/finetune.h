/* toy/finetune.h: fine-tuning Llama-family GGUF models: LoRA adapters
 * (PEFT semantics), QLoRA (the same adapters over a quantized, mapped base),
 * full fine-tuning, supervised fine-tuning (SFT) data with the loss on
 * completion tokens only, adapter files in llama.cpp's convention, merging,
 * warm start from a donor's embeddings, and the fine-tuning loop behind
 * `toy finetune`.
 *
 *     struct toy_llama *m;
 *     toy_llama_load("smollm2.q4_0.gguf", false, &m);      // mapped, frozen
 *     struct toy_lora *lora;
 *     struct toy_lora_opts lo = {.rank = 8, .alpha = 16, .targets = TOY_LORA_DEFAULT_TARGETS, .seed = 42};
 *     toy_lora_attach(m, &lo, &lora);                        // A Kaiming-uniform, B = 0
 *     struct toy_sft *data;
 *     toy_sft_open("sft.jsonl", tok, &(struct toy_sft_opts){.ctx = 256, .heldout = 0.1, .seed = 1}, &data);
 *     struct toy_finetuner *ft;
 *     toy_finetuner_new(m, lora, tok, data, &opts, "runs/ft-1", events, 0, &ft);
 *     toy_finetuner_run(ft, &result);          // adapter checkpoints in runs/ft-1/weights/
 *     toy_finetuner_free(ft); toy_sft_free(data); toy_lora_free(lora); toy_llama_free(m);
 *
 * LoRA. For a target projection y = x W^T with W (out, in) (GGUF ne {in,
 * out}), the adapted projection is y = x W^T + (alpha / r) (drop(x) A^T) B^T
 * with A (r, in) (ne {in, r}) initialised Kaiming-uniform(a = sqrt 5), i.e.
 * U(-1/sqrt(in), 1/sqrt(in)), and B (out, r) (ne {r, out}) zero, exactly as
 * PEFT's LoraLayer does; drop() is inverted dropout with probability p (a new
 * mask per layer, target and micro-step, from a seeded generator). Only A
 * and B are trainable; the base stays as mapped from the file in its own
 * dtype, so a Q4_0 base is QLoRA with no dequantized copy.
 *
 * Adapter files are llama.cpp's LoRA GGUF (src/llama-adapter.cpp,
 * convert_lora_to_gguf.py): general.type = "adapter", adapter.type =
 * "lora", adapter.lora.alpha (f32), general.architecture = the base's, and
 * per adapted weight the pair "<weight name>.lora_a" ne {in, r} and
 * "<weight name>.lora_b" ne {r, out} in F32 (e.g. blk.0.attn_q.weight.lora_a),
 * so `llama-cli --lora` applies toy's adapters. The effective scale is
 * lora_scale * alpha / r, with r read from lora_a's ne[1].
 *
 * SFT data: JSONL, one example a line, either {"prompt": P, "completion": C}
 * (ids = [BOS] enc(P) enc(C) [EOS], learning enc(C) and EOS) or
 * {"messages": [{"role", "content"}, ...]} rendered with the model's chat
 * template (or a named built-in) through toy_chat_encode, learning the
 * assistant turns. An example of n ids is n-1 (input, target) positions,
 * truncated to T. Unpacked, each example is one row of T positions padded
 * with target -100 (ignored). Packed (the fine-tuning default), examples are
 * placed first-fit into the B rows of a micro-batch in their shuffled order,
 * each with its own document id and positions 0, 1, ... (padding-free, as
 * TRL's packing with position_ids): attention stays inside each document
 * (toy_attention_seg), so each example's loss and gradient are those it
 * gets alone in a row, and only the tail of a row is padding. The last
 * `heldout` fraction of the examples is held out for evaluation. Training
 * examples come in a seeded random order per epoch (epoch e shuffles with
 * seed + e), so the sampler's state is just (epoch, position).
 */
#ifndef TOY_FINETUNE_H
#define TOY_FINETUNE_H

#include <stdbool.h>
#include <stdint.h>

#include "toy/events.h"
#include "toy/llama.h"
#include "toy/rng.h"
#include "toy/tokenizer.h"
#include "toy/trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_gguf_writer;

/* ---- LoRA adapters ---------------------------------------------------------- */

#define TOY_LORA_DEFAULT_TARGETS ((1u << TOY_LORA_Q) | (1u << TOY_LORA_V))

struct toy_lora_opts {
    int32_t rank;       /* r >= 1 */
    float alpha;        /* scale = alpha / r; 0 means alpha = r */
    unsigned targets;   /* bit (1u << enum toy_lora_target) per target; 0: q,v */
    float dropout;      /* in [0, 1) */
    uint64_t seed;      /* A's init and the dropout masks */
};

struct toy_lora;

/* Parses "q,v", "q,k,v,o,gate,up,down", PEFT's "q_proj,v_proj,...", or
 * "all" / "attn" / "mlp". TOY_ERR_INVALID_ARG naming an unknown target. */
enum toy_status toy_lora_parse_targets(const char *s, unsigned *targets);
/* "q,v" for a mask (static storage per call is not used: writes into buf). */
const char *toy_lora_targets_str(unsigned targets, char *buf, size_t size);

/* Creates trainable A, B for every layer and target of m (which must have no
 * adapter attached) and sets m->lora_scale = alpha / r. The adapter belongs
 * to the caller; toy_lora_free detaches it from the model. */
enum toy_status toy_lora_attach(struct toy_llama *m, const struct toy_lora_opts *o, struct toy_lora **out);
/* Loads an adapter GGUF onto m: checks general.type/adapter.type, the
 * architecture, that every pair names a target projection of m with
 * matching shapes (llama.cpp's checks), and one rank throughout; sets
 * m->lora_scale = scale * alpha / r. trainable: A and B become parameters
 * (to continue training). Errors: TOY_ERR_FORMAT, TOY_ERR_SHAPE,
 * TOY_ERR_UNSUPPORTED (a pair on a tensor toy cannot adapt). */
enum toy_status toy_lora_load(struct toy_llama *m, const char *path, float scale, bool trainable,
                              struct toy_lora **out);
/* Detaches (the model's lora pointers become NULL, lora_scale 0) and frees.
 * NULL is a no-op. */
void toy_lora_free(struct toy_lora *a);

const struct toy_lora_opts *toy_lora_get_opts(const struct toy_lora *a);
/* The A and B tensors in file order (layer, target, a then b). */
int toy_lora_n_tensors(const struct toy_lora *a);
struct toy_tensor *toy_lora_tensor(const struct toy_lora *a, int i);
int64_t toy_lora_n_params(const struct toy_lora *a);

/* Adds the adapter's metadata and tensors to a writer (data borrowed until
 * the write). */
enum toy_status toy_lora_write_gguf(const struct toy_lora *a, struct toy_gguf_writer *w);
/* Writes the adapter file atomically. */
enum toy_status toy_lora_save(const struct toy_lora *a, const char *path);

/* Dropout: allocates masks for inputs of T positions x B rows and points
 * the model's lora_mask at them (graphs built afterwards apply them; build
 * evaluation graphs before, or after toy_lora_dropout_end). Each call adds
 * a set (one per graph shape); the masks live until toy_lora_free. No-op
 * when the dropout is 0. toy_lora_dropout_refresh draws new values for
 * every set (call before each micro-step); the generator's state is in the
 * state file. */
enum toy_status toy_lora_dropout_begin(struct toy_lora *a, int64_t T, int64_t B);
void toy_lora_dropout_refresh(struct toy_lora *a);
void toy_lora_dropout_end(struct toy_lora *a);
struct toy_rng *toy_lora_rng(struct toy_lora *a);

/* Folds the adapter into a trainable (f32 data) model: W += scale B A for
 * each pair, then detaches nothing (the adapter stays attached; free it to
 * stop applying it twice). TOY_ERR_UNSUPPORTED for non-F32 weights. */
enum toy_status toy_lora_merge_into(struct toy_llama *m, const struct toy_lora *a);
/* `toy merge`: writes base + scale * alpha/r * B A as a new GGUF with the
 * base's metadata and every other tensor as it was; adapted weights keep the
 * base's dtype (quantized ones are dequantized, merged, re-quantized with the
 * same type). */
enum toy_status toy_lora_merge_file(const char *base_path, const char *adapter_path, float scale,
                                    const char *out_path);

/* ---- SFT data --------------------------------------------------------------- */

struct toy_sft_opts {
    int64_t ctx;              /* T: positions per row */
    double heldout;           /* fraction of the examples held out, in [0, 1) */
    uint64_t seed;
    const char *chat_template; /* NULL: the tokenizer's (else "chatml") for {"messages"} examples */
};

struct toy_sft_state {
    int64_t epoch, pos;       /* the next example: position pos of epoch's order */
    int64_t rows, tokens;     /* rows and target tokens handed out so far */
};

struct toy_sft;

/* Reads and tokenizes a JSONL file (read to its end by toy_file_read_all,
 * so "-" is standard input and a pipe or FIFO reads as a file does), or
 * the text in memory. Lines that are blank are skipped; a line that is not
 * one of the two shapes is TOY_ERR_FORMAT naming the line. Examples with no
 * target token within T+1 tokens are dropped (counted in toy_sft_dropped).
 * TOY_ERR_RANGE when no training example is left. */
enum toy_status toy_sft_open(const char *path, const struct toy_tokenizer *tok, const struct toy_sft_opts *o,
                             struct toy_sft **out);
enum toy_status toy_sft_from_text(const char *text, size_t len, const struct toy_tokenizer *tok,
                                  const struct toy_sft_opts *o, struct toy_sft **out);
void toy_sft_free(struct toy_sft *d);

int64_t toy_sft_n_train(const struct toy_sft *d);
int64_t toy_sft_n_heldout(const struct toy_sft *d);
int64_t toy_sft_dropped(const struct toy_sft *d);
int64_t toy_sft_ctx(const struct toy_sft *d);
/* Example i (0-based over train then held-out): its ids and per-id target
 * mask (1: learned). */
void toy_sft_example(const struct toy_sft *d, int64_t i, const int32_t **ids, const unsigned char **mask,
                     int64_t *n);
/* A 64-bit hash of every example's ids and target mask and of the
 * train/held-out split: what a run records so that resuming it on other
 * data is refused (toy_data_fingerprint's counterpart). */
uint64_t toy_sft_fingerprint(const struct toy_sft *d);

/* Fills x, y (B, T) with the next B training examples (the order reshuffles
 * each epoch): x the ids, y[t] = ids[t+1] where that id is learned, else
 * -100; positions past an example are x = pad, y = -100. */
void toy_sft_next_batch(struct toy_sft *d, int64_t B, int32_t *x, int32_t *y);
/* Packed micro-batch: fills x, y (B, T) and pos, seg (B, T) with the next
 * training examples placed first-fit into B rows (y as in
 * toy_sft_next_batch; pos restarts at 0 for each example; seg numbers the
 * examples of a row 0, 1, ... and is -1 on the padded tail of a row). Stops at
 * the first example that fits in no row or at the end of the epoch (the
 * next call starts the next epoch). Returns the examples placed (>= 1), or
 * -1 on out-of-memory (the first call for a batch size allocates B row
 * counters; later calls allocate nothing). */
int64_t toy_sft_next_packed(struct toy_sft *d, int64_t B, int32_t *x, int32_t *y, int32_t *pos, int32_t *seg);
/* Packed micro-batches the first `epochs` epochs make (the packing depends
 * on each epoch's order), and in *positions (may be NULL) the positions they
 * fill with example tokens (out of batches * B * T). -1 on out-of-memory. */
int64_t toy_sft_packed_batches(const struct toy_sft *d, int64_t B, int64_t epochs, int64_t *positions);
/* Held-out examples first .. first+B-1 (rows past the end all -100);
 * returns the real rows. */
int64_t toy_sft_eval_batch(const struct toy_sft *d, int64_t first, int64_t B, int32_t *x, int32_t *y);
/* Example positions ((input, target) pairs) handed out by the two batch
 * functions since the data was opened: with the positions run, the packing
 * efficiency (statistics only, not part of the state). */
int64_t toy_sft_positions(const struct toy_sft *d);
void toy_sft_get_state(const struct toy_sft *d, struct toy_sft_state *s);
void toy_sft_set_state(struct toy_sft *d, const struct toy_sft_state *s);

/* ---- warm start --------------------------------------------------------------- */

struct toy_warm_start_report {
    int64_t mapped, unmapped;   /* model tokens found in the donor / left at their init */
    int64_t donor_d, model_d;
    bool projected;             /* widths differ: went through the donor's PCA */
    bool learned;               /* ... and that projection is attached as a trainable m->embd_proj */
    double explained;           /* fraction of the donor's variance the kept directions hold */
};

/* Initialises m's token embeddings (f32, in memory) from the donor GGUF's
 * token_embd: tokens matched by piece text through tok and the donor's
 * tokenizer (or by id when the vocabularies have one size and either
 * tokenizer is missing); equal widths copy, different widths project onto
 * the donor's top principal directions, rescaled to the donor's RMS. A tied
 * head follows. When widths differ and token_embd is trainable, the
 * projection stays learnable: the embedding table becomes D P + R (D the
 * centred donor rows, frozen; P {d_model, d_donor} initialised from the
 * PCA, trainable: m->embd_proj, listed by toy_llama_tensor; R = token_embd,
 * the residual), equal to the PCA embedding at the start; writing the model
 * folds it into a plain token_embd.weight (toy_llama_embd_proj_fold folds
 * it in memory). Build graphs after this call. rep may be NULL. */
enum toy_status toy_llama_warm_start(struct toy_llama *m, const struct toy_tokenizer *tok, const char *donor_path,
                                     struct toy_warm_start_report *rep);

/* ---- the fine-tuning loop --------------------------------------------------- */

enum toy_ft_method { TOY_FT_LORA = 0, TOY_FT_QLORA = 1, TOY_FT_FULL = 2 };
const char *toy_ft_method_name(enum toy_ft_method m);
int toy_ft_method_from_name(const char *s); /* -1 if unknown */

struct toy_finetune_opts {
    struct toy_train_opts train; /* steps (0: from epochs), accum, lr, schedule, clip, eval, ckpt, ... */
    enum toy_ft_method method;
    int64_t batch;               /* examples per micro-batch */
    int64_t epochs;              /* used when train.steps is 0 */
    bool freeze_embeddings;      /* full: token_embd (and a tied head) stay fixed */
    bool no_pack;                /* one example per row instead of packed rows (toy_sft_next_packed) */
    int rank, world;             /* data parallelism (toy_finetuner_set_collective); 0, 0: one process */
};

struct toy_finetuner;

/* Borrows everything. lora: the attached adapter (LoRA/QLoRA; its tensors
 * are the only parameters), or NULL for a full fine-tune (every trainable
 * tensor of m). QLoRA needs quantized base projections (TOY_ERR_INVALID_ARG
 * otherwise). Checkpoints in <run_dir>/weights/step_N.gguf are the adapter
 * (LoRA) or the whole model with the tokenizer (full), each with a
 * step_N.state.gguf sidecar (moments, step, data and dropout state, opts). */
enum toy_status toy_finetuner_new(struct toy_llama *m, struct toy_lora *lora, const struct toy_tokenizer *tok,
                                  struct toy_sft *data, const struct toy_finetune_opts *o, const char *run_dir,
                                  struct toy_events *ev, int n_threads, struct toy_finetuner **out);
void toy_finetuner_free(struct toy_finetuner *f);
void toy_finetuner_on_step(struct toy_finetuner *f, toy_step_fn fn, void *ud);
int64_t toy_finetuner_steps(const struct toy_finetuner *f); /* the total the run goes to */
int64_t toy_finetuner_step(const struct toy_finetuner *f);
enum toy_status toy_finetuner_run(struct toy_finetuner *f, struct toy_train_result *res);
/* Mean held-out loss over the completion tokens of up to n_batches batches (0: all). */
enum toy_status toy_finetuner_eval(struct toy_finetuner *f, int64_t n_batches, float *loss);
enum toy_status toy_finetuner_checkpoint(struct toy_finetuner *f, char *path, size_t path_size);
enum toy_status toy_finetuner_load_state(struct toy_finetuner *f, const char *state_path);
/* Data parallelism (mpirun -np N toy finetune), with opts.rank / opts.world
 * set: every rank draws the same sequence of micro-batches and computes
 * every world-th one (rank r the r-th of each group of world), so the ranks
 * see disjoint rows, the sampler state is the same everywhere and resumes
 * on any number of ranks, and N ranks with batch B step through the rows a
 * single process with batch B and accum x N would. After the backward
 * passes allreduce (toy_collective_allreduce_grads) replaces each gradient
 * by its mean over the ranks, and reduce (toy_collective_reduce_sum) sums
 * the step's loss, target tokens and stop requests, so every rank sees the
 * same loss (a NaN stops all) and a Ctrl-C on any rank stops all after the
 * same step. An epoch takes N times fewer steps. Rank 0 alone writes
 * checkpoints (give the others no events). A failed collective ends the run
 * TOY_RUN_ERRORED. Call before toy_finetuner_run. */
/* The tensors the optimizer updates, in its order (the same on every rank). */
int toy_finetuner_params(const struct toy_finetuner *f, struct toy_tensor *const **params);
enum toy_status toy_finetuner_set_collective(struct toy_finetuner *f, toy_allreduce_fn allreduce,
                                             toy_reduce_sum_fn reduce, void *ud);
/* What the fine-tune holds besides the base: the planned activation buffer
 * (shared by the training and evaluation graphs) and the trainable tensors
 * with their gradients and AdamW moments (4 f32 per parameter). */
size_t toy_finetuner_activation_bytes(const struct toy_finetuner *f);
/* Fraction of the positions the training graphs ran so far that held
 * example tokens (the rest is padding); NAN before the first step. */
double toy_finetuner_pack_efficiency(const struct toy_finetuner *f);
size_t toy_finetuner_trainable_bytes(const struct toy_finetuner *f);

#ifdef __cplusplus
}
#endif
#endif
