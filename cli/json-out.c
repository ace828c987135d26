/* json-out.c: printing a command's --json result (json-out.h). */
#include <stdio.h>
#include <stdlib.h>

#include "json-out.h"

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
