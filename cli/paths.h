/* paths.h: the paths a command is given: made absolute for the options a
 * run saves (train.json, finetune.json), so that --resume works from any
 * folder, and input files checked before they are read. */
#ifndef TOY_CLI_PATHS_H
#define TOY_CLI_PATHS_H

#include <stddef.h>

/* The absolute, resolved form of an existing path p (realpath) in buf (n
 * bytes), returning buf; p itself when it is NULL, does not exist (the
 * command's own open then names it) or does not fit. */
const char *toy_cli_abspath(const char *p, char *buf, size_t n);

/* 0 when path is a file the command can read ("-" is standard input);
 * otherwise prints "toy CMD: PATH: why" ("is a directory", "No such file
 * or directory", ...) and returns 1. A directory opens and reads as an
 * empty or unreadable file, which gave misleading errors or empty output. */
int toy_cli_check_input(const char *cmd, const char *path);

/* 0 unless inputs a and b (either may be NULL) are one stream that can be
 * read only once: both "-", or a pipe, FIFO or device named twice
 * (/dev/stdin and "-" too). Then prints "toy CMD: FLAG_A and FLAG_B both
 * read ..." and returns 1: the second reader would find the stream
 * drained, and say only that its input is empty. */
int toy_cli_one_stream(const char *cmd, const char *flag_a, const char *a, const char *flag_b, const char *b);

/* A chat template as --template (finetune, chat-template) and serve's
 * --chat-template take it: a built-in name or Jinja source as given, else
 * the text of a readable file of that name ("-": standard input; malloc'd in *owned, which the
 * caller frees; NULL otherwise). A name that is none of these comes back as
 * given, for toy_chat_template_init to refuse with its message. */
const char *toy_cli_template_source(const char *arg, char **owned);

/* A tokenizer source as `toy tokenize -m` takes it: a path that exists (a
 * file or a folder) as it is, else a model name from `toy models` resolved
 * to its GGUF in buf (n bytes). NULL after printing "toy CMD: why" when it
 * is neither. */
const char *toy_cli_tokenizer_source(const char *cmd, const char *q, char *buf, size_t n);

#endif
