/* json-out.h: printing a command's --json result. */
#ifndef TOY_CLI_JSON_OUT_H
#define TOY_CLI_JSON_OUT_H

#include <jansson.h>

/* Prints j on one line (or indented, per flags) to stdout and releases it.
 * A NULL j (json_pack refused a value: text that is not UTF-8, or no
 * memory) or a failed dump is an error message naming the command, not a
 * crash or a silent empty result: returns 1 then, else 0. */
int toy_cli_print_json(const char *cmd, json_t *j, size_t flags);

/* A JSON string of model text s[0..n) (NULL: ""), each byte that is not
 * valid UTF-8 replaced by U+FFFD (decoded tokens can cut a character, and
 * JSON refuses such strings); NULL when out of memory. */
json_t *toy_cli_json_text(const char *s, size_t n);

/* Writes j (indented, sorted keys) to path through a temporary file and a
 * rename, so a full disk leaves no half-written file, and releases j. On
 * failure prints "toy CMD: cannot write PATH: why" and returns 1. */
int toy_cli_write_json_file(const char *cmd, json_t *j, const char *path);

#endif
