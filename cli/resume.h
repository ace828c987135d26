/* resume.h: what `--resume` of train and finetune checks and says before a
 * run goes on: that the data is the data it trained on, and what changes
 * with a new --steps or thread count. */
#ifndef TOY_CLI_RESUME_H
#define TOY_CLI_RESUME_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* --resume DIR: the run's saved options, DIR/`file` ("train.json",
 * "finetune.json"), or NULL after printing "toy CMD: cannot resume: ..."
 * with why: no such folder, a folder that is not a run, a run of the other
 * command (named, with the command that continues it), a `toy demo` run
 * (which cannot be resumed: its text is made in memory), or a file that
 * does not parse (JSON error and where). */
json_t *toy_cli_resume_load(const char *cmd, const char *dir, const char *file);

/* The data a run trains on, as train.json / finetune.json record it: the
 * fingerprint (toy_data_fingerprint, toy_sft_fingerprint) fp of n `unit`
 * ("tokens", "examples") in hex (hex, 17 bytes). With --resume, `recorded`
 * is the run's (NULL for a run from before fingerprints: accepted): another
 * value prints "toy CMD: cannot resume: DATA is not the data this run
 * trained on ..." naming both counts and the file `saved` that records them,
 * and returns 1. */
int toy_cli_resume_data(const char *cmd, const char *data, uint64_t fp, int64_t n, const char *unit,
                        const char *recorded, int64_t recorded_n, const char *saved, char hex[17]);

/* --resume with the flags that may change how a run goes on: `threads`
 * (0: all cores) against the run's recorded `run_threads` (0: none
 * recorded), `steps` against `run_steps`. Keeps a note for each change
 * (another thread count changes the losses' last bits; a schedule that is
 * not constant then spans the new length), which toy_cli_resume_notes
 * prints once every check has passed and the run goes on, and returns
 * whether the run's saved options need rewriting. */
bool toy_cli_resume_changes(const char *cmd, int run_threads, int threads, int64_t run_steps, int64_t steps,
                            bool constant_lr);
void toy_cli_resume_notes(void);

/* --resume: each --flag in argv[1..argc) not in `applies` (NULL-ended) is
 * said to be ignored, "toy CMD: FLAG is ignored with --resume: the run keeps
 * the settings in its SAVED (only WHICH apply)": the run goes on with its
 * own settings, not silently with others. */
void toy_cli_resume_ignored(const char *cmd, int argc, char **argv, const char *const *applies, const char *saved,
                            const char *which);

#endif
