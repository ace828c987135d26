/* test-data.c: the token data loader (src/train/data.c): TOYT files as the
 * tokenizer writes them (toy_token_file_write), every kind of corrupt or
 * truncated file rejected with a message naming the field and offset,
 * deterministic batches that continue identically after a state save and
 * restore, rows that stay inside their split, every offset reachable, the
 * held-out windows (each held-out token predicted once), and shards whose
 * rows are disjoint draws that together make the single-process batch.
 * Files are written under mkdtemp. Token ids are mostly id = position, so a
 * row's first input is its offset. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/data.h"
#include "toy/file.h"
#include "toy/tokenizer.h"

static char dir[] = "/tmp/toy-test-data-XXXXXX";
static bool have_dir;

static const char *tmp(const char *name) {
    static char p[PATH_MAX];
    if (!have_dir) {
        cr_assert(mkdtemp(dir));
        have_dir = true;
    }
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static void cleanup(void) {
    if (!have_dir) return;
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0);
}

TestSuite(data, .fini = cleanup);

static int32_t *iota(int64_t n) {
    int32_t *ids = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)i;
    return ids;
}

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> 8 * i); }

/* A TOYT image of n ids (id = i % vocab) with the given header fields. */
static uint8_t *image(const char *magic, uint32_t version, uint32_t vocab, uint64_t count, int64_t n, size_t *size) {
    *size = 20 + 4 * (size_t)n;
    uint8_t *b = malloc(*size);
    memcpy(b, magic, 4);
    put32(b + 4, version);
    put32(b + 8, vocab);
    put64(b + 12, count);
    for (int64_t i = 0; i < n; i++) put32(b + 20 + 4 * i, (uint32_t)(i % (vocab ? vocab : 1)));
    return b;
}

static const char *write_bytes(const char *name, const uint8_t *b, size_t n) {
    const char *p = tmp(name);
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    return p;
}

static const struct toy_data_opts small = {.batch = 4, .ctx = 16, .heldout = 0.1, .seed = 7};

/* Opening `path` fails with `st` and a message containing each of the strings. */
static void expect_fail(const char *path, enum toy_status st, const char *m1, const char *m2) {
    struct toy_data *d = (void *)1;
    enum toy_status got = toy_data_open(path, &small, &d);
    cr_expect_eq(got, st, "%s: got %s (%s), want %s", path, toy_status_str(got), toy_last_error(), toy_status_str(st));
    cr_expect_null(d);
    cr_expect(strstr(toy_last_error(), m1), "'%s' lacks '%s'", toy_last_error(), m1);
    if (m2) cr_expect(strstr(toy_last_error(), m2), "'%s' lacks '%s'", toy_last_error(), m2);
}

Test(data, opens_what_the_tokenizer_writes) {
    int64_t n = 5000;
    int32_t *ids = iota(n);
    const char *p = tmp("tokens.bin");
    cr_assert_eq(toy_token_file_write(p, n, ids, n), TOY_OK, "%s", toy_last_error());
    struct toy_data *d;
    cr_assert_eq(toy_data_open(p, &small, &d), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_data_vocab(d), n);
    cr_expect_eq(toy_data_count(d), n);
    cr_expect_eq(toy_data_heldout_tokens(d), 500);
    cr_expect_eq(toy_data_train_tokens(d), 4500);
    const uint32_t *got = toy_data_ids(d);
    for (int64_t i = 0; i < n; i++) cr_assert_eq(got[i], (uint32_t)i);
    /* the same stream from memory draws the same batches */
    struct toy_data *m;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &small, &m), TOY_OK, "%s", toy_last_error());
    int32_t x1[64], y1[64], x2[64], y2[64];
    for (int b = 0; b < 10; b++) {
        toy_data_next_batch(d, x1, y1);
        toy_data_next_batch(m, x2, y2);
        cr_assert_arr_eq(x1, x2, sizeof x1);
        cr_assert_arr_eq(y1, y2, sizeof y1);
    }
    toy_data_free(d);
    toy_data_free(m);
    toy_data_free(NULL);
    free(ids);
}

Test(data, corrupt_files_give_clear_errors) {
    size_t n;
    uint8_t *b = image("TOYT", 1, 100, 1000, 1000, &n);
    expect_fail(tmp("missing.bin"), TOY_ERR_IO, "missing.bin", NULL);
    expect_fail(write_bytes("empty.bin", b, 0), TOY_ERR_FORMAT, "0 bytes", "header");
    expect_fail(write_bytes("short.bin", b, 19), TOY_ERR_FORMAT, "19 bytes", "header");
    expect_fail(dir, TOY_ERR_FORMAT, "is a directory", NULL); /* it was "4096 bytes, shorter than the header" */
    /* truncated: the header promises 1000 ids, 999.5 are there */
    expect_fail(write_bytes("trunc.bin", b, n - 2), TOY_ERR_FORMAT, "count 1000 at offset 12", "truncated");
    /* trailing bytes */
    uint8_t *big = malloc(n + 4);
    memcpy(big, b, n);
    memset(big + n, 0, 4);
    expect_fail(write_bytes("trail.bin", big, n + 4), TOY_ERR_FORMAT, "count 1000", "trailing");
    free(big);
    /* a count so large that 4*count overflows */
    put64(b + 12, UINT64_MAX / 2);
    expect_fail(write_bytes("huge.bin", b, n), TOY_ERR_FORMAT, "offset 12", NULL);
    put64(b + 12, 1000);
    memcpy(b, "TOYX", 4);
    expect_fail(write_bytes("magic.bin", b, n), TOY_ERR_FORMAT, "bad magic", "offset 0");
    memcpy(b, "TOYT", 4);
    put32(b + 4, 2);
    expect_fail(write_bytes("version.bin", b, n), TOY_ERR_UNSUPPORTED, "version 2", "offset 4");
    put32(b + 4, 1);
    put32(b + 8, 0);
    expect_fail(write_bytes("vocab0.bin", b, n), TOY_ERR_FORMAT, "vocabulary size 0", "offset 8");
    put32(b + 8, 0x80000000u);
    expect_fail(write_bytes("vocabbig.bin", b, n), TOY_ERR_FORMAT, "vocabulary size", NULL);
    put32(b + 8, 100);
    /* one id out of range, deep in the file: named by index and byte offset */
    put32(b + 20 + 4 * 987, 100);
    expect_fail(write_bytes("badid.bin", b, n), TOY_ERR_RANGE, "token 987 (offset 3968) is id 100",
                "vocabulary has 100");
    put32(b + 20 + 4 * 987, 0xffffffffu);
    expect_fail(write_bytes("badid2.bin", b, n), TOY_ERR_RANGE, "token 987", "4294967295");
    put32(b + 20 + 4 * 987, 5);
    /* valid, but too short for the split */
    put64(b + 12, 0);
    expect_fail(write_bytes("zero.bin", b, 20), TOY_ERR_RANGE, "training part has 0 tokens", NULL);
    put64(b + 12, 100);
    expect_fail(write_bytes("tiny.bin", b, 20 + 400), TOY_ERR_RANGE, "held-out", "T+1 = 17");
    /* and the intact file opens */
    put64(b + 12, 1000);
    struct toy_data *d;
    cr_expect_eq(toy_data_open(write_bytes("ok.bin", b, n), &small, &d), TOY_OK, "%s", toy_last_error());
    toy_data_free(d);
    free(b);
}

Test(data, bad_arguments) {
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = i % 10;
    struct toy_data *d;
    struct toy_data_opts o = {.batch = 2, .ctx = 8, .seed = 1};
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, &o, &d), TOY_OK);
    toy_data_free(d);
    ids[42] = 10;
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, &o, &d), TOY_ERR_RANGE);
    cr_expect(strstr(toy_last_error(), "token 42 is id 10"), "%s", toy_last_error());
    ids[42] = -1;
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, &o, &d), TOY_ERR_RANGE);
    ids[42] = 0;
    cr_expect_eq(toy_data_from_ids(ids, 100, 0, &o, &d), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_data_from_ids(NULL, 100, 10, &o, &d), TOY_ERR_INVALID_ARG);
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, NULL, &d), TOY_ERR_INVALID_ARG);
    struct toy_data_opts bad[] = {
        {.batch = 0, .ctx = 8}, {.batch = 2, .ctx = 0}, {.batch = 2, .ctx = 8, .heldout = 1.0},
        {.batch = 2, .ctx = 8, .heldout = -0.1}, {.batch = 2, .ctx = 8, .rank = 2, .world = 2},
        {.batch = 2, .ctx = 8, .rank = -1}, {.batch = INT64_MAX, .ctx = 8}, {.batch = 2, .ctx = 8, .world = -3},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(toy_data_from_ids(ids, 100, 10, &bad[i], &d), TOY_ERR_INVALID_ARG, "opts %zu", i);
        cr_expect_null(d);
    }
    /* the training part must hold a row */
    o.ctx = 100;
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, &o, &d), TOY_ERR_RANGE);
    o.ctx = 99;
    cr_expect_eq(toy_data_from_ids(ids, 100, 10, &o, &d), TOY_OK);
    toy_data_free(d);
}

static void draw(struct toy_data *d, int batches, int32_t *x, int32_t *y, int64_t BT) {
    for (int b = 0; b < batches; b++) toy_data_next_batch(d, x + b * BT, y + b * BT);
}

Test(data, batches_are_deterministic_and_in_the_training_part) {
    const int64_t n = 20000, B = 8, T = 32;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = B, .ctx = T, .heldout = 0.25, .seed = 1234};
    struct toy_data *a, *b, *c;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &a), TOY_OK);
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &b), TOY_OK);
    o.seed = 1235;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &c), TOY_OK);
    const int NB = 50;
    int32_t *xa = malloc(NB * B * T * 4), *ya = malloc(NB * B * T * 4), *xb = malloc(NB * B * T * 4),
            *yb = malloc(NB * B * T * 4);
    draw(a, NB, xa, ya, B * T);
    draw(b, NB, xb, yb, B * T);
    cr_expect_arr_eq(xa, xb, (size_t)NB * B * T * 4);
    cr_expect_arr_eq(ya, yb, (size_t)NB * B * T * 4);
    draw(c, NB, xb, yb, B * T);
    cr_expect(memcmp(xa, xb, (size_t)NB * B * T * 4), "another seed draws the same batches");
    const int64_t n_train = toy_data_train_tokens(a);
    cr_expect_eq(n_train, 15000);
    for (int64_t r = 0; r < NB * B; r++) {
        int32_t off = xa[r * T];
        cr_assert(off >= 0 && off + T < n_train, "row %lld at %d leaves the training part", (long long)r, off);
        for (int64_t t = 0; t < T; t++) {
            cr_assert_eq(xa[r * T + t], off + t);
            cr_assert_eq(ya[r * T + t], off + t + 1);
        }
    }
    toy_data_free(a), toy_data_free(b), toy_data_free(c);
    free(xa), free(ya), free(xb), free(yb), free(ids);
}

Test(data, every_offset_is_reachable) {
    /* 40 training tokens, T = 8: offsets 0..31, all of them, none beyond */
    int32_t *ids = iota(40);
    struct toy_data_opts o = {.batch = 16, .ctx = 8, .seed = 3};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids, 40, 40, &o, &d), TOY_OK);
    int hits[40] = {0};
    int32_t x[128], y[128];
    for (int b = 0; b < 200; b++) {
        toy_data_next_batch(d, x, y);
        for (int r = 0; r < 16; r++) hits[x[r * 8]]++;
    }
    for (int i = 0; i < 32; i++) cr_expect_gt(hits[i], 40, "offset %d drawn %d times of 3200", i, hits[i]);
    for (int i = 32; i < 40; i++) cr_expect_eq(hits[i], 0, "offset %d", i);
    toy_data_free(d);
    free(ids);
}

Test(data, state_save_and_restore_continues_the_stream) {
    const int64_t n = 10000, B = 4, T = 16;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = B, .ctx = T, .heldout = 0.1, .seed = 99};
    struct toy_data *a, *b;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &a), TOY_OK);
    int32_t x[20][64], y[20][64], xr[64], yr[64];
    for (int i = 0; i < 7; i++) toy_data_next_batch(a, x[i], y[i]);
    struct toy_data_state s;
    toy_data_get_state(a, &s);
    cr_expect_eq(sizeof s, 88);
    cr_expect_eq(s.batches, 7);
    cr_expect_eq(s.tokens, 7 * B * T);
    cr_expect_eq(s.seed, 99);
    /* the state as bytes, as a checkpoint would keep it */
    unsigned char saved[sizeof s];
    memcpy(saved, &s, sizeof s);
    for (int i = 7; i < 20; i++) toy_data_next_batch(a, x[i], y[i]);
    /* a fresh loader (a resumed process) */
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &b), TOY_OK);
    struct toy_data_state r;
    memcpy(&r, saved, sizeof r);
    cr_assert_eq(toy_data_set_state(b, &r), TOY_OK, "%s", toy_last_error());
    for (int i = 7; i < 20; i++) {
        toy_data_next_batch(b, xr, yr);
        cr_assert_arr_eq(xr, x[i], sizeof xr, "batch %d after restore", i);
        cr_assert_arr_eq(yr, y[i], sizeof yr);
    }
    /* and rewinding the same loader */
    cr_assert_eq(toy_data_set_state(a, &r), TOY_OK);
    toy_data_next_batch(a, xr, yr);
    cr_expect_arr_eq(xr, x[7], sizeof xr);
    struct toy_data_state g;
    toy_data_get_state(a, &g);
    cr_expect_eq(g.batches, 8);
    /* a state from another shape is refused and changes nothing */
    struct toy_data_state bad = r;
    bad.batch = 8;
    cr_expect_eq(toy_data_set_state(a, &bad), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "global batch"), "%s", toy_last_error());
    bad = r, bad.n_train = 1;
    cr_expect_eq(toy_data_set_state(a, &bad), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "training tokens"), "%s", toy_last_error());
    bad = r, bad.seed = 1;
    cr_expect_eq(toy_data_set_state(a, &bad), TOY_ERR_STATE);
    bad = r, bad.world = 2;
    cr_expect_eq(toy_data_set_state(a, &bad), TOY_ERR_STATE);
    bad = r, bad.ctx = 8;
    cr_expect_eq(toy_data_set_state(a, &bad), TOY_ERR_STATE);
    cr_expect(strstr(toy_last_error(), "context"), "%s", toy_last_error());
    toy_data_next_batch(a, xr, yr);
    cr_expect_arr_eq(xr, x[8], sizeof xr);
    toy_data_free(a), toy_data_free(b);
    free(ids);
}

Test(data, heldout_windows_cover_the_tail_once) {
    const int64_t n = 1000, B = 4, T = 10;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = B, .ctx = T, .heldout = 0.2, .seed = 5};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &d), TOY_OK);
    const int64_t n_train = toy_data_train_tokens(d);
    cr_expect_eq(n_train, 800);
    cr_expect_eq(toy_data_heldout_tokens(d), 200);
    const int64_t W = toy_data_eval_windows(d);
    cr_expect_eq(W, 19); /* (200 - 1) / 10 */
    int predicted[1000] = {0};
    int32_t x[40], y[40];
    int64_t total = 0;
    for (int64_t w = 0; w < W; w += B) {
        int64_t got = toy_data_eval_batch(d, w, x, y, -100);
        cr_expect_eq(got, W - w < B ? W - w : B);
        for (int64_t r = 0; r < B; r++) {
            for (int64_t t = 0; t < T; t++) {
                if (r < got) {
                    cr_assert_geq(x[r * T + t], n_train, "eval reads training tokens");
                    cr_assert_eq(y[r * T + t], x[r * T + t] + 1);
                    predicted[y[r * T + t]]++;
                } else {
                    cr_assert_eq(x[r * T + t], 0);
                    cr_assert_eq(y[r * T + t], -100);
                }
            }
        }
        total += got;
    }
    cr_expect_eq(total, W);
    for (int64_t i = 0; i < n; i++)
        cr_assert_eq(predicted[i], i > n_train && i <= n_train + W * T ? 1 : 0, "token %lld", (long long)i);
    cr_expect_eq(toy_data_eval_batch(d, W, x, y, -1), 0);
    cr_expect_eq(toy_data_eval_batch(d, -5, x, y, -1), 0);
    /* no held-out part: no windows */
    o.heldout = 0;
    struct toy_data *e;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &e), TOY_OK);
    cr_expect_eq(toy_data_eval_windows(e), 0);
    cr_expect_eq(toy_data_train_tokens(e), n);
    toy_data_free(d), toy_data_free(e);
    free(ids);
}

/* eval_only (toy eval without --heldout): the whole stream is the held-out
 * part, however short, down to one window; it used to be asked for as a
 * held-out fraction of 0.999999, which left a one-token training part that
 * the loader refuses. */
Test(data, eval_only_makes_the_whole_stream_the_heldout_part) {
    const int64_t n = 1000, B = 4, T = 10;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = B, .ctx = T, .eval_only = true};
    struct toy_data *d;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &d), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_data_train_tokens(d), 0);
    cr_expect_eq(toy_data_heldout_tokens(d), n);
    cr_expect_eq(toy_data_eval_windows(d), 99); /* (1000 - 1) / 10 */
    int32_t x[40], y[40];
    cr_expect_eq(toy_data_eval_batch(d, 0, x, y, -100), B);
    cr_expect_eq(x[0], 0, "the first window starts at the first token");
    cr_expect_eq(y[0], 1);
    toy_data_free(d);
    /* a file of exactly one window, and one token short of it */
    const char *p = tmp("eval-only.bin");
    cr_assert_eq(toy_token_file_write(p, 100, ids, T + 1), TOY_OK, "%s", toy_last_error());
    cr_assert_eq(toy_data_open(p, &o, &d), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_data_eval_windows(d), 1);
    toy_data_free(d);
    cr_assert_eq(toy_token_file_write(p, 100, ids, T), TOY_OK);
    cr_expect_eq(toy_data_open(p, &o, &d), TOY_ERR_RANGE);
    cr_expect(strstr(toy_last_error(), "shorter than one window"), "%s", toy_last_error());
    free(ids);
}

Test(data, shards_are_disjoint_and_make_the_global_batch) {
    const int64_t n = 50000, B = 3, T = 8, world = 4, NB = 25;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = B * world, .ctx = T, .heldout = 0.1, .seed = 2024};
    struct toy_data *one;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &one), TOY_OK);
    int32_t *gx = malloc(NB * B * world * T * 4), *gy = malloc(NB * B * world * T * 4);
    draw(one, (int)NB, gx, gy, B * world * T);
    struct toy_data_state s1;
    toy_data_get_state(one, &s1);
    int32_t x[B * T], y[B * T];
    struct toy_data_state s0;
    int64_t owner_windows = 0;
    for (int r = 0; r < world; r++) {
        struct toy_data_opts ro = {.batch = B, .ctx = T, .heldout = 0.1, .seed = 2024, .rank = r, .world = (int)world};
        struct toy_data *d;
        cr_assert_eq(toy_data_from_ids(ids, n, n, &ro, &d), TOY_OK);
        for (int64_t b = 0; b < NB; b++) {
            toy_data_next_batch(d, x, y);
            /* rank r's rows are rows [r*B, (r+1)*B) of the global batch */
            cr_assert_arr_eq(x, gx + (b * world + r) * B * T, sizeof x, "rank %d batch %lld", r, (long long)b);
            cr_assert_arr_eq(y, gy + (b * world + r) * B * T, sizeof y);
        }
        struct toy_data_state s;
        toy_data_get_state(d, &s);
        if (r == 0) s0 = s;
        cr_expect_arr_eq(&s.rng, &s0.rng, sizeof s.rng, "ranks share one generator");
        cr_expect_arr_eq(&s.rng, &s1.rng, sizeof s.rng, "and it is the single process's");
        cr_expect_eq(s.tokens, NB * B * T);
        /* held-out windows: rank r evaluates windows r, r + world, ... */
        int64_t W = toy_data_eval_windows(d);
        for (int64_t w = 0; w < W; w++) {
            int32_t ex[B * T], ey[B * T];
            cr_assert_geq(toy_data_eval_batch(d, w, ex, ey, -100), 1);
            int64_t global = (ex[0] - toy_data_train_tokens(d)) / T;
            cr_assert_eq(global % world, r);
            cr_assert_eq(global / world, w);
        }
        owner_windows += W;
        toy_data_free(d);
    }
    struct toy_data_opts so = o;
    so.batch = 1;
    struct toy_data *single;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &so, &single), TOY_OK);
    cr_expect_eq(owner_windows, toy_data_eval_windows(single), "every window has exactly one owner");
    toy_data_free(single);
    toy_data_free(one);
    free(gx), free(gy), free(ids);
}

Test(data, big_file_by_mmap) {
    /* 4M tokens: opening validates them all, quickly */
    const int64_t n = 1 << 22;
    int32_t *ids = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)((i * 2654435761u) % 50257);
    const char *p = tmp("big.bin");
    cr_assert_eq(toy_token_file_write(p, 50257, ids, n), TOY_OK);
    struct toy_data *d;
    struct toy_data_opts o = {.batch = 8, .ctx = 256, .heldout = 0.05, .seed = 11};
    cr_assert_eq(toy_data_open(p, &o, &d), TOY_OK, "%s", toy_last_error());
    int32_t x[8 * 256], y[8 * 256];
    toy_data_next_batch(d, x, y);
    const uint32_t *all = toy_data_ids(d);
    for (int r = 0; r < 8; r++) {
        /* find the row in the stream: its first token pins the offset (ids are a permutation within 50257) */
        int64_t off = -1;
        for (int64_t i = 0; i + 256 < toy_data_train_tokens(d); i++)
            if ((int32_t)all[i] == x[r * 256] && (int32_t)all[i + 1] == x[r * 256 + 1] &&
                (int32_t)all[i + 2] == x[r * 256 + 2]) {
                off = i;
                break;
            }
        cr_assert_geq(off, 0);
        for (int t = 0; t < 256; t++) cr_assert_eq(y[r * 256 + t], ids[off + t + 1]);
    }
    toy_data_free(d);
    free(ids);
}

Test(data, resume_on_another_number_of_ranks) {
    /* 4 ranks x B 2 for 6 batches, then 2 ranks x B 4: the same global rows */
    const int64_t n = 30000, T = 8, NB = 6;
    int32_t *ids = iota(n);
    struct toy_data_opts o = {.batch = 8, .ctx = T, .heldout = 0.1, .seed = 77};
    struct toy_data *one;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o, &one), TOY_OK);
    int32_t gx[2 * NB][8 * T], gy[8 * T];
    for (int b = 0; b < 2 * NB; b++) toy_data_next_batch(one, gx[b], gy);
    struct toy_data_state s;
    struct toy_data *r4;
    struct toy_data_opts o4 = {.batch = 2, .ctx = T, .heldout = 0.1, .seed = 77, .rank = 3, .world = 4};
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o4, &r4), TOY_OK);
    int32_t x[8 * T], y[8 * T];
    for (int b = 0; b < NB; b++) toy_data_next_batch(r4, x, y);
    toy_data_get_state(r4, &s);
    for (int rank = 0; rank < 2; rank++) {
        struct toy_data_opts o2 = {.batch = 4, .ctx = T, .heldout = 0.1, .seed = 77, .rank = rank, .world = 2};
        struct toy_data *r2;
        cr_assert_eq(toy_data_from_ids(ids, n, n, &o2, &r2), TOY_OK);
        cr_assert_eq(toy_data_set_state(r2, &s), TOY_OK, "%s", toy_last_error());
        for (int b = NB; b < 2 * NB; b++) {
            toy_data_next_batch(r2, x, y);
            cr_assert_arr_eq(x, gx[b] + rank * 4 * T, 4 * T * sizeof(int32_t), "rank %d batch %d", rank, b);
        }
        struct toy_data_state s2;
        toy_data_get_state(r2, &s2);
        cr_expect_eq(s2.batches, 2 * NB);
        cr_expect_eq(s2.tokens, 2 * NB * 4 * T);
        toy_data_free(r2);
    }
    /* 3 ranks x B 2 is another global batch: refused */
    struct toy_data_opts o3 = {.batch = 2, .ctx = T, .heldout = 0.1, .seed = 77, .rank = 0, .world = 3};
    struct toy_data *r3;
    cr_assert_eq(toy_data_from_ids(ids, n, n, &o3, &r3), TOY_OK);
    cr_expect_eq(toy_data_set_state(r3, &s), TOY_ERR_STATE);
    toy_data_free(r3), toy_data_free(r4), toy_data_free(one);
    free(ids);
}

/* A token file in memory (as read from a pipe) and one through a FIFO, which cannot be mapped, open as the
 * mapped file does, with the same checks and messages; toy_file_read_all reads both without seeking. */
Test(data, token_bytes_and_pipes_read_as_the_file) {
    int64_t n = 3000;
    size_t size;
    uint8_t *b = image("TOYT", 1, 500, (uint64_t)n, n, &size);
    char p[PATH_MAX]; /* tmp() reuses its buffer */
    snprintf(p, sizeof p, "%s", write_bytes("file.bin", b, size));
    struct toy_data *d, *m, *f;
    cr_assert_eq(toy_data_open(p, &small, &d), TOY_OK, "%s", toy_last_error());
    uint8_t *odd = malloc(size + 1); /* at an odd address: the bytes need no alignment */
    memcpy(odd + 1, b, size);
    cr_assert_eq(toy_data_from_token_bytes(odd + 1, size, "piped", &small, &m), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(toy_data_fingerprint(m), toy_data_fingerprint(d));
    cr_expect_eq(toy_data_vocab(m), 500);
    /* the same checks, naming what it was given */
    put32(odd + 1 + 20 + 4 * 7, 900);
    cr_expect_eq(toy_data_from_token_bytes(odd + 1, size, "piped", &small, &f), TOY_ERR_RANGE);
    cr_expect(strstr(toy_last_error(), "piped: token 7 (offset 48) is id 900"), "%s", toy_last_error());
    cr_expect_eq(toy_data_from_token_bytes(odd + 1, 10, NULL, &small, &f), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "token data: 10 bytes"), "%s", toy_last_error());
    free(odd);
    /* through a FIFO: toy_data_open reads it whole */
    const char *fifo = tmp("fifo");
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    pid_t w = fork();
    cr_assert(w >= 0);
    if (w == 0) {
        FILE *o = fopen(fifo, "wb");
        _exit(o && fwrite(b, 1, size, o) == size && fclose(o) == 0 ? 0 : 1);
    }
    cr_assert_eq(toy_data_open(fifo, &small, &f), TOY_OK, "%s", toy_last_error());
    int ws;
    cr_expect_eq(waitpid(w, &ws, 0), w);
    cr_expect_eq(toy_data_fingerprint(f), toy_data_fingerprint(d));
    toy_data_free(f);
    toy_data_free(m);
    toy_data_free(d);
    /* toy_file_read_all: the bytes and a NUL after them; a folder or a failing read named */
    char *all;
    size_t len;
    cr_assert_eq(toy_file_read_all(p, &all, &len), TOY_OK, "%s", toy_last_error());
    cr_expect_eq(len, size);
    cr_expect_arr_eq(all, b, size);
    cr_expect_eq(all[len], 0);
    free(all);
    cr_expect_eq(toy_file_read_all(dir, &all, &len), TOY_ERR_IO);
    cr_expect(strstr(toy_last_error(), "is a directory") && strstr(toy_last_error(), dir), "%s", toy_last_error());
    cr_expect_null(all);
    if (access("/proc/self/mem", R_OK) == 0) { /* reading it at offset 0 fails with EIO */
        cr_expect_eq(toy_file_read_all("/proc/self/mem", &all, &len), TOY_ERR_IO);
        cr_expect(strstr(toy_last_error(), "/proc/self/mem: read error"), "%s", toy_last_error());
    }
    free(b);
}
