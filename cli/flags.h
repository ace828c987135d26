/* flags.h: command-line flags from a table, the same way for every
 * command that trains or reads data (train, finetune, eval, tokenize,
 * tokenizer train): each flag's name, type, destination and range. What
 * the parser refuses, with exit status 2 (bad usage) and a message naming
 * it, before the command does any work:
 *   - a flag that is not in the table: "unknown flag --frobnicate";
 *   - an argument that is neither a flag nor a wanted positional one:
 *     "unexpected argument 'extra.txt'";
 *   - a flag without its value: "--steps needs a value";
 *   - a number that is not finite, out of its range, or (for integer
 *     flags) not a whole number: "bad value '2.5' for --steps: a whole
 *     number from 0 to 1000000000000". Integers may be written 1e3 when
 *     that is exactly a whole number; they are never rounded or wrapped. */
#ifndef TOY_CLI_FLAGS_H
#define TOY_CLI_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

enum toy_cli_flag_kind {
    TOY_CLI_BOOL, /* no value: sets the bool *dst */
    TOY_CLI_STR,  /* const char **dst */
    TOY_CLI_LIST, /* repeatable: appends to the struct toy_cli_list *dst */
    TOY_CLI_I64,  /* int64_t *dst, a whole number in [lo, hi] */
    TOY_CLI_I32,  /* int32_t *dst */
    TOY_CLI_INT,  /* int *dst */
    TOY_CLI_U64,  /* uint64_t *dst, any 64-bit value (seeds) */
    TOY_CLI_F64,  /* double *dst, finite, in [lo, hi] ([lo, hi) with hi_open) */
    TOY_CLI_F32,  /* float *dst */
};

struct toy_cli_list {
    const char **items;
    int n, max;
};

struct toy_cli_flag {
    const char *name; /* "--steps"; NULL ends the table */
    enum toy_cli_flag_kind kind;
    void *dst;
    double lo, hi;
    bool hi_open;     /* reals: hi itself is out of range */
    bool *given;      /* set when the flag appears (NULL: not asked) */
};

/* Table entries: a string, a switch, a repeatable string, a whole number
 * of the given kind in [lo, hi], a real in [lo, hi] (or [lo, hi) with
 * OPEN), a seed; G: also sets *given when the flag appears. */
#define TOY_FLAG_S(n, d) {.name = (n), .kind = TOY_CLI_STR, .dst = (d)}
#define TOY_FLAG_B(n, d) {.name = (n), .kind = TOY_CLI_BOOL, .dst = (d)}
#define TOY_FLAG_L(n, d) {.name = (n), .kind = TOY_CLI_LIST, .dst = (d)}
#define TOY_FLAG_N(n, k, d, l, h) {.name = (n), .kind = (k), .dst = (d), .lo = (l), .hi = (h)}
#define TOY_FLAG_NG(n, k, d, l, h, g) {.name = (n), .kind = (k), .dst = (d), .lo = (l), .hi = (h), .given = (g)}
#define TOY_FLAG_OPEN(n, k, d, l, h) {.name = (n), .kind = (k), .dst = (d), .lo = (l), .hi = (h), .hi_open = true}
#define TOY_FLAG_U(n, d) {.name = (n), .kind = TOY_CLI_U64, .dst = (d)}
#define TOY_FLAG_END {.name = NULL}

/* The optimizer's flags, shared by the commands whose options struct `o`
 * has the trainer's fields (lr, lr_min, warmup, weight_decay, beta1/2,
 * clip, seed, eval_every, ckpt_every); big bounds the step counts. */
#define TOY_FLAGS_OPTIM(o, big)                                                                               \
    TOY_FLAG_N("--lr", TOY_CLI_F32, &(o).lr, 0, 1e30), TOY_FLAG_N("--lr-min", TOY_CLI_F32, &(o).lr_min, 0, 1e30), \
        TOY_FLAG_N("--warmup", TOY_CLI_I64, &(o).warmup, 0, big),                                             \
        TOY_FLAG_N("--wd", TOY_CLI_F32, &(o).weight_decay, 0, 1e30),                                          \
        TOY_FLAG_OPEN("--beta1", TOY_CLI_F32, &(o).beta1, 0, 1),                                              \
        TOY_FLAG_OPEN("--beta2", TOY_CLI_F32, &(o).beta2, 0, 1),                                              \
        TOY_FLAG_N("--clip", TOY_CLI_F32, &(o).clip, 0, 1e30), TOY_FLAG_U("--seed", &(o).seed),               \
        TOY_FLAG_N("--eval-every", TOY_CLI_I64, &(o).eval_every, 0, big),                                     \
        TOY_FLAG_N("--ckpt-every", TOY_CLI_I64, &(o).ckpt_every, 0, big)

/* Parses argv[1..argc) against the table. Arguments that are not flags
 * ("-" included) go to pos (up to max_pos of them; *n_pos counts them);
 * -h/--help makes it return 1 with nothing printed (the caller shows its
 * usage). Returns 0 when all is well, 1 for help, 2 after printing
 * "toy CMD: why" for bad usage. */
int toy_cli_parse(const char *cmd, int argc, char **argv, const struct toy_cli_flag *flags, const char **pos,
                  int max_pos, int *n_pos);

/* For a command that reads its few arguments by hand: whether -h or --help
 * is among argv[1..argc) (its usage then goes to stdout, with exit 0). */
bool toy_cli_wants_help(int argc, char **argv);

#endif
