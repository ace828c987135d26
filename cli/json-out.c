/* json-out.c: printing a command's --json result (json-out.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json-out.h"
#include "toy/file.h"
#include "toy/tokenizer.h"

int toy_cli_print_json(const char *cmd, json_t *j, size_t flags) {
    char *s = j ? json_dumps(j, flags) : NULL;
    json_decref(j);
    if (!s) {
        fprintf(stderr, "toy %s: could not write the JSON result (a string that is not UTF-8, or out of memory)\n",
                cmd);
        return 1;
    }
    puts(s);
    free(s);
    return 0;
}

json_t *toy_cli_json_text(const char *s, size_t n) {
    if (!s) return json_string("");
    if (toy_utf8_valid(s, n)) return json_stringn(s, n);
    char *clean = toy_utf8_clean(s, n, &n);
    json_t *j = clean ? json_stringn(clean, n) : NULL;
    free(clean);
    return j;
}

int toy_cli_write_json_file(const char *cmd, json_t *j, const char *path) {
    struct toy_file_replace r;
    enum toy_status st = j ? toy_file_replace_begin(path, &r) : TOY_OK;
    if (!j) {
        fprintf(stderr, "toy %s: cannot write %s: a value JSON cannot hold, or out of memory\n", cmd, path);
        return 1;
    }
    if (!st) {
        bool ok = !json_dumpf(j, r.f, JSON_INDENT(1) | JSON_SORT_KEYS) && fputc('\n', r.f) != EOF;
        st = toy_file_replace_end(&r, ok);
    }
    json_decref(j);
    if (!st) return 0;
    fprintf(stderr, "toy %s: cannot write %s\n", cmd, toy_last_error());
    return 1;
}
