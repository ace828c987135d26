/* test-api.c: libtoy as a program that embeds it sees it: the names it
 * exports, and the public functions called the way a user calls them
 * (including the plausible mistakes: NULL, wrong order, wrong shapes),
 * which must give a status and a message, not a crash. */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "toy/toy.h"

/* The build folder that holds libtoy.a and libtoy.so: TOY_BIN's folder. */
static const char *build_dir(void) {
    static char dir[4096];
    const char *b = getenv("TOY_BIN");
    if (!b) cr_skip("TOY_BIN not set (run through make check)");
    snprintf(dir, sizeof dir, "%s", b);
    return dirname(dir);
}

/* Every global symbol `nm FLAGS LIB` lists as defined must start with
 * toy_: a user's program (or another library) that defines, say, its own
 * tok_push or jinja_parse would otherwise clash with libtoy's. */
static void only_toy_names(const char *lib, const char *flags) {
    char path[4200], cmd[4400], line[512];
    snprintf(path, sizeof path, "%s/%s", build_dir(), lib);
    struct stat sb;
    if (stat(path, &sb)) cr_skip("%s not built", path);
    snprintf(cmd, sizeof cmd, "nm %s --defined-only '%s' 2>/dev/null", flags, path);
    FILE *p = popen(cmd, "r");
    if (!p) cr_skip("cannot run nm");
    int n = 0, bad = 0;
    char first_bad[8][256];
    while (fgets(line, sizeof line, p)) {
        char addr[64], type[8], name[256];
        if (sscanf(line, "%63s %7s %255s", addr, type, name) != 3) continue; /* "file.o:" headers */
        if (strchr("UvVwW", type[0]) || (type[0] >= 'a' && type[0] <= 'z')) continue; /* not a global definition */
        n++;
        if (strncmp(name, "toy_", 4)) {
            if (bad < 8) snprintf(first_bad[bad], sizeof first_bad[bad], "%s", name);
            bad++;
        }
    }
    int rc = pclose(p);
    if (rc != 0 && n == 0) cr_skip("nm is not available");
    cr_assert_gt(n, 100, "%s: only %d global symbols listed", lib, n);
    for (int i = 0; i < bad && i < 8; i++) cr_log_error("%s exports %s", lib, first_bad[i]);
    cr_assert_eq(bad, 0, "%s: %d global symbols without the toy_ prefix (first: %s)", lib, bad,
                 bad ? first_bad[0] : "");
}

Test(api, shared_library_exports_only_toy_names) { only_toy_names("libtoy.so", "-D"); }
Test(api, static_library_defines_only_toy_globals) { only_toy_names("libtoy.a", "-g"); }
