/* cmd-demo.c: `toy demo` placeholder until the training loop lands. */
#include <stdio.h>
int toy_cmd_demo(int argc, char **argv) {
    (void)argc; (void)argv;
    return 0;
}
