/* json-out.c: printing a command's --json result (json-out.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json-out.h"
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
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    const char *why = NULL;
    FILE *f = j ? fopen(tmp, "w") : NULL;
    if (!j) why = "a value JSON cannot hold, or out of memory";
    else if (!f) why = strerror(errno);
    else {
        int bad = json_dumpf(j, f, JSON_INDENT(1) | JSON_SORT_KEYS) || fputc('\n', f) == EOF;
        bad |= fflush(f) != 0; /* a full disk shows here at the latest */
        if (bad) why = strerror(errno ? errno : EIO);
        if (fclose(f) && !why) why = strerror(errno);
        if (!why && rename(tmp, path)) why = strerror(errno);
        if (why) unlink(tmp);
    }
    json_decref(j);
    if (!why) return 0;
    fprintf(stderr, "toy %s: cannot write %s: %s\n", cmd, path, why);
    return 1;
}
