/* flags.c: the table-driven flag parser of flags.h. Integers are read
 * exactly (strtoll on their digits) or, for forms like 1e3, through a
 * double that must be a whole number below 2^53, so no value is rounded
 * (2.5 -> 2), overflowed (1e30) or wrapped (99999999999999999999). */
#include "flags.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct toy_cli_flag *find(const struct toy_cli_flag *flags, const char *name) {
    for (const struct toy_cli_flag *f = flags; f->name; f++)
        if (!strcmp(f->name, name)) return f;
    return NULL;
}

/* v as a whole number; false if it is not one or does not fit */
static bool whole(const char *v, bool is_unsigned, int64_t *i, uint64_t *u) {
    char *end;
    if (!*v || isspace((unsigned char)*v)) return false;
    errno = 0;
    if (is_unsigned && *v != '-') {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*end && !errno) return *u = x, true;
    } else if (!is_unsigned) {
        long long x = strtoll(v, &end, 10);
        if (!*end && !errno) return *i = x, true;
    }
    if (errno == ERANGE) return false; /* all digits, but too many */
    errno = 0;
    double d = strtod(v, &end);
    if (!*v || *end || !isfinite(d) || d != floor(d) || fabs(d) >= 9007199254740992.0) return false;
    if (is_unsigned && d < 0) return false;
    *i = (int64_t)d;
    *u = (uint64_t)(d < 0 ? 0 : d);
    return true;
}

static int bad(const char *cmd, const struct toy_cli_flag *f, const char *v) {
    if (f->kind == TOY_CLI_U64)
        fprintf(stderr, "toy %s: bad value '%s' for %s: a whole number from 0 to %llu\n", cmd, v, f->name,
                (unsigned long long)UINT64_MAX);
    else if (f->kind == TOY_CLI_F64 || f->kind == TOY_CLI_F32)
        fprintf(stderr, "toy %s: bad value '%s' for %s: a number from %g to %g%s\n", cmd, v, f->name, f->lo, f->hi,
                f->hi_open ? " (not included)" : "");
    else
        fprintf(stderr, "toy %s: bad value '%s' for %s: a whole number from %.0f to %.0f\n", cmd, v, f->name, f->lo,
                f->hi);
    return 2;
}

static int set(const char *cmd, const struct toy_cli_flag *f, const char *v) {
    switch (f->kind) {
    case TOY_CLI_BOOL: *(bool *)f->dst = true; return 0;
    case TOY_CLI_STR: *(const char **)f->dst = v; return 0;
    case TOY_CLI_LIST: {
        struct toy_cli_list *l = f->dst;
        if (l->n >= l->max) {
            fprintf(stderr, "toy %s: at most %d %s\n", cmd, l->max, f->name);
            return 2;
        }
        l->items[l->n++] = v;
        return 0;
    }
    case TOY_CLI_U64: {
        int64_t i;
        uint64_t u;
        if (!whole(v, true, &i, &u)) return bad(cmd, f, v);
        *(uint64_t *)f->dst = u;
        return 0;
    }
    case TOY_CLI_I64:
    case TOY_CLI_I32:
    case TOY_CLI_INT: {
        int64_t i;
        uint64_t u;
        if (!whole(v, false, &i, &u) || (double)i < f->lo || (double)i > f->hi) return bad(cmd, f, v);
        if (f->kind == TOY_CLI_I64) *(int64_t *)f->dst = i;
        else if (f->kind == TOY_CLI_I32) *(int32_t *)f->dst = (int32_t)i; /* the range says it fits */
        else *(int *)f->dst = (int)i;
        return 0;
    }
    case TOY_CLI_F64:
    case TOY_CLI_F32: {
        char *end;
        double d = strtod(v, &end);
        if (!*v || *end || !isfinite(d) || d < f->lo || d > f->hi || (f->hi_open && d >= f->hi) ||
            (f->kind == TOY_CLI_F32 && !isfinite((float)d)))
            return bad(cmd, f, v);
        if (f->kind == TOY_CLI_F64) *(double *)f->dst = d;
        else *(float *)f->dst = (float)d;
        return 0;
    }
    }
    return 2;
}

int toy_cli_parse(const char *cmd, int argc, char **argv, const struct toy_cli_flag *flags, const char **pos,
                  int max_pos, int *n_pos) {
    if (n_pos) *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return 1;
        if (a[0] != '-' || !a[1]) { /* a positional argument ("-": standard input) */
            if (!n_pos || *n_pos >= max_pos) {
                fprintf(stderr, "toy %s: unexpected argument '%s'\n", cmd, a);
                return 2;
            }
            pos[(*n_pos)++] = a;
            continue;
        }
        const struct toy_cli_flag *f = find(flags, a);
        if (!f) {
            fprintf(stderr, "toy %s: unknown flag %s (see toy %s --help)\n", cmd, a, cmd);
            return 2;
        }
        if (f->given) *f->given = true;
        if (f->kind == TOY_CLI_BOOL) {
            set(cmd, f, NULL);
            continue;
        }
        /* a value that is itself one of our flags means this one's value was left out */
        if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] == '-' && find(flags, argv[i + 1]))) {
            fprintf(stderr, "toy %s: %s needs a value\n", cmd, a);
            return 2;
        }
        int rc = set(cmd, f, argv[++i]);
        if (rc) return rc;
    }
    return 0;
}

bool toy_cli_wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}
