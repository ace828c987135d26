/* chat-template.c: toy/chat-template.h: built-in templates by name, the
 * variables a chat template sees (messages, bos_token, eos_token,
 * add_generation_prompt, extras), and rendering with a tokenizer.
 *
 * The built-ins are the templates the models ship in their
 * tokenizer_config.json (Llama-2-chat, Llama-3-Instruct, Mistral-Instruct
 * v0.1, Gemma-it, SmolLM2-Instruct, Phi-3) and plain ChatML; the Jinja they
 * are written in is interpreted by jinja.c.
 */
#include "toy/chat-template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "toy/tokenizer.h"

struct toy_chat_template {
    struct jinja_template *jt;
};

static const struct {
    const char *name, *src;
} builtins[] = {
    {"chatml",
     "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"smollm2",
     "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
     "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
     "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"},
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
     "message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
     "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"},
    {"llama2",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
     "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
     "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
     "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"},
    {"mistral",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
     "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"},
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"},
    {"phi3",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\\n' + "
     "message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}{% elif (message['role'] == 'assistant') %}"
     "{{message['content'] + '<|end|>' + '\\n'}}{% endif %}{% endfor %}"},
};

const char *toy_chat_template_builtin(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return builtins[i].src;
    return NULL;
}

enum toy_status toy_chat_template_init(const char *source_or_name, struct toy_chat_template **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_chat_template_init: out is NULL");
    *out = NULL;
    if (!source_or_name) return toy_error(TOY_ERR_INVALID_ARG, "chat template: NULL source");
    const char *b = toy_chat_template_builtin(source_or_name);
    /* text without a single tag renders as itself and drops every message: a mistyped built-in name */
    if (!b && !strstr(source_or_name, "{{") && !strstr(source_or_name, "{%") && !strstr(source_or_name, "{#")) {
        char names[256] = "";
        for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", builtins[i].name);
        return toy_error(TOY_ERR_NOT_FOUND, "chat template '%.64s' is neither a built-in (%s) nor Jinja source (the "
                         "commands also take a file of it)", source_or_name, names);
    }
    struct toy_chat_template *t = calloc(1, sizeof *t);
    if (!t) return toy_error(TOY_ERR_NOMEM, "chat template: out of memory");
    enum toy_status st = toy_jinja_parse(b ? b : source_or_name, &t->jt);
    if (st) { free(t); return st; }
    *out = t;
    return TOY_OK;
}

void toy_chat_template_free(struct toy_chat_template *t) {
    if (!t) return;
    toy_jinja_free(t->jt);
    free(t);
}

static enum toy_status render(const struct toy_chat_template *t, json_t *messages /* stolen */, json_t *extra,
                              const struct toy_chat_vars *vars, char **out) {
    json_t *v = json_object();
    if (!v || !messages) {
        json_decref(v);
        json_decref(messages);
        return toy_error(TOY_ERR_NOMEM, "chat template: out of memory");
    }
    json_object_set_new(v, "bos_token", json_string(vars && vars->bos_token ? vars->bos_token : ""));
    json_object_set_new(v, "eos_token", json_string(vars && vars->eos_token ? vars->eos_token : ""));
    json_object_set_new(v, "add_generation_prompt", json_boolean(vars && vars->add_generation_prompt));
    /* transformers' apply_chat_template always passes tools and documents,
     * None when absent: templates test `tools is not none` and `tools is defined` */
    json_object_set_new(v, "tools", json_null());
    json_object_set_new(v, "documents", json_null());
    enum toy_status st = TOY_OK;
    if (vars && vars->extra_json) {
        json_error_t err;
        json_t *x = json_loads(vars->extra_json, JSON_ALLOW_NUL, &err);
        if (!x || !json_is_object(x)) st = toy_error(TOY_ERR_FORMAT, "chat template: extra variables: %s", x ? "not a JSON object" : err.text);
        else json_object_update(v, x);
        json_decref(x);
    }
    if (extra) json_object_update(v, extra);
    json_object_set_new(v, "messages", messages);
    if (!st) st = toy_jinja_render(t->jt, v, out);
    json_decref(v);
    return st;
}

enum toy_status toy_chat_template_render(const struct toy_chat_template *t, const struct toy_chat_message *msgs,
                                         size_t n_msgs, const struct toy_chat_vars *vars, char **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_chat_template_render: out is NULL");
    *out = NULL;
    json_t *m = json_array();
    for (size_t i = 0; m && i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            json_decref(m);
            return toy_error(TOY_ERR_INVALID_ARG, "chat template: message %zu has no role or content", i);
        }
        json_array_append_new(m, json_pack("{ssss}", "role", msgs[i].role, "content", msgs[i].content));
    }
    return render(t, m, NULL, vars, out);
}

enum toy_status toy_chat_template_render_json(const struct toy_chat_template *t, const char *json,
                                              const struct toy_chat_vars *vars, char **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_chat_template_render_json: out is NULL");
    *out = NULL;
    json_error_t err;
    /* "\u0000" is valid JSON (HF accepts it); the renderer reports it if it reaches the output */
    json_t *root = json_loads(json, JSON_ALLOW_NUL, &err);
    if (!root) return toy_error(TOY_ERR_FORMAT, "messages JSON: line %d: %s", err.line, err.text);
    json_t *msgs = NULL, *extra = NULL;
    if (json_is_array(root)) {
        msgs = json_incref(root);
    } else if (json_is_object(root) && json_is_array(json_object_get(root, "messages"))) {
        msgs = json_incref(json_object_get(root, "messages"));
        extra = json_copy(root);
        json_object_del(extra, "messages");
    } else {
        json_decref(root);
        return toy_error(TOY_ERR_FORMAT, "messages JSON: expected an array of messages or {\"messages\": [...]}");
    }
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role"))) {
            json_decref(msgs);
            json_decref(extra);
            json_decref(root);
            return toy_error(TOY_ERR_FORMAT, "messages JSON: message %zu is not an object with a \"role\"", i);
        }
    }
    enum toy_status st = render(t, msgs, extra, vars, out);
    json_decref(extra);
    json_decref(root);
    return st;
}

enum toy_status toy_tokenizer_apply_chat(const struct toy_tokenizer *tok, const char *name_or_source,
                                         const struct toy_chat_message *msgs, size_t n_msgs,
                                         bool add_generation_prompt, char **out) {
    if (!out) return toy_error(TOY_ERR_INVALID_ARG, "toy_tokenizer_apply_chat: out is NULL");
    *out = NULL;
    const char *src = name_or_source ? name_or_source : toy_tokenizer_chat_template(tok);
    if (!src) return toy_error(TOY_ERR_NOT_FOUND, "the tokenizer has no chat template; name one (chatml, llama3, ...)");
    struct toy_chat_template *t;
    enum toy_status st = toy_chat_template_init(src, &t);
    if (st) return st;
    struct toy_chat_vars v = {
        .bos_token = toy_tokenizer_bos(tok) >= 0 ? toy_tokenizer_piece(tok, toy_tokenizer_bos(tok)) : "",
        .eos_token = toy_tokenizer_eos(tok) >= 0 ? toy_tokenizer_piece(tok, toy_tokenizer_eos(tok)) : "",
        .add_generation_prompt = add_generation_prompt,
    };
    st = toy_chat_template_render(t, msgs, n_msgs, &v, out);
    toy_chat_template_free(t);
    return st;
}

unsigned toy_chat_encode_flags(const struct toy_tokenizer *tok, const char *text) {
    unsigned flags = TOY_ENCODE_PARSE_SPECIAL;
    int32_t b = toy_tokenizer_bos(tok);
    const char *piece = b >= 0 ? toy_tokenizer_piece(tok, b) : NULL;
    if (b >= 0 && toy_tokenizer_add_bos(tok) && !(piece && *piece && !strncmp(text, piece, strlen(piece))))
        flags |= TOY_ENCODE_ADD_BOS;
    return flags;
}

/* Byte offset in the rendered text where each token starts. Token bytes
 * concatenate to the text, except that SentencePiece inserts the dummy
 * prefix space at the start and after each special token (llama.cpp's rule,
 * which encode follows): those bytes are skipped. */
static void token_offsets(const struct toy_tokenizer *tok, const struct toy_tokens *ids, size_t *off) {
    bool spm = toy_tokenizer_kind(tok) != TOY_TOKENIZER_BPE;
    size_t j = 0;
    bool prev_special = true;
    for (int64_t i = 0; i < ids->n; i++) {
        size_t l;
        const char *b = toy_tokenizer_token_bytes(tok, ids->ids[i], &l);
        enum toy_token_type ty = toy_tokenizer_token_type(tok, ids->ids[i]);
        bool special = ty == TOY_TOKEN_CONTROL || ty == TOY_TOKEN_USER_DEFINED || ty == TOY_TOKEN_UNKNOWN;
        if (spm && prev_special && !special && l > 0 && b[0] == ' ' && ty != TOY_TOKEN_BYTE) l--;
        off[i] = j;
        j += l;
        prev_special = special;
    }
}

enum toy_status toy_chat_encode(const struct toy_tokenizer *tok, const char *name_or_source,
                                const struct toy_chat_message *msgs, size_t n_msgs, struct toy_tokens *ids,
                                unsigned char **mask) {
    if (!ids || !mask) return toy_error(TOY_ERR_INVALID_ARG, "toy_chat_encode: %s is NULL", ids ? "mask" : "ids");
    *mask = NULL;
    const char *src = name_or_source ? name_or_source : toy_tokenizer_chat_template(tok);
    if (!src) return toy_error(TOY_ERR_NOT_FOUND, "the tokenizer has no chat template; name one (chatml, llama3, ...)");
    struct toy_chat_template *t;
    enum toy_status st = toy_chat_template_init(src, &t);
    if (st) return st;
    struct toy_chat_vars v = {
        .bos_token = toy_tokenizer_bos(tok) >= 0 ? toy_tokenizer_piece(tok, toy_tokenizer_bos(tok)) : "",
        .eos_token = toy_tokenizer_eos(tok) >= 0 ? toy_tokenizer_piece(tok, toy_tokenizer_eos(tok)) : "",
    };
    char *full = NULL, *a = NULL, *b = NULL;
    size_t *regions = calloc(2 * (n_msgs + 1), sizeof *regions), nreg = 0;
    size_t *off = NULL;
    int64_t first = ids->n;
    if (!regions) { st = toy_error(TOY_ERR_NOMEM, "chat: out of memory"); goto done; }
    if ((st = toy_chat_template_render(t, msgs, n_msgs, &v, &full))) goto done;
    size_t flen = strlen(full);
    for (size_t i = 0; i < n_msgs; i++) {
        if (strcmp(msgs[i].role, "assistant")) continue;
        v.add_generation_prompt = true;
        if ((st = toy_chat_template_render(t, msgs, i, &v, &a))) goto done;
        v.add_generation_prompt = false;
        if ((st = toy_chat_template_render(t, msgs, i + 1, &v, &b))) goto done;
        size_t la = strlen(a), lb = strlen(b);
        if (la > lb || memcmp(a, b, la) || lb > flen || memcmp(b, full, lb)) {
            st = toy_error(TOY_ERR_UNSUPPORTED, "chat: the template's rendering of message %zu does not extend the "
                           "earlier ones, so the assistant turns cannot be located", i);
            goto done;
        }
        regions[2 * nreg] = la;
        regions[2 * nreg + 1] = lb;
        nreg++;
        free(a);
        free(b);
        a = b = NULL;
    }
    if ((st = toy_tokenizer_encode(tok, full, flen, TOY_ENCODE_PARSE_SPECIAL, ids))) goto done;
    int64_t n = ids->n - first;
    off = malloc((size_t)(n ? n : 1) * sizeof *off);
    *mask = calloc((size_t)(n ? n : 1), 1);
    if (!off || !*mask) { st = toy_error(TOY_ERR_NOMEM, "chat: out of memory"); goto done; }
    struct toy_tokens view = {n ? ids->ids + first : NULL, n, n}; /* ids->ids is NULL when nothing was ever encoded */
    token_offsets(tok, &view, off);
    for (int64_t k = 0; k < n; k++)
        for (size_t r = 0; r < nreg; r++)
            if (off[k] >= regions[2 * r] && off[k] < regions[2 * r + 1]) (*mask)[k] = 1;
done:
    if (st) { free(*mask); *mask = NULL; }
    free(off);
    free(full);
    free(a);
    free(b);
    free(regions);
    toy_chat_template_free(t);
    return st;
}
