/* toy/chat-template.h: chat templates: a model's tokenizer.chat_template
 * (Jinja, from GGUF or tokenizer_config.json) rendered for a list of
 * messages, plus built-in templates by name for models that carry none.
 *
 * The interpreter covers the Jinja subset real chat templates use, with the
 * environment Hugging Face's apply_chat_template sets up: trim_blocks and
 * lstrip_blocks on, loop controls ({% break %}, {% continue %}), the globals
 * raise_exception(msg), namespace(...), range(...), strftime_now(fmt) (the
 * local time, or SOURCE_DATE_EPOCH in UTC when that is set), and the
 * variables messages, add_generation_prompt, bos_token, eos_token (plus any
 * you pass as JSON, e.g. tools, or gpt-oss's reasoning_effort). Statements:
 * if/elif/else, for (with else, `if` filter, tuple unpacking,
 * loop.index/index0/first/last/length/revindex/previtem/nextitem), set (also
 * `set ns.attr = ...` and block set), macro/call, filter blocks, comments
 * and whitespace control. Expressions:
 * literals, lists, dicts, tuples, attribute/subscript/slice, calls with
 * keyword arguments, arithmetic, ~, comparisons, in / not in, is-tests,
 * and/or/not, the conditional `a if c else b`, filters (trim, length, tojson,
 * upper, lower, title, capitalize, join, default, replace, first, last,
 * list, items, map, select/reject(attr), string, int, float, indent, round,
 * unique, reverse, sort, safe, abs, count, wordcount) and string/dict/list
 * methods (strip, split, startswith, endswith, replace, items, get, ...).
 *
 *     struct toy_chat_template *t;
 *     toy_chat_template_init(toy_tokenizer_chat_template(tok), &t);  // or "chatml"
 *     struct toy_chat_message m[] = {{"system", "Be brief."}, {"user", "Hi"}};
 *     struct toy_chat_vars v = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = true};
 *     char *prompt;
 *     if (toy_chat_template_render(t, m, 2, &v, &prompt)) die(toy_last_error());
 *     ... free(prompt); toy_chat_template_free(t);
 *
 * Errors: a syntax error gives TOY_ERR_FORMAT naming the line; a template
 * that calls raise_exception gives TOY_ERR_INVALID_ARG with its message.
 * A parsed template is immutable and may be rendered from many threads.
 */
#ifndef TOY_CHAT_TEMPLATE_H
#define TOY_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_tokenizer;
struct toy_tokens;
struct toy_chat_template;

struct toy_chat_message {
    const char *role;    /* "system", "user", "assistant", "tool", ... */
    const char *content;
};

struct toy_chat_vars {
    const char *bos_token; /* NULL: "" */
    const char *eos_token;
    bool add_generation_prompt;
    const char *extra_json; /* a JSON object whose keys become variables (tools, ...), or NULL */
};

/* Parses Jinja source, or a built-in name ("chatml", "llama3", "llama2",
 * "mistral", "gemma", "smollm2", "phi3"). */
enum toy_status toy_chat_template_init(const char *source_or_name, struct toy_chat_template **out);
void toy_chat_template_free(struct toy_chat_template *t);

/* The Jinja source of a built-in template, or NULL. */
const char *toy_chat_template_builtin(const char *name);

/* Renders into a malloc'd NUL-terminated string. */
enum toy_status toy_chat_template_render(const struct toy_chat_template *t, const struct toy_chat_message *msgs,
                                         size_t n_msgs, const struct toy_chat_vars *vars, char **out);
/* The same with the messages as JSON: an array of message objects (any
 * fields: role, content, tool_calls, ...) or an object with "messages" (and
 * e.g. "tools", which become variables too). */
enum toy_status toy_chat_template_render_json(const struct toy_chat_template *t, const char *json,
                                              const struct toy_chat_vars *vars, char **out);

/* The encode flags for a rendered chat prompt: special tokens parsed, and
 * BOS added where the tokenizer asks for one, unless the text already
 * starts with the BOS token's text (a template that writes bos_token). */
unsigned toy_chat_encode_flags(const struct toy_tokenizer *tok, const char *text);

/* Renders with the tokenizer's template (or `name_or_source` when not NULL)
 * and its BOS/EOS piece text. TOY_ERR_NOT_FOUND if neither gives a template. */
enum toy_status toy_tokenizer_apply_chat(const struct toy_tokenizer *tok, const char *name_or_source,
                                         const struct toy_chat_message *msgs, size_t n_msgs,
                                         bool add_generation_prompt, char **out);

/* For supervised fine-tuning: renders the conversation (no generation
 * prompt), encodes it with special-token parsing, and sets *mask (malloc'd,
 * one byte per id appended to `ids`) to 1 for the tokens of assistant turns
 * the model should learn -- each assistant message's text after its
 * generation prompt, through its end-of-turn marker -- and 0 elsewhere.
 * Needs a template whose renderings of growing prefixes of the conversation
 * extend one another (all the built-ins do); TOY_ERR_UNSUPPORTED otherwise. */
enum toy_status toy_chat_encode(const struct toy_tokenizer *tok, const char *name_or_source,
                                const struct toy_chat_message *msgs, size_t n_msgs, struct toy_tokens *ids,
                                unsigned char **mask);

#ifdef __cplusplus
}
#endif
#endif
