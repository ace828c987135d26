/* fuzz-data.c: libFuzzer harness for the training-data readers: TOYT token
 * files (src/tokenizer/token-file.c, src/train/data.c), the data loader's
 * resume state (a checkpoint's bytes) and SFT JSONL (src/train/sft.c). The
 * first input byte picks the target, the rest is its input:
 *   0  a TOYT file on disk read by toy_token_file_read
 *   1  TOYT bytes opened by toy_data_from_token_bytes with options taken
 *      from 4 more bytes, then batches, eval windows, and a resume from a
 *      fuzzed toy_data_state (the next 88 bytes; a checkpoint's)
 *   2  SFT JSONL (prompt/completion and chatml messages) with a small
 *      byte-level BPE tokenizer, then every batch function
 * Build: make -f fuzz/Makefile; bounded run: fuzz/run.sh SECONDS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toy/data.h"
#include "toy/finetune.h"
#include "toy/tokenizer.h"
#include "tokenizer/tokenizer-impl.h" /* toy_tok_byte_to_cp, toy_tok_utf8_encode */

static struct toy_tokenizer *tok;
static char tmp[64];

/* GPT-2's piece for byte b (its byte-to-unicode table), NUL-terminated in o[4] */
static const char *byte_piece(int b, char *o) {
    o[toy_tok_utf8_encode(toy_tok_byte_to_cp[b], o)] = 0;
    return o;
}

static void init(void) {
    static char bytes[256][4];
    static const char *toks[300];
    int32_t types[300];
    int n = 0;
    for (int b = 0; b < 256; b++) types[n] = TOY_TOKEN_NORMAL, toks[n++] = byte_piece(b, bytes[b]);
    types[n] = TOY_TOKEN_CONTROL, toks[n++] = "<|im_start|>";
    types[n] = TOY_TOKEN_CONTROL, toks[n++] = "<|im_end|>";
    types[n] = TOY_TOKEN_NORMAL, toks[n++] = "ab";
    static const char *merges[] = {"a b"};
    struct toy_tokenizer_spec s = {.kind = TOY_TOKENIZER_BPE, .n_tokens = n, .tokens = toks, .types = types,
                                   .n_merges = 1, .merges = merges, .pre = "llama-bpe", .bos = -1, .eos = 257,
                                   .unk = -1, .pad = -1, .eot = 257};
    if (toy_tokenizer_init(&s, &tok)) abort();
    snprintf(tmp, sizeof tmp, "/tmp/fuzz-data-%d.toyt", (int)getpid());
}

static void token_file(const uint8_t *p, size_t n) {
    FILE *f = fopen(tmp, "wb");
    if (!f) abort();
    if (n && fwrite(p, 1, n, f) != n) abort();
    fclose(f);
    int64_t vocab, count;
    int32_t *ids;
    if (!toy_token_file_read(tmp, &vocab, &ids, &count)) {
        for (int64_t i = 0; i < count; i++)
            if (ids[i] < 0 || ids[i] >= vocab) abort();
        free(ids);
    }
    unlink(tmp);
}

static void loader(const uint8_t *p, size_t n) {
    if (n < 4 + sizeof(struct toy_data_state)) return;
    struct toy_data_opts o = {.batch = 1 + p[0] % 4, .ctx = 1 + p[1] % 16, .heldout = (p[2] % 4) / 4.0,
                              .seed = p[3], .eval_only = p[2] & 4, .world = 1 + (p[2] >> 3) % 3};
    o.rank = (p[2] >> 5) % o.world;
    struct toy_data_state fz;
    memcpy(&fz, p + 4, sizeof fz);
    p += 4 + sizeof fz;
    n -= 4 + sizeof fz;
    struct toy_data *d;
    if (toy_data_from_token_bytes(p, n, "fuzz", &o, &d)) return;
    size_t bt = (size_t)(o.batch * o.ctx);
    int32_t *x = malloc(bt * 4), *y = malloc(bt * 4);
    if (!o.eval_only) {
        toy_data_next_batch(d, x, y);
        struct toy_data_state s;
        toy_data_get_state(d, &s);
        if (toy_data_set_state(d, &s)) abort(); /* its own state must be accepted */
        if (!toy_data_set_state(d, &fz)) toy_data_next_batch(d, x, y);
    }
    int64_t w = toy_data_eval_windows(d);
    for (int64_t i = 0; i < w && i < 64; i += o.batch) toy_data_eval_batch(d, i, x, y, -100);
    free(x);
    free(y);
    toy_data_free(d);
}

static void sft(const uint8_t *p, size_t n) {
    if (n < 1) return;
    struct toy_sft_opts o = {.ctx = 1 + p[0] % 32, .heldout = (p[0] >> 5) / 8.0 * 0.9, .seed = 1};
    struct toy_sft *d;
    if (toy_sft_from_text((const char *)p + 1, n - 1, tok, &o, &d)) return;
    int64_t B = 1 + p[0] % 3, T = toy_sft_ctx(d);
    size_t bt = (size_t)(B * T);
    int32_t *x = malloc(bt * 4), *y = malloc(bt * 4), *pos = malloc(bt * 4), *seg = malloc(bt * 4);
    for (int i = 0; i < 3; i++) toy_sft_next_batch(d, B, x, y);
    for (int i = 0; i < 3; i++)
        if (toy_sft_next_packed(d, B, x, y, pos, seg) < 1) abort();
    int64_t positions;
    toy_sft_packed_batches(d, B, 2, &positions);
    for (int64_t i = 0; i < toy_sft_n_heldout(d) && i < 16; i += B) toy_sft_eval_batch(d, i, B, x, y);
    struct toy_sft_state s;
    toy_sft_get_state(d, &s);
    toy_sft_set_state(d, &s);
    toy_sft_fingerprint(d);
    free(x);
    free(y);
    free(pos);
    free(seg);
    toy_sft_free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) init();
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: token_file(data + 1, size - 1); break;
    case 1: loader(data + 1, size - 1); break;
    case 2: sft(data + 1, size - 1); break;
    }
    return 0;
}
