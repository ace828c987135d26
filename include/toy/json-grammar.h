/* toy/json-grammar.h: constrained decoding to JSON, for OpenAI's
 * response_format (json_object, json_schema). A schema compiles to a
 * grammar; a matcher follows one reply through it byte by byte and masks
 * the logits of every token whose text would leave it, so the sampled
 * reply is a JSON value the schema accepts (an end-of-generation token is
 * allowed only once the value is complete).
 *
 * The schema subset: type (one or a list), properties, required,
 * additionalProperties (false, true or a schema; properties with extra
 * keys are refused), items, minItems, maxItems, minLength, maxLength, enum,
 * const, anyOf / oneOf (up to 64 branches; oneOf is read as anyOf: a
 * value that two branches accept is not refused), $ref to #/$defs/... or
 * #/definitions/... (recursion too), and $defs. Annotations (title,
 * description, default, examples, format, $schema, $id) are ignored;
 * validation keywords it cannot enforce (pattern, minimum, maximum,
 * multipleOf, allOf, not, if, patternProperties, uniqueItems, ...) are an
 * error naming them, never silently dropped. Keys may come in any order,
 * each at most once; whitespace between tokens at most 16 characters in a
 * row; nesting at most 32 deep.
 */
#ifndef TOY_JSON_GRAMMAR_H
#define TOY_JSON_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_tokenizer;
struct toy_json_grammar;
struct toy_json_matcher;

/* schema: JSON Schema text, or NULL for any JSON object (json_object
 * mode). TOY_ERR_INVALID_ARG names what is wrong or unsupported, with its
 * JSON pointer. */
enum toy_status toy_json_grammar_compile(const char *schema, struct toy_json_grammar **out);
/* The same between two fixed texts (either may be NULL): the reply is
 * prefix, the JSON value, then suffix, byte for byte (a tool call's
 * markers, e.g. "<tool_call>\n" and "\n</tool_call>"). Special tokens are
 * allowed where their text is what the prefix or suffix asks for. */
enum toy_status toy_json_grammar_compile_framed(const char *schema, const char *prefix, const char *suffix,
                                                struct toy_json_grammar **out);
/* One of several forms, each a schema between its own fixed texts (a
 * tool call per tool, where the tool's name is in the markers): the reply
 * is whichever form it starts to follow, and may follow several while
 * their texts agree. At most 64 forms. */
struct toy_json_form {
    const char *schema; /* NULL: any object */
    const char *prefix, *suffix;
};
enum toy_status toy_json_grammar_compile_forms(const struct toy_json_form *forms, int n_forms,
                                               struct toy_json_grammar **out);
/* Lets a reply open with a free block, open ... close (a reasoning block:
 * "<think>", "</think>"), anything inside it, then up to 16 blanks before
 * the value (or its form's prefix). */
enum toy_status toy_json_grammar_allow_block(struct toy_json_grammar *g, const char *open, const char *close);
void toy_json_grammar_free(struct toy_json_grammar *g);

/* A reply's place in the grammar; g must outlive it. */
enum toy_status toy_json_matcher_new(const struct toy_json_grammar *g, struct toy_json_matcher **out);
void toy_json_matcher_free(struct toy_json_matcher *m);
/* Would these bytes keep the reply in the grammar? (m unchanged) */
bool toy_json_matcher_accepts(const struct toy_json_matcher *m, const char *bytes, size_t n);
/* Takes the bytes; false (and m unchanged) if they leave the grammar. */
bool toy_json_matcher_feed(struct toy_json_matcher *m, const char *bytes, size_t n);
/* Takes a sampled token's text (an end-of-generation token: nothing);
 * false, m unchanged, if it leaves the grammar. */
bool toy_json_matcher_take(struct toy_json_matcher *m, const struct toy_tokenizer *tok, int32_t id);
/* A whole value has been read: only the end may follow. */
bool toy_json_matcher_done(const struct toy_json_matcher *m);
/* Sets logits[v] = -inf for every token v whose text the grammar does not
 * take next (end-of-generation tokens: unless done; tokens without text:
 * always). Should nothing be left (a vocabulary that cannot spell what
 * the grammar asks), the end-of-generation tokens are, with logit 0: the
 * reply ends rather than leave the grammar. Returns how many tokens are
 * left. The first call builds a table of the tokenizer's tokens in m. */
int64_t toy_json_matcher_mask(struct toy_json_matcher *m, const struct toy_tokenizer *tok, float *logits,
                              int64_t n_vocab);

#ifdef __cplusplus
}
#endif
#endif
