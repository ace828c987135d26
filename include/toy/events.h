/* toy/events.h: the toy/v1 event stream, `runs/<id>/events.jsonl`.
 *
 * A run writes one JSON object per line (JSON Lines): `run_start` first,
 * then `step`, `eval`, `sample`, `note`, `op_timing`, ... events, and
 * `run_end` last. Every event carries `kind` (string) and `t` (seconds since
 * the stream was opened, CLOCK_MONOTONIC). The schema, every kind and field,
 * and the rules for consumers are in docs/events.md; it re-creates the
 * earlier system's toy/v1 (../shared/reference/toy-features.md §3).
 *
 * Writing:
 *
 *     struct toy_events *ev;
 *     if (toy_events_open("runs/llama-20260101-001/events.jsonl", TOY_EVENTS_TRUNCATE, &ev))
 *         fprintf(stderr, "%s\n", toy_last_error());
 *     json_t *model = json_pack("{s:s, s:i}", "arch", "llama", "vocab", 256);
 *     json_t *config = json_pack("{s:i, s:f}", "steps", 100, "lr", 3e-4);
 *     toy_events_run_start(ev, &(struct toy_run_start){
 *         .run_id = "llama-20260101-001", .model = model, .config = config});
 *     json_decref(model), json_decref(config);     // borrowed, copied
 *     for (int s = 1; s <= 100; s++)
 *         toy_events_step(ev, &(struct toy_step_event){
 *             .step = s, .loss = loss, .lr = lr, .tokens = B * T, .wall_us = us, .grad_norm = gn});
 *     toy_events_run_end(ev, &(struct toy_run_end){
 *         .reason = TOY_RUN_COMPLETED, .final_step = 100, .final_loss = loss});
 *     toy_events_close(ev);
 *
 * Guarantees: each event is encoded by jansson and reaches the file with one
 * write() of the whole line including its '\n' (O_APPEND), so a reader or a
 * crash never sees half of a line followed by another event, and `tail -f`
 * sees every event as soon as it is emitted (no stdio buffer). `t` never
 * decreases down the file, appended segments included. The handle enforces the order: nothing before
 * run_start (TOY_ERR_STATE), nothing after run_end. Non-finite numbers (a NaN
 * loss) are written as `null`. Reals are written with at most 15 significant
 * digits; a value that is exactly a float (loss, lr from a float) is written
 * with the shortest digits that give that float back ("0.0003", not
 * "0.000300000014"). Strings the caller passes as C text (notes, samples,
 * errors) are made valid UTF-8 (invalid bytes become U+FFFD).
 *
 * A toy_events handle may be used from several threads (emits are
 * serialized). The json_t arguments are always borrowed: the functions copy
 * what they keep, and the caller still owns (and decrefs) its objects.
 *
 * Reading: toy_events_read() calls back once per well-formed event of a
 * known kind, skipping torn or unparseable lines and unknown kinds, as every
 * consumer of the stream must.
 */
#ifndef TOY_EVENTS_H
#define TOY_EVENTS_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_EVENTS_SCHEMA "toy/v1"

struct toy_events;

enum toy_events_mode {
    TOY_EVENTS_TRUNCATE = 0, /* a fresh stream: an existing file is replaced */
    TOY_EVENTS_APPEND = 1,   /* keep what is there (a resumed run adds a new run_start ... run_end) */
};

/* Opens (creating the parent directories, mode 0755) the stream at `path`.
 * In append mode a last line without its newline (a torn tail) is closed
 * with one, so the next event starts on a line of its own. The clock `t`
 * starts now, at 0 for a fresh stream and, in append mode, at the t of the
 * file's last event (so t never decreases down the file). Errors: TOY_ERR_INVALID_ARG (NULL path or out), TOY_ERR_IO. */
enum toy_status toy_events_open(const char *path, enum toy_events_mode mode, struct toy_events **out);

/* Whether the last write failed for want of space (a full disk or quota,
 * a file-size limit). A run that keeps training then loses its steps:
 * its checkpoints need space too, so the trainers stop at once, with a
 * checkpoint attempted, rather than at the end (toy_events_step's error
 * then says so, with the step). Other write failures are
 * reported once on stderr and the producer goes on without its events. */
bool toy_events_out_of_space(const struct toy_events *ev);

/* Closes the file (fdatasync first). Does not write run_end: a stream closed
 * without one reads as a run that died. NULL is a no-op. */
void toy_events_close(struct toy_events *ev);

/* Seconds since open (CLOCK_MONOTONIC): what `t` of an event emitted now is. */
double toy_events_now(const struct toy_events *ev);

/* The path the stream writes to. */
const char *toy_events_path(const struct toy_events *ev);

/* ---- run_start -------------------------------------------------------------- */

struct toy_run_start {
    const char *run_id;  /* NULL: "anonymous" */
    const char *phase;   /* "train" (NULL) | "eval" | "serve" */
    const char *backend; /* the device the run computes on ("cpu", "cuda:0"); NULL: toy_device_default() */
    json_t *model;       /* {arch, name, vocab, d_model, n_layers, n_heads, n_kv, d_head, d_ff, ...}; NULL: omitted */
    json_t *config;      /* an open dictionary of hyper-parameters; NULL: {} */
    json_t *extra;       /* more top-level keys (compare_to, cost, ...); NULL: none */
    const char *git_dir; /* where to look for the repository; NULL: the current directory */
    bool no_git;         /* true: no `git` key even inside a repository */
};

/* Writes run_start: kind, schema "toy/v1", t, started_at (ISO-8601 UTC,
 * "2026-11-29T16:42:13Z"), run_id, phase, host{name, os, arch} (gethostname,
 * lowercased uname sysname, uname machine), backend{kind}, git{sha, branch}
 * (only when git_dir is inside a repository; branch null when detached),
 * model, config, then the keys of extra. Must be the first event:
 * TOY_ERR_STATE otherwise. `model` and `config`, when given, must be objects
 * (TOY_ERR_INVALID_ARG). */
enum toy_status toy_events_run_start(struct toy_events *ev, const struct toy_run_start *rs);

/* ---- per-step events ---------------------------------------------------------- */

struct toy_step_event {
    int64_t step;      /* optimizer step, 1-indexed */
    double loss;       /* mean training loss of the step; non-finite: null */
    double lr;         /* learning rate used by this step */
    int64_t tokens;    /* tokens consumed by this step (B * T * accumulation) */
    int64_t wall_us;   /* wall time of the step, microseconds */
    double grad_norm;  /* global L2 gradient norm before clipping; non-finite or NAN (not computed): null */
    const char *phase; /* NULL: "train" */
    json_t *extra;     /* optional keys (ppl, compute_us, ...); NULL: none */
};

/* One `step` event: kind, t, phase, step, loss, lr, tokens, wall_us,
 * grad_norm, then extra's keys. */
enum toy_status toy_events_step(struct toy_events *ev, const struct toy_step_event *s);

struct toy_eval_event {
    int64_t step;    /* the optimizer step the evaluation follows */
    const char *name; /* "validation" (NULL), "final", ... */
    double loss;     /* mean cross-entropy (nats/token); non-finite: null */
    int64_t samples; /* windows (sequences) evaluated */
    int64_t tokens;  /* predicted tokens evaluated; <= 0: omitted */
    json_t *extra;   /* written as "extra": {...}; NULL: omitted */
};

/* One `eval` event: kind, t, phase "eval", step, name, loss, ppl = exp(loss)
 * (null when not finite), samples, tokens, extra. */
enum toy_status toy_events_eval(struct toy_events *ev, const struct toy_eval_event *e);

/* One `sample` event: kind, t, phase "decode", step, prompt, text. */
enum toy_status toy_events_sample(struct toy_events *ev, int64_t step, const char *prompt, const char *text);

/* One `note` event: kind, t, step, text (free-form, e.g. "resumed from step 200"). */
enum toy_status toy_events_note(struct toy_events *ev, int64_t step, const char *text);

/* One `op_timing` event: kind, t, step, compute_us, buckets{OP: us, ...}
 * (buckets NULL: {}; must be an object). */
enum toy_status toy_events_op_timing(struct toy_events *ev, int64_t step, int64_t compute_us, json_t *buckets);

/* Any other event: kind, t, then the keys of `fields` (NULL: none). Keys
 * "kind" and "t" in fields are ignored. run_start and run_end must go
 * through their own functions (TOY_ERR_INVALID_ARG). */
enum toy_status toy_events_emit(struct toy_events *ev, const char *kind, json_t *fields);

/* ---- run_end ------------------------------------------------------------------ */

enum toy_run_reason {
    TOY_RUN_COMPLETED = 0,
    TOY_RUN_INTERRUPTED, /* Ctrl-C / SIGTERM: a checkpoint was saved */
    TOY_RUN_ABORTED,     /* the run stopped itself (non-finite loss, quality gate) */
    TOY_RUN_ERRORED,     /* an error (I/O, out of memory, ...) */
};

/* "completed", "interrupted", "aborted", "errored". */
const char *toy_run_reason_str(enum toy_run_reason r);

/* The exit status of a command whose run ended so, and what run_end's
 * exit_code says: 0 completed, 130 interrupted (what a shell reports for
 * Ctrl-C), 1 aborted or errored. */
int toy_run_reason_exit_code(enum toy_run_reason r);

struct toy_run_end {
    enum toy_run_reason reason;
    const char *error;   /* what went wrong (aborted/errored); NULL: null */
    int64_t final_step;  /* the last optimizer step completed */
    double final_loss;   /* its loss; non-finite: null */
    int exit_code;       /* the process exit code: 0 ok, 1 failure, 2 usage, 130 interrupted */
    json_t *extra;       /* more keys (quality_gate{...}); NULL: none */
};

/* Writes run_end: kind, t, ended_at (ISO-8601 UTC), reason, error,
 * final_step, final_loss, exit_code, then extra's keys; fdatasyncs the file.
 * After it every emit gives TOY_ERR_STATE. */
enum toy_status toy_events_run_end(struct toy_events *ev, const struct toy_run_end *e);

/* ---- reading ------------------------------------------------------------------- */

/* Called once per event, in file order. `event` is borrowed (valid during
 * the call; json_incref to keep it). Return nonzero to stop reading. */
typedef int (*toy_events_fn)(const char *kind, json_t *event, void *user);

struct toy_events_stats {
    int64_t lines;   /* non-empty lines seen */
    int64_t events;  /* events passed to the callback */
    int64_t torn;    /* lines skipped: not JSON, not an object, no string "kind" / number "t" */
    int64_t unknown; /* lines skipped: a kind this reader does not know */
};

/* Reads a stream, calling fn for each well-formed event of a known kind
 * (toy_events_kind_known). Torn lines (a crash mid-write, a writer still
 * writing the last line) and unknown kinds are counted in *stats (may be
 * NULL) and skipped, never an error. Errors: TOY_ERR_IO (cannot open/read). */
enum toy_status toy_events_read(const char *path, toy_events_fn fn, void *user, struct toy_events_stats *stats);

/* Whether `kind` is one of toy/v1's kinds (docs/events.md). */
bool toy_events_kind_known(const char *kind);

/* ---- provenance ----------------------------------------------------------------- */

struct toy_git_info {
    char sha[65];     /* HEAD's commit: 40 hex digits (64 in a SHA-256 repository) */
    char branch[256]; /* "main"; "" when HEAD is detached */
};

/* Reads HEAD of the git repository containing `dir` (NULL: the current
 * directory) from the files alone: .git/HEAD, the loose ref, else
 * packed-refs; worktrees (.git files, commondir) too. No git command runs.
 * Errors: TOY_ERR_NOT_FOUND (not inside a repository, or HEAD's branch has
 * no commit yet), TOY_ERR_FORMAT (an unreadable HEAD or ref). */
enum toy_status toy_git_info(const char *dir, struct toy_git_info *out);

/* The current UTC time as ISO-8601 with a Z: "2026-11-29T16:42:13Z"; buf
 * needs 21 bytes. Returns buf. */
char *toy_iso8601_now(char *buf, size_t n);

#ifdef __cplusplus
}
#endif
#endif
