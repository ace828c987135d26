/* token-file.c: packed token files ("TOYT"), the pre-tokenized corpora that
 * `toy tokenize --corpus` writes and training reads, and the rule that turns
 * a text corpus into that token stream (toy_tokenizer_encode_corpus), which
 * text read by `toy train` / `toy eval` goes through too. Format (docs/formats.md,
 * all little-endian): magic "TOYT", u32 version = 1, u32 vocab size,
 * u64 token count, then count u32 token ids. The reader checks the size
 * against the count before allocating and every id against the vocabulary.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/file.h"
#include "toy/tokenizer.h"

#define TOYT_VERSION 1
#define TOYT_HEADER 20

static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

enum toy_status toy_token_file_write(const char *path, int64_t n_vocab, const int32_t *ids, int64_t n) {
    if (n_vocab <= 0 || n_vocab > UINT32_MAX || n < 0 || (n && !ids))
        return toy_error(TOY_ERR_INVALID_ARG, "%s: vocab size %lld, %lld tokens", path, (long long)n_vocab, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return toy_error(TOY_ERR_RANGE, "%s: token %lld is id %d, vocabulary has %lld", path, (long long)i, ids[i], (long long)n_vocab);
    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(path, &r);
    if (st) return st;
    unsigned char h[TOYT_HEADER];
    memcpy(h, "TOYT", 4);
    put_u32(h + 4, TOYT_VERSION);
    put_u32(h + 8, (uint32_t)n_vocab);
    put_u64(h + 12, (uint64_t)n);
    bool ok = fwrite(h, 1, sizeof h, r.f) == sizeof h;
    unsigned char buf[4 * 4096];
    for (int64_t i = 0; ok && i < n;) {
        size_t k = 0;
        for (; k < 4096 && i < n; k++, i++) put_u32(buf + 4 * k, (uint32_t)ids[i]);
        ok = fwrite(buf, 4, k, r.f) == k;
    }
    return toy_file_replace_end(&r, ok);
}

enum toy_status toy_token_file_read(const char *path, int64_t *n_vocab, int32_t **ids, int64_t *n) {
    *ids = NULL;
    *n = 0;
    char *file;
    size_t size;
    enum toy_status st = toy_file_read_all(path, &file, &size); /* no seek: a pipe reads like a file */
    if (st) return st;
    const unsigned char *h = (const unsigned char *)file;
    if (size < TOYT_HEADER) {
        st = toy_error(TOY_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte header", path, size, TOYT_HEADER);
        goto out;
    }
    if (memcmp(h, "TOYT", 4)) { st = toy_error(TOY_ERR_FORMAT, "%s: bad magic (not a TOYT token file)", path); goto out; }
    if (get_u32(h + 4) != TOYT_VERSION) { st = toy_error(TOY_ERR_UNSUPPORTED, "%s: version %u (this reader knows 1)", path, get_u32(h + 4)); goto out; }
    uint32_t vocab = get_u32(h + 8);
    uint64_t count = get_u64(h + 12), body = size - TOYT_HEADER;
    if (vocab == 0 || vocab > INT32_MAX) { /* ids are int32: a larger vocabulary would read back negative ids */
        st = toy_error(TOY_ERR_FORMAT, "%s: vocabulary size %u (1 .. 2^31-1)", path, vocab);
        goto out;
    }
    if (count > body / 4 || body != count * 4) {
        st = toy_error(TOY_ERR_FORMAT, "%s: header says %llu tokens, the file holds %llu bytes of ids", path,
                       (unsigned long long)count, (unsigned long long)body);
        goto out;
    }
    int32_t *res = malloc(count ? count * 4 : 4);
    if (!res) { st = toy_error(TOY_ERR_NOMEM, "%s: out of memory (%llu tokens)", path, (unsigned long long)count); goto out; }
    for (uint64_t i = 0; i < count; i++) {
        uint32_t v = get_u32(h + TOYT_HEADER + 4 * i);
        if (v >= vocab) {
            free(res);
            st = toy_error(TOY_ERR_RANGE, "%s: token %llu is id %u, vocabulary has %u", path, (unsigned long long)i, v, vocab);
            goto out;
        }
        res[i] = (int32_t)v;
    }
    *ids = res;
    *n = (int64_t)count;
    *n_vocab = vocab;
out:
    free(file);
    return st;
}

enum toy_status toy_tokenizer_encode_corpus(const struct toy_tokenizer *tok, const char *text, size_t len,
                                            unsigned flags, struct toy_tokens *out) {
    if (!tok || !out || (!text && len)) return toy_error(TOY_ERR_INVALID_ARG, "tokenizer_encode_corpus: NULL argument");
    unsigned fl = flags & (TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_ADD_EOS);
    if (toy_tokenizer_corpus_bos(tok, flags)) fl |= TOY_ENCODE_ADD_BOS;
    return toy_tokenizer_encode(tok, text, len, fl, out);
}

bool toy_tokenizer_corpus_bos(const struct toy_tokenizer *tok, unsigned flags) {
    return tok && !(flags & TOY_ENCODE_NO_BOS) && toy_tokenizer_bos(tok) >= 0 &&
           ((flags & TOY_ENCODE_ADD_BOS) || toy_tokenizer_add_bos(tok));
}
