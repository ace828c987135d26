/* toy/chat-reply.h: a chat model's reply split the way OpenAI's API returns
 * it: the reasoning (its thinking), the content (what the user reads), and
 * the tool calls. A model family writes these with its own markers, which
 * its chat template shows; toy_chat_syntax_detect reads the template source
 * and names the family:
 *
 *   <think>...</think>          reasoning (Qwen3, QwQ, DeepSeek-R1, ...)
 *   <tool_call>{json}</tool_call>             Hermes and Qwen 2.5/3
 *   {"name": ..., "parameters": {...}}         Llama 3.1-3.3 (or after <|python_tag|>)
 *   [TOOL_CALLS][{...}] / [TOOL_CALLS]name[ARGS]{...}   Mistral
 *   <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>              DeepSeek V3 / R1 / V3.1
 *   <|channel|>analysis / final, to=functions.x          gpt-oss (harmony)
 *
 * The markers of the Llama 3, Mistral, DeepSeek and gpt-oss forms are
 * special tokens: decode the reply with them kept
 * (toy_chat_syntax_keeps_special) and the parser drops them.
 *
 * Parsing a growing reply (partial = true, while it streams) gives results
 * that each extend the one before, and the final parse extends them all:
 * text that may yet turn out to be a marker and trailing whitespace are
 * held back until they are known. A tool call counts from when its name
 * has been read: from then on it is a call (open while the reply may add
 * to it), and its arguments grow as the model writes them, so a stream
 * can send them piece by piece. Once taken, a call stays one: cut off at
 * the end (the length ran out) or with arguments that turn out broken, it
 * keeps what the model wrote, as OpenAI's API returns such a call. Text
 * that never became a call (a tool call marker not followed by a call
 * object with a name) stays in the content as the model wrote it.
 */
#ifndef TOY_CHAT_REPLY_H
#define TOY_CHAT_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

enum toy_chat_format {
    TOY_CHAT_FORMAT_CONTENT = 0, /* no tool-call syntax: everything (but reasoning) is content */
    TOY_CHAT_FORMAT_HERMES,
    TOY_CHAT_FORMAT_LLAMA3,
    TOY_CHAT_FORMAT_MISTRAL,
    TOY_CHAT_FORMAT_DEEPSEEK,
    TOY_CHAT_FORMAT_HARMONY,
};

struct toy_chat_syntax {
    enum toy_chat_format format;
    bool think;      /* a leading <think>...</think> is reasoning */
    bool in_think;   /* the prompt ends inside <think>: the reply starts as reasoning */
    bool tools;      /* tool calls are parsed (the request offered tools); else they are content */
    bool fenced;     /* DeepSeek V3 / R1: function<sep>name, the arguments in a ```json fence (V3.1: name<sep>{...}) */
    const char *const *tool_names; /* Llama 3's bare JSON counts as a call only when it names one of these */
    size_t n_tool_names;
};

/* The family a chat template's markers show (format and think; the rest 0). */
struct toy_chat_syntax toy_chat_syntax_detect(const char *template_source);
/* "content", "hermes", "llama3", "mistral", "deepseek", "harmony" */
const char *toy_chat_format_name(enum toy_chat_format f);
/* Whether the reply must be decoded with special tokens kept for this format. */
bool toy_chat_syntax_keeps_special(const struct toy_chat_syntax *s);
/* Whether a rendered prompt ends inside an open <think> (for in_think). */
bool toy_chat_prompt_in_think(const char *prompt);
/* The end-of-turn texts the template writes (<|im_end|>, <|eot_id|>,
 * <end_of_turn>, <|end|>; not gpt-oss's <|end|>, which ends a message of
 * the reply): stop strings for tokenizers that spell them as plain text.
 * Fills out (static strings) and returns how many (at most 4). */
int toy_chat_stop_texts(const struct toy_chat_syntax *s, const char *template_source, const char *out[4]);

/* The fixed texts a call is written between in this family, for forcing
 * one (prefix and suffix, malloc'd). Hermes, Llama 3 and Mistral write
 * the name in the JSON: {"name", "arguments"} (Llama 3: "parameters";
 * Mistral: in an array) goes between them, and name is not used.
 * DeepSeek and gpt-oss write the name in the markers: the arguments go
 * between them. False for a family without tool calls (or no memory). */
bool toy_chat_call_frame(const struct toy_chat_syntax *s, const char *name, char **prefix, char **suffix);

struct toy_chat_call {
    char *name;      /* the function's name */
    /* its arguments, JSON text (an object): as the model wrote them, less
     * the blanks between JSON tokens (strings as written) */
    char *arguments;
    bool open;       /* partial parse: the call is still being written (arguments so far) */
};

struct toy_chat_reply {
    char *reasoning; /* malloc'd, NUL-terminated; "" when none */
    char *content;
    struct toy_chat_call *calls;
    size_t n_calls;
};

/* Splits text[0..n) (the reply so far when partial). TOY_ERR_NOMEM only. */
enum toy_status toy_chat_reply_parse(const struct toy_chat_syntax *s, const char *text, size_t n, bool partial,
                                     struct toy_chat_reply *out);
void toy_chat_reply_free(struct toy_chat_reply *r);

#ifdef __cplusplus
}
#endif
#endif
