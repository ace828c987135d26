/* wpm.c: WordPiece (BERT, and the embedding models built on it: bge,
 * all-MiniLM, e5), encoding one text fragment and the decoder's per-token
 * cleanup.
 *
 * The vocabulary is held in llama.cpp's GGUF form (convert_hf_to_gguf.py,
 * BertModel.set_vocab): a word-initial piece is stored with a leading U+2581
 * ("the" is "▁the"), a continuation piece bare ("##ing" is "ing"), CONTROL
 * tokens ([CLS], [SEP], ...) as they are. The two kinds of piece cannot
 * collide, so one lookup table serves both.
 *
 * Normalization is Hugging Face's BertNormalizer, in its order: clean_text
 * (drop NUL, U+FFFD and Cc/Cf/Co controls except tab, newline and return;
 * White_Space becomes a word break), handle_chinese_chars (a CJK ideograph
 * is a word of its own), strip_accents (NFD, then drop the nonspacing marks,
 * category Mn), lowercase (per character, as Rust's char::to_lowercase).
 * BertPreTokenizer then splits at whitespace and makes each punctuation
 * character (Unicode P*, and all ASCII punctuation: $+<=>^`|~ included) a
 * word. llama.cpp's llm_tokenizer_wpm_session::preprocess does the same on
 * ordinary text; where the two differ we follow Hugging Face, the model's
 * reference: llama.cpp also drops spacing and enclosing marks (Mc, Me) and
 * breaks words at \v, \f and U+0085, which HF's clean_text deletes.
 *
 * Each word is then matched greedily, longest piece first (HF's WordPiece
 * model, llama.cpp's tokenize): the first piece looked up as "▁" + text, the
 * later ones bare; a word that cannot be covered to its end becomes one
 * [UNK], as does a word of more than max_word_chars code points (HF's
 * max_input_chars_per_word, 100; llama.cpp has no such limit).
 */
#include "tokenizer-impl.h"

#include <utf8proc.h>

/* The ranges HF's is_chinese_char tests (BERT's original list, with its
 * 0x2B920 where the Unicode block starts at 0x2B820). */
static bool is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* HF's is_whitespace: tab, newline, return, and Unicode White_Space (Rust's
 * char::is_whitespace). \v, \f and U+0085 are White_Space too, but they are
 * Cc, and clean_text deletes controls before it looks for spaces. */
static bool is_space(uint32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* HF's is_control: Cc, Cf and Co (the unicode_categories crate's is_other),
 * but not the three whitespace controls. Unassigned code points are kept. */
static bool is_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO;
}

/* BertPreTokenizer's is_bert_punc: ASCII punctuation (symbols included) or
 * any Unicode punctuation category. */
static bool is_punct(uint32_t c) {
    if (c < 0x80) return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
                         (c >= 0x7B && c <= 0x7E);
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
        return true;
    default:
        return false;
    }
}

#define WPM_MARK "\xe2\x96\x81" /* U+2581, the word-initial mark of the stored pieces */
#define WPM_MARK_LEN 3

/* The word being built: s->buf holds WPM_MARK then the word's bytes, so
 * that the word-initial lookup needs no copy. */
struct wpm_state {
    const struct toy_tokenizer *tok;
    struct tok_scratch *s;
    struct toy_tokens *out;
    size_t n;      /* bytes of the word (after the mark) */
    int64_t chars; /* its code points */
};

static enum toy_status word_add(struct wpm_state *w, uint32_t cp) {
    enum toy_status st = toy_tok_reserve(&w->s->buf, &w->s->cap, WPM_MARK_LEN + w->n + 4);
    if (st) return st;
    char *b = w->s->buf;
    if (w->n == 0) memcpy(b, WPM_MARK, WPM_MARK_LEN);
    w->n += (size_t)toy_tok_utf8_encode(cp, b + WPM_MARK_LEN + w->n);
    w->chars++;
    return TOY_OK;
}

/* Greedy longest-match-first over the word; [UNK] for the whole word when
 * some position has no piece. */
static enum toy_status word_match(const struct toy_tokenizer *tok, const char *b, size_t n, struct toy_tokens *out) {
    const char *word = b + WPM_MARK_LEN;
    int64_t mark = out->n;
    enum toy_status st;
    for (size_t start = 0; start < n;) {
        /* no piece is longer than max_piece_len bytes: start the search there, on a character boundary */
        size_t room = start == 0 ? (tok->max_piece_len > WPM_MARK_LEN ? tok->max_piece_len - WPM_MARK_LEN : 0)
                                 : tok->max_piece_len;
        size_t end = n - start > room ? start + room : n;
        while (end > start && end < n && (word[end] & 0xC0) == 0x80) end--;
        int32_t id = -1;
        while (end > start) {
            id = start == 0 ? tok_strmap_get(&tok->text_map, b, WPM_MARK_LEN + end)
                            : tok_strmap_get(&tok->text_map, word + start, end - start);
            if (id >= 0) break;
            do end--; while (end > start && (word[end] & 0xC0) == 0x80);
        }
        if (id < 0) {
            out->n = mark;
            return toy_tok_push(out, tok->unk);
        }
        if ((st = toy_tok_push(out, id))) return st;
        start = end;
    }
    return TOY_OK;
}

static enum toy_status word_flush(struct wpm_state *w) {
    if (!w->n) return TOY_OK;
    size_t n = w->n;
    int64_t chars = w->chars;
    w->n = 0;
    w->chars = 0;
    const char *b = w->s->buf;
    if (chars > w->tok->wpm_max_chars) return toy_tok_push(w->out, w->tok->unk);
    if (toy_tok_cache_get(&w->s->cache, b + WPM_MARK_LEN, n, w->out)) return TOY_OK;
    int64_t first = w->out->n;
    enum toy_status st = word_match(w->tok, b, n, w->out);
    if (!st) toy_tok_cache_put(&w->s->cache, b + WPM_MARK_LEN, n, w->out->ids + first, w->out->n - first);
    return st;
}

/* One character after normalization: a punctuation character is a word of
 * its own, anything else extends the word. */
static enum toy_status emit(struct wpm_state *w, uint32_t cp) {
    enum toy_status st;
    if (is_space(cp)) return word_flush(w);
    if (!is_punct(cp)) return word_add(w, cp);
    if ((st = word_flush(w)) || (st = word_add(w, cp))) return st;
    return word_flush(w);
}

enum toy_status toy_tok_wpm_encode(const struct toy_tokenizer *tok, struct tok_scratch *s, const char *text,
                                   size_t len, struct toy_tokens *out) {
    struct wpm_state w = {tok, s, out, 0, 0};
    enum toy_status st = TOY_OK;
    for (size_t pos = 0; pos < len && !st;) {
        uint32_t cp;
        int l = toy_tok_utf8_decode(text + pos, len - pos, &cp);
        if (!l) { /* a byte that starts no character: U+FFFD, which clean_text drops */
            pos++;
            continue;
        }
        pos += (size_t)l;
        if (cp == 0 || cp == 0xFFFD || is_control(cp)) continue;
        if (is_space(cp)) { st = word_flush(&w); continue; }
        bool cjk = is_cjk(cp);
        if (cjk && (st = word_flush(&w))) break;
        utf8proc_int32_t d[16];
        utf8proc_ssize_t nd = 1;
        d[0] = (utf8proc_int32_t)cp;
        if (tok->wpm_strip) {
            int bc = 0;
            nd = utf8proc_decompose_char((utf8proc_int32_t)cp, d, 16, UTF8PROC_DECOMPOSE, &bc);
            if (nd < 1 || nd > 16) { d[0] = (utf8proc_int32_t)cp; nd = 1; }
        }
        for (utf8proc_ssize_t k = 0; k < nd && !st; k++) {
            uint32_t c = (uint32_t)d[k];
            if (tok->wpm_strip && utf8proc_category(d[k]) == UTF8PROC_CATEGORY_MN) continue;
            if (tok->wpm_lower) {
                /* U+0130 (İ) is the one character whose full lowercase (Rust's, HF's) is two: i + U+0307;
                   with accents stripped NFD has already made it I + U+0307 */
                if (c == 0x130) {
                    if (!(st = emit(&w, 'i'))) st = emit(&w, 0x307);
                    continue;
                }
                c = (uint32_t)utf8proc_tolower((utf8proc_int32_t)c);
            }
            st = emit(&w, c);
        }
        if (!st && cjk) st = word_flush(&w);
    }
    if (!st) st = word_flush(&w);
    return st;
}

/* Hugging Face's WordPiece decoder cleanup, applied to each token's text
 * (with the space the decoder put before it), in its order. Every
 * replacement shortens: done in place. */
size_t toy_tok_wpm_cleanup(char *s, size_t n) {
    static const char *const from[] = {" .", " ?", " !", " ,", " ' ", " n't", " 'm", " do not", " 's", " 've", " 're"};
    static const char *const to[] = {".", "?", "!", ",", "'", "n't", "'m", " don't", "'s", "'ve", "'re"};
    if (!memchr(s, ' ', n)) return n;
    for (size_t r = 0; r < sizeof from / sizeof from[0]; r++) {
        size_t fl = strlen(from[r]), tl = strlen(to[r]), o = 0;
        for (size_t i = 0; i < n;) {
            if (i + fl <= n && !memcmp(s + i, from[r], fl)) {
                memmove(s + o, to[r], tl);
                o += tl;
                i += fl;
            } else {
                s[o++] = s[i++];
            }
        }
        n = o;
    }
    return n;
}
