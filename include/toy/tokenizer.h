/* toy/tokenizer.h: text <-> token ids, exact to the reference tokenizers.
 *
 * Four algorithms behind one opaque handle:
 *   - byte-level BPE (GPT-2, Llama-3, Qwen2/3, SmolLM2, StarCoder, GPT-NeoX,
 *     GPT-4o): the pre-tokenizer regexes (PCRE2, llama.cpp's table by
 *     tokenizer.ggml.pre name, or a tokenizer.json's own) split the text, each
 *     piece's bytes merge by rank (Hugging Face `tokenizers` / llama.cpp);
 *   - SentencePiece BPE (Llama-2, TinyLlama, Mistral): spaces become U+2581,
 *     a dummy prefix is added, pieces merge by score (or by merge rank for a
 *     tokenizer.json BPE with byte_fallback, as Hugging Face does), characters
 *     missing from the vocabulary fall back to <0xHH> byte tokens (or <unk>);
 *   - SentencePiece Unigram (Gemma/T5-style): Viterbi over piece scores;
 *   - WordPiece (BERT and the embedding models built on it: bge, all-MiniLM,
 *     e5): Hugging Face's BertNormalizer (lowercase, strip accents) and
 *     BertPreTokenizer (whitespace, punctuation, CJK ideographs), then the
 *     longest piece first; pieces are held in llama.cpp's GGUF form, "▁the"
 *     word-initial and "ing" for "##ing". encode(text) with
 *     TOY_ENCODE_MODEL_DEFAULTS is [CLS] ids [SEP]: BOS is [CLS] and EOS
 *     [SEP] for this kind.
 *
 * Vocabularies load from a Hugging Face tokenizer.json (+ tokenizer_config.json
 * beside it), GPT-2 encoder.json + vocab.bpe, a SentencePiece .model, a
 * llama2.c tokenizer.bin, or GGUF metadata (tokenizer.ggml.*), and save as
 * GGUF metadata or tokenizer.json. Any of them can also be built from plain
 * arrays with toy_tokenizer_init(), or learned with toy_tokenizer_train_bpe().
 * Chat templates are in toy/chat-template.h.
 *
 *     struct toy_tokenizer *tok;
 *     if (toy_tokenizer_load("models/smollm2", &tok)) die(toy_last_error());
 *     struct toy_tokens ids = {0};
 *     toy_tokenizer_encode(tok, "Hello world", 11, TOY_ENCODE_PARSE_SPECIAL, &ids);
 *     // ids.ids = {19556, 905}, ids.n = 2
 *     char *text; size_t len;
 *     toy_tokenizer_decode(tok, ids.ids, ids.n, 0, &text, &len);  // "Hello world"
 *     free(text); toy_tokens_free(&ids); toy_tokenizer_free(tok);
 *
 * A tokenizer is immutable after loading; encode/decode may run on many
 * threads at once. Token ids are int32_t (what GGUF and the models use).
 */
#ifndef TOY_TOKENIZER_H
#define TOY_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_tokenizer;

enum toy_tokenizer_kind {
    TOY_TOKENIZER_BPE = 0, /* byte-level BPE (GGUF tokenizer.ggml.model "gpt2") */
    TOY_TOKENIZER_SPM = 1, /* SentencePiece BPE ("llama") */
    TOY_TOKENIZER_UGM = 2, /* SentencePiece Unigram ("t5"/"gemma"-style) */
    TOY_TOKENIZER_WPM = 3, /* WordPiece ("bert"): BOS is [CLS], EOS [SEP] */
};

/* Token types: the values of GGUF tokenizer.ggml.token_type and of
 * SentencePiece's ModelProto.SentencePiece.Type. Append only. */
enum toy_token_type {
    TOY_TOKEN_UNDEFINED = 0,
    TOY_TOKEN_NORMAL = 1,
    TOY_TOKEN_UNKNOWN = 2,
    TOY_TOKEN_CONTROL = 3,      /* <s>, <|endoftext|>: matched in text only with PARSE_SPECIAL */
    TOY_TOKEN_USER_DEFINED = 4, /* added tokens: always matched in text */
    TOY_TOKEN_UNUSED = 5,
    TOY_TOKEN_BYTE = 6,         /* <0xHH> */
};

/* Attributes of added tokens (Hugging Face's lstrip/rstrip): the token
 * swallows the whitespace on that side of it when matched in text. */
enum {
    TOY_TOKEN_ATTR_LSTRIP = 1 << 0,
    TOY_TOKEN_ATTR_RSTRIP = 1 << 1,
};

/* A growable id array that encode appends to; reuse it across calls to avoid
 * allocation. Zero-initialize before first use; free with toy_tokens_free. */
struct toy_tokens {
    int32_t *ids;
    int64_t n, cap;
};
void toy_tokens_free(struct toy_tokens *t);

/* Everything a tokenizer is made of, as plain arrays (what GGUF stores).
 * All pointers are borrowed for the duration of toy_tokenizer_init. */
struct toy_tokenizer_spec {
    enum toy_tokenizer_kind kind;
    int64_t n_tokens;
    const char *const *tokens;  /* piece text as the vocabulary stores it: GPT-2 byte-to-unicode
                                   form for BPE, U+2581 for spaces in SentencePiece; WPM: U+2581
                                   before a word-initial piece, a continuation ("##ing") bare */
    const float *scores;        /* n_tokens or NULL (needed by SPM/UGM) */
    const int32_t *types;       /* n_tokens enum toy_token_type, or NULL (all NORMAL; SPM: <0xHH> become BYTE) */
    const uint8_t *attrs;       /* n_tokens TOY_TOKEN_ATTR_* bits, or NULL */
    int64_t n_merges;
    const char *const *merges;  /* BPE: "left right", rank = index. SPM with merges merges by rank
                                   (Hugging Face's BPE with byte_fallback) instead of by score */
    const char *pre;            /* BPE pre-tokenizer name as in GGUF tokenizer.ggml.pre
                                   ("gpt-2", "llama-bpe", "qwen2", "smollm", "starcoder", ...); NULL = "default" */
    int n_pre_regex;            /* or: explicit regexes applied in sequence (overrides pre) */
    const char *const *pre_regex;
    int32_t bos, eos, unk, pad, eot; /* -1 when absent */
    bool add_bos, add_eos;
    bool add_space_prefix;      /* SPM/UGM dummy prefix (default true there) */
    bool prefix_every_fragment; /* the prefix on every text fragment between special tokens (HF's
                                   Prepend normalizer), not only the first and after specials (llama.cpp) */
    bool ignore_merges;         /* BPE: a piece that is itself in the vocabulary is not merged (Llama-3) */
    bool nfc;                   /* NFC-normalize text before encoding */
    /* WPM: Hugging Face's BertNormalizer and WordPiece settings; zero is BERT-uncased's */
    bool keep_case;             /* do not lowercase (a cased model: lowercase false) */
    int strip_accents;          /* NFD, then drop nonspacing marks: 0 when lowercasing (HF's null), 1 always,
                                   -1 never */
    int32_t max_word_chars;     /* a word of more code points is [UNK] (0: 100, max_input_chars_per_word) */
    const char *chat_template;  /* Jinja source or NULL */
};

/* Builds a tokenizer. Checks every id, merge and token: duplicate tokens keep
 * the first id, a merge naming a token that is not in the vocabulary is an
 * error (TOY_ERR_FORMAT, with the merge's index), and so is a WordPiece
 * vocabulary without an UNK id (a word it cannot cover becomes UNK). */
enum toy_status toy_tokenizer_init(const struct toy_tokenizer_spec *spec, struct toy_tokenizer **out);
void toy_tokenizer_free(struct toy_tokenizer *tok);

/* Loads from `path`: a GGUF (known by its magic bytes, whatever its name: a
 * run's weights/latest has no suffix), a tokenizer.json (tokenizer_config.json beside
 * it is read too), a directory holding tokenizer.json / tokenizer.model /
 * encoder.json+vocab.bpe / vocab.json+merges.txt, a SentencePiece .model, or a
 * llama2.c .bin. A directory with both tokenizer.model (SentencePiece) and a
 * non-byte-level tokenizer.json segments with the .model and takes added
 * tokens, specials and the chat template from the JSON files. "-" (standard
 * input), a pipe such as /dev/stdin, or a FIFO is read once, whole: a GGUF
 * by its magic, else by its name as a file is (a tokenizer.json when the
 * name says nothing). */
enum toy_status toy_tokenizer_load(const char *path, struct toy_tokenizer **out);
/* Hugging Face tokenizer.json; config_path (tokenizer_config.json) may be NULL:
 * it supplies bos/eos/add_bos and the chat template. A WordPiece model
 * (BertNormalizer, BertPreTokenizer) is read into the GGUF form ("##x" -> "x",
 * other vocabulary entries "▁x", added tokens as they are), [CLS]/[SEP] and
 * whether they are added from its post_processor (TemplateProcessing or
 * BertProcessing); tokenizer_config.json's do_lower_case and strip_accents
 * override the normalizer's, as transformers does. What it cannot follow (a
 * normalizer or pre-tokenizer of another kind, clean_text or
 * handle_chinese_chars false) is TOY_ERR_UNSUPPORTED naming it. */
enum toy_status toy_tokenizer_load_hf(const char *json_path, const char *config_path,
                                      struct toy_tokenizer **out);
/* The same from memory (json text need not be NUL-terminated). */
enum toy_status toy_tokenizer_load_hf_mem(const char *json, size_t len, const char *config_json,
                                          size_t config_len, struct toy_tokenizer **out);
/* OpenAI GPT-2 encoder.json + vocab.bpe; pre names the pre-tokenizer (NULL: "gpt-2"). */
enum toy_status toy_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe,
                                        const char *pre, struct toy_tokenizer **out);
/* SentencePiece ModelProto (.model); BPE or Unigram per its trainer_spec. */
enum toy_status toy_tokenizer_load_spm(const char *model_path, struct toy_tokenizer **out);
enum toy_status toy_tokenizer_load_spm_mem(const void *data, size_t len, struct toy_tokenizer **out);
/* From the tokenizer.ggml.* metadata of a GGUF file (llama.cpp's keys:
 * model "gpt2"/"llama"/"t5"/"bert", pre, tokens, scores, token_type, merges,
 * bos/eos/unknown/padding/eot_token_id, add_bos_token, add_eos_token,
 * add_space_prefix; tokenizer.chat_template). Array lengths must agree and
 * tokens must be valid UTF-8 without NULs (TOY_ERR_FORMAT naming the key).
 * "bert" as llama.cpp reads it: [CLS] from bos_token_id (else cls_token_id,
 * else 101), [SEP] from seperator_token_id (else 102), unknown 100, padding
 * 0 (defaults that the vocabulary is too small for are none), normalizer.lowercase
 * (default true) and normalizer.strip_accents (default: as lowercase), and
 * [CLS]/[SEP] always added under TOY_ENCODE_MODEL_DEFAULTS, whatever
 * add_bos_token/add_eos_token say (llama.cpp adds them for any "bert"
 * vocabulary). */
struct toy_gguf;
struct toy_gguf_writer;
/* g NULL (m->gguf of a model made by toy_llama_new) is TOY_ERR_INVALID_ARG. */
enum toy_status toy_tokenizer_load_gguf(const struct toy_gguf *g, struct toy_tokenizer **out);
enum toy_status toy_tokenizer_load_gguf_file(const char *gguf_path, struct toy_tokenizer **out);
/* Writes those keys (for `toy convert` and `toy tokenizer train`). */
enum toy_status toy_tokenizer_write_gguf(const struct toy_tokenizer *tok, struct toy_gguf_writer *w);
/* The same for a model whose embedding has rows beyond the vocabulary (a
 * padded vocab_size): the token list is padded to `rows` with "[PAD<id>]"
 * tokens of type UNUSED, as llama.cpp's converter writes them, so that the
 * file's token count matches its embedding. */
enum toy_status toy_tokenizer_write_gguf_rows(const struct toy_tokenizer *tok, struct toy_gguf_writer *w, int64_t rows);
/* llama2.c tokenizer.bin (SentencePiece BPE vocabulary, BOS 1 / EOS 2). */
enum toy_status toy_tokenizer_load_llama2c(const char *bin_path, struct toy_tokenizer **out);

/* ---- encoding ---- */

enum {
    TOY_ENCODE_PARSE_SPECIAL = 1 << 0, /* match CONTROL token text ("<|im_start|>") as that token */
    TOY_ENCODE_ADD_BOS = 1 << 1,       /* prepend BOS (if the vocabulary has one) */
    TOY_ENCODE_ADD_EOS = 1 << 2,
    TOY_ENCODE_MODEL_DEFAULTS = 1 << 3, /* add BOS/EOS as the model's add_bos/add_eos say */
    TOY_ENCODE_NO_BOS = 1 << 4,         /* never BOS, whatever the other flags or the model say */
};

/* Appends the ids of text[0..len) to `out`. USER_DEFINED tokens are always
 * matched in the text, CONTROL tokens only with TOY_ENCODE_PARSE_SPECIAL.
 * Invalid UTF-8 never fails: byte-level BPE encodes the stray bytes as their
 * byte tokens, SentencePiece via <0xHH> byte fallback (or <unk>). */
enum toy_status toy_tokenizer_encode(const struct toy_tokenizer *tok, const char *text, size_t len,
                                     unsigned flags, struct toy_tokens *out);

/* ---- decoding ---- */

enum {
    TOY_DECODE_SKIP_SPECIAL = 1 << 0, /* CONTROL/UNKNOWN/UNUSED tokens produce no text */
    TOY_DECODE_KEEP_LEADING_SPACE = 1 << 1, /* SPM: keep the dummy-prefix space of the first token
                                               (WPM: the space before the first word) */
};

/* Decodes ids into a malloc'd, NUL-terminated string (*len excludes the NUL;
 * len may be NULL).
 * Bytes are output exactly (decode(encode(x)) == x where the vocabulary can
 * represent x); an id out of range is TOY_ERR_RANGE. WordPiece decodes as
 * Hugging Face's WordPiece decoder: words joined by one space, continuations
 * glued to the piece before, no space before the first, and its cleanup of
 * each token (" ." -> ".", " ," -> ",", " 's" -> "'s", ...): lowercased,
 * unaccented, respaced text. */
enum toy_status toy_tokenizer_decode(const struct toy_tokenizer *tok, const int32_t *ids, int64_t n,
                                     unsigned flags, char **text, size_t *len);

/* The bytes token `id` stands for ("Ġworld" -> " world", "<0x0A>" -> "\n"),
 * without any leading-space handling; NULL if out of range. */
const char *toy_tokenizer_token_bytes(const struct toy_tokenizer *tok, int32_t id, size_t *len);

/* Streaming decoder: push ids one at a time, get back text that ends on a
 * UTF-8 character boundary. A character split across tokens (byte tokens,
 * byte-level BPE pieces) is held until complete. */
struct toy_decoder;
enum toy_status toy_decoder_init(const struct toy_tokenizer *tok, unsigned flags, struct toy_decoder **out);
void toy_decoder_free(struct toy_decoder *d);
/* *text points into the decoder (valid until its next call), *len may be 0. */
enum toy_status toy_decoder_push(struct toy_decoder *d, int32_t id, const char **text, size_t *len);
/* Returns what is held (an incomplete character: its bytes as they are) and resets. */
void toy_decoder_flush(struct toy_decoder *d, const char **text, size_t *len);
/* The ids to come continue ids[0..n) (a prompt) rather than start a text:
 * if any of these ids has text, an SPM tokenizer's first pushed token
 * keeps its leading space ("Hello" + " world", not "Helloworld"). Call
 * before the first push; nothing is output. */
void toy_decoder_continue(struct toy_decoder *d, const int32_t *ids, int64_t n);

/* Decoded text need not be valid UTF-8 (a model can emit any bytes); JSON
 * needs it. toy_utf8_valid: s[0..n) is valid UTF-8 (no overlong forms,
 * surrogates or code points past U+10FFFF). toy_utf8_clean: a malloc'd,
 * NUL-terminated copy with one U+FFFD for each maximal ill-formed part (a
 * byte that starts no character, or the start of one cut off: "\xe2\x82"
 * is one U+FFFD, as Python's errors="replace" has it), *out_n (if given)
 * its length; NULL when out of memory. */
bool toy_utf8_valid(const char *s, size_t n);
char *toy_utf8_clean(const char *s, size_t n, size_t *out_n);
/* Characters (code points) of toy_utf8_clean(s, n), each U+FFFD one. */
size_t toy_utf8_chars(const char *s, size_t n);

/* ---- vocabulary ---- */

int64_t toy_tokenizer_n_vocab(const struct toy_tokenizer *tok);
enum toy_tokenizer_kind toy_tokenizer_kind(const struct toy_tokenizer *tok);
/* The pre-tokenizer name ("gpt-2", "llama-bpe", ..., "custom"; "default" for SPM/UGM/WPM). */
const char *toy_tokenizer_pre(const struct toy_tokenizer *tok);
/* Piece text as stored ("Ġworld", "▁the"); NULL if id is out of range. */
const char *toy_tokenizer_piece(const struct toy_tokenizer *tok, int32_t id);
/* Id of the stored piece text, or -1. */
int32_t toy_tokenizer_find(const struct toy_tokenizer *tok, const char *piece, size_t len);
enum toy_token_type toy_tokenizer_token_type(const struct toy_tokenizer *tok, int32_t id);
float toy_tokenizer_score(const struct toy_tokenizer *tok, int32_t id);
/* Special ids, -1 when the vocabulary has none. */
int32_t toy_tokenizer_bos(const struct toy_tokenizer *tok);
int32_t toy_tokenizer_eos(const struct toy_tokenizer *tok);
int32_t toy_tokenizer_unk(const struct toy_tokenizer *tok);
int32_t toy_tokenizer_pad(const struct toy_tokenizer *tok);
int32_t toy_tokenizer_eot(const struct toy_tokenizer *tok); /* end of turn (<|eot_id|>, <|im_end|>) */
bool toy_tokenizer_add_bos(const struct toy_tokenizer *tok);
bool toy_tokenizer_add_eos(const struct toy_tokenizer *tok);
/* Is `id` one that ends generation (EOS or EOT)? */
bool toy_tokenizer_is_eog(const struct toy_tokenizer *tok, int32_t id);
/* The fill-in-the-middle tokens, found by their texts as llama.cpp finds them (<|fim_prefix|>, <fim_prefix>,
 * <｜fim▁begin｜>, ▁<PRE>, ...): role 0 the prefix's, 1 the suffix's, 2 the middle's; -1 where the vocabulary has
 * none. */
int32_t toy_tokenizer_fim(const struct toy_tokenizer *tok, int role);
/* The Jinja chat template the vocabulary carries, or NULL. */
const char *toy_tokenizer_chat_template(const struct toy_tokenizer *tok);
/* The merges as "left right" strings, rank order (BPE only; 0 otherwise). */
int64_t toy_tokenizer_n_merges(const struct toy_tokenizer *tok);
const char *toy_tokenizer_merge(const struct toy_tokenizer *tok, int64_t rank);

/* Saves as a Hugging Face tokenizer.json: byte-level BPE (its pre-tokenizer
 * regexes as Split + ByteLevel), Unigram, and WordPiece (BertNormalizer,
 * BertPreTokenizer, TemplateProcessing with [CLS]/[SEP], "##" pieces);
 * SentencePiece BPE has no merge list to write (TOY_ERR_UNSUPPORTED: use
 * GGUF). */
enum toy_status toy_tokenizer_save_hf(const struct toy_tokenizer *tok, const char *path);

/* ---- packed token files ("TOYT", docs/formats.md) ---- */

/* Header (little-endian): "TOYT", u32 version (1), u32 vocab size,
 * u64 token count, then count u32 ids. Written to a temporary name and
 * renamed. Every id must be < n_vocab. */
enum toy_status toy_token_file_write(const char *path, int64_t n_vocab, const int32_t *ids, int64_t n);
/* Reads a whole file (a pipe or /dev/stdin too): checks magic, version,
 * that the size matches the count and every id < vocab size. *ids is
 * malloc'd. */
enum toy_status toy_token_file_read(const char *path, int64_t *n_vocab, int32_t **ids, int64_t *n);
/* The checks of a TOYT image of `size` bytes at p (a mapped file or bytes in
 * memory; `name` for messages): header, size against the count, every id
 * against the vocabulary, each failure named with its offset. The one
 * validator of the format: toy_token_file_read and the data loader use it. */
enum toy_status toy_token_file_check(const uint8_t *p, size_t size, const char *name, uint32_t *vocab,
                                     uint64_t *count);

/* The token stream of a text corpus, the one rule that `toy tokenize
 * --corpus`, `toy train --data TEXT` and `toy eval --data TEXT` share, so
 * that a text and the token file made from it are the same tokens
 * (docs/training.md, "Data"). Each document (one file's text, whole: no
 * splitting at blank lines) is appended to `out` as
 *     [BOS] text [EOS]
 * BOS when the tokenizer asks for one (toy_tokenizer_add_bos) and it has
 * one, unless flags has TOY_ENCODE_NO_BOS (TOY_ENCODE_ADD_BOS: always);
 * EOS only with TOY_ENCODE_ADD_EOS (the tokenizer's add_eos is not
 * applied: a corpus is documents, not prompts); control-token text in the
 * document is plain text unless TOY_ENCODE_PARSE_SPECIAL. */
enum toy_status toy_tokenizer_encode_corpus(const struct toy_tokenizer *tok, const char *text, size_t len,
                                            unsigned flags, struct toy_tokens *out);
/* Whether toy_tokenizer_encode_corpus puts BOS first under `flags` (what
 * a run records, so that it encodes its text the same way on resume). */
bool toy_tokenizer_corpus_bos(const struct toy_tokenizer *tok, unsigned flags);

/* ---- training ---- */

struct toy_bpe_train_opts {
    int64_t vocab_size;    /* total: special tokens + 256 bytes + merges */
    int64_t min_frequency; /* stop when the best pair occurs fewer times (0: 2) */
    const char *pre;       /* pre-tokenizer name (NULL: "gpt-2") */
    const char *const *special_tokens; /* ids 0..n_special-1, the first BOS, the second EOS (one alone is
                                          both); NULL: {"<|endoftext|>"} */
    int n_special;
};

/* Learns a byte-level BPE vocabulary from text[0..len) (BpeTrainer's
 * algorithm with incremental pair counts and a heap: a few MB in seconds).
 * Special-token text in the corpus separates words and is never merged.
 * Fewer than vocab_size tokens result when no pair reaches min_frequency. */
enum toy_status toy_tokenizer_train_bpe(const char *text, size_t len, const struct toy_bpe_train_opts *opts,
                                        struct toy_tokenizer **out);

#ifdef __cplusplus
}
#endif
#endif
