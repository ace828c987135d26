/* test-chat-template.c: the Jinja-subset interpreter on the real templates
 * in ../shared/testdata (Llama-3 tokenizer_config.json, Phi-3 from its GGUF)
 * and the built-ins (SmolLM2 ChatML, Llama-2, Mistral, Gemma), against
 * renderings written out by hand from the templates' Jinja semantics; then
 * the language features one by one, and errors.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "toy/chat-template.h"
#include "toy/tokenizer.h"

#define TD "../shared/testdata/"
#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

/* Renders `src` (source or built-in name) for JSON messages. */
static char *render(const char *src, const char *messages_json, bool add_gen, const char *bos, const char *eos) {
    struct toy_chat_template *t;
    MUST(toy_chat_template_init(src, &t));
    struct toy_chat_vars v = {.bos_token = bos, .eos_token = eos, .add_generation_prompt = add_gen};
    char *out;
    MUST(toy_chat_template_render_json(t, messages_json, &v, &out));
    toy_chat_template_free(t);
    return out;
}

/* Renders a template with no messages that only uses its own logic. */
static char *jinja(const char *src) { return render(src, "[]", false, "<s>", "</s>"); }

static enum toy_status jinja_err(const char *src, const char *msgs) {
    struct toy_chat_template *t;
    enum toy_status st = toy_chat_template_init(src, &t);
    if (st) return st;
    char *out = NULL;
    struct toy_chat_vars v = {0};
    st = toy_chat_template_render_json(t, msgs ? msgs : "[]", &v, &out);
    free(out);
    toy_chat_template_free(t);
    return st;
}

#define EXPECT_RENDER(src, want)                          \
    do {                                                  \
        char *got_ = jinja(src);                          \
        cr_expect_str_eq(got_, want, "template: %s", src); \
        free(got_);                                       \
    } while (0)

static const char *conv =
    "[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
    "{\"role\":\"user\",\"content\":\"Hello!\"},"
    "{\"role\":\"assistant\",\"content\":\"  Hi there. \\n\"},"
    "{\"role\":\"user\",\"content\":\"What is 2+2?\"}]";

Test(chat_template, llama3_tokenizer_config) {
    if (access(TD "tokenizer-llama3/tokenizer_config.json", R_OK)) cr_skip_test("no Llama-3 test data");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "tokenizer-llama3/tokenizer.json", &tok));
    const char *tmpl = toy_tokenizer_chat_template(tok);
    cr_assert_not_null(tmpl);
    char *got = render(tmpl, conv, true, "<|begin_of_text|>", "<|end_of_text|>");
    const char *want =
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHi there.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n";
    cr_expect_str_eq(got, want);
    free(got);
    /* the same through the tokenizer: its BOS text, and the built-in agrees */
    struct toy_chat_message m[] = {{"user", "Hello!"}};
    MUST(toy_tokenizer_apply_chat(tok, NULL, m, 1, true, &got));
    cr_expect_str_eq(got, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>"
                          "<|start_header_id|>assistant<|end_header_id|>\n\n");
    char *got2;
    MUST(toy_tokenizer_apply_chat(tok, "llama3", m, 1, true, &got2));
    cr_expect_str_eq(got, got2);
    /* rendered text tokenizes with the specials as single tokens */
    struct toy_tokens ids = {0};
    MUST(toy_tokenizer_encode(tok, got, strlen(got), TOY_ENCODE_PARSE_SPECIAL, &ids));
    cr_expect_eq(ids.ids[0], 128000);
    cr_expect_eq(ids.ids[1], 128006);
    cr_expect_eq(ids.ids[ids.n - 1], 271); /* "\n\n" */
    toy_tokens_free(&ids);
    free(got);
    free(got2);
    toy_tokenizer_free(tok);
}

Test(chat_template, smollm2_chatml) {
    const char *msgs = "[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello.\"}]";
    char *got = render("smollm2", msgs, true, "", "");
    cr_expect_str_eq(got, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
                          "<|im_start|>assistant\n");
    free(got);
    got = render("chatml", conv, false, "", "");
    cr_expect_str_eq(got, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n"
                          "<|im_start|>assistant\n  Hi there. \n<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n");
    free(got);
    if (access(TD "tokenizer-smollm2/tokenizer.json", R_OK) == 0) {
        struct toy_tokenizer *tok = NULL;
        MUST(toy_tokenizer_load(TD "tokenizer-smollm2/tokenizer.json", &tok));
        struct toy_chat_message m[] = {{"system", "S"}, {"user", "Hi"}};
        MUST(toy_tokenizer_apply_chat(tok, "smollm2", m, 2, true, &got));
        cr_expect_str_eq(got, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        struct toy_tokens ids = {0};
        MUST(toy_tokenizer_encode(tok, got, strlen(got), TOY_ENCODE_PARSE_SPECIAL, &ids));
        cr_expect_eq(ids.ids[0], 1); /* <|im_start|> */
        int ends = 0;
        for (int64_t i = 0; i < ids.n; i++) ends += ids.ids[i] == 2;
        cr_expect_eq(ends, 2);
        toy_tokens_free(&ids);
        free(got);
        toy_tokenizer_free(tok);
    }
}

Test(chat_template, phi3_from_gguf) {
    if (access(TD "llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf", R_OK)) cr_skip_test("no phi-3 GGUF");
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "llamacpp-vocab-gguf/ggml-vocab-phi-3.gguf", &tok));
    struct toy_chat_message m[] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    char *got;
    MUST(toy_tokenizer_apply_chat(tok, NULL, m, 3, true, &got));
    cr_expect_str_eq(got, "<s><|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
    free(got);
    toy_tokenizer_free(tok);
}

Test(chat_template, llama2_mistral_gemma_builtins) {
    char *got = render("llama2", conv, false, "<s>", "</s>");
    cr_expect_str_eq(got, "<s>[INST] <<SYS>>\nYou are a helpful assistant.\n<</SYS>>\n\nHello! [/INST] Hi there. </s>"
                          "<s>[INST] What is 2+2? [/INST]");
    free(got);
    const char *alt = "[{\"role\":\"user\",\"content\":\"Hello!\"},{\"role\":\"assistant\",\"content\":\"Hi.\"},"
                      "{\"role\":\"user\",\"content\":\"Bye\"}]";
    got = render("mistral", alt, false, "<s>", "</s>");
    cr_expect_str_eq(got, "<s>[INST] Hello! [/INST]Hi.</s>[INST] Bye [/INST]");
    free(got);
    got = render("gemma", alt, true, "<bos>", "<eos>");
    cr_expect_str_eq(got, "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\nHi.<end_of_turn>\n"
                          "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    free(got);
    /* raise_exception surfaces as an error with the template's message */
    struct toy_chat_template *t;
    MUST(toy_chat_template_init("gemma", &t));
    struct toy_chat_vars v = {0};
    cr_expect_eq(toy_chat_template_render_json(t, conv, &v, &got), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "System role not supported"), "%s", toy_last_error());
    toy_chat_template_free(t);
    MUST(toy_chat_template_init("mistral", &t));
    cr_expect_eq(toy_chat_template_render_json(t, "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"}]",
                                               &v, &got), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "alternate"), "%s", toy_last_error());
    toy_chat_template_free(t);
}

Test(chat_template, expressions) {
    EXPECT_RENDER("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ 2 ** 10 }}|{{ 7 / 2 }}",
                  "7|9|3|-4|1|1024|3.5");
    EXPECT_RENDER("{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ [1, 2] + [3] }}|{{ {'k': 'v', 'n': 1} }}",
                  "a1None|ababab|[1, 2, 3]|{'k': 'v', 'n': 1}");
    EXPECT_RENDER("{{ true and false }}|{{ true or false }}|{{ not true }}|{{ 1 if 0 else 2 }}|{{ 'x' if false }}|",
                  "False|True|False|2||");
    EXPECT_RENDER("{{ 'b' in 'abc' }}|{{ 3 in [1, 2] }}|{{ 'k' in {'k': 1} }}|{{ 'z' not in 'abc' }}",
                  "True|False|True|True");
    EXPECT_RENDER("{{ 1 < 2 }}|{{ 2 <= 1 }}|{{ 'a' == 'a' }}|{{ 1 == 1.0 }}|{{ 1 != 2 }}|{{ 'b' > 'a' }}",
                  "True|False|True|True|True|True");
    EXPECT_RENDER("{{ x is defined }}|{{ x is undefined }}|{{ none is none }}|{{ 'a' is string }}|{{ 3 is odd }}|"
                  "{{ 4 is even }}|{{ {} is mapping }}|{{ [] is iterable }}|{{ 1 is not number }}|{{ 6 is divisibleby 3 }}",
                  "False|True|True|True|True|True|True|True|False|True");
    EXPECT_RENDER("{{ 'hello'[1] }}|{{ 'hello'[-1] }}|{{ 'hello'[1:3] }}|{{ 'hello'[::-1] }}|{{ [1,2,3,4][1:] }}|"
                  "{{ [1,2,3,4][:-1] }}|{{ [1,2,3,4][::2] }}",
                  "e|o|el|olleh|[2, 3, 4]|[1, 2, 3]|[1, 3]");
    EXPECT_RENDER("{{ undefined_var }}|{{ none.attr }}|{{ none }}|{{ true }}|{{ 1.5 }}|{{ 2.0 }}",
                  "||None|True|1.5|2.0");
    EXPECT_RENDER("{{ 'a' 'b' }}|{{ \"q'uote\" }}|{{ 'esc\\n'|length }}", "ab|q'uote|4");
}

Test(chat_template, filters_and_methods) {
    EXPECT_RENDER("{{ '  x y  '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'hello world'|title }}|{{ 'hELLO'|capitalize }}",
                  "x y|ABC|abc|Hello World|Hello");
    EXPECT_RENDER("{{ [1,2,3]|length }}|{{ 'héllo'|length }}|{{ {'a':1}|count }}|{{ [3,1,2]|sort }}|{{ [1,2]|reverse|list }}",
                  "3|5|1|[1, 2, 3]|[2, 1]");
    EXPECT_RENDER("{{ [1,2,3]|join(', ') }}|{{ [1,2,3]|first }}|{{ [1,2,3]|last }}|{{ x|default('dflt') }}|{{ ''|default('e', true) }}",
                  "1, 2, 3|1|3|dflt|e");
    EXPECT_RENDER("{{ {'a': [1, 'two', none, true], 'b': {'c': 1.5}}|tojson }}", "{\"a\": [1, \"two\", null, true], \"b\": {\"c\": 1.5}}");
    EXPECT_RENDER("{{ {'a': 1}|tojson(indent=2) }}", "{\n  \"a\": 1\n}");
    EXPECT_RENDER("{{ 'é\"\\n'|tojson }}", "\"é\\\"\\n\"");
    EXPECT_RENDER("{{ 'a-b-c'|replace('-', '+') }}|{{ 42|string ~ '!' }}|{{ '7'|int + 1 }}|{{ 2|float }}|{{ -3|abs }}|{{ 2.567|round(2) }}",
                  "a+b+c|42!|8|2.0|3|2.57");
    EXPECT_RENDER("{% set xs = [{'n': 'a', 'k': 1}, {'n': 'b'}, {'n': 'c', 'k': 0}] %}{{ xs|map(attribute='n')|join }}|"
                  "{{ xs|selectattr('k')|map(attribute='n')|list }}|{{ xs|rejectattr('k', 'defined')|map(attribute='n')|first }}|"
                  "{{ xs|selectattr('n', 'equalto', 'c')|list|length }}|{{ ['a','b']|map('upper')|join }}",
                  "abc|['a']|b|1|AB");
    EXPECT_RENDER("{{ '  pad '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
                  "{{ 'hello'.startswith('he') }}|{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|"
                  "{{ 'Hi'.upper() }}|{{ '-'.join(['x', 'y']) }}|{{ 'banana'.count('an') }}|{{ 'abc'.find('c') }}",
                  "pad|hi|['a', 'b', '', 'c']|['a', 'b']|True|True|bba|HI|x-y|2|2");
    EXPECT_RENDER("{% set d = {'a': 1, 'b': 2} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('z', 9) }}|"
                  "{{ d.keys()|list }}|{{ d['b'] }}|{{ d.a }}|{{ d|items|length }}",
                  "a=1;b=2;|9|['a', 'b']|2|1|2");
    EXPECT_RENDER("{{ 'line1\\nline2'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ [1, 1, 2]|unique|list }}|{{ 'one two'|wordcount }}",
                  "line1\n  line2|  a\n  b|[1, 2]|2");
    EXPECT_RENDER("{% filter upper %}shout {{ 'it' }}{% endfilter %}", "SHOUT IT");
}

Test(chat_template, statements) {
    EXPECT_RENDER("{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{% if loop.first %}F{% endif %}"
                  "{% if loop.last %}L{% endif %}/{{ loop.length }};{% endfor %}",
                  "103F/3;212/3;321L/3;");
    EXPECT_RENDER("{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}",
                  "empty|2242");
    EXPECT_RENDER("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
                  "0134");
    EXPECT_RENDER("{% for x in 'ab' %}{{ x }}{{ loop.previtem }}{{ loop.nextitem }},{% endfor %}", "ab,ba,");
    EXPECT_RENDER("{% set n = 1 %}{% for x in [1] %}{% set n = 2 %}{% endfor %}{{ n }}|"
                  "{% set ns = namespace(n=1, s='') %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}{% set ns.s = ns.s ~ x %}{% endfor %}{{ ns.n }},{{ ns.s }}",
                  "1|4,12");
    EXPECT_RENDER("{% if 0 %}a{% elif false %}b{% elif 1 %}c{% else %}d{% endif %}{% if none %}x{% else %}y{% endif %}", "cy");
    EXPECT_RENDER("{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set blk %}in {{ 'block' }}{% endset %}{{ blk|upper }}",
                  "12|IN BLOCK");
    EXPECT_RENDER("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} "
                  "{{ greet(name='C', punct='.') }}",
                  "Hi A! Hi B? Hi C.");
    EXPECT_RENDER("{% macro wrap(t) %}[{{ t }}:{{ caller() }}]{% endmacro %}{% call wrap('x') %}body{% endcall %}", "[x:body]");
    EXPECT_RENDER("{% for a in [[1, 2], [3, 4]] %}{% for b in a %}{{ loop.index }}{{ b }}{% endfor %}/{{ loop.index }} {% endfor %}",
                  "1122/1 1324/2 ");
    EXPECT_RENDER("{# a comment #}{% raw %}{{ not evaluated }}{% endraw %}", "{{ not evaluated }}");
    EXPECT_RENDER("{% set xs = [] %}{% set _ = xs.append(1) %}{% set _ = xs.append(2) %}{{ xs }}", "[1, 2]");
    EXPECT_RENDER("{{ strftime_now('%Y')|length }}", "4");
}

Test(chat_template, whitespace_control) {
    /* trim_blocks: the newline after a block tag goes; lstrip_blocks: indentation before it */
    EXPECT_RENDER("{% if true %}\nA\n{% endif %}\nB", "A\nB");
    EXPECT_RENDER("x\n    {% if true %}\n    y\n    {% endif %}\nz", "x\n    y\nz");
    EXPECT_RENDER("a  {%- if true -%}  b  {%- endif -%}  c", "abc");
    EXPECT_RENDER("a  {{- 'b' -}}  c|{{ 'x' }}\n", "abc|x"); /* the source's last newline goes too */
    EXPECT_RENDER("a\n  {%+ if true %}b{% endif %}", "a\n  b");
    EXPECT_RENDER("{# c #}\nA", "A");
    EXPECT_RENDER("{% for m in [1,2] %}\n  {{ m }}\n{% endfor %}\n", "  1\n  2\n");
}

Test(chat_template, messages_json_with_tools) {
    const char *src = "{% if tools is defined %}Tools: {{ tools|map(attribute='name')|join(', ') }}\n{% endif %}"
                      "{% for m in messages %}{{ m.role }}: {{ m.content }}"
                      "{% if m.tool_calls is defined %} -> {{ m.tool_calls[0].function.name }}({{ m.tool_calls[0].function.arguments|tojson }}){% endif %}{{ '\\n' }}"
                      "{% endfor %}";
    const char *json = "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"},"
                       "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\": {\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}}]}],"
                       "\"tools\": [{\"name\": \"get\"}, {\"name\": \"put\"}]}";
    char *got = render(src, json, false, "", "");
    cr_expect_str_eq(got, "Tools: get, put\nuser: weather?\nassistant:  -> get({\"city\": \"Oslo\"})\n");
    free(got);
}

Test(chat_template, errors) {
    cr_expect_eq(jinja_err("{% if x %}no end", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "endif"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("line1\nline2 {{ 1 + }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "line 2"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{{ 'unterminated }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% frobnicate %}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ x|nosuchfilter }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "nosuchfilter"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{{ raise_exception('boom ' ~ 42) }}", NULL), TOY_ERR_INVALID_ARG);
    cr_expect(strstr(toy_last_error(), "boom 42"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{{ 1 / 0 }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% for a, b in [1] %}{% endfor %}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ x }}", "{\"not\": \"messages\"}"), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ x }}", "[{\"content\": \"no role\"}]"), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 9223372036854775807 + 1 }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "overflow"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{{ 3 ** 99 }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ (1, 2 }}", NULL), TOY_ERR_FORMAT); /* found by fuzzing */
    EXPECT_RENDER("{{ 2 ** -1 }}|{{ range(0, 10, 4)|list }}|{{ range(3, 0, -1)|list }}", "0.5|[0, 4, 8]|[3, 2, 1]");
    struct toy_chat_template *t = NULL;
    cr_expect_eq(toy_chat_template_init(NULL, &t), TOY_ERR_INVALID_ARG);
    /* a mistyped built-in name is not taken for a template that renders as itself and drops the messages */
    cr_expect_eq(toy_chat_template_init("chatml2", &t), TOY_ERR_NOT_FOUND);
    cr_expect(strstr(toy_last_error(), "'chatml2'") && strstr(toy_last_error(), "llama3"), "%s", toy_last_error());
    cr_expect_null(t);
}

/* A tool-calling template of our own in the shape the popular ones take
 * (tools listed with tojson, calls whose arguments are a mapping, runs of
 * tool results grouped by looking at the neighbours, heavy whitespace
 * control); the expected renderings are Jinja2 3.1's, configured as Hugging
 * Face renders chat templates. */
static const char *tool_template =
    "{%- if tools %}\n"
    "    {{- '<|turn|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'A helper that may call functions.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\nFunctions you can call, one JSON object per line:\\n<functions>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</functions>\\nTo call one, answer with <call>{\\\"name\\\": ..., \\\"arguments\\\": {...}}</call>.<|end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|turn|>system\\n' + messages[0]['content'] + '<|end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|turn|>system\\nA helper.<|end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|turn|>' + message.role + '\\n' + message.content + '<|end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|turn|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for call in message.tool_calls %}\n"
    "            {%- if call.function is defined %}\n"
    "                {%- set call = call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<call>{\"name\": \"' }}\n"
    "            {{- call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- call.arguments | tojson }}\n"
    "            {{- '}</call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|turn|>results' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<result>' }}\n"
    "        {{- message.content }}\n"
    "        {{- '</result>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|turn|>assistant\\n' }}\n"
    "{%- endif %}\n";

Test(chat_template, tool_calling_template) {
    const char *plain = "[{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
                        " {\"role\": \"assistant\", \"content\": \"Hello\"}]";
    char *got = render(tool_template, plain, true, "", "");
    cr_expect_str_eq(got, "<|turn|>system\n"
                          "S<|end|>\n"
                          "<|turn|>user\n"
                          "Hi<|end|>\n"
                          "<|turn|>assistant\n"
                          "Hello<|end|>\n"
                          "<|turn|>assistant\n");
    free(got);
    const char *tools =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What's the weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": \"function\","
        "   \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
        " {\"role\": \"tool\", \"content\": \"22C\"}, {\"role\": \"tool\", \"content\": \"sunny\"}],"
        " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}]}";
    got = render(tool_template, tools, true, "", "");
    cr_expect_str_eq(got,
        "<|turn|>system\n"
        "A helper that may call functions.\n"
        "\n"
        "Functions you can call, one JSON object per line:\n"
        "<functions>\n"
        "{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}\n"
        "</functions>\n"
        "To call one, answer with <call>{\"name\": ..., \"arguments\": {...}}</call>.<|end|>\n"
        "<|turn|>user\n"
        "What's the weather in Paris?<|end|>\n"
        "<|turn|>assistant\n"
        "<call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</call><|end|>\n"
        "<|turn|>results\n"
        "<result>22C</result>\n"
        "<result>sunny</result><|end|>\n"
        "<|turn|>assistant\n");
    free(got);
}

/* Decodes the ids whose mask is 1, in order. */
static char *masked_text(const struct toy_tokenizer *tok, const struct toy_tokens *ids, const unsigned char *mask) {
    struct toy_tokens m = {0};
    for (int64_t i = 0; i < ids->n; i++)
        if (mask[i]) {
            if (m.n == m.cap) {
                m.cap = m.cap ? 2 * m.cap : 64;
                m.ids = realloc(m.ids, (size_t)m.cap * sizeof *m.ids);
            }
            m.ids[m.n++] = ids->ids[i];
        }
    char *d;
    MUST(toy_tokenizer_decode(tok, m.ids, m.n, TOY_DECODE_KEEP_LEADING_SPACE, &d, NULL));
    toy_tokens_free(&m);
    return d;
}

Test(chat_template, sft_mask_marks_assistant_turns) {
    if (access(TD "tokenizer-smollm2/tokenizer.json", R_OK)) cr_skip_test("no test data");
    struct toy_chat_message conv5[] = {{"system", "S"}, {"user", "Hi"}, {"assistant", "Hello there."}, {"user", "Bye"},
                                       {"assistant", "Bye!"}};
    struct toy_tokenizer *tok = NULL;
    MUST(toy_tokenizer_load(TD "tokenizer-smollm2/tokenizer.json", &tok));
    struct toy_tokens ids = {0};
    unsigned char *mask;
    MUST(toy_chat_encode(tok, "chatml", conv5, 5, &ids, &mask));
    char *m = masked_text(tok, &ids, mask);
    cr_expect_str_eq(m, "Hello there.<|im_end|>\nBye!<|im_end|>\n");
    free(m);
    /* all ids, in order, are the whole rendering */
    char *all, *ref;
    MUST(toy_tokenizer_decode(tok, ids.ids, ids.n, 0, &all, NULL));
    MUST(toy_tokenizer_apply_chat(tok, "chatml", conv5, 5, false, &ref));
    cr_expect_str_eq(all, ref);
    free(all);
    free(ref);
    free(mask);
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);

    /* SentencePiece: the dummy-prefix spaces are not in the text, offsets skip them */
    MUST(toy_tokenizer_load_spm(TD "tokenizer-llama2-spm/tokenizer.model", &tok));
    struct toy_chat_message conv3[] = {{"user", "Hello!"}, {"assistant", "Hi there."}, {"user", "Q"}};
    MUST(toy_chat_encode(tok, "llama2", conv3, 3, &ids, &mask));
    cr_expect_eq(ids.ids[0], 1);
    m = masked_text(tok, &ids, mask);
    cr_expect_str_eq(m, " Hi there. </s>");
    free(m);
    free(mask);
    toy_tokens_free(&ids);
    /* no messages: chatml renders nothing, no ids and an empty mask (the
     * offsets were taken from NULL + 0, undefined behaviour that UBSan in
     * fuzz/fuzz-data.c flagged: run under `make asan`) */
    ids = (struct toy_tokens){0};
    MUST(toy_chat_encode(tok, "chatml", conv3, 0, &ids, &mask));
    cr_expect_eq(ids.n, 0);
    free(mask);
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
}

#include <pthread.h>

struct render_job {
    const struct toy_chat_template *t;
    char *out;
};

static void *render_job_fn(void *p) {
    struct render_job *j = p;
    struct toy_chat_vars v = {.add_generation_prompt = true};
    for (int i = 0; i < 50; i++) {
        free(j->out);
        j->out = NULL;
        if (toy_chat_template_render_json(j->t, "[{\"role\": \"user\", \"content\": \"x\"}]", &v, &j->out)) return NULL;
    }
    return NULL;
}

/* One parsed template, four threads rendering it (filter blocks included). */
Test(chat_template, concurrent_render) {
    struct toy_chat_template *t;
    MUST(toy_chat_template_init("{% filter upper %}{% for m in messages %}{{ m.content }}{% endfor %}{% endfilter %}"
                                "{% set ns = namespace(k=0) %}{% for i in range(3) %}{% set ns.k = ns.k + i %}{% endfor %}{{ ns.k }}",
                                &t));
    struct render_job jobs[4] = {{t, NULL}, {t, NULL}, {t, NULL}, {t, NULL}};
    pthread_t th[4];
    for (int i = 0; i < 4; i++) cr_assert_eq(pthread_create(&th[i], NULL, render_job_fn, &jobs[i]), 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        cr_expect_str_eq(jobs[i].out ? jobs[i].out : "(null)", "X3");
        free(jobs[i].out);
    }
    toy_chat_template_free(t);
}

/* The expected strings below are what Jinja2 renders (HF's settings:
 * ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols). */

/* Floats print as Python's repr(): the shortest round-tripping digits,
 * positional for exponents in [-4, 16). Tool-call arguments and JSON-schema
 * bounds (10.0, 1500.0) go through this in tojson. */
Test(chat_template, float_repr) {
    EXPECT_RENDER("{{ 10.0 }} {{ 1500.0 }} {{ 1e5 }} {{ 1e16 }} {{ 0.1 }} {{ 1/3 }} {{ 1.5e-7 }} {{ 0.0001 }} {{ -0.0 }} "
                  "{{ 20 / 2 }} {{ [2.0, 250.0] }}|{{ 3600.0 ~ 's' }}",
                  "10.0 1500.0 100000.0 1e+16 0.1 0.3333333333333333 1.5e-07 0.0001 -0.0 10.0 [2.0, 250.0]|3600.0s");
    EXPECT_RENDER("{{ {'minimum': 0.0, 'maximum': 100.0, 'default': 10.0, 'big': 1500.0, 'e': 1e16, 's': 1e-5}|tojson }}",
                  "{\"minimum\": 0.0, \"maximum\": 100.0, \"default\": 10.0, \"big\": 1500.0, \"e\": 1e+16, \"s\": 1e-05}");
}

/* Each loop iteration has a scope of its own; {% if %} has none. */
Test(chat_template, loop_scopes) {
    EXPECT_RENDER("{% set x = 'outer' %}{% for i in [1, 2] %}{% if loop.first %}{% set x = 'in' ~ i %}{% set y = 'Y' %}{% endif %}"
                  "[{{ x }}{{ y }}]{% endfor %}{{ x }}[{{ y }}]|{% set c = 0 %}{% for m in [1, 2, 3] %}{% set c = c + 1 %}{{ c }}"
                  "{% endfor %}{{ c }}|{% if true %}{% set z = 5 %}{% endif %}{{ z }}",
                  "[in1Y][outer]outer[]|1110|5");
    EXPECT_RENDER("{% macro m(a, b) %}{% set a = 'A' %}{{ a }}[{{ b }}{{ b is defined }}]{% endmacro %}{% set a = 'top' %}"
                  "{{ m(1) }}{{ a }}|{% macro d(p, q=p ~ '!') %}{{ q }}{% endmacro %}{{ d('x') }}",
                  "A[False]top|x!");
}

/* for-else: the else branch runs unless an iteration finished its body
 * (one left by break or continue does not count). */
Test(chat_template, for_else) {
    EXPECT_RENDER("{% for x in [1, 2] %}{% break %}{% else %}E1{% endfor %}|"
                  "{% for x in [1, 2] %}{% if x == 2 %}{% break %}{% endif %}{% else %}E2{% endfor %}|"
                  "{% for x in [1, 2] %}{% continue %}{% else %}E3{% endfor %}|{% for x in [] %}{% else %}E4{% endfor %}|"
                  "{% for x in [1, 2] if x > 5 %}{% else %}E5{% endfor %}",
                  "E1||E3|E4|E5");
}

/* caller() renders the call block in the call site's scope. */
Test(chat_template, caller_scope) {
    EXPECT_RENDER("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% for x in [1, 2] %}{% set y = 'y' ~ x %}"
                  "{% call wrap() %}{{ x }}{{ y }}{% endcall %}{% endfor %}|{% macro inner() %}[{{ caller() }}]{% endmacro %}"
                  "{% macro outer(a) %}{% call inner() %}{{ a }}{% endcall %}{% endmacro %}{{ outer('A') }}|"
                  "{% macro two() %}{{ caller(1, 2) }}{% endmacro %}{% call(a, b) two() %}{{ a + b }}{% endcall %}|"
                  "{% macro nest() %}({{ caller() }}){% endmacro %}{% call wrap() %}{% call nest() %}n{% endcall %}{% endcall %}",
                  "<1y1><2y2>|[A]|3|<(n)>");
}

/* String literals decode Python's escapes; unknown ones (\d) stay as
 * written. CRLF and lone CR in the source read as LF, as in Jinja2. */
Test(chat_template, string_escapes_and_newlines) {
    EXPECT_RENDER("{{ 'a\\nb\\tc\\\\d\\'e\\\"f' }}|{{ '\\u00e9\\x41\\U0001F389' }}|{{ '\\d\\s\\w' }}|{{ '\\101\\7' == 'A\\x07' }}|"
                  "{{ \"\\a\\b\\f\\v\"|length }}|{{ 'a\\\nb' }}",
                  "a\nb\tc\\d'e\"f|éA🎉|\\d\\s\\w|True|4|ab");
    EXPECT_RENDER("{% if true %}\r\nA\r\n{% endif %}\r\nB\rC{{ \"x\r\ny\" }}{% raw %}\r\n{{ r }}{% endraw %}\r\nz",
                  "A\nB\nCx\ny\n{{ r }}z");
}

/* A string inside a container prints as Python's repr(): what
 * str.isprintable() rejects (controls, format characters, separators and
 * spaces other than ' ', private use, unassigned) is \xNN, \uNNNN or
 * \UNNNNNNNN in lowercase hex, an emoji stays itself, and a bare string
 * prints as it is (expected strings are Jinja2 3.1's). */
Test(chat_template, repr_escapes_unprintable) {
    EXPECT_RENDER("{{ ['\\xa0', '\\u200b', '\\x7f', '\\u2028', '\\u0378', '\\ue000', '\\U0001F600', '\\x1b', '\\xad', "
                  "'\\U000F0000', 'a b', '\\u3000', '\u00e9', 'it\\'s\\x0b'] }}|{{ {'k\\x85': ('\\t\\u2029',)} }}|"
                  "{{ ['\\x00'] }}|{{ '\\u200b' }}",
                  "['\\xa0', '\\u200b', '\\x7f', '\\u2028', '\\u0378', '\\ue000', '\U0001F600', '\\x1b', '\\xad', "
                  "'\\U000f0000', 'a b', '\\u3000', '\u00e9', \"it's\\x0b\"]|{'k\\x85': ('\\t\\u2029',)}|['\\x00']|\u200b");
    /* bytes that are not UTF-8 (no Python string holds them) stay as they are */
    EXPECT_RENDER("{{ ['\xff\x85'] }}", "['\xff\x85']");
}

/* trim, strip() and split() take whitespace as Python's str.isspace() does:
 * NBSP, em space, ideographic space, NEL... (U+200B is not whitespace). */
Test(chat_template, unicode_whitespace) {
    EXPECT_RENDER("[{{ '\\u00a0\\u2003hi\\u3000\\u0085'|trim }}][{{ '\\u00a0x\\u00a0'.strip() }}][{{ '\\x1fx'|trim }}]"
                  "[{{ '\\u200bx'|trim }}][{{ ' \\u00a0x'.lstrip() }}][{{ 'x\\u2028 '.rstrip() }}]",
                  "[hi][x][x][\u200bx][x][x]");
    EXPECT_RENDER("{{ 'a\\u00a0b\\u3000c  d'.split()|join('|') }}[{{ 'éaé'.strip('é') }}][{{ 'èé'.strip('é') }}]"
                  "{{ '\\u3000 '.isspace() }}",
                  "a|b|c|d[a][è]True");
}

/* "\u0000" in messages is valid JSON and accepted; it can be measured and
 * compared, but rendered text is a C string, so output holding it is an
 * error that says why rather than text cut short. */
Test(chat_template, nul_in_messages) {
    const char *msgs = "[{\"role\": \"user\", \"content\": \"a\\u0000b\"}]";
    char *got = render("{{ messages[0].content|length }}|{{ messages[0].content == 'a\\0b' }}", msgs, false, "", "");
    cr_expect_str_eq(got, "3|True");
    free(got);
    cr_expect_eq(jinja_err("{{ messages[0].content }}", msgs), TOY_ERR_UNSUPPORTED);
    cr_expect(strstr(toy_last_error(), "NUL") != NULL, "%s", toy_last_error());
}

/* transformers passes tools=None and documents=None when there are none. */
Test(chat_template, tools_and_documents_default_to_none) {
    EXPECT_RENDER("{{ tools is defined }}|{{ tools is none }}|{{ documents is defined }}|{{ documents is none }}",
                  "True|True|True|True");
    char *got = render("{{ tools|length }}", "{\"messages\": [], \"tools\": [{\"type\": \"function\"}]}", false, "", "");
    cr_expect_str_eq(got, "1");
    free(got);
}

/* Comparisons chain as in Python; `is` binds like a filter, tighter than + and ~. */
Test(chat_template, compare_chain_and_test_precedence) {
    EXPECT_RENDER("{{ 1 < 2 < 3 }} {{ 3 > 2 > 1 }} {{ 2 == 2 == 2 }} {{ 1 < 3 > 2 }} {{ 1 < 2 in [True] }} {{ 3 > 2 > 2 }}",
                  "True True True True False False");
    EXPECT_RENDER("{{ 1 + 1 is number }} {{ 'a' ~ 'b' is string }} {{ not 1 is string }} {{ -1 is number }} "
                  "{{ x is not defined and true }} {{ 'y' if none is none else 'n' }} {{ 'x'|upper is string }}",
                  "2 aTrue True True True y True");
}

/* `is filter` / `is test` (Jinja2 3.x): whether a string names a filter or
 * a test toy has; false for other values, an error for a list or dict
 * (unhashable in Python) or with arguments (expected strings are Jinja2
 * 3.1's). */
Test(chat_template, filter_and_test_tests) {
    EXPECT_RENDER("{{ 'upper' is filter }}|{{ 'nope' is filter }}|{{ 'defined' is test }}|{{ 'upper' is test }}|"
                  "{{ 'filter' is test }}|{{ 'map' is test }}|{{ 'tojson' is filter }}|{{ 'upper' is not filter }}|"
                  "{{ 5 is filter }}|{{ none is test }}|{{ missing is filter }}|"
                  "{{ ['upper', 'x', 'lower']|select('filter')|list }}|{{ ['odd', 'join']|reject('test')|list }}",
                  "True|False|True|True|True|False|True|False|False|False|False|['upper', 'lower']|['join']");
    cr_expect_eq(jinja_err("{{ [1] is filter }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ {} is test }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 'upper' is filter('x') }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 'x' is nosuch }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 'x'|nosuch }}", NULL), TOY_ERR_FORMAT);
}

/* sort/unique/dictsort/max/min ignore case by default and sort stably;
 * round is Python's; sum; comparison tests; Undefined is iterable. */
Test(chat_template, jinja2_filters_and_tests) {
    EXPECT_RENDER("{% set names = ['b', 'A', 'a', 'B'] %}{{ names|sort }} {{ names|sort(reverse=true) }} "
                  "{{ names|sort(case_sensitive=true) }} {{ names|unique|list }} "
                  "{{ [[2, 'a'], [1, 'b'], [2, 'c'], [1, 'd']]|sort(attribute='0')|map('last')|join }} "
                  "{% for k, v in {'b': 2, 'a': 1, 'C': 3}|dictsort %}{{ k }}={{ v }};{% endfor %} {{ names|max }} {{ 'aB'|max }}",
                  "['A', 'a', 'b', 'B'] ['b', 'B', 'A', 'a'] ['A', 'B', 'a', 'b'] ['b', 'A'] bdac a=1;b=2;C=3; b B");
    EXPECT_RENDER("{{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }} {{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum(start=1) }} "
                  "{{ [{'a': 30}, {'a': 25}]|sum(attribute='a') }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} "
                  "{{ 3|round }} {{ 2.4|round(0, 'ceil') }} {{ 2.6|round(method='floor') }} {{ 1234.5678|round(-2) }}",
                  "3 1 6 4.5 55 2.0 4.0 2.67 3 3.0 2.0 1200.0");
    EXPECT_RENDER("{{ 1 is gt 0 }} {{ [1, 2, 3, 4]|select('>=', 3)|list }} {{ none is sameas none }} {{ true is number }} "
                  "{{ missing is iterable }}",
                  "True [3, 4] True True True");
}

/* Case filters and methods map every letter, not only ASCII ('été'|upper
 * gave 'éTé'), 'ß' as Python does, and the title filter (words after white
 * space or -({[<) differs from str.title() (words after any uncased
 * character), as in Jinja2: expected strings are Jinja2 3.1's. */
Test(chat_template, case_mapping_is_unicode) {
    EXPECT_RENDER("{{ 'été ßx'|upper }} {{ 'ÉTÉ Ω'|lower }} {{ 'élan VITAL'|capitalize }}", "ÉTÉ SSX été ω Élan vital");
    EXPECT_RENDER("{{ \"they're hello_world 1st\"|title }}|{{ \"they're hello_world 1st\".title() }}",
                  "They're Hello_world 1st|They'Re Hello_World 1St");
    EXPECT_RENDER("{{ 'ßa'|capitalize }} {{ 'aß'|title }} {{ 'x ßy'.title() }} {{ 'straße'.upper() }}",
                  "Ssa Aß X Ssy STRASSE");
}

/* Python's full case mappings where they are more than one code point
 * ('İ' lowers to "i\u0307", 'ß' uppers to "SS" and titles to "Ss", ligatures
 * split, Greek ypogegrammeni becomes a capital iota), the final sigma of
 * lower() (in capitalize and title too; Jinja's title filter lowers each
 * word after its first character, so a two-letter word keeps 'σ'), Jinja's
 * title filter taking upper case, not title case, for a word's first
 * character, 'ª' counting as cased for str.title(), and any str.isspace()
 * character starting a word for the title filter (expected strings are
 * Jinja2 3.1's). */
Test(chat_template, full_case_mappings_and_final_sigma) {
    EXPECT_RENDER("{{ 'ÉTÉ İ'|lower }}|{{ 'ß ŉ ǰ ﬁx ﬀ ﬆ և'|upper }}|{{ 'ﬁx ßa ǆemal'.title() }}|{{ 'ﬁx ßa ǆemal'|title }}|"
                  "{{ 'ﬁx'|capitalize }} {{ 'ǆemal'|capitalize }}|{{ 'ᾳ ᾀ ΐ'|upper }}|{{ 'ᾳ'|capitalize }}",
                  "été i\u0307|SS \u02BCN J\u030C FIX FF ST \u0535\u0552|Fix Ssa ǅemal|FIx SSa Ǆemal|Fix ǅemal|"
                  "\u0391\u0399 \u1F08\u0399 \u0399\u0308\u0301|\u1FBC");
    EXPECT_RENDER("{{ 'ΟΔΟΣ ΟΔΟΣ.'|lower }}|{{ 'Σ'|lower }} {{ 'ΑΣΑ'|lower }}|{{ 'ΑΣ ΒΣ'.title() }}|{{ 'ΑΣ ΒΣ ΑΒΣ'|title }}|"
                  "{{ 'ΑΣ'|capitalize }}|{{ \"Α'Σ\"|lower }}",
                  "οδος οδος.|σ ασα|Ας Βς|Ασ Βσ Αβς|Ας|α'ς");
    EXPECT_RENDER("{{ 'ªb ºc 1st'.title() }}|{{ 'a\\x1cb c\\u3000d'|title }}", "ªb ºc 1St|A\x1c" "B C\u3000D");
}

/* Undefined inside containers stays undefined (Jinja2 3.1's output): an item
 * of map(attribute=) that lacks it joins as '' and prints as Undefined in a
 * list (Command-R's content|map(attribute='text')|join gave 'None'), a set
 * to undefined is not defined, and tojson refuses it as json.dumps does. */
Test(chat_template, undefined_in_containers) {
    EXPECT_RENDER("{{ [{'a': 'x'}, {}]|map(attribute='a')|join(',') }}|{{ [{'a': 'x'}, {}]|map(attribute='a')|list }}|"
                  "{{ [[1, 2], [3]]|map(attribute=1)|list }}|{{ [{}]|map(attribute='a', default='d')|first }}|"
                  "{{ ([{}]|map(attribute='a')|first) is defined }}|{{ [{}]|map(attribute='a')|map('default', 'z')|join }}",
                  "x,|['x', Undefined]|[2, Undefined]|d|False|z");
    EXPECT_RENDER("{% set x = missing %}[{{ x }}]{{ x is defined }}|{{ [missing, 1] }}|{{ {'k': missing} }}|"
                  "{{ [missing]|select|list }}|{{ [missing] == [missing] }}",
                  "[]False|[Undefined, 1]|{'k': Undefined}|[]|True");
    cr_expect_eq(jinja_err("{{ [missing]|tojson }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ missing|tojson }}", NULL), TOY_ERR_FORMAT);
}

/* Python's printf-style formatting, behind the % operator on strings and the
 * format filter (Jinja2's format is printf-style too); expected strings are
 * Python's. */
Test(chat_template, percent_formatting) {
    EXPECT_RENDER("{{ '%s|%5s|%-5s|%.2s|%r|%d|%i|%05d|%+d|%x|%X|%#x|%o|%#o|%.2f|%e|%g|%%|%c|%c|%5.1f|%-6d|%.3d' % "
                  "('é', 'ab', 'ab', 'abc', 'q', 3.7, True, -42, 5, -255, 255, 255, 8, 8, 3.14159, 12345.678, 0.00001, "
                  "65, 'z', 2.25, 7, 5) }}",
                  "é|   ab|ab   |ab|'q'|3|1|-0042|+5|-ff|FF|0xff|10|0o10|3.14|1.234568e+04|1e-05|%|A|z|  2.2|7     |005");
    EXPECT_RENDER("{{ '%s' % [1, 2] }}|{{ '%s and %s' % ('a', 'b') }}|{{ '%d items' % 3 }}|{{ '%s' % none }}|"
                  "{{ '%(a)s-%(b)d' % {'a': 'x', 'b': 2} }}|{{ '%s' % {'a': 1} }}|{{ 'ab' % () }}|{{ '%s'|format([1]) }}|"
                  "{{ '%s-%s'|format('a', 2) }}|{{ '%s' % missing }}|{{ '%.1f%%' % 12.345 }}|{{ '%(a)s'|format(a=1) }}|"
                  "{{ '%05.1f|%010.3f|%08.3s|%-+5d|%d' % (-2.5, 3.14159, 'abcdef', 4, 1e20) }}",
                  "[1, 2]|a and b|3 items|None|x-2|{'a': 1}|ab|[1]|a-2||12.3%|1|-02.5|000003.142|     abc|+4   |"
                  "100000000000000000000");
    cr_expect_eq(jinja_err("{{ '%d' % 'x' }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ '%s %s' % ('a',) }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 'x' % 5 }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ '%x' % 3.0 }}", NULL), TOY_ERR_FORMAT);
}

/* More of Jinja2's filters and tests (expected strings are Jinja2 3.1's):
 * truncate with its leeway of 5, center as str.center, batch and slice,
 * attr (JSON values have no data attributes), escape/e/forceescape as
 * markupsafe, striptags, urlencode; the lower/upper/callable tests. */
Test(chat_template, more_jinja2_filters) {
    EXPECT_RENDER("{{ 'hello world foo'|truncate(9) }}|{{ 'hello world foo'|truncate(9, true) }}|"
                  "{{ 'hello world foo bar baz'|truncate(12, false, '..', 0) }}|{{ 'abcdefghijkl'|truncate(5, leeway=0) }}|"
                  "{{ 'short'|truncate(3) }}|{{ 'héllo wörld'|truncate(7, leeway=0) }}|{{ 'ab cd'|truncate(3, leeway=0) }}",
                  "hello...|hello ...|hello..|ab...|short|héll...|...");
    EXPECT_RENDER("[{{ 'ab'|center(5) }}][{{ 'abc'|center(6) }}][{{ 'é'|center(4) }}]", "[  ab ][ abc  ][ é  ]");
    EXPECT_RENDER("{{ [1,2,3,4,5]|batch(2)|list }}{{ [1,2,3]|batch(2, 'x')|list }}{{ [1,2,3,4,5]|slice(3)|list }}"
                  "{{ [1,2,3,4]|slice(3, 0)|list }}{{ 'abc'|batch(2)|list }}",
                  "[[1, 2], [3, 4], [5]][[1, 2], [3, 'x']][[1, 2], [3, 4], [5]][[1, 2], [3, 0], [4, 0]][['a', 'b'], ['c']]");
    EXPECT_RENDER("{{ {'a':1}|attr('a') }}|{{ ({'a':1}|attr('a')) is defined }}", "|False");
    EXPECT_RENDER("{{ '<p>a  <b>b</b>\\n<!-- c --> &amp; &lt;x&gt; &#65;&#x42; &quot;</p>'|striptags }}", "a b & <x> AB \"");
    EXPECT_RENDER("{{ '<&>\"\\''|e }}|{{ 5|escape }}|{{ none|forceescape }}|{{ [1, '<']|e }}|{{ 'a b&c/é'|urlencode }}|"
                  "{{ {'a b': 'c&d', 'e': 1}|urlencode }}",
                  "&lt;&amp;&gt;&#34;&#39;|5|None|[1, &#39;&lt;&#39;]|a%20b%26c/%C3%A9|a+b=c%26d&e=1");
    EXPECT_RENDER("{{ 'abc' is lower }}{{ 'aBC' is upper }}{{ 5 is lower }}{{ '1A' is upper }}{{ '12' is lower }}"
                  "{% macro m() %}{% endmacro %}{{ m is callable }}{{ {} is callable }}{{ 'x' is escaped }}",
                  "TrueFalseFalseTrueFalseTrueFalseFalse");
    cr_expect_eq(jinja_err("{{ 'abcdef'|truncate(2) }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 5|truncate(3) }}", NULL), TOY_ERR_FORMAT);
}

/* More of Python's str and list methods (expected strings are Python's). */
Test(chat_template, more_string_methods) {
    EXPECT_RENDER("{{ 'a,b,c'.rsplit(',', 1) }}{{ '  a b c  '.rsplit(none, 1) }}{{ ' a b '.rsplit() }}{{ 'a b c'.rsplit(' ', 0) }}",
                  "['a,b', 'c']['  a b', 'c']['a', 'b']['a b c']");
    EXPECT_RENDER("{{ 'a\\nb\\r\\nc\\rd\\x0be\\x85f\\n'.splitlines() }}{{ 'a\\nb'.splitlines(true) }}{{ ''.splitlines() }}",
                  "['a', 'b', 'c', 'd', 'e', 'f']['a\\n', 'b'][]");
    EXPECT_RENDER("{{ '7'.zfill(3) }}{{ '-7'.zfill(4) }}{{ '+ab'.zfill(5) }}{{ 'abc'.zfill(2) }}|{{ 'héllo'.rfind('l') }}"
                  "{{ 'x'.rfind('y') }}{{ 'ab'.rfind('') }}|{{ 'Ab1'.isalnum() }}{{ 'A B'.isupper() }}{{ 'ab'.islower() }}"
                  "{{ ''.isalnum() }}|{{ [1, 2, 2].count(2) }}|{{ 'ab'.ljust(4, '*') }}{{ 'ab'.rjust(4) }}{{ 'ab'.center(5, '-') }}",
                  "007-007+00ababc|3-12|TrueTrueTrueFalse|2|ab**  ab--ab-");
    EXPECT_RENDER("{{ '{} is {}'.format('x', 1) }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name}!'.format(name='n') }}|"
                  "{{ '{{x}}'.format() }}",
                  "x is 1|aba|n!|{x}");
}

/* {% with %} scopes its names (the values see the outer ones), {% set x | f %}
 * filters a block set, loop.cycle/loop.changed, and the cycler and joiner
 * globals (expected strings are Jinja2 3.1's). */
Test(chat_template, with_block_set_filters_cycler_joiner) {
    EXPECT_RENDER("{% set a = 5 %}{% with a = 1, b = a %}{{ a }}{{ b }}{% set c = 3 %}{% endwith %}{{ a }}[{{ c }}]|"
                  "{% with %}{% set q = 1 %}{{ q }}{% endwith %}[{{ q }}]|"
                  "{% set ns = namespace(x=0) %}{% with %}{% set ns.x = 5 %}{% endwith %}{{ ns.x }}",
                  "155[]|1[]|5");
    EXPECT_RENDER("{% set blk | upper %}abc{{ 1 }}{% endset %}{{ blk }}|{% set b2 | replace('a', 'x') | upper %}aba{% endset %}{{ b2 }}",
                  "ABC1|XBX");
    EXPECT_RENDER("{% for x in [1,2,3] %}{{ loop.cycle('a', 'b') }}{% endfor %}|"
                  "{% for x in [1,1,2,2,1] %}{{ loop.changed(x) }}{% endfor %}|{% for x in [1,1] %}{{ loop.changed(x, 2) }}{% endfor %}",
                  "aba|TrueFalseTrueFalseTrue|TrueFalse");
    EXPECT_RENDER("{% set c = cycler('a','b') %}{{ c.current }}{{ c.next() }}{{ c.next() }}{{ c.next() }}{{ c.current }}"
                  "{% set _ = c.reset() %}{{ c.next() }}|{% set j = joiner() %}{% for x in [1,2] %}{{ j() }}{{ x }}{% endfor %}|"
                  "{% set j = joiner('|') %}{{ j() }}{{ j() }}{{ j() }}",
                  "aababa|1, 2|||");
}

/* Jinja2 looks up a Python attribute before a key: d.items is dict.items
 * even when d has a key 'items' (Hermes' json_spec.items.type is undefined
 * there), d['items'] is the key, the sandbox hides mutating methods, and
 * only a namespace takes {% set ns.x %} (expected strings are Jinja2 3.1's). */
Test(chat_template, dict_attribute_is_method_first) {
    EXPECT_RENDER("{% set x = {'items': [1], 'keys': 'k', 'update': 'u', 'type': 't'} %}{{ x.items is defined }}|"
                  "{{ x.items.type is defined }}|{{ x.update is defined }}|{{ x.type }}|{{ x.items is mapping }}|"
                  "{{ x.items is callable }}|{{ x['items'] }}|{{ x.keys()|list }}|{{ 'y' if x.values else 'n' }}",
                  "True|False|False|t|False|True|[1]|['items', 'keys', 'update', 'type']|y");
    EXPECT_RENDER("{% set ns = namespace(items=1, keys=2) %}{{ ns.items }}{{ ns.keys }} {{ ns }}", "12 <Namespace {'items': 1, 'keys': 2}>");
    cr_expect_eq(jinja_err("{% set dd = {'a': 1} %}{% set dd.a = 2 %}{{ dd.a }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% set x = {'items': 1} %}{{ x.items|tojson }}", NULL), TOY_ERR_FORMAT);
}

/* Tuples print as Python's, (1, 2) and (1,), and never equal a list; the
 * pairs of .items() and dictsort and a macro's varargs are tuples; list()
 * of a tuple is a list; == compares numbers by value at any depth
 * (expected strings are Jinja2 3.1's). */
Test(chat_template, tuples) {
    EXPECT_RENDER("{{ (1, 2) }}{{ (1,) }}{{ () }}|{% set t = 1, 'a' %}{{ t }}|{{ {'b': 1, 'a': [2]}.items()|list }}|"
                  "{{ {'b': 1}|dictsort }}|{% macro m(a) %}{{ varargs }}{% endmacro %}{{ m(1, 2, 3) }}{{ m(1, 2) }}|"
                  "{{ (1, 2) == [1, 2] }}{{ (1, 2) == (1, 2) }}{{ [1, [2]] == [1.0, [2.0]] }}{{ {'a': [1]} == {'a': [1.0]} }}|"
                  "{{ (1, 2)|list }}|{% set t = ('x', 2) %}{{ '%s=%d' % t }}|{{ [(1, 2)]|tojson }}",
                  "(1, 2)(1,)()|(1, 'a')|[('b', 1), ('a', [2])]|[('b', 1)]|(2, 3)(2,)|FalseTrueTrueTrue|[1, 2]|x=2|[[1, 2]]");
    /* many short-lived tuples: the set of them is swept as it grows */
    EXPECT_RENDER("{% set ns = namespace(n=0) %}{% for i in range(3000) %}{% set t = (i, i) %}{% set ns.n = ns.n + t[1] %}"
                  "{% endfor %}{{ ns.n }}{{ (ns.n,) }}",
                  "4498500(4498500,)");
}

/* d.keys(), d.values() and d.items() are views: they print as Python's
 * dict_keys([...]) and so on, also inside a container, through |string, ~,
 * %s, a variable or |default; whatever makes a new value of one (|list,
 * |sort, |map...) is a list. A view kept across many others keeps its kind
 * as the set of them is swept (expected strings are Jinja2 3.1's). */
Test(chat_template, dict_views_print_as_views) {
    EXPECT_RENDER("{% set d = {'b': 2, 'a': 1} %}{{ d.items() }}|{{ d.keys() }}|{{ d.values() }}|{{ {}.keys() }}|{{ [d.keys()] }}|"
                  "{{ d.keys()|string }}|{{ d.values() ~ '' }}|{{ '%s' % d.keys() }}|{% set ks = d.keys() %}{{ ks }}|"
                  "{{ d.keys()|default('x') }}|{{ (d.values(),) }}|{{ {'x': d.values()} }}|{{ d.keys()|list }}|{{ d.items()|sort }}|"
                  "{{ d.keys()|map('upper')|list }}|{{ d.items()|first }}|{{ d.keys()|join(',') }}",
                  "dict_items([('b', 2), ('a', 1)])|dict_keys(['b', 'a'])|dict_values([2, 1])|dict_keys([])|[dict_keys(['b', 'a'])]|"
                  "dict_keys(['b', 'a'])|dict_values([2, 1])|dict_keys(['b', 'a'])|dict_keys(['b', 'a'])|"
                  "dict_keys(['b', 'a'])|(dict_values([2, 1]),)|{'x': dict_values([2, 1])}|['b', 'a']|[('a', 1), ('b', 2)]|"
                  "['B', 'A']|('b', 2)|b,a");
    EXPECT_RENDER("{% set keep = {'q': 1}.items() %}{% set t = (1,) %}{% set ns = namespace(n=0) %}{% for i in range(3000) %}"
                  "{% set k = {'a': i}.values() %}{% set ns.n = ns.n + k|first %}{% endfor %}{{ ns.n }}{{ keep }}{{ t }}{{ {'z': 1}.keys() }}",
                  "4498500dict_items([('q', 1)])(1,)dict_keys(['z'])");
}

/* tojson is Hugging Face's json.dumps(x, ensure_ascii=False, indent=None,
 * separators=None, sort_keys=False): the first positional argument is
 * ensure_ascii, an indent is spaces or a string (0: newlines only), with an
 * indent the item separator is ",", sort_keys orders keys by code point
 * (expected strings are Jinja2 3.1's with HF's filter). */
Test(chat_template, tojson_options) {
    EXPECT_RENDER("{% set d = {'b': [1, {'z': 'é', 'a': none}], 'a': {}, 'c': []} %}{{ d|tojson(indent=2) }}|"
                  "{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(indent='\\t', sort_keys=true) }}|"
                  "{{ d|tojson(indent=0) }}|{{ 'é\\u4e16\\U0001F389\\x7f'|tojson(ensure_ascii=true) }}{{ 'é'|tojson(2) }}|"
                  "{{ [1, 2]|tojson(false, 1, (';', '=')) }}",
                  "{\n  \"b\": [\n    1,\n    {\n      \"z\": \"é\",\n      \"a\": null\n    }\n  ],\n  \"a\": {},\n  \"c\": []\n}|"
                  "{\"a\": {}, \"b\": [1, {\"a\": null, \"z\": \"é\"}], \"c\": []}|{\"b\":[1,{\"z\":\"é\",\"a\":null}],\"a\":{},\"c\":[]}|"
                  "{\n\t\"a\": {},\n\t\"b\": [\n\t\t1,\n\t\t{\n\t\t\t\"a\": null,\n\t\t\t\"z\": \"é\"\n\t\t}\n\t],\n\t\"c\": []\n}|"
                  "{\n\"b\": [\n1,\n{\n\"z\": \"é\",\n\"a\": null\n}\n],\n\"a\": {},\n\"c\": []\n}|"
                  "\"\\u00e9\\u4e16\\ud83c\\udf89\\u007f\"\"\\u00e9\"|[\n 1;\n 2\n]");
    cr_expect_eq(jinja_err("{{ [1]|tojson(separators=',') }}", NULL), TOY_ERR_FORMAT);
}

/* {% for ... recursive %}: loop(items) renders the loop again one level
 * deeper (loop.depth), in the scopes the loop sees, with its filter and its
 * else (expected strings are Jinja2 3.1's). */
Test(chat_template, recursive_loops) {
    EXPECT_RENDER("{%- set tree = [{'n': 'a', 'kids': [{'n': 'b', 'kids': [{'n': 'c'}]}, {'n': 'd'}]}, {'n': 'e', 'kids': []}] -%}"
                  "{% set top = 'T' %}{% for x in tree recursive %}{% set inner = x.n %}[{{ loop.depth }}{{ loop.depth0 }}"
                  "{{ loop.index }}/{{ loop.length }} {{ x.n }}{{ top }}{% if x.kids %}<{{ loop(x.kids) }}>{% endif %}{{ inner }}]"
                  "{% else %}E{% endfor %}|"
                  "{% for x in [[1, [2, [3]]], 4] if x != 2 recursive %}{% if x is iterable %}({{ loop(x) }}){% else %}{{ x }}"
                  "{% endif %}{% endfor %}|{% for k, v in {'a': {'b': {}}}.items() recursive %}{{ k }}{{ loop(v.items()) }}{% endfor %}|"
                  "{% for x in [[]] recursive %}{{ loop(x) }}{% else %}empty{% endfor %}",
                  "[101/2 aT<[211/2 bT<[321/1 cTc]>b][212/2 dTd]>a][102/2 eTe]|(1((3)))4|ab|empty");
    cr_expect_eq(jinja_err("{% for x in [1] %}{{ loop([]) }}{% endfor %}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% set t = [1] %}{% for x in [t] recursive %}{{ loop([t]) }}{% endfor %}", NULL), TOY_ERR_FORMAT);
}

/* Int dict keys stay ints, apart from their strings: {1: 'one', '1': 'str'}
 * prints, looks up (by 1, 1.0 and True), iterates, tests with `in` and
 * serializes as Python's does (expected strings are Jinja2 3.1's). */
Test(chat_template, int_dict_keys) {
    EXPECT_RENDER("{% set m = {1: 'one', '1': 'str', 2: [true]} %}{{ m }}|{{ m[1] }}{{ m['1'] }}{{ m[1.0] }}{{ m[true] }}|"
                  "{{ m.get(2) }}{{ m.get(3, 'd') }}|{{ 1 in m }}{{ 3 in m }}{{ '2' in m }}|{{ m|list }}{{ m.keys()|list }}|"
                  "{% for k, v in m.items() %}{{ k + 1 if k is number else k }};{% endfor %}|{{ m|tojson }}|"
                  "{{ {2: 'b', 1: 'a'}|dictsort }}|{{ m.2 }}|{{ {true: 'a'}[1] }}",
                  "{1: 'one', '1': 'str', 2: [True]}|onestroneone|[True]d|TrueFalseFalse|[1, '1', 2][1, '1', 2]|2;1;3;|"
                  "{\"1\": \"one\", \"1\": \"str\", \"2\": [true]}|[(1, 'a'), (2, 'b')]|[True]|a");
}

/* Sequence repetition ('ab' * 3, 3 * 'ab', [0] * 3) and replace('', x),
 * which puts x around every character, as Python has them (expected
 * strings are Jinja2 3.1's). */
Test(chat_template, repetition_and_empty_replace) {
    EXPECT_RENDER("{{ 'ab' * 3 }} {{ 3 * 'ab' }} [{{ '=' * 0 }}] [{{ 'x' * -2 }}] {{ [0] * 3 }} {{ 2 * [1, 'a'] }} {{ [1] * 0 }} "
                  "{{ 'é' * 2 }}|{{ 'abc'|replace('', '-') }} {{ 'abc'.replace('', '-', 2) }} {{ ''|replace('', 'x') }} "
                  "{{ 'héé'|replace('', '.') }}",
                  "ababab ababab [] [] [0, 0, 0] [1, 'a', 1, 'a'] [] éé|-a-b-c- -a-bc x .h.é.é.");
    cr_expect_eq(jinja_err("{{ 'ab' * 100000000 }}", NULL), TOY_ERR_FORMAT);
}

/* Substring searches (find, count, split, replace, striptags' comments)
 * run over windows that double from 4 KiB: matches across a window's edge,
 * a needle longer than half a window, comments and tags left open (a
 * search each, which was quadratic: 23 s for a million '<!--'). What a split
 * copies is charged to the render's budget (a split into millions of
 * pieces took gigabytes, unbounded); so is what rsplit copies. */
Test(chat_template, searches_over_long_strings) {
    EXPECT_RENDER("{{ ('x' * 4094 ~ 'abc' ~ 'x' * 5000 ~ 'abc').find('abc') }}|"
                  "{{ ('x' * 4094 ~ 'abc' ~ 'x' * 9000 ~ 'abc').count('abc') }}|"
                  "{{ ('x' * 4095 ~ 'ab' ~ 'x' * 9000).split('ab') | map('length') | join(',') }}|"
                  "{% set n = 'y' * 5000 %}{{ ('x' * 7000 ~ n ~ 'x').find(n) }} {{ ('x' * 7000 ~ n).count(n) }}|"
                  "{{ ('x' * 10000 ~ 'ab' ~ 'x' * 5000 ~ 'ab') | replace('ab', 'Z') | length }}|"
                  "{{ 'a<!--x-->b<!--y-->c<!--z'|striptags }}|{{ 'a<!--x-->b <!--y<!--z-->c'|striptags }}|"
                  "{{ ('<!--' * 100000) | striptags | length }}|{{ 'a<b>c<d e'|striptags }}|{{ ('<' * 100000) | striptags | length }}",
                  "4094|2|4095,9000|7000 1|15002|abc<!--z|ab c|400000|ac<d e|100000");
    /* 64 MB split into pieces copies 64 more: over the 128 MiB a render may build */
    cr_expect_eq(jinja_err("{{ (('x' * 8000000 ~ 'a') * 8).split('a') | length }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ (('x' * 8000000 ~ ' ') * 8).split() | length }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ (('x' * 8000000 ~ 'a') * 8).rsplit('a') | length }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ (('x' * 8000000 ~ ' ') * 8).rsplit() | length }}", NULL), TOY_ERR_FORMAT);
    EXPECT_RENDER("{{ (('x' * 8000000 ~ 'a') * 4).split('a') | length }}|{{ ('x' * 1000000) | replace('x', 'yz') | length }}|"
                  "{{ ('ab' * 1000000).count('a') }}",
                  "5|2000000|1000000");
    EXPECT_RENDER("{{ (('x' * 8000000 ~ ' ') * 4).rsplit(None, 2) | map('length') | join(',') }}", "16000001,8000000,8000000");
    /* from the right, as Python (overlapping separators split otherwise than from the left); a needle
     * that matches all but its last byte at every position of a long string (a search, not a compare at
     * every position); matches across the edge of the first windows from the end (64 and 128 bytes) */
    EXPECT_RENDER("{{ 'aaa'.rsplit('aa') }}{{ 'aaa'.split('aa') }}{{ 'aaaa'.rfind('aa') }}{{ 'abcabc'.rfind('bc') }}"
                  "{{ 'a,b,,c'.rsplit(',', 2) }}{{ 'xyx'.rsplit('xyx') }}{{ 'ab'.rsplit('abc') }}|"
                  "{% set n = 'a' * 3000 ~ 'b' %}{{ ('a' * 4000000).rfind(n) }} {{ ('a' * 4000000).rsplit(n) | length }} "
                  "{{ ('a' * 4000000 ~ n ~ 'a').rfind(n) }}|{{ ('bc' ~ 'x' * 63).rfind('bc') }} {{ ('xbc' ~ 'x' * 126).rfind('bc') }} "
                  "{{ ('xbc' ~ 'x' * 126).rsplit('bc') | map('length') | join(',') }}",
                  "['a', '']['', 'a']24['a,b', '', 'c']['', '']['ab']|-1 1 4000000|0 1 1,126");
}

/* int(default, base) and float(default) as Jinja2's: Python's int(s, base)
 * (prefixes, underscores, white space), then int(float(s)), then the
 * default (expected strings are Jinja2 3.1's). */
Test(chat_template, int_and_float_filters) {
    EXPECT_RENDER("{{ '42'|int }} {{ '3.7'|int }} {{ 3.9|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ -3.9|int }} {{ '0x1A'|int(0, 16) }} "
                  "{{ '1_000'|int }} {{ ' -7 '|int }} {{ '0b101'|int(base=0) }} {{ 'ff'|int(base=16) }} {{ '0o17'|int(0, 0) }} "
                  "{{ '010'|int(-1, 0) }} {{ '1__0'|int(-1) }} {{ '_1'|int(-1) }} {{ '1_'|int(-1) }} {{ none|int(9) }} "
                  "{{ true|int }} {{ '1e3'|int }} {{ 'nan'|int(4) }} {{ 'z'|int(1, 36) }}|{{ '2.5'|float }} {{ 3|float }} "
                  "{{ 'x'|float }} {{ 'x'|float(1.5) }} {{ ' 1_0.5 '|float }} {{ '0x10'|float(-1) }} {{ none|float(2) }} "
                  "{{ '1e3'|float }}",
                  "42 3 3 0 5 -3 26 1000 -7 5 255 15 10 -1 -1 -1 9 1 1000 4 35|2.5 3.0 0.0 1.5 10.5 -1 2 1000.0");
    /* Python's ints have no bound; toy's 64-bit ones refuse what does not fit */
    cr_expect_eq(jinja_err("{{ '99999999999999999999'|int }}", NULL), TOY_ERR_FORMAT);
}

/* indent as Jinja2's: lines as str.splitlines() gives them (joined with
 * "\n"), empty ones left unless blank=true, first=true indents even an
 * empty start; a non-string is an error (expected strings are Jinja2 3.1's). */
Test(chat_template, indent_filter_lines) {
    EXPECT_RENDER("{% set multi = 'a\\nb\\n\\nc\\n' %}[{{ multi|indent }}][{{ multi|indent(2, true) }}][{{ multi|indent(2, blank=true) }}]"
                  "[{{ multi|indent('> ') }}][{{ '\\nx'|indent(2, true) }}][{{ ''|indent(2, true) }}][{{ ''|indent }}]"
                  "[{{ 'a\\r\\nb\\rc\\u2028d'|indent(1) }}][{{ 'x\\n'|indent(3, true, true) }}]",
                  "[a\n    b\n\n    c\n][  a\n  b\n\n  c\n][a\n  b\n  \n  c\n  ][a\n> b\n\n> c\n][  \n  x][  ][][a\n b\n c\n d][   x\n   ]");
    cr_expect_eq(jinja_err("{{ 5|indent }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ none|indent }}", NULL), TOY_ERR_FORMAT);
}

/* An attribute, item or slice of undefined is an error, as Jinja2's
 * Undefined raises (a template rendered by Hugging Face stops there); an
 * undefined value itself prints, tests, iterates and defaults, and an
 * attribute of none, a string or a number is undefined (expected strings
 * are Jinja2 3.1's). */
Test(chat_template, attribute_of_undefined_is_an_error) {
    cr_expect_eq(jinja_err("[{{ missing.attr }}]", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("[{{ missing['k'] }}]", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("[{{ missing[1:] }}]", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% set d = {} %}[{{ d.zz.yy }}]", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("[{{ ('y' if false).x }}]", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ messages[0].tool_calls[0] }}", "[{\"role\":\"user\",\"content\":\"x\"}]"), TOY_ERR_FORMAT);
    EXPECT_RENDER("[{{ missing }}][{{ missing is defined }}][{{ missing|default('d') }}][{{ missing|length }}]"
                  "{% for x in missing %}x{% endfor %}[{{ none.x }}][{{ 'ab'.x }}]{% set n = 1 %}[{{ n.x is defined }}]"
                  "{% set d = {} %}[{{ d.zz is defined }}][{{ (d.zz.yy is defined) if d.zz is defined }}]"
                  "[{{ missing.x if missing is defined else 'guarded' }}]",
                  "[][False][d][0][][][False][False][][guarded]");
    /* `in` needs a container on its right, and a string on its left when that is a string */
    EXPECT_RENDER("{{ 'a' in missing }}{{ 1 in [1] }}{{ 1 in {1: 2} }}", "FalseTrueTrue");
    cr_expect_eq(jinja_err("{{ 'a' in none }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 1 in 'abc' }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ 'a' in 5 }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{{ missing in 'abc' }}", NULL), TOY_ERR_FORMAT);
}

/* "+%}" keeps the newline after a block tag (trim_blocks off for it), and
 * `for x in 1, 2` loops over a tuple (expected strings are Jinja2 3.1's). */
Test(chat_template, plus_block_end_and_bare_tuple_loop) {
    EXPECT_RENDER("{% if true +%}\nx{% endif +%}\ny\n{% for i in [1] +%}\n  {{ i }}\n{%+ endfor +%}\nz", "\nx\ny\n\n  1\n\nz");
    EXPECT_RENDER("{% for x in 1, 2 %}{{ x }}{% endfor %}|{% for x in 'a', %}{{ x }}{% endfor %}|"
                  "{% for x in 1, 2, 3 if x > 1 %}{{ x }}{% endfor %}",
                  "12|a|23");
}

/* ---- limits: templates are untrusted (GGUF files, `toy serve` clients) ---- */

static char *repeat(const char *head, const char *unit, int n, const char *mid, const char *unit2, int n2, const char *tail) {
    size_t len = strlen(head) + strlen(unit) * (size_t)n + strlen(mid) + strlen(unit2) * (size_t)n2 + strlen(tail) + 1;
    char *s = malloc(len), *p = s;
    p = stpcpy(p, head);
    for (int i = 0; i < n; i++) p = stpcpy(p, unit);
    p = stpcpy(p, mid);
    for (int i = 0; i < n2; i++) p = stpcpy(p, unit2);
    stpcpy(p, tail);
    return s;
}

static void expect_parse_error(char *src, const char *what) {
    struct toy_chat_template *t = NULL;
    cr_expect_eq(toy_chat_template_init(src, &t), TOY_ERR_FORMAT, "%s parsed", what);
    cr_expect(strstr(toy_last_error(), "nested too deeply"), "%s: %s", what, toy_last_error());
    toy_chat_template_free(t);
    free(src);
}

/* The parser is recursive: deep nesting was a stack overflow (found by fuzz/fuzz-jinja.c). */
Test(chat_template, deep_nesting_is_a_syntax_error) {
    expect_parse_error(repeat("{{ ", "(", 100000, "1", ")", 100000, " }}"), "parentheses");
    expect_parse_error(repeat("{{ ", "[", 100000, "1", "]", 100000, " }}"), "lists");
    expect_parse_error(repeat("{{ ", "-", 100000, "1", "", 0, " }}"), "unary minus");
    expect_parse_error(repeat("{{ ", "not ", 100000, "1", "", 0, " }}"), "not");
    expect_parse_error(repeat("", "{% if 1 %}", 100000, "x", "{% endif %}", 100000, ""), "if blocks");
    expect_parse_error(repeat("{% if 0 %}", "{% elif 0 %}", 100000, "x", "", 0, "{% endif %}"), "elif chain");
    /* what real templates do still parses */
    char *ok = repeat("{{ ", "(", 50, "1", ")", 50, " }}");
    EXPECT_RENDER(ok, "1");
    free(ok);
    ok = repeat("", "{% if 1 %}", 50, "x", "{% endif %}", 50, "");
    EXPECT_RENDER(ok, "x");
    free(ok);
    ok = repeat("{% if 0 %}", "{% elif 0 %}", 100, "{% else %}e", "", 0, "{% endif %}");
    EXPECT_RENDER(ok, "e");
    free(ok);
}

/* A long operator chain parses flat but evaluates recursively: a stack overflow at render. */
Test(chat_template, long_operator_chain_is_an_error) {
    char *src = repeat("{{ 1", "+1", 100000, "", "", 0, " }}");
    cr_expect_eq(jinja_err(src, NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "nests more than"), "%s", toy_last_error());
    free(src);
    src = repeat("{{ 1", "+1", 299, "", "", 0, " }}");
    EXPECT_RENDER(src, "300");
    free(src);
}

/* Renders that would run for hours or eat all memory fail instead. */
/* A container put inside itself is a reference cycle jansson's counts never free: every render of such a
 * template (a GGUF's, a serve client's) leaked it (found by fuzz/fuzz-jinja.c; make asan reports the leak).
 * It is an error naming the cycle; a list appended into another, and a namespace holding lists, still work. */
Test(chat_template, a_container_inside_itself_is_refused) {
    cr_expect_eq(jinja_err("{% set ns = namespace() %}{% set ns.l = ns, 1 %}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "reference cycle"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{% set ns = namespace(l=[]) %}{{ ns.l.append(ns) }}", NULL), TOY_ERR_FORMAT);
    cr_expect_eq(jinja_err("{% set l = [] %}{{ l.append([1, l]) }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "reference cycle"), "%s", toy_last_error());
    EXPECT_RENDER("{% set a = [1] %}{% set b = [] %}{{ b.append(a) }}{{ b.append(a) }}{{ b }}", "NoneNone[[1], [1]]");
    EXPECT_RENDER("{% set ns = namespace(l=[]) %}{{ ns.l.append(2) }}{% set ns.m = ns.l + [3] %}{{ ns.m }}", "None[2, 3]");
}

Test(chat_template, render_budget) {
    cr_expect_eq(jinja_err("{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}", NULL),
                 TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "MiB") || strstr(toy_last_error(), "steps"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", NULL),
                 TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "steps"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                           "{% endfor %}{{ ns.s|length }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "MiB"), "%s", toy_last_error());
    cr_expect_eq(jinja_err("{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                           "{% endfor %}{{ ns.s|length }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "MiB"), "%s", toy_last_error());
    /* batch(n) walked all n slots of a row, filled or not (LLONG_MAX: a hang) */
    EXPECT_RENDER("{{ [1, 2, 3] | batch(9223372036854775807) | list | length }}", "1");
    EXPECT_RENDER("{{ [1, 2, 3] | batch(2, 0) | list }}", "[[1, 2], [3, 0]]");
    cr_expect_eq(jinja_err("{{ [1, 2, 3] | batch(100000000000, 0) | list | length }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "MiB"), "%s", toy_last_error());
    /* a big but reasonable render still works: 1000 messages, 20000 loop iterations */
    size_t cap = 1000 * 48 + 16;
    char *msgs = malloc(cap), *p = msgs;
    p += sprintf(p, "[");
    for (int i = 0; i < 1000; i++) p += sprintf(p, "%s{\"role\":\"user\",\"content\":\"message %d\"}", i ? "," : "", i);
    sprintf(p, "]");
    char *out = render("chatml", msgs, true, NULL, NULL);
    cr_expect(strstr(out, "message 999<|im_end|>"));
    free(out);
    free(msgs);
    out = jinja("{% set ns = namespace(n=0) %}{% for i in range(200) %}{% for j in range(100) %}{% set ns.n = ns.n + 1 %}"
                "{% endfor %}{% endfor %}{{ ns.n }}");
    cr_expect_str_eq(out, "20000");
    free(out);
}

/* sort and unique were insertion sorts and pairwise scans: 100000 items
 * took 44 s, and a loop re-sorting a list was bounded by nothing; now they
 * are O(n log n) and their comparisons count against the render's steps. */
Test(chat_template, sort_and_unique_of_long_lists) {
    EXPECT_RENDER("{% set l = range(60000)|reverse|sort %}{{ l|first }} {{ l|last }} {{ l|length }}", "0 59999 60000");
    EXPECT_RENDER("{% set l = (range(30000)|list + range(30000)|reverse|list)|unique|list %}{{ l|length }} {{ l[:3] }} "
                  "{{ l|last }}", "30000 [0, 1, 2] 29999");
    EXPECT_RENDER("{{ (range(30000)|map('string')|list * 2)|unique|list|length }}", "30000");
    /* stability, case folding, numbers beside strings and bools, reverse, dicts */
    EXPECT_RENDER("{{ ['b', 'A', 'a', 2, 1.0, true, 'B', 1]|unique|list }}", "['b', 'A', 2, 1.0]");
    EXPECT_RENDER("{{ ['b', 'A', 'a', 'B']|sort }} {{ ['b', 'A', 'a', 'B']|sort(reverse=true) }}",
                  "['A', 'a', 'b', 'B'] ['b', 'B', 'A', 'a']");
    EXPECT_RENDER("{{ ['b', 'A', 'a', 'B']|sort(case_sensitive=true) }} {{ [{'a': 1}, {'a': 1}, {'a': 2}]|unique|list }}",
                  "['A', 'B', 'a', 'b'] [{'a': 1}, {'a': 2}]");
    EXPECT_RENDER("{{ [{'n': 'b', 'k': 2}, {'n': 'a', 'k': 1}, {'n': 'c', 'k': 1}]|sort(attribute='k')|map(attribute='n')|list }}",
                  "['a', 'c', 'b']");
    EXPECT_RENDER("{{ {'b': 1, 'a': 2, 'c': 0}|dictsort(by='value', reverse=true) }}", "[('a', 2), ('b', 1), ('c', 0)]");
    /* re-sorting a long list in a loop runs out of steps */
    cr_expect_eq(jinja_err("{% set l = range(1000)|list %}{% for i in range(8000) %}{{ (l|sort)|length }}{% endfor %}",
                           NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "steps"), "%s", toy_last_error());
    EXPECT_RENDER("{{ range(3000)|batch(1)|unique|list|length }}", "3000"); /* lists: compared pairwise */
    cr_expect_eq(jinja_err("{{ range(12000)|batch(1)|unique|list|length }}", NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "steps"), "%s", toy_last_error());
    /* scans that build nothing count too: x in list, list == list, a substring in a long string */
    const char *scans[] = {"999999 in l", "l == l", "'b' in s"};
    for (int i = 0; i < 3; i++) {
        char src[200];
        snprintf(src, sizeof src, "{%% set l = range(1000000)|list %%}{%% set s = 'a' * 10000000 %%}"
                 "{%% for i in range(3000) %%}{{ %s }}{%% endfor %%}", scans[i]);
        cr_expect_eq(jinja_err(src, NULL), TOY_ERR_FORMAT, "%s", scans[i]);
        cr_expect(strstr(toy_last_error(), "steps"), "%s: %s", scans[i], toy_last_error());
    }
}

/* What the counts miss (here: str.count over 60 MB, repeated) stops at
 * the render's CPU-time limit (10 s) instead of running for minutes. */
Test(chat_template, render_cpu_time_limit, .timeout = 120) {
    cr_expect_eq(jinja_err("{% set s = 'a' * 60000000 %}{% for i in range(100000) %}{{ s.count('b') }}{% endfor %}",
                           NULL), TOY_ERR_FORMAT);
    cr_expect(strstr(toy_last_error(), "s of CPU time"), "%s", toy_last_error());
}

/* Inputs found by fuzz/fuzz-jinja.c: the first byte picks the mode, as there
 * (even: the rest is a template; odd: the rest is messages JSON for the
 * built-in chatml). Each must render or fail with a message, not crash. */
Test(chat_template, fuzz_regressions) {
    DIR *d = opendir("tests/data/jinja-crashes");
    if (!d) cr_skip_test("no tests/data/jinja-crashes");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "tests/data/jinja-crashes/%s", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        char *buf = malloc(1 << 20);
        size_t n = fread(buf, 1, (1 << 20) - 1, f);
        fclose(f);
        buf[n] = 0;
        if (n < 1) { free(buf); continue; }
        struct toy_chat_template *t = NULL;
        struct toy_chat_vars v = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = true};
        char *out = NULL;
        enum toy_status st;
        if (buf[0] % 2 == 0) {
            st = toy_chat_template_init(buf + 1, &t);
            if (!st) st = toy_chat_template_render_json(t, conv, &v, &out);
        } else {
            MUST(toy_chat_template_init("chatml", &t));
            st = toy_chat_template_render_json(t, buf + 1, &v, &out);
        }
        if (st) cr_expect(strlen(toy_last_error()) > 0, "%s", path);
        free(out);
        toy_chat_template_free(t);
        free(buf);
    }
    closedir(d);
}

/* Jinja2 (keep_trailing_newline off, as in transformers) drops one "\n" at
 * the end of the source -- a .jinja file's last line end -- after reading
 * "\r\n" as "\n" (expected strings are Jinja2 3.1's). */
Test(chat_template, trailing_newline_of_source_is_dropped) {
    EXPECT_RENDER("{{ 'x' }}\n", "x");
    EXPECT_RENDER("{{ 'x' }}\n\n", "x\n");
    EXPECT_RENDER("a{{ 'b' }}c\n", "abc");
    EXPECT_RENDER("{% if true %}a{% endif %}b\r\n", "ab");
    EXPECT_RENDER("{{ 'x' -}}  z\n", "xz");
    EXPECT_RENDER("{{ 'a' }}\n{# c #}\n", "a\n");
    EXPECT_RENDER("{% raw %}r\n{% endraw %}\n", "r\n");
}

/* A macro takes extra positional arguments only when its body uses varargs
 * (a macro nested in it counts), unknown keywords -- or one naming a
 * parameter already given by position -- only when it uses kwargs, and a
 * {% call %} only when it uses caller; otherwise the call is an error, as
 * in Jinja2 3.1 (whose messages these are). A call block is a macro too. */
Test(chat_template, macro_arguments_are_checked) {
    EXPECT_RENDER("{% macro m(a, b=false, c='x') %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}"
                  "{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(1, 2, 3) }}{{ m(c=1, a=2) }}",
                  "[1|False|x][1|2|x][1|False|3][1|2|3][2|False|1]");
    EXPECT_RENDER("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, a=3, x=4) }}",
                  "1(2,){'a': 3, 'x': 4}");
    EXPECT_RENDER("{% macro m(a) %}{% macro n() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ a }}{% endmacro %}"
                  "{{ m(1, 2, z=3) }}",
                  "1");
    EXPECT_RENDER("{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(x) m() %}{{ x }}{{ varargs }}{% endcall %}",
                  "1(2,)");
    EXPECT_RENDER("{% macro m() %}{{ caller(1) }}{% endmacro %}{% call(x, y=5) m() %}{{ x }}{{ y }}{% endcall %}", "15");
    static const char *const bad[][2] = {
        {"{% macro m(a, b) %}{{ a }}{% endmacro %}{{ m(1, 2, 3) }}", "macro 'm' takes not more than 2 argument(s)"},
        {"{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}", "macro 'm' takes no keyword argument 'b'"},
        {"{% macro m(a, b) %}{{ a }}{% endmacro %}{{ m(1, c=3, d=4) }}", "macro 'm' takes no keyword argument 'c'"},
        {"{% macro m(a, b) %}{{ a }}{% endmacro %}{{ m(1, a=2) }}", "macro 'm' takes no keyword argument 'a'"},
        {"{% macro m() %}M{% endmacro %}{% call m() %}x{% endcall %}",
         "macro 'm' was invoked with two values for the special caller argument"},
        {"{% macro m() %}{{ caller(1, 2) }}{% endmacro %}{% call(x) m() %}{{ x }}{% endcall %}",
         "macro None takes not more than 1 argument(s)"},
        {"{% macro m() %}{{ caller(y=1) }}{% endmacro %}{% call(x) m() %}{{ x }}{% endcall %}",
         "macro None takes no keyword argument 'y'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_expect_eq(jinja_err(bad[i][0], NULL), TOY_ERR_FORMAT, "%s", bad[i][0]);
        cr_expect(strstr(toy_last_error(), bad[i][1]) != NULL, "%s: %s", bad[i][0], toy_last_error());
    }
}

/* strftime_now reads the clock, or SOURCE_DATE_EPOCH (UTC) when set, so a
 * prompt that shows the date (gpt-oss's "Current date:") can be pinned. */
Test(chat_template, strftime_now_honours_source_date_epoch) {
    setenv("SOURCE_DATE_EPOCH", "1754400000", 1);
    EXPECT_RENDER("{{ strftime_now('%Y-%m-%d %H:%M') }}|{{ strftime_now('%d %b %Y') }}", "2025-08-05 13:20|05 Aug 2025");
    unsetenv("SOURCE_DATE_EPOCH");
    char *got = jinja("{{ strftime_now('%Y-%m-%d')|length }}");
    cr_expect_str_eq(got, "10");
    free(got);
}

/* The constructs of tool-schema templates like gpt-oss's, together, in a
 * template of our own: a recursive macro with defaults, namespace()
 * attributes set in loops, is defined/iterable/string/mapping, dict.items(),
 * `in` on strings, lists and dicts, (x or []), a slice from loop.index,
 * tojson, join, length, + on strings, whitespace control and comments
 * (expected string is Jinja2 3.1's). */
Test(chat_template, schema_renderer_constructs) {
    const char *src =
        "{#- a schema-to-signature renderer of our own -#}\n"
        "{%- macro sig(s, depth=0, sep=\", \") -%}\n"
        "    {%- if s.type is defined and s.type is iterable and s.type is not string and s.type is not mapping -%}\n"
        "        {{- s.type|join(\"|\") -}}\n"
        "    {%- elif s.type == \"object\" and s.fields -%}\n"
        "        {{- \"(\" -}}\n"
        "        {%- for k, v in s.fields.items() -%}\n"
        "            {{- k + (\"\" if k in (s.need or []) else \"?\") + \":\" + sig(v, depth + 1) -}}\n"
        "            {%- if not loop.last %}{{ sep }}{% endif -%}\n"
        "        {%- endfor -%}\n"
        "        {{- \")\" -}}\n"
        "    {%- elif s.type == \"list\" -%}\n"
        "        {{- sig(s.of, depth + 1) + \"[]\" if \"of\" in s else \"any[]\" -}}\n"
        "    {%- else -%}\n"
        "        {{- s.type if s.type is defined else \"any\" -}}\n"
        "    {%- endif -%}\n"
        "{%- endmacro -%}\n"
        "{%- set st = namespace(calls=0, last=none) -%}\n"
        "{%- for m in messages -%}\n"
        "    {%- if m.tools is defined -%}\n"
        "        {%- for t in m.tools -%}\n"
        "            {{- t.name + sig(t.schema) + (\" = \" + t.default|tojson if t.default is defined else \"\") + \"\\n\" -}}\n"
        "        {%- endfor -%}\n"
        "    {%- endif -%}\n"
        "    {%- set later = namespace(user=false) -%}\n"
        "    {%- for f in messages[loop.index:] -%}\n"
        "        {%- if f.role == \"user\" -%}{%- set later.user = true -%}{%- endif -%}\n"
        "    {%- endfor -%}\n"
        "    {%- if \"call\" in m -%}\n"
        "        {%- set st.calls = st.calls + 1 -%}\n"
        "        {%- set st.last = m.call -%}\n"
        "    {%- endif -%}\n"
        "    {{- m.role + (\"*\" if later.user else \"\") + (\"!\" if \"x\" in m.role else \"\") + \" \" -}}\n"
        "{%- endfor -%}\n"
        "{{- \"|\" + st.calls|string + \":\" + st.last|tojson + \":\" + (messages|length)|string -}}\n";
    const char *msgs =
        "{\"messages\": [{\"role\": \"system\", \"tools\": [{\"name\": \"f\", \"schema\": {\"type\": \"object\", "
        "\"need\": [\"a\"], \"fields\": {\"a\": {\"type\": \"list\", \"of\": {\"type\": \"object\", \"fields\": "
        "{\"x\": {\"type\": \"number\"}, \"y\": {}}}}, \"b\": {\"type\": [\"string\", \"null\"]}, \"c\": {\"type\": "
        "\"list\"}}}, \"default\": {\"a\": [1.5, \"\\u00e9\"]}}, {\"name\": \"g\", \"schema\": {\"type\": "
        "\"object\"}}]}, {\"role\": \"user\"}, {\"role\": \"xassistant\", \"call\": \"f\"}, {\"role\": \"user\"}, "
        "{\"role\": \"assistant\", \"call\": {\"k\": [1, null]}}]}";
    char *got = render(src, msgs, false, "", "");
    cr_expect_str_eq(got, "f(a:(x?:number, y?:any)[], b?:string|null, c?:any[]) = {\"a\": [1.5, \"\u00e9\"]}\n"
                          "gobject\nsystem* user* xassistant*! user assistant |2:{\"k\": [1, null]}:5");
    free(got);
}
