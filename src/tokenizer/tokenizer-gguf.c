/* tokenizer-gguf.c: tokenizers to and from GGUF metadata: llama.cpp's
 * tokenizer.ggml.* keys (model, pre, tokens, scores, token_type, merges, the
 * special ids, add_bos_token/add_eos_token/add_space_prefix, the BERT
 * normalizer's lowercase/strip_accents) and tokenizer.chat_template.
 * Defaults for absent keys follow llama.cpp's llama_vocab::load (SPM: unk 0,
 * bos 1, eos 2, add_bos, dummy prefix; Llama-3 and Tekken pre-tokenizers:
 * ignore_merges and add_bos; "bert": [CLS] 101 as BOS, [SEP] 102 from
 * seperator_token_id, unk 100, pad 0, both added, lowercase).
 */
#include "tokenizer-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/gguf.h"

static enum toy_status get_strarr(const struct toy_gguf *g, const char *key, char ***out, int64_t *n,
                                  bool required, bool check_utf8) {
    *out = NULL;
    *n = 0;
    int64_t kv;
    enum toy_gguf_type et;
    uint64_t len;
    enum toy_status st = toy_gguf_get_arr(g, key, &kv, &et, &len);
    if (st == TOY_ERR_NOT_FOUND && !required) return TOY_OK;
    if (st) return toy_error(st, "%s: %s", key, toy_last_error());
    if (et != TOY_GGUF_STRING) return toy_error(TOY_ERR_FORMAT, "%s: array of %s, expected strings", key, toy_gguf_type_name(et));
    if (len >= INT32_MAX) return toy_error(TOY_ERR_FORMAT, "%s: %llu entries", key, (unsigned long long)len);
    char **a = calloc(len ? len : 1, sizeof *a);
    if (!a) return toy_error(TOY_ERR_NOMEM, "%s: out of memory", key);
    for (uint64_t j = 0; j < len; j++) {
        size_t l;
        const char *s = toy_gguf_arr_str(g, kv, j, &l);
        if (memchr(s, 0, l)) { st = toy_error(TOY_ERR_FORMAT, "%s[%llu] contains a NUL byte", key, (unsigned long long)j); goto fail; }
        if (check_utf8) {
            for (size_t p = 0; p < l;) {
                uint32_t cp;
                int cl = toy_tok_utf8_decode(s + p, l - p, &cp);
                if (!cl) {
                    st = toy_error(TOY_ERR_FORMAT, "%s[%llu] is not valid UTF-8 (byte %zu)", key, (unsigned long long)j, p);
                    goto fail;
                }
                p += (size_t)cl;
            }
        }
        if (!(a[j] = strndup(s, l))) { st = toy_error(TOY_ERR_NOMEM, "%s: out of memory", key); goto fail; }
    }
    *out = a;
    *n = (int64_t)len;
    return TOY_OK;
fail:
    for (uint64_t j = 0; j < len; j++) free(a[j]);
    free(a);
    return st;
}

static void free_strarr(char **a, int64_t n) {
    if (!a) return;
    for (int64_t i = 0; i < n; i++) free(a[i]);
    free(a);
}

/* A numeric array of exactly n entries, converted. */
static enum toy_status get_numarr(const struct toy_gguf *g, const char *key, int64_t n, float *f, int32_t *i32,
                                  bool *present) {
    int64_t kv;
    enum toy_gguf_type et;
    uint64_t len;
    *present = false;
    enum toy_status st = toy_gguf_get_arr(g, key, &kv, &et, &len);
    if (st == TOY_ERR_NOT_FOUND) return TOY_OK;
    if (st) return toy_error(st, "%s: %s", key, toy_last_error());
    if ((int64_t)len != n)
        return toy_error(TOY_ERR_FORMAT, "%s: %llu entries for %lld tokens", key, (unsigned long long)len, (long long)n);
    for (int64_t j = 0; j < n; j++) {
        if (f) {
            double v;
            if ((st = toy_gguf_arr_float(g, kv, (uint64_t)j, &v))) return toy_error(st, "%s[%lld]: %s", key, (long long)j, toy_last_error());
            f[j] = (float)v;
        } else {
            int64_t v;
            if ((st = toy_gguf_arr_int(g, kv, (uint64_t)j, &v))) return toy_error(st, "%s[%lld]: %s", key, (long long)j, toy_last_error());
            if (v < INT32_MIN || v > INT32_MAX) return toy_error(TOY_ERR_RANGE, "%s[%lld] = %lld", key, (long long)j, (long long)v);
            i32[j] = (int32_t)v;
        }
    }
    *present = true;
    return TOY_OK;
}

static int32_t get_id(const struct toy_gguf *g, const char *key, int32_t dflt, enum toy_status *st) {
    int64_t v;
    int64_t kv = toy_gguf_find_key(g, key);
    if (kv < 0) return dflt;
    enum toy_status s = toy_gguf_kv_int(g, kv, &v);
    if (s) { *st = toy_error(s, "%s: %s", key, toy_last_error()); return -1; }
    /* llama.cpp writes -1 (as u32 0xffffffff) for "none" in some converters */
    if (v == 0xffffffffLL || v == -1) return -1;
    if (v < 0 || v >= INT32_MAX) { *st = toy_error(TOY_ERR_RANGE, "%s = %lld", key, (long long)v); return -1; }
    return (int32_t)v;
}

static bool get_flag(const struct toy_gguf *g, const char *key, bool dflt) {
    bool v;
    return toy_gguf_get_bool(g, key, &v) == TOY_OK ? v : dflt;
}

/* ids of tokens that end generation besides EOS and EOT (read, and written back) */
static const char *const eog_keys[4] = {"tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id",
                                        "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id"};

enum toy_status toy_tokenizer_load_gguf(const struct toy_gguf *g, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_gguf: out is NULL");
    *out = NULL;
    if (!g) /* m->gguf of a model that was not loaded from a file (toy_llama_new) */
        return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_gguf: NULL GGUF (a model not loaded from a file has none)");
    const char *model = NULL, *pre = NULL, *tmpl = NULL;
    enum toy_status st = toy_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL);
    if (st == TOY_ERR_NOT_FOUND) return toy_error(TOY_ERR_NOT_FOUND, "GGUF has no tokenizer (tokenizer.ggml.model is absent)");
    if (st) return toy_error(st, "tokenizer.ggml.model: %s", toy_last_error());
    struct toy_tokenizer_spec spec;
    memset(&spec, 0, sizeof spec);
    if (!strcmp(model, "gpt2")) spec.kind = TOY_TOKENIZER_BPE;
    else if (!strcmp(model, "llama")) spec.kind = TOY_TOKENIZER_SPM;
    else if (!strcmp(model, "t5")) spec.kind = TOY_TOKENIZER_UGM;
    else if (!strcmp(model, "bert")) spec.kind = TOY_TOKENIZER_WPM;
    else return toy_error(TOY_ERR_UNSUPPORTED, "tokenizer.ggml.model '%s' is not supported (gpt2, llama, t5, bert)", model);
    bool wpm = spec.kind == TOY_TOKENIZER_WPM;
    if (toy_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL)) pre = NULL;
    if (toy_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL)) tmpl = NULL;

    char **tokens = NULL, **merges = NULL, **pre_re = NULL;
    int64_t n = 0, nm = 0, n_pre_re = 0;
    float *scores = NULL;
    int32_t *types = NULL;
    bool has;
    if ((st = get_strarr(g, "tokenizer.ggml.tokens", &tokens, &n, true, true))) return st;
    if (n == 0) { st = toy_error(TOY_ERR_FORMAT, "tokenizer.ggml.tokens is empty"); goto done; }
    if (spec.kind == TOY_TOKENIZER_BPE &&
        (st = get_strarr(g, "tokenizer.ggml.merges", &merges, &nm, true, true))) goto done;
    scores = calloc((size_t)n, sizeof *scores);
    types = calloc((size_t)n, sizeof *types);
    if (!scores || !types) { st = toy_error(TOY_ERR_NOMEM, "tokenizer: out of memory"); goto done; }
    if ((st = get_numarr(g, "tokenizer.ggml.scores", n, scores, NULL, &has))) goto done;
    if (!has && spec.kind != TOY_TOKENIZER_BPE && !wpm) { /* llama.cpp's BERT converter writes no scores */
        st = toy_error(TOY_ERR_FORMAT, "tokenizer.ggml.scores is required by a '%s' tokenizer", model);
        goto done;
    }
    if ((st = get_numarr(g, "tokenizer.ggml.token_type", n, NULL, types, &has))) goto done;
    bool spm = spec.kind == TOY_TOKENIZER_SPM || spec.kind == TOY_TOKENIZER_UGM;
    /* llama.cpp (llama_vocab::load) makes end-of-generation- and
     * fill-in-the-middle-looking tokens CONTROL whatever the file says, so
     * they are text unless parse_special */
    if (has)
        for (int64_t i = 0; i < n; i++)
            if (toy_tok_is_control_text(tokens[i])) types[i] = TOY_TOKEN_CONTROL;
    spec.n_tokens = n;
    spec.tokens = (const char *const *)tokens;
    spec.scores = scores;
    spec.types = has ? types : NULL;
    spec.n_merges = nm;
    spec.merges = (const char *const *)merges;
    spec.pre = spec.kind == TOY_TOKENIZER_BPE ? pre : NULL;
    if (spec.kind == TOY_TOKENIZER_BPE) {
        if ((st = get_strarr(g, "tokenizer.toy.pre_regex", &pre_re, &n_pre_re, false, true))) goto done;
        if (n_pre_re > TOK_MAX_REGEX) {
            st = toy_error(TOY_ERR_FORMAT, "tokenizer.toy.pre_regex: %lld regexes (at most %d)", (long long)n_pre_re,
                           TOK_MAX_REGEX);
            goto done;
        }
        spec.n_pre_regex = (int)n_pre_re;
        spec.pre_regex = (const char *const *)pre_re;
    }
    if (wpm) {
        /* llama.cpp's "bert" defaults, each only where the vocabulary has the id (it disables the others). Its
         * BOS is [CLS] (older converters named it cls_token_id alone); what it appends is the separator, not
         * eos_token_id: that is our EOS here */
        int32_t cls = get_id(g, "tokenizer.ggml.cls_token_id", n > 101 ? 101 : -1, &st);
        spec.bos = get_id(g, "tokenizer.ggml.bos_token_id", cls, &st);
        spec.eos = get_id(g, "tokenizer.ggml.seperator_token_id", n > 102 ? 102 : -1, &st);
        spec.unk = get_id(g, "tokenizer.ggml.unknown_token_id", n > 100 ? 100 : -1, &st);
        spec.pad = get_id(g, "tokenizer.ggml.padding_token_id", 0, &st);
        bool lower = get_flag(g, "tokenizer.ggml.normalizer.lowercase", true);
        spec.keep_case = !lower;
        spec.strip_accents = get_flag(g, "tokenizer.ggml.normalizer.strip_accents", lower) ? 1 : -1;
        /* HF's max_input_chars_per_word where it is not 100 (a toy key: llama.cpp has no limit) */
        int32_t mw = get_id(g, "tokenizer.toy.max_word_chars", 0, &st);
        spec.max_word_chars = mw > 0 ? mw : 0;
    } else {
        spec.bos = get_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, &st);
        spec.eos = get_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, &st);
        spec.unk = get_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, &st);
        spec.pad = get_id(g, "tokenizer.ggml.padding_token_id", -1, &st);
    }
    spec.eot = get_id(g, "tokenizer.ggml.eot_token_id", -1, &st);
    if (st) goto done;
    /* ids beyond the vocabulary: llama.cpp ignores them; we say so */
    int32_t *ids[] = {&spec.bos, &spec.eos, &spec.unk, &spec.pad, &spec.eot};
    const char *const names[] = {"bos", wpm ? "seperator" : "eos", "unknown", "padding", "eot"};
    for (int k = 0; k < 5; k++)
        if (*ids[k] >= n) {
            st = toy_error(TOY_ERR_RANGE, "tokenizer.ggml.%s_token_id = %d, vocabulary has %lld tokens", names[k], *ids[k], (long long)n);
            goto done;
        }
    if (spec.eot < 0) { /* gpt-oss (a vocabulary with <|return|>): its <|end|> ends a message, not the turn */
        static const char *const eot_names[] = {"<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>"};
        bool harmony = false;
        for (int64_t i = 0; i < n && !harmony; i++) harmony = !strcmp(tokens[i], "<|return|>");
        for (int k = 0; k < (harmony ? 3 : 4) && spec.eot < 0; k++)
            for (int64_t i = 0; i < n; i++)
                if (!strcmp(tokens[i], eot_names[k])) { spec.eot = (int32_t)i; break; }
    }
    /* llama.cpp (llama_vocab::load): the Llama-3 and Tekken pre-tokenizers ignore merges and add BOS */
    bool llama3 = pre && (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "tekken"));
    spec.add_bos = get_flag(g, "tokenizer.ggml.add_bos_token", spm || llama3);
    spec.add_eos = get_flag(g, "tokenizer.ggml.add_eos_token", false);
    /* llama.cpp's tokenize adds [CLS] and [SEP] to any "bert" text with add_special, whatever the flags (older
     * converters wrote add_bos_token false for BERT) */
    if (wpm) spec.add_bos = spec.add_eos = true;
    spec.add_space_prefix = get_flag(g, "tokenizer.ggml.add_space_prefix", spm);
    spec.ignore_merges = llama3;
    spec.chat_template = tmpl;
    /* end-of-message and fill-in-the-middle ids the file names: llama.cpp
     * ends generation at them too (ids outside the vocabulary: ignored) */
    int32_t eog_ids[4];
    for (int k = 0; k < 4; k++) eog_ids[k] = get_id(g, eog_keys[k], -1, &st);
    if (st) goto done;
    for (int k = 0; k < 4; k++)
        if (eog_ids[k] >= 0 && eog_ids[k] < n) types[eog_ids[k]] = TOY_TOKEN_CONTROL;
    st = toy_tokenizer_init(&spec, out);
    for (int k = 0; !st && k < 4; k++)
        if (eog_ids[k] >= 0 && eog_ids[k] < n) toy_tok_eog_add(*out, (*out)->named_eog[k] = eog_ids[k]);
done:
    free_strarr(pre_re, n_pre_re);
    free_strarr(tokens, n);
    free_strarr(merges, nm);
    free(scores);
    free(types);
    return st;
}

enum toy_status toy_tokenizer_load_gguf_file(const char *path, struct toy_tokenizer **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_load_gguf_file: out is NULL");
    *out = NULL;
    struct toy_gguf *g;
    enum toy_status st = toy_gguf_open(path, &g);
    if (st) return st;
    st = toy_tokenizer_load_gguf(g, out);
    toy_gguf_close(g);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", toy_last_error());
        toy_error(st, "%s: %s", path, msg);
    }
    return st;
}

enum toy_status toy_tokenizer_write_gguf(const struct toy_tokenizer *tok, struct toy_gguf_writer *w) {
    enum toy_status st;
    static const char *const models[] = {"gpt2", "llama", "t5", "bert"};
    bool scored = tok->kind == TOY_TOKENIZER_SPM || tok->kind == TOY_TOKENIZER_UGM;
#define TRY(x) do { if ((st = (x))) return st; } while (0)
    TRY(toy_gguf_writer_set_str(w, "tokenizer.ggml.model", models[tok->kind]));
    if (tok->kind == TOY_TOKENIZER_BPE) {
        TRY(toy_gguf_writer_set_str(w, "tokenizer.ggml.pre", toy_tokenizer_pre(tok)));
        /* regexes that the pre name does not stand for exactly (a tokenizer.json's
         * own, e.g. HF's ASCII-only Digits) go in a toy key so toy reads back the
         * same splits; llama.cpp ignores it and uses the name */
        int n;
        const char *const *re;
        bool same = toy_tok_pre_regexes(toy_tokenizer_pre(tok), &n, &re) && n == tok->n_regex;
        for (int i = 0; same && i < n; i++) same = !strcmp(re[i], tok->re_src[i]);
        if (!same) TRY(toy_gguf_writer_set_arr_str(w, "tokenizer.toy.pre_regex", (const char *const *)tok->re_src, NULL,
                                                   (uint64_t)tok->n_regex));
    }
    TRY(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok->text, NULL, (uint64_t)tok->n_vocab));
    if (scored)
        TRY(toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, tok->scores, (uint64_t)tok->n_vocab));
    TRY(toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, tok->types, (uint64_t)tok->n_vocab));
    if (tok->kind == TOY_TOKENIZER_BPE)
        TRY(toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)tok->merges, NULL, (uint64_t)tok->n_merges));
    /* a BPE file without a BOS id gets llama.cpp's default, token 11 (SmolLM2's <jupyter_start>): a known EOS
     * stands in, GPT-2's convention (bos = eos = <|endoftext|>), harmless as add_bos_token says whether it is
     * put first */
    int32_t bos = tok->bos < 0 && tok->kind == TOY_TOKENIZER_BPE ? tok->eos : tok->bos;
    const int32_t ids[] = {bos, tok->eos, tok->unk, tok->pad, tok->eot};
    static const char *const keys[] = {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                       "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
                                       "tokenizer.ggml.eot_token_id"};
    for (int k = 0; k < 5; k++)
        if (ids[k] >= 0) TRY(toy_gguf_writer_set_u32(w, keys[k], (uint32_t)ids[k]));
    if (tok->kind == TOY_TOKENIZER_WPM) {
        /* the keys llama.cpp's converter writes for BERT beside bos/eos, which older readers take [CLS] and
         * [SEP] from; and the normalizer, whose absent lowercase llama.cpp would take as true */
        if (tok->bos >= 0) TRY(toy_gguf_writer_set_u32(w, "tokenizer.ggml.cls_token_id", (uint32_t)tok->bos));
        if (tok->eos >= 0) TRY(toy_gguf_writer_set_u32(w, "tokenizer.ggml.seperator_token_id", (uint32_t)tok->eos));
        TRY(toy_gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.lowercase", tok->wpm_lower));
        TRY(toy_gguf_writer_set_bool(w, "tokenizer.ggml.normalizer.strip_accents", tok->wpm_strip));
        if (tok->wpm_max_chars != 100)
            TRY(toy_gguf_writer_set_u32(w, "tokenizer.toy.max_word_chars", (uint32_t)tok->wpm_max_chars));
    }
    for (int k = 0; k < 4; k++)
        if (tok->named_eog[k] >= 0) TRY(toy_gguf_writer_set_u32(w, eog_keys[k], (uint32_t)tok->named_eog[k]));
    TRY(toy_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", tok->add_bos));
    TRY(toy_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", tok->add_eos));
    if (scored) TRY(toy_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", tok->add_space_prefix));
    if (tok->chat_template) TRY(toy_gguf_writer_set_str(w, "tokenizer.chat_template", tok->chat_template));
#undef TRY
    return TOY_OK;
}

enum toy_status toy_tokenizer_write_gguf_rows(const struct toy_tokenizer *tok, struct toy_gguf_writer *w, int64_t rows) {
    enum toy_status st = toy_tokenizer_write_gguf(tok, w);
    if (st || rows <= tok->n_vocab) return st;
    const char **text = malloc((size_t)rows * sizeof *text);
    char *pads = malloc((size_t)(rows - tok->n_vocab) * 32);
    float *scores = malloc((size_t)rows * sizeof *scores);
    int32_t *types = malloc((size_t)rows * sizeof *types);
    if (!text || !pads || !scores || !types) st = toy_error(TOY_ERR_NOMEM, "tokenizer: padding the vocabulary");
    for (int64_t i = 0; !st && i < rows; i++) {
        bool pad = i >= tok->n_vocab;
        if (pad) snprintf(pads + (i - tok->n_vocab) * 32, 32, "[PAD%lld]", (long long)i);
        text[i] = pad ? pads + (i - tok->n_vocab) * 32 : tok->text[i];
        scores[i] = pad ? -1000.0f : tok->scores ? tok->scores[i] : 0.0f;
        types[i] = pad ? TOY_TOKEN_UNUSED : tok->types[i];
    }
    if (!st) st = toy_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", text, NULL, (uint64_t)rows);
    if (!st && (tok->kind == TOY_TOKENIZER_SPM || tok->kind == TOY_TOKENIZER_UGM))
        st = toy_gguf_writer_set_arr(w, "tokenizer.ggml.scores", TOY_GGUF_F32, scores, (uint64_t)rows);
    if (!st) st = toy_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", TOY_GGUF_I32, types, (uint64_t)rows);
    free(text);
    free(pads);
    free(scores);
    free(types);
    return st;
}
