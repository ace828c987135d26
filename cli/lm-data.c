/* lm-data.c: --data of toy train and toy eval, read once (lm-data.h). */
#include "lm-data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "toy/file.h"

int toy_cli_data_read(const char *cmd, const char *path, struct toy_cli_data *in) {
    memset(in, 0, sizeof *in);
    in->path = path;
    struct stat sb;
    if (strcmp(path, "-") && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
        /* a regular file: a token file is mapped, not read, so only its magic is read now */
        FILE *f = fopen(path, "rb");
        if (!f) { fprintf(stderr, "toy %s: %s: %s\n", cmd, path, strerror(errno)); return 1; }
        char magic[4];
        errno = 0;
        size_t got = fread(magic, 1, 4, f);
        int err = ferror(f) ? errno : 0;
        fclose(f);
        if (err) {
            fprintf(stderr, "toy %s: %s: read error: %s\n", cmd, path, strerror(err));
            return 1;
        }
        if (got == 4 && !memcmp(magic, TOY_TOKEN_FILE_MAGIC, 4)) { in->packed = true; return 0; }
    }
    if (toy_file_read_all(path, &in->bytes, &in->len)) {
        fprintf(stderr, "toy %s: %s\n", cmd, toy_last_error());
        return 1;
    }
    in->packed = in->len >= 4 && !memcmp(in->bytes, TOY_TOKEN_FILE_MAGIC, 4);
    return 0;
}

enum toy_status toy_cli_data_load(const struct toy_cli_data *in, const struct toy_tokenizer *tok, unsigned flags,
                                  const struct toy_data_opts *o, struct toy_data **out) {
    *out = NULL;
    if (in->packed)
        return in->bytes ? toy_data_from_token_bytes(in->bytes, in->len, in->path, o, out)
                         : toy_data_open(in->path, o, out);
    struct toy_tokens ids = {0};
    enum toy_status st = toy_tokenizer_encode_corpus(tok, in->bytes, in->len, flags, &ids);
    if (st) {
        toy_tokens_free(&ids);
        return toy_error(st, "%s: %s", in->path, toy_last_error());
    }
    st = toy_data_from_ids(ids.ids, ids.n, toy_tokenizer_n_vocab(tok), o, out);
    toy_tokens_free(&ids);
    if (st) return toy_error(st, "%s: %s", in->path, toy_last_error());
    return TOY_OK;
}

void toy_cli_data_free(struct toy_cli_data *in) {
    free(in->bytes);
    in->bytes = NULL;
    in->len = 0;
}
