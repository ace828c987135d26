/* tokenizer-save.c: writing a tokenizer as a Hugging Face tokenizer.json
 * (the `tokenizers` serialization that tokenizer-load.c reads): byte-level
 * BPE with its pre-tokenizer regexes as Split pre-tokenizers followed by
 * ByteLevel(use_regex=false), Unigram with Metaspace, and WordPiece as BERT's
 * (BertNormalizer, BertPreTokenizer, TemplateProcessing, the vocabulary back
 * in its "##" form). Non-normal tokens go to added_tokens (special =
 * CONTROL/UNKNOWN). The file is written to a
 * temporary name and renamed, so a failed save leaves no partial file.
 */
#include "tokenizer-impl.h"
#include "toy/file.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static json_t *added_tokens(const struct toy_tokenizer *tok) {
    json_t *a = json_array();
    for (int32_t i = 0; i < tok->n_vocab; i++) {
        int32_t ty = tok->types[i];
        if (ty != TOY_TOKEN_CONTROL && ty != TOY_TOKEN_USER_DEFINED && ty != TOY_TOKEN_UNKNOWN) continue;
        if ((tok->kind == TOY_TOKENIZER_SPM || tok->kind == TOY_TOKENIZER_UGM) && ty == TOY_TOKEN_UNKNOWN) continue;
        int at = tok->attrs ? tok->attrs[i] : 0;
        json_array_append_new(a, json_pack("{sIsssbsbsbsbsb}", "id", (json_int_t)i, "content", tok->text[i], "single_word", 0,
                                           "lstrip", (at & TOY_TOKEN_ATTR_LSTRIP) != 0, "rstrip",
                                           (at & TOY_TOKEN_ATTR_RSTRIP) != 0, "normalized", 0, "special",
                                           ty != TOY_TOKEN_USER_DEFINED));
    }
    return a;
}

/* [CLS] $A [SEP] (and the pair form), as far as the tokenizer adds them. */
static json_t *bert_template(const struct toy_tokenizer *tok) {
    bool cls = tok->add_bos && tok->bos >= 0, sep = tok->add_eos && tok->eos >= 0;
    if (!cls && !sep) return json_null();
    json_t *single = json_array(), *pair = json_array(), *sp = json_object();
    for (int p = 0; p < 2; p++) {
        json_t *a = p ? pair : single;
        if (cls) json_array_append_new(a, json_pack("{s{sssi}}", "SpecialToken", "id", tok->text[tok->bos], "type_id", 0));
        json_array_append_new(a, json_pack("{s{sssi}}", "Sequence", "id", "A", "type_id", 0));
        if (sep) json_array_append_new(a, json_pack("{s{sssi}}", "SpecialToken", "id", tok->text[tok->eos], "type_id", 0));
        if (!p) continue;
        json_array_append_new(a, json_pack("{s{sssi}}", "Sequence", "id", "B", "type_id", 1));
        if (sep) json_array_append_new(a, json_pack("{s{sssi}}", "SpecialToken", "id", tok->text[tok->eos], "type_id", 1));
    }
    for (int k = 0; k < 2; k++) {
        int32_t id = k ? (sep ? tok->eos : -1) : (cls ? tok->bos : -1);
        if (id >= 0)
            json_object_set_new(sp, tok->text[id], json_pack("{sss[I]s[s]}", "id", tok->text[id], "ids", (json_int_t)id,
                                                              "tokens", tok->text[id]));
    }
    return json_pack("{sssososo}", "type", "TemplateProcessing", "single", single, "pair", pair,
                     "special_tokens", sp);
}

/* The WordPiece vocabulary in Hugging Face's spelling: "▁the" -> "the", a
 * continuation "ing" -> "##ing", special and added tokens as they are. A
 * spelling two ids share keeps the first (the loader then names the gap). */
static json_t *wordpiece_vocab(const struct toy_tokenizer *tok) {
    json_t *vocab = json_object();
    for (int32_t i = 0; i < tok->n_vocab && vocab; i++) {
        int32_t ty = tok->types[i];
        const char *t = tok->text[i];
        char *own = NULL;
        if (ty == TOY_TOKEN_NORMAL || ty == TOY_TOKEN_UNUSED) {
            if (!strncmp(t, "\xe2\x96\x81", 3)) t += 3;
            else if ((own = malloc(tok->text_len[i] + 3))) {
                memcpy(own, "##", 2);
                memcpy(own + 2, t, tok->text_len[i] + 1);
                t = own;
            } else {
                json_decref(vocab);
                return NULL;
            }
        }
        if (!json_object_get(vocab, t)) json_object_set_new(vocab, t, json_integer(i));
        free(own);
    }
    return vocab;
}

enum toy_status toy_tokenizer_save_hf(const struct toy_tokenizer *tok, const char *path) {
    if (tok->kind == TOY_TOKENIZER_SPM)
        return toy_error(TOY_ERR_UNSUPPORTED, "%s: a SentencePiece BPE vocabulary has no merge list for tokenizer.json; save as GGUF", path);
    json_t *root = json_object(), *model = json_object();
    if (!root || !model) { json_decref(root); json_decref(model); return toy_error(TOY_ERR_NOMEM, "out of memory"); }
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens", added_tokens(tok));
    json_object_set_new(root, "normalizer", tok->nfc ? json_pack("{ss}", "type", "NFC") : json_null());
    if (tok->kind == TOY_TOKENIZER_WPM) {
        json_object_set_new(root, "normalizer", json_pack("{sssbsbsbsb}", "type", "BertNormalizer", "clean_text", 1,
                                                          "handle_chinese_chars", 1, "strip_accents", tok->wpm_strip,
                                                          "lowercase", tok->wpm_lower));
        json_object_set_new(root, "pre_tokenizer", json_pack("{ss}", "type", "BertPreTokenizer"));
        json_object_set_new(root, "post_processor", bert_template(tok));
        json_object_set_new(root, "decoder", json_pack("{sssssb}", "type", "WordPiece", "prefix", "##", "cleanup", 1));
        json_t *vocab = wordpiece_vocab(tok);
        if (!vocab) {
            json_decref(root);
            json_decref(model);
            return toy_error(TOY_ERR_NOMEM, "out of memory");
        }
        json_object_set_new(model, "type", json_string("WordPiece"));
        json_object_set_new(model, "unk_token", json_string(tok->text[tok->unk]));
        json_object_set_new(model, "continuing_subword_prefix", json_string("##"));
        json_object_set_new(model, "max_input_chars_per_word", json_integer(tok->wpm_max_chars));
        json_object_set_new(model, "vocab", vocab);
    } else if (tok->kind == TOY_TOKENIZER_BPE) {
        json_t *seq = json_array();
        for (int i = 0; i < tok->n_regex; i++)
            json_array_append_new(seq, json_pack("{sss{ss}sssb}", "type", "Split", "pattern", "Regex", tok->re_src[i],
                                                 "behavior", "Isolated", "invert", 0));
        json_array_append_new(seq, json_pack("{sssbsbsb}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                                             "use_regex", 0));
        json_object_set_new(root, "pre_tokenizer", json_pack("{sssO}", "type", "Sequence", "pretokenizers", seq));
        json_decref(seq);
        json_object_set_new(root, "post_processor", json_null());
        json_object_set_new(root, "decoder", json_pack("{sssbsbsb}", "type", "ByteLevel", "add_prefix_space", 1,
                                                       "trim_offsets", 1, "use_regex", 1));
        json_t *vocab = json_object(), *merges = json_array();
        for (int32_t i = 0; i < tok->n_vocab; i++) {
            int32_t ty = tok->types[i];
            if (ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_USER_DEFINED || ty == TOY_TOKEN_UNKNOWN) continue;
            json_object_set_new(vocab, tok->text[i], json_integer(i));
        }
        for (int64_t r = 0; r < tok->n_merges; r++) json_array_append_new(merges, json_string(tok->merges[r]));
        json_object_set_new(model, "type", json_string("BPE"));
        json_object_set_new(model, "dropout", json_null());
        json_object_set_new(model, "unk_token", tok->unk >= 0 ? json_string(tok->text[tok->unk]) : json_null());
        json_object_set_new(model, "continuing_subword_prefix", json_null());
        json_object_set_new(model, "end_of_word_suffix", json_null());
        json_object_set_new(model, "fuse_unk", json_false());
        json_object_set_new(model, "byte_fallback", json_false());
        json_object_set_new(model, "ignore_merges", json_boolean(tok->ignore_merges));
        json_object_set_new(model, "vocab", vocab);
        json_object_set_new(model, "merges", merges);
    } else {
        json_object_set_new(root, "pre_tokenizer", json_pack("{sssss}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                                             "prepend_scheme", tok->add_space_prefix ? "always" : "never"));
        json_object_set_new(root, "post_processor", json_null());
        json_object_set_new(root, "decoder", json_pack("{sssss}", "type", "Metaspace", "replacement", "\xe2\x96\x81",
                                                       "prepend_scheme", tok->add_space_prefix ? "always" : "never"));
        json_t *vocab = json_array();
        bool bytes = false;
        for (int32_t i = 0; i < tok->n_vocab; i++) {
            json_array_append_new(vocab, json_pack("[sf]", tok->text[i], (double)tok->scores[i]));
            bytes |= tok->types[i] == TOY_TOKEN_BYTE;
        }
        json_object_set_new(model, "type", json_string("Unigram"));
        json_object_set_new(model, "unk_id", tok->unk >= 0 ? json_integer(tok->unk) : json_null());
        json_object_set_new(model, "vocab", vocab);
        json_object_set_new(model, "byte_fallback", json_boolean(bytes));
    }
    json_object_set_new(root, "model", model);

    struct toy_file_replace r;
    enum toy_status st = toy_file_replace_begin(path, &r);
    if (!st) st = toy_file_replace_end(&r, json_dumpf(root, r.f, JSON_INDENT(1)) == 0);
    json_decref(root);
    return st;
}
