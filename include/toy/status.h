/* toy/status.h: the one status enum of libtoy and its error messages.
 *
 * Every fallible function returns `enum toy_status`. TOY_OK is 0, so
 *
 *     enum toy_status st = toy_gguf_open(path, &g);
 *     if (st) { fprintf(stderr, "toy: %s\n", toy_last_error()); return 1; }
 *
 * is the usual pattern. The failing function also records a human message
 * (per thread) naming what failed and where, e.g.
 * "blk.3.attn_q.weight: 3 dims, expected 2 (model.gguf, offset 81920)".
 * A NULL where a function stores its result (an `out`, a getter's value,
 * a struct the caller has it fill in) is TOY_ERR_INVALID_ARG naming the
 * function and the parameter ("toy_llama_load: out is NULL"), before any
 * work is done; outputs whose comment says "may be NULL" are optional.
 *
 * Broken invariants while building a graph (shape mismatches, wrong dtypes)
 * are programming errors: they abort with file:line through TOY_ASSERT.
 * The library never calls exit().
 */
#ifndef TOY_STATUS_H
#define TOY_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X-macro: name, string. Append only (values may reach files and logs). */
#define TOY_STATUS_LIST(X)                                         \
    X(TOY_OK, "ok")                                                \
    X(TOY_ERR_INVALID_ARG, "invalid argument")                     \
    X(TOY_ERR_NOMEM, "out of memory")                              \
    X(TOY_ERR_IO, "I/O error")                                     \
    X(TOY_ERR_FORMAT, "malformed file")                            \
    X(TOY_ERR_UNSUPPORTED, "unsupported")                          \
    X(TOY_ERR_SHAPE, "shape mismatch")                             \
    X(TOY_ERR_NOT_FOUND, "not found")                              \
    X(TOY_ERR_RANGE, "value out of range")                         \
    X(TOY_ERR_NUMERIC, "non-finite value")                         \
    X(TOY_ERR_INTERRUPTED, "interrupted")                          \
    X(TOY_ERR_BACKEND, "backend error")                            \
    X(TOY_ERR_STATE, "invalid state")

enum toy_status {
#define TOY_X_ENUM(name, str) name,
    TOY_STATUS_LIST(TOY_X_ENUM)
#undef TOY_X_ENUM
    TOY_STATUS_COUNT
};

/* Static string for a status ("malformed file"); never NULL. */
const char *toy_status_str(enum toy_status st);

/* Records a message for the calling thread and returns `st`, so that
 * `return toy_error(TOY_ERR_FORMAT, "%s: bad magic", path);` reads well. */
enum toy_status toy_error(enum toy_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The calling thread's last message ("" if none). Valid until the next
 * toy_error on the same thread. It means something only after a call
 * returned an error: a call that succeeds may leave the text of a failure
 * it recovered from (an optional GGUF key that was absent). */
const char *toy_last_error(void);

/* Clears the calling thread's message. */
void toy_clear_error(void);

/* C11's _Noreturn is not C++'s spelling */
#ifdef __cplusplus
#define TOY_NORETURN [[noreturn]]
#else
#define TOY_NORETURN _Noreturn
#endif

/* Abort with file:line and a message: for broken invariants only. */
TOY_NORETURN void toy_abort(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

TOY_NORETURN void toy_assert_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define TOY_ABORT(...) toy_abort(__FILE__, __LINE__, __VA_ARGS__)
/* TOY_ASSERT(cond, fmt, ...): the message is required. */
#define TOY_ASSERT(cond, ...)                                               \
    do {                                                                    \
        if (!(cond)) toy_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
