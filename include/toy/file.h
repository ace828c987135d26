/* toy/file.h: writing a file whole or not at all. Every file toy writes
 * (GGUF models and checkpoints, token files, tokenizers, traces, run
 * options) goes through this: the bytes go to a temp file beside the
 * target, which is synced and renamed over it, so a reader (or a crash, a
 * full disk, a signal) sees the old file or the new one, never a part.
 *
 *     struct toy_file_replace r;
 *     if (toy_file_replace_begin("out.bin", &r)) return ...;  // names why
 *     bool ok = fwrite(buf, 1, n, r.f) == n;
 *     if (toy_file_replace_end(&r, ok)) return ...;            // renamed, or removed
 *
 * What is there already: a symbolic link is written through (its target
 * is replaced, the link stays), an existing file keeps its permissions,
 * and anything that is not a regular file (a device such as /dev/null, a
 * pipe, a folder) is refused: replacing /dev/full as root turned it into
 * a plain file.
 *
 * Reading a file whole: toy_file_read_all reads regular files and streams
 * alike (a pipe, /dev/stdin, a FIFO, a character device), so a command
 * given `--data /dev/stdin` needs no seek. */
#ifndef TOY_FILE_H
#define TOY_FILE_H

#include <stdbool.h>
#include <stdio.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_file_replace {
    FILE *f;          /* write the content here */
    char path[4096];  /* the file that will be replaced: the target, symbolic links resolved */
    char tmp[4160];   /* "<path>.tmp.<pid>" */
    const char *name; /* the path as given, for messages */
    int slot;         /* toy_file_remove_temps' record of tmp (-1: none) */
};

/* Opens the temp file for `path`. Errors: TOY_ERR_INVALID_ARG (empty or
 * "-", r NULL), TOY_ERR_IO (not a regular file, a dangling link, the folder
 * cannot take the file: each named with `path`). */
enum toy_status toy_file_replace_begin(const char *path, struct toy_file_replace *r);

/* ok: flushes, syncs and renames the temp file over the target (then syncs
 * the folder); a write error found there is TOY_ERR_IO naming the file.
 * !ok (the caller's writes failed) or any error: removes the temp file,
 * leaving the target as it was, and returns TOY_ERR_IO naming the file and
 * errno's reason (toy_file_replace_abort keeps the caller's own error).
 * Either way r->f is closed. */
enum toy_status toy_file_replace_end(struct toy_file_replace *r, bool ok);

/* Removes the temp file and closes r->f, leaving the target as it was and
 * the last error as it is: for a caller that has its own error to return. */
void toy_file_replace_abort(struct toy_file_replace *r);

/* Removes the temp files of the replacements in progress (up to 8 are
 * tracked at once), for a signal handler that ends the process:
 * async-signal-safe (unlink only). */
void toy_file_remove_temps(void);

/* Bytes of physical memory: what a file's contents, or what a file
 * declares (a header's sizes), must fit in before toy allocates them; past
 * it, overcommit hands out pages that the OOM killer then takes. */
double toy_ram_bytes(void);

/* Reads all of path ("-" is standard input) into *buf (malloc'd, with a NUL
 * after the last byte, which *len does not count), by reading until end of
 * file: regular files and non-seekable inputs (pipes, FIFOs, /dev/stdin)
 * the same way. Errors, each naming path: TOY_ERR_IO (cannot open, "is a
 * directory", a read error with errno's reason), TOY_ERR_NOMEM. On error
 * *buf is NULL and *len 0. */
enum toy_status toy_file_read_all(const char *path, char **buf, size_t *len);

/* The same from an open descriptor (left open), read from where it is;
 * `name` names it in messages. For an input opened once that must not be
 * opened again: a FIFO's writer may be gone by then. */
enum toy_status toy_file_read_fd(int fd, const char *name, char **buf, size_t *len);

/* A file's bytes from one open: a regular file mapped read-only, anything
 * else ("-" for standard input, a pipe, a FIFO, a device) read to its end,
 * since it can be read only once and has no size to trust. An empty file
 * is n 0 with p pointing at "". Errors, each naming path: TOY_ERR_IO
 * (cannot open, "is a directory", mmap or read errors), TOY_ERR_RANGE (too
 * big to map), TOY_ERR_NOMEM. toy_file_bytes_close unmaps or frees; a
 * caller that keeps the mapping takes map (then sets it NULL). */
struct toy_file_bytes {
    const unsigned char *p; /* (n) */
    size_t n;
    void *map; /* the mapping (n bytes) of a regular file, or NULL */
    char *buf; /* the bytes read from a stream, or NULL */
};
enum toy_status toy_file_bytes_open(const char *path, struct toy_file_bytes *b);
void toy_file_bytes_close(struct toy_file_bytes *b);

#ifdef __cplusplus
}
#endif

#endif
