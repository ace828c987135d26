/* tokenizer-save.c: writing a tokenizer as a Hugging Face tokenizer.json
 * (the `tokenizers` serialization that tokenizer-load.c reads): byte-level
 * BPE with its pre-tokenizer regexes as Split pre-tokenizers followed by
 * ByteLevel(use_regex=false), and Unigram with Metaspace. Non-normal tokens
 * go to added_tokens (special = CONTROL/UNKNOWN). The file is written to a
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
        if (tok->kind != TOY_TOKENIZER_BPE && ty == TOY_TOKEN_UNKNOWN) continue;
        int at = tok->attrs ? tok->attrs[i] : 0;
        json_array_append_new(a, json_pack("{sIsssbsbsbsbsb}", "id", (json_int_t)i, "content", tok->text[i], "single_word", 0,
                                           "lstrip", (at & TOY_TOKEN_ATTR_LSTRIP) != 0, "rstrip",
                                           (at & TOY_TOKEN_ATTR_RSTRIP) != 0, "normalized", 0, "special",
                                           ty != TOY_TOKEN_USER_DEFINED));
    }
    return a;
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
    if (tok->kind == TOY_TOKENIZER_BPE) {
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
