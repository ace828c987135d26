/* jinja.c: the evaluator of the Jinja2-subset chat-template language
 * (parsed by jinja-parse.c): a tree walk over jansson values.
 *
 * Semantics follow Jinja2 (jinja.palletsprojects.com/templates) as Hugging
 * Face's apply_chat_template configures it: for-loops open a scope
 * (assignments inside do not leak out; namespace() objects carry state
 * out); macros see the globals and their parameters; output of
 * none/bools/lists uses Python's str() (None, True, ['a', 'b']); tojson is
 * Hugging Face's: json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False). Undefined
 * values print as "" and are falsy; an attribute or item of undefined is an
 * error, as in Jinja2. Errors carry the template line.
 */
#include "jinja.h"
#include "tokenizer-impl.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ---- evaluation ---- */

struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
};

/* Limits of one render. Templates are untrusted (GGUF metadata, `toy
 * serve` clients) and Jinja is Turing-complete enough to loop for ever
 * (nested range loops) or double a string each iteration, so a render gets
 * a budget: MAX_STEPS evaluated nodes and loop iterations (a few seconds;
 * real chat templates take ~100 per message, tools included), MAX_WORK
 * bytes of text and list elements built (8 bytes each, 64 for a range()
 * element, a string iterated by character 64 each) and MAX_RENDER_NEST nested evaluations (stack).
 * Scans that build nothing (x in list, list == list, sort's comparisons)
 * count 64 elements to a step. Behind the counts, a render that uses more
 * than MAX_CPU_SECONDS of its thread's CPU time stops: an operation whose
 * cost the counts miss (a substring search in a long string, repeated) is
 * bounded so too. */
#define MAX_STEPS 1000000ull
#ifndef TOY_JINJA_MAX_CPU_SECONDS
#define TOY_JINJA_MAX_CPU_SECONDS 10 /* the fuzz build stops at 2, inside libFuzzer's -timeout */
#endif
#define MAX_CPU_SECONDS TOY_JINJA_MAX_CPU_SECONDS
#define ITER_STEPS 8 /* a loop iteration (its scope and loop object) weighs as much as 8 nodes */
#ifndef TOY_JINJA_MAX_WORK_MB
#define TOY_JINJA_MAX_WORK_MB 128 /* the fuzz build: 8, so that a byte-at-a-time pass over all of it, 30-50x
                                   * slower under ASan, UBSan and coverage, stays inside libFuzzer's -timeout */
#endif
#define MAX_WORK ((size_t)TOY_JINJA_MAX_WORK_MB << 20)
#define MAX_RENDER_NEST 1000

struct budget {
    unsigned long long steps, scanned; /* scanned: elements compared, not yet counted as steps */
    size_t work;
    unsigned entered; /* nodes entered: the CPU time is read every 256th */
    bool over;        /* MAX_WORK reached: the render fails */
    double cpu0;      /* the thread's CPU time when the render began */
};
static _Thread_local struct budget *budget; /* the render in progress on this thread, or NULL */

/* Charges `units` of work to the render in progress; false once it is over budget. */
static bool take(size_t units) {
    if (!budget) return true;
    if (budget->over || units > MAX_WORK - budget->work) { budget->over = true; return false; }
    budget->work += units;
    return true;
}

static void over_budget(void) {
    if (budget) budget->over = true;
}

/* Counts `units` elements scanned toward the render's steps (64 to a step);
 * the next evaluated node fails once they are over MAX_STEPS. */
static void scanned(unsigned long long units) {
    if (!budget) return;
    budget->scanned += units;
    budget->steps += budget->scanned / 64;
    budget->scanned %= 64;
}

static double thread_cpu_seconds(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts)) return 0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sb_add(struct sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (!take(n)) { b->oom = true; return; }
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->p, c);
        if (!p) { b->oom = true; return; }
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(struct sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Jinja2's Undefined inside a container or a variable ([missing], an item
 * of map(attribute=) that lacks it, {% set x = missing %}). A bare undefined
 * value is NULL, which a json array cannot hold, so containers and scopes
 * hold this marker instead: an object whose one key is not UTF-8, which no
 * JSON input nor template can build (jansson checks the keys it is given).
 * Every read out of a container or scope turns it back into NULL (see
 * unmark), so evaluation only ever sees it where a filter returns an
 * element as it is (first, max); printing, tests and filters treat it as
 * undefined there too. */
#define UNDEF_KEY "\xff" "undefined"

/* Other private keys, unforgeable for the same reason: the state of
 * loop.changed(), cycler() and joiner() objects */
#define LOOP_CHANGED_KEY "\xff" "changed"
/* the loop object of a recursive loop: its node and the scopes it sees */
#define LOOP_NODE_KEY "\xff" "loop-node"
#define LOOP_BASE_KEY "\xff" "loop-base"
#define CYCLER_ITEMS_KEY "\xff" "cycler"
#define CYCLER_POS_KEY "\xff" "cycler-pos"
#define JOINER_KEY "\xff" "joiner"
#define JOINER_USED_KEY "\xff" "joiner-used"
/* d.items without the call: the bound method (see E_ATTR); and the mark of
 * a namespace(), the one object whose attributes {% set ns.x %} may set */
#define METHOD_KEY "\xff" "method"
#define NAMESPACE_KEY "\xff" "namespace"

static json_t *undef_marker(void) {
    json_t *o = json_object();
    if (o) json_object_set_new_nocheck(o, UNDEF_KEY, json_true());
    return o;
}

static bool is_undef(json_t *v) {
    return v && json_is_object(v) && json_object_size(v) == 1 && json_object_get(v, UNDEF_KEY);
}

static bool is_method(json_t *v) { return v && json_is_object(v) && json_is_string(json_object_get(v, METHOD_KEY)); }
static bool is_namespace(json_t *v) { return v && json_is_object(v) && json_object_get(v, NAMESPACE_KEY); }

/* a value read out of a container or scope (borrowed): the marker as NULL */
static json_t *unmark(json_t *v) { return is_undef(v) ? NULL : v; }

/* a value to store in a container or scope (stolen): undefined as the marker */
static json_t *mark(json_t *v) { return v ? v : undef_marker(); }

/* Whether v is c or holds it, at any depth. A namespace attribute or a list.append() that would put a
 * container inside itself is refused: jansson counts references, so the cycle would never be freed, and
 * every render of such a template (from a GGUF, or a toy serve client) would leak it. Python allows it;
 * no chat template needs it. */
static bool reaches(json_t *v, json_t *c, int depth) {
    if (v == c) return true;
    if (depth > 2000 || !v || !(json_is_array(v) || json_is_object(v))) return false;
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++)
            if (reaches(json_array_get(v, i), c, depth + 1)) return true;
        return false;
    }
    const char *k;
    json_t *e;
    json_object_foreach(v, k, e) if (reaches(e, c, depth + 1)) return true;
    return false;
}

/* Dict keys. JSON's are strings; a template's dict may have int keys too
 * ({1: 'x'}), which Python keeps apart from '1'. An int key is stored as
 * INT_KEY and its digits, a key no input can build (as above); a bool or
 * an integral float is the same key as its int, as Python hashes them
 * alike. Other keys (none, other floats) are their str(). */
#define INT_KEY "\xff" "#"

static bool is_int_key(const char *k) { return !strncmp(k, INT_KEY, 2); }

/* the key the template sees for the stored key `k`, as a new value */
static json_t *key_value(const char *k) { return is_int_key(k) ? json_integer(strtoll(k + 2, NULL, 10)) : json_string(k); }

/* Python tuples: (1, 2), the pairs of d.items() and dictsort, varargs. A
 * tuple is a json array like a list (it indexes, iterates and serializes the
 * same way); what differs is how it prints, (1, 2) and (1,), and that it
 * never equals a list. Dict views, what d.keys(), d.values() and d.items()
 * return, are arrays that print as dict_keys([...]), dict_values([...]),
 * dict_items([...]). The arrays that are tuples or views are kept, with
 * their kind, in a set of pointers per render, each holding a reference, so
 * that no list can take the address of one while the set names it; entries
 * that nothing else holds any more are dropped as the set grows. The set
 * belongs to the rendering thread (renders run concurrently), which lets
 * repr() and equal() ask it without a context. Copies (|list, slices, +)
 * are lists, as list(t) is. */
enum seq_kind { SEQ_LIST, SEQ_TUPLE, SEQ_DICT_KEYS, SEQ_DICT_VALUES, SEQ_DICT_ITEMS };

struct tuple_set {
    json_t **slot;
    unsigned char *kind; /* enum seq_kind of slot[i] */
    size_t cap, n;
};
static _Thread_local struct tuple_set *tuples;

static size_t tuple_hash(const json_t *p, size_t cap) {
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

static enum seq_kind seq_kind(const json_t *v) {
    const struct tuple_set *T = tuples;
    if (!v || !T || !T->cap || !json_is_array(v)) return SEQ_LIST;
    for (size_t i = tuple_hash(v, T->cap); T->slot[i]; i = (i + 1) & (T->cap - 1))
        if (T->slot[i] == v) return (enum seq_kind)T->kind[i];
    return SEQ_LIST;
}

static bool is_tuple(const json_t *v) { return seq_kind(v) == SEQ_TUPLE; }

/* Marks the array `a` (returned as it is) as a tuple or view; one already
 * marked keeps its kind, and without memory it stays a list. */
static json_t *mark_seq(json_t *a, enum seq_kind kind) {
    struct tuple_set *T = tuples;
    if (!a || !T || !json_is_array(a) || seq_kind(a) != SEQ_LIST) return a;
    if ((T->n + 1) * 2 > T->cap) {
        /* drop the entries only the set holds, then size it for four times
         * the live ones, so that sweeps stay rare */
        size_t live = 0;
        for (size_t i = 0; i < T->cap; i++) {
            if (!T->slot[i]) continue;
            if (T->slot[i]->refcount == 1) { json_decref(T->slot[i]); T->slot[i] = NULL; }
            else live++;
        }
        size_t cap = 64;
        while (cap < (live + 1) * 4) cap *= 2;
        json_t **slot = calloc(cap, sizeof *slot);
        unsigned char *kinds = malloc(cap);
        if (!slot || !kinds) { free(slot); free(kinds); return a; }
        for (size_t i = 0; i < T->cap; i++) {
            if (!T->slot[i]) continue;
            size_t j = tuple_hash(T->slot[i], cap);
            while (slot[j]) j = (j + 1) & (cap - 1);
            slot[j] = T->slot[i];
            kinds[j] = T->kind[i];
        }
        free(T->slot);
        free(T->kind);
        T->slot = slot;
        T->kind = kinds;
        T->cap = cap;
        T->n = live;
    }
    size_t j = tuple_hash(a, T->cap);
    while (T->slot[j]) j = (j + 1) & (T->cap - 1);
    T->slot[j] = json_incref(a);
    T->kind[j] = (unsigned char)kind;
    T->n++;
    return a;
}

static json_t *as_tuple(json_t *a) { return mark_seq(a, SEQ_TUPLE); }

static void tuples_free(struct tuple_set *T) {
    for (size_t i = 0; i < T->cap; i++) json_decref(T->slot[i]);
    free(T->slot);
    free(T->kind);
}

/* (k, v) */
static json_t *pair(json_t *k /* stolen */, json_t *v /* borrowed */) {
    json_t *p = json_array();
    json_array_append_new(p, k);
    json_array_append(p, v);
    return as_tuple(p);
}

/* A {% call %} in progress: caller() renders `body` in the scopes of the
 * call site (so the loop variables and sets around the call are visible),
 * with `outer` as the caller() of the code around it. */
struct call_site {
    const struct node *body;
    json_t **scopes;
    int nscopes;
    const struct call_site *outer;
};

struct ctx {
    const struct jinja_template *tpl;
    json_t **scopes; /* stack of objects, innermost last */
    int nscopes, capscopes;
    enum toy_status st;
    char err[512];
    int brk; /* 1 break, 2 continue */
    int depth;
    int nest; /* eval/exec calls in progress (MAX_RENDER_NEST) */
    const struct call_site *caller; /* the enclosing {% call %}, for caller() */
};

static void rerr(struct ctx *C, const struct node *x, const char *fmt, ...) {
    if (C->st) return;
    va_list ap;
    va_start(ap, fmt);
    char m[400];
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(C->err, sizeof C->err, "line %d: %s", x ? x->line : 0, m);
    C->st = TOY_ERR_FORMAT;
}

static json_t *eval(struct ctx *C, const struct node *x);
static void exec_body(struct ctx *C, struct node *const *body, int n, struct sbuf *out);

static bool push_scope(struct ctx *C) {
    if (C->nscopes == C->capscopes) {
        int c = C->capscopes ? C->capscopes * 2 : 8;
        json_t **p = realloc(C->scopes, (size_t)c * sizeof *p);
        if (!p) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); return false; }
        C->scopes = p;
        C->capscopes = c;
    }
    json_t *o = json_object();
    if (!o) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); return false; }
    C->scopes[C->nscopes++] = o;
    return true;
}

static void pop_scope(struct ctx *C) { json_decref(C->scopes[--C->nscopes]); }

static json_t *lookup(struct ctx *C, const char *name) {
    for (int i = C->nscopes - 1; i >= 0; i--) {
        json_t *v = json_object_get(C->scopes[i], name);
        if (v) return unmark(v);
    }
    return NULL;
}

static void assign(struct ctx *C, const char *name, json_t *v /* stolen */) {
    json_object_set_new(C->scopes[C->nscopes - 1], name, mark(v));
}

static bool truthy(json_t *v) {
    if (!v || is_undef(v)) return false;
    switch (json_typeof(v)) {
    case JSON_NULL: case JSON_FALSE: return false;
    case JSON_TRUE: return true;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_STRING: return json_string_length(v) != 0;
    case JSON_ARRAY: return json_array_size(v) != 0;
    case JSON_OBJECT: return json_object_size(v) != 0;
    }
    return false;
}

/* Python's repr(float), which str() and json.dumps also use: the fewest
 * significant digits that read back as the same double, written positionally
 * when the decimal exponent is in [-4, 16) (10.0, 1500.0, 0.0001) and as
 * d.ddde+XX otherwise (1e+16, 1.5e-07). C's %g differs: it switches to the
 * exponent form from 6 significant digits on and drops the ".0". */
static void fmt_float(double d, char *buf, size_t cap) {
    if (isnan(d)) { snprintf(buf, cap, "nan"); return; }
    if (isinf(d)) { snprintf(buf, cap, d < 0 ? "-inf" : "inf"); return; }
    char e[48];
    for (int p = 0; p <= 16; p++) {
        snprintf(e, sizeof e, "%.*e", p, d);
        if (strtod(e, NULL) == d) break;
    }
    /* e is [-]D[.DDD]e(+|-)XX: gather the digits and the exponent */
    char dig[24];
    int nd = 0;
    const char *q = e + (e[0] == '-');
    for (; *q && *q != 'e' && nd < (int)sizeof dig - 1; q++)
        if (isdigit((unsigned char)*q)) dig[nd++] = *q;
    int exp = *q == 'e' ? atoi(q + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    struct sbuf b = {0};
    if (signbit(d)) sb_str(&b, "-");
    if (exp < -4 || exp >= 16) {
        sb_add(&b, dig, 1);
        if (nd > 1) { sb_str(&b, "."); sb_add(&b, dig + 1, (size_t)nd - 1); }
        char x[16];
        snprintf(x, sizeof x, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
        sb_str(&b, x);
    } else if (exp < 0) {
        sb_str(&b, "0.");
        for (int i = 0; i < -exp - 1; i++) sb_str(&b, "0");
        sb_add(&b, dig, (size_t)nd);
    } else {
        for (int i = 0; i <= exp; i++) sb_add(&b, i < nd ? dig + i : "0", 1);
        sb_str(&b, ".");
        if (nd > exp + 1) sb_add(&b, dig + exp + 1, (size_t)(nd - exp - 1));
        else sb_str(&b, "0");
    }
    snprintf(buf, cap, "%s", b.p ? b.p : "0.0");
    free(b.p);
}

static void repr(json_t *v, struct sbuf *b, bool top);

static void py_str(json_t *v, struct sbuf *b) {
    if (!v || is_undef(v)) return; /* undefined prints nothing */
    switch (json_typeof(v)) {
    case JSON_STRING: sb_add(b, json_string_value(v), json_string_length(v)); return;
    default: repr(v, b, true);
    }
}

static unsigned cp_at(const char *s, size_t n, size_t *len);

/* Python's str.isprintable() of one code point, which repr() asks of each:
 * false for the categories Cc, Cf, Cs, Co, Cn and Zl, Zp, Zs, except the
 * ASCII space. utf8proc's tables may name a newer Unicode than the Python
 * compared against; a code point assigned in between reads as printable
 * here and as \U... there. */
static bool py_printable(unsigned c) {
    if (c == ' ') return true;
    if (c > 0x10FFFF) return false;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

/* Python repr(): strings quoted inside containers, with \n \r \t, the
 * backslash and the quote escaped and what is not printable as \xNN,
 * \uNNNN or \UNNNNNNNN. */
static void repr(json_t *v, struct sbuf *b, bool top) {
    char num[64];
    size_t i;
    json_t *e;
    const char *k;
    if (is_undef(v)) { sb_str(b, "Undefined"); return; } /* repr(Undefined), as in [missing] */
    if (is_method(v)) { /* Python adds the dict's address, which toy has not */
        sb_str(b, "<built-in method ");
        sb_str(b, json_string_value(json_object_get(v, METHOD_KEY)));
        sb_str(b, " of dict object>");
        return;
    }
    bool ns = is_namespace(v);
    if (ns) sb_str(b, "<Namespace ");
    switch (json_typeof(v)) {
    case JSON_NULL: sb_str(b, "None"); break;
    case JSON_TRUE: sb_str(b, "True"); break;
    case JSON_FALSE: sb_str(b, "False"); break;
    case JSON_INTEGER: snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)); sb_str(b, num); break;
    case JSON_REAL: fmt_float(json_real_value(v), num, sizeof num); sb_str(b, num); break;
    case JSON_STRING: {
        if (top) { sb_add(b, json_string_value(v), json_string_length(v)); break; }
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
        sb_add(b, &q, 1);
        for (size_t j = 0, l; j < n; j += l) {
            unsigned c = cp_at(s + j, n - j, &l);
            if (c == (unsigned char)q || c == '\\') { sb_add(b, "\\", 1); sb_add(b, s + j, 1); }
            else if (c == '\n') sb_str(b, "\\n");
            else if (c == '\t') sb_str(b, "\\t");
            else if (c == '\r') sb_str(b, "\\r");
            else if (c >= 0x80 && l == 1) sb_add(b, s + j, 1); /* not UTF-8: the byte as it is */
            else if (!py_printable(c)) {
                snprintf(num, sizeof num, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x", c);
                sb_str(b, num);
            }
            else sb_add(b, s + j, l);
        }
        sb_add(b, &q, 1);
        break;
    }
    case JSON_ARRAY: {
        enum seq_kind sk = seq_kind(v);
        bool tu = sk == SEQ_TUPLE;
        if (sk >= SEQ_DICT_KEYS) sb_str(b, sk == SEQ_DICT_KEYS ? "dict_keys(" : sk == SEQ_DICT_VALUES ? "dict_values(" : "dict_items(");
        sb_str(b, tu ? "(" : "[");
        json_array_foreach(v, i, e) { if (i) sb_str(b, ", "); repr(e, b, false); }
        sb_str(b, !tu ? "]" : json_array_size(v) == 1 ? ",)" : ")");
        if (sk >= SEQ_DICT_KEYS) sb_str(b, ")");
        break;
    }
    case JSON_OBJECT:
        sb_str(b, "{");
        i = 0;
        json_object_foreach(v, k, e) {
            if (ns && !strcmp(k, NAMESPACE_KEY)) continue;
            if (i++) sb_str(b, ", ");
            json_t *ks = key_value(k);
            if (ks) repr(ks, b, false);
            json_decref(ks);
            sb_str(b, ": ");
            repr(e, b, false);
        }
        sb_str(b, ns ? "}>" : "}");
        break;
    }
}

/* How json.dumps writes: Hugging Face's tojson is json.dumps(x,
 * ensure_ascii=False, indent=None, separators=None, sort_keys=False), in
 * that order of parameters. */
struct json_opts {
    const char *indent;           /* NULL: one line; else newlines, this per level */
    const char *item_sep, *key_sep; /* ", " / ": " (",", ": " with an indent) */
    bool sort_keys, ascii;
};


static int cmp_key(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

static void json_newline(struct sbuf *b, const struct json_opts *o, int level) {
    sb_str(b, "\n");
    for (int i = 0; i < level; i++) sb_str(b, o->indent);
}

/* json.dumps(v) as `o` says. What json.dumps cannot serialize (undefined, a
 * method, a namespace) sets *undef. */
static void to_json(json_t *v, struct sbuf *b, const struct json_opts *o, int level, bool *undef) {
    char num[64];
    if (!v || is_undef(v) || is_method(v) || is_namespace(v)) { *undef = true; return; }
    switch (json_typeof(v)) {
    case JSON_NULL: sb_str(b, "null"); break;
    case JSON_TRUE: sb_str(b, "true"); break;
    case JSON_FALSE: sb_str(b, "false"); break;
    case JSON_INTEGER: snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v)); sb_str(b, num); break;
    case JSON_REAL: {
        /* json.dumps uses repr() for finite floats and JavaScript's names otherwise */
        double d = json_real_value(v);
        if (isnan(d)) sb_str(b, "NaN");
        else if (isinf(d)) sb_str(b, d < 0 ? "-Infinity" : "Infinity");
        else { fmt_float(d, num, sizeof num); sb_str(b, num); }
        break;
    }
    case JSON_STRING: {
        const unsigned char *s = (const unsigned char *)json_string_value(v);
        size_t n = json_string_length(v);
        sb_str(b, "\"");
        for (size_t j = 0; j < n; j++) {
            unsigned char c = s[j];
            if (c == '"') sb_str(b, "\\\"");
            else if (c == '\\') sb_str(b, "\\\\");
            else if (c == '\n') sb_str(b, "\\n");
            else if (c == '\r') sb_str(b, "\\r");
            else if (c == '\t') sb_str(b, "\\t");
            else if (c == '\b') sb_str(b, "\\b");
            else if (c == '\f') sb_str(b, "\\f");
            else if (c < 0x20 || (o->ascii && c == 0x7f)) { snprintf(num, sizeof num, "\\u%04x", c); sb_str(b, num); }
            else if (o->ascii && c >= 0x80) {
                /* ensure_ascii: \uXXXX, as a surrogate pair above U+FFFF */
                size_t l;
                unsigned cp = cp_at((const char *)s + j, n - j, &l);
                if (cp >= 0x10000) {
                    cp -= 0x10000;
                    snprintf(num, sizeof num, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
                } else {
                    snprintf(num, sizeof num, "\\u%04x", cp);
                }
                sb_str(b, num);
                j += l - 1;
            }
            else sb_add(b, (const char *)s + j, 1);
        }
        sb_str(b, "\"");
        break;
    }
    case JSON_ARRAY: {
        size_t cnt = json_array_size(v);
        if (!cnt) { sb_str(b, "[]"); break; }
        sb_str(b, "[");
        for (size_t j = 0; j < cnt; j++) {
            if (j) sb_str(b, o->item_sep);
            if (o->indent) json_newline(b, o, level + 1);
            to_json(json_array_get(v, j), b, o, level + 1, undef);
        }
        if (o->indent) json_newline(b, o, level);
        sb_str(b, "]");
        break;
    }
    case JSON_OBJECT: {
        size_t cnt = json_object_size(v), j = 0;
        if (!cnt) { sb_str(b, "{}"); break; }
        const char **keys = malloc(cnt * sizeof *keys);
        if (!keys) { b->oom = true; break; }
        const char *k;
        json_t *e;
        json_object_foreach(v, k, e) keys[j++] = k;
        if (o->sort_keys) qsort(keys, cnt, sizeof *keys, cmp_key);
        sb_str(b, "{");
        for (j = 0; j < cnt; j++) {
            if (j) sb_str(b, o->item_sep);
            if (o->indent) json_newline(b, o, level + 1);
            json_t *ks = json_string(is_int_key(keys[j]) ? keys[j] + 2 : keys[j]); /* json.dumps writes {1: x} as {"1": x} */
            to_json(ks, b, o, level + 1, undef);
            json_decref(ks);
            sb_str(b, o->key_sep);
            to_json(json_object_get(v, keys[j]), b, o, level + 1, undef);
        }
        free(keys);
        if (o->indent) json_newline(b, o, level);
        sb_str(b, "}");
        break;
    }
    }
}

static json_t *str_of(json_t *v) {
    struct sbuf b = {0};
    py_str(v, &b);
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

static bool is_num(json_t *v) { return v && (json_is_integer(v) || json_is_real(v) || json_is_boolean(v)); }
static double num(json_t *v) {
    if (json_is_integer(v)) return (double)json_integer_value(v);
    if (json_is_real(v)) return json_real_value(v);
    return json_is_true(v) ? 1 : 0;
}
static bool is_intlike(json_t *v) { return v && (json_is_integer(v) || json_is_boolean(v)); }
static long long ival(json_t *v) { return json_is_integer(v) ? (long long)json_integer_value(v) : json_is_true(v) ? 1 : 0; }

/* the stored form of the key `k` (borrowed), as a new string */
static json_t *dict_key(json_t *k) {
    char buf[32];
    k = unmark(k);
    if (k && json_is_string(k)) return json_incref(k);
    if (k && (json_is_integer(k) || json_is_boolean(k) ||
              (json_is_real(k) && fabs(json_real_value(k)) < 9e18 && json_real_value(k) == floor(json_real_value(k))))) {
        long long i = json_is_real(k) ? (long long)json_real_value(k) : ival(k);
        snprintf(buf, sizeof buf, INT_KEY "%lld", i);
        return json_string_nocheck(buf);
    }
    return str_of(k);
}

/* d[k] (a new reference, or NULL) */
static json_t *dict_get(json_t *d, json_t *k) {
    json_t *ks = k ? dict_key(k) : NULL;
    json_t *v = ks ? unmark(json_object_get(d, json_string_value(ks))) : NULL;
    json_decref(ks);
    return v ? json_incref(v) : NULL;
}

/* Python's ==: numbers by value at any depth ([1] == [1.0], True == 1), a
 * tuple never equals a list */
static bool equal(json_t *a, json_t *b) {
    a = unmark(a);
    b = unmark(b);
    if (!a || !b) return !a && !b;
    if (is_num(a) && is_num(b)) return num(a) == num(b);
    if (json_is_array(a) && json_is_array(b)) {
        size_t n = json_array_size(a);
        if (n != json_array_size(b) || is_tuple(a) != is_tuple(b)) return false;
        scanned(n);
        for (size_t i = 0; i < n; i++)
            if (!equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a) && json_is_object(b)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        scanned(json_object_size(a));
        const char *k;
        json_t *e;
        json_object_foreach(a, k, e) {
            json_t *o = json_object_get(b, k);
            if (!o || !equal(e, o)) return false;
        }
        return true;
    }
    return json_equal(a, b);
}

static int compare(struct ctx *C, const struct node *x, json_t *a, json_t *b) {
    if (a && b && is_num(a) && is_num(b)) { double p = num(a), q = num(b); return p < q ? -1 : p > q; }
    if (a && b && json_is_string(a) && json_is_string(b)) {
        int r = strcmp(json_string_value(a), json_string_value(b));
        return r < 0 ? -1 : r > 0;
    }
    rerr(C, x, "cannot compare these values");
    return 0;
}

/* UTF-8 code points of a string, for indexing and slicing. */
static size_t utf8_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}
static size_t utf8_offset(const char *s, size_t n, size_t cp) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) { if (c == cp) return i; c++; }
    }
    return n;
}

/* The first nn-byte needle in hay[0..hn), or NULL: memmem over windows that
 * double from 4 KiB, so that a search costs about the distance to its match
 * everywhere. (The sanitizers' memmem checks the whole haystack on every
 * call: a replace or split loop over a string of 4 Mi matches took minutes
 * in the fuzz build.) */
static const char *find_bytes(const char *hay, size_t hn, const char *nd, size_t nn) {
    if (!nn) return hay;
    size_t from = 0, w = nn > 2048 ? 2 * nn : 4096;
    while (from + nn <= hn) {
        size_t len = hn - from < w ? hn - from : w;
        const char *f = memmem(hay + from, len, nd, nn);
        if (f || from + len == hn) return f;
        from += len - nn + 1; /* the next window starts where a match could still begin */
        w *= 2;
    }
    return NULL;
}

/* p[0..n) back to front, into r */
static void reverse_into(char *r, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) r[i] = p[n - 1 - i];
}

/* The last nn-byte needle in hay[0..hn) (hay + hn for an empty one), or
 * NULL: find_bytes over reversed copies of windows from the end that double
 * from 64 bytes (rnd: the needle reversed), so that a search from the right
 * costs about the distance to its match, as find_bytes's. (A compare at
 * every position, back to front, cost the length times the needle's length
 * for a crafted needle.) *buf, *cap: scratch the caller frees; *oom is set
 * when it cannot grow. */
static const char *rfind_bytes(const char *hay, size_t hn, const char *rnd, size_t nn, char **buf, size_t *cap,
                               bool *oom) {
    if (!nn) return hay + hn;
    size_t end = hn, w = nn > 32 ? 2 * nn : 64;
    while (end >= nn) {
        size_t start = end > w ? end - w : 0, len = end - start;
        if (len > *cap) {
            char *p = realloc(*buf, len);
            if (!p) { *oom = true; return NULL; }
            *buf = p;
            *cap = len;
        }
        reverse_into(*buf, hay + start, len);
        const char *k = find_bytes(*buf, len, rnd, nn);
        if (k) return hay + end - (size_t)(k - *buf) - nn;
        if (!start) return NULL;
        end = start + nn - 1; /* the next window ends where a match not wholly in this one could */
        w *= 2;
    }
    return NULL;
}

static bool contains(json_t *hay, json_t *needle) {
    hay = unmark(hay);
    if (!hay) return false;
    if (json_is_string(hay)) {
        if (!needle || !json_is_string(needle)) return false;
        scanned(json_string_length(hay) / 16); /* memmem reads about 16 bytes in the time of an element */
        return memmem(json_string_value(hay), json_string_length(hay), json_string_value(needle), json_string_length(needle)) != NULL;
    }
    if (json_is_array(hay)) {
        size_t i;
        json_t *e;
        json_array_foreach(hay, i, e) {
            if (equal(e, needle)) { scanned(i + 1); return true; }
        }
        scanned(json_array_size(hay));
        return false;
    }
    if (json_is_object(hay)) {
        json_t *v = needle ? dict_get(hay, needle) : NULL;
        json_decref(v);
        return v != NULL;
    }
    return false;
}

/* items of an iterable as a new array (dict -> keys, string -> characters) */
static json_t *to_list(json_t *v) {
    if (!v) return json_array();
    if (!take(8 * (json_is_string(v) ? 8 * json_string_length(v) : json_is_array(v) ? json_array_size(v) : json_object_size(v))))
        return json_array();
    if (json_is_array(v)) return json_copy(v);
    json_t *r = json_array();
    if (json_is_object(v)) {
        const char *k;
        json_t *e;
        json_object_foreach(v, k, e) json_array_append_new(r, key_value(k));
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        for (size_t i = 0; i < n;) {
            size_t l = 1;
            while (i + l < n && ((unsigned char)s[i + l] & 0xC0) == 0x80) l++;
            json_array_append_new(r, json_stringn_nocheck(s + i, l));
            i += l;
        }
    }
    return r;
}

static json_t *py_index(json_t *a, json_t *k) {
    if (!a || !k) return NULL;
    if (json_is_object(a)) return dict_get(a, k);
    if (json_is_array(a) && is_intlike(k)) {
        long long i = ival(k), n = (long long)json_array_size(a);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return NULL;
        json_t *v = unmark(json_array_get(a, (size_t)i));
        return v ? json_incref(v) : NULL;
    }
    if (json_is_string(a) && is_intlike(k)) {
        const char *s = json_string_value(a);
        size_t n = json_string_length(a);
        long long i = ival(k), cnt = (long long)utf8_count(s, n);
        if (i < 0) i += cnt;
        if (i < 0 || i >= cnt) return NULL;
        size_t o = utf8_offset(s, n, (size_t)i), e = utf8_offset(s, n, (size_t)i + 1);
        return json_stringn_nocheck(s + o, e - o);
    }
    return NULL;
}

static json_t *arg(struct ctx *C, const struct node *call, int i, const char *kw) {
    json_t *v = NULL;
    if (i >= 0 && i < call->n) v = eval(C, call->list[i]);
    for (int k = 0; !v && kw && k < call->nkw; k++)
        if (!strcmp(call->kwn[k], kw)) v = eval(C, call->kwv[k]);
    if (is_undef(v)) { json_decref(v); v = NULL; }
    return v;
}

static const char *strv(json_t *v) { return v && json_is_string(v) ? json_string_value(v) : NULL; }

/* The code point starting at s[0] (n > 0 bytes left) and its length in
 * bytes; malformed UTF-8 reads as one byte. */
static unsigned cp_at(const char *s, size_t n, size_t *len) {
    uint32_t c;
    int l = toy_tok_utf8_decode(s, n, &c);
    *len = l > 0 ? (size_t)l : 1;
    return l > 0 ? c : (unsigned char)s[0];
}

/* Python's str.isspace(), which strip(), split() and Jinja's trim use: the
 * ASCII controls \t..\r and \x1c..\x1f, space, and Unicode's spaces and
 * line/paragraph separators (NEL, NBSP, U+2000-200A, ideographic space...). */
static bool py_space(unsigned c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length of the whitespace code point at s (0 if none), and of the one ending at s[n-1]. */
static size_t space_at(const char *s, size_t n) {
    size_t l;
    return n && py_space(cp_at(s, n, &l)) ? l : 0;
}
static size_t space_before(const char *s, size_t n) {
    size_t b = n;
    while (b > 0 && n - b < 4 && ((unsigned char)s[b - 1] & 0xC0) == 0x80) b--;
    if (b == 0) return 0;
    b--;
    size_t l;
    return py_space(cp_at(s + b, n - b, &l)) && l == n - b ? l : 0;
}

/* Python's int(s, base) for base 0 or 2..36: white space around, a sign,
 * the base's prefix (0x, 0o, 0b; base 0 reads it, and then a plain number
 * has no leading zero), single underscores between digits. False where
 * Python raises ValueError; *ovf where the value needs more than 64 bits. */
static bool py_parse_int(const char *s, size_t n, int base, long long *out, bool *ovf) {
    size_t i = 0, l;
    *ovf = false;
    while (i < n && (l = space_at(s + i, n - i))) i += l;
    while (n > i && (l = space_before(s + i, n - i))) n -= l;
    bool neg = i < n && s[i] == '-';
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    char p = i + 1 < n && s[i] == '0' ? (char)tolower((unsigned char)s[i + 1]) : 0;
    int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    bool prefixed = pb && (base == 0 || base == pb);
    if (prefixed) { base = pb; i += 2; if (i < n && s[i] == '_') i++; }
    bool plain0 = base == 0;
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || i >= n) return false;
    unsigned long long v = 0;
    bool nonzero = false;
    for (size_t j = i; j < n; j++) {
        int c = (unsigned char)s[j], d;
        if (c == '_') {
            if (j == i || s[j - 1] == '_' || j + 1 >= n) return false;
            continue;
        }
        if (isdigit(c)) d = c - '0';
        else if (isalpha(c)) d = tolower(c) - 'a' + 10;
        else return false;
        if (d >= base) return false;
        nonzero |= d != 0;
        if (v > (ULLONG_MAX - (unsigned)d) / (unsigned)base) *ovf = true;
        else v = v * (unsigned)base + (unsigned)d;
    }
    if (plain0 && nonzero && s[i] == '0') return false; /* int('010', 0) */
    if (v > (neg ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX)) *ovf = true;
    *out = neg ? (long long)(0 - v) : (long long)v;
    return true;
}

/* Python's float(s): white space around, underscores between digits,
 * inf/nan; false where Python raises ValueError */
static bool py_parse_float(const char *s, size_t n, double *out) {
    size_t i = 0, l;
    while (i < n && (l = space_at(s + i, n - i))) i += l;
    while (n > i && (l = space_before(s + i, n - i))) n -= l;
    if (i >= n || n - i > 400) return false;
    char buf[402];
    size_t k = 0;
    for (size_t j = i; j < n; j++) {
        if (s[j] == '_') {
            if (j == i || j + 1 >= n || !isdigit((unsigned char)s[j - 1]) || !isdigit((unsigned char)s[j + 1])) return false;
            continue;
        }
        if (!isalnum((unsigned char)s[j]) && !strchr("+-.", s[j])) return false;
        buf[k++] = s[j];
    }
    buf[k] = 0;
    /* strtod also reads hex floats and "infinity"/"nan(...)", which float() does not, bar "infinity" */
    const char *q = buf + (buf[0] == '+' || buf[0] == '-');
    if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) return false;
    char *end;
    *out = strtod(buf, &end);
    return end == buf + k && k > 0;
}

/* Does the code point s[0..l) occur in `set` (whole code points, so 'é'
 * never strips half of 'è')? */
static bool in_set(const char *set, size_t setn, const char *s, size_t l) {
    for (size_t i = 0, k; i < setn; i += k) {
        cp_at(set + i, setn - i, &k);
        if (k == l && !memcmp(set + i, s, l)) return true;
    }
    return false;
}

static json_t *strip_chars(json_t *s, json_t *chars, bool left, bool right) {
    const char *p = json_string_value(s);
    size_t n = json_string_length(s), a = 0, e = n, l;
    const char *set = chars && json_is_string(chars) ? json_string_value(chars) : NULL;
    size_t setn = set ? json_string_length(chars) : 0;
    if (left) {
        while (a < e) {
            if (set) { cp_at(p + a, e - a, &l); if (!in_set(set, setn, p + a, l)) break; }
            else if (!(l = space_at(p + a, e - a))) break;
            a += l;
        }
    }
    if (right) {
        while (e > a) {
            if (set) {
                size_t b = e - 1;
                while (b > a && e - b < 4 && ((unsigned char)p[b] & 0xC0) == 0x80) b--;
                cp_at(p + b, e - b, &l);
                if (l != e - b) { b = e - 1; l = 1; }
                if (!in_set(set, setn, p + b, l)) break;
            } else if (!(l = space_before(p + a, e - a))) break;
            e -= l;
        }
    }
    return json_stringn_nocheck(p + a, e - a);
}

static json_t *str_replace(json_t *s, json_t *from, json_t *to, long long count) {
    if (!s || !json_is_string(s) || !strv(from) || !strv(to)) return s ? json_incref(s) : NULL;
    const char *p = json_string_value(s), *f = json_string_value(from), *t = json_string_value(to);
    size_t n = json_string_length(s), fl = json_string_length(from), tl = json_string_length(to);
    struct sbuf b = {0};
    size_t i = 0;
    long long done = 0;
    if (fl == 0) { /* Python puts `to` before each character and at the end */
        for (size_t l; i <= n && !b.oom; i += l) {
            l = 1;
            if (count < 0 || done < count) { sb_add(&b, t, tl); done++; }
            if (i == n) break;
            cp_at(p + i, n - i, &l);
            sb_add(&b, p + i, l);
        }
    } else {
        while (i < n && !b.oom) {
            const char *m = (count < 0 || done < count) ? find_bytes(p + i, n - i, f, fl) : NULL;
            if (!m) { sb_add(&b, p + i, n - i); break; }
            sb_add(&b, p + i, (size_t)(m - (p + i)));
            sb_add(&b, t, tl);
            i = (size_t)(m - p) + fl;
            done++;
        }
    }
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

/* Case mapping of UTF-8 text by code point, as Python's str methods do it:
 * utf8proc's simple mappings ('é' -> 'É'), the full ones of the table below
 * where they differ, and the final sigma. Modes: lower, upper, capitalize
 * (the first character title case, the rest lower), Python's str.title() (a
 * cased letter after an uncased character starts a word, title case:
 * "they're" -> "They'Re"), and Jinja's title filter (a word starts after
 * white space or one of -({[< and its first character is upper case, not
 * title case: item[0].upper() + item[1:].lower(), so "They're"). */
enum { CASE_LOWER, CASE_UPPER, CASE_CAPITALIZE, CASE_TITLE_METHOD, CASE_TITLE_FILTER };

/* The code points whose full case mapping (SpecialCasing.txt's
 * unconditional entries, as Python applies them) is more than one code
 * point: 'ß' -> "SS" / "Ss", 'İ' -> 'i' U+0307, 'ŉ' -> "ʼN", 'ﬁ' -> "FI" / "Fi",
 * the Greek letters with ypogegrammeni. {0} is the simple mapping. Generated
 * from Python 3.11 (Unicode 14): every c whose chr(c).lower(), .upper() or
 * .title() is longer than one. */
struct full_case {
    uint16_t cp, lower[2], upper[3], title[3];
};
static const struct full_case full_cases[] = {
    {0x00DF, {0}, {0x0053, 0x0053}, {0x0053, 0x0073}}, {0x0130, {0x0069, 0x0307}, {0}, {0}},
    {0x0149, {0}, {0x02BC, 0x004E}, {0x02BC, 0x004E}}, {0x01F0, {0}, {0x004A, 0x030C}, {0x004A, 0x030C}},
    {0x0390, {0}, {0x0399, 0x0308, 0x0301}, {0x0399, 0x0308, 0x0301}}, {0x03B0, {0}, {0x03A5, 0x0308, 0x0301}, {0x03A5, 0x0308, 0x0301}},
    {0x0587, {0}, {0x0535, 0x0552}, {0x0535, 0x0582}}, {0x1E96, {0}, {0x0048, 0x0331}, {0x0048, 0x0331}},
    {0x1E97, {0}, {0x0054, 0x0308}, {0x0054, 0x0308}}, {0x1E98, {0}, {0x0057, 0x030A}, {0x0057, 0x030A}},
    {0x1E99, {0}, {0x0059, 0x030A}, {0x0059, 0x030A}}, {0x1E9A, {0}, {0x0041, 0x02BE}, {0x0041, 0x02BE}},
    {0x1F50, {0}, {0x03A5, 0x0313}, {0x03A5, 0x0313}}, {0x1F52, {0}, {0x03A5, 0x0313, 0x0300}, {0x03A5, 0x0313, 0x0300}},
    {0x1F54, {0}, {0x03A5, 0x0313, 0x0301}, {0x03A5, 0x0313, 0x0301}}, {0x1F56, {0}, {0x03A5, 0x0313, 0x0342}, {0x03A5, 0x0313, 0x0342}},
    {0x1F80, {0}, {0x1F08, 0x0399}, {0}}, {0x1F81, {0}, {0x1F09, 0x0399}, {0}},
    {0x1F82, {0}, {0x1F0A, 0x0399}, {0}}, {0x1F83, {0}, {0x1F0B, 0x0399}, {0}},
    {0x1F84, {0}, {0x1F0C, 0x0399}, {0}}, {0x1F85, {0}, {0x1F0D, 0x0399}, {0}},
    {0x1F86, {0}, {0x1F0E, 0x0399}, {0}}, {0x1F87, {0}, {0x1F0F, 0x0399}, {0}},
    {0x1F88, {0}, {0x1F08, 0x0399}, {0}}, {0x1F89, {0}, {0x1F09, 0x0399}, {0}},
    {0x1F8A, {0}, {0x1F0A, 0x0399}, {0}}, {0x1F8B, {0}, {0x1F0B, 0x0399}, {0}},
    {0x1F8C, {0}, {0x1F0C, 0x0399}, {0}}, {0x1F8D, {0}, {0x1F0D, 0x0399}, {0}},
    {0x1F8E, {0}, {0x1F0E, 0x0399}, {0}}, {0x1F8F, {0}, {0x1F0F, 0x0399}, {0}},
    {0x1F90, {0}, {0x1F28, 0x0399}, {0}}, {0x1F91, {0}, {0x1F29, 0x0399}, {0}},
    {0x1F92, {0}, {0x1F2A, 0x0399}, {0}}, {0x1F93, {0}, {0x1F2B, 0x0399}, {0}},
    {0x1F94, {0}, {0x1F2C, 0x0399}, {0}}, {0x1F95, {0}, {0x1F2D, 0x0399}, {0}},
    {0x1F96, {0}, {0x1F2E, 0x0399}, {0}}, {0x1F97, {0}, {0x1F2F, 0x0399}, {0}},
    {0x1F98, {0}, {0x1F28, 0x0399}, {0}}, {0x1F99, {0}, {0x1F29, 0x0399}, {0}},
    {0x1F9A, {0}, {0x1F2A, 0x0399}, {0}}, {0x1F9B, {0}, {0x1F2B, 0x0399}, {0}},
    {0x1F9C, {0}, {0x1F2C, 0x0399}, {0}}, {0x1F9D, {0}, {0x1F2D, 0x0399}, {0}},
    {0x1F9E, {0}, {0x1F2E, 0x0399}, {0}}, {0x1F9F, {0}, {0x1F2F, 0x0399}, {0}},
    {0x1FA0, {0}, {0x1F68, 0x0399}, {0}}, {0x1FA1, {0}, {0x1F69, 0x0399}, {0}},
    {0x1FA2, {0}, {0x1F6A, 0x0399}, {0}}, {0x1FA3, {0}, {0x1F6B, 0x0399}, {0}},
    {0x1FA4, {0}, {0x1F6C, 0x0399}, {0}}, {0x1FA5, {0}, {0x1F6D, 0x0399}, {0}},
    {0x1FA6, {0}, {0x1F6E, 0x0399}, {0}}, {0x1FA7, {0}, {0x1F6F, 0x0399}, {0}},
    {0x1FA8, {0}, {0x1F68, 0x0399}, {0}}, {0x1FA9, {0}, {0x1F69, 0x0399}, {0}},
    {0x1FAA, {0}, {0x1F6A, 0x0399}, {0}}, {0x1FAB, {0}, {0x1F6B, 0x0399}, {0}},
    {0x1FAC, {0}, {0x1F6C, 0x0399}, {0}}, {0x1FAD, {0}, {0x1F6D, 0x0399}, {0}},
    {0x1FAE, {0}, {0x1F6E, 0x0399}, {0}}, {0x1FAF, {0}, {0x1F6F, 0x0399}, {0}},
    {0x1FB2, {0}, {0x1FBA, 0x0399}, {0x1FBA, 0x0345}}, {0x1FB3, {0}, {0x0391, 0x0399}, {0}},
    {0x1FB4, {0}, {0x0386, 0x0399}, {0x0386, 0x0345}}, {0x1FB6, {0}, {0x0391, 0x0342}, {0x0391, 0x0342}},
    {0x1FB7, {0}, {0x0391, 0x0342, 0x0399}, {0x0391, 0x0342, 0x0345}}, {0x1FBC, {0}, {0x0391, 0x0399}, {0}},
    {0x1FC2, {0}, {0x1FCA, 0x0399}, {0x1FCA, 0x0345}}, {0x1FC3, {0}, {0x0397, 0x0399}, {0}},
    {0x1FC4, {0}, {0x0389, 0x0399}, {0x0389, 0x0345}}, {0x1FC6, {0}, {0x0397, 0x0342}, {0x0397, 0x0342}},
    {0x1FC7, {0}, {0x0397, 0x0342, 0x0399}, {0x0397, 0x0342, 0x0345}}, {0x1FCC, {0}, {0x0397, 0x0399}, {0}},
    {0x1FD2, {0}, {0x0399, 0x0308, 0x0300}, {0x0399, 0x0308, 0x0300}}, {0x1FD3, {0}, {0x0399, 0x0308, 0x0301}, {0x0399, 0x0308, 0x0301}},
    {0x1FD6, {0}, {0x0399, 0x0342}, {0x0399, 0x0342}}, {0x1FD7, {0}, {0x0399, 0x0308, 0x0342}, {0x0399, 0x0308, 0x0342}},
    {0x1FE2, {0}, {0x03A5, 0x0308, 0x0300}, {0x03A5, 0x0308, 0x0300}}, {0x1FE3, {0}, {0x03A5, 0x0308, 0x0301}, {0x03A5, 0x0308, 0x0301}},
    {0x1FE4, {0}, {0x03A1, 0x0313}, {0x03A1, 0x0313}}, {0x1FE6, {0}, {0x03A5, 0x0342}, {0x03A5, 0x0342}},
    {0x1FE7, {0}, {0x03A5, 0x0308, 0x0342}, {0x03A5, 0x0308, 0x0342}}, {0x1FF2, {0}, {0x1FFA, 0x0399}, {0x1FFA, 0x0345}},
    {0x1FF3, {0}, {0x03A9, 0x0399}, {0}}, {0x1FF4, {0}, {0x038F, 0x0399}, {0x038F, 0x0345}},
    {0x1FF6, {0}, {0x03A9, 0x0342}, {0x03A9, 0x0342}}, {0x1FF7, {0}, {0x03A9, 0x0342, 0x0399}, {0x03A9, 0x0342, 0x0345}},
    {0x1FFC, {0}, {0x03A9, 0x0399}, {0}}, {0xFB00, {0}, {0x0046, 0x0046}, {0x0046, 0x0066}},
    {0xFB01, {0}, {0x0046, 0x0049}, {0x0046, 0x0069}}, {0xFB02, {0}, {0x0046, 0x004C}, {0x0046, 0x006C}},
    {0xFB03, {0}, {0x0046, 0x0046, 0x0049}, {0x0046, 0x0066, 0x0069}}, {0xFB04, {0}, {0x0046, 0x0046, 0x004C}, {0x0046, 0x0066, 0x006C}},
    {0xFB05, {0}, {0x0053, 0x0054}, {0x0053, 0x0074}}, {0xFB06, {0}, {0x0053, 0x0054}, {0x0053, 0x0074}},
    {0xFB13, {0}, {0x0544, 0x0546}, {0x0544, 0x0576}}, {0xFB14, {0}, {0x0544, 0x0535}, {0x0544, 0x0565}},
    {0xFB15, {0}, {0x0544, 0x053B}, {0x0544, 0x056B}}, {0xFB16, {0}, {0x054E, 0x0546}, {0x054E, 0x0576}},
    {0xFB17, {0}, {0x0544, 0x053D}, {0x0544, 0x056D}},
};

static int cmp_full_case(const void *k, const void *e) {
    unsigned c = *(const unsigned *)k, d = ((const struct full_case *)e)->cp;
    return c < d ? -1 : c > d;
}

static void put_cp(struct sbuf *b, utf8proc_int32_t c) {
    utf8proc_uint8_t enc[4];
    sb_add(b, (const char *)enc, (size_t)utf8proc_encode_char(c, enc));
}

/* Appends the full lower (0), upper (1) or title (2) case of c. */
static void put_case(struct sbuf *b, utf8proc_int32_t c, int which) {
    const unsigned key = (unsigned)c;
    const struct full_case *f = c >= 0xDF && c <= 0xFFFF ? bsearch(&key, full_cases, sizeof full_cases / sizeof *full_cases,
                                                                   sizeof *full_cases, cmp_full_case)
                                                         : NULL;
    const uint16_t *m = !f ? NULL : which == 0 ? f->lower : which == 1 ? f->upper : f->title;
    size_t len = which == 0 ? 2 : 3;
    if (m && m[0]) {
        for (size_t i = 0; i < len && m[i]; i++) put_cp(b, m[i]);
        return;
    }
    put_cp(b, which == 0 ? utf8proc_tolower(c) : which == 1 ? utf8proc_toupper(c) : utf8proc_totitle(c));
}

static bool has_case(utf8proc_int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
           utf8proc_tolower(c) != c || utf8proc_toupper(c) != c;
}

/* Python's "cased" (Lowercase, Uppercase or Lt): the cased categories and
 * what has a mapping, and, for Unicode's Other_Lowercase/Other_Uppercase,
 * a modifier letter or symbol whose compatibility form is one cased letter
 * ('ª' is 'a', 'ʰ' is 'h', '🄰' is 'A'). That rule misses or adds some 70 rare
 * code points (ˀ, ͺ, negative circled letters...) against Python 3.11. */
static bool is_cased(utf8proc_int32_t c) {
    if (has_case(c)) return true;
    utf8proc_category_t k = utf8proc_category(c);
    if (k != UTF8PROC_CATEGORY_LM && k != UTF8PROC_CATEGORY_LO && k != UTF8PROC_CATEGORY_SO) return false;
    utf8proc_int32_t d[4];
    int boundclass = 0;
    utf8proc_ssize_t n = utf8proc_decompose_char(c, d, 4, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &boundclass);
    return n == 1 && d[0] != c && has_case(d[0]);
}

/* Unicode's Case_Ignorable: the categories Mn, Me, Cf, Lm, Sk and the
 * apostrophes and word-inner stops (Word_Break MidLetter, MidNumLet,
 * Single_Quote) */
static bool is_case_ignorable(utf8proc_int32_t c) {
    static const utf8proc_int32_t mid[] = {0x27,   0x2E,   0x3A,   0xB7,   0x387,  0x55F,  0x5F4,  0x2018, 0x2019,
                                           0x2024, 0x2027, 0xFE13, 0xFE52, 0xFE55, 0xFF07, 0xFF0E, 0xFF1A};
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_SK:
        return true;
    default:
        for (size_t i = 0; i < sizeof mid / sizeof *mid; i++)
            if (c == mid[i]) return true;
        return false;
    }
}

/* Whether the 'Σ' at p[i] ends a word, so lowers to 'ς' (CPython's
 * handle_capital_sigma, Unicode's Final_Sigma): a cased letter before it
 * and none after, skipping case-ignorable ones, looking back no further
 * than p[from]. Bytes that are not UTF-8 count as uncased. */
static bool final_sigma(const utf8proc_uint8_t *p, utf8proc_ssize_t n, utf8proc_ssize_t from, utf8proc_ssize_t i) {
    utf8proc_int32_t c = -1;
    utf8proc_ssize_t j = i;
    for (;;) {
        if (j <= from) return false;
        utf8proc_ssize_t b = j - 1;
        while (b > from && (p[b] & 0xC0) == 0x80 && j - b < 4) b--;
        if (utf8proc_iterate(p + b, j - b, &c) != j - b) return false;
        if (!is_case_ignorable(c)) break;
        j = b;
    }
    if (!is_cased(c)) return false;
    for (j = i + 2; j < n;) { /* 'Σ' is two bytes */
        utf8proc_ssize_t k = utf8proc_iterate(p + j, n - j, &c);
        if (k <= 0) return true;
        if (!is_case_ignorable(c)) return !is_cased(c);
        j += k;
    }
    return true;
}

static json_t *case_map(json_t *s, int mode) {
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)json_string_value(s);
    utf8proc_ssize_t n = (utf8proc_ssize_t)json_string_length(s), i = 0;
    utf8proc_ssize_t from = 0; /* where the text that lower() sees starts, for the final sigma */
    struct sbuf b = {0};
    bool start = true;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, n - i, &c);
        if (k <= 0) { /* not UTF-8 here: the byte as it is, an uncased letter */
            sb_add(&b, (const char *)p + i, 1);
            i++;
            if (mode == CASE_TITLE_FILTER && start) from = i;
            start = mode == CASE_TITLE_METHOD;
            continue;
        }
        int which; /* 0 lower, 1 upper, 2 title */
        switch (mode) {
        case CASE_LOWER: which = 0; break;
        case CASE_UPPER: which = 1; break;
        case CASE_CAPITALIZE: which = i == 0 ? 2 : 0; break;
        case CASE_TITLE_METHOD:
            which = start ? 2 : 0;
            start = !is_cased(c);
            break;
        default:
            which = start ? 1 : 0;
            if (start) from = i + k; /* item[1:].lower() sees the word from its second character */
            start = py_space((unsigned)c) || (c && c < 0x80 && strchr("-({[<", c));
        }
        if (which == 0 && c == 0x3A3) put_cp(&b, final_sigma(p, n, from, i) ? 0x3C2 : 0x3C3);
        else put_case(&b, c, which);
        i += k;
    }
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

/* str.islower() / str.isupper(): some cased letter, and none of the other case */
static bool py_is_case(json_t *v, bool lower) {
    if (!v || !json_is_string(v)) return false;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)json_string_value(v);
    utf8proc_ssize_t len = (utf8proc_ssize_t)json_string_length(v), k;
    bool cased = false;
    for (utf8proc_ssize_t i = 0; i < len; i += k > 0 ? k : 1) {
        utf8proc_int32_t c;
        if ((k = utf8proc_iterate(p + i, len - i, &c)) <= 0) continue;
        bool lo = utf8proc_toupper(c) != c, up = utf8proc_tolower(c) != c || utf8proc_category(c) == UTF8PROC_CATEGORY_LT;
        if (lower ? up : lo) return false;
        cased |= lower ? lo : up;
    }
    return cased;
}

/* s padded to `width` code points with `fill` (one character): on the
 * right (ljust), the left (rjust) or both (center, the odd one on the left
 * when width is odd, as CPython) */
enum { PAD_LJUST, PAD_RJUST, PAD_CENTER };
static json_t *pad_str(json_t *s, long long width, int mode, const char *fill, size_t filln) {
    long long len = (long long)utf8_count(json_string_value(s), json_string_length(s));
    if (width <= len || width > 1000000) return json_incref(s);
    long long marg = width - len;
    long long left = mode == PAD_LJUST ? 0 : mode == PAD_RJUST ? marg : marg / 2 + (marg & width & 1);
    struct sbuf b = {0};
    for (long long i = 0; i < left; i++) sb_add(&b, fill, filln);
    sb_add(&b, json_string_value(s), json_string_length(s));
    for (long long i = left + len; i < width; i++) sb_add(&b, fill, filln);
    json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

/* Python's str.splitlines(keepends): \n, \r, \r\n, \v, \f, \x1c-\x1e, NEL, U+2028/9 end lines */
static json_t *split_lines(json_t *obj, bool keep) {
    const char *s = json_string_value(obj);
    size_t n = json_string_length(obj), start = 0;
    json_t *r = json_array();
    for (size_t i = 0, l; i < n; i += l) {
        unsigned c = cp_at(s + i, n - i, &l);
        if (!(c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 || c == 0x2029))
            continue;
        size_t end = i + l;
        if (c == '\r' && end < n && s[end] == '\n') end++;
        json_array_append_new(r, json_stringn_nocheck(s + start, (keep ? end : i) - start));
        start = end;
        l = end - i;
    }
    if (start < n) json_array_append_new(r, json_stringn_nocheck(s + start, n - start));
    return r;
}

static bool eval_args(struct ctx *C, const struct node *call, json_t ***pos, json_t ***kwv);
static void free_args(const struct node *call, json_t **pos, json_t **kwv);

/* Python's str.format for the plain fields: {} {0} {name} and {{ }};
 * conversions and format specs ({:>5}, {!r}) are not supported */
static json_t *py_str_format(struct ctx *C, const struct node *call, json_t *fmtv) {
    json_t **pos = NULL, **kwv = NULL, *r = NULL;
    if (!eval_args(C, call, &pos, &kwv)) { free_args(call, pos, kwv); return NULL; }
    const char *f = json_string_value(fmtv);
    size_t n = json_string_length(fmtv);
    int auto_next = 0;
    struct sbuf b = {0};
    for (size_t i = 0; i < n && !C->st;) {
        if ((f[i] == '{' || f[i] == '}') && i + 1 < n && f[i + 1] == f[i]) { sb_add(&b, f + i, 1); i += 2; continue; }
        if (f[i] == '}') { rerr(C, call, "format: single '}' in the format string"); break; }
        if (f[i] != '{') { sb_add(&b, f + i, 1); i++; continue; }
        const char *close = memchr(f + i, '}', n - i);
        if (!close) { rerr(C, call, "format: unclosed '{'"); break; }
        char field[128];
        snprintf(field, sizeof field, "%.*s", (int)(close - f - i - 1), f + i + 1);
        json_t *v = NULL;
        bool found = false;
        if (strpbrk(field, ":![.{")) { rerr(C, call, "format: field '{%s}' is not supported", field); break; }
        if (!field[0] || isdigit((unsigned char)field[0])) {
            int idx = field[0] ? atoi(field) : auto_next++;
            if (idx < call->n) { v = pos[idx]; found = true; }
        } else {
            for (int k = 0; k < call->nkw && !found; k++)
                if (!strcmp(call->kwn[k], field)) { v = kwv[k]; found = true; }
        }
        if (!found) { rerr(C, call, "format: no argument for '{%s}'", field); break; }
        py_str(v, &b);
        i = (size_t)(close - f) + 1;
    }
    if (!C->st) r = json_stringn_nocheck(b.p ? b.p : "", b.n);
    free(b.p);
    free_args(call, pos, kwv);
    return r;
}

static json_t *call_method(struct ctx *C, const struct node *call, json_t *obj, const char *m) {
    if (obj && json_is_string(obj)) {
        json_t *a0 = arg(C, call, 0, NULL), *r = NULL;
        if (!strcmp(m, "strip")) r = strip_chars(obj, a0, true, true);
        else if (!strcmp(m, "lstrip")) r = strip_chars(obj, a0, true, false);
        else if (!strcmp(m, "rstrip")) r = strip_chars(obj, a0, false, true);
        else if (!strcmp(m, "upper")) r = case_map(obj, CASE_UPPER);
        else if (!strcmp(m, "lower")) r = case_map(obj, CASE_LOWER);
        else if (!strcmp(m, "title")) r = case_map(obj, CASE_TITLE_METHOD);
        else if (!strcmp(m, "capitalize")) r = case_map(obj, CASE_CAPITALIZE);
        else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
            bool ok = false;
            json_t *cands = a0 && json_is_array(a0) ? a0 : NULL;
            size_t nc = cands ? json_array_size(cands) : 1;
            for (size_t i = 0; i < nc && !ok; i++) {
                json_t *c = cands ? json_array_get(cands, i) : a0;
                const char *p = strv(c);
                if (!p) continue;
                size_t pl = json_string_length(c), n = json_string_length(obj);
                const char *s = json_string_value(obj);
                ok = pl <= n && !memcmp(m[0] == 's' ? s : s + n - pl, p, pl);
            }
            r = json_boolean(ok);
        } else if (!strcmp(m, "split")) {
            json_t *a1 = arg(C, call, 1, "maxsplit");
            long long maxs = a1 && is_intlike(a1) ? ival(a1) : -1;
            json_decref(a1);
            r = json_array();
            const char *s = json_string_value(obj);
            size_t n = json_string_length(obj), i = 0;
            const char *sep = strv(a0);
            if (!sep) { /* whitespace split */
                long long cnt = 0;
                while (i < n) {
                    for (size_t l; i < n && (l = space_at(s + i, n - i));) i += l;
                    if (i >= n) break;
                    size_t e = i;
                    if (maxs >= 0 && cnt >= maxs) e = n; /* the rest as it is, as Python */
                    else while (e < n && !space_at(s + e, n - e)) { size_t l; cp_at(s + e, n - e, &l); e += l; }
                    if (!take(8 + e - i)) break; /* the list's slot and the piece's copy */
                    json_array_append_new(r, json_stringn_nocheck(s + i, e - i));
                    cnt++;
                    i = e;
                }
            } else {
                size_t sl = json_string_length(a0);
                long long cnt = 0;
                if (!sl) { rerr(C, call, "split: empty separator"); json_decref(a0); json_decref(r); return NULL; }
                for (;;) {
                    const char *f = (maxs < 0 || cnt < maxs) ? find_bytes(s + i, n - i, sep, sl) : NULL;
                    if (!take(8 + (size_t)((f ? f : s + n) - (s + i)))) break; /* the slot and the copy */
                    if (!f) { json_array_append_new(r, json_stringn_nocheck(s + i, n - i)); break; }
                    json_array_append_new(r, json_stringn_nocheck(s + i, (size_t)(f - (s + i))));
                    i = (size_t)(f - s) + sl;
                    cnt++;
                }
            }
        } else if (!strcmp(m, "rsplit")) {
            /* split from the right: only maxsplit makes it differ from split */
            json_t *a1 = arg(C, call, 1, "maxsplit");
            long long maxs = a1 && is_intlike(a1) ? ival(a1) : -1;
            json_decref(a1);
            const char *s = json_string_value(obj), *sep = strv(a0);
            size_t sl = sep ? json_string_length(a0) : 0, e = json_string_length(obj);
            if (sep && !sl) { rerr(C, call, "rsplit: empty separator"); json_decref(a0); return NULL; }
            json_t *rev = json_array(); /* the pieces, last first */
            long long cnt = 0;
            if (!sep) {
                for (;;) {
                    for (size_t l; e > 0 && (l = space_before(s, e));) e -= l;
                    if (!e) break;
                    size_t b = e;
                    if (maxs >= 0 && cnt >= maxs) b = 0;
                    else for (size_t l; b > 0 && !space_before(s, b);) { l = 1; while (b - l > 0 && ((unsigned char)s[b - l] & 0xC0) == 0x80) l++; b -= l; }
                    if (!take(16 + e - b)) break; /* the piece's copy and its slot in both lists */
                    json_array_append_new(rev, json_stringn_nocheck(s + b, e - b));
                    cnt++;
                    e = b;
                }
            } else {
                char *rp = malloc(sl), *buf = NULL;
                size_t cap = 0;
                bool oom = !rp;
                if (rp) reverse_into(rp, sep, sl);
                while (!oom) {
                    const char *hit = (maxs < 0 || cnt < maxs) ? rfind_bytes(s, e, rp, sl, &buf, &cap, &oom) : NULL;
                    if (oom || !take(16 + (hit ? e - (size_t)(hit - s) - sl : e))) break; /* the copy and two slots */
                    if (!hit) { json_array_append_new(rev, json_stringn_nocheck(s, e)); break; }
                    json_array_append_new(rev, json_stringn_nocheck(hit + sl, e - (size_t)(hit - s) - sl));
                    e = (size_t)(hit - s);
                    cnt++;
                }
                free(rp);
                free(buf);
                if (oom) {
                    json_decref(rev);
                    json_decref(a0);
                    rerr(C, call, "rsplit: out of memory");
                    C->st = TOY_ERR_NOMEM;
                    return NULL;
                }
            }
            r = json_array();
            for (size_t i = json_array_size(rev); i > 0; i--) json_array_append(r, json_array_get(rev, i - 1));
            json_decref(rev);
        } else if (!strcmp(m, "splitlines")) {
            r = split_lines(obj, truthy(a0));
        } else if (!strcmp(m, "zfill")) {
            /* zeros on the left up to the width, after a leading sign */
            long long w = a0 && is_intlike(a0) ? ival(a0) : 0;
            const char *s = json_string_value(obj);
            size_t sn = json_string_length(obj), sign = sn && (s[0] == '-' || s[0] == '+');
            long long len = (long long)utf8_count(s, sn);
            struct sbuf b = {0};
            sb_add(&b, s, sign);
            for (long long i = len; i < w && i < 1000000; i++) sb_str(&b, "0");
            sb_add(&b, s + sign, sn - sign);
            r = json_stringn_nocheck(b.p ? b.p : "", b.n);
            free(b.p);
        } else if (!strcmp(m, "ljust") || !strcmp(m, "rjust") || !strcmp(m, "center")) {
            json_t *a1 = arg(C, call, 1, NULL);
            const char *fill = strv(a1) ? strv(a1) : " ";
            size_t fl = strv(a1) ? json_string_length(a1) : 1;
            if (utf8_count(fill, fl) != 1) rerr(C, call, "%s: the fill character must be exactly one character long", m);
            else r = pad_str(obj, a0 && is_intlike(a0) ? ival(a0) : 0, m[0] == 'l' ? PAD_LJUST : m[0] == 'r' ? PAD_RJUST : PAD_CENTER, fill, fl);
            json_decref(a1);
        } else if (!strcmp(m, "rfind")) {
            const char *p = strv(a0), *s = json_string_value(obj), *hit = NULL;
            size_t n = json_string_length(obj), pl = p ? json_string_length(a0) : 0;
            char *rp = p ? malloc(pl + 1) : NULL, *buf = NULL;
            size_t cap = 0;
            bool oom = p && !rp;
            if (rp) reverse_into(rp, p, pl);
            if (rp) hit = rfind_bytes(s, n, rp, pl, &buf, &cap, &oom);
            free(rp);
            free(buf);
            if (oom) {
                json_decref(a0);
                rerr(C, call, "rfind: out of memory");
                C->st = TOY_ERR_NOMEM;
                return NULL;
            }
            r = json_integer(hit ? (json_int_t)utf8_count(s, (size_t)(hit - s)) : -1);
        } else if (!strcmp(m, "isupper") || !strcmp(m, "islower")) {
            r = json_boolean(py_is_case(obj, m[2] == 'l'));
        } else if (!strcmp(m, "format")) {
            r = py_str_format(C, call, obj);
        } else if (!strcmp(m, "replace")) {
            json_t *a1 = arg(C, call, 1, NULL), *a2 = arg(C, call, 2, NULL);
            r = str_replace(obj, a0, a1, a2 && is_intlike(a2) ? ival(a2) : -1);
            json_decref(a1);
            json_decref(a2);
        } else if (!strcmp(m, "find") || !strcmp(m, "count")) {
            const char *p = strv(a0);
            const char *s = json_string_value(obj);
            size_t n = json_string_length(obj);
            if (m[0] == 'f') {
                const char *f = p ? find_bytes(s, n, p, json_string_length(a0)) : NULL;
                r = json_integer(f ? (json_int_t)utf8_count(s, (size_t)(f - s)) : -1);
            } else {
                long long c = 0;
                size_t pl = p ? json_string_length(a0) : 0;
                for (size_t i = 0; p && pl && i + pl <= n;) {
                    const char *f = find_bytes(s + i, n - i, p, pl);
                    if (!f) break;
                    c++;
                    i = (size_t)(f - s) + pl;
                }
                r = json_integer(c);
            }
        } else if (!strcmp(m, "join")) {
            json_t *l = to_list(a0);
            struct sbuf b = {0};
            size_t i;
            json_t *e;
            json_array_foreach(l, i, e) { if (i) sb_add(&b, json_string_value(obj), json_string_length(obj)); py_str(e, &b); }
            r = json_stringn_nocheck(b.p ? b.p : "", b.n);
            free(b.p);
            json_decref(l);
        } else if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isspace") || !strcmp(m, "isalnum")) {
            const char *s = json_string_value(obj);
            size_t n = json_string_length(obj);
            bool ok = n > 0;
            for (size_t i = 0, l = 1; i < n && ok; i += l)
                ok = m[2] == 'd' ? isdigit((unsigned char)s[i]) : !strcmp(m, "isalpha") ? isalpha((unsigned char)s[i])
                   : m[2] == 'a' ? isalnum((unsigned char)s[i]) : (l = space_at(s + i, n - i)) != 0;
            r = json_boolean(ok);
        } else {
            rerr(C, call, "unknown string method '%s'", m);
        }
        json_decref(a0);
        return r;
    }
    if (obj && json_is_object(obj)) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            json_t *r = json_array();
            const char *k;
            json_t *v;
            json_object_foreach(obj, k, v) {
                if (m[0] == 'k') json_array_append_new(r, key_value(k));
                else if (m[0] == 'v') json_array_append(r, v);
                else json_array_append_new(r, pair(key_value(k), v));
            }
            /* a view: it prints as one; what makes a new value of it (|list, +, slices) gives a list */
            return mark_seq(r, m[0] == 'k' ? SEQ_DICT_KEYS : m[0] == 'v' ? SEQ_DICT_VALUES : SEQ_DICT_ITEMS);
        }
        if (!strcmp(m, "get")) {
            json_t *k = arg(C, call, 0, NULL), *d = arg(C, call, 1, "default");
            json_t *ks = k ? dict_key(k) : NULL;
            json_t *v = ks ? json_object_get(obj, json_string_value(ks)) : NULL;
            json_decref(ks);
            json_decref(k);
            if (is_undef(v)) { json_decref(d); return NULL; } /* a key set to undefined */
            if (v) { json_decref(d); return json_incref(v); }
            return d ? d : json_null();
        }
        json_t *chg = json_object_get(obj, LOOP_CHANGED_KEY), *cyc = json_object_get(obj, CYCLER_ITEMS_KEY);
        if (json_object_get(obj, "index0") && !strcmp(m, "cycle")) { /* loop.cycle(a, b, ...) */
            if (!call->n) { rerr(C, call, "no items for cycling given"); return NULL; }
            return arg(C, call, (int)(json_integer_value(json_object_get(obj, "index0")) % call->n), NULL);
        }
        if (chg && json_is_array(chg) && !strcmp(m, "changed")) { /* loop.changed(values...): differs from the last call */
            json_t *now = json_array();
            for (int i = 0; i < call->n; i++) json_array_append_new(now, mark(eval(C, call->list[i])));
            bool differs = json_array_size(chg) != 1 || !equal(json_array_get(chg, 0), now);
            json_array_clear(chg);
            json_array_append_new(chg, now);
            return json_boolean(differs);
        }
        if (cyc && json_is_array(cyc) && (!strcmp(m, "next") || !strcmp(m, "reset"))) {
            /* cycler: next() gives `current` and moves on; reset() goes back to the first */
            size_t cn = json_array_size(cyc), pos = (size_t)json_integer_value(json_object_get(obj, CYCLER_POS_KEY));
            json_t *r = m[0] == 'n' && cn ? json_incref(json_array_get(cyc, pos % cn)) : json_null();
            pos = m[0] == 'n' && cn ? (pos + 1) % cn : 0;
            json_object_set_new_nocheck(obj, CYCLER_POS_KEY, json_integer((json_int_t)pos));
            if (cn) json_object_set(obj, "current", json_array_get(cyc, pos));
            return r;
        }
        /* a namespace or dict holding a macro-like value is not callable */
    }
    if (obj && json_is_array(obj)) {
        if (!strcmp(m, "append")) {
            json_t *v = arg(C, call, 0, NULL);
            if (reaches(v, obj, 0)) {
                json_decref(v);
                rerr(C, call, "append: the list would hold itself (a reference cycle)");
                return NULL;
            }
            json_array_append_new(obj, mark(v));
            return json_null();
        }
        if (!strcmp(m, "pop")) {
            size_t n = json_array_size(obj);
            if (!n) { rerr(C, call, "pop from empty list"); return NULL; }
            json_t *a0 = arg(C, call, 0, NULL);
            long long i = a0 && is_intlike(a0) ? ival(a0) : (long long)n - 1;
            json_decref(a0);
            if (i < 0) i += (long long)n;
            if (i < 0 || i >= (long long)n) { rerr(C, call, "pop index out of range"); return NULL; }
            json_t *v = json_incref(json_array_get(obj, (size_t)i));
            json_array_remove(obj, (size_t)i);
            return v;
        }
        if (!strcmp(m, "count")) {
            json_t *a0 = arg(C, call, 0, NULL);
            size_t i;
            json_t *e;
            long long c = 0;
            json_array_foreach(obj, i, e) c += equal(e, a0);
            json_decref(a0);
            return json_integer(c);
        }
        if (!strcmp(m, "index")) {
            json_t *a0 = arg(C, call, 0, NULL);
            size_t i;
            json_t *e;
            json_array_foreach(obj, i, e) if (equal(e, a0)) { json_decref(a0); return json_integer((json_int_t)i); }
            json_decref(a0);
            rerr(C, call, "value is not in list");
            return NULL;
        }
    }
    rerr(C, call, "unknown method '%s'", m);
    return NULL;
}

static json_t *do_filter(struct ctx *C, const struct node *f, json_t *v /* borrowed */);
static bool do_test(struct ctx *C, const struct node *t, json_t *v);

/* Renders `body` with the scope stack base[0..nbase) (borrowed) plus
 * `local` (borrowed) as the innermost scope, then restores the current stack.
 * The base array is copied, so scopes pushed by the body cannot move it. */
static void exec_in_scopes(struct ctx *C, json_t **base, int nbase, json_t *local, struct node *const *body, int n,
                           struct sbuf *out) {
    int cap = nbase + 8;
    json_t **fresh = malloc((size_t)cap * sizeof *fresh);
    if (!fresh) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); return; }
    memcpy(fresh, base, (size_t)nbase * sizeof *fresh);
    fresh[nbase] = local;
    json_t **saved = C->scopes;
    int saved_n = C->nscopes, saved_cap = C->capscopes, saved_brk = C->brk;
    C->scopes = fresh;
    C->nscopes = nbase + 1;
    C->capscopes = cap;
    C->brk = 0;
    C->depth++;
    exec_body(C, body, n, out);
    C->depth--;
    C->brk = saved_brk;
    while (C->nscopes > nbase + 1) pop_scope(C);
    free(C->scopes);
    C->scopes = saved;
    C->nscopes = saved_n;
    C->capscopes = saved_cap;
}

/* Binds a macro's (or call block's) parameters in `local`: positional values
 * first, then keyword arguments by name, then defaults, which are evaluated
 * with the earlier parameters visible (`m(a, b=a)`). A parameter with no
 * value stays undefined, as in Jinja2. Extra arguments land in varargs and
 * kwargs. `args` are already evaluated in the caller's scope. */
static void bind_params(struct ctx *C, const struct node *params, json_t *local, json_t **pos, int npos, char **kwn,
                        json_t **kwv, int nkw, json_t **scopes, int nscopes) {
    json_t *varargs = json_array(), *kwargs = json_object();
    for (int i = npos > params->nkw ? params->nkw : npos; i < npos; i++) json_array_append_new(varargs, pos[i] ? json_incref(pos[i]) : undef_marker());
    for (int k = 0; k < nkw; k++) {
        bool named = false; /* a parameter not already given by position */
        for (int i = npos; i < params->nkw && !named; i++) named = !strcmp(kwn[k], params->kwn[i]);
        if (!named) json_object_set_new(kwargs, kwn[k], kwv[k] ? json_incref(kwv[k]) : undef_marker());
    }
    for (int i = 0; i < params->nkw; i++) {
        json_t *v = i < npos ? json_incref(pos[i]) : NULL;
        for (int k = 0; !v && i >= npos && k < nkw; k++)
            if (!strcmp(kwn[k], params->kwn[i])) v = json_incref(kwv[k]);
        if (!v && params->kwv[i]) {
            /* the default sees the parameters bound so far */
            int cap = nscopes + 8;
            json_t **fresh = malloc((size_t)cap * sizeof *fresh);
            if (!fresh) { C->st = TOY_ERR_NOMEM; break; }
            memcpy(fresh, scopes, (size_t)nscopes * sizeof *fresh);
            fresh[nscopes] = local;
            json_t **saved = C->scopes;
            int saved_n = C->nscopes, saved_cap = C->capscopes;
            C->scopes = fresh;
            C->nscopes = nscopes + 1;
            C->capscopes = cap;
            v = eval(C, params->kwv[i]);
            free(fresh);
            C->scopes = saved;
            C->nscopes = saved_n;
            C->capscopes = saved_cap;
        }
        if (v) json_object_set_new(local, params->kwn[i], v);
    }
    json_object_set_new(local, "varargs", varargs ? as_tuple(varargs) : json_array());
    json_object_set_new(local, "kwargs", kwargs ? kwargs : json_object());
}

/* Evaluates a call's arguments in the current scope. */
static bool eval_args(struct ctx *C, const struct node *call, json_t ***pos, json_t ***kwv) {
    *pos = calloc((size_t)call->n + 1, sizeof **pos);
    *kwv = calloc((size_t)call->nkw + 1, sizeof **kwv);
    if (!*pos || !*kwv) { C->st = TOY_ERR_NOMEM; return false; }
    for (int i = 0; i < call->n; i++) (*pos)[i] = eval(C, call->list[i]);
    for (int k = 0; k < call->nkw; k++) (*kwv)[k] = eval(C, call->kwv[k]);
    return !C->st;
}

static void free_args(const struct node *call, json_t **pos, json_t **kwv) {
    for (int i = 0; pos && i < call->n; i++) json_decref(pos[i]);
    for (int k = 0; kwv && k < call->nkw; k++) json_decref(kwv[k]);
    free(pos);
    free(kwv);
}

/* Jinja2's Macro.__call__ checks: extra positional arguments need a body
 * that reads varargs; keywords that name no parameter still open (unknown,
 * or given by position already) one that reads kwargs; and {% call %}, which
 * passes caller, one that reads caller. A call block is the macro None. */
static bool check_args(struct ctx *C, const struct node *def, const struct node *call, bool by_call_block) {
    char name[80];
    if (def->k == N_MACRO) snprintf(name, sizeof name, "'%.60s'", def->str ? def->str : "");
    else snprintf(name, sizeof name, "None");
    if (by_call_block && !(def->uses & (USES_CALLER | USES_KWARGS))) {
        rerr(C, call, "macro %s was invoked with two values for the special caller argument. This is most likely a bug.",
             name);
        return false;
    }
    if (!(def->uses & USES_KWARGS)) {
        for (int k = 0; k < call->nkw; k++) {
            bool open = false;
            for (int i = call->n; i < def->nkw && !open; i++) open = !strcmp(call->kwn[k], def->kwn[i]);
            if (!open) {
                rerr(C, call, "macro %s takes no keyword argument '%.60s'", name, call->kwn[k]);
                return false;
            }
        }
    }
    if (!(def->uses & USES_VARARGS) && call->n > def->nkw) {
        rerr(C, call, "macro %s takes not more than %d argument(s)", name, def->nkw);
        return false;
    }
    return true;
}

/* Renders `def`'s body (a macro, or a {% call %} block) for `call`: its
 * parameters bound in a fresh scope over `scopes`, with `caller` as what
 * caller() renders meanwhile. */
static json_t *invoke(struct ctx *C, const struct node *def, const struct node *call, json_t **scopes, int nscopes,
                      const struct call_site *caller) {
    if (C->depth > 64) { rerr(C, call, "macro recursion too deep"); return NULL; }
    if (!check_args(C, def, call, def->k == N_MACRO && caller)) return NULL;
    json_t **pos = NULL, **kwv = NULL;
    struct sbuf out = {0};
    json_t *local = json_object();
    if (!local) C->st = TOY_ERR_NOMEM;
    else if (eval_args(C, call, &pos, &kwv)) {
        bind_params(C, def, local, pos, call->n, call->kwn, kwv, call->nkw, scopes, nscopes);
        const struct call_site *saved = C->caller;
        C->caller = caller;
        if (!C->st) exec_in_scopes(C, scopes, nscopes, local, def->list, def->n, &out);
        C->caller = saved;
    }
    free_args(call, pos, kwv);
    json_decref(local);
    json_t *r = C->st ? NULL : json_stringn_nocheck(out.p ? out.p : "", out.n);
    free(out.p);
    return r;
}

/* A macro invocation. Macros see the template's top-level names and their
 * parameters, not the locals of the code that calls them. */
static json_t *call_macro(struct ctx *C, const struct node *mac, const struct node *call, const struct call_site *cs) {
    return invoke(C, mac, call, C->scopes, 1, cs);
}

/* caller(args) inside a macro run by {% call(params) m() %}: the call block
 * renders in the call site's scopes, its own parameters bound on top. */
static json_t *call_caller(struct ctx *C, const struct node *call) {
    const struct call_site *cs = C->caller;
    return invoke(C, cs->body, call, cs->scopes, cs->nscopes, cs->outer);
}

static const struct node *find_macro(struct ctx *C, const char *name) {
    json_t *m = lookup(C, name);
    if (!m || !json_is_object(m)) return NULL;
    json_t *p = json_object_get(m, "__macro__");
    if (!p || !json_is_integer(p)) return NULL;
    json_int_t idx = json_integer_value(p);
    if (idx < 0 || (size_t)idx >= C->tpl->nall) return NULL;
    return C->tpl->all[idx];
}

static size_t node_index(struct ctx *C, const struct node *x) {
    size_t idx = 0;
    while (idx < C->tpl->nall && C->tpl->all[idx] != x) idx++;
    return idx;
}

static void exec_for(struct ctx *C, const struct node *x, json_t *it, int depth, struct sbuf *out);

/* loop(items) in a recursive loop: the loop once more over `items`, one
 * level deeper, in the scopes the loop itself sees (not the iteration's);
 * its output is the value */
static json_t *call_loop(struct ctx *C, const struct node *call, json_t *loop) {
    json_int_t idx = json_integer_value(json_object_get(loop, LOOP_NODE_KEY));
    json_int_t base = json_integer_value(json_object_get(loop, LOOP_BASE_KEY));
    json_int_t depth = json_integer_value(json_object_get(loop, "depth"));
    if (call->n != 1 || call->nkw) { rerr(C, call, "loop() takes one argument, the items"); return NULL; }
    if (idx < 0 || (size_t)idx >= C->tpl->nall || base < 1 || base > C->nscopes) { rerr(C, call, "loop() called outside its loop"); return NULL; }
    if (C->depth > 64) { rerr(C, call, "loop recursion too deep"); return NULL; }
    json_t *it = eval(C, call->list[0]);
    int cap = (int)base + 8;
    json_t **fresh = C->st ? NULL : malloc((size_t)cap * sizeof *fresh);
    if (!fresh) {
        json_decref(it);
        if (!C->st) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); }
        return NULL;
    }
    memcpy(fresh, C->scopes, (size_t)base * sizeof *fresh);
    json_t **saved = C->scopes;
    int saved_n = C->nscopes, saved_cap = C->capscopes;
    C->scopes = fresh;
    C->nscopes = (int)base;
    C->capscopes = cap;
    C->depth++;
    struct sbuf b = {0};
    exec_for(C, C->tpl->all[idx], it, (int)depth, &b);
    C->depth--;
    while (C->nscopes > base) pop_scope(C);
    free(C->scopes);
    C->scopes = saved;
    C->nscopes = saved_n;
    C->capscopes = saved_cap;
    json_decref(it);
    json_t *r = C->st || b.oom ? NULL : json_stringn_nocheck(b.p ? b.p : "", b.n);
    if (b.oom && !C->st) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); }
    free(b.p);
    return r;
}

static json_t *call_global(struct ctx *C, const struct node *call, const char *name) {
    if (!strcmp(name, "raise_exception")) {
        json_t *m = arg(C, call, 0, NULL);
        struct sbuf b = {0};
        py_str(m, &b);
        json_decref(m);
        if (!C->st) {
            snprintf(C->err, sizeof C->err, "template raised: %s", b.p ? b.p : "");
            C->st = TOY_ERR_INVALID_ARG;
        }
        free(b.p);
        return NULL;
    }
    if (!strcmp(name, "range")) {
        json_t *a = arg(C, call, 0, NULL), *b = arg(C, call, 1, NULL), *c = arg(C, call, 2, NULL);
        long long start = 0, stop, step = 1;
        if (b) { start = ival(a); stop = ival(b); } else stop = a ? ival(a) : 0;
        if (c) step = ival(c);
        json_decref(a); json_decref(b); json_decref(c);
        if (step == 0) { rerr(C, call, "range() step must not be zero"); return NULL; }
        json_t *r = json_array();
        for (long long i = start; step > 0 ? i < stop : i > stop;) {
            if (json_array_size(r) > 1000000) { rerr(C, call, "range() too long"); break; }
            if (!take(64)) break; /* a jansson integer, its malloc header and its slot in the list */
            json_array_append_new(r, json_integer(i));
            if (__builtin_add_overflow(i, step, &i)) break;
        }
        return r;
    }
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        json_t *o = json_object();
        if (name[0] == 'n') json_object_set_new_nocheck(o, NAMESPACE_KEY, json_true());
        for (int k = 0; k < call->nkw; k++) {
            json_t *v = eval(C, call->kwv[k]);
            json_object_set_new(o, call->kwn[k], mark(v));
        }
        if (call->n > 0) {
            json_t *d = eval(C, call->list[0]);
            if (d && json_is_object(d)) json_object_update(o, d);
            json_decref(d);
        }
        return o;
    }
    if (!strcmp(name, "strftime_now")) {
        json_t *f = arg(C, call, 0, NULL);
        char buf[256] = "";
        /* the clock's local time, or SOURCE_DATE_EPOCH (UTC), the reproducible-builds
         * convention, so that a prompt showing the date can be pinned */
        const char *sde = getenv("SOURCE_DATE_EPOCH");
        char *end = NULL;
        long long pinned = sde && *sde ? strtoll(sde, &end, 10) : 0;
        time_t when = (time_t)pinned, now = time(NULL);
        struct tm tm = {0};
        if (!(end && !*end && gmtime_r(&when, &tm))) localtime_r(&now, &tm);
        if (strv(f)) strftime(buf, sizeof buf, strv(f), &tm);
        json_decref(f);
        return json_string(buf);
    }
    if (!strcmp(name, "cycler") && !lookup(C, name)) {
        json_t *items = json_array(), *o = json_object();
        for (int i = 0; i < call->n; i++) json_array_append_new(items, mark(eval(C, call->list[i])));
        if (json_array_size(items)) json_object_set(o, "current", json_array_get(items, 0));
        json_object_set_new_nocheck(o, CYCLER_ITEMS_KEY, items);
        json_object_set_new_nocheck(o, CYCLER_POS_KEY, json_integer(0));
        return o;
    }
    if (!strcmp(name, "joiner") && !lookup(C, name)) {
        json_t *sep = arg(C, call, 0, "sep"), *o = json_object();
        json_object_set_new_nocheck(o, JOINER_KEY, sep && json_is_string(sep) ? sep : json_string(", "));
        if (sep && !json_is_string(sep)) json_decref(sep);
        return o;
    }
    json_t *j = lookup(C, name);
    if (j && json_is_object(j) && json_is_string(json_object_get(j, JOINER_KEY))) {
        /* a joiner: '' the first time, its separator after */
        bool used = json_object_get(j, JOINER_USED_KEY) != NULL;
        json_object_set_new_nocheck(j, JOINER_USED_KEY, json_true());
        return used ? json_incref(json_object_get(j, JOINER_KEY)) : json_string("");
    }
    if (!strcmp(name, "caller") && C->caller) return call_caller(C, call);
    if (j && json_is_object(j) && json_is_integer(json_object_get(j, LOOP_NODE_KEY))) return call_loop(C, call, j);
    const struct node *mac = find_macro(C, name);
    if (mac) return call_macro(C, mac, call, NULL);
    rerr(C, call, "'%s' is not callable", name);
    return NULL;
}

/* Python's printf-style `fmt % args`, behind the % operator on a string and
 * the format filter: conversions s r d i u f F e E g G x X o c and %%, flags
 * - + space 0 #, a width, a .precision, and %(key)s when `map` (the single
 * argument, a dict) is given. Widths count code points, as Python's do.
 * Python's errors (too few or too many arguments, %d of a string) are
 * errors here too. */
static json_t *py_percent(struct ctx *C, const struct node *x, json_t *fmtv, json_t **args, size_t nargs, json_t *map) {
    const char *f = json_string_value(fmtv);
    size_t n = json_string_length(fmtv), next = 0;
    struct sbuf out = {0};
    for (size_t i = 0; i < n && !C->st;) {
        if (f[i] != '%') { sb_add(&out, f + i, 1); i++; continue; }
        i++;
        json_t *v = NULL;
        bool from_map = false;
        if (i < n && f[i] == '(') { /* %(key)s */
            size_t e = i + 1;
            while (e < n && f[e] != ')') e++;
            if (e >= n) { rerr(C, x, "incomplete format key"); break; }
            if (!map) { rerr(C, x, "format requires a mapping"); break; }
            char key[256];
            snprintf(key, sizeof key, "%.*s", (int)(e - i - 1), f + i + 1);
            v = unmark(json_object_get(map, key));
            if (!v) { rerr(C, x, "format key '%s' not found", key); break; }
            from_map = true;
            i = e + 1;
        }
        char flags[8] = "";
        size_t nf = 0;
        while (i < n && strchr("-+ 0#", f[i]) && nf < sizeof flags - 1) flags[nf++] = f[i++];
        flags[nf] = 0;
        long width = 0, prec = -1;
        while (i < n && isdigit((unsigned char)f[i]) && width < 100000) width = width * 10 + (f[i++] - '0');
        if (i < n && f[i] == '.') {
            prec = 0;
            for (i++; i < n && isdigit((unsigned char)f[i]) && prec < 100000;) prec = prec * 10 + (f[i++] - '0');
        }
        if (i >= n) { rerr(C, x, "incomplete format"); break; }
        char conv = f[i++];
        if (conv == '%') { sb_str(&out, "%"); continue; }
        if (!strchr("srdiufFeEgGxXoc", conv) || width >= 100000 || prec >= 100000) {
            rerr(C, x, "unsupported format character '%c'", conv);
            break;
        }
        if (!from_map) {
            if (next >= nargs) { rerr(C, x, "not enough arguments for format string"); break; }
            v = args[next++];
        }
        v = unmark(v);
        bool left = strchr(flags, '-') != NULL, zero = strchr(flags, '0') != NULL && !left;
        struct sbuf t = {0}; /* the converted text before padding */
        if (conv == 's' || conv == 'r' || conv == 'c') {
            if (conv == 's') py_str(v, &t);
            else if (conv == 'r') { if (v) repr(v, &t, false); else sb_str(&t, "Undefined"); }
            else if (v && json_is_string(v) && utf8_count(json_string_value(v), json_string_length(v)) == 1)
                sb_add(&t, json_string_value(v), json_string_length(v));
            else if (is_intlike(v) && ival(v) >= 0 && ival(v) <= 0x10FFFF) {
                utf8proc_uint8_t enc[4];
                sb_add(&t, (const char *)enc, (size_t)utf8proc_encode_char((utf8proc_int32_t)ival(v), enc));
            } else rerr(C, x, "%%c requires an int or a single character");
            if (prec >= 0 && conv != 'c' && t.p) t.n = utf8_offset(t.p, t.n, (size_t)prec);
            zero = false;
        } else if (!is_num(v) || (strchr("xXo", conv) && !is_intlike(v))) {
            rerr(C, x, "%%%c format: %s is required", conv, strchr("xXo", conv) ? "an integer" : "a number");
        } else if (strchr("fFeEgG", conv)) {
            char spec[32], buf[512];
            snprintf(spec, sizeof spec, "%%%s.%ld%c", flags, prec < 0 ? 6 : prec, conv);
            double d = num(v);
            int len = snprintf(NULL, 0, spec, d);
            char *big = len >= (int)sizeof buf ? malloc((size_t)len + 1) : buf;
            if (!big) { C->st = TOY_ERR_NOMEM; }
            else { snprintf(big, (size_t)len + 1, spec, d); sb_add(&t, big, (size_t)len); if (big != buf) free(big); }
            zero = false; /* printf applied the flags; width is added below */
            if (strchr(flags, '0') && !left && (long)t.n < width) { /* zeros go after the sign */
                struct sbuf z = {0};
                size_t s = t.p && (t.p[0] == '-' || t.p[0] == '+' || t.p[0] == ' ');
                sb_add(&z, t.p, s);
                for (long k = (long)t.n; k < width; k++) sb_str(&z, "0");
                sb_add(&z, t.p + s, t.n - s);
                free(t.p);
                t = z;
            }
        } else { /* d i u x X o: an integer, floats truncated toward zero */
            bool neg;
            char digits[400];
            if (is_intlike(v)) {
                long long iv = ival(v);
                neg = iv < 0;
                unsigned long long u = neg ? 0ULL - (unsigned long long)iv : (unsigned long long)iv;
                snprintf(digits, sizeof digits, conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : conv == 'o' ? "%llo" : "%llu", u);
            } else {
                double d = trunc(num(v));
                if (!isfinite(d)) { rerr(C, x, "cannot convert float %s to integer", isnan(d) ? "NaN" : "infinity"); d = 0; }
                neg = d < 0;
                if (fabs(d) < 1.8e19) {
                    unsigned long long u = (unsigned long long)fabs(d);
                    snprintf(digits, sizeof digits, conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : conv == 'o' ? "%llo" : "%llu", u);
                } else if (strchr("diu", conv)) {
                    snprintf(digits, sizeof digits, "%.0f", fabs(d)); /* the double's exact value, as Python's int() */
                } else {
                    rerr(C, x, "%%%c of a float this large is not supported", conv);
                    digits[0] = 0;
                }
            }
            const char *sign = neg ? "-" : strchr(flags, '+') ? "+" : strchr(flags, ' ') ? " " : "";
            const char *pre = !strchr(flags, '#') ? "" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
            sb_str(&t, sign);
            sb_str(&t, pre);
            long nd = (long)strlen(digits), len = (long)(strlen(sign) + strlen(pre)) + (prec > nd ? prec : nd);
            for (long k = nd; k < prec; k++) sb_str(&t, "0");
            if (zero) for (long k = len; k < width; k++) sb_str(&t, "0");
            sb_str(&t, digits);
            zero = false; /* the 0 flag's zeros are in, after the sign and prefix */
        }
        if (t.oom) C->st = TOY_ERR_NOMEM;
        long cps = t.p ? (long)utf8_count(t.p, t.n) : 0;
        if (!left) for (long k = cps; k < width; k++) sb_str(&out, zero ? "0" : " ");
        sb_add(&out, t.p ? t.p : "", t.n);
        if (left) for (long k = cps; k < width; k++) sb_str(&out, " ");
        free(t.p);
    }
    if (!C->st && !map && next < nargs) rerr(C, x, "not all arguments converted during string formatting");
    if (out.oom && !C->st) C->st = TOY_ERR_NOMEM;
    json_t *r = C->st ? NULL : json_stringn_nocheck(out.p ? out.p : "", out.n);
    free(out.p);
    return r;
}

/* Python's TypeErrors of `a in b`: `x in none`, `x in 5`, `1 in 'abc'`
 * (undefined is an empty iterable) */
static bool in_operands(struct ctx *C, const struct node *x, json_t *a, json_t *b) {
    b = unmark(b);
    a = unmark(a);
    if (C->st || !b) return !C->st;
    if (!(json_is_string(b) || json_is_array(b) || json_is_object(b))) { rerr(C, x, "the right of 'in' is not a container"); return false; }
    if (json_is_string(b) && !(a && json_is_string(a))) { rerr(C, x, "'in <string>' needs a string on the left"); return false; }
    return true;
}

/* One comparison of a chain: == != < > <= >= in notin. */
static bool compare_op(struct ctx *C, const struct node *x, const char *op, json_t *a, json_t *b) {
    if (!strcmp(op, "==")) return equal(a, b);
    if (!strcmp(op, "!=")) return !equal(a, b);
    if (!strcmp(op, "in")) return in_operands(C, x, a, b) && contains(b, a);
    if (!strcmp(op, "notin")) return in_operands(C, x, a, b) && !contains(b, a);
    int c = compare(C, x, a, b);
    return op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
}

/* Is `name` a method of Python's dict: 1 for those the immutable sandbox
 * lets through, 2 for the mutating ones it hides, 0 for a plain key */
static int dict_method(const char *name) {
    static const char *const safe[] = {"items", "keys", "values", "get", "copy", "fromkeys"};
    static const char *const mutating[] = {"update", "pop", "popitem", "setdefault", "clear"};
    for (size_t i = 0; i < sizeof safe / sizeof *safe; i++)
        if (!strcmp(name, safe[i])) return 1;
    for (size_t i = 0; i < sizeof mutating / sizeof *mutating; i++)
        if (!strcmp(name, mutating[i])) return 2;
    return 0;
}

/* Jinja2's Undefined can be printed, tested, iterated and compared, but an
 * attribute or item of it is an error, as a template rendered by Hugging
 * Face finds: `missing.x`, `d.no_key.x`, `missing[0]`. Evaluates x->a and
 * says whether it is defined; an error when not. */
static json_t *eval_defined(struct ctx *C, const struct node *x, bool *ok) {
    json_t *a = eval(C, x->a);
    if (is_undef(a)) { json_decref(a); a = NULL; }
    *ok = a != NULL;
    if (!a && !C->st) {
        const struct node *o = x->a;
        if (o->k == E_NAME || o->k == E_ATTR) rerr(C, x, "'%s' is undefined", o->str);
        else rerr(C, x, "an attribute or item of an undefined value");
    }
    return a;
}

/* Counts a step of the render and enters one level of nesting: false
 * (and the render fails) when that is over a limit. */
static bool enter(struct ctx *C, const struct node *x) {
    if (budget && ++budget->steps > MAX_STEPS) {
        rerr(C, x, "the template takes more than %llu steps to render", MAX_STEPS);
        return false;
    }
    if (budget && (++budget->entered & 255) == 0 && thread_cpu_seconds() - budget->cpu0 > MAX_CPU_SECONDS) {
        rerr(C, x, "the template takes more than %d s of CPU time to render", MAX_CPU_SECONDS);
        return false;
    }
    if (budget && budget->over) {
        rerr(C, x, "the template builds more than %zu MiB of text and lists", MAX_WORK >> 20);
        return false;
    }
    if (C->nest >= MAX_RENDER_NEST) {
        rerr(C, x, "the template nests more than %d levels deep", MAX_RENDER_NEST);
        return false;
    }
    C->nest++;
    return true;
}

static json_t *eval_node(struct ctx *C, const struct node *x);

static json_t *eval(struct ctx *C, const struct node *x) {
    if (C->st || !x || !enter(C, x)) return NULL;
    json_t *r = eval_node(C, x);
    C->nest--;
    return r;
}

static json_t *eval_node(struct ctx *C, const struct node *x) {
    bool ok;
    json_t *a, *b, *r = NULL;
    switch (x->k) {
    /* a fresh copy: the literal belongs to the parsed template, which other
     * threads may be rendering (jansson's refcount read is not atomic) */
    case E_LIT: return json_copy(x->lit);
    case E_NAME: {
        json_t *v = lookup(C, x->str);
        return v ? json_incref(v) : NULL;
    }
    case E_ATTR: {
        a = eval_defined(C, x, &ok);
        if (!ok) return NULL;
        if (a && json_is_object(a) && !is_namespace(a) && dict_method(x->str)) {
            /* Jinja2 looks for a Python attribute before a key: d.items is
             * dict.items even when d has a key 'items' (d['items'] is the
             * key), and the immutable sandbox hides the mutating methods */
            if (dict_method(x->str) == 1 && (r = json_object())) json_object_set_new_nocheck(r, METHOD_KEY, json_string(x->str));
        } else if (a && isdigit((unsigned char)x->str[0]) && (json_is_array(a) || json_is_object(a))) {
            /* x.1 is x[1], an int, as Jinja2's parser has it */
            json_t *k = json_integer(atoll(x->str));
            r = py_index(a, k);
            json_decref(k);
        } else if (a && json_is_object(a)) { json_t *v = unmark(json_object_get(a, x->str)); r = v ? json_incref(v) : NULL; }
        json_decref(a);
        return r;
    }
    case E_INDEX:
        a = eval_defined(C, x, &ok);
        if (!ok) return NULL;
        b = eval(C, x->b);
        r = py_index(a, b);
        json_decref(a);
        json_decref(b);
        return r;
    case E_SLICE: {
        a = eval_defined(C, x, &ok);
        if (!ok) return NULL;
        json_t *s = eval(C, x->b), *e = eval(C, x->c), *st = x->n ? eval(C, x->list[0]) : NULL;
        long long step = st && is_intlike(st) ? ival(st) : 1;
        if (step == 0) { rerr(C, x, "slice step cannot be zero"); goto slice_out; }
        if (a && (json_is_array(a) || json_is_string(a))) {
            json_t *items = to_list(a);
            long long n = (long long)json_array_size(items);
            long long lo, hi;
            /* Python slice semantics */
            if (step > 0) {
                lo = s && is_intlike(s) ? ival(s) : 0;
                hi = e && is_intlike(e) ? ival(e) : n;
                if (lo < 0) lo += n;
                if (hi < 0) hi += n;
                lo = lo < 0 ? 0 : lo > n ? n : lo;
                hi = hi < 0 ? 0 : hi > n ? n : hi;
            } else {
                lo = n - 1;
                hi = -1;
                if (s && is_intlike(s)) { lo = ival(s); if (lo < 0) lo += n; }
                if (e && is_intlike(e)) { hi = ival(e); if (hi < 0) hi += n; }
                lo = lo < -1 ? -1 : lo > n - 1 ? n - 1 : lo;
                hi = hi < -1 ? -1 : hi > n - 1 ? n - 1 : hi;
            }
            json_t *out = json_array();
            for (long long i = lo; step > 0 ? i < hi : i > hi;) {
                json_array_append(out, json_array_get(items, (size_t)i));
                if (__builtin_add_overflow(i, step, &i)) break;
            }
            json_decref(items);
            if (json_is_string(a)) {
                struct sbuf sb = {0};
                size_t i;
                json_t *c;
                json_array_foreach(out, i, c) sb_add(&sb, json_string_value(c), json_string_length(c));
                r = json_stringn_nocheck(sb.p ? sb.p : "", sb.n);
                free(sb.p);
                json_decref(out);
            } else {
                r = out;
            }
        }
    slice_out:
        json_decref(a); json_decref(s); json_decref(e); json_decref(st);
        return r;
    }
    case E_CALL: {
        const struct node *callee = x->a;
        if (callee->k == E_NAME) return call_global(C, x, callee->str);
        if (callee->k == E_ATTR) {
            a = eval(C, callee->a);
            if (is_undef(a)) { json_decref(a); a = NULL; }
            if (!a && !C->st) { rerr(C, x, "method '%s' called on an undefined value", callee->str); return NULL; }
            r = call_method(C, x, a, callee->str);
            json_decref(a);
            return r;
        }
        rerr(C, x, "this expression is not callable");
        return NULL;
    }
    case E_FILTER:
        a = eval(C, x->a);
        r = do_filter(C, x, a);
        json_decref(a);
        return r;
    case E_TEST: {
        a = eval(C, x->a);
        bool ok = do_test(C, x, a);
        json_decref(a);
        return C->st ? NULL : json_boolean(ok != x->negate);
    }
    case E_NEG:
    case E_POS:
        a = eval(C, x->a);
        if (!is_num(a)) { if (!C->st) rerr(C, x, "unary %c on a non-number", x->k == E_NEG ? '-' : '+'); json_decref(a); return NULL; }
        if (x->k == E_POS) return a;
        if (!json_is_real(a) && ival(a) == LLONG_MIN) { rerr(C, x, "integer overflow"); json_decref(a); return NULL; }
        r = json_is_real(a) ? json_real(-json_real_value(a)) : json_integer(-ival(a));
        json_decref(a);
        return r;
    case E_NOT:
        a = eval(C, x->a);
        r = json_boolean(!truthy(a));
        json_decref(a);
        return r;
    case E_AND:
        a = eval(C, x->a);
        if (!truthy(a)) return a;
        json_decref(a);
        return eval(C, x->b);
    case E_OR:
        a = eval(C, x->a);
        if (truthy(a)) return a;
        json_decref(a);
        return eval(C, x->b);
    case E_COND:
        a = eval(C, x->b);
        r = truthy(a) ? eval(C, x->a) : eval(C, x->c);
        json_decref(a);
        return r;
    case E_IN:
    case E_NOTIN:
        a = eval(C, x->a);
        b = eval(C, x->b);
        if (!in_operands(C, x, a, b)) { json_decref(a); json_decref(b); return NULL; }
        r = json_boolean(contains(b, a) == (x->k == E_IN));
        json_decref(a);
        json_decref(b);
        return r;
    case E_CMP: {
        /* a < b < c: each operand evaluated once, stopping at the first false */
        bool ok = true;
        a = eval(C, x->list[0]);
        for (int i = 0; i < x->nnames && ok && !C->st; i++) {
            b = eval(C, x->list[i + 1]);
            ok = !C->st && compare_op(C, x, x->names[i], a, b);
            json_decref(a);
            a = b;
        }
        json_decref(a);
        return C->st ? NULL : json_boolean(ok);
    }
    case E_LIST:
    case E_TUPLE:
        r = json_array();
        for (int i = 0; i < x->n; i++) {
            json_t *v = eval(C, x->list[i]);
            json_array_append_new(r, mark(v));
        }
        return x->k == E_TUPLE ? as_tuple(r) : r;
    case E_DICT:
        r = json_object();
        for (int i = 0; i < x->n; i++) {
            json_t *k = eval(C, x->list[i]), *v = eval(C, x->els[i]);
            json_t *ks = dict_key(k);
            json_object_set_new_nocheck(r, json_string_value(ks), mark(v));
            json_decref(k);
            json_decref(ks);
        }
        return r;
    case E_BIN: {
        a = eval(C, x->a);
        b = eval(C, x->b);
        const char *op = x->str;
        if (C->st) goto bin_out;
        if (!strcmp(op, "==")) r = json_boolean(equal(a, b));
        else if (!strcmp(op, "!=")) r = json_boolean(!equal(a, b));
        else if (!strcmp(op, "<")) r = json_boolean(compare(C, x, a, b) < 0);
        else if (!strcmp(op, ">")) r = json_boolean(compare(C, x, a, b) > 0);
        else if (!strcmp(op, "<=")) r = json_boolean(compare(C, x, a, b) <= 0);
        else if (!strcmp(op, ">=")) r = json_boolean(compare(C, x, a, b) >= 0);
        else if (!strcmp(op, "~")) {
            struct sbuf sb = {0};
            py_str(a, &sb);
            py_str(b, &sb);
            r = json_stringn_nocheck(sb.p ? sb.p : "", sb.n);
            free(sb.p);
        } else if (!strcmp(op, "+") && a && b && json_is_string(a) && json_is_string(b)) {
            struct sbuf sb = {0};
            sb_add(&sb, json_string_value(a), json_string_length(a));
            sb_add(&sb, json_string_value(b), json_string_length(b));
            r = json_stringn_nocheck(sb.p ? sb.p : "", sb.n);
            free(sb.p);
        } else if (!strcmp(op, "+") && a && b && json_is_array(a) && json_is_array(b)) {
            if (!take(8 * (json_array_size(a) + json_array_size(b)))) goto bin_out;
            r = json_copy(a);
            json_array_extend(r, b);
        } else if (!strcmp(op, "*") && a && b && (((json_is_string(a) || json_is_array(a)) && is_intlike(b)) ||
                                                 ((json_is_string(b) || json_is_array(b)) && is_intlike(a)))) {
            /* 'ab' * 3, 3 * 'ab', [0] * 3: repetition (none for n <= 0) */
            json_t *seq = is_intlike(a) ? b : a;
            long long times = ival(is_intlike(a) ? a : b);
            size_t unit = json_is_string(seq) ? json_string_length(seq) : json_array_size(seq);
            if (times > 0 && unit && (unsigned long long)times > (64u << 20) / unit) { rerr(C, x, "'*' result too large"); goto bin_out; }
            if (json_is_string(seq)) {
                /* charged and allocated once, then filled by doubling copies: a byte repeated 64 Mi
                 * times took 64 Mi appends (seconds; over libFuzzer's timeout in the fuzz build) */
                size_t n = times > 0 ? (size_t)times * unit : 0;
                char *p = take(n) ? malloc(n + 1) : NULL;
                if (!p) { C->st = TOY_ERR_NOMEM; goto bin_out; }
                if (n) memcpy(p, json_string_value(seq), unit);
                for (size_t have = unit; have < n;) {
                    size_t c = have < n - have ? have : n - have;
                    memcpy(p + have, p, c);
                    have += c;
                }
                p[n] = 0;
                r = json_stringn_nocheck(p, n);
                free(p);
            } else {
                if (times > 0 && !take(8 * (size_t)times * unit)) goto bin_out;
                r = json_array();
                for (long long i = 0; i < times; i++) json_array_extend(r, seq);
            }
        } else if (!strcmp(op, "%") && a && json_is_string(a)) {
            /* a tuple gives the arguments ('%s and %s' % (a, b)); any other
             * value is the one argument, a dict one to take %(key)s from */
            bool tuple = (x->b->k == E_TUPLE && b && json_is_array(b)) || is_tuple(b);
            size_t na = tuple ? json_array_size(b) : 1;
            json_t **args = malloc((na ? na : 1) * sizeof *args);
            if (!args) { C->st = TOY_ERR_NOMEM; goto bin_out; }
            for (size_t i = 0; i < na; i++) args[i] = tuple ? json_array_get(b, i) : b;
            r = py_percent(C, x, a, args, na, !tuple && b && json_is_object(b) && !is_undef(b) ? b : NULL);
            free(args);
        } else if (is_num(a) && is_num(b)) {
            bool ints = is_intlike(a) && is_intlike(b);
            double p = num(a), q = num(b);
            long long ia = ival(a), ib = ival(b), ir;
            /* Python ints do not overflow; a template that needs more than 64 bits is an error here */
            bool ovf = ints && ((!strcmp(op, "+") && __builtin_add_overflow(ia, ib, &ir)) ||
                                (!strcmp(op, "-") && __builtin_sub_overflow(ia, ib, &ir)) ||
                                (!strcmp(op, "*") && __builtin_mul_overflow(ia, ib, &ir)) ||
                                ((!strcmp(op, "//") || !strcmp(op, "%")) && ia == LLONG_MIN && ib == -1) ||
                                (!strcmp(op, "**") && (q < 0 || fabs(pow(p, q)) >= 9.2e18)));
            if (ovf && strcmp(op, "**")) { rerr(C, x, "integer overflow in '%s'", op); goto bin_out; }
            if (ovf && q >= 0) { rerr(C, x, "integer overflow in '**'"); goto bin_out; }
            if (!strcmp(op, "+")) r = ints ? json_integer(ia + ib) : json_real(p + q);
            else if (!strcmp(op, "-")) r = ints ? json_integer(ia - ib) : json_real(p - q);
            else if (!strcmp(op, "*")) r = ints ? json_integer(ia * ib) : json_real(p * q);
            else if (!strcmp(op, "/")) { if (q == 0) rerr(C, x, "division by zero"); else r = json_real(p / q); }
            else if (!strcmp(op, "//")) {
                if (q == 0) rerr(C, x, "division by zero");
                else if (ints) { long long d = ival(a) / ival(b); if ((ival(a) % ival(b) != 0) && ((ival(a) < 0) != (ival(b) < 0))) d--; r = json_integer(d); }
                else r = json_real(floor(p / q));
            } else if (!strcmp(op, "%")) {
                if (q == 0) rerr(C, x, "modulo by zero");
                else if (ints) { long long m = ival(a) % ival(b); if (m != 0 && ((m < 0) != (ival(b) < 0))) m += ival(b); r = json_integer(m); }
                else r = json_real(p - q * floor(p / q));
            } else if (!strcmp(op, "**")) r = ints && ib >= 0 ? json_integer((long long)pow(p, q)) : json_real(pow(p, q));
        } else {
            rerr(C, x, "unsupported operands for '%s'", op);
        }
    bin_out:
        json_decref(a);
        json_decref(b);
        return r;
    }
    default:
        rerr(C, x, "not an expression");
        return NULL;
    }
}

/* The filters and tests toy has, for `is filter` / `is test`; do_filter and
 * do_test refuse a name missing here before they look at it, so a filter
 * added to one but not the other fails its first use. */
static const char *const filter_names[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first",
    "float", "forceescape", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "slice",
    "sort", "string", "strip", "striptags", "sum", "title", "tojson", "trim", "truncate", "unique", "upper",
    "urlencode", "wordcount",
};
static const char *const test_names[] = {
    "<", "<=", "==", ">", ">=", "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even",
    "false", "filter", "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none",
    "number", "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper",
};

static bool known_name(const char *const *names, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], name)) return true;
    return false;
}

static bool do_test(struct ctx *C, const struct node *t, json_t *v) {
    const char *n = t->str;
    v = unmark(v);
    if (!known_name(test_names, sizeof test_names / sizeof *test_names, n)) { rerr(C, t, "unknown test '%s'", n); return false; }
    /* Jinja2's `value in env.filters` (or env.tests): false for what is
     * not a string, an error for what Python cannot hash */
    if (!strcmp(n, "filter") || !strcmp(n, "test")) {
        if (t->n || t->nkw) { rerr(C, t, "the test '%s' takes no arguments", n); return false; }
        if (v && (json_is_array(v) || (json_is_object(v) && !is_method(v) && !is_namespace(v)))) {
            rerr(C, t, "is %s: a %s is not hashable", n, json_is_array(v) ? "list" : "dict");
            return false;
        }
        if (!strv(v)) return false;
        return n[0] == 'f' ? known_name(filter_names, sizeof filter_names / sizeof *filter_names, strv(v))
                           : known_name(test_names, sizeof test_names / sizeof *test_names, strv(v));
    }
    if (!strcmp(n, "defined")) return v != NULL;
    if (!strcmp(n, "undefined")) return v == NULL;
    if (!strcmp(n, "none")) return v && json_is_null(v);
    if (!strcmp(n, "string")) return v && json_is_string(v);
    if (!strcmp(n, "number")) return is_num(v); /* Python's bool is a number */
    if (!strcmp(n, "integer")) return v && json_is_integer(v);
    if (!strcmp(n, "float")) return v && json_is_real(v);
    if (!strcmp(n, "boolean")) return v && json_is_boolean(v);
    if (!strcmp(n, "true")) return v && json_is_true(v);
    if (!strcmp(n, "false")) return v && json_is_false(v);
    if (!strcmp(n, "mapping")) return v && json_is_object(v) && !is_method(v) && !is_namespace(v);
    /* Jinja2's Undefined iterates as empty, so it is iterable */
    if (!strcmp(n, "iterable")) return !v || json_is_array(v) || (json_is_object(v) && !is_method(v) && !is_namespace(v)) || json_is_string(v);
    if (!strcmp(n, "sequence")) return v && (json_is_array(v) || json_is_string(v) || (json_is_object(v) && !is_method(v) && !is_namespace(v)));
    /* macros are the only callables a template can hold (see N_MACRO) */
    if (!strcmp(n, "callable")) return is_method(v) || (v && json_is_object(v) && json_is_integer(json_object_get(v, "__macro__")));
    if (!strcmp(n, "escaped")) return false; /* toy has no Markup strings */
    if (!strcmp(n, "lower") || !strcmp(n, "upper")) return py_is_case(v, n[0] == 'l');
    if (!strcmp(n, "even") || !strcmp(n, "odd")) return v && is_intlike(v) && (ival(v) % 2 == 0) == (n[0] == 'e');
    if (!strcmp(n, "divisibleby")) {
        json_t *d = arg(C, t, 0, NULL);
        bool ok = v && is_intlike(v) && d && is_intlike(d) && ival(d) != 0 && ival(v) % ival(d) == 0;
        json_decref(d);
        return ok;
    }
    if (!strcmp(n, "gt") || !strcmp(n, ">") || !strcmp(n, "lt") || !strcmp(n, "<") || !strcmp(n, "ge") ||
        !strcmp(n, ">=") || !strcmp(n, "le") || !strcmp(n, "<=") || !strcmp(n, "sameas")) {
        static const char *const alias[][2] = {{"gt", ">"}, {"lt", "<"}, {"ge", ">="}, {"le", "<="}};
        const char *op = n;
        for (size_t i = 0; i < 4; i++)
            if (!strcmp(n, alias[i][0])) op = alias[i][1];
        json_t *o = arg(C, t, 0, NULL);
        /* sameas is Python's `is`: for none/true/false (what a template can name), the same kind */
        bool ok = !strcmp(op, "sameas") ? (v && o && json_typeof(v) == json_typeof(o) && (json_is_null(v) || json_is_boolean(v)))
                                        : compare_op(C, t, op, v, o);
        json_decref(o);
        return ok;
    }
    if (!strcmp(n, "eq") || !strcmp(n, "equalto") || !strcmp(n, "==") || !strcmp(n, "ne") || !strcmp(n, "in")) {
        json_t *o = arg(C, t, 0, NULL);
        bool ok = !strcmp(n, "in") ? contains(o, v) : equal(v, o) == (strcmp(n, "ne") != 0);
        json_decref(o);
        return ok;
    }
    rerr(C, t, "unknown test '%s'", n);
    return false;
}

/* attribute path "a.b" of a value */
static json_t *attr_path(json_t *v, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    json_t *cur = v;
    for (char *save = NULL, *p = strtok_r(buf, ".", &save); p && cur; p = strtok_r(NULL, ".", &save)) {
        if (json_is_object(cur)) cur = json_object_get(cur, p);
        else if (json_is_array(cur) && isdigit((unsigned char)p[0])) cur = json_array_get(cur, (size_t)atoll(p));
        else cur = NULL;
        cur = unmark(cur);
    }
    return cur;
}

/* Order of two values for sort/unique/dictsort/max/min: numbers by value,
 * strings by bytes with ASCII letters folded unless case_sensitive (Jinja2
 * ignores case by default), lists item by item. */
static int cmp_values(json_t *a, json_t *b, bool case_sensitive) {
    if (is_num(a) && is_num(b)) return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a && b && json_is_string(a) && json_is_string(b)) {
        const unsigned char *p = (const unsigned char *)json_string_value(a), *q = (const unsigned char *)json_string_value(b);
        size_t n = json_string_length(a), m = json_string_length(b);
        for (size_t i = 0; i < n && i < m; i++) {
            int x = case_sensitive ? p[i] : tolower(p[i]), y = case_sensitive ? q[i] : tolower(q[i]);
            if (x != y) return x < y ? -1 : 1;
        }
        return n < m ? -1 : n > m;
    }
    if (a && b && json_is_array(a) && json_is_array(b)) {
        for (size_t i = 0; i < json_array_size(a) && i < json_array_size(b); i++) {
            int c = cmp_values(json_array_get(a, i), json_array_get(b, i), case_sensitive);
            if (c) return c;
        }
        return json_array_size(a) < json_array_size(b) ? -1 : json_array_size(a) > json_array_size(b);
    }
    return 0;
}

/* How sort and unique order keys: by cmp_values, reversed on request;
 * `typed` puts numbers before strings (unique's fast path, where a number
 * and a string are never equal). */
struct key_order {
    json_t **keys;
    bool reverse, case_sensitive, typed;
};

static int key_cmp(const struct key_order *o, size_t a, size_t b) {
    if (o->typed) {
        bool sa = json_is_string(o->keys[a]), sb = json_is_string(o->keys[b]);
        if (sa != sb) return sa ? 1 : -1;
    }
    int c = cmp_values(o->keys[a], o->keys[b], o->case_sensitive);
    return o->reverse ? -c : c;
}

/* Stable merge sort of the indices ix[0..n) (tmp: n more); equal keys keep
 * their order, reversed or not, as Python's sorted. */
static void merge_sort(size_t *ix, size_t *tmp, size_t n, const struct key_order *o) {
    size_t *src = ix, *dst = tmp;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = key_cmp(o, src[j], src[i]) < 0 ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        size_t *t = src;
        src = dst, dst = t;
    }
    if (src != ix) memcpy(ix, src, n * sizeof *ix);
}

/* Charges `units` comparisons to the render's steps (64 to a step: an
 * evaluated node costs about that); false, and the render fails, past
 * MAX_STEPS. Sorting a long list over and over in a loop is bounded so. */
static bool charge_compares(struct ctx *C, const struct node *x, unsigned long long units) {
    if (!budget) return true;
    scanned(units);
    if (budget->steps <= MAX_STEPS) return true;
    rerr(C, x, "the template takes more than %llu steps to render", MAX_STEPS);
    return false;
}

static unsigned long long log2_ceil(size_t n) {
    unsigned long long l = 0;
    while (l < 63 && ((size_t)1 << l) < n) l++;
    return l;
}

static json_t *do_filter(struct ctx *C, const struct node *f, json_t *v) {
    const char *n = f->str;
    v = unmark(v);
    if (C->st) return NULL;
    if (!known_name(filter_names, sizeof filter_names / sizeof *filter_names, n)) { rerr(C, f, "unknown filter '%s'", n); return NULL; }
    if (!strcmp(n, "trim") || !strcmp(n, "strip")) {
        if (!v || !json_is_string(v)) { json_t *s = str_of(v); json_t *r = strip_chars(s, NULL, true, true); json_decref(s); return r; }
        json_t *chars = arg(C, f, 0, "chars");
        json_t *r = strip_chars(v, chars, true, true);
        json_decref(chars);
        return r;
    }
    if (!strcmp(n, "length") || !strcmp(n, "count")) {
        if (!v) return json_integer(0);
        if (json_is_string(v)) return json_integer((json_int_t)utf8_count(json_string_value(v), json_string_length(v)));
        if (json_is_array(v)) return json_integer((json_int_t)json_array_size(v));
        if (json_is_object(v) && !is_method(v)) return json_integer((json_int_t)json_object_size(v));
        rerr(C, f, "length of a value that has none");
        return NULL;
    }
    if (!strcmp(n, "tojson")) {
        json_t *asc = arg(C, f, 0, "ensure_ascii"), *ind = arg(C, f, 1, "indent");
        json_t *sep = arg(C, f, 2, "separators"), *sk = arg(C, f, 3, "sort_keys");
        /* json.dumps: an int indent is that many spaces (none when <= 0, but
         * still the newlines), a string is itself */
        char spaces[257] = "";
        if (is_intlike(ind)) {
            long long w = ival(ind) < 0 ? 0 : ival(ind) > 256 ? 256 : ival(ind);
            memset(spaces, ' ', (size_t)w);
            spaces[w] = 0;
        }
        struct json_opts o = {.indent = strv(ind) ? strv(ind) : is_intlike(ind) ? spaces : NULL,
                              .sort_keys = truthy(sk), .ascii = truthy(asc)};
        o.item_sep = o.indent ? "," : ", ";
        o.key_sep = ": ";
        if (sep) {
            if (!json_is_array(sep) || json_array_size(sep) != 2 || !strv(json_array_get(sep, 0)) || !strv(json_array_get(sep, 1))) {
                rerr(C, f, "tojson: separators must be two strings");
            } else {
                o.item_sep = strv(json_array_get(sep, 0));
                o.key_sep = strv(json_array_get(sep, 1));
            }
        }
        struct sbuf b = {0};
        bool undef = false;
        if (!C->st) to_json(v, &b, &o, 0, &undef);
        json_decref(asc); json_decref(ind); json_decref(sep); json_decref(sk);
        if (C->st) { free(b.p); return NULL; }
        if (undef) { free(b.p); rerr(C, f, "tojson: the value holds something JSON cannot (undefined, a method, a namespace)"); return NULL; }
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        return r;
    }
    if (!strcmp(n, "upper") || !strcmp(n, "lower") || !strcmp(n, "title") || !strcmp(n, "capitalize")) {
        json_t *s = str_of(v);
        json_t *r = case_map(s, n[0] == 'l'   ? CASE_LOWER
                                : n[0] == 'u' ? CASE_UPPER
                                : n[0] == 't' ? CASE_TITLE_FILTER
                                              : CASE_CAPITALIZE);
        json_decref(s);
        return r;
    }
    if (!strcmp(n, "format")) {
        /* Jinja2's format is printf-style: fmt % args, or fmt % kwargs */
        if (f->n && f->nkw) { rerr(C, f, "format: positional and keyword arguments cannot be mixed"); return NULL; }
        json_t *s = v && json_is_string(v) ? json_incref(v) : str_of(v), *map = NULL, *r = NULL;
        json_t **pos = NULL, **kwv = NULL;
        if (eval_args(C, f, &pos, &kwv)) {
            if (f->nkw) {
                map = json_object();
                for (int k = 0; map && k < f->nkw; k++) json_object_set_new(map, f->kwn[k], mark(json_incref(kwv[k])));
                if (!map) C->st = TOY_ERR_NOMEM;
            }
            if (!C->st) r = py_percent(C, f, s, pos, (size_t)f->n, map);
        }
        free_args(f, pos, kwv);
        json_decref(map);
        json_decref(s);
        return r;
    }
    if (!strcmp(n, "string")) return str_of(v);
    if (!strcmp(n, "safe")) return v ? json_incref(v) : json_string("");
    if (!strcmp(n, "int")) {
        /* Jinja2: int(value, base), else int(float(value)), else the default */
        json_t *dflt = arg(C, f, 0, "default"), *base = arg(C, f, 1, "base");
        long long bv = base && is_intlike(base) ? ival(base) : 10, i = 0;
        json_t *r = NULL;
        double d = 0;
        bool ovf = false, use_default = false;
        if (v && json_is_string(v)) {
            const char *sv = json_string_value(v);
            size_t sl = json_string_length(v);
            if (bv >= 0 && bv <= 36 && bv != 1 && py_parse_int(sv, sl, (int)bv, &i, &ovf)) {
                if (ovf) rerr(C, f, "int: the value needs more than 64 bits");
                else r = json_integer(i);
            } else if (!py_parse_float(sv, sl, &d)) {
                use_default = true;
            }
        } else if (is_num(v)) {
            d = num(v);
        } else {
            use_default = true;
        }
        if (isnan(d)) use_default = true; /* int(nan) is a ValueError, which Jinja2 turns into the default */
        if (use_default) r = dflt ? json_incref(dflt) : json_integer(0);
        else if (!r && !C->st && !(fabs(d) < 9.2e18)) rerr(C, f, "int: the value needs more than 64 bits");
        else if (!r && !C->st) r = json_integer((long long)d);
        json_decref(dflt);
        json_decref(base);
        return r;
    }
    if (!strcmp(n, "float")) {
        double d;
        if (is_num(v)) return json_real(num(v));
        if (v && json_is_string(v) && py_parse_float(json_string_value(v), json_string_length(v), &d)) return json_real(d);
        json_t *dflt = arg(C, f, 0, "default");
        return dflt ? dflt : json_real(0.0);
    }
    if (!strcmp(n, "abs")) {
        if (is_intlike(v) && ival(v) == LLONG_MIN) { rerr(C, f, "integer overflow in abs"); return NULL; }
        return is_intlike(v) ? json_integer(llabs(ival(v))) : json_real(fabs(is_num(v) ? num(v) : 0));
    }
    if (!strcmp(n, "round")) {
        /* Python's round(): to the nearest, ties to even on the exact binary
         * value (2.675 is just below the tie, so 2.67), which printf's %.*f
         * also does; an int stays an int. ceil and floor give floats. */
        json_t *p = arg(C, f, 0, "precision"), *m = arg(C, f, 1, "method");
        long long prec = p && is_intlike(p) ? ival(p) : 0;
        const char *meth = strv(m) ? strv(m) : "common";
        double d = is_num(v) ? num(v) : 0, sc = pow(10, (double)prec);
        json_t *r = NULL;
        if (!strcmp(meth, "ceil")) r = json_real(ceil(d * sc) / sc);
        else if (!strcmp(meth, "floor")) r = json_real(floor(d * sc) / sc);
        else if (strcmp(meth, "common")) rerr(C, f, "round: method must be common, ceil or floor");
        else if (is_intlike(v) && prec >= 0) r = json_integer(ival(v));
        else if (prec >= 0 && prec < 300) {
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, d);
            r = json_real(strtod(buf, NULL));
        } else r = json_real(nearbyint(d * sc) / sc);
        json_decref(p);
        json_decref(m);
        return r;
    }
    if (!strcmp(n, "default") || !strcmp(n, "d")) {
        json_t *bo = arg(C, f, 1, "boolean");
        bool use = bo && truthy(bo) ? !truthy(v) : v == NULL;
        json_decref(bo);
        if (!use) return json_incref(v);
        json_t *d = arg(C, f, 0, "default_value");
        return d ? d : json_string("");
    }
    if (!strcmp(n, "first") || !strcmp(n, "last")) {
        json_t *l = to_list(v);
        size_t sz = json_array_size(l);
        json_t *r = sz ? json_incref(json_array_get(l, n[0] == 'f' ? 0 : sz - 1)) : NULL;
        json_decref(l);
        return r;
    }
    if (!strcmp(n, "list")) return to_list(v);
    if (!strcmp(n, "reverse")) {
        json_t *l = to_list(v), *r = json_array();
        for (size_t i = json_array_size(l); i > 0; i--) json_array_append(r, json_array_get(l, i - 1));
        json_decref(l);
        if (v && json_is_string(v)) {
            struct sbuf b = {0};
            size_t i;
            json_t *c;
            json_array_foreach(r, i, c) sb_add(&b, json_string_value(c), json_string_length(c));
            json_decref(r);
            r = json_stringn_nocheck(b.p ? b.p : "", b.n);
            free(b.p);
        }
        return r;
    }
    if (!strcmp(n, "sort") || !strcmp(n, "dictsort") || !strcmp(n, "unique") || !strcmp(n, "max") || !strcmp(n, "min")) {
        /* positional parameters: sort(reverse, case_sensitive, attribute),
         * dictsort(case_sensitive, by, reverse), unique/max/min(case_sensitive, attribute) */
        bool dict = n[0] == 'd', srt = n[0] == 's';
        json_t *rv = arg(C, f, srt ? 0 : dict ? 2 : -1, "reverse");
        json_t *cs = arg(C, f, srt ? 1 : 0, "case_sensitive");
        json_t *attr = dict ? NULL : arg(C, f, srt ? 2 : 1, "attribute");
        json_t *by = dict ? arg(C, f, 1, "by") : NULL;
        bool rev = truthy(rv), sens = truthy(cs), by_value = strv(by) && !strcmp(strv(by), "value");
        json_t *l, *r = NULL;
        if (dict) {
            l = json_array();
            const char *k;
            json_t *e;
            if (v && json_is_object(v)) json_object_foreach(v, k, e) json_array_append_new(l, pair(key_value(k), e));
        } else {
            l = to_list(v);
        }
        size_t sz = json_array_size(l);
        json_t **items = malloc((sz ? sz : 1) * sizeof *items), **keys = malloc((sz ? sz : 1) * sizeof *keys);
        if (!items || !keys) { C->st = TOY_ERR_NOMEM; goto sort_out; }
        for (size_t i = 0; i < sz; i++) {
            items[i] = json_array_get(l, i);
            keys[i] = dict ? json_array_get(items[i], by_value ? 1 : 0)
                    : strv(attr) ? attr_path(items[i], strv(attr))
                    : attr && is_intlike(attr) && json_is_array(items[i]) ? json_array_get(items[i], (size_t)ival(attr))
                    : items[i];
        }
        bool simple = true; /* every key a number or a string: unique can sort */
        for (size_t i = 0; i < sz && simple; i++) simple = is_num(keys[i]) || json_is_string(keys[i]);
        if (n[0] == 'u' && !simple) { /* the first of each set of equal keys, in order: pairwise */
            if (!charge_compares(C, f, (unsigned long long)sz * (sz ? sz - 1 : 0) / 2)) goto sort_out;
            r = json_array();
            for (size_t i = 0; i < sz; i++) {
                bool seen = false;
                for (size_t j = 0; j < i && !seen; j++)
                    seen = json_is_string(keys[i]) && json_is_string(keys[j]) ? !cmp_values(keys[i], keys[j], sens)
                                                                             : equal(keys[i], keys[j]);
                if (!seen) json_array_append(r, items[i]);
            }
        } else if (n[0] == 'u' || n[0] == 's' || n[0] == 'd') { /* sort, dictsort; unique by sorting */
            if (!charge_compares(C, f, (unsigned long long)sz * log2_ceil(sz))) goto sort_out;
            size_t *ix = malloc((sz ? sz : 1) * 2 * sizeof *ix);
            if (!ix) { C->st = TOY_ERR_NOMEM; goto sort_out; }
            for (size_t i = 0; i < sz; i++) ix[i] = i;
            struct key_order o = {.keys = keys, .reverse = n[0] != 'u' && rev, .case_sensitive = sens,
                                  .typed = n[0] == 'u'};
            merge_sort(ix, ix + sz, sz, &o);
            r = json_array();
            if (n[0] == 'u') { /* the first (lowest index) of each run of equal keys, in the list's order */
                bool *keep = calloc(sz ? sz : 1, 1);
                if (!keep) { free(ix); C->st = TOY_ERR_NOMEM; goto sort_out; }
                for (size_t i = 0; i < sz; i++)
                    if (i == 0 || key_cmp(&o, ix[i - 1], ix[i])) keep[ix[i]] = true;
                for (size_t i = 0; i < sz; i++)
                    if (keep[i]) json_array_append(r, items[i]);
                free(keep);
            } else {
                for (size_t i = 0; i < sz; i++) json_array_append(r, items[ix[i]]);
            }
            free(ix);
        } else if (n[0] == 'm') { /* max / min: the first extreme item */
            size_t best = 0;
            for (size_t i = 1; i < sz; i++) {
                int c = cmp_values(keys[i], keys[best], sens);
                if (n[1] == 'a' ? c > 0 : c < 0) best = i;
            }
            r = sz ? json_incref(items[best]) : NULL;
        }
    sort_out:
        free(items);
        free(keys);
        json_decref(l); json_decref(rv); json_decref(cs); json_decref(attr); json_decref(by);
        return r;
    }
    if (!strcmp(n, "sum")) {
        json_t *attr = arg(C, f, 0, "attribute"), *start = arg(C, f, 1, "start");
        json_t *l = to_list(v);
        bool ints = !start || is_intlike(start);
        long long is = start && is_intlike(start) ? ival(start) : 0;
        double ds = start && is_num(start) ? num(start) : 0;
        size_t i;
        json_t *e;
        json_array_foreach(l, i, e) {
            json_t *x = strv(attr) ? attr_path(e, strv(attr)) : e;
            if (!is_num(x)) { rerr(C, f, "sum: not a number"); break; }
            if (!is_intlike(x)) ints = false;
            else if (__builtin_add_overflow(is, ival(x), &is)) { rerr(C, f, "integer overflow in sum"); break; }
            ds += num(x);
        }
        json_decref(l); json_decref(attr); json_decref(start);
        return C->st ? NULL : ints ? json_integer(is) : json_real(ds);
    }
    if (!strcmp(n, "join")) {
        json_t *sep = arg(C, f, 0, "d"), *attr = arg(C, f, 1, "attribute");
        json_t *l = to_list(v);
        struct sbuf b = {0};
        size_t i;
        json_t *e;
        json_array_foreach(l, i, e) {
            if (i && strv(sep)) sb_add(&b, json_string_value(sep), json_string_length(sep));
            py_str(strv(attr) ? attr_path(e, strv(attr)) : e, &b);
        }
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        json_decref(l); json_decref(sep); json_decref(attr);
        return r;
    }
    if (!strcmp(n, "replace")) {
        json_t *a = arg(C, f, 0, NULL), *b = arg(C, f, 1, NULL), *c = arg(C, f, 2, "count");
        json_t *s = v && json_is_string(v) ? json_incref(v) : str_of(v);
        json_t *r = str_replace(s, a, b, c && is_intlike(c) ? ival(c) : -1);
        json_decref(s); json_decref(a); json_decref(b); json_decref(c);
        return r;
    }
    if (!strcmp(n, "items")) {
        json_t *r = json_array();
        const char *k;
        json_t *e;
        if (v && json_is_object(v)) json_object_foreach(v, k, e) json_array_append_new(r, pair(key_value(k), e));
        return r;
    }
    if (!strcmp(n, "map")) {
        json_t *attr = arg(C, f, -1, "attribute"), *dflt = arg(C, f, -1, "default");
        json_t *fname = attr ? NULL : arg(C, f, 0, NULL);
        json_t *l = to_list(v), *r = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(l, i, e) {
            json_t *m = NULL;
            if (strv(attr) || is_intlike(attr)) {
                /* attribute=1 indexes lists; an item without it maps to undefined (or the default) */
                if (strv(attr)) { m = attr_path(e, strv(attr)); if (m) json_incref(m); }
                else m = py_index(e, attr);
                if (!m && dflt) m = json_incref(dflt);
            }
            else if (strv(fname)) {
                struct node tmp = *f;
                tmp.str = (char *)strv(fname);
                tmp.list = f->list + 1; /* map('default', 'z'): the rest are the filter's arguments */
                tmp.n = f->n - 1;
                m = do_filter(C, &tmp, e);
            }
            json_array_append_new(r, mark(m));
        }
        json_decref(l); json_decref(attr); json_decref(dflt); json_decref(fname);
        return r;
    }
    if (!strcmp(n, "selectattr") || !strcmp(n, "rejectattr") || !strcmp(n, "select") || !strcmp(n, "reject")) {
        bool byattr = strstr(n, "attr") != NULL, sel = n[0] == 's';
        json_t *attr = byattr ? arg(C, f, 0, NULL) : NULL;
        json_t *test = arg(C, f, byattr ? 1 : 0, NULL);
        json_t *l = to_list(v), *r = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(l, i, e) {
            json_t *val = byattr ? (strv(attr) ? attr_path(e, strv(attr)) : NULL) : e;
            bool ok;
            if (strv(test)) {
                struct node tmp = {.k = E_TEST, .line = f->line, .str = (char *)strv(test)};
                struct node *extra[1];
                int base = byattr ? 2 : 1;
                if (f->n > base) { extra[0] = f->list[base]; tmp.list = extra; tmp.n = 1; }
                ok = do_test(C, &tmp, val);
            } else {
                ok = truthy(val);
            }
            if (ok == sel) json_array_append(r, e);
        }
        json_decref(l); json_decref(attr); json_decref(test);
        return r;
    }
    if (!strcmp(n, "indent")) {
        /* Jinja2's: the text plus a newline is split into lines as
         * str.splitlines() does and joined with "\n"; each line after the
         * first is indented unless empty (blank=true: all of them), and
         * first=true indents the result's start too */
        if (!v || !json_is_string(v)) { rerr(C, f, "indent: the value is not a string"); return NULL; }
        json_t *w = arg(C, f, 0, "width"), *first = arg(C, f, 1, "first"), *blank = arg(C, f, 2, "blank");
        long long width = w && is_intlike(w) ? ival(w) : 4;
        if (width < 0 || width > 4096) width = width < 0 ? 0 : 4096;
        struct sbuf pad = {0};
        if (strv(w)) sb_str(&pad, strv(w));
        else for (long long k = 0; k < width; k++) sb_add(&pad, " ", 1);
        const char *ind = pad.p ? pad.p : "";
        json_t *s = str_of(v);
        struct sbuf b = {0};
        sb_add(&b, json_string_value(s), json_string_length(s));
        sb_str(&b, "\n");
        json_t *whole = json_stringn_nocheck(b.p, b.n);
        free(b.p);
        b = (struct sbuf){0};
        json_t *lines = whole ? split_lines(whole, false) : NULL;
        size_t i;
        json_t *ln;
        if (truthy(first)) sb_str(&b, ind);
        json_array_foreach(lines, i, ln) {
            if (i) sb_str(&b, "\n");
            if (i && (json_string_length(ln) || truthy(blank))) sb_str(&b, ind);
            sb_add(&b, json_string_value(ln), json_string_length(ln));
        }
        json_t *r = b.oom ? NULL : json_stringn_nocheck(b.p ? b.p : "", b.n);
        if (b.oom || pad.oom) C->st = TOY_ERR_NOMEM;
        free(b.p);
        free(pad.p);
        json_decref(lines); json_decref(whole);
        json_decref(s); json_decref(w); json_decref(first); json_decref(blank);
        return r;
    }
    if (!strcmp(n, "wordcount")) {
        json_t *s = str_of(v);
        long long c = 0;
        const char *p = json_string_value(s);
        bool in_word = false;
        for (size_t i = 0, len = json_string_length(s), l; i < len; i += l) {
            bool sp = (l = space_at(p + i, len - i)) != 0;
            if (!sp) cp_at(p + i, len - i, &l);
            if (!sp && !in_word) c++;
            in_word = !sp;
        }
        json_decref(s);
        return json_integer(c);
    }
    if (!strcmp(n, "truncate")) {
        /* Jinja2's: text within length + leeway stays; else cut to leave room
         * for `end`, at the last space unless killwords */
        json_t *ln = arg(C, f, 0, "length"), *kw = arg(C, f, 1, "killwords"), *end = arg(C, f, 2, "end");
        json_t *lw = arg(C, f, 3, "leeway");
        long long length = ln && is_intlike(ln) ? ival(ln) : 255, leeway = lw && is_intlike(lw) ? ival(lw) : 5;
        const char *e = strv(end) ? strv(end) : "...";
        size_t el = strv(end) ? json_string_length(end) : 3;
        long long ecp = (long long)utf8_count(e, el);
        json_t *r = NULL;
        if (!v || !json_is_string(v)) rerr(C, f, "truncate: not a string");
        else if (length < ecp) rerr(C, f, "truncate: expected length >= %lld, got %lld", ecp, length);
        else {
            const char *s = json_string_value(v);
            size_t sn = json_string_length(v);
            if ((long long)utf8_count(s, sn) <= length + leeway) r = json_incref(v);
            else {
                size_t cut = utf8_offset(s, sn, (size_t)(length - ecp));
                if (!truthy(kw)) { /* rsplit(' ', 1)[0] */
                    const char *sp = NULL;
                    for (size_t i = 0; i < cut; i++) if (s[i] == ' ') sp = s + i;
                    if (sp) cut = (size_t)(sp - s);
                }
                struct sbuf b = {0};
                sb_add(&b, s, cut);
                sb_add(&b, e, el);
                r = json_stringn_nocheck(b.p ? b.p : "", b.n);
                free(b.p);
            }
        }
        json_decref(ln); json_decref(kw); json_decref(end); json_decref(lw);
        return r;
    }
    if (!strcmp(n, "center")) {
        json_t *w = arg(C, f, 0, "width");
        long long width = w && is_intlike(w) ? ival(w) : 80;
        json_decref(w);
        json_t *s = str_of(v), *r = pad_str(s, width, PAD_CENTER, " ", 1);
        json_decref(s);
        return r;
    }
    if (!strcmp(n, "batch") || !strcmp(n, "slice")) {
        /* batch(n): chunks of n, the last filled up with fill_with if given;
         * slice(n): n columns, the first len % n one longer (the others get
         * fill_with, if given) */
        json_t *cnt = arg(C, f, 0, n[0] == 'b' ? "linecount" : "slices"), *fill = arg(C, f, 1, "fill_with");
        long long k = cnt && is_intlike(cnt) ? ival(cnt) : 0;
        json_t *l = to_list(v), *r = NULL;
        long long len = (long long)json_array_size(l);
        if (k <= 0) rerr(C, f, "%s: the count must be positive", n);
        else if (n[0] == 'b') {
            /* k can be anything up to LLONG_MAX: walk the items, not the
             * row (i + k could overflow), and charge the fill to the budget */
            r = json_array();
            for (long long i = 0; i < len; i = k > len - i ? len : i + k) {
                json_t *row = json_array();
                long long end = k > len - i ? len : i + k;
                for (long long j = i; j < end; j++) json_array_append(row, json_array_get(l, (size_t)j));
                if (k > len - i && fill && !json_is_null(fill)) {
                    long long pad = k - (len - i);
                    if ((unsigned long long)pad > MAX_WORK / 8 || !take(8 * (size_t)pad)) over_budget();
                    else for (long long j = 0; j < pad; j++) json_array_append(row, fill);
                }
                json_array_append_new(r, row);
            }
        } else {
            r = json_array();
            long long per = len / k, extra = len % k, offset = 0;
            if (!take(64 * (size_t)(k < 1000001 ? k : 1000001))) k = 0; /* a list per column */
            for (long long s = 0; s < k && s <= 1000000; s++) {
                long long start = offset + s * per;
                if (s < extra) offset++;
                long long stop = offset + (s + 1) * per;
                json_t *col = json_array();
                for (long long j = start; j < stop; j++) json_array_append(col, json_array_get(l, (size_t)j));
                if (fill && !json_is_null(fill) && s >= extra) json_array_append(col, fill);
                json_array_append_new(r, col);
            }
        }
        json_decref(l); json_decref(cnt); json_decref(fill);
        return r;
    }
    if (!strcmp(n, "attr")) {
        /* Python's getattr: JSON values have methods but no data attributes
         * (a dict's keys are items), so this is always undefined */
        return NULL;
    }
    if (!strcmp(n, "escape") || !strcmp(n, "e") || !strcmp(n, "forceescape")) {
        /* markupsafe's escape of str(value). toy keeps no "safe" marking,
         * so escaping twice escapes twice, where Jinja2 would not */
        json_t *s = str_of(v);
        const char *p = json_string_value(s);
        struct sbuf b = {0};
        for (size_t i = 0, len = json_string_length(s); i < len; i++) {
            switch (p[i]) {
            case '&': sb_str(&b, "&amp;"); break;
            case '<': sb_str(&b, "&lt;"); break;
            case '>': sb_str(&b, "&gt;"); break;
            case '"': sb_str(&b, "&#34;"); break;
            case '\'': sb_str(&b, "&#39;"); break;
            default: sb_add(&b, p + i, 1);
            }
        }
        json_decref(s);
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        return r;
    }
    if (!strcmp(n, "striptags")) {
        /* markupsafe's: drop <!-- comments --> and <tags>, collapse white
         * space to single spaces, then unescape the common entities (Python's
         * html.unescape knows every HTML5 name; toy knows the XML five, &nbsp;
         * and numeric references) */
        json_t *s = str_of(v);
        const char *p = json_string_value(s);
        size_t len = json_string_length(s);
        struct sbuf t = {0}, w = {0}, b = {0};
        for (size_t i = 0; i < len && !t.oom;) { /* comments, a search each (not a pass per character) */
            const char *open = find_bytes(p + i, len - i, "<!--", 4);
            const char *close = open ? find_bytes(open + 4, len - (size_t)(open + 4 - p), "-->", 3) : NULL;
            if (!close) { /* no comment closes after here: the rest is text */
                sb_add(&t, p + i, len - i);
                break;
            }
            sb_add(&t, p + i, (size_t)(open - (p + i)));
            i = (size_t)(close - p) + 3;
        }
        for (size_t i = 0; i < t.n && !w.oom;) { /* tags, after comments are gone: '<' to the next '>' */
            const char *open = memchr(t.p + i, '<', t.n - i);
            const char *close = open ? memchr(open + 1, '>', t.n - (size_t)(open + 1 - t.p)) : NULL;
            if (!close) { /* no tag closes after here (a search per '<' was quadratic): the rest is text */
                sb_add(&w, t.p + i, t.n - i);
                break;
            }
            sb_add(&w, t.p + i, (size_t)(open - (t.p + i)));
            i = (size_t)(close - t.p) + 1;
        }
        json_t *ws = json_stringn_nocheck(w.p ? w.p : "", w.n);
        { /* " ".join(value.split()) */
            const char *q = json_string_value(ws);
            size_t qn = json_string_length(ws), i = 0;
            bool any = false;
            while (i < qn) {
                for (size_t l; i < qn && (l = space_at(q + i, qn - i));) i += l;
                if (i >= qn) break;
                size_t e = i;
                while (e < qn && !space_at(q + e, qn - e)) { size_t l; cp_at(q + e, qn - e, &l); e += l; }
                if (any) sb_str(&b, " ");
                any = true;
                for (size_t j = i; j < e;) { /* unescape while copying */
                    static const char *const ent[][2] = {{"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                                                         {"&apos;", "'"}, {"&nbsp;", "\xc2\xa0"}};
                    bool done = false;
                    for (size_t k = 0; k < sizeof ent / sizeof ent[0] && !done; k++) {
                        size_t el = strlen(ent[k][0]);
                        if (e - j >= el && !memcmp(q + j, ent[k][0], el)) { sb_str(&b, ent[k][1]); j += el; done = true; }
                    }
                    if (!done && q[j] == '&' && j + 2 < e && q[j + 1] == '#') {
                        bool hex = q[j + 2] == 'x' || q[j + 2] == 'X';
                        char *endp;
                        long c = strtol(q + j + 2 + hex, &endp, hex ? 16 : 10);
                        if (endp > q + j + 2 + hex && endp < q + e && *endp == ';' && c > 0 && c <= 0x10FFFF) {
                            utf8proc_uint8_t enc[4];
                            sb_add(&b, (const char *)enc, (size_t)utf8proc_encode_char((utf8proc_int32_t)c, enc));
                            j = (size_t)(endp - q) + 1;
                            done = true;
                        }
                    }
                    if (!done) { sb_add(&b, q + j, 1); j++; }
                }
                i = e;
            }
        }
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(t.p); free(w.p); free(b.p);
        json_decref(ws); json_decref(s);
        return r;
    }
    if (!strcmp(n, "urlencode")) {
        /* percent-encoding of UTF-8 bytes, '/' kept; a dict (or list of
         * pairs) becomes a query string, with '+' for spaces and '/' encoded */
        json_t *pairs = NULL;
        if (v && json_is_object(v)) {
            pairs = json_array();
            const char *k;
            json_t *e;
            json_object_foreach(v, k, e) json_array_append_new(pairs, pair(key_value(k), e));
        }
        struct sbuf b = {0};
        size_t np = pairs ? json_array_size(pairs) : 1;
        for (size_t i = 0; i < np; i++) {
            if (i) sb_str(&b, "&");
            for (int half = 0; half < (pairs ? 2 : 1); half++) {
                if (half) sb_str(&b, "=");
                json_t *s = str_of(pairs ? json_array_get(json_array_get(pairs, i), (size_t)half) : v);
                const unsigned char *p = (const unsigned char *)json_string_value(s);
                for (size_t j = 0, len = json_string_length(s); j < len; j++) {
                    char hx[4];
                    if (isalnum(p[j]) || strchr("_.-~", p[j]) || (p[j] == '/' && !pairs)) sb_add(&b, (const char *)p + j, 1);
                    else if (p[j] == ' ' && pairs) sb_str(&b, "+");
                    else { snprintf(hx, sizeof hx, "%%%02X", p[j]); sb_str(&b, hx); }
                }
                json_decref(s);
            }
        }
        json_decref(pairs);
        json_t *r = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        return r;
    }
    rerr(C, f, "unknown filter '%s'", n);
    return NULL;
}

/* Applies the filter chain `top` = f_k(...f_1(placeholder)) to v (stolen),
 * innermost first, for {% filter %} and {% set x | f %}: the AST stays
 * untouched, so templates render from many threads at once. */
static json_t *apply_chain(struct ctx *C, const struct node *top, const struct node *placeholder, json_t *v) {
    const struct node *chain[32];
    int nc = 0;
    for (const struct node *f = top; f && f != placeholder && nc < 32; f = f->a) chain[nc++] = f;
    for (int i = nc - 1; i >= 0 && !C->st; i--) {
        json_t *r = do_filter(C, chain[i], v);
        json_decref(v);
        v = r;
    }
    return v;
}

static void set_target(struct ctx *C, const struct node *x, json_t *v /* stolen */) {
    if (x->str) { /* ns.attr = v */
        json_t *ns = lookup(C, x->names[0]);
        if (!is_namespace(ns)) { rerr(C, x, "cannot assign attribute on '%s', which is not a namespace", x->names[0]); json_decref(v); return; }
        if (reaches(v, ns, 0)) {
            rerr(C, x, "cannot set %s.%s to a value that holds %s itself (a reference cycle)", x->names[0], x->str,
                 x->names[0]);
            json_decref(v);
            return;
        }
        json_object_set_new(ns, x->str, mark(v));
        return;
    }
    if (x->nnames == 1) { assign(C, x->names[0], v); return; }
    if (!v || !json_is_array(v) || (int)json_array_size(v) != x->nnames) {
        rerr(C, x, "cannot unpack into %d names", x->nnames);
        json_decref(v);
        return;
    }
    for (int i = 0; i < x->nnames; i++) assign(C, x->names[i], json_incref(json_array_get(v, (size_t)i)));
    json_decref(v);
}

/* Runs the for loop `x` over `it` (borrowed) at recursion depth `depth` (0
 * for the loop itself, one more for each loop(...) of a recursive loop). */
static void exec_for(struct ctx *C, const struct node *x, json_t *it, int depth, struct sbuf *out) {
    it = unmark(it);
    if (C->st) return;
    if (it && !json_is_array(it) && !json_is_object(it) && !json_is_string(it)) {
        rerr(C, x, "cannot iterate over this value");
        return;
    }
    json_t *items = to_list(it);
    /* the `if` filter applies before loop.* counts; it sees the loop
     * variables in a scope of its own */
    if (x->b) {
        json_t *kept = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(items, i, e) {
            if (!push_scope(C)) break;
            if (x->nnames == 1) assign(C, x->names[0], json_incref(e));
            else if (json_is_array(e) && (int)json_array_size(e) == x->nnames)
                for (int k = 0; k < x->nnames; k++) assign(C, x->names[k], json_incref(json_array_get(e, (size_t)k)));
            json_t *c = eval(C, x->b);
            if (truthy(c)) json_array_append(kept, e);
            json_decref(c);
            pop_scope(C);
        }
        json_decref(items);
        items = kept;
    }
    /* Jinja2 gives every iteration a scope of its own: a {% set %} in the
     * body is gone at the next iteration and after the loop (state that
     * must carry goes through namespace()). The else branch runs unless
     * some iteration ran its body to the end: an iteration left by break
     * or continue does not count, as in Jinja2's generated code. */
    size_t n = json_array_size(items);
    int base = C->nscopes;
    bool completed = false;
    json_t *changed = json_array(); /* loop.changed()'s last arguments, shared by the iterations */
    for (size_t i = 0; i < n && !C->st; i++) {
        if (budget && (budget->steps += ITER_STEPS) > MAX_STEPS) {
            rerr(C, x, "the template takes more than %llu steps to render", MAX_STEPS);
            break;
        }
        json_t *e = json_array_get(items, i);
        json_t *loop = json_pack("{sIsIsIsIsbsbsIsIsI}", "index", (json_int_t)i + 1, "index0", (json_int_t)i, "revindex",
                                 (json_int_t)(n - i), "revindex0", (json_int_t)(n - i - 1), "first", i == 0, "last",
                                 i + 1 == n, "length", (json_int_t)n, "depth", (json_int_t)depth + 1, "depth0", (json_int_t)depth);
        if (loop && x->recursive) {
            /* loop(items) renders this loop again, in the scopes the loop itself sees */
            json_object_set_new_nocheck(loop, LOOP_NODE_KEY, json_integer((json_int_t)node_index(C, x)));
            json_object_set_new_nocheck(loop, LOOP_BASE_KEY, json_integer(base));
        }
        if (loop) {
            if (changed) json_object_set_nocheck(loop, LOOP_CHANGED_KEY, changed);
            if (i > 0) json_object_set(loop, "previtem", json_array_get(items, i - 1));
            if (i + 1 < n) json_object_set(loop, "nextitem", json_array_get(items, i + 1));
        }
        if (!push_scope(C)) { json_decref(loop); break; }
        assign(C, "loop", loop);
        if (x->nnames == 1) assign(C, x->names[0], json_incref(e));
        else {
            if (!json_is_array(e) || (int)json_array_size(e) != x->nnames) {
                rerr(C, x, "cannot unpack loop item into %d names", x->nnames);
                pop_scope(C);
                break;
            }
            for (int k = 0; k < x->nnames; k++) assign(C, x->names[k], json_incref(json_array_get(e, (size_t)k)));
        }
        exec_body(C, x->list, x->n, out);
        pop_scope(C);
        if (!C->brk) completed = true;
        if (C->brk == 1) { C->brk = 0; break; }
        C->brk = 0;
    }
    if (!completed && !C->st) exec_body(C, x->els, x->nels, out);
    json_decref(items);
    json_decref(changed);
}

static void exec_node(struct ctx *C, const struct node *x, struct sbuf *out);

static void exec(struct ctx *C, const struct node *x, struct sbuf *out) {
    if (C->st || C->brk || !enter(C, x)) return;
    exec_node(C, x, out);
    C->nest--;
}

static void exec_node(struct ctx *C, const struct node *x, struct sbuf *out) {
    switch (x->k) {
    case N_TEXT: sb_str(out, x->str); break;
    case N_OUT: {
        json_t *v = eval(C, x->a);
        py_str(v, out);
        json_decref(v);
        break;
    }
    case N_IF: {
        json_t *c = eval(C, x->a);
        bool t = truthy(c);
        json_decref(c);
        if (C->st) return;
        if (t) exec_body(C, x->list, x->n, out);
        else exec_body(C, x->els, x->nels, out);
        break;
    }
    case N_FOR: {
        json_t *it = eval(C, x->a);
        exec_for(C, x, it, 0, out);
        json_decref(it);
        break;
    }
    case N_SET: set_target(C, x, eval(C, x->a)); break;
    case N_SETBLOCK: {
        struct sbuf b = {0};
        exec_body(C, x->list, x->n, &b);
        json_t *v = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        if (x->a) v = apply_chain(C, x->a, x->b, v);
        if (C->st) { json_decref(v); break; }
        set_target(C, x, v);
        break;
    }
    case N_MACRO: {
        /* a macro is a dict naming its node, so it can be looked up like a variable */
        assign(C, x->str, json_pack("{sI}", "__macro__", (json_int_t)node_index(C, x)));
        break;
    }
    case N_CALLBLOCK: {
        const struct node *call = x->a;
        if (call->a->k != E_NAME) { rerr(C, x, "{%% call %%} needs a macro name"); return; }
        const struct node *mac = find_macro(C, call->a->str);
        if (!mac) { rerr(C, x, "'%s' is not a macro", call->a->str); return; }
        struct call_site cs = {.body = x, .scopes = C->scopes, .nscopes = C->nscopes, .outer = C->caller};
        json_t *r = call_macro(C, mac, call, &cs);
        py_str(r, out);
        json_decref(r);
        break;
    }
    case N_FILTERBLOCK: {
        /* x->a is the filter chain f_k(...f_1(placeholder)) */
        struct sbuf b = {0};
        exec_body(C, x->list, x->n, &b);
        json_t *v = json_stringn_nocheck(b.p ? b.p : "", b.n);
        free(b.p);
        v = apply_chain(C, x->a, x->b, v);
        py_str(v, out);
        json_decref(v);
        break;
    }
    case N_WITH: {
        /* the values see the enclosing scope ({% with a = 1, b = a %} takes
         * the outer a), the body a scope of its own */
        json_t **vals = calloc((size_t)x->nkw + 1, sizeof *vals);
        if (!vals) { C->st = TOY_ERR_NOMEM; snprintf(C->err, sizeof C->err, "out of memory"); return; }
        for (int i = 0; i < x->nkw; i++) vals[i] = eval(C, x->kwv[i]);
        if (!C->st && push_scope(C)) {
            for (int i = 0; i < x->nkw; i++) { assign(C, x->kwn[i], vals[i]); vals[i] = NULL; }
            exec_body(C, x->list, x->n, out);
            pop_scope(C);
        }
        for (int i = 0; i < x->nkw; i++) json_decref(vals[i]);
        free(vals);
        break;
    }
    case N_BREAK: C->brk = 1; break;
    case N_CONTINUE: C->brk = 2; break;
    default: rerr(C, x, "not a statement"); break;
    }
}

static void exec_body(struct ctx *C, struct node *const *body, int n, struct sbuf *out) {
    for (int i = 0; i < n && !C->st && !C->brk; i++) exec(C, body[i], out);
}

enum toy_status toy_jinja_render(const struct jinja_template *t, json_t *vars, char **out) {
    *out = NULL;
    struct ctx C = {.tpl = t};
    if (!push_scope(&C)) return toy_error(TOY_ERR_NOMEM, "chat template: out of memory");
    if (vars) json_object_update(C.scopes[0], vars);
    struct sbuf b = {0};
    struct tuple_set ts = {0}, *saved_tuples = tuples;
    struct budget bud = {.cpu0 = thread_cpu_seconds()}, *saved_budget = budget;
    tuples = &ts;
    budget = &bud;
    exec_body(&C, t->body, t->n, &b);
    while (C.nscopes) pop_scope(&C);
    free(C.scopes);
    tuples = saved_tuples;
    budget = saved_budget;
    tuples_free(&ts);
    if (bud.over && (!C.st || C.st == TOY_ERR_NOMEM)) { /* sb_add reports the limit as its out-of-memory flag */
        C.st = TOY_ERR_FORMAT;
        snprintf(C.err, sizeof C.err, "the template builds more than %zu MiB of text and lists", MAX_WORK >> 20);
    }
    if (b.oom && !C.st) { C.st = TOY_ERR_NOMEM; snprintf(C.err, sizeof C.err, "out of memory"); }
    /* strings hold U+0000 (JSON "\u0000", "\0" in a literal), but the result
     * is a C string: say so rather than return the text cut at the NUL */
    if (!C.st && b.p && memchr(b.p, 0, b.n)) {
        C.st = TOY_ERR_UNSUPPORTED;
        snprintf(C.err, sizeof C.err, "the rendered text contains a NUL character (U+0000), which toy's C-string "
                 "result cannot hold");
    }
    if (C.st) {
        free(b.p);
        return toy_error(C.st, "chat template: %s", C.err);
    }
    *out = b.p ? b.p : strdup("");
    if (!*out) return toy_error(TOY_ERR_NOMEM, "chat template: out of memory");
    return TOY_OK;
}
