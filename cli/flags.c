/* flags.c: flag values for the toy commands (flags.h). */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool toy_flag_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "toy %s: %s needs a whole number in %lld..%lld, not '%s'\n", cmd, flag, (long long)lo,
                (long long)hi, v);
        return false;
    }
    *out = x;
    return true;
}

bool toy_flag_u64(const char *cmd, const char *flag, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || errno || strchr(v, '-')) {
        fprintf(stderr, "toy %s: %s needs a whole number in 0..%llu, not '%s'\n", cmd, flag,
                (unsigned long long)UINT64_MAX, v);
        return false;
    }
    *out = x;
    return true;
}

bool toy_flag_num(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out) {
    char *end;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || x < lo || x > hi) {
        fprintf(stderr, "toy %s: %s needs a number in %g..%g, not '%s'\n", cmd, flag, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

bool toy_flag_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) return true;
    return false;
}

bool toy_flag_in(const char *a, const char *const *names) {
    for (int i = 0; names[i]; i++)
        if (!strcmp(a, names[i])) return true;
    return false;
}

int toy_flag_unknown(const char *cmd, const char *a) {
    if (a[0] == '-' && a[1]) fprintf(stderr, "toy %s: unknown flag %s (toy %s --help lists them)\n", cmd, a, cmd);
    else fprintf(stderr, "toy %s: unexpected argument '%s' (toy %s --help)\n", cmd, a, cmd);
    return 2;
}
