/* toy/data.h: training data for language models: a token stream (a packed
 * TOYT token file, mmapped, or ids in memory), split into a training part
 * and a held-out tail, with seeded random batches for training and
 * sequential windows for evaluation.
 *
 *     struct toy_data *d;
 *     struct toy_data_opts o = {.batch = 8, .ctx = 256, .heldout = 0.1, .seed = 42};
 *     if (toy_data_open("tokens.bin", &o, &d)) { fprintf(stderr, "%s\n", toy_last_error()); ... }
 *     int32_t *x = malloc(8 * 256 * 4), *y = malloc(8 * 256 * 4);   // (B, T) each
 *     toy_data_next_batch(d, x, y);          // y[b*T + t]: the token after x[b*T + t]
 *     struct toy_data_state s;
 *     toy_data_get_state(d, &s);             // save with the checkpoint ...
 *     toy_data_set_state(d, &s);             // ... and on resume: the same batches follow
 *     for (int64_t w = 0; w < toy_data_eval_windows(d); w += 8)
 *         toy_data_eval_batch(d, w, x, y, -100);   // rows past the end: y = -100 (ignored)
 *     toy_data_free(d);
 *
 * The file format ("TOYT", written by `toy tokenize --corpus`; docs/formats.md):
 * all little-endian, magic "TOYT", u32 version = 1, u32 vocabulary size,
 * u64 token count, then count u32 ids. Opening checks the magic, the
 * version, that the file holds exactly 20 + 4*count bytes, and every id
 * against the vocabulary (up front, so training never meets a bad id); a
 * failure is TOY_ERR_FORMAT / TOY_ERR_UNSUPPORTED / TOY_ERR_RANGE with a
 * message naming the file, the field or token index, and the byte offset.
 *
 * Split: the last floor(count * heldout) tokens are held out; training rows
 * never read them, evaluation reads nothing else. With opts.eval_only the
 * whole stream is the held-out part (what `toy eval` reads without
 * --heldout): there are no training rows, heldout is ignored, and
 * toy_data_next_batch must not be called.
 *
 * Training batches: a row is T+1 consecutive tokens starting at a uniformly
 * random offset in the training part (inputs x = the first T, targets y =
 * the last T). Offsets come from a toy_rng seeded with opts.seed, so the
 * stream of batches is a function of (seed, data, B, T, world) only; the
 * state (generator + counters) is a plain struct to save with a checkpoint.
 *
 * Sharding (data parallelism): with world ranks, every rank draws the same
 * global batch of B*world rows and keeps rows [rank*B, (rank+1)*B), so the
 * ranks' rows are disjoint draws whose union is exactly what one process
 * with batch B*world draws; the state is the same on every rank. Held-out
 * window i belongs to rank i % world.
 *
 * Evaluation windows: window i is the T+1 held-out tokens starting T*i into
 * the held-out part, so consecutive windows overlap by one token and every
 * held-out token after the first is predicted exactly once; a tail shorter
 * than a window is left out.
 *
 * A toy_data is not thread-safe for toy_data_next_batch / set_state; the
 * read-only functions may run concurrently. An opened file is mapped, not
 * copied: replace it by rename (as toy tokenize does), never truncate it
 * in place while a loader has it open.
 */
#ifndef TOY_DATA_H
#define TOY_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/rng.h"
#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_TOKEN_FILE_MAGIC "TOYT"
#define TOY_TOKEN_FILE_VERSION 1
#define TOY_TOKEN_FILE_HEADER 20 /* magic, version, vocab, count */

struct toy_data_opts {
    int64_t batch;  /* B: rows per batch on this rank, >= 1 */
    int64_t ctx;    /* T: positions per row (a row reads T+1 tokens), >= 1 */
    double heldout; /* fraction of the stream held out at the end, in [0, 1) */
    uint64_t seed;
    int rank, world; /* this process among `world` (world 0 means 1) */
    bool eval_only;  /* every token is held out, for evaluation alone (no training part) */
};

/* Everything that decides the batches still to come: save it with a
 * checkpoint, give it back to toy_data_set_state on resume. Plain data of
 * fixed-width fields (88 bytes, no padding). */
struct toy_data_state {
    struct toy_rng rng; /* the generator after the last batch drawn */
    int64_t batches;    /* training batches drawn so far */
    int64_t tokens;     /* training tokens this rank has handed out (batches * B * T) */
    uint64_t seed;      /* what it was seeded with */
    int64_t batch;      /* B, T, world and the training part's length: a state */
    int64_t ctx;        /* fits a loader with the same T, training part and */
    int64_t world;      /* global batch B*world */
    int64_t n_train;
};

struct toy_data;

/* Opens a TOYT token file by mmap and validates it (see above). Also checks
 * that the training part holds at least T+1 tokens and the held-out part,
 * if heldout > 0, at least one window (T+1 tokens); with eval_only, that
 * the whole stream holds one window. Errors: TOY_ERR_IO,
 * TOY_ERR_FORMAT, TOY_ERR_UNSUPPORTED (version), TOY_ERR_RANGE (an id >=
 * vocab, a split too small), TOY_ERR_INVALID_ARG (opts). A path that is
 * not a regular file (a pipe, /dev/stdin, a FIFO) cannot be mapped: it is
 * read whole into memory and checked the same way. */
enum toy_status toy_data_open(const char *path, const struct toy_data_opts *o, struct toy_data **out);

/* The same over the bytes of a TOYT file already in memory (size bytes at
 * `bytes`, which need no alignment; the ids are copied), e.g. one read
 * from a pipe. `name` (NULL: "token data") names them in messages. */
enum toy_status toy_data_from_token_bytes(const void *bytes, size_t size, const char *name,
                                          const struct toy_data_opts *o, struct toy_data **out);

/* The same over ids in memory (text tokenized on the fly); the ids are
 * copied. Every id must be in [0, vocab) (TOY_ERR_RANGE naming the index). */
enum toy_status toy_data_from_ids(const int32_t *ids, int64_t n, int64_t vocab, const struct toy_data_opts *o,
                                  struct toy_data **out);

/* NULL is a no-op. */
void toy_data_free(struct toy_data *d);

int64_t toy_data_vocab(const struct toy_data *d);
int64_t toy_data_count(const struct toy_data *d);       /* all tokens */
int64_t toy_data_train_tokens(const struct toy_data *d); /* the training part: tokens [0, n_train) */
int64_t toy_data_heldout_tokens(const struct toy_data *d); /* the held-out part: [n_train, count) */
/* All ids (host order; each < vocab), count of them. Valid until free. */
const uint32_t *toy_data_ids(const struct toy_data *d);
/* A 64-bit hash of the ids, their count and the vocabulary size: what a run
 * records so that resuming it on other data is refused, whatever the file's
 * name, date or format (text or token file) on the way in. */
uint64_t toy_data_fingerprint(const struct toy_data *d);

/* Draws the next training batch (never with eval_only): x and y are (B, T) row-major (row b at
 * x + b*T: the layout of an I32 tensor {T, B}); y[b*T + t] is the token that
 * follows x[b*T + t]. */
void toy_data_next_batch(struct toy_data *d, int32_t *x, int32_t *y);

/* Copies out the sampler's state. */
void toy_data_get_state(const struct toy_data *d, struct toy_data_state *s);

/* Restores a saved state so the next batches are those that followed it.
 * The state may come from another number of ranks if the global batch
 * B*world is the same (4 ranks x B 2 resume as 2 ranks x B 4, drawing the
 * same global rows). Errors: TOY_ERR_STATE when the state was drawn with
 * another global batch, T, seed or training part (the message names which),
 * leaving d unchanged. */
enum toy_status toy_data_set_state(struct toy_data *d, const struct toy_data_state *s);

/* How many held-out windows this rank evaluates (0 without a held-out part). */
int64_t toy_data_eval_windows(const struct toy_data *d);

/* Fills x, y (B, T) with this rank's held-out windows first, first+1, ...,
 * first+B-1; rows past the last window get x = 0 and y = pad (an ignore
 * index such as -100). Returns the number of real rows (0 if first is past
 * the end). Deterministic and stateless. */
int64_t toy_data_eval_batch(const struct toy_data *d, int64_t first, int32_t *x, int32_t *y, int32_t pad);

#ifdef __cplusplus
}
#endif
#endif
