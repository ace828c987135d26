/* test-json-grammar.c: constrained decoding to JSON (toy/json-grammar.h):
 * documents each schema takes or refuses, byte by byte; random walks
 * through the masked logits of a real tokenizer (SmolLM2's) that always
 * end in JSON the schema accepts, checked by a small validator written
 * here from the JSON Schema rules (not by the matcher); and schemas that
 * are refused with the keyword named.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/json-grammar.h"
#include "toy/rng.h"
#include "toy/tokenizer.h"

#define TD "../shared/testdata/"
#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

static const char person[] =
    "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 6},"
    " \"age\": {\"type\": \"integer\"}, \"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"bc\", 7, null]},"
    " \"maxItems\": 3}, \"nick\": {\"anyOf\": [{\"type\": \"string\", \"maxLength\": 4}, {\"type\": \"null\"}]}},"
    " \"required\": [\"name\", \"age\"], \"additionalProperties\": false}";

/* a discriminated union: both branches are objects */
#define SHAPES                                                                                                   \
    "{\"anyOf\": [{\"type\": \"object\", \"properties\": {\"kind\": {\"const\": \"circle\"}, \"r\": {\"type\": " \
    "\"number\"}}, \"required\": [\"kind\", \"r\"], \"additionalProperties\": false}, {\"type\": \"object\", "      \
    "\"properties\": {\"kind\": {\"const\": \"rect\"}, \"w\": {\"type\": \"number\"}, \"h\": {\"type\": " \
    "\"number\"}}, \"required\": [\"kind\", \"w\", \"h\"], \"additionalProperties\": false}]}"
static const char shapes[] = SHAPES;

static bool whole(const struct toy_json_grammar *g, const char *doc) {
    struct toy_json_matcher *m;
    MUST(toy_json_matcher_new(g, &m));
    bool ok = toy_json_matcher_feed(m, doc, strlen(doc)) && toy_json_matcher_done(m);
    toy_json_matcher_free(m);
    return ok;
}

Test(json_grammar, documents_the_schema_takes_and_refuses) {
    struct {
        const char *schema, *doc;
        bool ok;
    } cases[] = {
        {person, "{\"name\": \"Ann\", \"age\": 31}", true},
        {person, "{\"age\":-4,\"name\":\"\",\"tags\":[\"bc\",7,null],\"nick\":null}", true},
        {person, "{\"name\": \"Ann\"}", false},                        /* age is required */
        {person, "{\"name\": \"Ann\", \"age\": 3.5}", false},          /* an integer */
        {person, "{\"name\": \"Annabel\", \"age\": 3}", false},        /* maxLength 6 */
        {person, "{\"name\": \"A\", \"age\": 3, \"x\": 1}", false},    /* no other keys */
        {person, "{\"name\": \"A\", \"name\": \"B\", \"age\": 3}", false}, /* each key once */
        {person, "{\"name\": \"A\", \"age\": 3, \"tags\": [\"b\"]}", false}, /* enum */
        {person, "{\"name\": \"A\", \"age\": 3, \"tags\": [7, 7, 7, 7]}", false}, /* maxItems */
        {person, "{\"name\": \"A\", \"age\": 03}", false},             /* JSON numbers */
        {person, "{\"name\": \"A\\u00e9\\n\", \"age\": 1e2}", false},  /* an exponent is not an integer */
        {person, "{\"name\": \"A\\u00e9\\n\", \"age\": 100}", true},
        {person, "{\"name\": \"A\", \"age\": 1,}", false},
        {person, "{\"name\": \"A\", \"age\": 1} ", false},            /* nothing after the value */
        {NULL, "{}", true},                                              /* json_object: any object */
        {NULL, "{\"a\": [1, -2.5e+3, true, false, null, {\"b\": \"\\\"\"}], \"c\": {}}", true},
        {NULL, "[1]", false},
        {NULL, "{\"a\": tru}", false},
        {NULL, "{\"a\": \"\x01\"}", false},
        {NULL, "{                 \"a\": 1}", false},                    /* 17 blanks in a row */
        {"{\"type\": \"number\"}", "12.5", true},
        {"{\"type\": \"number\"}", "12.", false},
        {"{\"enum\": [1, 12, \"x\"]}", "1", true},
        {"{\"enum\": [1, 12, \"x\"]}", "12", true},
        {"{\"enum\": [1, 12, \"x\"]}", "123", false},
        {"{\"type\": [\"string\", \"null\"]}", "null", true},
        {"{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"minItems\": 2}", "[true]", false},
        {"{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"minItems\": 2}", "[true , false]", true},
        {"{\"$defs\": {\"n\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, \"next\": "
         "{\"anyOf\": [{\"$ref\": \"#/$defs/n\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", \"next\"]}}, "
         "\"$ref\": \"#/$defs/n\"}",
         "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}", true},
        {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": 1, \"y\": 2}", true},
        {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", "{\"x\": \"1\"}", false},
        {"{\"const\": {\"k\": [1, 2]}}", "{\"k\":[1,2]}", true},
        {NULL, "{\"s\": \"\\ud83d\\ude00\"}", true},                 /* a surrogate pair */
        {NULL, "{\"s\": \"\\ud83d\"}", false},                          /* a lone high surrogate */
        {NULL, "{\"s\": \"\\ude00\"}", false},                          /* a lone low one */
        {NULL, "{\"s\": \"\xc3\xa9\xe2\x82\"}", false},               /* a character cut off */
        {NULL, "{\"s\": \"\xed\xa0\x80\"}", false},                    /* UTF-8 of a surrogate */
        {NULL, "{\"n\": 1234567890123456789}", false},                      /* beyond 64 bits */
        {NULL, "{\"n\": 1e100}", false},                                    /* an exponent of 3 digits */
        /* unions whose branches start alike: the matcher follows each until the text tells them apart */
        {shapes, "{\"kind\": \"circle\", \"r\": 1.5}", true},
        {shapes, "{\"kind\":\"rect\",\"w\":1,\"h\":2}", true},
        {shapes, "{\"w\": 1, \"h\": 2, \"kind\": \"rect\"}", true},  /* told apart only at the end */
        {shapes, "{\"kind\": \"circle\", \"w\": 1}", false},
        {shapes, "{\"r\": 1, \"kind\": \"rect\"}", false},
        {shapes, "{\"kind\": \"rect\", \"w\": 1}", false},              /* h is required */
        {"{\"anyOf\": [{\"type\": \"string\", \"maxLength\": 2}, {\"enum\": [\"hello\"]}]}", "\"hi\"", true},
        {"{\"anyOf\": [{\"type\": \"string\", \"maxLength\": 2}, {\"enum\": [\"hello\"]}]}", "\"hello\"", true},
        {"{\"anyOf\": [{\"type\": \"string\", \"maxLength\": 2}, {\"enum\": [\"hello\"]}]}", "\"hey\"", false},
        {"{\"type\": [\"integer\", \"number\"]}", "2.5", true},
        {"{\"oneOf\": [{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, {\"type\": \"array\", "
         "\"items\": {\"type\": \"string\"}}]}", "[1, 2]", true},
        {"{\"oneOf\": [{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, {\"type\": \"array\", "
         "\"items\": {\"type\": \"string\"}}]}", "[1, \"2\"]", false},
        {"{\"oneOf\": [{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}, {\"type\": \"array\", "
         "\"items\": {\"type\": \"string\"}}]}", "[]", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct toy_json_grammar *g;
        MUST(toy_json_grammar_compile(cases[i].schema, &g));
        cr_expect_eq(whole(g, cases[i].doc), cases[i].ok, "case %zu: %s", i, cases[i].doc);
        toy_json_grammar_free(g);
    }
}

/* a value between fixed texts (a tool call's markers) */
Test(json_grammar, framed_values) {
    struct toy_json_grammar *g;
    MUST(toy_json_grammar_compile_framed("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}",
                                         "<tool_call>\n", "\n</tool_call>", &g));
    cr_expect(whole(g, "<tool_call>\n{\"a\": 1}\n</tool_call>"));
    cr_expect(!whole(g, "<tool_call>\n{\"a\": 1}"), "the suffix is due");
    cr_expect(!whole(g, "<tool_call>{\"a\": 1}\n</tool_call>"), "the prefix byte for byte");
    cr_expect(!whole(g, "<tool_call>\n{\"a\": 1}\n</tool_call>\n"), "nothing after the suffix");
    cr_expect(!whole(g, "<tool_call>\n{\"a\": 1} \n</tool_call>"), "the suffix right after the value");
    toy_json_grammar_free(g);
    MUST(toy_json_grammar_compile_framed("{\"type\": \"integer\"}", "[N]", NULL, &g));
    cr_expect(whole(g, "[N]42") && !whole(g, "[N]") && !whole(g, "42"));
    toy_json_grammar_free(g);
}

/* one of several framed forms (a call per tool, the name in the markers) */
Test(json_grammar, one_of_several_forms) {
    struct toy_json_form forms[] = {
        {"{\"type\": \"object\", \"properties\": {\"n\": {\"type\": \"integer\"}}, \"required\": [\"n\"]}",
         "call f(", ")"},
        {"{\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\"}}, \"required\": [\"s\"]}",
         "call fg(", ");"},
        {"{\"$defs\": {\"b\": {\"type\": \"boolean\"}}, \"type\": \"object\", \"properties\": {\"b\": "
         "{\"$ref\": \"#/$defs/b\"}}}", "call h(", ")"},
    };
    struct toy_json_grammar *g;
    MUST(toy_json_grammar_compile_forms(forms, 3, &g));
    cr_expect(whole(g, "call f({\"n\": 1})"));
    cr_expect(whole(g, "call fg({\"s\": \"x\"});"));
    cr_expect(whole(g, "call h({\"b\": true})"), "each form's $refs are its own");
    cr_expect(!whole(g, "call f({\"s\": \"x\"})"), "f's schema");
    cr_expect(!whole(g, "call fg({\"s\": \"x\"})"), "fg's suffix");
    cr_expect(!whole(g, "call g({\"n\": 1})"));
    toy_json_grammar_free(g);
    forms[1].schema = "{\"type\": \"object\", \"minimum\": 1}";
    cr_expect_eq(toy_json_grammar_compile_forms(forms, 3, &g), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "form 1: ") && strstr(toy_last_error(), "minimum"), "%s", toy_last_error());
    cr_expect_eq(toy_json_grammar_compile_forms(forms, 0, &g), TOY_ERR_INVALID_ARG);
}

/* a reasoning block may come first, then the value */
Test(json_grammar, a_free_block_may_come_first) {
    struct toy_json_grammar *g;
    MUST(toy_json_grammar_compile_framed(NULL, "<tool_call>\n", "\n</tool_call>", &g));
    MUST(toy_json_grammar_allow_block(g, "<think>", "</think>"));
    const char *call = "<tool_call>\n{\"a\": 1}\n</tool_call>";
    char doc[256];
    cr_expect(whole(g, call), "the block is optional");
    snprintf(doc, sizeof doc, "<think>\nso: {\"a\" <b> </thin </think>\n\n%s", call);
    cr_expect(whole(g, doc), "%s", doc);
    snprintf(doc, sizeof doc, "<think>a<</think</think>%s", call);
    cr_expect(whole(g, doc), "the closing text found after a false start");
    snprintf(doc, sizeof doc, "<think></think>                 %s", call);
    cr_expect(!whole(g, doc), "17 blanks");
    cr_expect(!whole(g, "<think>still thinking"), "the value is due");
    cr_expect(!whole(g, "<think></think>"), "the value is due");
    snprintf(doc, sizeof doc, "<think></think>x%s", call);
    cr_expect(!whole(g, doc));
    snprintf(doc, sizeof doc, "%s<think></think>", call);
    cr_expect(!whole(g, doc), "the block only first");
    toy_json_grammar_free(g);
}

/* the mask with the block and forms: special tokens only outside the value */
Test(json_grammar, mask_with_a_block_and_special_tokens) {
    const char *toks[] = {"<think>", "</think>", "hm", "\n", "{", "}", "\"a\"", ":", "1", "</s>", "<|x|>", "\"", "<"};
    int32_t types[13];
    for (int i = 0; i < 13; i++) types[i] = i == 9 || i == 10 ? TOY_TOKEN_CONTROL : TOY_TOKEN_NORMAL;
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 13, .tokens = toks, .types = types,
                                      .bos = -1, .eos = 9, .unk = -1, .pad = -1, .eot = -1};
    struct toy_tokenizer *tok;
    MUST(toy_tokenizer_init(&spec, &tok));
    struct toy_json_grammar *g;
    struct toy_json_form form = {NULL, "<|x|>", NULL};
    MUST(toy_json_grammar_compile_forms(&form, 1, &g));
    MUST(toy_json_grammar_allow_block(g, "<think>", "</think>"));
    struct toy_json_matcher *m;
    MUST(toy_json_matcher_new(g, &m));
    struct {
        int take;            /* token taken before the mask (-1: none) */
        const char *allowed; /* a '1' per token the mask leaves */
    } steps[] = {
        {-1, "1000000000101"}, /* <think> or the form's marker, or the '<' that starts either */
        {0, "1111111110111"},  /* in the block: any text, a special token's too; not the end */
        {2, "1111111110111"},
        {1, "0001000000101"},  /* after it: blanks, or the marker (or its first byte) */
        {10, "0001100000000"}, /* the value: blanks, an object */
        {4, "0001011000010"},  /* a key, the end of the object; not a special token */
        {5, "0000000001000"},  /* done: the end alone */
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        if (steps[i].take >= 0) cr_assert(toy_json_matcher_take(m, tok, steps[i].take), "step %zu", i);
        float logits[13] = {0};
        toy_json_matcher_mask(m, tok, logits, 13);
        char got[14] = "";
        for (int v = 0; v < 13; v++) got[v] = logits[v] == -INFINITY ? '0' : '1';
        cr_expect_str_eq(got, steps[i].allowed, "step %zu: %s, not %s", i, got, steps[i].allowed);
    }
    toy_json_matcher_free(m);
    toy_json_grammar_free(g);
    toy_tokenizer_free(tok);
}

/* a vocabulary that cannot spell what the grammar asks: the mask leaves the end, rather than nothing */
Test(json_grammar, a_vocabulary_that_cannot_follow_ends_the_reply) {
    const char *toks[] = {"a", "b", "</s>"};
    struct toy_tokenizer_spec spec = {.kind = TOY_TOKENIZER_BPE, .n_tokens = 3, .tokens = toks, .bos = -1, .eos = 2,
                                      .unk = -1, .pad = -1, .eot = -1};
    struct toy_tokenizer *tok;
    MUST(toy_tokenizer_init(&spec, &tok));
    struct toy_json_grammar *g;
    MUST(toy_json_grammar_compile(NULL, &g));
    struct toy_json_matcher *m;
    MUST(toy_json_matcher_new(g, &m));
    float logits[3] = {5, 4, -3};
    cr_expect_eq(toy_json_matcher_mask(m, tok, logits, 3), 1);
    cr_expect(logits[0] == -INFINITY && logits[1] == -INFINITY && logits[2] == 0);
    toy_json_matcher_free(m);
    toy_json_grammar_free(g);
    toy_tokenizer_free(tok);
}

Test(json_grammar, schemas_it_cannot_enforce_are_refused_by_name) {
    struct {
        const char *schema, *says;
    } cases[] = {
        {"{\"type\": \"string\", \"pattern\": \"^a\"}", "'pattern'"},
        {"{\"properties\": {\"a\": {\"minimum\": 3}}}", "#/properties/a: 'minimum'"},
        {"{\"anyOf\": []}", "1 to 64"},
        {"{\"$ref\": \"#/components/x\"}", "$ref"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"additionalProperties\": true}", "additionalProperties"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "'b'"},
        {"{\"type\": \"strang\"}", "strang"},
        {"[1, 2]", "must be an object"},
        {"{", "malformed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct toy_json_grammar *g = NULL;
        cr_expect_eq(toy_json_grammar_compile(cases[i].schema, &g), TOY_ERR_INVALID_ARG, "case %zu", i);
        cr_expect(strstr(toy_last_error(), cases[i].says), "case %zu: '%s' does not say %s", i, toy_last_error(),
                  cases[i].says);
        cr_expect_null(g);
    }
}

/* ---- a validator for the subset, from the JSON Schema rules ---- */

static bool valid(json_t *s, json_t *v, json_t *root) {
    if (json_is_true(s)) return true;
    json_t *ref = json_object_get(s, "$ref");
    if (ref) return valid(json_object_get(json_object_get(root, "$defs"), json_string_value(ref) + 8), v, root);
    json_t *en = json_object_get(s, "enum");
    if (en) {
        for (size_t i = 0; i < json_array_size(en); i++)
            if (json_equal(json_array_get(en, i), v)) return true;
        return false;
    }
    json_t *cn = json_object_get(s, "const");
    if (cn) return json_equal(cn, v);
    json_t *any = json_object_get(s, "anyOf");
    if (!any) any = json_object_get(s, "oneOf");
    if (any) {
        for (size_t i = 0; i < json_array_size(any); i++)
            if (valid(json_array_get(any, i), v, root)) return true;
        return false;
    }
    const char *t = json_string_value(json_object_get(s, "type"));
    if (!t) return true;
    if (!strcmp(t, "null")) return json_is_null(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "string")) {
        json_t *mx = json_object_get(s, "maxLength");
        size_t chars = 0;
        for (const char *p = json_string_value(v); p && *p; p++) chars += ((unsigned char)*p & 0xC0) != 0x80;
        return json_is_string(v) && (!mx || chars <= (size_t)json_integer_value(mx));
    }
    if (!strcmp(t, "array")) {
        json_t *mx = json_object_get(s, "maxItems");
        if (!json_is_array(v) || (mx && json_array_size(v) > (size_t)json_integer_value(mx))) return false;
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!valid(json_object_get(s, "items"), json_array_get(v, i), root)) return false;
        return true;
    }
    if (!json_is_object(v)) return false;
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    for (size_t i = 0; i < json_array_size(req); i++)
        if (!json_object_get(v, json_string_value(json_array_get(req, i)))) return false;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        json_t *ps = json_object_get(props, k);
        if (props && !ps) return false;
        if (ps && !valid(ps, x, root)) return false;
    }
    return true;
}

/* Random walks: random logits, the grammar's mask, a token drawn from what is left, until an end token is
 * drawn; whatever path is taken, the text is JSON the schema accepts. */
Test(json_grammar, every_masked_path_through_a_real_vocabulary_is_valid, .timeout = 120) {
    struct toy_tokenizer *tok;
    if (toy_tokenizer_load(TD "tokenizer-smollm2/tokenizer.json", &tok)) cr_skip_test("no SmolLM2 tokenizer");
    const char *schemas[] = {
        person,
        "{\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}, "
        "\"n\": {\"type\": [\"number\", \"null\"]}}, \"required\": [\"ok\"]}, \"maxItems\": 3}",
        "{\"$defs\": {\"t\": {\"type\": \"object\", \"properties\": {\"kids\": {\"type\": \"array\", \"items\": "
        "{\"$ref\": \"#/$defs/t\"}, \"maxItems\": 2}, \"id\": {\"enum\": [\"x\", \"yz\", 1.5]}}, \"required\": "
        "[\"id\"]}}, \"$ref\": \"#/$defs/t\"}",
        "{\"type\": \"array\", \"maxItems\": 3, \"items\": " SHAPES "}",
    };
    int64_t V = toy_tokenizer_n_vocab(tok);
    float *logits = malloc((size_t)V * sizeof(float));
    struct toy_rng rng;
    toy_rng_seed(&rng, 11);
    int finished = 0;
    for (size_t si = 0; si < sizeof schemas / sizeof schemas[0]; si++) {
        struct toy_json_grammar *g;
        MUST(toy_json_grammar_compile(schemas[si], &g));
        json_t *schema = json_loads(schemas[si], 0, NULL);
        for (int walk = 0; walk < 6; walk++) {
            struct toy_json_matcher *m;
            MUST(toy_json_matcher_new(g, &m));
            char text[8192] = "";
            size_t len = 0;
            bool ended = false;
            for (int step = 0; step < 400 && !ended; step++) {
                for (int64_t v = 0; v < V; v++) logits[v] = toy_rng_normal(&rng);
                /* a pull towards closing, so that walks end: shorter tokens and the end are likelier */
                toy_json_matcher_mask(m, tok, logits, V);
                int32_t eos = toy_tokenizer_eos(tok);
                cr_assert(toy_json_matcher_done(m) || logits[eos] == -INFINITY,
                          "schema %zu: the end allowed after '%s' (nothing else fit?)", si, text);
                for (int64_t v = 0; step % 8 == 0 && v < V; v++) { /* the mask's shortcuts against plain trials */
                    size_t n = 0;
                    const char *b = toy_tokenizer_token_bytes(tok, (int32_t)v, &n);
                    bool eog = toy_tokenizer_is_eog(tok, (int32_t)v);
                    bool want = eog ? toy_json_matcher_done(m)
                                    : n > 0 && toy_tokenizer_token_type(tok, (int32_t)v) != TOY_TOKEN_CONTROL &&
                                          toy_json_matcher_accepts(m, b, n);
                    cr_assert_eq(logits[v] != -INFINITY, want, "schema %zu: token %lld after '%s'", si, (long long)v,
                                 text);
                }
                int64_t best = -1;
                float bv = -INFINITY;
                for (int64_t v = 0; v < V; v++) {
                    if (logits[v] == -INFINITY) continue;
                    size_t n = 0;
                    toy_tokenizer_token_bytes(tok, (int32_t)v, &n);
                    float score = logits[v] - (float)n + (toy_tokenizer_is_eog(tok, (int32_t)v) ? 4.0f : 0.0f);
                    if (score > bv) bv = score, best = v;
                }
                if (toy_tokenizer_is_eog(tok, (int32_t)best)) {
                    ended = true;
                    break;
                }
                size_t n = 0;
                const char *b = toy_tokenizer_token_bytes(tok, (int32_t)best, &n);
                cr_assert(toy_json_matcher_take(m, tok, (int32_t)best), "a token the mask allowed was refused");
                cr_assert_lt(len + n, sizeof text);
                memcpy(text + len, b, n);
                text[len += n] = 0;
            }
            if (ended) {
                finished++;
                cr_assert(toy_json_matcher_done(m));
                json_error_t je;
                json_t *v = json_loads(text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                cr_assert(v, "schema %zu: not JSON: %s (%s)", si, text, je.text);
                cr_expect(valid(schema, v, schema), "schema %zu: %s does not follow it", si, text);
                json_decref(v);
            }
            toy_json_matcher_free(m);
        }
        json_decref(schema);
        toy_json_grammar_free(g);
    }
    cr_expect_geq(finished, 16, "only %d of 24 walks ended within 400 tokens", finished);
    free(logits);
    toy_tokenizer_free(tok);
}
