/* json-grammar.c: toy/json-grammar.h: JSON Schema compiled to a tree of
 * nodes, and a pushdown matcher that reads a reply byte by byte.
 *
 * A path through the grammar is a stack of frames: a value still to start
 * (F_VALUE, which becomes one of the others at its first byte), an object
 * or array between its brackets, a string, a number, or a literal being
 * matched against a set of candidate texts (true/false/null, enum and
 * const values, and the keys of an object with properties). A number, and
 * a literal that may be the prefix of a longer candidate, end at the first
 * byte that cannot continue them, which then goes to the frame below.
 *
 * The matcher follows a set of paths at once: a union (anyOf, a type
 * list) whose branches start with the same byte forks its path into one
 * per branch, as does the choice among several framed forms, and a path
 * that cannot take a byte is dropped. Most of the time there is one.
 * Masking tries each token's bytes on copies of the paths (first bytes,
 * and byte pairs, that no path can take rule most tokens out before any
 * copy).
 */
#include "toy/json-grammar.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/tokenizer.h"

#define MAX_DEPTH 32
#define MAX_WS 16
#define MAX_SET 64
#define MAX_NUM 32
#define MAX_PATHS 64 /* paths followed at once; forks beyond them are dropped (the later branches) */

enum kind { K_ANY, K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_INTEGER, K_BOOL, K_NULL, K_LITS, K_UNION };

struct node {
    enum kind kind;
    int n;               /* object: properties; literals: texts; union: branches */
    char **text;         /* object: the keys as JSON text ("\"name\""); literals: canonical JSON texts */
    struct node **sub;   /* object: the properties' schemas; union: the branches */
    uint64_t required;   /* object: keys that must come */
    struct node *values; /* object without properties: every value's schema (NULL: no keys); array: items */
    int64_t min, max;    /* array: items; string: characters; max < 0: no limit */
};

static struct node any_node = {.kind = K_ANY};
static struct node any_object = {.kind = K_OBJECT, .values = &any_node, .max = -1};
static struct node any_array = {.kind = K_ARRAY, .values = &any_node, .max = -1};
static struct node any_string = {.kind = K_STRING, .max = -1};
static struct node any_number = {.kind = K_NUMBER};
static char *lits_any[] = {"true", "false", "null"};

struct form {
    struct node *root;
    char *prefix, *suffix; /* fixed text before and after the value ("" when none) */
};

struct toy_json_grammar {
    struct node **nodes; /* every node made, for freeing */
    int n_nodes, cap_nodes;
    struct form *forms;
    int n_forms;
    char *open, *close; /* an optional free block first (NULL: none) */
};

/* ---- the matcher ------------------------------------------------------------------------ */

enum fkind { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
enum { O_OPEN, O_COLON, O_AFTER, O_NEED_KEY };          /* object stages */
enum { A_OPEN, A_AFTER, A_NEED };                       /* array stages */
enum { R_FAIL, R_OK, R_AGAIN, R_FORK, R_FORMS };        /* a byte is bad, taken, for the frame below, or forks the
                                                         * path: among a union's branches, or among the forms */
/* where a path is: a form's prefix, value, suffix, all of it read; the free block's opening, its inside, and
 * the blanks after it (before a form) */
enum { PH_PREFIX, PH_VALUE, PH_SUFFIX, PH_END, PH_OPEN, PH_BLOCK, PH_GAP };

struct frame {
    const struct node *node;
    uint8_t kind, stage, key; /* key: this string or literal is an object's key */
    int32_t pos;              /* literal: bytes matched; number: characters; string: \u digits */
    int64_t count;            /* array: items; string: characters */
    uint64_t bits;            /* object: keys seen; literal: candidates left */
    int32_t cur;              /* object: the key whose value comes (-1: a free key) */
    uint8_t utf8, lo, hi;     /* string: continuation bytes still due, and the range of the next one */
    uint8_t low_due;          /* string: a \uD800-\uDBFF escape wants its low surrogate next */
    uint16_t hex;             /* string: the \u escape's value so far */
    char *const *lits;        /* literal: the candidates */
    int n_lits;
};

struct path {
    int form;  /* which form (-1: before the choice) */
    int phase; /* PH_* */
    size_t lit; /* bytes of the prefix, suffix or block marker matched */
    int depth, ws;
    struct frame st[MAX_DEPTH];
};

struct pset {
    int n, cap;
    struct path *p; /* cap of them, grown as needed up to MAX_PATHS */
};

struct toy_json_matcher {
    const struct toy_json_grammar *g;
    struct pset cur, *scratch; /* scratch: 4 sets, for stepping */
    /* what masking asks of each token, made at the first mask: its first byte, its kind, and whether its text
     * is plain string content (no quote, backslash or control byte; whole UTF-8 characters): its characters */
    const struct toy_tokenizer *tok;
    struct tok_info *info;
};

enum { TI_EOG = 1, TI_SPECIAL = 2, TI_NONE = 4 }; /* end of generation; a control token; no text (or unused) */
struct tok_info {
    uint16_t plain;        /* characters as plain string content, 0: not plain */
    uint8_t first, second; /* its first two bytes (second: 0 when it has one) */
    uint8_t flags;
    uint32_t n;            /* its bytes */
};

static bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

static int ws(struct path *m) { return ++m->ws <= MAX_WS ? R_OK : R_FAIL; }

static struct frame *push(struct path *m, enum fkind k, const struct node *nd) {
    if (m->depth == MAX_DEPTH) return NULL;
    struct frame *f = &m->st[m->depth++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)k;
    f->node = nd;
    f->cur = -1;
    return f;
}

/* the frame on top ends; a key tells its object which key it was */
static void pop(struct path *m, int key_index) {
    struct frame *f = &m->st[--m->depth];
    if (f->key && m->depth > 0) {
        struct frame *o = &m->st[m->depth - 1];
        o->cur = key_index;
        if (key_index >= 0) o->bits |= 1ull << key_index;
    }
}
static void lit_frame(struct frame *f, char *const *lits, int n) {
    f->kind = F_LIT;
    f->lits = lits;
    f->n_lits = n;
    f->pos = 0;
    f->bits = n >= 64 ? ~0ull : (1ull << n) - 1;
}

static int lit_byte(struct path *m, struct frame *f, unsigned char c) {
    uint64_t next = 0;
    int complete = -1, longer = 0;
    for (int i = 0; i < f->n_lits; i++) {
        if (!(f->bits >> i & 1)) continue;
        size_t len = strlen(f->lits[i]);
        if (len > (size_t)f->pos && (unsigned char)f->lits[i][f->pos] == c) {
            next |= 1ull << i;
            if (len == (size_t)f->pos + 1) complete = i;
            else longer = 1;
        }
    }
    if (!next) { /* c goes past every candidate: fine if one is complete here */
        for (int i = 0; i < f->n_lits; i++)
            if ((f->bits >> i & 1) && strlen(f->lits[i]) == (size_t)f->pos) {
                pop(m, i);
                return R_AGAIN;
            }
        return R_FAIL;
    }
    f->bits = next;
    f->pos++;
    if (complete >= 0 && !longer) pop(m, complete);
    return R_OK;
}

static int str_byte(struct path *m, struct frame *f, unsigned char c) {
    const struct node *nd = f->node;
    bool full = nd->max >= 0 && f->count >= nd->max;
    if (f->utf8) { /* inside a multi-byte character: well-formed UTF-8 only (no overlongs or surrogates) */
        if (c < f->lo || c > f->hi) return R_FAIL;
        f->utf8--;
        f->lo = 0x80, f->hi = 0xBF;
        return R_OK;
    }
    switch (f->stage) {
    case 0:
        if (f->low_due && c != '\\') return R_FAIL;
        if (c == '"') {
            if (f->count < nd->min) return R_FAIL;
            pop(m, -1);
            return R_OK;
        }
        if (c < 0x20 || (c >= 0x80 && c < 0xC2) || c > 0xF4) return R_FAIL;
        if (full) return R_FAIL;
        f->count++;
        if (c >= 0xC2) {
            f->utf8 = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
            f->lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
            f->hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        }
        if (c == '\\') f->stage = 1;
        return R_OK;
    case 1:
        if (c == 'u') { f->stage = 2, f->pos = 0, f->hex = 0; return R_OK; }
        if (f->low_due || !strchr("\"\\/bfnrt", c) || !c) return R_FAIL;
        f->stage = 0;
        return R_OK;
    default: /* \uXXXX: surrogates only in pairs (JSON readers refuse a lone one) */
        if (!isxdigit(c)) return R_FAIL;
        f->hex = (uint16_t)(f->hex << 4 | (is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
        if (++f->pos < 4) return R_OK;
        f->stage = 0;
        bool high = f->hex >= 0xD800 && f->hex <= 0xDBFF, low = f->hex >= 0xDC00 && f->hex <= 0xDFFF;
        if (f->low_due != low) return R_FAIL;
        f->low_due = high;
        return R_OK;
    }
}

/* number states: 0 start, 1 after '-', 2 a leading 0, 3 integer digits, 4 after '.', 5 fraction digits,
 * 6 after 'e', 7 after the exponent's sign, 8 exponent digits; 2, 3, 5 and 8 may end. At most 18 integer
 * digits, 16 fraction digits and 2 exponent digits (count: the digits of the part so far) */
static bool num_can_end(const struct frame *f) { return f->stage == 2 || f->stage == 3 || f->stage == 5 || f->stage == 8; }

static int num_byte(struct path *m, struct frame *f, unsigned char c) {
    bool integer = f->node->kind == K_INTEGER, d = is_digit(c);
    int s = f->stage, to = -1;
    switch (s) {
    case 0: to = c == '-' ? 1 : c == '0' ? 2 : d ? 3 : -1; break;
    case 1: to = c == '0' ? 2 : d ? 3 : -1; break;
    case 2:
    case 3:
        if (s == 3 && d) to = 3;
        else if (c == '.' && !integer) to = 4;
        else if ((c == 'e' || c == 'E') && !integer) to = 6;
        break;
    case 4: to = d ? 5 : -1; break;
    case 5: to = d ? 5 : (c == 'e' || c == 'E') ? 6 : -1; break;
    case 6: to = c == '+' || c == '-' ? 7 : d ? 8 : -1; break;
    case 7: to = d ? 8 : -1; break;
    case 8: to = d ? 8 : -1; break;
    }
    if (to < 0) {
        if (!num_can_end(f)) return R_FAIL;
        pop(m, -1);
        return R_AGAIN;
    }
    if (++f->pos > MAX_NUM) return R_FAIL;
    /* digits a part: what a 64-bit integer and a double hold (readers such as jansson refuse more) */
    f->count = to == s ? f->count + 1 : 1;
    if ((to == 3 && f->count > 18) || (to == 5 && f->count > 16) || (to == 8 && f->count > 2)) return R_FAIL;
    f->stage = (uint8_t)to;
    return R_OK;
}

static bool first_ok(const struct node *nd, unsigned char c) {
    switch (nd->kind) {
    case K_ANY: return c == '{' || c == '[' || c == '"' || c == '-' || is_digit(c) || c == 't' || c == 'f' || c == 'n';
    case K_OBJECT: return c == '{';
    case K_ARRAY: return c == '[';
    case K_STRING: return c == '"';
    case K_NUMBER:
    case K_INTEGER: return c == '-' || is_digit(c);
    case K_BOOL: return c == 't' || c == 'f';
    case K_NULL: return c == 'n';
    case K_LITS:
        for (int i = 0; i < nd->n; i++)
            if ((unsigned char)nd->text[i][0] == c) return true;
        return false;
    case K_UNION:
        for (int i = 0; i < nd->n; i++)
            if (first_ok(nd->sub[i], c)) return true;
        return false;
    }
    return false;
}

/* the value frame f starts with byte c as node nd */
static int start_value(struct path *m, struct frame *f, const struct node *nd, unsigned char c) {
    while (nd->kind == K_UNION) { /* the one branch that can start with c, or a fork among several */
        const struct node *pick = NULL;
        int k = 0;
        for (int i = 0; i < nd->n; i++)
            if (first_ok(nd->sub[i], c)) pick = nd->sub[i], k++;
        if (k == 0) return R_FAIL;
        if (k > 1) {
            f->node = nd;
            return R_FORK;
        }
        nd = pick;
    }
    if (nd->kind == K_ANY) {
        nd = c == '{' ? &any_object : c == '[' ? &any_array : c == '"' ? &any_string : NULL;
        if (!nd && (c == '-' || is_digit(c))) nd = &any_number;
        if (!nd) {
            f->node = &any_node;
            lit_frame(f, lits_any, 3);
            return lit_byte(m, f, c);
        }
    }
    if (!first_ok(nd, c)) return R_FAIL;
    f->node = nd;
    switch (nd->kind) {
    case K_OBJECT: f->kind = F_OBJ, f->stage = O_OPEN, f->bits = 0; return R_OK;
    case K_ARRAY: f->kind = F_ARR, f->stage = A_OPEN, f->count = 0; return R_OK;
    case K_STRING: f->kind = F_STR, f->stage = 0, f->count = 0; return R_OK;
    case K_NUMBER:
    case K_INTEGER: f->kind = F_NUM, f->stage = 0, f->pos = 0; return num_byte(m, f, c);
    case K_BOOL: lit_frame(f, lits_any, 2); return lit_byte(m, f, c);
    case K_NULL: lit_frame(f, lits_any + 2, 1); return lit_byte(m, f, c);
    case K_LITS: lit_frame(f, nd->text, nd->n); return lit_byte(m, f, c);
    default: return R_FAIL;
    }
}

static uint64_t all_keys(const struct node *nd) { return nd->n >= 64 ? ~0ull : (1ull << nd->n) - 1; }

static bool more_keys(const struct frame *f) {
    const struct node *nd = f->node;
    return nd->n ? (all_keys(nd) & ~f->bits) != 0 : nd->values != NULL;
}

static int obj_byte(struct path *m, struct frame *f, unsigned char c) {
    const struct node *nd = f->node;
    if (is_ws(c)) return ws(m);
    switch (f->stage) {
    case O_OPEN:
    case O_NEED_KEY:
        if (c == '}' && f->stage == O_OPEN && (nd->required & ~f->bits) == 0) break;
        if (c != '"' || !more_keys(f)) return R_FAIL;
        f->stage = O_COLON;
        if (nd->n) { /* one of the keys not yet seen */
            struct frame *k = push(m, F_LIT, nd);
            if (!k) return R_FAIL;
            lit_frame(k, nd->text, nd->n);
            k->bits &= ~m->st[m->depth - 2].bits;
            k->key = 1;
            return lit_byte(m, k, c);
        }
        struct frame *k = push(m, F_STR, &any_string);
        if (!k) return R_FAIL;
        k->key = 1;
        return R_OK;
    case O_COLON: {
        if (c != ':') return R_FAIL;
        f->stage = O_AFTER;
        const struct node *v = nd->n ? nd->sub[f->cur] : nd->values;
        return push(m, F_VALUE, v) ? R_OK : R_FAIL;
    }
    default: /* O_AFTER */
        if (c == ',' && more_keys(f)) { f->stage = O_NEED_KEY; return R_OK; }
        if (c == '}' && (nd->required & ~f->bits) == 0) break;
        return R_FAIL;
    }
    pop(m, -1);
    return R_OK;
}

static int arr_byte(struct path *m, struct frame *f, unsigned char c) {
    const struct node *nd = f->node;
    if (is_ws(c)) return ws(m);
    if (f->stage == A_AFTER) {
        if (c == ',' && (nd->max < 0 || f->count < nd->max)) { f->stage = A_NEED; return R_OK; }
        if (c == ']' && f->count >= nd->min) { pop(m, -1); return R_OK; }
        return R_FAIL;
    }
    if (c == ']' && f->stage == A_OPEN && nd->min <= 0) { pop(m, -1); return R_OK; }
    if (nd->max >= 0 && f->count >= nd->max) return R_FAIL;
    f->count++;
    f->stage = A_AFTER;
    return push(m, F_VALUE, nd->values) ? R_AGAIN : R_FAIL;
}

/* the form's prefix and suffix, and the free block's opening, byte for byte */
static bool fixed_text(const struct toy_json_grammar *g, struct path *m, unsigned char c) {
    const char *t = m->phase == PH_OPEN ? g->open : m->phase == PH_PREFIX ? g->forms[m->form].prefix
                                                                         : g->forms[m->form].suffix;
    if ((unsigned char)t[m->lit] != c || !c) return false;
    if (!t[++m->lit]) { /* the prefix read: the value; the suffix: all; the opening: the block */
        m->phase = m->phase == PH_OPEN ? PH_BLOCK : m->phase + 1;
        m->lit = 0;
    }
    return true;
}

/* inside the free block: anything, until its closing text */
static void block_byte(const struct toy_json_grammar *g, struct path *m, unsigned char c) {
    const char *t = g->close;
    size_t n = m->lit;
    /* the longest start of the closing text that the bytes read end with */
    for (;;) {
        if ((unsigned char)t[n] == c) { n++; break; }
        if (n == 0) break;
        size_t k = n - 1; /* the next shorter start of t that ends the matched part */
        while (k > 0 && memcmp(t, t + n - k, k)) k--;
        n = k;
    }
    m->lit = n;
    if (!t[n]) m->phase = PH_GAP, m->lit = 0, m->ws = 0;
}

static int step(const struct toy_json_grammar *g, struct path *m, unsigned char c) {
    switch (m->phase) {
    case PH_BLOCK: block_byte(g, m, c); return R_OK;
    case PH_GAP: return is_ws(c) && ++m->ws <= MAX_WS ? R_OK : R_FORMS;
    case PH_VALUE: break;
    case PH_END: return R_FAIL;
    default: return fixed_text(g, m, c) ? R_OK : R_FAIL;
    }
    if (!is_ws(c)) m->ws = 0;
    for (;;) {
        if (m->depth == 0) { /* a whole value: the suffix, or nothing, may follow */
            if (!g->forms[m->form].suffix[0]) return R_FAIL;
            m->phase = PH_SUFFIX, m->lit = 0;
            return fixed_text(g, m, c) ? R_OK : R_FAIL;
        }
        struct frame *f = &m->st[m->depth - 1];
        int r;
        switch (f->kind) {
        case F_VALUE: r = is_ws(c) ? ws(m) : start_value(m, f, f->node, c); break;
        case F_OBJ: r = obj_byte(m, f, c); break;
        case F_ARR: r = arr_byte(m, f, c); break;
        case F_STR: r = str_byte(m, f, c); break;
        case F_NUM: r = num_byte(m, f, c); break;
        default: r = lit_byte(m, f, c); break;
        }
        if (r != R_AGAIN) return r;
    }
}

static void copy_path(struct path *dst, const struct path *src) {
    memcpy(dst, src, offsetof(struct path, st) + (size_t)src->depth * sizeof src->st[0]);
}

static bool same_path(const struct path *a, const struct path *b) {
    return a->form == b->form && a->phase == b->phase && a->lit == b->lit && a->depth == b->depth && a->ws == b->ws &&
           !memcmp(a->st, b->st, (size_t)a->depth * sizeof a->st[0]);
}

/* room for one more path in s (false: at MAX_PATHS, or out of memory: the path is dropped) */
static bool room_for_one(struct pset *s) {
    if (s->n < s->cap) return true;
    if (s->cap == MAX_PATHS) return false;
    int cap = s->cap ? 2 * s->cap : 4;
    if (cap > MAX_PATHS) cap = MAX_PATHS;
    struct path *p = realloc(s->p, (size_t)cap * sizeof *p);
    if (!p) return false;
    s->p = p, s->cap = cap;
    return true;
}

static void add_path(struct pset *s, const struct path *p) {
    for (int i = 0; i < s->n; i++)
        if (same_path(&s->p[i], p)) return;
    if (room_for_one(s)) copy_path(&s->p[s->n++], p);
}

/* a path at the start of form i */
static void form_start(const struct toy_json_grammar *g, struct path *p, int i) {
    memset(p, 0, offsetof(struct path, st));
    p->form = i;
    p->phase = g->forms[i].prefix[0] ? PH_PREFIX : PH_VALUE;
    push(p, F_VALUE, g->forms[i].root);
}

static void step_into(const struct toy_json_grammar *g, struct path *p, unsigned char c, struct pset *out);

/* p's step with c answered a fork (R_FORK or R_FORMS): each branch, or form, that can take c goes to out */
static void expand(const struct toy_json_grammar *g, const struct path *p, int r, unsigned char c, struct pset *out) {
    const struct node *u = r == R_FORK ? p->st[p->depth - 1].node : NULL;
    int n = r == R_FORK ? u->n : g->n_forms;
    for (int i = 0; i < n && out->n < MAX_PATHS; i++) {
        struct path q;
        if (r == R_FORMS) {
            form_start(g, &q, i);
        } else {
            if (!first_ok(u->sub[i], c)) continue;
            copy_path(&q, p);
            q.st[q.depth - 1].node = u->sub[i];
        }
        step_into(g, &q, c, out);
    }
}

/* p (changed) takes c; every path it becomes goes to out */
static void step_into(const struct toy_json_grammar *g, struct path *p, unsigned char c, struct pset *out) {
    int r = step(g, p, c);
    if (r == R_OK) add_path(out, p);
    else if (r == R_FORK || r == R_FORMS) expand(g, p, r, c, out);
}

/* the paths from, after bytes b[0..n): one of the two scratch sets (or from itself when n is 0) */
static const struct pset *run(const struct toy_json_grammar *g, const struct pset *from, const unsigned char *b, size_t n,
                              struct pset *s0, struct pset *s1) {
    const struct pset *cur = from;
    for (size_t i = 0; i < n && cur->n; i++) {
        struct pset *out = cur == s0 ? s1 : s0;
        out->n = 0;
        for (int k = 0; k < cur->n; k++) {
            struct path t;
            copy_path(&t, &cur->p[k]);
            step_into(g, &t, b[i], out);
        }
        cur = out;
    }
    return cur;
}

static bool path_done(const struct toy_json_grammar *g, const struct path *m) {
    if (m->phase == PH_END) return true;
    if (m->phase != PH_VALUE || g->forms[m->form].suffix[0]) return false;
    if (m->depth == 0) return true;
    if (m->depth > 1) return false;
    const struct frame *f = &m->st[0]; /* a root number, or literal, that may yet go on */
    if (f->kind == F_NUM) return num_can_end(f);
    if (f->kind == F_LIT)
        for (int i = 0; i < f->n_lits; i++)
            if ((f->bits >> i & 1) && strlen(f->lits[i]) == (size_t)f->pos) return true;
    return false;
}

enum toy_status toy_json_matcher_new(const struct toy_json_grammar *g, struct toy_json_matcher **out) {
    *out = NULL;
    struct toy_json_matcher *m = calloc(1, sizeof *m);
    if (!m) return toy_error(TOY_ERR_NOMEM, "json matcher");
    m->g = g;
    bool ok = (m->scratch = calloc(4, sizeof *m->scratch)) != NULL;
    for (int i = 0; i < g->n_forms && ok; i++) {
        if ((ok = room_for_one(&m->cur))) form_start(g, &m->cur.p[m->cur.n++], i);
    }
    if (ok && g->open && (ok = room_for_one(&m->cur))) { /* or the free block first */
        struct path *p = &m->cur.p[m->cur.n++];
        memset(p, 0, offsetof(struct path, st));
        p->form = -1;
        p->phase = PH_OPEN;
    }
    if (!ok) {
        toy_json_matcher_free(m);
        return toy_error(TOY_ERR_NOMEM, "json matcher");
    }
    *out = m;
    return TOY_OK;
}

void toy_json_matcher_free(struct toy_json_matcher *m) {
    if (!m) return;
    free(m->info);
    free(m->cur.p);
    for (int i = 0; m->scratch && i < 4; i++) free(m->scratch[i].p);
    free(m->scratch);
    free(m);
}

/* characters of b[0..n) as string content that needs no escape, or 0 */
static uint16_t plain_chars(const unsigned char *b, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = b[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c < 0xE0 ? 2 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || c < 0x20 || c == '"' || c == '\\' || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((b[i + j] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && b[i + 1] < 0xA0) || (c == 0xED && b[i + 1] > 0x9F) || (c == 0xF0 && b[i + 1] < 0x90) ||
            (c == 0xF4 && b[i + 1] > 0x8F))
            return 0;
        i += k;
        chars++;
    }
    return chars > 0xFFFF ? 0 : (uint16_t)chars;
}

/* whether some path of from takes b[0..n): each path stepped in place until a fork, if any, makes a set */
static bool set_accepts(const struct toy_json_matcher *m, const struct pset *from, const char *bytes, size_t n) {
    const unsigned char *b = (const unsigned char *)bytes;
    for (int k = 0; k < from->n; k++) {
        struct path t;
        copy_path(&t, &from->p[k]);
        size_t i = 0;
        int r = R_OK;
        while (i < n && (r = step(m->g, &t, b[i])) == R_OK) i++;
        if (i == n) return true;
        if (r == R_FAIL) continue;
        struct pset *forks = &m->scratch[3];
        forks->n = 0;
        expand(m->g, &t, r, b[i], forks);
        if (run(m->g, forks, b + i + 1, n - i - 1, &m->scratch[0], &m->scratch[1])->n) return true;
    }
    return false;
}

bool toy_json_matcher_accepts(const struct toy_json_matcher *m, const char *bytes, size_t n) {
    return set_accepts(m, &m->cur, bytes, n);
}

bool toy_json_matcher_feed(struct toy_json_matcher *m, const char *bytes, size_t n) {
    const struct pset *r = run(m->g, &m->cur, (const unsigned char *)bytes, n, &m->scratch[0], &m->scratch[1]);
    if (!r->n) return false;
    if (r != &m->cur) { /* the result becomes cur; cur's array, the scratch set's */
        struct pset *sr = r == &m->scratch[0] ? &m->scratch[0] : &m->scratch[1], t = m->cur;
        m->cur = *sr, *sr = t;
    }
    return true;
}

bool toy_json_matcher_take(struct toy_json_matcher *m, const struct toy_tokenizer *tok, int32_t id) {
    if (toy_tokenizer_is_eog(tok, id)) return true;
    size_t n = 0;
    const char *b = toy_tokenizer_token_bytes(tok, id, &n);
    return b && toy_json_matcher_feed(m, b, n);
}

bool toy_json_matcher_done(const struct toy_json_matcher *m) {
    for (int i = 0; i < m->cur.n; i++)
        if (path_done(m->g, &m->cur.p[i])) return true;
    return false;
}

/* nothing but the end of generation, at logit 0 */
static int64_t only_the_end(const struct toy_tokenizer *tok, float *logits, int64_t n_vocab) {
    int64_t left = 0;
    for (int64_t v = 0; v < n_vocab; v++) {
        bool eog = toy_tokenizer_is_eog(tok, (int32_t)v);
        logits[v] = eog ? 0.0f : -INFINITY;
        left += eog;
    }
    return left;
}

static void token_table(struct toy_json_matcher *m, const struct toy_tokenizer *tok, int64_t n_vocab) {
    free(m->info);
    m->tok = tok;
    if (!(m->info = malloc((size_t)n_vocab * sizeof *m->info))) m->tok = NULL;
    for (int64_t v = 0; m->info && v < n_vocab; v++) {
        size_t n = 0;
        const char *b = toy_tokenizer_token_bytes(tok, (int32_t)v, &n);
        enum toy_token_type t = toy_tokenizer_token_type(tok, (int32_t)v);
        struct tok_info *ti = &m->info[v];
        ti->flags = (uint8_t)((toy_tokenizer_is_eog(tok, (int32_t)v) ? TI_EOG : 0) |
                              (t == TOY_TOKEN_CONTROL ? TI_SPECIAL : 0) |
                              (!b || n == 0 || t == TOY_TOKEN_UNUSED ? TI_NONE : 0));
        ti->first = b && n ? (uint8_t)b[0] : 0;
        ti->second = b && n > 1 ? (uint8_t)b[1] : 0;
        ti->n = (uint32_t)n;
        ti->plain = ti->flags ? 0 : plain_chars((const unsigned char *)b, n);
    }
}

int64_t toy_json_matcher_mask(struct toy_json_matcher *m, const struct toy_tokenizer *tok, float *logits,
                              int64_t n_vocab) {
    if (m->tok != tok) token_table(m, tok, n_vocab);
    if (!m->info) return only_the_end(tok, logits, n_vocab); /* out of memory */
    /* in a string, between characters: a plain token fits if the length limit lets it; special tokens only
     * where a path is outside the value (a prefix, suffix or the free block: in a string theirs would be taken) */
    int64_t room = -1;
    struct pset *outside = &m->scratch[2];
    outside->n = 0;
    for (int i = 0; i < m->cur.n; i++) {
        const struct path *p = &m->cur.p[i];
        const struct frame *top = p->depth ? &p->st[p->depth - 1] : NULL;
        if (p->phase == PH_VALUE && top && top->kind == F_STR && top->stage == 0 && !top->utf8 && !top->low_due) {
            int64_t r = top->node->max < 0 ? INT64_MAX : top->node->max - top->count;
            if (r > room) room = r;
        }
        if ((p->phase != PH_VALUE || p->depth == 0) && room_for_one(outside)) copy_path(&outside->p[outside->n++], p);
    }
    bool first[256], done = toy_json_matcher_done(m);
    int n_first = 0;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        n_first += first[b] = toy_json_matcher_accepts(m, &c, 1);
    }
    /* between values few first bytes fit (blanks, a quote, a bracket), but many tokens start with a blank: the
     * byte pairs that fit rule most of those out too. (With the free block open every byte fits: no pairs.) */
    static _Thread_local uint64_t second[256][4];
    bool pairs = n_first <= 32;
    for (int b = 0; pairs && b < 256; b++) {
        if (!first[b]) continue;
        const unsigned char ub = (unsigned char)b;
        const struct pset *after = run(m->g, &m->cur, &ub, 1, &m->scratch[0], &m->scratch[1]);
        struct pset *tried = &m->scratch[1];
        memset(second[b], 0, sizeof second[b]);
        for (int c = 0; c < 256; c++) {
            bool ok = false;
            for (int i = 0; i < after->n && !ok; i++) {
                struct path t;
                copy_path(&t, &after->p[i]);
                int r = step(m->g, &t, (unsigned char)c);
                if (r == R_FORK || r == R_FORMS) {
                    tried->n = 0;
                    expand(m->g, &t, r, (unsigned char)c, tried);
                }
                ok = r == R_OK || ((r == R_FORK || r == R_FORMS) && tried->n > 0);
            }
            if (ok) second[b][c >> 6] |= 1ull << (c & 63);
        }
    }
    int64_t left = 0;
    for (int64_t v = 0; v < n_vocab; v++) {
        if (logits[v] == -INFINITY) continue;
        const struct tok_info *ti = &m->info[v];
        bool ok;
        if (room >= 0 && ti->plain && ti->plain <= room) {
            ok = true;
        } else if (ti->flags & TI_EOG) {
            ok = done;
        } else if ((ti->flags & TI_NONE) || !first[ti->first] || ((ti->flags & TI_SPECIAL) && !outside->n)) {
            ok = false;
        } else if (ti->n == 1 && !(ti->flags & TI_SPECIAL)) {
            ok = true;
        } else if (pairs && !(second[ti->first][ti->second >> 6] >> (ti->second & 63) & 1)) {
            ok = false;
        } else if (pairs && ti->n == 2 && !(ti->flags & TI_SPECIAL)) {
            ok = true;
        } else {
            size_t n = 0;
            const char *b = toy_tokenizer_token_bytes(tok, (int32_t)v, &n);
            ok = set_accepts(m, ti->flags & TI_SPECIAL ? outside : &m->cur, b, n);
        }
        if (ok) left++;
        else logits[v] = -INFINITY;
    }
    return left ? left : only_the_end(tok, logits, n_vocab);
}

/* ---- schemas ----------------------------------------------------------------------------------- */

struct compiler {
    struct toy_json_grammar *g;
    json_t *root;
    struct {
        char *ref;
        struct node *node;
    } refs[256];
    int n_refs;
    enum toy_status st;
};

static struct node *new_node(struct compiler *cc, enum kind k) {
    struct toy_json_grammar *g = cc->g;
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 16;
        struct node **nn = realloc(g->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return NULL;
        g->nodes = nn, g->cap_nodes = cap;
    }
    struct node *nd = calloc(1, sizeof *nd);
    if (!nd) return NULL;
    nd->kind = k;
    nd->max = -1;
    g->nodes[g->n_nodes++] = nd;
    return nd;
}

#define FAIL(cc, ...) ((cc)->st = toy_error(TOY_ERR_INVALID_ARG, __VA_ARGS__), (struct node *)NULL)

static const char *const unsupported[] = {
    "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "allOf", "not", "if",
    "then", "else", "patternProperties", "propertyNames", "uniqueItems", "contains", "minContains", "maxContains",
    "prefixItems", "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
    "unevaluatedProperties", "unevaluatedItems", "additionalItems", "$dynamicRef", NULL};

static struct node *compile(struct compiler *cc, json_t *s, const char *ptr, int depth);

/* a union of the branches (a path forks where several can start with the same byte) */
static struct node *union_of(struct compiler *cc, struct node **alts, int n, const char *ptr) {
    if (n == 1) return alts[0];
    struct node *u = new_node(cc, K_UNION);
    if (!u || !(u->sub = calloc((size_t)n, sizeof *u->sub)) || !(u->text = calloc(1, sizeof *u->text)) ||
        !(u->text[0] = strdup(ptr)))
        return FAIL(cc, "out of memory");
    memcpy(u->sub, alts, (size_t)n * sizeof *alts);
    u->n = n;
    return u;
}

static bool get_count(struct compiler *cc, json_t *s, const char *key, int64_t *out, const char *ptr) {
    json_t *v = json_object_get(s, key);
    if (!v) return true;
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        cc->st = toy_error(TOY_ERR_INVALID_ARG, "schema at %s: '%s' must be a non-negative integer", ptr, key);
        return false;
    }
    *out = json_integer_value(v);
    return true;
}

static struct node *compile_type(struct compiler *cc, json_t *s, const char *type, const char *ptr, int depth) {
    char sub[512];
    if (!strcmp(type, "string")) {
        struct node *nd = new_node(cc, K_STRING);
        if (!nd) return FAIL(cc, "out of memory");
        if (!get_count(cc, s, "minLength", &nd->min, ptr) || !get_count(cc, s, "maxLength", &nd->max, ptr)) return NULL;
        return nd;
    }
    if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") || !strcmp(type, "null")) {
        enum kind k = type[0] == 'n' && type[1] == 'u' && type[2] == 'm' ? K_NUMBER : type[0] == 'i' ? K_INTEGER
                      : type[0] == 'b'                                    ? K_BOOL
                                                                          : K_NULL;
        struct node *nd = new_node(cc, k);
        return nd ? nd : FAIL(cc, "out of memory");
    }
    if (!strcmp(type, "array")) {
        struct node *nd = new_node(cc, K_ARRAY);
        if (!nd) return FAIL(cc, "out of memory");
        json_t *items = json_object_get(s, "items");
        if (json_is_array(items)) return FAIL(cc, "schema at %s: tuple 'items' (an array) is not supported", ptr);
        snprintf(sub, sizeof sub, "%s/items", ptr);
        nd->values = items ? compile(cc, items, sub, depth + 1) : &any_node;
        if (!nd->values) return NULL;
        if (!get_count(cc, s, "minItems", &nd->min, ptr) || !get_count(cc, s, "maxItems", &nd->max, ptr)) return NULL;
        return nd;
    }
    if (!strcmp(type, "object")) {
        struct node *nd = new_node(cc, K_OBJECT);
        if (!nd) return FAIL(cc, "out of memory");
        json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
        json_t *add = json_object_get(s, "additionalProperties");
        if (props && !json_is_object(props)) return FAIL(cc, "schema at %s: 'properties' must be an object", ptr);
        size_t np = props ? json_object_size(props) : 0;
        if (np > MAX_SET) return FAIL(cc, "schema at %s: more than %d properties", ptr, MAX_SET);
        if (np && add && !json_is_false(add))
            return FAIL(cc, "schema at %s: 'additionalProperties' beside 'properties' is not supported (toy writes "
                        "only the listed keys)", ptr);
        if (np) {
            nd->text = calloc(np, sizeof *nd->text);
            nd->sub = calloc(np, sizeof *nd->sub);
            if (!nd->text || !nd->sub) return FAIL(cc, "out of memory");
            const char *key;
            json_t *v;
            json_object_foreach(props, key, v) {
                json_t *ks = json_string(key);
                nd->text[nd->n] = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
                json_decref(ks);
                if (!nd->text[nd->n]) return FAIL(cc, "schema at %s: property '%s'", ptr, key);
                snprintf(sub, sizeof sub, "%s/properties/%s", ptr, key);
                struct node *pn = compile(cc, v, sub, depth + 1);
                nd->sub[nd->n++] = pn;
                if (!pn) return NULL;
            }
        } else {
            if (add && !json_is_boolean(add) && !json_is_object(add))
                return FAIL(cc, "schema at %s: 'additionalProperties' must be a boolean or a schema", ptr);
            snprintf(sub, sizeof sub, "%s/additionalProperties", ptr);
            nd->values = json_is_false(add) ? NULL : json_is_object(add) ? compile(cc, add, sub, depth + 1) : &any_node;
            if (json_is_object(add) && !nd->values) return NULL;
        }
        if (req && !json_is_array(req)) return FAIL(cc, "schema at %s: 'required' must be an array", ptr);
        for (size_t i = 0; req && i < json_array_size(req); i++) {
            const char *name = json_string_value(json_array_get(req, i));
            int k = -1;
            for (int p = 0; name && p < nd->n; p++) {
                json_t *ks = json_string(name);
                char *t = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
                if (t && !strcmp(t, nd->text[p])) k = p;
                free(t);
                json_decref(ks);
            }
            if (k < 0) return FAIL(cc, "schema at %s: required '%s' is not among the properties", ptr, name ? name : "?");
            nd->required |= 1ull << k;
        }
        return nd;
    }
    return FAIL(cc, "schema at %s: unknown type '%s'", ptr, type);
}

static struct node *compile_ref(struct compiler *cc, const char *ref, const char *ptr, int depth) {
    for (int i = 0; i < cc->n_refs; i++)
        if (!strcmp(cc->refs[i].ref, ref)) return cc->refs[i].node;
    const char *name = NULL;
    json_t *defs = NULL;
    if (!strncmp(ref, "#/$defs/", 8)) name = ref + 8, defs = json_object_get(cc->root, "$defs");
    else if (!strncmp(ref, "#/definitions/", 14)) name = ref + 14, defs = json_object_get(cc->root, "definitions");
    json_t *target = name ? json_object_get(defs, name) : NULL;
    if (!target) return FAIL(cc, "schema at %s: $ref '%s' (toy follows #/$defs/NAME and #/definitions/NAME)", ptr, ref);
    if (cc->n_refs == 256) return FAIL(cc, "schema: more than 256 $refs");
    /* a placeholder first, so that a recursive schema refers to itself */
    struct node *nd = new_node(cc, K_ANY);
    if (!nd) return FAIL(cc, "out of memory");
    cc->refs[cc->n_refs].ref = strdup(ref);
    cc->refs[cc->n_refs++].node = nd;
    struct node *t = compile(cc, target, ref + 1, depth + 1);
    if (!t) return NULL;
    bool shared = t == &any_node || t == &any_object || t == &any_array || t == &any_string || t == &any_number;
    for (int i = 0; i < cc->n_refs; i++) shared |= cc->refs[i].node == t;
    *nd = *t;
    if (!shared) t->text = NULL, t->sub = NULL, t->n = 0; /* its arrays move to nd (each freed once) */
    return nd;
}

static struct node *compile(struct compiler *cc, json_t *s, const char *ptr, int depth) {
    if (depth > 64) return FAIL(cc, "schema at %s: nested more than 64 deep", ptr);
    if (json_is_true(s)) return &any_node;
    if (!json_is_object(s)) return FAIL(cc, "schema at %s: a schema must be an object or true", ptr);
    for (const char *const *k = unsupported; *k; k++)
        if (json_object_get(s, *k))
            return FAIL(cc, "schema at %s: '%s' is not supported (toy cannot enforce it while generating)", ptr, *k);
    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref)) return FAIL(cc, "schema at %s: '$ref' must be a string", ptr);
        return compile_ref(cc, json_string_value(ref), ptr, depth);
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0))
            return FAIL(cc, "schema at %s: 'enum' must be a non-empty array", ptr);
        size_t n = en ? json_array_size(en) : 1;
        if (n > MAX_SET) return FAIL(cc, "schema at %s: 'enum' of more than %d values", ptr, MAX_SET);
        struct node *nd = new_node(cc, K_LITS);
        if (!nd || !(nd->text = calloc(n, sizeof *nd->text))) return FAIL(cc, "out of memory");
        for (size_t i = 0; i < n; i++) {
            nd->text[i] = json_dumps(en ? json_array_get(en, i) : cn, JSON_COMPACT | JSON_ENCODE_ANY);
            nd->n++;
            if (!nd->text[i]) return FAIL(cc, "out of memory");
        }
        return nd;
    }
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    char sub[512];
    if (any) {
        if (!json_is_array(any) || json_array_size(any) == 0 || json_array_size(any) > MAX_SET)
            return FAIL(cc, "schema at %s: 'anyOf' / 'oneOf' must be an array of 1 to %d schemas", ptr, MAX_SET);
        struct node *alts[MAX_SET];
        size_t n = json_array_size(any);
        for (size_t i = 0; i < n; i++) {
            snprintf(sub, sizeof sub, "%s/anyOf/%zu", ptr, i);
            if (!(alts[i] = compile(cc, json_array_get(any, i), sub, depth + 1))) return NULL;
        }
        return union_of(cc, alts, (int)n, ptr);
    }
    json_t *type = json_object_get(s, "type");
    if (!type) { /* what the keywords show, else anything */
        if (json_object_get(s, "properties") || json_object_get(s, "additionalProperties") ||
            json_object_get(s, "required"))
            return compile_type(cc, s, "object", ptr, depth);
        if (json_object_get(s, "items")) return compile_type(cc, s, "array", ptr, depth);
        return &any_node;
    }
    if (json_is_string(type)) return compile_type(cc, s, json_string_value(type), ptr, depth);
    if (!json_is_array(type) || json_array_size(type) == 0 || json_array_size(type) > 7)
        return FAIL(cc, "schema at %s: 'type' must be a string or a list of them", ptr);
    struct node *alts[7];
    size_t n = json_array_size(type);
    for (size_t i = 0; i < n; i++) {
        const char *t = json_string_value(json_array_get(type, i));
        if (!t) return FAIL(cc, "schema at %s: 'type' must be a string or a list of them", ptr);
        if (!(alts[i] = compile_type(cc, s, t, ptr, depth))) return NULL;
    }
    return union_of(cc, alts, (int)n, ptr);
}

void toy_json_grammar_free(struct toy_json_grammar *g) {
    if (!g) return;
    for (int i = 0; i < g->n_nodes; i++) {
        struct node *nd = g->nodes[i];
        for (int k = 0; nd->text && k < (nd->kind == K_UNION ? 1 : nd->n); k++) free(nd->text[k]);
        free(nd->text);
        free(nd->sub);
        free(nd);
    }
    free(g->nodes);
    for (int i = 0; g->forms && i < g->n_forms; i++) free(g->forms[i].prefix), free(g->forms[i].suffix);
    free(g->forms);
    free(g->open);
    free(g->close);
    free(g);
}

/* one schema (NULL: any object) into g's nodes; its $refs are its own */
static enum toy_status compile_schema(struct toy_json_grammar *g, const char *schema, const char *where,
                                      struct node **out) {
    *out = NULL;
    if (!schema) {
        *out = &any_object;
        return TOY_OK;
    }
    json_error_t je;
    json_t *root = json_loads(schema, 0, &je);
    if (!root)
        return toy_error(TOY_ERR_INVALID_ARG, "%sschema: malformed JSON at line %d, column %d: %s", where, je.line,
                         je.column, je.text);
    struct compiler *cc = calloc(1, sizeof *cc);
    if (!cc) {
        json_decref(root);
        return toy_error(TOY_ERR_NOMEM, "json grammar");
    }
    cc->g = g;
    cc->root = root;
    *out = compile(cc, root, "#", 0);
    enum toy_status st = *out ? TOY_OK : cc->st ? cc->st : toy_error(TOY_ERR_INVALID_ARG, "schema");
    if (st && where[0]) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", toy_last_error());
        toy_error(st, "%s%s", where, msg);
    }
    for (int i = 0; i < cc->n_refs; i++) free(cc->refs[i].ref);
    free(cc);
    json_decref(root);
    return st;
}

enum toy_status toy_json_grammar_compile_forms(const struct toy_json_form *forms, int n_forms,
                                               struct toy_json_grammar **out) {
    *out = NULL;
    if (n_forms < 1 || n_forms > MAX_PATHS)
        return toy_error(TOY_ERR_INVALID_ARG, "json grammar: %d forms (1 to %d)", n_forms, MAX_PATHS);
    struct toy_json_grammar *g = calloc(1, sizeof *g);
    if (!g || !(g->forms = calloc((size_t)n_forms, sizeof *g->forms))) {
        free(g);
        return toy_error(TOY_ERR_NOMEM, "json grammar");
    }
    enum toy_status st = TOY_OK;
    for (int i = 0; i < n_forms && !st; i++) {
        struct form *f = &g->forms[g->n_forms++];
        f->prefix = strdup(forms[i].prefix ? forms[i].prefix : "");
        f->suffix = strdup(forms[i].suffix ? forms[i].suffix : "");
        if (!f->prefix || !f->suffix) st = toy_error(TOY_ERR_NOMEM, "json grammar");
        char where[32] = "";
        if (n_forms > 1) snprintf(where, sizeof where, "form %d: ", i);
        if (!st) st = compile_schema(g, forms[i].schema, where, &f->root);
    }
    if (st) {
        toy_json_grammar_free(g);
        return st;
    }
    *out = g;
    return TOY_OK;
}

enum toy_status toy_json_grammar_compile(const char *schema, struct toy_json_grammar **out) {
    return toy_json_grammar_compile_framed(schema, NULL, NULL, out);
}

enum toy_status toy_json_grammar_compile_framed(const char *schema, const char *prefix, const char *suffix,
                                                struct toy_json_grammar **out) {
    struct toy_json_form f = {schema, prefix, suffix};
    return toy_json_grammar_compile_forms(&f, 1, out);
}

enum toy_status toy_json_grammar_allow_block(struct toy_json_grammar *g, const char *open, const char *close) {
    if (!open || !close || !open[0] || !close[0])
        return toy_error(TOY_ERR_INVALID_ARG, "json grammar: a free block needs an opening and a closing text");
    char *o = strdup(open), *c = strdup(close);
    if (!o || !c) {
        free(o);
        free(c);
        return toy_error(TOY_ERR_NOMEM, "json grammar");
    }
    free(g->open);
    free(g->close);
    g->open = o, g->close = c;
    return TOY_OK;
}
