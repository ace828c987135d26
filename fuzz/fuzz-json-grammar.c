/* fuzz-json-grammar.c: libFuzzer harness for response_format grammars
 * (src/infer/json-grammar.c): a client's schema is compiled and a reply
 * fed through it. The input is the schema, a NUL byte, then the reply
 * (no NUL: the input is a reply for json_object mode); a schema that starts
 * with a space is framed as a Hermes tool call, one that starts with '!'
 * is two forms whose prefixes overlap ("<a>", "<ab>"), after an optional
 * <think> block. Besides not
 * crashing: a reply the matcher takes whole and calls done must be JSON
 * (jansson parses it; abort otherwise; not checked for the forms), and feeding it in two pieces at
 * every 7th cut agrees with feeding it at once. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toy/json-grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *in = (const char *)data, *nul = memchr(in, 0, size);
    char *schema = nul ? strndup(in, (size_t)(nul - in)) : NULL;
    const char *doc = nul ? nul + 1 : in;
    size_t n = nul ? size - (size_t)(nul - in) - 1 : size;
    struct toy_json_grammar *g;
    /* a schema starting with a space: framed as a Hermes tool call */
    bool framed = schema && schema[0] == ' ', forms = schema && schema[0] == '!';
    struct toy_json_form two_forms[] = {{schema ? schema + 1 : NULL, "<a>", NULL}, {schema ? schema + 1 : NULL, "<ab>", ";"}};
    if (forms ? toy_json_grammar_compile_forms(two_forms, 2, &g) || toy_json_grammar_allow_block(g, "<think>", "</think>")
        : framed ? toy_json_grammar_compile_framed(schema, "<tool_call>\n", "\n</tool_call>", &g)
                 : toy_json_grammar_compile(schema, &g)) {
        if (forms) toy_json_grammar_free(g);
        free(schema);
        return 0;
    }
    struct toy_json_matcher *m;
    if (!toy_json_matcher_new(g, &m)) {
        bool all = toy_json_matcher_feed(m, doc, n);
        size_t skip = framed ? strlen("<tool_call>\n") : 0, cut = framed ? strlen("\n</tool_call>") : 0;
        if (all && !forms && toy_json_matcher_done(m) && n >= skip + cut) {
            json_t *v = json_loadb(doc + skip, n - skip - cut, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL); /* \u0000 is JSON */
            if (!v) abort();
            json_decref(v);
        }
        for (size_t k = 0; k <= n; k += 7) {
            struct toy_json_matcher *p;
            if (toy_json_matcher_new(g, &p)) break;
            bool two = toy_json_matcher_feed(p, doc, k) && toy_json_matcher_feed(p, doc + k, n - k);
            if (two != all) abort();
            toy_json_matcher_free(p);
        }
        toy_json_matcher_free(m);
    }
    toy_json_grammar_free(g);
    free(schema);
    return 0;
}
