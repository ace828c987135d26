/* token-file.c: packed token files ("TOYT"), the pre-tokenized corpora that
 * `toy tokenize --corpus` writes and training reads, and the rule that turns
 * a text corpus into that token stream (toy_tokenizer_encode_corpus), which
 * text read by `toy train` / `toy eval` goes through too. Format (docs/formats.md,
 * all little-endian): magic "TOYT", u32 version = 1, u32 vocab size,
 * u64 token count, then count u32 token ids. The reader checks the size
 * against the count before allocating and every id against the vocabulary.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/data.h" /* TOY_TOKEN_FILE_MAGIC, _VERSION, _HEADER */
#include "toy/file.h"
#include "toy/tokenizer.h"

static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

enum toy_status toy_token_file_write(const char *path, int64_t n_vocab, const int32_t *ids, int64_t n) {
    if (n_vocab <= 0 || n_vocab > INT32_MAX || n < 0 || (n && !ids))
        return toy_error(TOY_ERR_INVALID_ARG, "%s: vocab size %lld, %lld tokens", path, (long long)n_vocab, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab)
            return toy_error(TOY_ERR_RANGE, "%s: token %lld is id %d, vocabulary has %lld", path, (long long)i, ids[i], (long long)n_vocab);
    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(path, &r);
    if (st) return st;
    unsigned char h[TOY_TOKEN_FILE_HEADER];
    memcpy(h, TOY_TOKEN_FILE_MAGIC, 4);
    put_u32(h + 4, TOY_TOKEN_FILE_VERSION);
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

enum toy_status toy_token_file_check(const uint8_t *p, size_t size, const char *name, uint32_t *vocab_out,
                                     uint64_t *count_out) {
    if (!vocab_out || !count_out)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_token_file_check: %s is NULL", vocab_out ? "count" : "vocab");
    if (size < TOY_TOKEN_FILE_HEADER)
        return toy_error(TOY_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte TOYT header (offset 0)", name, size,
                         TOY_TOKEN_FILE_HEADER);
    uint32_t version = get_u32(p + 4), vocab = get_u32(p + 8);
    uint64_t count = get_u64(p + 12), body = size - TOY_TOKEN_FILE_HEADER;
    if (memcmp(p, TOY_TOKEN_FILE_MAGIC, 4))
        return toy_error(TOY_ERR_FORMAT, "%s: bad magic %02x %02x %02x %02x at offset 0 (not a TOYT token file)", name,
                         p[0], p[1], p[2], p[3]);
    if (version != TOY_TOKEN_FILE_VERSION)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: version %" PRIu32 " at offset 4 (this reader knows %d)", name,
                         version, TOY_TOKEN_FILE_VERSION);
    if (vocab == 0 || vocab > INT32_MAX)
        return toy_error(TOY_ERR_FORMAT, "%s: vocabulary size %" PRIu32 " at offset 8 (must be 1..%d)", name, vocab,
                         INT32_MAX);
    if (count > body / 4 || body != count * 4)
        return toy_error(TOY_ERR_FORMAT,
                         "%s: count %" PRIu64 " at offset 12 needs %s bytes of ids, the file holds %" PRIu64
                         " (truncated or trailing bytes)",
                         name, count, count > body / 4 ? "more" : "fewer", body);
    if (count > INT64_MAX) return toy_error(TOY_ERR_FORMAT, "%s: count %" PRIu64 " at offset 12", name, count);
    /* Every id up front, a block at a time: a branch-free max, and only a
     * block that fails is searched for the first bad id. */
    const uint8_t *ids = p + TOY_TOKEN_FILE_HEADER;
    for (uint64_t b = 0; b < count; b += 4096) {
        uint64_t e = count - b < 4096 ? count : b + 4096;
        uint32_t mx = 0;
        for (uint64_t i = b; i < e; i++) {
            uint32_t v = get_u32(ids + 4 * i);
            mx = v > mx ? v : mx;
        }
        if (mx < vocab) continue;
        uint64_t i = b;
        while (get_u32(ids + 4 * i) < vocab) i++;
        return toy_error(TOY_ERR_RANGE, "%s: token %" PRIu64 " (offset %" PRIu64 ") is id %" PRIu32
                                        ", the vocabulary has %" PRIu32,
                         name, i, (uint64_t)TOY_TOKEN_FILE_HEADER + 4 * i, get_u32(ids + 4 * i), vocab);
    }
    *vocab_out = vocab;
    *count_out = count;
    return TOY_OK;
}

enum toy_status toy_token_file_read(const char *path, int64_t *n_vocab, int32_t **ids, int64_t *n) {
    if (!n_vocab || !ids || !n)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_token_file_read: %s is NULL", !n_vocab ? "n_vocab" : !ids ? "ids" : "n");
    *ids = NULL;
    *n = 0;
    char *file;
    size_t size;
    enum toy_status st = toy_file_read_all(path, &file, &size); /* no seek: a pipe reads like a file */
    if (st) return st;
    uint32_t vocab = 0;
    uint64_t count = 0;
    st = toy_token_file_check((const uint8_t *)file, size, path, &vocab, &count);
    int32_t *res = st ? NULL : malloc(count ? count * 4 : 4);
    if (!st && !res) st = toy_error(TOY_ERR_NOMEM, "%s: out of memory (%llu tokens)", path, (unsigned long long)count);
    if (!st) {
        for (uint64_t i = 0; i < count; i++) res[i] = (int32_t)get_u32((const unsigned char *)file + TOY_TOKEN_FILE_HEADER + 4 * i);
        *ids = res;
        *n = (int64_t)count;
        *n_vocab = vocab;
    }
    free(file);
    return st;
}

enum toy_status toy_tokenizer_encode_corpus(const struct toy_tokenizer *tok, const char *text, size_t len,
                                            unsigned flags, struct toy_tokens *out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_encode_corpus: out is NULL");
    if (!tok || (!text && len)) return toy_error(TOY_ERR_INVALID_ARG, "tokenizer_encode_corpus: NULL argument");
    unsigned fl = flags & (TOY_ENCODE_PARSE_SPECIAL | TOY_ENCODE_ADD_EOS);
    if (toy_tokenizer_corpus_bos(tok, flags)) fl |= TOY_ENCODE_ADD_BOS;
    return toy_tokenizer_encode(tok, text, len, fl, out);
}

bool toy_tokenizer_corpus_bos(const struct toy_tokenizer *tok, unsigned flags) {
    return tok && !(flags & TOY_ENCODE_NO_BOS) && toy_tokenizer_bos(tok) >= 0 &&
           ((flags & TOY_ENCODE_ADD_BOS) || toy_tokenizer_add_bos(tok));
}
