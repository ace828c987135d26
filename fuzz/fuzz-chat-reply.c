/* fuzz-chat-reply.c: libFuzzer harness for the reply splitter
 * (src/tokenizer/chat-reply.c), which reads whatever a model writes. The
 * first input byte picks the family (low 3 bits) and the flags think,
 * in_think and tools; the rest is the reply. Besides not crashing, it
 * checks the promise a stream relies on: the reply's parse at each of up
 * to 64 cut points, as a partial reply, is a prefix of the whole reply's
 * parse, field by field (an open call's arguments a prefix of the whole
 * call's; abort otherwise). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "toy/chat-reply.h"

static const char *const names[] = {"get_weather", "f"};

static int prefix(const char *a, const char *b) { return !strncmp(a, b, strlen(a)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    struct toy_chat_syntax s = {.format = (enum toy_chat_format)(data[0] % 6), .think = data[0] >> 3 & 1,
                                .in_think = data[0] >> 4 & 1, .tools = data[0] >> 5 & 1, .tool_names = names,
                                .n_tool_names = 2};
    const char *t = (const char *)data + 1;
    size_t n = size - 1;
    struct toy_chat_reply whole;
    if (toy_chat_reply_parse(&s, t, n, false, &whole)) return 0;
    size_t step = n / 64 + 1;
    for (size_t k = 0; k <= n; k += step) {
        struct toy_chat_reply r;
        if (toy_chat_reply_parse(&s, t, k, true, &r)) break;
        if (!prefix(r.reasoning, whole.reasoning) || !prefix(r.content, whole.content) || r.n_calls > whole.n_calls)
            abort();
        for (size_t c = 0; c < r.n_calls; c++) /* an open call's arguments so far, a closed one's all */
            if (strcmp(r.calls[c].name, whole.calls[c].name) || whole.calls[c].open ||
                (r.calls[c].open ? !prefix(r.calls[c].arguments, whole.calls[c].arguments)
                                 : strcmp(r.calls[c].arguments, whole.calls[c].arguments)))
                abort();
        toy_chat_reply_free(&r);
    }
    toy_chat_reply_free(&whole);
    return 0;
}
