/* jinja.h: the Jinja-subset interpreter behind toy/chat-template.h.
 * Values are jansson json_t (none, bool, int, float, str, list, dict);
 * undefined is NULL. */
#ifndef TOY_JINJA_H
#define TOY_JINJA_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "toy/status.h"

/* The AST (shared by jinja-parse.c and the evaluator in jinja.c). */

enum nk {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_FILTERBLOCK, N_CALLBLOCK, N_WITH,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_POS, E_NOT, E_BIN, E_AND, E_OR,
    E_COND, E_LIST, E_DICT, E_TUPLE, E_IN, E_NOTIN, E_CMP,
};

struct node {
    enum nk k;
    int line;
    char *str;          /* name, attribute, filter/test, operator, text */
    json_t *lit;
    struct node *a, *b, *c;
    struct node **list; /* body / args / elements */
    int n;
    struct node **els;  /* else body */
    int nels;
    char **kwn;         /* keyword argument names (or macro parameter names) */
    struct node **kwv;  /* their values (or macro defaults, may be NULL) */
    int nkw;
    char **names;       /* for/set targets */
    int nnames;
    bool negate;        /* is not */
    bool recursive;     /* {% for ... recursive %} */
    unsigned char uses; /* N_MACRO, N_CALLBLOCK: the USES_* names its body reads */
};

/* Names whose use in a macro's (or call block's) body, a nested macro's
 * included, lets it take extra arguments (varargs, kwargs) or be run by
 * {% call %} (caller), as Jinja2 decides. */
enum { USES_VARARGS = 1, USES_KWARGS = 2, USES_CALLER = 4 };

struct jinja_template {
    struct node **all; /* every node, for freeing */
    size_t nall, cap;
    struct node **body;
    int n;
};


/* Parses with trim_blocks and lstrip_blocks (Hugging Face's settings). */
enum toy_status toy_jinja_parse(const char *src, struct jinja_template **out);
void toy_jinja_free(struct jinja_template *t);
/* Renders with the keys of `vars` (a JSON object, borrowed) as globals. */
enum toy_status toy_jinja_render(const struct jinja_template *t, json_t *vars, char **out);

#endif
