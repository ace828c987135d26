/* jinja-parse.c: the Jinja2-subset lexer and parser of chat templates:
 * tags {{ }}, {% %}, {# #} with Hugging Face's trim_blocks and lstrip_blocks
 * and the -/+ whitespace modifiers, {% raw %}, and a recursive-descent
 * parser to the AST in jinja.h. Operator precedence is Jinja2's
 * (jinja2/parser.py): ternary < or < and < not < comparisons/in (chained,
 * as in Python) < + - < ~ < * / // % < ** < unary sign < postfix (. [] ())
 * < filters and `is` tests, where a sign binds to its operand before the
 * filters (`-3|abs` is 3) and tests bind like filters (`1 + 1 is number`
 * is 1 + True). "}}" inside an
 * open bracket does not close a tag, as in Jinja's lexer.
 */
#include "jinja.h"
#include "tokenizer-impl.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- lexer ---- */

enum tk { TK_EOF, TK_TEXT, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP };

struct token {
    enum tk k;
    char *s; /* TEXT/NAME/STRING/OP text (owned) */
    size_t len;
    long long i;
    double f;
    int line;
};

struct lexer {
    const char *src;
    size_t n, pos;
    int line;
    struct token *toks;
    size_t ntok, cap;
    char err[256];
};

static bool lex_push(struct lexer *L, struct token t) {
    if (L->ntok == L->cap) {
        size_t c = L->cap ? L->cap * 2 : 256;
        struct token *p = realloc(L->toks, c * sizeof *p);
        if (!p) { snprintf(L->err, sizeof L->err, "out of memory"); free(t.s); return false; }
        L->toks = p;
        L->cap = c;
    }
    L->toks[L->ntok++] = t;
    return true;
}

static int count_lines(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

static bool lex_text(struct lexer *L, const char *s, size_t n, int line) {
    if (!n) return true;
    char *c = malloc(n + 1);
    if (!c) { snprintf(L->err, sizeof L->err, "out of memory"); return false; }
    memcpy(c, s, n);
    c[n] = 0;
    return lex_push(L, (struct token){.k = TK_TEXT, .s = c, .len = n, .line = line});
}

/* Python's string-literal escapes (Jinja2 decodes literals with
 * "unicode-escape"): \n \t \r \a \b \f \v \\ \' \", up to three octal
 * digits, \xHH, \uXXXX, \UXXXXXXXX (written out as UTF-8), a backslash-newline
 * that joins lines; any other escape, \d say, stays as written, backslash
 * included. `s` is the text after the backslash; appends to b[*o] and
 * returns how many characters of `s` it used. */
static size_t unescape(const char *s, size_t n, char *b, size_t *o) {
    static const char from[] = "ntrabfv\\'\"\n", to[] = "\n\t\r\a\b\f\v\\'\"";
    const char *f = strchr(from, s[0]);
    if (f && s[0]) {
        if (s[0] != '\n') b[(*o)++] = to[f - from];
        return 1;
    }
    unsigned long cp = 0;
    size_t used = 0;
    if (s[0] >= '0' && s[0] <= '7') {
        while (used < 3 && used < n && s[used] >= '0' && s[used] <= '7') cp = cp * 8 + (unsigned long)(s[used++] - '0');
    } else if (s[0] == 'x' || s[0] == 'u' || s[0] == 'U') {
        size_t want = s[0] == 'x' ? 2 : s[0] == 'u' ? 4 : 8;
        for (size_t i = 1; i <= want; i++)
            if (i >= n || !isxdigit((unsigned char)s[i])) { b[(*o)++] = '\\'; return 0; } /* malformed: kept as text */
        for (size_t i = 1; i <= want; i++) cp = cp * 16 + (unsigned long)(isdigit((unsigned char)s[i]) ? s[i] - '0' : (tolower((unsigned char)s[i]) - 'a' + 10));
        used = want + 1;
        if (cp > 0x10FFFF) { b[(*o)++] = '\\'; return 0; }
    } else {
        b[(*o)++] = '\\';
        return 0;
    }
    *o += (size_t)toy_tok_utf8_encode((uint32_t)cp, b + *o);
    return used;
}

/* Lexes expression tokens until "}}" (var) or "%}" (block); sets *strip_after
 * when the closing delimiter has a '-', *keep_nl when a block's has a '+'. */
static bool lex_expr(struct lexer *L, bool block, bool *strip_after, bool *keep_nl) {
    const char *s = L->src;
    int depth = 0; /* open ( [ { : "}}" inside a dict literal does not close the tag */
    for (;;) {
        while (L->pos < L->n && isspace((unsigned char)s[L->pos])) {
            if (s[L->pos] == '\n') L->line++;
            L->pos++;
        }
        if (L->pos >= L->n) { snprintf(L->err, sizeof L->err, "line %d: unclosed %s", L->line, block ? "{%" : "{{"); return false; }
        size_t p = L->pos;
        char c = s[p];
        const char *close = block ? "%}" : "}}";
        if (depth == 0 && c == '-' && p + 2 < L->n + 1 && !strncmp(s + p + 1, close, 2)) {
            *strip_after = true;
            L->pos = p + 3;
            return lex_push(L, (struct token){.k = block ? TK_BLOCK_END : TK_VAR_END, .line = L->line});
        }
        if (depth == 0 && block && c == '+' && !strncmp(s + p + 1, close, 2)) {
            /* "+%}": this tag keeps the newline after it (no trim_blocks) */
            *strip_after = false;
            *keep_nl = true;
            L->pos = p + 3;
            return lex_push(L, (struct token){.k = TK_BLOCK_END, .line = L->line});
        }
        if (depth == 0 && !strncmp(s + p, close, 2)) {
            *strip_after = false;
            L->pos = p + 2;
            return lex_push(L, (struct token){.k = block ? TK_BLOCK_END : TK_VAR_END, .line = L->line});
        }
        struct token t = {.line = L->line};
        if (isalpha((unsigned char)c) || c == '_') {
            size_t e = p;
            while (e < L->n && (isalnum((unsigned char)s[e]) || s[e] == '_')) e++;
            t.k = TK_NAME;
            t.s = strndup(s + p, e - p);
            t.len = e - p;
            L->pos = e;
        } else if (isdigit((unsigned char)c)) {
            size_t e = p;
            while (e < L->n && (isdigit((unsigned char)s[e]) || s[e] == '_')) e++;
            bool flt = false;
            if (e + 1 < L->n && s[e] == '.' && isdigit((unsigned char)s[e + 1])) {
                flt = true;
                e++;
                while (e < L->n && isdigit((unsigned char)s[e])) e++;
            }
            if (e < L->n && (s[e] == 'e' || s[e] == 'E')) {
                size_t q = e + 1;
                if (q < L->n && (s[q] == '+' || s[q] == '-')) q++;
                if (q < L->n && isdigit((unsigned char)s[q])) {
                    flt = true;
                    e = q;
                    while (e < L->n && isdigit((unsigned char)s[e])) e++;
                }
            }
            char buf[64];
            size_t o = 0;
            for (size_t i = p; i < e && o < sizeof buf - 1; i++) if (s[i] != '_') buf[o++] = s[i];
            buf[o] = 0;
            if (flt) { t.k = TK_FLOAT; t.f = strtod(buf, NULL); }
            else { t.k = TK_INT; t.i = strtoll(buf, NULL, 10); }
            L->pos = e;
        } else if (c == '\'' || c == '"') {
            size_t e = p + 1, cap = 16, o = 0;
            char *b = malloc(cap);
            if (!b) { snprintf(L->err, sizeof L->err, "out of memory"); return false; }
            while (e < L->n && s[e] != c) {
                /* room for one escape's UTF-8 (at most 4 bytes) and the NUL */
                if (o + 6 > cap) {
                    cap *= 2;
                    char *nb = realloc(b, cap);
                    if (!nb) { free(b); snprintf(L->err, sizeof L->err, "out of memory"); return false; }
                    b = nb;
                }
                if (s[e] == '\n') L->line++;
                if (s[e] != '\\' || e + 1 >= L->n) { b[o++] = s[e++]; continue; }
                e += 1 + unescape(s + e + 1, L->n - e - 1, b, &o);
            }
            if (e >= L->n) { free(b); snprintf(L->err, sizeof L->err, "line %d: unterminated string", t.line); return false; }
            b[o] = 0;
            t.k = TK_STRING;
            t.s = b;
            t.len = o;
            L->pos = e + 1;
        } else {
            static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ",", ".", ":",
                                              "|", "~", "+", "-", "*", "/", "%", "<", ">", "=", NULL};
            const char *op = NULL;
            for (int i = 0; ops[i]; i++)
                if (!strncmp(s + p, ops[i], strlen(ops[i]))) { op = ops[i]; break; }
            if (!op) { snprintf(L->err, sizeof L->err, "line %d: unexpected character '%c'", L->line, c); return false; }
            if (strchr("([{", op[0])) depth++;
            else if (strchr(")]}", op[0]) && depth > 0) depth--;
            t.k = TK_OP;
            t.s = strdup(op);
            t.len = strlen(op);
            L->pos = p + t.len;
        }
        if ((t.k == TK_NAME || t.k == TK_OP) && !t.s) { snprintf(L->err, sizeof L->err, "out of memory"); return false; }
        if (!lex_push(L, t)) return false;
    }
}

static bool lex(struct lexer *L) {
    const char *s = L->src;
    bool lstrip_next = false, trim_nl = false;
    L->line = 1;
    while (L->pos <= L->n) {
        size_t start = L->pos, q = start;
        while (q + 1 < L->n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= L->n) q = L->n;
        const char *t = s + start;
        size_t tn = q - start;
        int tline = L->line;
        if (trim_nl && tn && t[0] == '\n') { t++; tn--; }
        if (lstrip_next) while (tn && isspace((unsigned char)*t)) { t++; tn--; }
        L->line += count_lines(s + start, q - start);
        if (q >= L->n) return lex_text(L, t, tn, tline) && lex_push(L, (struct token){.k = TK_EOF, .line = L->line});
        char kind = s[q + 1];
        char mod = q + 2 < L->n ? s[q + 2] : 0;
        if (mod == '-') {
            while (tn && isspace((unsigned char)t[tn - 1])) tn--;
        } else if (kind != '{' && mod != '+') {
            /* lstrip_blocks: spaces/tabs between a line start and a block tag */
            size_t j = q;
            while (j > 0 && (s[j - 1] == ' ' || s[j - 1] == '\t')) j--;
            if ((j == 0 || s[j - 1] == '\n') && q - j <= tn) tn -= q - j;
        }
        if (!lex_text(L, t, tn, tline)) return false;
        L->pos = q + 2 + (mod == '-' || mod == '+');
        if (kind == '#') {
            const char *e = strstr(s + L->pos, "#}");
            if (!e) { snprintf(L->err, sizeof L->err, "line %d: unclosed comment", L->line); return false; }
            L->line += count_lines(s + L->pos, (size_t)(e - (s + L->pos)));
            lstrip_next = e > s + L->pos && e[-1] == '-';
            trim_nl = !lstrip_next;
            L->pos = (size_t)(e - s) + 2;
            continue;
        }
        bool block = kind == '%';
        if (!lex_push(L, (struct token){.k = block ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, .line = L->line})) return false;
        size_t first = L->ntok;
        bool strip_after = false, keep_nl = false;
        if (!lex_expr(L, block, &strip_after, &keep_nl)) return false;
        lstrip_next = strip_after;
        trim_nl = block && !strip_after && !keep_nl;
        /* {% raw %} ... {% endraw %}: the text in between, verbatim */
        if (block && L->ntok == first + 2 && L->toks[first].k == TK_NAME && !strcmp(L->toks[first].s, "raw")) {
            L->ntok -= 3;
            free(L->toks[first].s);
            const char *e = s + L->pos, *end = NULL;
            for (const char *f = strstr(e, "{%"); f; f = strstr(f + 2, "{%")) {
                const char *g = f + 2;
                if (*g == '-' || *g == '+') g++;
                while (isspace((unsigned char)*g)) g++;
                if (!strncmp(g, "endraw", 6)) { end = f; break; }
            }
            if (!end) { snprintf(L->err, sizeof L->err, "line %d: {%% raw %%} without {%% endraw %%}", L->line); return false; }
            const char *close = strstr(end, "%}");
            if (!close) { snprintf(L->err, sizeof L->err, "line %d: unclosed endraw", L->line); return false; }
            size_t rn = (size_t)(end - e);
            const char *r = e;
            /* trim_blocks leaves the newline after {% raw %} alone (Jinja2) */
            if (end[2] == '-') while (rn && isspace((unsigned char)r[rn - 1])) rn--;
            if (!lex_text(L, r, rn, L->line)) return false;
            L->line += count_lines(e, (size_t)(close - e));
            lstrip_next = close[-1] == '-';
            trim_nl = !lstrip_next;
            L->pos = (size_t)(close - s) + 2;
        }
    }
    return lex_push(L, (struct token){.k = TK_EOF, .line = L->line});
}

struct parser {
    struct token *t;
    size_t i, n;
    struct jinja_template *tpl;
    char err[256];
    int depth; /* nesting of expressions and blocks being parsed */
    struct def_frame *defs; /* the macros and call blocks whose bodies are being parsed, innermost first */
};

struct def_frame {
    struct node *def;
    struct def_frame *up;
};

/* The parser is recursive descent: every nested (, [, {, unary -/not,
 * conditional and block costs stack, and a template is untrusted input
 * (GGUF metadata, `toy serve` clients), so nesting is capped. Real chat
 * templates nest a handful of levels; Jinja2 itself stops near Python's
 * recursion limit. */
#define MAX_NEST 200

static struct node *mk(struct parser *P, enum nk k) {
    if (P->err[0]) return NULL;
    struct jinja_template *T = P->tpl;
    if (T->nall == T->cap) {
        size_t c = T->cap ? T->cap * 2 : 128;
        struct node **p = realloc(T->all, c * sizeof *p);
        if (!p) { snprintf(P->err, sizeof P->err, "out of memory"); return NULL; }
        T->all = p;
        T->cap = c;
    }
    struct node *x = calloc(1, sizeof *x);
    if (!x) { snprintf(P->err, sizeof P->err, "out of memory"); return NULL; }
    x->k = k;
    x->line = P->t[P->i < P->n ? P->i : P->n - 1].line;
    T->all[T->nall++] = x;
    return x;
}

static void free_node(struct node *x) {
    free(x->str);
    json_decref(x->lit);
    free(x->list);
    free(x->els);
    for (int i = 0; i < x->nkw; i++) free(x->kwn[i]);
    free(x->kwn);
    free(x->kwv);
    for (int i = 0; i < x->nnames; i++) free(x->names[i]);
    free(x->names);
    free(x);
}

void toy_jinja_free(struct jinja_template *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nall; i++) free_node(t->all[i]);
    free(t->all);
    free(t->body);
    free(t);
}

static bool append(struct parser *P, struct node ***list, int *n, struct node *x) {
    if (!x) return false;
    struct node **p = realloc(*list, (size_t)(*n + 1) * sizeof *p);
    if (!p) { snprintf(P->err, sizeof P->err, "out of memory"); return false; }
    *list = p;
    (*list)[(*n)++] = x;
    return true;
}

static bool append_str(struct parser *P, char ***list, int *n, const char *s) {
    char **p = realloc(*list, (size_t)(*n + 1) * sizeof *p);
    if (!p) { snprintf(P->err, sizeof P->err, "out of memory"); return false; }
    *list = p;
    if (!(p[*n] = strdup(s))) { snprintf(P->err, sizeof P->err, "out of memory"); return false; }
    (*n)++;
    return true;
}

static struct token *peek(struct parser *P) { return &P->t[P->i]; }
static struct token *peek2(struct parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->n - 1]; }
static bool is_op(struct token *t, const char *op) { return t->k == TK_OP && !strcmp(t->s, op); }
static bool is_name(struct token *t, const char *nm) { return t->k == TK_NAME && !strcmp(t->s, nm); }

static void perr(struct parser *P, const char *fmt, ...) {
    if (P->err[0]) return;
    va_list ap;
    va_start(ap, fmt);
    char m[200];
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    struct token *t = peek(P);
    snprintf(P->err, sizeof P->err, "line %d: %s", t->line, m);
}

static const char *tok_desc(struct token *t) {
    switch (t->k) {
    case TK_EOF: return "end of template";
    case TK_VAR_END: return "}}";
    case TK_BLOCK_END: return "%}";
    default: return t->s ? t->s : "?";
    }
}

static bool expect_op(struct parser *P, const char *op) {
    if (is_op(peek(P), op)) { P->i++; return true; }
    perr(P, "expected '%s', found '%s'", op, tok_desc(peek(P)));
    return false;
}

static bool expect_name(struct parser *P, const char *nm) {
    if (is_name(peek(P), nm)) { P->i++; return true; }
    perr(P, "expected '%s', found '%s'", nm, tok_desc(peek(P)));
    return false;
}

static bool expect_k(struct parser *P, enum tk k) {
    if (peek(P)->k == k) { P->i++; return true; }
    perr(P, "expected '%s', found '%s'", k == TK_BLOCK_END ? "%}" : k == TK_VAR_END ? "}}" : "name", tok_desc(peek(P)));
    return false;
}

static struct node *parse_expr(struct parser *P);
static struct node *parse_or(struct parser *P);

static bool enter(struct parser *P) {
    if (++P->depth <= MAX_NEST) return true;
    perr(P, "nested too deeply (more than %d levels)", MAX_NEST);
    return false;
}
static struct node *parse_unary(struct parser *P);

/* (args) after the '(' : positional and key=value */
static bool parse_args(struct parser *P, struct node *call) {
    while (!is_op(peek(P), ")")) {
        if (P->err[0] || peek(P)->k == TK_EOF) { perr(P, "unclosed '('"); return false; }
        if (peek(P)->k == TK_NAME && is_op(peek2(P), "=")) {
            const char *nm = peek(P)->s;
            P->i += 2;
            struct node *v = parse_expr(P);
            if (!v || !append_str(P, &call->kwn, &call->nkw, nm)) return false;
            struct node **p = realloc(call->kwv, (size_t)call->nkw * sizeof *p);
            if (!p) { perr(P, "out of memory"); return false; }
            call->kwv = p;
            p[call->nkw - 1] = v;
        } else if (!append(P, &call->list, &call->n, parse_expr(P))) {
            return false;
        }
        if (is_op(peek(P), ",")) P->i++;
        else if (!is_op(peek(P), ")")) { perr(P, "expected ',' or ')' in arguments"); return false; }
    }
    P->i++;
    return true;
}

static struct node *parse_primary(struct parser *P) {
    struct token *t = peek(P);
    struct node *x;
    switch (t->k) {
    case TK_NAME: {
        P->i++;
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) { x = mk(P, E_LIT); if (x) x->lit = json_true(); return x; }
        if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) { x = mk(P, E_LIT); if (x) x->lit = json_false(); return x; }
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) { x = mk(P, E_LIT); if (x) x->lit = json_null(); return x; }
        x = mk(P, E_NAME);
        if (x && !(x->str = strdup(t->s))) perr(P, "out of memory");
        unsigned char use = !strcmp(t->s, "varargs") ? USES_VARARGS : !strcmp(t->s, "kwargs") ? USES_KWARGS
                          : !strcmp(t->s, "caller")  ? USES_CALLER  : 0;
        for (struct def_frame *f = P->defs; use && f; f = f->up) f->def->uses |= use;
        return x;
    }
    case TK_STRING: {
        /* adjacent literals concatenate */
        size_t len = 0, j = P->i;
        while (j < P->n && P->t[j].k == TK_STRING) len += P->t[j++].len;
        char *b = malloc(len + 1);
        if (!b) { perr(P, "out of memory"); return NULL; }
        size_t o = 0;
        while (P->i < j) { memcpy(b + o, P->t[P->i].s, P->t[P->i].len); o += P->t[P->i].len; P->i++; }
        x = mk(P, E_LIT);
        if (x) x->lit = json_stringn_nocheck(b, len);
        free(b);
        return x;
    }
    case TK_INT: P->i++; x = mk(P, E_LIT); if (x) x->lit = json_integer(t->i); return x;
    case TK_FLOAT: P->i++; x = mk(P, E_LIT); if (x) x->lit = json_real(t->f); return x;
    case TK_OP:
        if (is_op(t, "(")) {
            P->i++;
            if (is_op(peek(P), ")")) { P->i++; return mk(P, E_TUPLE); }
            struct node *e = parse_expr(P);
            if (is_op(peek(P), ",")) {
                x = mk(P, E_TUPLE);
                if (!x) return NULL;
                if (!append(P, &x->list, &x->n, e)) return NULL;
                while (is_op(peek(P), ",")) {
                    P->i++;
                    if (is_op(peek(P), ")")) break;
                    if (!append(P, &x->list, &x->n, parse_expr(P))) return NULL;
                }
                e = x;
            }
            return expect_op(P, ")") ? e : NULL;
        }
        if (is_op(t, "[")) {
            P->i++;
            x = mk(P, E_LIST);
            while (x && !is_op(peek(P), "]")) {
                if (!append(P, &x->list, &x->n, parse_expr(P))) return NULL;
                if (is_op(peek(P), ",")) P->i++;
                else if (!is_op(peek(P), "]")) { perr(P, "expected ',' or ']'"); return NULL; }
            }
            P->i++;
            return x;
        }
        if (is_op(t, "{")) {
            P->i++;
            x = mk(P, E_DICT);
            while (x && !is_op(peek(P), "}")) {
                struct node *k = parse_expr(P);
                if (!expect_op(P, ":")) return NULL;
                struct node *v = parse_expr(P);
                if (!append(P, &x->list, &x->n, k) || !append(P, &x->els, &x->nels, v)) return NULL;
                if (is_op(peek(P), ",")) P->i++;
                else if (!is_op(peek(P), "}")) { perr(P, "expected ',' or '}'"); return NULL; }
            }
            P->i++;
            return x;
        }
        /* fallthrough */
    default:
        perr(P, "unexpected '%s' in expression", tok_desc(t));
        return NULL;
    }
}

static struct node *parse_postfix(struct parser *P, struct node *x) {
    while (x && !P->err[0]) {
        struct token *t = peek(P);
        if (is_op(t, ".")) {
            P->i++;
            struct token *nm = peek(P);
            if (nm->k != TK_NAME && nm->k != TK_INT) { perr(P, "expected a name after '.'"); return NULL; }
            P->i++;
            struct node *y = mk(P, E_ATTR);
            if (!y) return NULL;
            y->a = x;
            if (nm->k == TK_NAME) y->str = strdup(nm->s);
            else { char b[32]; snprintf(b, sizeof b, "%lld", nm->i); y->str = strdup(b); }
            x = y;
        } else if (is_op(t, "[")) {
            P->i++;
            struct node *parts[3] = {NULL, NULL, NULL};
            bool slice = false;
            int k = 0;
            for (;;) {
                if (!is_op(peek(P), ":") && !is_op(peek(P), "]")) parts[k] = parse_expr(P);
                if (is_op(peek(P), ":") && k < 2) { slice = true; k++; P->i++; continue; }
                break;
            }
            if (!expect_op(P, "]")) return NULL;
            struct node *y = mk(P, slice ? E_SLICE : E_INDEX);
            if (!y) return NULL;
            y->a = x;
            if (slice) { y->b = parts[0]; y->c = parts[1]; if (parts[2] && !append(P, &y->list, &y->n, parts[2])) return NULL; }
            else y->b = parts[0];
            if (!slice && !parts[0]) { perr(P, "empty subscript"); return NULL; }
            x = y;
        } else if (is_op(t, "(")) {
            P->i++;
            struct node *y = mk(P, E_CALL);
            if (!y) return NULL;
            y->a = x;
            if (!parse_args(P, y)) return NULL;
            x = y;
        } else {
            break;
        }
    }
    return x;
}

/* `x is [not] name [arg]` or `x is name(args)`, after the 'is' */
static struct node *parse_test(struct parser *P, struct node *a) {
    struct node *x = mk(P, E_TEST);
    if (!x) return NULL;
    if (is_name(peek(P), "not")) { x->negate = true; P->i++; }
    struct token *nm = peek(P);
    if (nm->k != TK_NAME) { perr(P, "expected a test name after 'is'"); return NULL; }
    x->str = strdup(nm->s);
    P->i++;
    x->a = a;
    if (is_op(peek(P), "(")) {
        P->i++;
        if (!parse_args(P, x)) return NULL;
    } else if (peek(P)->k == TK_STRING || peek(P)->k == TK_INT || peek(P)->k == TK_FLOAT ||
               is_op(peek(P), "[") || is_op(peek(P), "{") ||
               (peek(P)->k == TK_NAME && !is_name(peek(P), "and") && !is_name(peek(P), "or") &&
                !is_name(peek(P), "else") && !is_name(peek(P), "if") && !is_name(peek(P), "is") &&
                !is_name(peek(P), "in") && !is_name(peek(P), "not"))) {
        if (!append(P, &x->list, &x->n, parse_postfix(P, parse_primary(P)))) return NULL;
    }
    return x;
}

/* Filters and tests bind to the operand, as Jinja2's parser has them:
 * `1 + 1 is number` is 1 + (1 is number), `'a' ~ x|upper` upper-cases x. */
static struct node *parse_filters(struct parser *P, struct node *x) {
    while (x && (is_op(peek(P), "|") || is_name(peek(P), "is"))) {
        if (is_name(peek(P), "is")) { P->i++; x = parse_test(P, x); continue; }
        P->i++;
        if (peek(P)->k != TK_NAME) { perr(P, "expected a filter name after '|'"); return NULL; }
        struct node *y = mk(P, E_FILTER);
        if (!y) return NULL;
        y->str = strdup(peek(P)->s);
        P->i++;
        y->a = x;
        if (is_op(peek(P), "(")) {
            P->i++;
            if (!parse_args(P, y)) return NULL;
        }
        x = y;
    }
    return x;
}

/* Jinja: `-x|f` is f(-x): the sign binds to the operand, filters to the result. */
static struct node *parse_unary_nofilter(struct parser *P) {
    if (!enter(P)) return NULL;
    struct node *x;
    if (is_op(peek(P), "-") || is_op(peek(P), "+")) {
        bool neg = is_op(peek(P), "-");
        P->i++;
        x = mk(P, neg ? E_NEG : E_POS);
        if (x) x->a = parse_unary_nofilter(P);
    } else {
        x = parse_postfix(P, parse_primary(P));
    }
    P->depth--;
    return x;
}

static struct node *parse_unary(struct parser *P) { return parse_filters(P, parse_unary_nofilter(P)); }

static struct node *bin(struct parser *P, const char *op, struct node *a, struct node *b) {
    struct node *x = mk(P, E_BIN);
    if (!x) return NULL;
    x->str = strdup(op);
    x->a = a;
    x->b = b;
    return x;
}

static struct node *parse_pow(struct parser *P) {
    struct node *a = parse_unary(P);
    while (a && is_op(peek(P), "**")) { P->i++; a = bin(P, "**", a, parse_unary(P)); }
    return a;
}

static struct node *parse_math2(struct parser *P) {
    struct node *a = parse_pow(P);
    while (a && (is_op(peek(P), "*") || is_op(peek(P), "/") || is_op(peek(P), "//") || is_op(peek(P), "%"))) {
        const char *op = peek(P)->s;
        P->i++;
        a = bin(P, op, a, parse_pow(P));
    }
    return a;
}

static struct node *parse_concat(struct parser *P) {
    struct node *a = parse_math2(P);
    while (a && is_op(peek(P), "~")) { P->i++; a = bin(P, "~", a, parse_math2(P)); }
    return a;
}

static struct node *parse_math1(struct parser *P) {
    struct node *a = parse_concat(P);
    while (a && (is_op(peek(P), "+") || is_op(peek(P), "-"))) {
        const char *op = peek(P)->s;
        P->i++;
        a = bin(P, op, a, parse_concat(P));
    }
    return a;
}

/* Comparisons chain as in Python: `a < b < c` is `a < b and b < c`, with b
 * evaluated once (E_CMP holds the operands in list, the operators in names). */
static struct node *parse_compare(struct parser *P) {
    struct node *a = parse_math1(P), *chain = NULL;
    while (a && !P->err[0]) {
        struct token *t = peek(P);
        const char *op = NULL;
        if (t->k == TK_OP && (!strcmp(t->s, "==") || !strcmp(t->s, "!=") || !strcmp(t->s, "<") || !strcmp(t->s, ">") ||
                              !strcmp(t->s, "<=") || !strcmp(t->s, ">=")))
            op = t->s, P->i++;
        else if (is_name(t, "in")) op = "in", P->i++;
        else if (is_name(t, "not") && is_name(peek2(P), "in")) op = "notin", P->i += 2;
        else break;
        if (!chain) {
            if (!(chain = mk(P, E_CMP)) || !append(P, &chain->list, &chain->n, a)) return NULL;
        }
        if (!append_str(P, &chain->names, &chain->nnames, op) || !append(P, &chain->list, &chain->n, parse_math1(P))) return NULL;
    }
    return chain ? chain : a;
}

static struct node *parse_not(struct parser *P) {
    if (!enter(P)) return NULL;
    struct node *x;
    if (is_name(peek(P), "not")) {
        P->i++;
        x = mk(P, E_NOT);
        if (x) x->a = parse_not(P);
    } else {
        x = parse_compare(P);
    }
    P->depth--;
    return x;
}

static struct node *parse_and(struct parser *P) {
    struct node *a = parse_not(P);
    while (a && is_name(peek(P), "and")) {
        P->i++;
        struct node *x = mk(P, E_AND);
        if (!x) return NULL;
        x->a = a;
        x->b = parse_not(P);
        a = x;
    }
    return a;
}

static struct node *parse_or(struct parser *P) {
    struct node *a = parse_and(P);
    while (a && is_name(peek(P), "or")) {
        P->i++;
        struct node *x = mk(P, E_OR);
        if (!x) return NULL;
        x->a = a;
        x->b = parse_and(P);
        a = x;
    }
    return a;
}

static struct node *parse_cond(struct parser *P);

static struct node *parse_expr(struct parser *P) {
    if (!enter(P)) return NULL;
    struct node *x = parse_cond(P);
    P->depth--;
    return x;
}

static struct node *parse_cond(struct parser *P) {
    struct node *a = parse_or(P);
    if (a && is_name(peek(P), "if")) {
        P->i++;
        struct node *x = mk(P, E_COND);
        if (!x) return NULL;
        x->a = a;
        x->b = parse_or(P);
        if (is_name(peek(P), "else")) {
            P->i++;
            x->c = parse_expr(P);
        }
        return x;
    }
    return a;
}

/* ---- statements ---- */

static bool parse_body(struct parser *P, struct node ***body, int *n, const char *const *ends);

static bool at_block(struct parser *P, const char *const *names) {
    if (peek(P)->k != TK_BLOCK_BEGIN) return false;
    struct token *t = peek2(P);
    if (t->k != TK_NAME) return false;
    for (; *names; names++)
        if (!strcmp(t->s, *names)) return true;
    return false;
}

static struct node *parse_if_in(struct parser *P);

/* an elif is an if nested in the else branch: it counts as a level */
static struct node *parse_if(struct parser *P) {
    if (!enter(P)) return NULL;
    struct node *x = parse_if_in(P);
    P->depth--;
    return x;
}

static struct node *parse_if_in(struct parser *P) {
    /* at: cond %} (after 'if' or 'elif') */
    struct node *x = mk(P, N_IF);
    if (!x) return NULL;
    x->a = parse_expr(P);
    if (!expect_k(P, TK_BLOCK_END)) return NULL;
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    if (!parse_body(P, &x->list, &x->n, ends)) return NULL;
    if (!at_block(P, ends)) { perr(P, "'if' without 'endif'"); return NULL; }
    P->i++; /* {% */
    const char *w = peek(P)->s;
    P->i++;
    if (!strcmp(w, "elif")) {
        if (!append(P, &x->els, &x->nels, parse_if(P))) return NULL;
        return x; /* the nested if consumed endif */
    }
    if (!strcmp(w, "else")) {
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const e2[] = {"endif", NULL};
        if (!parse_body(P, &x->els, &x->nels, e2)) return NULL;
        if (!at_block(P, e2)) { perr(P, "'else' without 'endif'"); return NULL; }
        P->i += 2;
    }
    return expect_k(P, TK_BLOCK_END) ? x : NULL;
}

/* A parameter list after its '(': names with optional defaults, into
 * x->kwn / x->kwv (a NULL default: none given). */
static bool parse_params(struct parser *P, struct node *x) {
    while (!is_op(peek(P), ")")) {
        if (peek(P)->k != TK_NAME) { perr(P, "expected a parameter name"); return false; }
        if (!append_str(P, &x->kwn, &x->nkw, peek(P)->s)) return false;
        P->i++;
        struct node *dflt = NULL;
        if (is_op(peek(P), "=")) { P->i++; dflt = parse_expr(P); if (!dflt) return false; }
        struct node **p = realloc(x->kwv, (size_t)x->nkw * sizeof *p);
        if (!p) { perr(P, "out of memory"); return false; }
        x->kwv = p;
        p[x->nkw - 1] = dflt;
        if (is_op(peek(P), ",")) P->i++;
        else if (!is_op(peek(P), ")")) { perr(P, "expected ',' or ')'"); return false; }
    }
    P->i++;
    return true;
}

/* The body of a macro or call block, noting in x->uses the special names
 * it reads (its parameter defaults are not part of it, as in Jinja2). */
static bool parse_def_body(struct parser *P, struct node *x, const char *const *ends) {
    struct def_frame f = {.def = x, .up = P->defs};
    P->defs = &f;
    bool ok = parse_body(P, &x->list, &x->n, ends);
    P->defs = f.up;
    return ok;
}

static bool end_block(struct parser *P, const char *name) {
    const char *const e[] = {name, NULL};
    if (!at_block(P, e)) { perr(P, "expected {%% %s %%}", name); return false; }
    P->i += 2;
    return expect_k(P, TK_BLOCK_END);
}

static struct node *parse_stmt(struct parser *P) {
    /* at: {% name */
    P->i++;
    struct token *t = peek(P);
    if (t->k != TK_NAME) { perr(P, "expected a statement after {%%"); return NULL; }
    const char *w = t->s;
    P->i++;
    if (!strcmp(w, "if")) return parse_if(P);
    if (!strcmp(w, "for")) {
        struct node *x = mk(P, N_FOR);
        if (!x) return NULL;
        do {
            if (peek(P)->k != TK_NAME) { perr(P, "expected a loop variable"); return NULL; }
            if (!append_str(P, &x->names, &x->nnames, peek(P)->s)) return NULL;
            P->i++;
            if (!is_op(peek(P), ",")) break;
            P->i++;
        } while (1);
        if (!expect_name(P, "in")) return NULL;
        x->a = parse_or(P); /* no conditional: `if` here filters the loop */
        if (x->a && is_op(peek(P), ",")) { /* for x in 1, 2: a tuple */
            struct node *tu = mk(P, E_TUPLE);
            if (!tu || !append(P, &tu->list, &tu->n, x->a)) return NULL;
            while (is_op(peek(P), ",")) {
                P->i++;
                if (peek(P)->k == TK_BLOCK_END || is_name(peek(P), "if") || is_name(peek(P), "recursive")) break;
                if (!append(P, &tu->list, &tu->n, parse_or(P))) return NULL;
            }
            x->a = tu;
        }
        if (is_name(peek(P), "if")) { P->i++; x->b = parse_or(P); }
        if (is_name(peek(P), "recursive")) { P->i++; x->recursive = true; }
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"else", "endfor", NULL};
        if (!parse_body(P, &x->list, &x->n, ends)) return NULL;
        if (!at_block(P, ends)) { perr(P, "'for' without 'endfor'"); return NULL; }
        if (!strcmp(peek2(P)->s, "else")) {
            P->i += 2;
            if (!expect_k(P, TK_BLOCK_END)) return NULL;
            static const char *const e2[] = {"endfor", NULL};
            if (!parse_body(P, &x->els, &x->nels, e2)) return NULL;
        }
        return end_block(P, "endfor") ? x : NULL;
    }
    if (!strcmp(w, "set")) {
        struct node *x = mk(P, N_SET);
        if (!x) return NULL;
        do {
            if (peek(P)->k != TK_NAME) { perr(P, "expected a name after 'set'"); return NULL; }
            if (!append_str(P, &x->names, &x->nnames, peek(P)->s)) return NULL;
            P->i++;
            if (is_op(peek(P), ".")) { /* set ns.attr = ... */
                P->i++;
                if (peek(P)->k != TK_NAME) { perr(P, "expected an attribute name"); return NULL; }
                x->str = strdup(peek(P)->s);
                P->i++;
                break;
            }
            if (!is_op(peek(P), ",")) break;
            P->i++;
        } while (1);
        if (is_op(peek(P), "=")) {
            P->i++;
            x->a = parse_expr(P);
            if (is_op(peek(P), ",")) { /* set a, b = 1, 2 */
                struct node *tu = mk(P, E_TUPLE);
                if (!tu || !append(P, &tu->list, &tu->n, x->a)) return NULL;
                while (is_op(peek(P), ",")) { P->i++; if (!append(P, &tu->list, &tu->n, parse_expr(P))) return NULL; }
                x->a = tu;
            }
            return expect_k(P, TK_BLOCK_END) ? x : NULL;
        }
        x->k = N_SETBLOCK;
        if (is_op(peek(P), "|")) { /* {% set x | upper %}: the filters apply to the block's text */
            struct node *ph = mk(P, E_LIT);
            if (!ph) return NULL;
            ph->lit = json_string("");
            x->a = parse_filters(P, ph);
            x->b = ph;
            if (!x->a) return NULL;
        }
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"endset", NULL};
        if (!parse_body(P, &x->list, &x->n, ends)) return NULL;
        return end_block(P, "endset") ? x : NULL;
    }
    if (!strcmp(w, "macro")) {
        struct node *x = mk(P, N_MACRO);
        if (!x) return NULL;
        if (peek(P)->k != TK_NAME) { perr(P, "expected a macro name"); return NULL; }
        x->str = strdup(peek(P)->s);
        P->i++;
        if (!expect_op(P, "(") || !parse_params(P, x)) return NULL;
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        if (!parse_def_body(P, x, ends)) return NULL;
        return end_block(P, "endmacro") ? x : NULL;
    }
    if (!strcmp(w, "call")) {
        /* {% call macro(args) %}body{% endcall %}: caller() renders body */
        struct node *x = mk(P, N_CALLBLOCK);
        if (!x) return NULL;
        /* {% call(a, b) m() %}: the parameters caller(...) passes to the block */
        if (is_op(peek(P), "(")) { P->i++; if (!parse_params(P, x)) return NULL; }
        x->a = parse_expr(P);
        if (!x->a || x->a->k != E_CALL) { perr(P, "{%% call %%} needs a macro call"); return NULL; }
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"endcall", NULL};
        if (!parse_def_body(P, x, ends)) return NULL;
        return end_block(P, "endcall") ? x : NULL;
    }
    if (!strcmp(w, "filter")) {
        struct node *x = mk(P, N_FILTERBLOCK);
        if (!x) return NULL;
        if (peek(P)->k != TK_NAME) { perr(P, "expected a filter name"); return NULL; }
        P->i++;
        /* the filter chain applies to a placeholder literal set at run time */
        struct node *ph = mk(P, E_LIT);
        struct node *f = mk(P, E_FILTER);
        if (!ph || !f) return NULL;
        ph->lit = json_string("");
        P->i--; /* back to the filter name */
        f->str = strdup(peek(P)->s);
        P->i++;
        f->a = ph;
        if (is_op(peek(P), "(")) { P->i++; if (!parse_args(P, f)) return NULL; }
        x->a = parse_filters(P, f);
        x->b = ph;
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        if (!parse_body(P, &x->list, &x->n, ends)) return NULL;
        return end_block(P, "endfilter") ? x : NULL;
    }
    if (!strcmp(w, "with")) {
        /* {% with a = 1, b = 2 %}body{% endwith %}: names scoped to the body */
        struct node *x = mk(P, N_WITH);
        if (!x) return NULL;
        while (peek(P)->k == TK_NAME) {
            if (!append_str(P, &x->kwn, &x->nkw, peek(P)->s)) return NULL;
            P->i++;
            if (!expect_op(P, "=")) return NULL;
            struct node *v = parse_expr(P);
            struct node **p = v ? realloc(x->kwv, (size_t)x->nkw * sizeof *p) : NULL;
            if (!p) { if (v) perr(P, "out of memory"); return NULL; }
            x->kwv = p;
            p[x->nkw - 1] = v;
            if (!is_op(peek(P), ",")) break;
            P->i++;
        }
        if (!expect_k(P, TK_BLOCK_END)) return NULL;
        static const char *const ends[] = {"endwith", NULL};
        if (!parse_body(P, &x->list, &x->n, ends)) return NULL;
        return end_block(P, "endwith") ? x : NULL;
    }
    if (!strcmp(w, "break") || !strcmp(w, "continue")) {
        struct node *x = mk(P, w[0] == 'b' ? N_BREAK : N_CONTINUE);
        return expect_k(P, TK_BLOCK_END) ? x : NULL;
    }
    if (!strcmp(w, "generation") || !strcmp(w, "endgeneration")) {
        /* HF's assistant-mask markers: no output of their own */
        struct node *x = mk(P, N_TEXT);
        if (x) x->str = strdup("");
        return expect_k(P, TK_BLOCK_END) ? x : NULL;
    }
    P->i--;
    perr(P, "unknown or unexpected statement '%s'", w);
    return NULL;
}

static bool parse_body_in(struct parser *P, struct node ***body, int *n, const char *const *ends);

static bool parse_body(struct parser *P, struct node ***body, int *n, const char *const *ends) {
    if (!enter(P)) return false;
    bool ok = parse_body_in(P, body, n, ends);
    P->depth--;
    return ok;
}

static bool parse_body_in(struct parser *P, struct node ***body, int *n, const char *const *ends) {
    for (;;) {
        if (P->err[0]) return false;
        struct token *t = peek(P);
        if (t->k == TK_EOF) {
            if (!ends) return true;
            const char *const *e = ends;
            while (e[1]) e++;
            perr(P, "unexpected end of template: missing {%% %s %%}", *e);
            return false;
        }
        if (ends && at_block(P, ends)) return true;
        struct node *x = NULL;
        if (t->k == TK_TEXT) {
            x = mk(P, N_TEXT);
            if (x && !(x->str = strndup(t->s, t->len))) perr(P, "out of memory");
            if (x) x->line = t->line;
            P->i++;
        } else if (t->k == TK_VAR_BEGIN) {
            P->i++;
            x = mk(P, N_OUT);
            if (x) x->a = parse_expr(P);
            if (!expect_k(P, TK_VAR_END)) return false;
        } else if (t->k == TK_BLOCK_BEGIN) {
            x = parse_stmt(P);
        } else {
            perr(P, "unexpected '%s'", tok_desc(t));
            return false;
        }
        if (!append(P, body, n, x)) return false;
    }
}

enum toy_status toy_jinja_parse(const char *src, struct jinja_template **out) {
    *out = NULL;
    /* Jinja2 reads "\r\n" and a lone "\r" in the source as "\n" (its
     * newline_sequence), in text and string literals alike, ... */
    size_t sn = strlen(src), dn = 0;
    char *norm = malloc(sn + 1);
    if (!norm) return toy_error(TOY_ERR_NOMEM, "chat template: out of memory");
    for (size_t i = 0; i < sn; i++) {
        if (src[i] == '\r') { norm[dn++] = '\n'; if (i + 1 < sn && src[i + 1] == '\n') i++; }
        else norm[dn++] = src[i];
    }
    /* and drops one newline at the very end (keep_trailing_newline off) */
    if (dn && norm[dn - 1] == '\n') dn--;
    norm[dn] = 0;
    struct lexer L = {.src = norm, .n = dn};
    struct jinja_template *T = calloc(1, sizeof *T);
    if (!T) { free(norm); return toy_error(TOY_ERR_NOMEM, "chat template: out of memory"); }
    enum toy_status st = TOY_OK;
    if (!lex(&L)) {
        st = toy_error(TOY_ERR_FORMAT, "chat template: %s", L.err);
    } else {
        struct parser P = {.t = L.toks, .n = L.ntok, .tpl = T};
        if (!parse_body(&P, &T->body, &T->n, NULL) || P.err[0]) {
            if (!P.err[0]) {
                P.i = P.i < P.n ? P.i : P.n - 1;
                perr(&P, "unexpected '%s'", tok_desc(peek(&P)));
            }
            st = toy_error(TOY_ERR_FORMAT, "chat template: %s", P.err);
        }
    }
    for (size_t i = 0; i < L.ntok; i++) free(L.toks[i].s);
    free(L.toks);
    free(norm);
    if (st) { toy_jinja_free(T); return st; }
    *out = T;
    return TOY_OK;
}

