/* paths.h: the paths a command is given: made absolute for the options a
 * run saves (train.json, finetune.json), so that --resume works from any
 * folder, and input files checked before they are read. */
#ifndef TOY_CLI_PATHS_H
#define TOY_CLI_PATHS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The absolute, resolved form of an existing path p (realpath) in buf (n
 * bytes), returning buf; p itself when it is NULL, does not exist (the
 * command's own open then names it) or does not fit. */
const char *toy_cli_abspath(const char *p, char *buf, size_t n);

/* 0 when path is a file the command can read ("-" is standard input);
 * otherwise prints "toy CMD: PATH: why" ("is a directory", "No such file
 * or directory", ...) and returns 1. A directory opens and reads as an
 * empty or unreadable file, which gave misleading errors or empty output. */
int toy_cli_check_input(const char *cmd, const char *path);

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
 * recorded), `steps` against `run_steps`. Prints a note for each change
 * (another thread count changes the losses' last bits; a schedule that is
 * not constant then spans the new length) and returns whether the run's
 * saved options need rewriting. */
bool toy_cli_resume_changes(const char *cmd, int run_threads, int threads, int64_t run_steps, int64_t steps,
                            bool constant_lr);

/* A tokenizer source as `toy tokenize -m` takes it: a path that exists (a
 * file or a folder) as it is, else a model name from `toy models` resolved
 * to its GGUF in buf (n bytes). NULL after printing "toy CMD: why" when it
 * is neither. */
const char *toy_cli_tokenizer_source(const char *cmd, const char *q, char *buf, size_t n);

#endif
