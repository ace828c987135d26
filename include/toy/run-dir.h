/* toy/run-dir.h: run directories: naming a run, creating its folder, and
 * the `weights/latest` link to its newest checkpoint.
 *
 *     runs/<run_id>/
 *       events.jsonl      the toy/v1 event stream (toy/events.h)
 *       weights/
 *         step_<N>.gguf   checkpoints
 *         latest          relative symlink to the newest checkpoint
 *
 * Run ids come from a template (default "{arch}-{date}-{seq}"): {arch} the
 * caller's label ("llama"), {date} YYYYMMDD and {time} HHMMSS in local time,
 * {seq} a 3-digit daily counter: one more than the largest number that ends
 * a name in the runs folder after today's date ("llama-20261129-007" counts
 * 7), so the first run of a day is 001. $TOY_RUN_ID, when set, is the id.
 *
 *     char id[128], dir[4096];
 *     if (toy_run_create("runs", NULL, "llama", id, sizeof id, dir, sizeof dir)) ...
 *     // dir = "runs/llama-20261129-001", created empty (toy_run_claim wants it so)
 *     ... toy_mkdir_p("runs/llama-20261129-001/weights"), write weights/step_100.gguf ...
 *     toy_run_link_latest("runs/llama-20261129-001/weights/step_100.gguf");
 *
 * Same spec as the earlier system (../shared/reference/toy-features.md §3.1).
 */
#ifndef TOY_RUN_DIR_H
#define TOY_RUN_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOY_RUN_ID_TEMPLATE "{arch}-{date}-{seq}"

/* mkdir -p with mode 0755: creates dir and its missing parents; an existing
 * directory is fine. Errors: TOY_ERR_IO (naming the component that failed). */
enum toy_status toy_mkdir_p(const char *dir);

/* Computes a run id into out (out_size bytes) from tmpl (NULL: the default)
 * and arch (NULL: "run") at time `now` (0: the current time), looking in
 * runs_dir for {seq} (a missing folder counts as empty). $TOY_RUN_ID
 * overrides everything. Errors: TOY_ERR_INVALID_ARG (out NULL, an unknown {token}, an
 * id that is empty, has '/', or starts with '.'), TOY_ERR_RANGE (out too
 * small). */
enum toy_status toy_run_id_make(const char *runs_dir, const char *tmpl, const char *arch, time_t now, char *out,
                                size_t out_size);

/* Names and creates a fresh run folder runs_dir/<id> (runs_dir is created
 * if missing): the id as toy_run_id_make, and if another process took that
 * name first, the next {seq}. With $TOY_RUN_ID an existing folder is
 * taken as it is: claim it with toy_run_claim(dir, true, ...), which refuses
 * one that holds a run.
 * Writes the id and the folder path. Errors: as toy_run_id_make, TOY_ERR_IO,
 * TOY_ERR_STATE (the template has no {seq} and its name is taken). */
enum toy_status toy_run_create(const char *runs_dir, const char *tmpl, const char *arch, char *id, size_t id_size,
                               char *dir, size_t dir_size);

/* Points `latest`, beside checkpoint_path, at it: a relative symlink
 * ("latest" -> "step_100.gguf") made under a temporary name and renamed
 * over the old link, so a reader sees the old or the new link, never none.
 * Errors: TOY_ERR_INVALID_ARG (no file name), TOY_ERR_IO. */
enum toy_status toy_run_link_latest(const char *checkpoint_path);

/* The lock file toy_run_claim keeps in a run folder. */
#define TOY_RUN_LOCK_FILE ".lock"

/* Claims the run folder dir for this process, so that two processes never
 * write one run (two `--resume` at once): creates dir if missing (mkdir
 * -p) and takes an exclusive lock on dir/.lock (flock; it holds this
 * process's pid), held until toy_run_release or until the process ends.
 * fresh: the folder is for a new run and must be new or empty (the lock
 * file aside), since a new run's files would replace or mix with an old
 * run's. Writes the lock's descriptor to *lock_fd (-1 on failure).
 * Errors: TOY_ERR_STATE (another process holds the lock: the message
 * names its pid; fresh and not empty: the message names an entry and
 * suggests --resume), TOY_ERR_IO. */
enum toy_status toy_run_claim(const char *dir, bool fresh, int *lock_fd);

/* Releases a claim (closes the descriptor); -1 is a no-op. */
void toy_run_release(int lock_fd);

/* Removes what a new run that was refused before its first step left in
 * dir (events.jsonl, train.json, finetune.json, the lock file), and with
 * remove_dir dir itself when nothing else is left in it (a folder the run
 * made); a later --out of the same folder then starts afresh instead of
 * finding a run that never ran, and `toy runs` lists no empty run. */
void toy_run_discard(const char *dir, bool remove_dir);

#ifdef __cplusplus
}
#endif
#endif
