/* test-chat-reply.c: replies of each family split into reasoning, content
 * and tool calls (toy/chat-reply.h): the whole reply against the split
 * written out by hand from the family's format; every byte-prefix of it,
 * parsed as a streaming reply, a prefix of that split (what makes the
 * stream's deltas add up to the answer); malformed and cut-off calls kept
 * as content; and the family found from template markers.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/chat-reply.h"

#define MUST(call) cr_assert_eq((call), TOY_OK, "%s: %s", #call, toy_last_error())

#define DS(x) "<\xef\xbd\x9c" x "\xef\xbd\x9c>" /* DeepSeek's <｜...｜> */
#define U "\xe2\x96\x81"                          /* ▁ */

static const char *const weather[] = {"get_weather", "get_time"};

struct want {
    const char *reasoning, *content;
    const char *calls[4][2]; /* name, arguments (compact JSON) */
};

struct sample {
    const char *what;
    struct toy_chat_syntax syn;
    const char *text;
    struct want want;
};

#define SYN(f, ...) {.format = TOY_CHAT_FORMAT_##f, .tool_names = weather, .n_tool_names = 2, __VA_ARGS__}

static const struct sample samples[] = {
    {"qwen3 think + call", SYN(HERMES, .think = true, .tools = true),
     "<think>\nThe user wants Paris weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": \"get_weather\", "
     "\"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
     {"The user wants Paris weather.", "Let me check.", {{"get_weather", "{\"city\":\"Paris\",\"days\":2}"}}}},
    {"qwen two calls", SYN(HERMES, .tools = true),
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}\n</tool_call>",
     {"", "", {{"get_weather", "{\"city\":\"Oslo\"}"}, {"get_time", "{\"tz\":\"CET\"}"}}}},
    {"hermes bad JSON kept", SYN(HERMES, .tools = true),
     "Sure. <tool_call>{\"name\": get_weather}</tool_call> done",
     {"", "Sure. <tool_call>{\"name\": get_weather}</tool_call> done", {{0}}}},
    {"hermes cut off before the name", SYN(HERMES, .tools = true), "Checking <tool_call>\n{\"name\": \"get_wea",
     {"", "Checking <tool_call>\n{\"name\": \"get_wea", {{0}}}},
    {"hermes cut off after the name", SYN(HERMES, .tools = true), "Checking <tool_call>\n{\"name\": \"get_weather\", \"argu",
     {"", "Checking", {{"get_weather", "{}"}}}},
    {"hermes cut off in the arguments", SYN(HERMES, .tools = true),
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa ris\", \"da",
     {"", "", {{"get_weather", "{\"city\":\"Pa ris\",\"da"}}}},
    {"hermes keys the other way round", SYN(HERMES, .tools = true),
     "<tool_call>{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}</tool_call>",
     {"", "", {{"get_weather", "{\"city\":\"Oslo\"}"}}}},
    {"hermes arguments as written", SYN(HERMES, .tools = true),
     "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"q\": \"a  \\\"b\\\" \\u00e9\", \"n\": 1.50, \"l\": [1, {}]}}"
     "</tool_call>",
     {"", "", {{"get_weather", "{\"q\":\"a  \\\"b\\\" \\u00e9\",\"n\":1.50,\"l\":[1,{}]}"}}}},
    {"hermes without tools", SYN(HERMES),
     "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>",
     {"", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>", {{0}}}},
    {"think only", SYN(CONTENT, .think = true), "  <think>a < b, so</think>  The answer is 4.\n",
     {"a < b, so", "The answer is 4.", {{0}}}},
    {"think unclosed", SYN(CONTENT, .think = true), "<think>still thinking about </th",
     {"still thinking about </th", "", {{0}}}},
    {"prompt opened think", SYN(CONTENT, .think = true, .in_think = true), "step 1\nstep 2\n</think>\n\n42",
     {"step 1\nstep 2", "42", {{0}}}},
    {"no think block", SYN(CONTENT, .think = true), "Just an answer with <think> later",
     {"", "Just an answer with <think> later", {{0}}}},
    {"llama3 bare call", SYN(LLAMA3, .tools = true),
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
     {"", "", {{"get_weather", "{\"city\":\"Rome\"}"}}}},
    {"llama3 python_tag two calls", SYN(LLAMA3, .tools = true),
     "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": "
     "{\"city\": \"Lima\"}}",
     {"", "", {{"get_time", "{}"}, {"get_weather", "{\"city\":\"Lima\"}"}}}},
    {"llama3 JSON that is not a call", SYN(LLAMA3, .tools = true), "{\"name\": \"Bob\", \"parameters\": {}}",
     {"", "{\"name\": \"Bob\", \"parameters\": {}}", {{0}}}},
    {"llama3 prose", SYN(LLAMA3, .tools = true), "It is sunny in {city}.", {"", "It is sunny in {city}.", {{0}}}},
    {"mistral v3", SYN(MISTRAL, .tools = true),
     "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Nice\"}, \"id\": \"abc123def\"}]",
     {"", "", {{"get_weather", "{\"city\":\"Nice\"}"}}}},
    {"mistral v11", SYN(MISTRAL, .tools = true),
     "Looking.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Bern\"}[TOOL_CALLS]get_time[CALL_ID]x1[ARGS]{}",
     {"", "Looking.", {{"get_weather", "{\"city\":\"Bern\"}"}, {"get_time", "{}"}}}},
    {"mistral broken", SYN(MISTRAL, .tools = true), "[TOOL_CALLS][{\"name\": ",
     {"", "[TOOL_CALLS][{\"name\":", {{0}}}},
    {"mistral v11 cut off", SYN(MISTRAL, .tools = true), "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Be",
     {"", "", {{"get_weather", "{\"city\":\"Be"}}}},
    {"mistral v3 then words", SYN(MISTRAL, .tools = true),
     "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}] and more",
     {"", "and more", {{"get_time", "{}"}}}},
    {"llama3 cut off", SYN(LLAMA3, .tools = true), "{\"name\": \"get_weather\", \"parameters\": {\"city\": ",
     {"", "", {{"get_weather", "{\"city\":"}}}},
    {"llama3 call then junk", SYN(LLAMA3, .tools = true),
     "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}} oops",
     {"", "oops", {{"get_time", "{}"}}}},
    {"deepseek v3", SYN(DEEPSEEK, .think = true, .tools = true),
     "<think>need weather</think>" DS("tool" U "calls" U "begin") DS("tool" U "call" U "begin") "function" DS(
         "tool" U "sep") "get_weather\n```json\n{\"city\": \"Kyiv\"}\n```" DS("tool" U "call" U "end") DS(
         "tool" U "calls" U "end"),
     {"need weather", "", {{"get_weather", "{\"city\":\"Kyiv\"}"}}}},
    {"deepseek v3 cut off", SYN(DEEPSEEK, .tools = true),
     DS("tool" U "calls" U "begin") DS("tool" U "call" U "begin") "function" DS("tool" U "sep") "get_time\n```json\n{\"tz\"",
     {"", "", {{"get_time", "{\"tz\""}}}},
    {"deepseek v3.1", SYN(DEEPSEEK, .tools = true),
     "On it." DS("tool" U "calls" U "begin") DS("tool" U "call" U "begin") "get_time" DS("tool" U "sep") "{}" DS(
         "tool" U "call" U "end") DS("tool" U "calls" U "end"),
     {"", "On it.", {{"get_time", "{}"}}}},
    {"harmony final", SYN(HARMONY),
     "<|channel|>analysis<|message|>User says hi. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello! "
     "How can I help?",
     {"User says hi. Reply.", "Hello! How can I help?", {{0}}}},
    {"harmony call", SYN(HARMONY, .tools = true),
     "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Tokyo\"}",
     {"Need the weather.", "", {{"get_weather", "{\"city\":\"Tokyo\"}"}}}},
    {"harmony recipient in the header", SYN(HARMONY, .tools = true),
     "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|>"
     "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>",
     {"a\nb", "", {{"get_time", "{}"}}}},
    {"harmony preamble", SYN(HARMONY, .tools = true),
     "<|channel|>commentary<|message|>Checking two cities.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"A\"}<|call|>",
     {"", "Checking two cities.", {{"get_weather", "{\"city\":\"A\"}"}}}},
    {"harmony not followed", SYN(HARMONY), "plain words", {"", "plain words", {{0}}}},
    {"harmony cut off", SYN(HARMONY, .tools = true),
     "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Lo",
     {"", "", {{"get_weather", "{\"city\":\"Lo"}}}},
};

static void check_reply(const struct toy_chat_reply *r, const struct want *w, const char *what) {
    cr_assert_str_eq(r->reasoning, w->reasoning, "%s: reasoning", what);
    cr_assert_str_eq(r->content, w->content, "%s: content", what);
    size_t n = 0;
    while (n < 4 && w->calls[n][0]) n++;
    cr_assert_eq(r->n_calls, n, "%s: %zu calls, want %zu", what, r->n_calls, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(r->calls[i].name, w->calls[i][0], "%s: call %zu", what, i);
        cr_assert_str_eq(r->calls[i].arguments, w->calls[i][1], "%s: call %zu", what, i);
    }
}

Test(chat_reply, each_family_splits_as_written) {
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++) {
        const struct sample *s = &samples[i];
        struct toy_chat_reply r;
        MUST(toy_chat_reply_parse(&s->syn, s->text, strlen(s->text), false, &r));
        check_reply(&r, &s->want, s->what);
        toy_chat_reply_free(&r);
    }
}

static bool is_prefix(const char *a, const char *b) { return !strncmp(a, b, strlen(a)); }

/* a call of a partial parse against the same call later: the same name; the arguments the same once it is
 * closed, else a prefix */
static void same_call(const struct toy_chat_call *a, const struct toy_chat_call *b, const char *what, size_t k) {
    cr_assert_str_eq(a->name, b->name, "%s at %zu", what, k);
    if (a->open) cr_assert(is_prefix(a->arguments, b->arguments), "%s at %zu: arguments '%s' then '%s'", what, k,
                           a->arguments, b->arguments);
    else cr_assert_str_eq(a->arguments, b->arguments, "%s at %zu", what, k);
}

/* Each byte-prefix of text[0..n), parsed as a streaming reply, is a prefix of the whole parse, field by field
 * (an open call's arguments a prefix of the whole call's), and the prefixes grow monotonically; so the deltas a
 * stream sends add up to the whole answer. */
static void check_streaming(const struct toy_chat_syntax *syn, const char *text, size_t n, const char *what) {
    struct toy_chat_reply whole, prev = {0};
    MUST(toy_chat_reply_parse(syn, text, n, false, &whole));
    for (size_t c = 0; c < whole.n_calls; c++) cr_assert(!whole.calls[c].open, "%s: a final call is closed", what);
    for (size_t k = 0; k <= n; k++) {
        struct toy_chat_reply r;
        MUST(toy_chat_reply_parse(syn, text, k, true, &r));
        cr_assert(is_prefix(r.reasoning, whole.reasoning), "%s at %zu: reasoning '%s' vs '%s'", what, k, r.reasoning,
                  whole.reasoning);
        cr_assert(is_prefix(r.content, whole.content), "%s at %zu: content '%s' vs '%s'", what, k, r.content,
                  whole.content);
        cr_assert_leq(r.n_calls, whole.n_calls, "%s at %zu", what, k);
        for (size_t c = 0; c < r.n_calls; c++) {
            same_call(&r.calls[c], &whole.calls[c], what, k);
            cr_assert(!r.calls[c].open || c == r.n_calls - 1, "%s at %zu: only the last call is open", what, k);
        }
        if (k > 0) {
            cr_assert(is_prefix(prev.reasoning, r.reasoning) && is_prefix(prev.content, r.content) &&
                          prev.n_calls <= r.n_calls, "%s at %zu: shrank", what, k);
            for (size_t c = 0; c < prev.n_calls; c++) same_call(&prev.calls[c], &r.calls[c], what, k);
        }
        toy_chat_reply_free(&prev);
        prev = r;
    }
    toy_chat_reply_free(&prev);
    toy_chat_reply_free(&whole);
}

Test(chat_reply, a_streaming_parse_only_ever_extends) {
    for (size_t i = 0; i < sizeof samples / sizeof samples[0]; i++)
        check_streaming(&samples[i].syn, samples[i].text, strlen(samples[i].text), samples[i].what);
}

/* inputs fuzz/fuzz-chat-reply.c found (fuzz/run.sh keeps them here): first byte the family and flags */
Test(chat_reply, fuzzer_finds_replay) {
    DIR *d = opendir("tests/data/chat-reply-crashes");
    if (!d) cr_skip_test("no tests/data/chat-reply-crashes");
    static const char *const names[] = {"get_weather", "f"};
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[512], buf[65536];
        snprintf(path, sizeof path, "tests/data/chat-reply-crashes/%s", e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (n < 1) continue;
        struct toy_chat_syntax syn = {.format = (enum toy_chat_format)((unsigned char)buf[0] % 6),
                                      .think = buf[0] >> 3 & 1, .in_think = buf[0] >> 4 & 1,
                                      .tools = buf[0] >> 5 & 1, .tool_names = names, .n_tool_names = 2};
        check_streaming(&syn, buf + 1, n - 1, path);
    }
    closedir(d);
}

/* What streams before the end: reasoning and content as they come, a call once its name is read */
Test(chat_reply, streaming_sends_text_early_and_calls_as_written) {
    struct toy_chat_syntax syn = SYN(HERMES, .think = true, .tools = true);
    const char *t = "<think>Plan: call it</think>Calling now <tool_call>{\"name\": \"get_time\", \"arguments\": {}}";
    struct toy_chat_reply r;
    MUST(toy_chat_reply_parse(&syn, t, strlen("<think>Plan: ca"), true, &r));
    cr_assert_str_eq(r.reasoning, "Plan: ca");
    toy_chat_reply_free(&r);
    MUST(toy_chat_reply_parse(&syn, t, strlen(t) - strlen("\"get_time\", \"arguments\": {}}"), true, &r));
    cr_assert_str_eq(r.content, "Calling now");
    cr_assert_eq(r.n_calls, 0, "a call before its name is read is held back");
    toy_chat_reply_free(&r);
    MUST(toy_chat_reply_parse(&syn, t, strlen(t) - strlen(", \"arguments\": {}}"), true, &r));
    cr_assert_eq(r.n_calls, 1, "a call counts once its name is read");
    cr_assert(r.calls[0].open);
    cr_assert_str_eq(r.calls[0].name, "get_time");
    cr_assert_str_eq(r.calls[0].arguments, "");
    toy_chat_reply_free(&r);
    MUST(toy_chat_reply_parse(&syn, t, strlen(t), true, &r));
    cr_assert_str_eq(r.content, "Calling now");
    cr_assert_eq(r.n_calls, 1);
    cr_assert(r.calls[0].open, "open until </tool_call>");
    cr_assert_str_eq(r.calls[0].arguments, "{}");
    toy_chat_reply_free(&r);
    MUST(toy_chat_reply_parse(&syn, "Calling <tool_c", 15, true, &r));
    cr_assert_str_eq(r.content, "Calling", "a marker's start is held back");
    toy_chat_reply_free(&r);
    struct toy_chat_syntax h = SYN(HARMONY);
    const char *g = "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>fin";
    MUST(toy_chat_reply_parse(&h, g, strlen(g), true, &r));
    cr_assert_str_eq(r.reasoning, "thinking");
    cr_assert_str_eq(r.content, "", "a header still coming shows nothing");
    toy_chat_reply_free(&r);
}

Test(chat_reply, the_family_comes_from_the_template) {
    struct {
        const char *src;
        enum toy_chat_format f;
        bool think;
    } cases[] = {
        {"{{ '<|im_start|>' + m.role }}", TOY_CHAT_FORMAT_CONTENT, false},
        {"{% if tools %}<tool_call>{{ t | tojson }}</tool_call>{% endif %}<think>", TOY_CHAT_FORMAT_HERMES, true},
        {"{{ '<|start_header_id|>ipython' }}{{ '<|python_tag|>' }}", TOY_CHAT_FORMAT_LLAMA3, false},
        {"<|start_header_id|>user Respond as {\"name\": fn, \"parameters\": args}", TOY_CHAT_FORMAT_LLAMA3, false},
        {"[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", TOY_CHAT_FORMAT_MISTRAL, false},
        {DS("Assistant") "</think>" DS("tool" U "call" U "begin"), TOY_CHAT_FORMAT_DEEPSEEK, true},
        {"<|start|>assistant<|channel|>final<|message|>", TOY_CHAT_FORMAT_HARMONY, false},
        {NULL, TOY_CHAT_FORMAT_CONTENT, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct toy_chat_syntax s = toy_chat_syntax_detect(cases[i].src);
        cr_assert_eq(s.format, cases[i].f, "case %zu: %s", i, toy_chat_format_name(s.format));
        cr_assert_eq(s.think, cases[i].think, "case %zu", i);
    }
    struct toy_chat_syntax h = {.format = TOY_CHAT_FORMAT_HARMONY}, c = {0};
    cr_assert(toy_chat_syntax_keeps_special(&h));
    cr_assert(!toy_chat_syntax_keeps_special(&c));
    cr_assert(toy_chat_prompt_in_think("<|im_start|>assistant\n<think>\n"));
    cr_assert(!toy_chat_prompt_in_think("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
    cr_assert(!toy_chat_prompt_in_think(NULL));
}
