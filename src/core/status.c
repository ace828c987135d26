/* status.c: status strings, per-thread error messages, loud aborts.
 * See include/toy/status.h for the contract. */
#include "toy/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

static const char *const status_strings[] = {
#define TOY_X_STR(name, str) str,
    TOY_STATUS_LIST(TOY_X_STR)
#undef TOY_X_STR
};

static _Thread_local char last_error[1024];

const char *toy_status_str(enum toy_status st) {
    if ((unsigned)st >= TOY_STATUS_COUNT) return "unknown status";
    return status_strings[st];
}

enum toy_status toy_error(enum toy_status st, const char *fmt, ...) {
    /* formatted aside first: callers prefix the last error with
     * toy_error(st, "%s: %s", path, toy_last_error()), an argument that
     * points into the buffer being written */
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return st;
}

const char *toy_last_error(void) { return last_error; }

void toy_clear_error(void) { last_error[0] = 0; }

_Noreturn void toy_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "toy: %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

_Noreturn void toy_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "toy: %s:%d: assertion '%s' failed: ", file, line, cond);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
