/* test-install.c: `make install` gives a library that a program builds
 * against with pkg-config, shared and static (tests/install/check.sh; needs
 * TOY_BIN, set by make check, and the source tree; skipped otherwise). */
#include <criterion/criterion.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define MAKE_VARS "SANITIZE=1" /* the build this test binary comes from */
#else
#define MAKE_VARS ""
#endif

Test(install, make_install_gives_a_library_pkg_config_builds_against, .timeout = 300) {
    const char *bin = getenv("TOY_BIN");
    if (!bin || access(bin, X_OK)) cr_skip_test("TOY_BIN is not set");
    if (access("tests/install/check.sh", R_OK) || access("Makefile", R_OK)) cr_skip_test("not in the source tree");
    char path[1024], cmd[2048];
    snprintf(path, sizeof path, "%s", bin);
    snprintf(cmd, sizeof cmd, "bash tests/install/check.sh '%s' " MAKE_VARS " 2>&1", dirname(path));
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s\n%s", cmd, out);
    cr_expect(strstr(out, "install check: ok"), "%s", out);
}
