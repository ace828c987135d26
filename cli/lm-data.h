/* lm-data.h: the --data of the language-model commands (toy train, toy
 * eval): a TOYT token file or text, told apart by the file's first bytes
 * and read once, so that a pipe (--data /dev/stdin, or "-") works as a file
 * does. Text becomes tokens by toy_tokenizer_encode_corpus, the rule that
 * `toy tokenize --corpus` follows too: a text and the token file made from
 * it are the same tokens. */
#ifndef TOY_CLI_LM_DATA_H
#define TOY_CLI_LM_DATA_H

#include <stdbool.h>
#include <stddef.h>

#include "toy/data.h"
#include "toy/tokenizer.h"

struct toy_cli_data {
    const char *path;
    bool packed; /* a TOYT token file */
    char *bytes; /* the whole input when it was read: a text, or a token file from a pipe (NULL: a regular
                  * token file, mapped by toy_data_open) */
    size_t len;
};

/* Reads what --data names ("-" is standard input): a regular file's first
 * four bytes say whether it is a token file (then mapped later), anything
 * else is read whole (toy_file_read_all: no seek). Prints "toy CMD: why"
 * naming the path and returns 1 when it cannot be read. */
int toy_cli_data_read(const char *cmd, const char *path, struct toy_cli_data *in);

/* The loader over it: a token file (mapped, or from its bytes), or the text
 * encoded with tok as one document (toy_tokenizer_encode_corpus, with
 * `flags`, e.g. TOY_ENCODE_NO_BOS). Errors are the library's, naming the
 * path. */
enum toy_status toy_cli_data_load(const struct toy_cli_data *in, const struct toy_tokenizer *tok, unsigned flags,
                                  const struct toy_data_opts *o, struct toy_data **out);

void toy_cli_data_free(struct toy_cli_data *in);

#endif
