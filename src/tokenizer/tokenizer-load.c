/* tokenizer-load.c: reading vocabularies from the files models ship with:
 * Hugging Face tokenizer.json (+ tokenizer_config.json), OpenAI GPT-2
 * encoder.json + vocab.bpe, SentencePiece ModelProto (.model) and llama2.c
 * tokenizer.bin; and toy_tokenizer_load() which picks one by path (a pipe
 * or "-", read once, by its first bytes or its name). Files are read to
 * their end (toy_file_read_all), never sized by seeking, so any of them may
 * be a pipe.
 *
 * Formats: tokenizer.json is the `tokenizers` library's serialization
 * (model.vocab piece->id, model.merges as "a b" strings or ["a","b"] pairs,
 * added_tokens, pre_tokenizer/normalizer trees; a WordPiece model is turned
 * into llama.cpp's GGUF form of it, convert_hf_to_gguf.py's "phantom space"
 * vocabulary, so that a folder and its GGUF tokenize alike). The .model file is protobuf
 * (sentencepiece_model.proto): ModelProto{1: repeated SentencePiece{1 piece,
 * 2 score, 3 type}, 2: TrainerSpec{3 model_type, 35 byte_fallback, 40..43
 * unk/bos/eos/pad id}, 3: NormalizerSpec{3 add_dummy_prefix}}. Every length
 * and id read from a file is checked against the bytes present.
 */
#include "tokenizer-impl.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "toy/file.h"
#include "toy/gguf.h"


/* st, with the error message prefixed by path (the loaders by path name their file) */
static enum toy_status named(enum toy_status st, const char *path) {
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", toy_last_error());
        toy_error(st, "%s: %s", path, msg);
    }
    return st;
}

static void spec_defaults(struct toy_tokenizer_spec *s) {
    memset(s, 0, sizeof *s);
    s->bos = s->eos = s->unk = s->pad = s->eot = -1;
}

/* Token id by text, or -1. */
static int32_t find_text(char **tokens, int64_t n, const char *t) {
    if (!t) return -1;
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] && !strcmp(tokens[i], t)) return (int32_t)i;
    return -1;
}

static int32_t find_first(char **tokens, int64_t n, const char *const *cands) {
    for (; *cands; cands++) {
        int32_t id = find_text(tokens, n, *cands);
        if (id >= 0) return id;
    }
    return -1;
}

static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", NULL};

/* ---- Hugging Face tokenizer.json ---- */

#define RE_GPT2_HF "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

struct hf_pre {
    int n;
    char *re[TOK_MAX_REGEX];
    bool byte_level, metaspace, digits_individual, prepend_space;
    enum toy_status st;
};

static char *regex_quote(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(2 * n + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strchr("\\^$.|?*+()[]{}", s[i])) *p++ = '\\';
        *p++ = s[i];
    }
    *p = 0;
    return o;
}

static void hf_pre_add(struct hf_pre *p, const char *re, bool own) {
    if (p->st) return;
    if (p->n >= TOK_MAX_REGEX) {
        p->st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: more than %d pre-tokenizer splits", TOK_MAX_REGEX);
        if (own) free((char *)re);
        return;
    }
    p->re[p->n++] = own ? (char *)re : strdup(re);
}

static void hf_pre_walk(struct hf_pre *p, json_t *node) {
    if (!json_is_object(node) || p->st) return;
    const char *type = json_string_value(json_object_get(node, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        json_t *arr = json_object_get(node, "pretokenizers");
        size_t i;
        json_t *v;
        json_array_foreach(arr, i, v) hf_pre_walk(p, v);
    } else if (!strcmp(type, "Split")) {
        json_t *pat = json_object_get(node, "pattern");
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        const char *lit = json_string_value(json_object_get(pat, "String"));
        const char *beh = json_string_value(json_object_get(node, "behavior"));
        if (beh && strcmp(beh, "Isolated") && strcmp(beh, "Removed"))
            p->st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: Split behavior '%s' is not supported", beh);
        else if (json_is_true(json_object_get(node, "invert")))
            p->st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: inverted Split is not supported");
        else if (re) hf_pre_add(p, re, false);
        else if (lit) hf_pre_add(p, regex_quote(lit), true);
    } else if (!strcmp(type, "ByteLevel")) {
        p->byte_level = true;
        json_t *ur = json_object_get(node, "use_regex");
        if (!ur || json_is_true(ur)) hf_pre_add(p, RE_GPT2_HF, false);
    } else if (!strcmp(type, "Digits")) {
        bool ind = json_is_true(json_object_get(node, "individual_digits"));
        p->digits_individual = ind;
        /* tokenizers' Digits splits on char::is_ascii_digit */
        hf_pre_add(p, ind ? "[0-9]" : "[0-9]+", false);
    } else if (!strcmp(type, "Metaspace")) {
        p->metaspace = true;
        const char *ps = json_string_value(json_object_get(node, "prepend_scheme"));
        json_t *aps = json_object_get(node, "add_prefix_space");
        p->prepend_space = ps ? strcmp(ps, "never") != 0 : (!aps || json_is_true(aps));
    } else {
        p->st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: pre-tokenizer '%s' is not supported", type);
    }
}

/* The GGUF tokenizer.ggml.pre name for a regex sequence from tokenizer.json. */
static const char *hf_pre_name(const struct hf_pre *p) {
    if (p->n == 0) return "none";
    if (p->n == 1 && !strcmp(p->re[0], RE_GPT2_HF)) return "gpt-2";
    if (p->n == 2 && p->digits_individual && !strcmp(p->re[1], RE_GPT2_HF)) return "smollm";
    /* a regex set that is one of the table's as is (o200k): its own name, before the guesses below */
    static const char *const exact[] = {"gpt-4o", "qwen35", "tekken"};
    for (size_t k = 0; k < sizeof exact / sizeof exact[0]; k++) {
        int n;
        const char *const *re;
        bool same = toy_tok_pre_regexes(exact[k], &n, &re) && n == p->n;
        for (int i = 0; same && i < n; i++) same = !strcmp(re[i], p->re[i]);
        if (same) return exact[k];
    }
    for (int i = 0; i < p->n; i++) {
        if (strstr(p->re[i], "\\p{N}{1,3}")) return "llama-bpe";
        if (strstr(p->re[i], "|\\p{N}|") || strstr(p->re[i], "|\\p{N}| ")) return "qwen2";
    }
    return "custom";
}

static const char *token_content(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    return json_string_value(json_object_get(v, "content"));
}

static void normalizer_walk(json_t *n, bool *nfc, bool *prepend, bool *replace) {
    const char *type = json_string_value(json_object_get(n, "type"));
    if (!type) return;
    if (!strcmp(type, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(n, "normalizers"), i, v) normalizer_walk(v, nfc, prepend, replace);
    } else if (!strcmp(type, "NFC")) *nfc = true;
    else if (!strcmp(type, "Prepend")) *prepend = true;
    else if (!strcmp(type, "Replace")) *replace = true;
}

/* The one object a "Sequence" of a single step wraps, or node itself. */
static json_t *hf_single(json_t *node, const char *list) {
    const char *t = json_string_value(json_object_get(node, "type"));
    json_t *a = json_object_get(node, list);
    return t && !strcmp(t, "Sequence") && json_array_size(a) == 1 ? json_array_get(a, 0) : node;
}

static const char *hf_special_id(json_t *item) {
    return json_string_value(json_object_get(json_object_get(item, "SpecialToken"), "id"));
}

/* A WordPiece tokenizer.json (BERT's: BertNormalizer, BertPreTokenizer,
 * TemplateProcessing or BertProcessing, WordPiece with "##" continuations)
 * into the spec of a WPM tokenizer, its vocabulary rewritten as llama.cpp's
 * converter writes it: "##x" -> "x", other entries "▁x"; added tokens, and
 * the special tokens the model and post-processor name, stay as they are.
 * tokens[]/types[] come filled from model.vocab and added_tokens; the
 * rewritten strings are malloc'd into *owned (n entries). */
static enum toy_status hf_wordpiece(json_t *root, json_t *cfg, char **tokens, int32_t *types, int64_t n,
                                    struct toy_tokenizer_spec *spec, char ***owned) {
    json_t *model = json_object_get(root, "model");
    json_t *norm = hf_single(json_object_get(root, "normalizer"), "normalizers");
    const char *nt = json_string_value(json_object_get(norm, "type"));
    if (!nt || strcmp(nt, "BertNormalizer"))
        return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: WordPiece with normalizer '%s' (only BertNormalizer)",
                         nt ? nt : "null");
    static const char *const always[] = {"clean_text", "handle_chinese_chars"};
    for (int k = 0; k < 2; k++)
        if (json_is_false(json_object_get(norm, always[k])))
            return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: normalizer.%s false is not supported", always[k]);
    bool lower = !json_is_false(json_object_get(norm, "lowercase"));
    json_t *sa = json_object_get(norm, "strip_accents");
    int strip = json_is_true(sa) ? 1 : json_is_false(sa) ? -1 : 0;
    /* transformers' BertTokenizerFast rebuilds the normalizer from tokenizer_config.json's values where they
     * differ (we only where the config names them: its own defaults would lowercase a cased tokenizer.json) */
    json_t *dl = cfg ? json_object_get(cfg, "do_lower_case") : NULL;
    if (json_is_boolean(dl)) lower = json_is_true(dl);
    json_t *cs = cfg ? json_object_get(cfg, "strip_accents") : NULL;
    if (cs) strip = json_is_true(cs) ? 1 : json_is_false(cs) ? -1 : 0;
    if (cfg && json_is_false(json_object_get(cfg, "tokenize_chinese_chars")))
        return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer_config.json: tokenize_chinese_chars false is not supported");

    json_t *pt = hf_single(json_object_get(root, "pre_tokenizer"), "pretokenizers");
    const char *ptt = json_string_value(json_object_get(pt, "type"));
    if (!ptt || strcmp(ptt, "BertPreTokenizer"))
        return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: WordPiece with pre_tokenizer '%s' (only BertPreTokenizer)",
                         ptt ? ptt : "null");

    const char *prefix = "##", *unk = "[UNK]";
    json_t *jp = json_object_get(model, "continuing_subword_prefix"), *ju = json_object_get(model, "unk_token");
    if (json_is_string(jp)) prefix = json_string_value(jp);
    if (json_is_string(ju)) unk = json_string_value(ju);
    if (!*prefix) return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: an empty model.continuing_subword_prefix");
    json_t *mw = json_object_get(model, "max_input_chars_per_word");
    if (mw && !json_is_null(mw)) {
        if (!json_is_integer(mw) || json_integer_value(mw) < 1 || json_integer_value(mw) > INT32_MAX)
            return toy_error(TOY_ERR_FORMAT, "tokenizer.json: model.max_input_chars_per_word is not a positive count");
        spec->max_word_chars = (int32_t)json_integer_value(mw);
    }

    /* [CLS] and [SEP], and whether a single text gets them */
    json_t *post = json_object_get(root, "post_processor"), *tp = NULL;
    const char *ptype = json_string_value(json_object_get(post, "type"));
    const char *cls = NULL, *sep = NULL;
    bool add_cls = false, add_sep = false;
    if (ptype && !strcmp(ptype, "Sequence")) {
        size_t i;
        json_t *v;
        json_array_foreach(json_object_get(post, "processors"), i, v) {
            const char *t = json_string_value(json_object_get(v, "type"));
            if (t && (!strcmp(t, "TemplateProcessing") || !strcmp(t, "BertProcessing"))) tp = v;
        }
    } else if (ptype) {
        tp = post;
    }
    ptype = json_string_value(json_object_get(tp, "type"));
    if (ptype && !strcmp(ptype, "TemplateProcessing")) {
        json_t *single = json_object_get(tp, "single");
        size_t ns = json_array_size(single);
        if (ns > 0 && (cls = hf_special_id(json_array_get(single, 0)))) add_cls = true;
        if (ns > 1 && (sep = hf_special_id(json_array_get(single, ns - 1)))) add_sep = true;
    } else if (ptype && (!strcmp(ptype, "BertProcessing") || !strcmp(ptype, "RobertaProcessing"))) {
        cls = json_string_value(json_array_get(json_object_get(tp, "cls"), 0));
        sep = json_string_value(json_array_get(json_object_get(tp, "sep"), 0));
        add_cls = cls != NULL;
        add_sep = sep != NULL;
    } else if (post && !json_is_null(post)) {
        return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: WordPiece with post_processor '%s'",
                         ptype ? ptype : "(no type)");
    }
    const char *ccls = cfg ? token_content(json_object_get(cfg, "cls_token")) : NULL;
    const char *csep = cfg ? token_content(json_object_get(cfg, "sep_token")) : NULL;
    const char *pad = cfg ? token_content(json_object_get(cfg, "pad_token")) : NULL;
    const char *mask = cfg ? token_content(json_object_get(cfg, "mask_token")) : NULL;
    if (!cls) cls = ccls ? ccls : "[CLS]";
    if (!sep) sep = csep ? csep : "[SEP]";
    if (!pad) pad = "[PAD]";
    if (!mask) mask = "[MASK]";

    if (!(*owned = calloc((size_t)n, sizeof **owned))) return toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory");
    const char *const named[] = {unk, cls, sep, pad, mask};
    size_t pl = strlen(prefix);
    for (int64_t k = 0; k < n; k++) {
        if (types[k] != TOY_TOKEN_NORMAL) continue; /* an added token: matched by its text, kept as it is */
        bool special = false;
        for (int j = 0; j < 5 && !special; j++) special = !strcmp(tokens[k], named[j]);
        if (special) {
            types[k] = TOY_TOKEN_CONTROL;
            continue;
        }
        size_t l = strlen(tokens[k]);
        bool cont = !strncmp(tokens[k], prefix, pl);
        char *t = malloc(l + 4);
        if (!t) return toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory");
        if (cont) memcpy(t, tokens[k] + pl, l - pl + 1);
        else {
            memcpy(t, "\xe2\x96\x81", 3);
            memcpy(t + 3, tokens[k], l + 1);
        }
        tokens[k] = (*owned)[k] = t;
    }

    spec->kind = TOY_TOKENIZER_WPM;
    spec->n_tokens = n;
    spec->tokens = (const char *const *)tokens;
    spec->types = types;
    spec->keep_case = !lower;
    spec->strip_accents = strip;
    spec->unk = find_text(tokens, n, unk);
    if (spec->unk < 0)
        return toy_error(TOY_ERR_FORMAT, "tokenizer.json: the WordPiece unk_token '%s' is not in the vocabulary", unk);
    spec->bos = find_text(tokens, n, cls);
    spec->eos = find_text(tokens, n, sep);
    spec->pad = find_text(tokens, n, pad);
    if ((add_cls && spec->bos < 0) || (add_sep && spec->eos < 0))
        return toy_error(TOY_ERR_FORMAT, "tokenizer.json: post_processor adds '%s', which is not in the vocabulary",
                         add_cls && spec->bos < 0 ? cls : sep);
    spec->add_bos = add_cls;
    spec->add_eos = add_sep;
    return TOY_OK;
}

enum toy_status toy_tokenizer_load_hf_mem(const char *json, size_t len, const char *config_json,
                                          size_t config_len, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_hf_mem: out is NULL");
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, 0, &jerr), *cfg = NULL;
    if (!root) return toy_error(TOY_ERR_FORMAT, "tokenizer.json: line %d: %s", jerr.line, jerr.text);
    if (config_json && !(cfg = json_loadb(config_json, config_len, JSON_DECODE_INT_AS_REAL, &jerr))) {
        json_decref(root);
        return toy_error(TOY_ERR_FORMAT, "tokenizer_config.json: line %d: %s", jerr.line, jerr.text);
    }
    enum toy_status st = TOY_OK;
    struct toy_tokenizer_spec spec;
    spec_defaults(&spec);
    char **tokens = NULL, **merges = NULL, **owned = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    uint8_t *attrs = NULL;
    int64_t n = 0, nm = 0;
    struct hf_pre pre = {0};
    json_t *model = json_object_get(root, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(root, "added_tokens");
    if (!mtype) mtype = json_is_array(vocab) ? "Unigram" : "BPE";
    bool unigram = !strcmp(mtype, "Unigram"), wordpiece = !strcmp(mtype, "WordPiece");
    if (strcmp(mtype, "BPE") && !unigram && !wordpiece) {
        st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported", mtype);
        goto done;
    }
    /* vocabulary size: the largest id + 1 */
    size_t i;
    json_t *v;
    const char *key;
    if (unigram ? !json_is_array(vocab) : !json_is_object(vocab)) {
        st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: model.vocab is missing or has the wrong type");
        goto done;
    }
    n = unigram ? (int64_t)json_array_size(vocab) : 0;
    if (!unigram) json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: vocab entry '%s' has a bad id", key);
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (!json_is_integer(json_object_get(v, "id")) || id < 0 || id >= INT32_MAX || !token_content(v)) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: added_tokens[%zu] has a bad id or content", i);
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    if (n <= 0) { st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: empty vocabulary"); goto done; }
    tokens = calloc((size_t)n, sizeof *tokens);
    types = calloc((size_t)n, sizeof *types);
    scores = calloc((size_t)n, sizeof *scores);
    if (!tokens || !types || !scores) { st = toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory"); goto done; }
    if (unigram) {
        json_array_foreach(vocab, i, v) {
            const char *p = json_string_value(json_array_get(v, 0));
            if (!p || !json_is_number(json_array_get(v, 1))) {
                st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: model.vocab[%zu] is not [piece, score]", i);
                goto done;
            }
            tokens[i] = (char *)p;
            scores[i] = (float)json_number_value(json_array_get(v, 1));
            types[i] = TOY_TOKEN_NORMAL;
        }
        json_t *u = json_object_get(model, "unk_id");
        if (json_is_integer(u)) spec.unk = (int32_t)json_integer_value(u);
    } else {
        json_object_foreach(vocab, key, v) {
            json_int_t id = json_integer_value(v);
            if (!tokens[id]) { tokens[id] = (char *)key; types[id] = TOY_TOKEN_NORMAL; }
        }
    }
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        tokens[id] = (char *)token_content(v);
        types[id] = json_is_true(json_object_get(v, "special")) ? TOY_TOKEN_CONTROL : TOY_TOKEN_USER_DEFINED;
        uint8_t a = (json_is_true(json_object_get(v, "lstrip")) ? TOY_TOKEN_ATTR_LSTRIP : 0) |
                    (json_is_true(json_object_get(v, "rstrip")) ? TOY_TOKEN_ATTR_RSTRIP : 0);
        if (a && !attrs && !(attrs = calloc((size_t)n, 1))) { st = toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory"); goto done; }
        if (a) attrs[id] = a;
    }
    for (int64_t k = 0; k < n; k++)
        if (!tokens[k]) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: no token has id %lld (vocabulary of %lld)",
                           (long long)k, (long long)n);
            goto done;
        }

    /* merges: "a b" strings or ["a", "b"] pairs */
    json_t *jm = json_object_get(model, "merges");
    if (!unigram) {
        nm = json_is_array(jm) ? (int64_t)json_array_size(jm) : 0;
        merges = calloc(nm ? (size_t)nm : 1, sizeof *merges);
        if (!merges) { st = toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory"); goto done; }
        json_array_foreach(jm, i, v) {
            if (json_is_string(v)) {
                merges[i] = strdup(json_string_value(v));
            } else if (json_is_array(v) && json_array_size(v) == 2 && json_is_string(json_array_get(v, 0)) &&
                       json_is_string(json_array_get(v, 1))) {
                const char *a = json_string_value(json_array_get(v, 0)), *b = json_string_value(json_array_get(v, 1));
                size_t la = strlen(a), lb = strlen(b);
                if ((merges[i] = malloc(la + lb + 2))) {
                    memcpy(merges[i], a, la);
                    merges[i][la] = ' ';
                    memcpy(merges[i] + la + 1, b, lb + 1);
                }
            } else {
                st = toy_error(TOY_ERR_FORMAT, "tokenizer.json: model.merges[%zu] is neither \"a b\" nor [a, b]", i);
                goto done;
            }
            if (!merges[i]) { st = toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory"); goto done; }
        }
    }

    if (wordpiece) {
        spec.attrs = attrs;
        st = hf_wordpiece(root, cfg, tokens, types, n, &spec, &owned);
        goto init;
    }
    hf_pre_walk(&pre, json_object_get(root, "pre_tokenizer"));
    if ((st = pre.st)) goto done;
    bool nfc = false, prepend = false, replace = false;
    normalizer_walk(json_object_get(root, "normalizer"), &nfc, &prepend, &replace);
    bool byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));

    spec.n_tokens = n;
    spec.tokens = (const char *const *)tokens;
    spec.types = types;
    spec.attrs = attrs;
    spec.scores = scores;
    spec.nfc = nfc;
    if (unigram) {
        spec.kind = TOY_TOKENIZER_UGM;
        spec.add_space_prefix = prepend || pre.prepend_space || !pre.metaspace ? true : false;
        for (int64_t k = 0; k < n; k++)
            if (toy_tok_parse_byte_piece(tokens[k], strlen(tokens[k])) >= 0) types[k] = TOY_TOKEN_BYTE;
    } else if (pre.byte_level) {
        spec.kind = TOY_TOKENIZER_BPE;
        spec.n_merges = nm;
        spec.merges = (const char *const *)merges;
        spec.n_pre_regex = pre.n;
        spec.pre_regex = (const char *const *)pre.re;
        spec.pre = hf_pre_name(&pre); /* with no regexes: "none", from the table */
        spec.ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    } else if (byte_fallback || prepend || pre.metaspace) {
        /* SentencePiece BPE exported to tokenizer.json (Llama-2, Mistral): Hugging Face merges by rank */
        spec.kind = TOY_TOKENIZER_SPM;
        spec.add_space_prefix = prepend || pre.prepend_space;
        spec.prefix_every_fragment = prepend;
        spec.n_merges = nm;
        spec.merges = (const char *const *)merges;
        for (int64_t k = 0; k < n; k++)
            if (toy_tok_parse_byte_piece(tokens[k], strlen(tokens[k])) >= 0 && types[k] == TOY_TOKEN_NORMAL) types[k] = TOY_TOKEN_BYTE;
        /* scores for score-based consumers (a GGUF for llama.cpp): a merged piece
           scores minus the rank of the first merge that makes it */
        for (int64_t k = 0; k < n; k++) scores[k] = 0;
        char *cat = NULL;
        size_t cat_cap = 0;
        for (int64_t r = nm - 1; r >= 0; r--) {
            const char *sp = strchr(merges[r], ' ');
            if (!sp) continue;
            size_t l = strlen(merges[r]);
            if (l > cat_cap) {
                char *c2 = realloc(cat, l + 1);
                if (!c2) { free(cat); st = toy_error(TOY_ERR_NOMEM, "tokenizer.json: out of memory"); goto done; }
                cat = c2;
                cat_cap = l;
            }
            size_t a = (size_t)(sp - merges[r]);
            memcpy(cat, merges[r], a);
            memcpy(cat + a, sp + 1, l - a);
            json_t *idv = json_object_get(vocab, cat);
            if (json_is_integer(idv) && json_integer_value(idv) < n) scores[json_integer_value(idv)] = -(float)(r + 1);
        }
        free(cat);
        json_t *u = json_object_get(model, "unk_token");
        spec.unk = find_text(tokens, n, json_string_value(u));
    } else {
        st = toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.json: BPE without ByteLevel or SentencePiece-style normalizer");
        goto done;
    }

    /* specials and chat template from tokenizer_config.json */
    const char *bos = cfg ? token_content(json_object_get(cfg, "bos_token")) : NULL;
    const char *eos = cfg ? token_content(json_object_get(cfg, "eos_token")) : NULL;
    const char *pad = cfg ? token_content(json_object_get(cfg, "pad_token")) : NULL;
    const char *unk = cfg ? token_content(json_object_get(cfg, "unk_token")) : NULL;
    static const char *const bos_names[] = {"<|begin_of_text|>", "<s>", "<bos>", NULL};
    static const char *const eos_names[] = {"<|end_of_text|>", "</s>", "<eos>", "<|endoftext|>", NULL};
    spec.bos = bos ? find_text(tokens, n, bos) : find_first(tokens, n, bos_names);
    spec.eos = eos ? find_text(tokens, n, eos) : find_first(tokens, n, eos_names);
    spec.pad = find_text(tokens, n, pad);
    if (unk) spec.unk = find_text(tokens, n, unk);
    spec.eot = find_first(tokens, n, eot_names);
    json_t *ab = cfg ? json_object_get(cfg, "add_bos_token") : NULL;
    json_t *ae = cfg ? json_object_get(cfg, "add_eos_token") : NULL;
    /* the BOS a TemplateProcessing post-processor puts first, alone or inside a Sequence of processors (Llama 3's
     * tokenizer.json: ByteLevel, then TemplateProcessing) */
    json_t *post = json_object_get(root, "post_processor"), *tp = NULL;
    const char *ptype = json_string_value(json_object_get(post, "type"));
    if (ptype && !strcmp(ptype, "TemplateProcessing")) tp = post;
    else if (ptype && !strcmp(ptype, "Sequence")) {
        json_array_foreach(json_object_get(post, "processors"), i, v) {
            const char *t = json_string_value(json_object_get(v, "type"));
            if (t && !strcmp(t, "TemplateProcessing")) tp = v;
        }
    }
    const char *first = json_string_value(
        json_object_get(json_object_get(json_array_get(json_object_get(tp, "single"), 0), "SpecialToken"), "id"));
    if (first && !bos && find_text(tokens, n, first) >= 0) spec.bos = find_text(tokens, n, first);
    if (ab) spec.add_bos = json_is_true(ab);
    else if (tp) spec.add_bos = first != NULL;
    else spec.add_bos = spec.kind != TOY_TOKENIZER_BPE;
    spec.add_eos = ae && json_is_true(ae);
    json_t *tmpl = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (json_is_string(tmpl)) spec.chat_template = json_string_value(tmpl);
    else if (json_is_array(tmpl)) {
        json_array_foreach(tmpl, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (!spec.chat_template || (name && !strcmp(name, "default")))
                spec.chat_template = json_string_value(json_object_get(v, "template"));
        }
    }
init:
    if (!st) st = toy_tokenizer_init(&spec, out);
done:
    if (owned) for (int64_t k = 0; k < n; k++) free(owned[k]);
    free(owned);
    if (merges) for (int64_t k = 0; k < nm; k++) free(merges[k]);
    free(merges);
    for (int k = 0; k < pre.n; k++) free(pre.re[k]);
    free(tokens);
    free(types);
    free(attrs);
    free(scores);
    json_decref(root);
    json_decref(cfg);
    return st;
}

enum toy_status toy_tokenizer_load_hf(const char *json_path, const char *config_path, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_hf: out is NULL");
    *out = NULL;
    if (!json_path) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_hf: NULL tokenizer.json path");
    char *j = NULL, *c = NULL;
    size_t jl = 0, cl = 0;
    enum toy_status st = toy_file_read_all(json_path, &j, &jl);
    if (!st && config_path) st = toy_file_read_all(config_path, &c, &cl);
    if (!st) st = toy_tokenizer_load_hf_mem(j, jl, c, cl, out);
    free(j);
    free(c);
    return named(st, json_path);
}

/* ---- GPT-2 encoder.json + vocab.bpe ---- */

enum toy_status toy_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe, const char *pre,
                                        struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_gpt2: out is NULL");
    *out = NULL;
    if (!encoder_json || !vocab_bpe)
        return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_gpt2: NULL %s path", encoder_json ? "vocab.bpe" : "encoder.json");
    json_error_t jerr;
    json_t *enc = json_load_file(encoder_json, 0, &jerr);
    if (!enc) return toy_error(TOY_ERR_FORMAT, "%s: line %d: %s", encoder_json, jerr.line, jerr.text);
    enum toy_status st = TOY_OK;
    char *bpe = NULL, **tokens = NULL, **merges = NULL;
    int32_t *types = NULL;
    size_t blen = 0;
    int64_t n = 0, nm = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(enc)) { st = toy_error(TOY_ERR_FORMAT, "%s: not a JSON object", encoder_json); goto done; }
    json_object_foreach(enc, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX) {
            st = toy_error(TOY_ERR_FORMAT, "%s: entry '%s' has a bad id", encoder_json, key);
            goto done;
        }
        if (id + 1 > n) n = id + 1;
    }
    tokens = calloc(n ? (size_t)n : 1, sizeof *tokens);
    types = calloc(n ? (size_t)n : 1, sizeof *types);
    if (!tokens || !types) { st = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
    json_object_foreach(enc, key, v) if (!tokens[json_integer_value(v)]) tokens[json_integer_value(v)] = (char *)key;
    for (int64_t k = 0; k < n; k++) {
        if (!tokens[k]) { st = toy_error(TOY_ERR_FORMAT, "%s: no token has id %lld", encoder_json, (long long)k); goto done; }
        types[k] = TOY_TOKEN_NORMAL;
    }
    if ((st = toy_file_read_all(vocab_bpe, &bpe, &blen))) goto done;
    size_t lines = 1;
    for (size_t k = 0; k < blen; k++) lines += bpe[k] == '\n';
    merges = calloc(lines, sizeof *merges);
    if (!merges) { st = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
    for (char *p = bpe, *e; p < bpe + blen; p = e + 1) {
        e = memchr(p, '\n', (size_t)(bpe + blen - p));
        if (!e) e = bpe + blen;
        *e = 0;
        if (e > p && e[-1] == '\r') e[-1] = 0;
        if (*p == 0 || (p == bpe && !strncmp(p, "#version", 8))) continue;
        merges[nm++] = p;
    }
    int32_t eot = find_text(tokens, n, "<|endoftext|>");
    if (eot >= 0) types[eot] = TOY_TOKEN_CONTROL;
    struct toy_tokenizer_spec spec;
    spec_defaults(&spec);
    spec.kind = TOY_TOKENIZER_BPE;
    spec.n_tokens = n;
    spec.tokens = (const char *const *)tokens;
    spec.types = types;
    spec.n_merges = nm;
    spec.merges = (const char *const *)merges;
    spec.pre = pre ? pre : "gpt-2";
    /* llama.cpp: the Llama-3 and Tekken pre-tokenizers come with ignore_merges */
    spec.ignore_merges = !strcmp(spec.pre, "llama-bpe") || !strcmp(spec.pre, "llama3") || !strcmp(spec.pre, "tekken");
    spec.bos = spec.eos = eot;
    st = named(toy_tokenizer_init(&spec, out), vocab_bpe);
done:
    json_decref(enc);
    free(bpe);
    free(tokens);
    free(types);
    free(merges);
    return st;
}

/* ---- SentencePiece ModelProto ---- */

struct pb {
    const uint8_t *p, *end;
};

static bool pb_varint(struct pb *b, uint64_t *v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) return false;
        uint8_t c = *b->p++;
        r |= (uint64_t)(c & 0x7F) << shift;
        if (!(c & 0x80)) { *v = r; return true; }
    }
    return false;
}

/* Reads one field: key, and for wire type 2 the sub-buffer, for 0 the value,
 * for 5 the 4 bytes; skips 1 (fixed64). */
static bool pb_field(struct pb *b, uint32_t *field, int *wt, uint64_t *val, struct pb *sub) {
    uint64_t key;
    if (!pb_varint(b, &key)) return false;
    *field = (uint32_t)(key >> 3);
    *wt = (int)(key & 7);
    switch (*wt) {
    case 0: return pb_varint(b, val);
    case 1: if (b->end - b->p < 8) return false; b->p += 8; return true;
    case 2:
        if (!pb_varint(b, val) || *val > (uint64_t)(b->end - b->p)) return false;
        sub->p = b->p;
        sub->end = b->p + *val;
        b->p += *val;
        return true;
    case 5:
        if (b->end - b->p < 4) return false;
        memcpy(val, b->p, 4);
        *val &= 0xffffffffu;
        b->p += 4;
        return true;
    default: return false;
    }
}

enum toy_status toy_tokenizer_load_spm_mem(const void *data, size_t len, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_spm_mem: out is NULL");
    *out = NULL;
    struct pb b = {data, (const uint8_t *)data + len}, sub;
    uint32_t field;
    int wt;
    uint64_t val;
    int64_t n = 0, cap = 0;
    char **tokens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    int model_type = 1;
    bool add_dummy = true;
    int32_t unk = 0, bos = 1, eos = 2, pad = -1;
    bool in_piece = false; /* tokens[n] is being filled */
    enum toy_status st = TOY_OK;
    while (b.p < b.end) {
        if (!pb_field(&b, &field, &wt, &val, &sub)) {
            st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: truncated or corrupt at byte %zu",
                           (size_t)(b.p - (const uint8_t *)data));
            goto done;
        }
        if (field == 1 && wt == 2) { /* SentencePiece */
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                char **t = realloc(tokens, (size_t)cap * sizeof *t);
                float *s = t ? realloc(scores, (size_t)cap * sizeof *s) : NULL;
                int32_t *y = s ? realloc(types, (size_t)cap * sizeof *y) : NULL;
                if (t) tokens = t;
                if (s) scores = s;
                if (y) types = y;
                if (!y) { st = toy_error(TOY_ERR_NOMEM, "sentencepiece model: out of memory"); goto done; }
            }
            tokens[n] = NULL;
            in_piece = true;
            scores[n] = 0;
            types[n] = TOY_TOKEN_NORMAL;
            struct pb s2;
            while (sub.p < sub.end) {
                if (!pb_field(&sub, &field, &wt, &val, &s2)) {
                    st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: piece %lld is corrupt", (long long)n);
                    goto done;
                }
                if (field == 1 && wt == 2) {
                    free(tokens[n]);
                    tokens[n] = strndup((const char *)s2.p, (size_t)(s2.end - s2.p));
                    if (!tokens[n]) { st = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
                } else if (field == 2 && wt == 5) {
                    uint32_t u = (uint32_t)val;
                    memcpy(&scores[n], &u, 4);
                } else if (field == 3 && wt == 0) {
                    types[n] = (int32_t)val;
                }
            }
            if (!tokens[n]) { st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: piece %lld has no text", (long long)n); goto done; }
            n++;
            in_piece = false;
            if (n >= INT32_MAX) { st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: too many pieces"); goto done; }
        } else if (field == 2 && wt == 2) { /* TrainerSpec */
            struct pb s2;
            while (sub.p < sub.end) {
                if (!pb_field(&sub, &field, &wt, &val, &s2)) {
                    st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: trainer_spec is corrupt");
                    goto done;
                }
                if (wt != 0) continue;
                if (field == 3) model_type = (int)val;
                else if (field == 40) unk = (int32_t)val;
                else if (field == 41) bos = (int32_t)val;
                else if (field == 42) eos = (int32_t)val;
                else if (field == 43) pad = (int32_t)val;
            }
        } else if (field == 3 && wt == 2) { /* NormalizerSpec */
            struct pb s2;
            while (sub.p < sub.end) {
                if (!pb_field(&sub, &field, &wt, &val, &s2)) {
                    st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: normalizer_spec is corrupt");
                    goto done;
                }
                if (field == 3 && wt == 0) add_dummy = val != 0;
            }
        }
    }
    if (n == 0) { st = toy_error(TOY_ERR_FORMAT, "sentencepiece model: no pieces"); goto done; }
    if (model_type != 1 && model_type != 2) {
        st = toy_error(TOY_ERR_UNSUPPORTED, "sentencepiece model: model_type %d (only Unigram=1 and BPE=2)", model_type);
        goto done;
    }
    struct toy_tokenizer_spec spec;
    spec_defaults(&spec);
    spec.kind = model_type == 2 ? TOY_TOKENIZER_SPM : TOY_TOKENIZER_UGM;
    spec.n_tokens = n;
    spec.tokens = (const char *const *)tokens;
    spec.scores = scores;
    spec.types = types;
    /* signed int32 ids in the proto: -1 means "none" */
    spec.unk = unk >= 0 && unk < n ? unk : -1;
    spec.bos = bos >= 0 && bos < n ? bos : -1;
    spec.eos = eos >= 0 && eos < n ? eos : -1;
    spec.pad = pad >= 0 && pad < n ? pad : -1;
    spec.eot = find_first(tokens, n, eot_names);
    spec.add_bos = true;
    spec.add_space_prefix = add_dummy;
    st = toy_tokenizer_init(&spec, out);
done:
    for (int64_t k = 0; k < n; k++) free(tokens[k]);
    if (in_piece) free(tokens[n]);
    free(tokens);
    free(scores);
    free(types);
    return st;
}

enum toy_status toy_tokenizer_load_spm(const char *path, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_spm: out is NULL");
    char *d;
    size_t l;
    enum toy_status st = toy_file_read_all(path, &d, &l);
    if (st) return st;
    st = toy_tokenizer_load_spm_mem(d, l, out);
    free(d);
    return named(st, path);
}

/* ---- llama2.c tokenizer.bin ---- */

/* The vocabulary in d (l bytes, the file `path`). */
static enum toy_status llama2c_from_bytes(const char *d, size_t l, const char *path, struct toy_tokenizer **out) {
    *out = NULL;
    enum toy_status st = TOY_OK;
    int64_t n = 0, cap = 0;
    char **tokens = NULL;
    float *scores = NULL;
    size_t p = 4;
    if (l < 4) { st = toy_error(TOY_ERR_FORMAT, "%s: truncated header", path); goto done; }
    while (p < l) {
        float sc;
        int32_t len;
        if (l - p < 8) { st = toy_error(TOY_ERR_FORMAT, "%s: token %lld truncated at byte %zu", path, (long long)n, p); goto done; }
        memcpy(&sc, d + p, 4);
        memcpy(&len, d + p + 4, 4);
        p += 8;
        if (len < 0 || (size_t)len > l - p) {
            st = toy_error(TOY_ERR_FORMAT, "%s: token %lld length %d exceeds the file (offset %zu)", path, (long long)n, len, p);
            goto done;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 1024;
            char **t = realloc(tokens, (size_t)cap * sizeof *t);
            float *s = t ? realloc(scores, (size_t)cap * sizeof *s) : NULL;
            if (t) tokens = t;
            if (s) scores = s;
            if (!s) { st = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
        }
        /* llama2.c wrote spaces for U+2581 and "\n<s>\n" for the controls */
        char *t = malloc(3 * (size_t)len + 1);
        if (!t) { st = toy_error(TOY_ERR_NOMEM, "out of memory"); goto done; }
        size_t o = 0;
        const char *src = d + p;
        int32_t sl = len;
        if (sl >= 2 && src[0] == '\n' && src[sl - 1] == '\n') { src++; sl -= 2; }
        for (int32_t k = 0; k < sl; k++) {
            if (src[k] == ' ') { memcpy(t + o, "\xe2\x96\x81", 3); o += 3; }
            else t[o++] = src[k];
        }
        t[o] = 0;
        tokens[n] = t;
        scores[n++] = sc;
        p += (size_t)len;
        if (n >= INT32_MAX) { st = toy_error(TOY_ERR_FORMAT, "%s: too many tokens", path); goto done; }
    }
    if (n < 3) { st = toy_error(TOY_ERR_FORMAT, "%s: only %lld tokens", path, (long long)n); goto done; }
    struct toy_tokenizer_spec spec;
    spec_defaults(&spec);
    spec.kind = TOY_TOKENIZER_SPM;
    spec.n_tokens = n;
    spec.tokens = (const char *const *)tokens;
    spec.scores = scores;
    spec.unk = 0;
    spec.bos = 1;
    spec.eos = 2;
    spec.add_bos = true;
    spec.add_space_prefix = true;
    st = toy_tokenizer_init(&spec, out);
done:
    for (int64_t k = 0; k < n; k++) free(tokens[k]);
    free(tokens);
    free(scores);
    return st;
}

enum toy_status toy_tokenizer_load_llama2c(const char *path, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_llama2c: out is NULL");
    *out = NULL;
    char *d;
    size_t l;
    enum toy_status st = toy_file_read_all(path, &d, &l);
    if (st) return st;
    st = llama2c_from_bytes(d, l, path, out);
    free(d);
    return st;
}

/* ---- by path ---- */

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}
static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}
static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The file starts with these 4 bytes. A GGUF is known by its magic rather
 * than its name: a run's weights/latest link has no .gguf suffix. */
static bool has_magic(const char *p, const char magic[4]) {
    char m[4];
    FILE *f = fopen(p, "rb");
    bool yes = f && fread(m, 1, 4, f) == 4 && !memcmp(m, magic, 4);
    if (f) fclose(f);
    return yes;
}

/* A SentencePiece .model, with the added tokens of a byte-fallback
 * tokenizer.json beside it and tokenizer_config.json's specials and chat
 * template. TOY_ERR_UNSUPPORTED when the pair is not of that kind (a
 * byte-level tokenizer.json, or a .model that is not a ModelProto, such as
 * Llama-3's tiktoken file): the caller then uses tokenizer.json alone. */
static enum toy_status load_spm_with_hf(const char *dir, const char *model_path, const char *json_path,
                                        struct toy_tokenizer **out) {
    *out = NULL;
    struct toy_tokenizer *sp = NULL;
    json_t *root = NULL, *cfg = NULL;
    json_error_t jerr;
    if (toy_tokenizer_load_spm(model_path, &sp)) return TOY_ERR_UNSUPPORTED;
    if (!(root = json_load_file(json_path, 0, &jerr))) { toy_tokenizer_free(sp); return TOY_ERR_UNSUPPORTED; }
    struct hf_pre pre = {0};
    hf_pre_walk(&pre, json_object_get(root, "pre_tokenizer"));
    for (int k = 0; k < pre.n; k++) free(pre.re[k]);
    const char *mtype = json_string_value(json_object_get(json_object_get(root, "model"), "type"));
    if (pre.byte_level || (mtype && strcmp(mtype, "BPE") && strcmp(mtype, "Unigram"))) {
        json_decref(root);
        toy_tokenizer_free(sp);
        return TOY_ERR_UNSUPPORTED;
    }
    char cp[4096];
    snprintf(cp, sizeof cp, "%s/tokenizer_config.json", dir);
    cfg = json_load_file(cp, JSON_DECODE_INT_AS_REAL, &jerr); /* optional */

    enum toy_status st = TOY_OK;
    int64_t n = sp->n_vocab, total = n;
    size_t i;
    json_t *v;
    json_t *added = json_object_get(root, "added_tokens");
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        if (id >= total && id < INT32_MAX && token_content(v)) total = id + 1;
    }
    const char **tokens = calloc((size_t)total, sizeof *tokens);
    float *scores = calloc((size_t)total, sizeof *scores);
    int32_t *types = calloc((size_t)total, sizeof *types);
    if (!tokens || !scores || !types) { st = toy_error(TOY_ERR_NOMEM, "%s: out of memory", dir); goto done; }
    for (int64_t k = 0; k < n; k++) {
        tokens[k] = sp->text[k];
        scores[k] = sp->scores[k];
        types[k] = sp->types[k];
    }
    json_array_foreach(added, i, v) {
        json_int_t id = json_integer_value(json_object_get(v, "id"));
        const char *c = token_content(v);
        if (id < 0 || id >= total || !c) continue;
        bool special = json_is_true(json_object_get(v, "special"));
        if (id >= n) {
            tokens[id] = c;
            types[id] = special ? TOY_TOKEN_CONTROL : TOY_TOKEN_USER_DEFINED;
        } else if (!strcmp(tokens[id], c) && types[id] == TOY_TOKEN_NORMAL) {
            types[id] = special ? TOY_TOKEN_CONTROL : TOY_TOKEN_USER_DEFINED;
        }
    }
    for (int64_t k = n; k < total; k++)
        if (!tokens[k]) { st = toy_error(TOY_ERR_FORMAT, "%s: added tokens leave id %lld undefined", json_path, (long long)k); goto done; }
    struct toy_tokenizer_spec spec;
    spec_defaults(&spec);
    spec.kind = sp->kind;
    spec.n_tokens = total;
    spec.tokens = tokens;
    spec.scores = scores;
    spec.types = types;
    spec.add_space_prefix = sp->add_space_prefix;
    spec.unk = sp->unk;
    spec.bos = sp->bos;
    spec.eos = sp->eos;
    spec.pad = sp->pad;
    spec.add_bos = true;
    if (cfg) {
        const char *bos = token_content(json_object_get(cfg, "bos_token"));
        const char *eos = token_content(json_object_get(cfg, "eos_token"));
        const char *pad = token_content(json_object_get(cfg, "pad_token"));
        if (bos && find_text((char **)tokens, total, bos) >= 0) spec.bos = find_text((char **)tokens, total, bos);
        if (eos && find_text((char **)tokens, total, eos) >= 0) spec.eos = find_text((char **)tokens, total, eos);
        if (pad && find_text((char **)tokens, total, pad) >= 0) spec.pad = find_text((char **)tokens, total, pad);
        json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
        if (ab) spec.add_bos = json_is_true(ab);
        spec.add_eos = ae && json_is_true(ae);
        json_t *tmpl = json_object_get(cfg, "chat_template");
        if (json_is_string(tmpl)) spec.chat_template = json_string_value(tmpl);
        else json_array_foreach(tmpl, i, v) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (!spec.chat_template || (name && !strcmp(name, "default")))
                spec.chat_template = json_string_value(json_object_get(v, "template"));
        }
    }
    spec.eot = find_first((char **)tokens, total, eot_names);
    st = toy_tokenizer_init(&spec, out);
done:
    free(tokens);
    free(scores);
    free(types);
    json_decref(root);
    json_decref(cfg);
    toy_tokenizer_free(sp);
    return st;
}

/* A tokenizer from what is not a regular file: "-" (standard input), a
 * pipe (/dev/stdin), a FIFO, a device. It can be read only once, so it is
 * read whole first and told by its bytes (a GGUF's magic) or else by its
 * name, as a file is; a GGUF is parsed in memory, since a pipe cannot be
 * mapped. */
static enum toy_status load_stream(const char *path, struct toy_tokenizer **out) {
    char a[4096];
    if (ends_with(path, "encoder.json")) { /* with vocab.bpe beside it: each read once by the GPT-2 loader */
        snprintf(a, sizeof a, "%.*svocab.bpe", (int)(strlen(path) - strlen("encoder.json")), path);
        return toy_tokenizer_load_gpt2(path, a, NULL, out);
    }
    char *d;
    size_t l;
    enum toy_status st = toy_file_read_all(path, &d, &l);
    if (st) return st;
    if (l == 0) st = toy_error(TOY_ERR_FORMAT, "%s: empty (0 bytes), not a tokenizer", path);
    else if (ends_with(path, ".gguf") || (l >= 4 && !memcmp(d, "GGUF", 4))) {
        struct toy_gguf *g;
        if (!(st = toy_gguf_open_memory(d, l, path, &g))) {
            st = named(toy_tokenizer_load_gguf(g, out), path);
            toy_gguf_close(g);
        }
    } else if (ends_with(path, ".model")) {
        st = named(toy_tokenizer_load_spm_mem(d, l, out), path);
    } else if (ends_with(path, ".bin")) {
        st = llama2c_from_bytes(d, l, path, out);
    } else { /* tokenizer.json, with tokenizer_config.json beside it if present (standard input has no "beside") */
        const char *slash = strrchr(path, '/');
        char *c = NULL;
        size_t cl = 0;
        snprintf(a, sizeof a, "%.*stokenizer_config.json", slash ? (int)(slash - path + 1) : 0, path);
        if (strcmp(path, "-") && exists(a)) st = toy_file_read_all(a, &c, &cl);
        if (!st) st = named(toy_tokenizer_load_hf_mem(d, l, c, cl, out), path);
        free(c);
    }
    free(d);
    return st;
}

enum toy_status toy_tokenizer_load(const char *path, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load: out is NULL");
    *out = NULL;
    if (!path) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load: NULL path");
    char a[4096], b[4096];
    struct stat sb;
    if (!strcmp(path, "-") || (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode) && !S_ISDIR(sb.st_mode)))
        return load_stream(path, out);
    if (is_dir(path)) {
        snprintf(a, sizeof a, "%s/tokenizer.json", path);
        snprintf(b, sizeof b, "%s/tokenizer.model", path);
        if (exists(a) && exists(b)) {
            /* SentencePiece models (Llama-2, TinyLlama, Mistral, Gemma) ship both:
               the .model has the real scores and types (what sentencepiece and
               llama.cpp segment by); tokenizer.json adds added tokens, and
               tokenizer_config.json the specials and the chat template */
            enum toy_status st = load_spm_with_hf(path, b, a, out);
            if (st != TOY_ERR_UNSUPPORTED) return st;
        }
        if (exists(a)) return toy_tokenizer_load(a, out);
        snprintf(a, sizeof a, "%s/tokenizer.model", path);
        if (exists(a)) return toy_tokenizer_load_spm(a, out);
        snprintf(a, sizeof a, "%s/encoder.json", path);
        snprintf(b, sizeof b, "%s/vocab.bpe", path);
        if (exists(a) && exists(b)) return toy_tokenizer_load_gpt2(a, b, NULL, out);
        /* the same two files under Hugging Face's slow-tokenizer names */
        snprintf(a, sizeof a, "%s/vocab.json", path);
        snprintf(b, sizeof b, "%s/merges.txt", path);
        if (exists(a) && exists(b)) return toy_tokenizer_load_gpt2(a, b, NULL, out);
        return toy_error(TOY_ERR_NOT_FOUND, "%s: no tokenizer.json, tokenizer.model, encoder.json+vocab.bpe or "
                         "vocab.json+merges.txt", path);
    }
    if (!exists(path)) return toy_error(TOY_ERR_NOT_FOUND, "%s: no such file", path);
    if (ends_with(path, ".gguf") || has_magic(path, "GGUF")) return toy_tokenizer_load_gguf_file(path, out);
    if (ends_with(path, ".model")) return toy_tokenizer_load_spm(path, out);
    if (ends_with(path, ".bin")) return toy_tokenizer_load_llama2c(path, out);
    if (ends_with(path, "encoder.json")) {
        snprintf(a, sizeof a, "%.*svocab.bpe", (int)(strlen(path) - strlen("encoder.json")), path);
        return toy_tokenizer_load_gpt2(path, a, NULL, out);
    }
    /* tokenizer.json, with tokenizer_config.json beside it if present */
    const char *slash = strrchr(path, '/');
    snprintf(a, sizeof a, "%.*stokenizer_config.json", slash ? (int)(slash - path + 1) : 0, path);
    return toy_tokenizer_load_hf(path, exists(a) ? a : NULL, out);
}
