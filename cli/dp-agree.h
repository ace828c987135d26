/* dp-agree.h: under data parallelism (mpirun), that every rank was started
 * alike, checked before the first collective: ranks given other flags,
 * data or models trained silently wrong (other seeds drew other rows, other
 * data other tokens) or died in MPI with a size mismatch and no message. */
#ifndef TOY_CLI_DP_AGREE_H
#define TOY_CLI_DP_AGREE_H

#include <jansson.h>
#include <stdint.h>

#include "toy/collective.h"
#include "toy/gguf.h"
#include "toy/tensor.h"

struct toy_cli_agree {
    const char *what; /* "training options", "data", "model" */
    uint64_t hash;
};

/* 64-bit FNV-1a of n bytes, continuing from h (start: TOY_CLI_HASH0). */
#define TOY_CLI_HASH0 1469598103934665603ull
uint64_t toy_cli_hash(uint64_t h, const void *p, size_t n);
/* Of a JSON value, keys sorted (j is released). */
uint64_t toy_cli_hash_json(json_t *j);
/* Of the names, types and shapes of n tensors. */
uint64_t toy_cli_hash_shapes(struct toy_tensor *const *t, int n);
/* Of a mapped GGUF's tensors: names, types, shapes and 16 samples of each
 * one's bytes (two checkpoints of one model differ there, cheaply). */
uint64_t toy_cli_hash_gguf(const struct toy_gguf *g);

/* "toy CMD: rank R of W: <the last error>", without a second "rank R of W"
 * when the collective's message starts with it already. */
void toy_cli_rank_error(const char *cmd, int rank, int world);

/* Under mpirun (world > 1), 0 when path is a file every rank can read
 * itself; a pipe or standard input reaches rank 0 alone (the others read
 * /dev/null), so it prints "toy CMD: FLAG PATH is a pipe: ..." and
 * returns 2. */
int toy_cli_dp_input(const char *cmd, const char *flag, const char *path, int world);

/* Each item's hash compared over the ranks (every rank calls it with the
 * same items in the same order). 0 when all agree; else every rank prints
 * what differs ("toy CMD: the ranks were started with other WHAT: ...", a
 * differing rank names itself) and it returns 2 on every rank alike; 1 when
 * a collective failed (its message printed). */
int toy_cli_dp_agree(const char *cmd, struct toy_collective *coll, const struct toy_cli_agree *items, int n);

#endif
