/* flags.h: reading the values of a command's flags. Whole numbers are whole
 * and in range (strtod and a cast turned 1e30 steps into 0 and seed
 * 2^64 - 1 into 0), and a word the command does not know is named as such,
 * not as a flag missing its value. Each function prints "toy CMD: ..." on
 * stderr when it refuses. */
#ifndef TOY_CLI_FLAGS_H
#define TOY_CLI_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

/* v as a whole number in [lo, hi] into *out; false (after saying why) otherwise */
bool toy_flag_int(const char *cmd, const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out);
/* v as an unsigned 64-bit whole number (a seed), exactly */
bool toy_flag_u64(const char *cmd, const char *flag, const char *v, uint64_t *out);
/* v as a finite number in [lo, hi] */
bool toy_flag_num(const char *cmd, const char *flag, const char *v, double lo, double hi, double *out);
/* whether -h or --help is among argv[1..argc) (the usage then goes to stdout, exit 0) */
bool toy_flag_help(int argc, char **argv);
/* whether a is one of the NULL-terminated names */
bool toy_flag_in(const char *a, const char *const *names);
/* Says what argv word a is when the command does not take it: "unexpected
 * argument 'x'" or "unknown flag --x"; returns 2 (bad usage). */
int toy_flag_unknown(const char *cmd, const char *a);

#endif
