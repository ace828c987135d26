/* generate-gpt2.h: `toy generate` for GPT-2 GGUFs (cli/generate-gpt2.c);
 * cmd-generate.c dispatches here on general.architecture = "gpt2". */
#ifndef TOY_CLI_GENERATE_GPT2_H
#define TOY_CLI_GENERATE_GPT2_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "toy/generate.h"

struct toy_tokens;
/* --prompt-ids: token ids separated by commas and/or spaces ("1,2 3") into
 * ids; anything else, or an id outside 0..2^31-1, is an error printed for
 * the command. Returns 0, or 2 (a usage error: the exit code). */
int toy_cli_parse_prompt_ids(const char *s, struct toy_tokens *ids);

/* What a generation prints, for both model families: text mode echoes the
 * prompt with the first piece (so a prompt that is refused prints nothing)
 * and streams the text; JSON mode keeps the ids, logprobs and the text as
 * it was emitted (the same text, stop strings cut, as text mode prints). */
struct toy_cli_gen_out {
    bool json, echoed;
    const char *prompt;  /* text mode: echoed before the first piece; NULL: none */
    json_t *ids, *lps;
    char *text;
    size_t len, cap;
    const char *spec;    /* "lookup" (--lookup) or "draft" (--draft): json reports what the drafts did */
};
bool toy_cli_gen_on_token(void *ud, int32_t id, const char *text, size_t len, float lp);
/* text mode, after a generation that succeeded: the prompt if nothing was printed yet */
void toy_cli_gen_echo(struct toy_cli_gen_out *o);
/* After a generation that succeeded: the toy/generate-v1 object (json; arch
 * added when not NULL), or the text's end and, on a terminal, the speeds.
 * Returns the exit code: 130 when a stop signal ended it (finish_reason
 * "interrupted"), 1 when the output cannot be written, else 0. */
int toy_cli_gen_finish(struct toy_cli_gen_out *o, const struct toy_tokens *prompt, const struct toy_generate_result *r,
                       const char *arch);

/* --draft: a draft model (a Llama-family or GPT-2 GGUF, or a name from
 * `toy models`) behind a generator of its own on the model's threads, with
 * the model's context (n_ctx 0 or past the draft's: the draft's) and cache
 * type. */
struct toy_cli_draft_opts {
    const char *path;    /* NULL: no draft model */
    int64_t n_ctx;
    enum toy_dtype kv_type;
    struct toy_threadpool *tp;
};
struct toy_cli_draft {
    struct toy_llama *llama;
    struct toy_gpt2 *gpt2;
    struct toy_tokenizer *tok;
    struct toy_generator *gen;
};
/* Loads it into *d (zeroed first); an error is printed for cmd ("generate")
 * and returns 1. */
int toy_cli_draft_open(const char *cmd, const struct toy_cli_draft_opts *o, struct toy_cli_draft *d);
void toy_cli_draft_close(struct toy_cli_draft *d);

/* True when `path` is a GGUF whose general.architecture is "gpt2". */
bool toy_cli_is_gpt2(const char *path);
/* Whether path is a GGUF of a BERT encoder (embeddings only) */
bool toy_cli_is_bert(const char *path);
/* Loads the GPT-2 GGUF (mapped), encodes the prompt with its tokenizer
 * (special: special-token text such as <|endoftext|> as those tokens, as
 * --special does) or takes prompt_ids ("1 2 3"), generates with a KV cache of kv_type and prints the
 * text (json: the toy/generate-v1 object; trace_path: a Chrome trace; bf16:
 * the products over f32/f16 matrices in bf16, as --bf16; draft: --draft's path, or NULL).
 * Returns the exit code. */
int toy_cli_generate_gpt2(const char *path, const char *prompt, const char *prompt_ids,
                          const struct toy_generate_params *gp, int64_t n_ctx, enum toy_dtype kv_type, int threads,
                          bool json, bool special, const char *trace_path, bool bf16, const char *draft);
/* Generates after ids with gen and prints it as above (arch: the JSON's
 * "arch", or NULL); trace_path: a Chrome trace of the run (not generating
 * when it cannot be opened); draft (may be NULL): the draft model to load
 * for it. Returns the exit code. */
int toy_cli_run_generator(struct toy_generator *gen, const struct toy_tokens *ids, const struct toy_generate_params *gp,
                          const char *prompt, bool json, const char *trace_path, const char *arch,
                          const struct toy_cli_draft_opts *draft);

#endif
