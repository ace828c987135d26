/* sft.c: supervised fine-tuning data (toy/finetune.h): JSONL examples of
 * {"prompt","completion"} or {"messages":[...]} tokenized once, with a
 * per-token mask of what the loss learns, served in a seeded shuffled order
 * per epoch either as padded rows of one example each (targets -100 outside
 * the learned tokens) or packed: examples taken in that order, each placed
 * first-fit into B rows of T positions, with per-position document ids and
 * positions restarting at 0 (padding-free batches; the rows go through
 * toy_llama_forward_packed). A packed micro-batch ends at the first example
 * that fits in no row, or at the end of the epoch, so the sampler's state
 * stays (epoch, position) either way.
 *
 * Invariants: every kept example has n >= 2 ids and at least one learned
 * id among ids[1..min(n, T+1)-1]; ids are < the tokenizer's vocabulary.
 * The message shapes are those of TRL's SFTTrainer (prompt-completion and
 * conversational datasets). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/chat-template.h"
#include "toy/file.h"
#include "toy/finetune.h"

struct example {
    int32_t *ids;
    unsigned char *mask; /* (n) 1: this id is a target */
    int64_t n;
};

struct toy_sft {
    struct example *ex;
    int64_t n, n_train, dropped;
    int64_t T;
    uint64_t seed;
    int32_t pad;
    int64_t *order;      /* (n_train) the current epoch's permutation */
    int64_t order_epoch; /* which epoch `order` is for */
    struct toy_sft_state st;
    int64_t *fill;       /* (fill_cap) packing: positions used in each row */
    int64_t fill_cap;
    int64_t positions;   /* example positions handed out (statistics, not state) */
};

/* positions example e fills: its (input, target) pairs, at most T */
static int64_t packed_len(const struct toy_sft *d, const struct example *e) {
    return e->n - 1 < d->T ? e->n - 1 : d->T;
}

int64_t toy_sft_positions(const struct toy_sft *d) { return d->positions; }

void toy_sft_free(struct toy_sft *d) {
    if (!d) return;
    for (int64_t i = 0; i < d->n; i++) {
        free(d->ex[i].ids);
        free(d->ex[i].mask);
    }
    free(d->ex);
    free(d->order);
    free(d->fill);
    free(d);
}

/* ids and mask grow together (mask holds ids->cap bytes) */
static enum toy_status append(struct toy_tokens *ids, unsigned char **mask, int32_t id, unsigned char m) {
    if (ids->n + 1 > ids->cap) {
        size_t nc = ids->cap ? (size_t)ids->cap * 2 : 64;
        unsigned char *nm = realloc(*mask, nc);
        int32_t *ni = realloc(ids->ids, nc * sizeof *ni);
        if (nm) *mask = nm;
        if (ni) ids->ids = ni;
        if (!nm || !ni) return toy_error(TOY_ERR_NOMEM, "SFT example");
        ids->cap = (int64_t)nc;
    }
    ids->ids[ids->n] = id;
    (*mask)[ids->n] = m;
    ids->n++;
    return TOY_OK;
}

/* prompt + completion: [BOS] enc(P) enc(C) EOS, learning enc(C) EOS */
static enum toy_status encode_pc(const struct toy_tokenizer *tok, const char *p, const char *c, struct example *e) {
    struct toy_tokens ids = {0}, part = {0};
    unsigned char *mask = NULL;
    enum toy_status st = TOY_OK;
    if (toy_tokenizer_add_bos(tok) && toy_tokenizer_bos(tok) >= 0) st = append(&ids, &mask, toy_tokenizer_bos(tok), 0);
    for (int which = 0; which < 2 && !st; which++) {
        const char *s = which ? c : p;
        part.n = 0;
        st = toy_tokenizer_encode(tok, s, strlen(s), 0, &part);
        for (int64_t i = 0; i < part.n && !st; i++) st = append(&ids, &mask, part.ids[i], (unsigned char)which);
    }
    int32_t eos = toy_tokenizer_eot(tok) >= 0 ? toy_tokenizer_eot(tok) : toy_tokenizer_eos(tok);
    if (!st && eos >= 0) st = append(&ids, &mask, eos, 1);
    toy_tokens_free(&part);
    if (st) { toy_tokens_free(&ids); free(mask); return st; }
    e->ids = ids.ids;
    e->mask = mask;
    e->n = ids.n;
    return TOY_OK;
}

static enum toy_status encode_messages(const struct toy_tokenizer *tok, const char *tmpl, json_t *msgs,
                                       struct example *e, int64_t line) {
    size_t n = json_array_size(msgs);
    struct toy_chat_message *m = calloc(n + 1, sizeof *m);
    if (!m) return toy_error(TOY_ERR_NOMEM, "SFT messages");
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(o, "role"));
        const char *content = json_string_value(json_object_get(o, "content"));
        if (!role || !content) {
            free(m);
            return toy_error(TOY_ERR_FORMAT, "line %lld: message %zu needs string \"role\" and \"content\"",
                             (long long)line, i);
        }
        m[i] = (struct toy_chat_message){role, content};
    }
    if (!tmpl && !toy_tokenizer_chat_template(tok)) tmpl = "chatml";
    struct toy_tokens ids = {0};
    unsigned char *mask = NULL;
    enum toy_status st = toy_chat_encode(tok, tmpl, m, n, &ids, &mask);
    free(m);
    if (st) return toy_error(st, "line %lld: %s", (long long)line, toy_last_error());
    e->ids = ids.ids;
    e->mask = mask;
    e->n = ids.n;
    return TOY_OK;
}

/* true if some learned id falls among the T targets of the row */
static bool learns(const struct example *e, int64_t T) {
    int64_t end = e->n < T + 1 ? e->n : T + 1;
    for (int64_t i = 1; i < end; i++)
        if (e->mask[i]) return true;
    return false;
}

enum toy_status toy_sft_from_text(const char *text, size_t len, const struct toy_tokenizer *tok,
                                  const struct toy_sft_opts *o, struct toy_sft **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_sft_from_text: out is NULL");
    *out = NULL;
    if (o->ctx < 1) return toy_error(TOY_ERR_INVALID_ARG, "SFT: context %lld must be >= 1", (long long)o->ctx);
    if (!(o->heldout >= 0 && o->heldout < 1)) return toy_error(TOY_ERR_INVALID_ARG, "SFT: held-out fraction %g", o->heldout);
    struct toy_sft *d = calloc(1, sizeof *d);
    if (!d) return toy_error(TOY_ERR_NOMEM, "SFT data");
    d->T = o->ctx;
    d->seed = o->seed;
    d->pad = toy_tokenizer_pad(tok) >= 0 ? toy_tokenizer_pad(tok) : toy_tokenizer_eos(tok) >= 0 ? toy_tokenizer_eos(tok) : 0;
    d->order_epoch = -1;
    size_t cap = 0;
    enum toy_status st = TOY_OK;
    int64_t line = 0;
    for (size_t off = 0; off < len && !st;) {
        const char *nl = memchr(text + off, '\n', len - off);
        size_t n = nl ? (size_t)(nl - (text + off)) : len - off;
        const char *s = text + off;
        off += n + 1;
        line++;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
        if (k == n) continue;
        json_error_t err;
        json_t *j = json_loadb(s, n, 0, &err);
        if (!j || !json_is_object(j)) {
            st = toy_error(TOY_ERR_FORMAT, "line %lld: %s", (long long)line, j ? "not a JSON object" : err.text);
            json_decref(j);
            break;
        }
        struct example e = {0};
        json_t *msgs = json_object_get(j, "messages");
        const char *p = json_string_value(json_object_get(j, "prompt"));
        const char *c = json_string_value(json_object_get(j, "completion"));
        if (json_is_array(msgs)) st = encode_messages(tok, o->chat_template, msgs, &e, line);
        else if (p && c) st = encode_pc(tok, p, c, &e);
        else st = toy_error(TOY_ERR_FORMAT, "line %lld: expected {\"prompt\", \"completion\"} or {\"messages\": [...]}",
                            (long long)line);
        json_decref(j);
        if (st) break;
        if (e.n < 2 || !learns(&e, d->T)) {
            d->dropped++;
            free(e.ids);
            free(e.mask);
            continue;
        }
        if ((size_t)d->n == cap) {
            size_t nc = cap ? cap * 2 : 64;
            struct example *ne = realloc(d->ex, nc * sizeof *ne);
            if (!ne) { free(e.ids); free(e.mask); st = toy_error(TOY_ERR_NOMEM, "SFT data"); break; }
            d->ex = ne;
            cap = nc;
        }
        d->ex[d->n++] = e;
    }
    if (!st) {
        int64_t held = (int64_t)((double)d->n * o->heldout);
        d->n_train = d->n - held;
        if (d->n_train < 1)
            st = toy_error(TOY_ERR_RANGE, "SFT: no training examples (%lld read, %lld dropped: no completion token within the context)",
                           (long long)d->n, (long long)d->dropped);
    }
    if (!st && !(d->order = malloc((size_t)d->n_train * sizeof *d->order))) st = toy_error(TOY_ERR_NOMEM, "SFT data");
    if (st) { toy_sft_free(d); return st; }
    *out = d;
    return TOY_OK;
}

enum toy_status toy_sft_open(const char *path, const struct toy_tokenizer *tok, const struct toy_sft_opts *o,
                             struct toy_sft **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_sft_open: out is NULL");
    *out = NULL;
    char *buf;
    size_t len;
    /* read to its end, once: "-", /dev/stdin and FIFOs read as a file does */
    enum toy_status st = toy_file_read_all(path, &buf, &len);
    if (st) return st;
    st = toy_sft_from_text(buf, len, tok, o, out);
    free(buf);
    if (st) return toy_error(st, "%s: %s", path, toy_last_error());
    return TOY_OK;
}

int64_t toy_sft_n_train(const struct toy_sft *d) { return d->n_train; }
int64_t toy_sft_n_heldout(const struct toy_sft *d) { return d->n - d->n_train; }
int64_t toy_sft_dropped(const struct toy_sft *d) { return d->dropped; }
int64_t toy_sft_ctx(const struct toy_sft *d) { return d->T; }

void toy_sft_example(const struct toy_sft *d, int64_t i, const int32_t **ids, const unsigned char **mask, int64_t *n) {
    *ids = d->ex[i].ids;
    *mask = d->ex[i].mask;
    *n = d->ex[i].n;
}

uint64_t toy_sft_fingerprint(const struct toy_sft *d) {
    const uint64_t k = 0x9e3779b97f4a7c15ull;
    uint64_t r = ((uint64_t)d->n * k ^ (uint64_t)d->n_train) * k;
    for (int64_t i = 0; i < d->n; i++) {
        const struct example *e = &d->ex[i];
        r = (r ^ (uint64_t)e->n) * k;
        for (int64_t t = 0; t < e->n; t++) r = (r ^ ((uint64_t)(uint32_t)e->ids[t] << 1 | e->mask[t])) * k;
    }
    return r ^ r >> 29;
}

/* one row: x (T), y (T); returns the number of targets */
static int64_t fill_row(const struct toy_sft *d, const struct example *e, int32_t *x, int32_t *y) {
    int64_t cnt = 0;
    for (int64_t t = 0; t < d->T; t++) {
        if (t + 1 < e->n) {
            x[t] = e->ids[t];
            y[t] = e->mask[t + 1] ? e->ids[t + 1] : -100;
            cnt += e->mask[t + 1] != 0;
        } else {
            x[t] = t < e->n ? e->ids[t] : d->pad;
            y[t] = -100;
        }
    }
    return cnt;
}

static void make_order(struct toy_sft *d, int64_t epoch) {
    for (int64_t i = 0; i < d->n_train; i++) d->order[i] = i;
    struct toy_rng r;
    toy_rng_seed(&r, d->seed + 0x9e3779b97f4a7c15ull * (uint64_t)(epoch + 1));
    for (int64_t i = d->n_train - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)toy_rng_below(&r, (uint64_t)i + 1);
        int64_t t = d->order[i];
        d->order[i] = d->order[j];
        d->order[j] = t;
    }
    d->order_epoch = epoch;
}

void toy_sft_next_batch(struct toy_sft *d, int64_t B, int32_t *x, int32_t *y) {
    for (int64_t b = 0; b < B; b++) {
        if (d->st.pos >= d->n_train) {
            d->st.epoch++;
            d->st.pos = 0;
        }
        if (d->order_epoch != d->st.epoch) make_order(d, d->st.epoch);
        const struct example *e = &d->ex[d->order[d->st.pos++]];
        d->st.tokens += fill_row(d, e, x + b * d->T, y + b * d->T);
        d->st.rows++;
        d->positions += packed_len(d, e);
    }
}

int64_t toy_sft_eval_batch(const struct toy_sft *d, int64_t first, int64_t B, int32_t *x, int32_t *y) {
    int64_t real = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t i = d->n_train + first + b;
        if (first + b >= 0 && i < d->n) {
            fill_row(d, &d->ex[i], x + b * d->T, y + b * d->T);
            real++;
        } else {
            for (int64_t t = 0; t < d->T; t++) {
                x[b * d->T + t] = d->pad;
                y[b * d->T + t] = -100;
            }
        }
    }
    return real;
}

void toy_sft_get_state(const struct toy_sft *d, struct toy_sft_state *s) { *s = d->st; }
void toy_sft_set_state(struct toy_sft *d, const struct toy_sft_state *s) { d->st = *s; }

/* ---- packing ------------------------------------------------------------------ */


/* First-fit of the examples order[pos..] into B rows with fill[] used; stops
 * at the first that fits nowhere or at the end of the order. Returns the
 * next position; place(ud, row, example) is told where each one goes. */
static int64_t pack_rows(const struct toy_sft *d, const int64_t *order, int64_t pos, int64_t B, int64_t *fill,
                         void (*place)(void *, int64_t, const struct example *), void *ud) {
    for (; pos < d->n_train; pos++) {
        const struct example *e = &d->ex[order[pos]];
        int64_t L = packed_len(d, e), b = 0;
        while (b < B && fill[b] + L > d->T) b++;
        if (b == B) break;
        if (place) place(ud, b, e);
        fill[b] += L;
    }
    return pos;
}

struct pack_out {
    const struct toy_sft *d;
    int64_t *fill, *docs; /* (B) used positions and documents per row */
    int32_t *x, *y, *pos, *seg;
    int64_t targets, examples;
};

static void place_example(void *ud, int64_t b, const struct example *e) {
    struct pack_out *o = ud;
    int64_t T = o->d->T, L = packed_len(o->d, e), at = b * T + o->fill[b];
    for (int64_t t = 0; t < L; t++) {
        o->x[at + t] = e->ids[t];
        o->y[at + t] = e->mask[t + 1] ? e->ids[t + 1] : -100;
        o->targets += e->mask[t + 1] != 0;
        o->pos[at + t] = (int32_t)t;
        o->seg[at + t] = (int32_t)o->docs[b];
    }
    o->docs[b]++;
    o->examples++;
}

int64_t toy_sft_next_packed(struct toy_sft *d, int64_t B, int32_t *x, int32_t *y, int32_t *pos, int32_t *seg) {
    if (2 * B > d->fill_cap) { /* once per batch size: fill and docs */
        int64_t *nf = realloc(d->fill, (size_t)(2 * B) * sizeof *nf);
        if (!nf) {
            toy_error(TOY_ERR_NOMEM, "SFT packing: %lld rows", (long long)B);
            return -1;
        }
        d->fill = nf;
        d->fill_cap = 2 * B;
    }
    memset(d->fill, 0, (size_t)(2 * B) * sizeof *d->fill);
    if (d->st.pos >= d->n_train) {
        d->st.epoch++;
        d->st.pos = 0;
    }
    if (d->order_epoch != d->st.epoch) make_order(d, d->st.epoch);
    struct pack_out o = {d, d->fill, d->fill + B, x, y, pos, seg, 0, 0};
    d->st.pos = pack_rows(d, d->order, d->st.pos, B, d->fill, place_example, &o);
    for (int64_t b = 0; b < B; b++) { /* the tail of each row: padding, a document of its own */
        for (int64_t t = d->fill[b]; t < d->T; t++) {
            x[b * d->T + t] = d->pad;
            y[b * d->T + t] = -100;
            pos[b * d->T + t] = (int32_t)(t - d->fill[b]);
            seg[b * d->T + t] = -1;
        }
    }
    d->st.tokens += o.targets;
    d->st.rows += B;
    for (int64_t b = 0; b < B; b++) d->positions += d->fill[b];
    return o.examples;
}

int64_t toy_sft_packed_batches(const struct toy_sft *d, int64_t B, int64_t epochs, int64_t *positions) {
    int64_t *order = malloc((size_t)d->n_train * sizeof *order), *fill = malloc((size_t)B * sizeof *fill);
    int64_t n = 0, used = 0;
    if (!order || !fill) {
        free(order);
        free(fill);
        toy_error(TOY_ERR_NOMEM, "SFT packing");
        return -1;
    }
    struct toy_sft tmp = *d; /* its own order; the shuffle is a function of (seed, epoch) */
    tmp.order = order;
    for (int64_t e = 0; e < epochs; e++) {
        make_order(&tmp, e);
        for (int64_t p = 0; p < d->n_train; n++) {
            memset(fill, 0, (size_t)B * sizeof *fill);
            p = pack_rows(d, order, p, B, fill, NULL, NULL);
            for (int64_t b = 0; b < B; b++) used += fill[b];
        }
    }
    if (positions) *positions = used;
    free(order);
    free(fill);
    return n;
}
