/* fuzz-jinja.c: libFuzzer harness for the chat-template engine
 * (src/tokenizer/jinja-parse.c, jinja.c, chat-template.c). Templates come
 * from untrusted GGUF files and tokenizer_config.json, messages from `toy
 * serve` clients, so both sides are fuzzed. The first input byte picks:
 *   even  the rest is a template, parsed and rendered for a fixed small
 *         conversation (with tools as extra variables)
 *   odd   the rest is the messages JSON (an array of messages or an object
 *         with "messages", "tools", ...) rendered by a fixed template
 *         (byte >> 1 picks it: the built-ins and a tool-calling one)
 * A render may fail, but must not crash, hang (run with -timeout) or grow
 * memory without bound (-rss_limit_mb / -malloc_limit_mb). Build: make -f
 * fuzz/Makefile; bounded run: fuzz/run.sh SECONDS. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toy/chat-template.h"

static const char *const builtins[] = {"chatml", "llama3", "llama2", "mistral", "gemma", "smollm2", "phi3"};

/* a template that walks every kind of value a client can send */
static const char tools_tmpl[] =
    "{%- if tools %}{{ '<tools>' }}{% for t in tools %}{{ t | tojson(indent=2) }}{% endfor %}{% endif %}"
    "{%- for m in messages %}{{ '<|' ~ m.role ~ '|>' }}"
    "{%- if m.content is string %}{{ m.content | trim }}"
    "{%- elif m.content is iterable %}{% for c in m.content %}{{ c.text if c.text is defined else c | string }}{% endfor %}"
    "{%- endif %}"
    "{%- for tc in m.tool_calls | default([]) %}{{ tc.function.name }}({{ tc.function.arguments | tojson }}){% endfor %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

static struct toy_chat_template *fixed[8];

static const char msgs_json[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"hi\"},"
    "{\"role\":\"assistant\",\"content\":\"yo\",\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"more\"}]}]";

static void init(void) {
    for (int i = 0; i < 7; i++)
        if (toy_chat_template_init(builtins[i], &fixed[i])) abort();
    if (toy_chat_template_init(tools_tmpl, &fixed[7])) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fixed[0]) init();
    if (size < 1) return 0;
    char *s = malloc(size);
    if (!s) return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = 0;
    struct toy_chat_vars v = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = true};
    char *out = NULL;
    if (data[0] % 2 == 0) {
        struct toy_chat_template *t;
        if (!toy_chat_template_init(s, &t)) {
            v.extra_json = "{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
                           "\"date_string\":\"1 Jan 2026\"}";
            if (!toy_chat_template_render_json(t, msgs_json, &v, &out)) free(out);
            toy_chat_template_free(t);
        }
    } else {
        v.add_generation_prompt = data[0] & 2;
        if (!toy_chat_template_render_json(fixed[(data[0] >> 1) % 8], s, &v, &out)) free(out);
    }
    free(s);
    return 0;
}
