/* data.c: the token data loader: TOYT token files by mmap (validated up
 * front), in-memory id streams, the train / held-out split, seeded random
 * training batches with a saveable state, sharding across ranks, and
 * sequential held-out windows. Contract: include/toy/data.h; the file
 * format: docs/formats.md ("TOYT", written by src/tokenizer/token-file.c).
 *
 * Invariants: every id in d->ids is < vocab <= INT32_MAX (checked once, at
 * open), so batches copy ids without checks; every training row lies in
 * [0, n_train) and every eval window in [n_train, n); the batch stream
 * depends only on (seed, n_train, B, T, world) and the number of batches
 * drawn: all ranks advance one shared generator by B*world draws a batch. */
#include "toy/data.h"

#include "toy/file.h"
#include "toy/tokenizer.h" /* toy_token_file_check */

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct toy_data {
    const uint32_t *ids; /* (n) host order */
    int64_t n;
    int64_t vocab;
    void *map;           /* the file mapping, when ids point into it */
    size_t map_size;
    uint32_t *owned;     /* ids we allocated (in-memory data, big-endian hosts) */
    struct toy_data_opts o;
    int64_t n_train, n_eval;
    struct toy_rng rng;
    int64_t batches;
};

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static enum toy_status check_opts(const struct toy_data_opts *o, const char *what) {
    if (!o) return toy_error(TOY_ERR_INVALID_ARG, "%s: no options", what);
    int world = o->world ? o->world : 1;
    if (o->batch < 1 || o->ctx < 1 || o->ctx > INT64_MAX / 4 / o->batch)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: batch %" PRId64 " x context %" PRId64 " (each must be >= 1)", what,
                         o->batch, o->ctx);
    if (!o->eval_only && !(o->heldout >= 0 && o->heldout < 1))
        return toy_error(TOY_ERR_INVALID_ARG, "%s: held-out fraction %g (must be in [0, 1))", what, o->heldout);
    if (world < 1 || o->rank < 0 || o->rank >= world || o->batch > INT64_MAX / world)
        return toy_error(TOY_ERR_INVALID_ARG, "%s: rank %d of world %d", what, o->rank, o->world);
    return TOY_OK;
}

/* Split and seed once the ids are in place; frees d on failure. */
static enum toy_status finish(struct toy_data *d, const struct toy_data_opts *o, const char *what, struct toy_data **out) {
    d->o = *o;
    if (!d->o.world) d->o.world = 1;
    int64_t T = o->ctx;
    d->n_eval = o->eval_only ? d->n : (int64_t)((double)d->n * o->heldout);
    if (d->n_eval > d->n) d->n_eval = d->n;
    d->n_train = d->n - d->n_eval;
    if (o->eval_only && d->n_eval < T + 1) {
        enum toy_status st = toy_error(TOY_ERR_RANGE, "%s: %" PRId64 " tokens, shorter than one window of T+1 = %" PRId64
                                                      " tokens", what, d->n, T + 1);
        toy_data_free(d);
        return st;
    }
    if (!o->eval_only && d->n_train < T + 1) {
        enum toy_status st = toy_error(TOY_ERR_RANGE,
                                       "%s: the training part has %" PRId64 " tokens, a row needs T+1 = %" PRId64, what,
                                       d->n_train, T + 1);
        toy_data_free(d);
        return st;
    }
    if (!o->eval_only && o->heldout > 0 && d->n_eval < T + 1) {
        enum toy_status st = toy_error(TOY_ERR_RANGE,
                                       "%s: the held-out %g of %" PRId64 " tokens is %" PRId64
                                       ", shorter than one window of T+1 = %" PRId64 " tokens",
                                       what, o->heldout, d->n, d->n_eval, T + 1);
        toy_data_free(d);
        return st;
    }
    toy_rng_seed(&d->rng, o->seed);
    d->batches = 0;
    *out = d;
    return TOY_OK;
}

/* A loader over the ids of a checked image: pointing into `map` (a file
 * mapping, little-endian hosts) or copied. Frees the mapping on failure. */
static enum toy_status data_from_image(const uint8_t *p, uint32_t vocab, uint64_t count, void *map, size_t map_size,
                                       const struct toy_data_opts *o, const char *name, struct toy_data **out) {
    const uint32_t *ids = (const uint32_t *)(p + TOY_TOKEN_FILE_HEADER); /* offset 20: 4-byte aligned */
    uint32_t *owned = NULL;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_BIG_ENDIAN__
    if (!map) /* bytes the caller keeps: copied (their alignment is theirs too) */
#endif
    {
        owned = malloc(count ? count * 4 : 4);
        if (!owned) {
            if (map) munmap(map, map_size);
            return toy_error(TOY_ERR_NOMEM, "%s: out of memory for %" PRIu64 " tokens", name, count);
        }
        for (uint64_t i = 0; i < count; i++) owned[i] = get_u32(p + TOY_TOKEN_FILE_HEADER + 4 * i);
        ids = owned;
        if (map) munmap(map, map_size);
        map = NULL;
    }
    struct toy_data *d = calloc(1, sizeof *d);
    if (!d) {
        if (map) munmap(map, map_size);
        free(owned);
        return toy_error(TOY_ERR_NOMEM, "%s: out of memory", name);
    }
    d->ids = ids;
    d->n = (int64_t)count;
    d->vocab = vocab;
    d->map = map;
    d->map_size = map_size;
    d->owned = owned;
    return finish(d, o, name, out);
}

enum toy_status toy_data_from_token_bytes(const void *bytes, size_t size, const char *name,
                                          const struct toy_data_opts *o, struct toy_data **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_data_from_token_bytes: out is NULL");
    *out = NULL;
    if (!name) name = "token data";
    enum toy_status st = check_opts(o, name);
    if (st) return st;
    if (!bytes && size) return toy_error(TOY_ERR_INVALID_ARG, "%s: NULL bytes", name);
    uint32_t vocab;
    uint64_t count;
    if ((st = toy_token_file_check(bytes, size, name, &vocab, &count))) return st;
    return data_from_image(bytes, vocab, count, NULL, 0, o, name, out);
}

enum toy_status toy_data_open(const char *path, const struct toy_data_opts *o, struct toy_data **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_data_open: out is NULL");
    *out = NULL;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_data_open: NULL path");
    enum toy_status st = check_opts(o, path);
    if (st) return st;
    struct stat sb;
    if (strcmp(path, "-") && stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
        return toy_error(TOY_ERR_FORMAT, "%s: is a directory, not a TOYT token file", path);
    /* a regular file mapped (the data keeps the mapping); a pipe, FIFO or device read whole, from one open */
    struct toy_file_bytes fb;
    if ((st = toy_file_bytes_open(path, &fb))) return st;
    if (!fb.map) {
        st = toy_data_from_token_bytes(fb.p, fb.n, path, o, out);
        toy_file_bytes_close(&fb);
        return st;
    }
    uint32_t vocab;
    uint64_t count;
    if ((st = toy_token_file_check(fb.p, fb.n, path, &vocab, &count))) {
        toy_file_bytes_close(&fb);
        return st;
    }
    return data_from_image(fb.map, vocab, count, fb.map, fb.n, o, path, out);
}

enum toy_status toy_data_from_ids(const int32_t *ids, int64_t n, int64_t vocab, const struct toy_data_opts *o,
                                  struct toy_data **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_data_from_ids: out is NULL");
    *out = NULL;
    enum toy_status st = check_opts(o, "token data");
    if (st) return st;
    if (n < 0 || (n && !ids) || vocab < 1 || vocab > INT32_MAX || (uint64_t)n > SIZE_MAX / 4)
        return toy_error(TOY_ERR_INVALID_ARG, "token data: %" PRId64 " ids, vocabulary %" PRId64, n, vocab);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return toy_error(TOY_ERR_RANGE, "token data: token %" PRId64 " is id %" PRId32 ", the vocabulary has %" PRId64,
                             i, ids[i], vocab);
    struct toy_data *d = calloc(1, sizeof *d);
    uint32_t *owned = malloc(n ? (size_t)n * 4 : 4);
    if (!d || !owned) {
        free(d);
        free(owned);
        return toy_error(TOY_ERR_NOMEM, "token data: out of memory for %" PRId64 " tokens", n);
    }
    if (n) memcpy(owned, ids, (size_t)n * 4);
    d->ids = d->owned = owned;
    d->n = n;
    d->vocab = vocab;
    return finish(d, o, "token data", out);
}

void toy_data_free(struct toy_data *d) {
    if (!d) return;
    if (d->map) munmap(d->map, d->map_size);
    free(d->owned);
    free(d);
}

int64_t toy_data_vocab(const struct toy_data *d) { return d->vocab; }
int64_t toy_data_count(const struct toy_data *d) { return d->n; }
int64_t toy_data_train_tokens(const struct toy_data *d) { return d->n_train; }
int64_t toy_data_heldout_tokens(const struct toy_data *d) { return d->n_eval; }
const uint32_t *toy_data_ids(const struct toy_data *d) { return d->ids; }

/* Four independent multiply-xor lanes over pairs of ids (about 0.2 ns a
 * token), folded with the count and vocabulary at the end. */
uint64_t toy_data_fingerprint(const struct toy_data *d) {
    const uint64_t k = 0x9e3779b97f4a7c15ull;
    uint64_t h[4] = {1, 2, 3, 4};
    int64_t i = 0;
    for (; i + 8 <= d->n; i += 8)
        for (int l = 0; l < 4; l++) h[l] = (h[l] ^ ((uint64_t)d->ids[i + 2 * l] << 32 | d->ids[i + 2 * l + 1])) * k;
    uint64_t r = (uint64_t)d->n * k ^ (uint64_t)d->vocab;
    for (; i < d->n; i++) r = (r ^ d->ids[i]) * k;
    for (int l = 0; l < 4; l++) r = (r ^ (h[l] >> 29) ^ h[l]) * k;
    return r ^ r >> 32;
}

/* Row b of x, y (B, T) from the T+1 tokens at off. */
static void fill_row(const struct toy_data *d, int64_t off, int32_t *x, int32_t *y) {
    const uint32_t *s = d->ids + off;
    for (int64_t t = 0; t < d->o.ctx; t++) {
        x[t] = (int32_t)s[t];
        y[t] = (int32_t)s[t + 1];
    }
}

void toy_data_next_batch(struct toy_data *d, int32_t *x, int32_t *y) {
    const int64_t B = d->o.batch, T = d->o.ctx, first = (int64_t)d->o.rank * B, G = B * d->o.world;
    /* an eval_only loader has no training part: drawing from it would read past the ids */
    TOY_ASSERT(!d->o.eval_only, "toy_data_next_batch on an eval_only loader (it has no training part)");
    const uint64_t starts = (uint64_t)(d->n_train - T); /* offsets 0 .. n_train-(T+1) */
    for (int64_t g = 0; g < G; g++) {
        int64_t off = (int64_t)toy_rng_below(&d->rng, starts);
        if (g >= first && g < first + B) fill_row(d, off, x + (g - first) * T, y + (g - first) * T);
    }
    d->batches++;
}

void toy_data_get_state(const struct toy_data *d, struct toy_data_state *s) {
    memset(s, 0, sizeof *s);
    s->rng = d->rng;
    s->batches = d->batches;
    s->tokens = d->batches * d->o.batch * d->o.ctx;
    s->seed = d->o.seed;
    s->batch = d->o.batch;
    s->ctx = d->o.ctx;
    s->world = d->o.world;
    s->n_train = d->n_train;
}

enum toy_status toy_data_set_state(struct toy_data *d, const struct toy_data_state *s) {
    /* Only the global batch matters: the ranks split the same draws, so a
     * run may resume on another number of ranks with B*world unchanged. */
    const bool same_global = s->batch > 0 && s->world > 0 && s->batch <= INT64_MAX / s->world &&
                             s->batch * s->world == d->o.batch * d->o.world;
    const char *what = !same_global           ? "global batch (B x world)"
                       : s->ctx != d->o.ctx   ? "context length"
                       : s->seed != d->o.seed ? "seed"
                       : s->n_train != d->n_train ? "training tokens (another file or split)"
                       : s->batches < 0       ? "batch count"
                                              : NULL;
    if (what)
        return toy_error(TOY_ERR_STATE,
                         "data state: %s differs (state: B %" PRId64 ", T %" PRId64 ", world %" PRId64 ", seed %" PRIu64
                         ", %" PRId64 " training tokens; loader: B %" PRId64 ", T %" PRId64 ", world %d, seed %" PRIu64
                         ", %" PRId64 ")",
                         what, s->batch, s->ctx, s->world, s->seed, s->n_train, d->o.batch, d->o.ctx, d->o.world,
                         d->o.seed, d->n_train);
    d->rng = s->rng;
    d->batches = s->batches;
    return TOY_OK;
}

static int64_t windows_total(const struct toy_data *d) {
    return d->n_eval >= d->o.ctx + 1 ? (d->n_eval - 1) / d->o.ctx : 0;
}

int64_t toy_data_eval_windows(const struct toy_data *d) {
    int64_t W = windows_total(d);
    return W > d->o.rank ? (W - d->o.rank - 1) / d->o.world + 1 : 0;
}

int64_t toy_data_eval_batch(const struct toy_data *d, int64_t first, int32_t *x, int32_t *y, int32_t pad) {
    const int64_t B = d->o.batch, T = d->o.ctx, mine = toy_data_eval_windows(d);
    int64_t filled = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t k = first + b;
        if (first >= 0 && k < mine) {
            int64_t w = d->o.rank + k * d->o.world;
            fill_row(d, d->n_train + w * T, x + b * T, y + b * T);
            filled++;
        } else {
            for (int64_t t = 0; t < T; t++) x[b * T + t] = 0, y[b * T + t] = pad;
        }
    }
    return filled;
}
