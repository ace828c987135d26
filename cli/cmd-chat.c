/* cmd-chat.c: `toy chat`: a conversation with a Llama-family GGUF in the
 * terminal. Each line read is a user message; the conversation is rendered
 * with the model's chat template (as `toy serve` does), prefilled, and the
 * reply streamed as it is sampled: its content, and its reasoning when
 * asked (dim on a terminal), split as chat-reply.h splits it. When the
 * conversation outgrows the context, its oldest turns (after the system
 * message) are dropped. Lines "/reset" and "/exit" do what they say;
 * Ctrl-C ends the reply being written, a second one the chat.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "flags.h"
#include "generate-gpt2.h"
#include "paths.h"
#include "stop-signals.h"
#include "toy/chat-reply.h"
#include "toy/chat-template.h"
#include "toy/generate.h"
#include "toy/llama.h"
#include "toy/models.h"
#include "toy/tokenizer.h"

static int usage_to(FILE *out) {
    fprintf(out,
            "usage: toy chat -m MODEL.gguf [--system TEXT] [--chat-template NAME|FILE|JINJA] [--show-reasoning]\n"
            "                [--temp 0.7] [--top-k 40] [--top-p 0.95] [--min-p 0.05] [--repeat-penalty 1] [--seed 42]\n"
            "                [-n 2048] [--ctx N] [--threads N] [--kv-type f16|f32] [--lookup N]\n"
            "                [--draft DRAFT.gguf [--draft-max 8] [--draft-p-min 0.75]]\n"
            "Reads one user message a line from standard input and writes each reply as it comes (-n: at\n"
            "most that many tokens a reply). The model's chat template (else --chat-template, else ChatML)\n"
            "renders the conversation; its oldest turns go when it outgrows the context. --show-reasoning\n"
            "also writes the model's thinking (<think>, gpt-oss's analysis), dim on a terminal. Lines\n"
            "\"/reset\" (a new conversation) and \"/exit\"; Ctrl-C ends the reply, a second one the chat.\n"
            "--lookup N: drafts of up to N tokens copied from the conversation, checked in one pass;\n"
            "--draft: drafts a smaller model of the same vocabulary writes (toy generate --help).\n");
    return 2;
}

struct chat {
    const struct toy_chat_syntax *syn;
    bool show_reasoning, tty;
    char *text;              /* the reply so far */
    size_t len, cap;
    size_t sent_r, sent_c, sent_calls;
    bool in_reasoning;       /* the terminal is writing dim reasoning */
};

/* writes what the reply's parse adds to what was written */
static void show(struct chat *c, bool final) {
    struct toy_chat_reply r;
    if (toy_chat_reply_parse(c->syn, c->text, c->len, !final, &r)) return;
    size_t nr = strlen(r.reasoning), nc = strlen(r.content);
    if (c->show_reasoning && nr > c->sent_r) {
        if (!c->in_reasoning && c->tty) fputs("\033[2m", stdout);
        c->in_reasoning = true;
        fwrite(r.reasoning + c->sent_r, 1, nr - c->sent_r, stdout);
        c->sent_r = nr;
    }
    if (nc > c->sent_c || r.n_calls > c->sent_calls) {
        if (c->in_reasoning) fputs(c->tty ? "\033[0m\n\n" : "\n\n", stdout);
        c->in_reasoning = false;
    }
    if (nc > c->sent_c) {
        fwrite(r.content + c->sent_c, 1, nc - c->sent_c, stdout);
        c->sent_c = nc;
    }
    for (; c->sent_calls < r.n_calls; c->sent_calls++)
        printf("%s[tool call] %s(%s)\n", c->sent_c || c->sent_calls ? "\n" : "", r.calls[c->sent_calls].name,
               r.calls[c->sent_calls].arguments);
    if (final && c->in_reasoning && c->tty) fputs("\033[0m", stdout);
    fflush(stdout);
    toy_chat_reply_free(&r);
}

static bool on_token(void *ud, int32_t id, const char *text, size_t len, float lp) {
    struct chat *c = ud;
    (void)id, (void)lp;
    if (c->len + len + 1 > c->cap) {
        size_t cap = (c->len + len + 1) * 2;
        char *t = realloc(c->text, cap);
        if (!t) return false;
        c->text = t, c->cap = cap;
    }
    memcpy(c->text + c->len, text, len);
    c->len += len;
    c->text[c->len] = 0;
    show(c, false);
    return !toy_cli_stop;
}

/* the conversation rendered and encoded (BOS as the model wants it, unless the template writes it) */
static enum toy_status encode_chat(const struct toy_chat_template *t, const struct toy_tokenizer *tok, json_t *msgs,
                                   struct toy_tokens *ids, bool *in_think) {
    int32_t b = toy_tokenizer_bos(tok), e = toy_tokenizer_eos(tok);
    struct toy_chat_vars v = {.bos_token = b >= 0 ? toy_tokenizer_piece(tok, b) : "",
                              .eos_token = e >= 0 ? toy_tokenizer_piece(tok, e) : "", .add_generation_prompt = true};
    char *js = json_dumps(msgs, JSON_COMPACT), *text = NULL;
    enum toy_status st = js ? toy_chat_template_render_json(t, js, &v, &text) : toy_error(TOY_ERR_NOMEM, "chat");
    free(js);
    if (st) return st;
    *in_think = toy_chat_prompt_in_think(text);
    toy_tokens_free(ids);
    st = toy_tokenizer_encode(tok, text, strlen(text), toy_chat_encode_flags(tok, text), ids);
    free(text);
    return st;
}

int toy_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system_msg = NULL, *tmpl_arg = NULL, *kv_name = NULL, *draft = NULL;
    int threads = 0;
    int64_t n_ctx = 0;
    bool show_reasoning = false;
    struct toy_generate_params gp = {.n_predict = 2048,
                                     .sampling = {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                                  .seed = 42},
                                     .draft_max = TOY_GENERATE_DRAFT_MAX, .draft_p_min = 0.75f};
    struct toy_sampler_params *sp = &gp.sampling;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("--system", &system_msg),
        TOY_FLAG_S("--chat-template", &tmpl_arg), TOY_FLAG_B("--show-reasoning", &show_reasoning),
        TOY_FLAG_S("--kv-type", &kv_name), TOY_FLAG_N("-n", TOY_CLI_I32, &gp.n_predict, 0, INT32_MAX),
        TOY_FLAG_N("--lookup", TOY_CLI_I32, &gp.lookup, 0, TOY_GENERATE_MAX_LOOKUP), TOY_FLAG_S("--draft", &draft),
        TOY_FLAG_N("--draft-max", TOY_CLI_I32, &gp.draft_max, 1, TOY_GENERATE_MAX_LOOKUP),
        TOY_FLAG_N("--draft-p-min", TOY_CLI_F32, &gp.draft_p_min, 0, 1),
        TOY_FLAG_N("--temp", TOY_CLI_F32, &sp->temperature, 0, 100),
        TOY_FLAG_N("--temperature", TOY_CLI_F32, &sp->temperature, 0, 100),
        TOY_FLAG_N("--top-k", TOY_CLI_I32, &sp->top_k, 0, INT32_MAX), TOY_FLAG_N("--top-p", TOY_CLI_F32, &sp->top_p, 0, 1),
        TOY_FLAG_N("--min-p", TOY_CLI_F32, &sp->min_p, 0, 1),
        TOY_FLAG_N("--repeat-penalty", TOY_CLI_F32, &sp->repeat_penalty, 0, 100), TOY_FLAG_U("--seed", &sp->seed),
        TOY_FLAG_N("--ctx", TOY_CLI_I64, &n_ctx, 16, INT32_MAX), TOY_FLAG_N("--threads", TOY_CLI_INT, &threads, 0, 1024),
        TOY_FLAG_END};
    int prc = toy_cli_parse("chat", argc, argv, flags, NULL, 0, NULL);
    if (prc == 1) return usage_to(stdout), 0;
    if (prc) return prc;
    if (!model) { fprintf(stderr, "toy chat: -m MODEL is required\n"); return usage_to(stderr); }
    int kv_type = TOY_F16;
    if (kv_name && (kv_type = toy_dtype_from_name(kv_name)) != TOY_F32 && kv_type != TOY_F16) {
        fprintf(stderr, "toy chat: --kv-type f32|f16\n");
        return 2;
    }
    if (toy_sampler_params_check(sp)) { fprintf(stderr, "toy chat: %s\n", toy_last_error()); return 2; }
    char resolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy chat: %s\n", toy_last_error()); return 1; }
    struct toy_llama *m = NULL;
    struct toy_tokenizer *tok = NULL;
    struct toy_chat_template *tmpl = NULL;
    struct toy_threadpool *tp = NULL;
    struct toy_generator *gen = NULL;
    struct toy_cli_draft dm = {0};
    char *tmpl_text = NULL;
    json_t *msgs = json_array();
    struct toy_tokens ids = {0};
    struct chat c = {.show_reasoning = show_reasoning, .tty = isatty(STDOUT_FILENO)};
    int rc = 1;
    if (toy_llama_load(resolved, false, &m) || toy_tokenizer_load_gguf(m->gguf, &tok)) {
        fprintf(stderr, "toy chat: %s: %s\n", resolved, toy_last_error());
        goto done;
    }
    /* the template: --chat-template, else the model's, else ChatML */
    const char *src = tmpl_arg ? toy_cli_template_source(tmpl_arg, &tmpl_text) : toy_tokenizer_chat_template(tok);
    if (!src) src = "chatml";
    if (toy_chat_template_init(src, &tmpl)) {
        fprintf(stderr, "toy chat: %s\n", toy_last_error());
        rc = tmpl_arg ? 2 : 1;
        goto done;
    }
    const char *tsrc = toy_chat_template_builtin(src) ? toy_chat_template_builtin(src) : src;
    struct toy_chat_syntax syn = toy_chat_syntax_detect(tsrc);
    const char *stops[4];
    gp.n_stop = toy_chat_stop_texts(&syn, tsrc, stops);
    gp.stop = stops;
    gp.keep_special = toy_chat_syntax_keeps_special(&syn);
    gp.reuse_cache = true; /* each turn computes only what is new */
    c.syn = &syn;
    tp = toy_threadpool_new(threads);
    if (toy_generator_new_kv(m, tok, n_ctx, (enum toy_dtype)kv_type, tp, &gen)) {
        fprintf(stderr, "toy chat: %s\n", toy_last_error());
        goto done;
    }
    struct toy_cli_draft_opts dopt = {draft, n_ctx, (enum toy_dtype)kv_type, tp};
    if (draft && toy_cli_draft_open("chat", &dopt, &dm)) goto done;
    if (dm.gen && toy_generator_check_draft(gen, dm.gen)) {
        fprintf(stderr, "toy chat: --draft %s: %s\n", draft, toy_last_error());
        goto done;
    }
    gp.draft = dm.gen;
    int64_t ctx = n_ctx > 0 && n_ctx < m->cfg.max_ctx ? n_ctx : m->cfg.max_ctx;
    if (system_msg) json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "system", "content", system_msg));
    size_t n_fixed = json_array_size(msgs);
    bool tty_in = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    rc = 0;
    for (;;) {
        if (tty_in) fputs("> ", stdout), fflush(stdout);
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (!strcmp(line, "/exit")) break;
        if (!strcmp(line, "/reset")) {
            while (json_array_size(msgs) > n_fixed) json_array_remove(msgs, n_fixed);
            continue;
        }
        if (n == 0) continue;
        json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "user", "content", line));
        bool in_think = false, fits = false;
        enum toy_status st;
        /* room for a reply of at least a quarter of the context: the oldest turns go first */
        while (!(st = encode_chat(tmpl, tok, msgs, &ids, &in_think)) && ids.n > ctx - ctx / 4 &&
               json_array_size(msgs) > n_fixed + 1)
            json_array_remove(msgs, n_fixed);
        fits = !st && ids.n < ctx;
        if (!fits) {
            fprintf(stderr, "toy chat: %s\n", st ? toy_last_error() : "that message does not fit the context");
            json_array_remove(msgs, json_array_size(msgs) - 1);
            continue;
        }
        syn.in_think = syn.think && in_think;
        c.len = c.sent_r = c.sent_c = c.sent_calls = 0;
        c.in_reasoning = false;
        toy_cli_stop = 0;
        toy_cli_stop_signals_install();
        struct toy_generate_result res;
        st = toy_generate(gen, ids.ids, ids.n, &gp, on_token, &c, &res);
        bool interrupted = toy_cli_stop;
        toy_cli_stop_signals_restore();
        toy_cli_stop = 0;
        if (st) {
            fprintf(stderr, "\ntoy chat: %s\n", toy_last_error());
            rc = 1;
            break;
        }
        show(&c, true);
        fputs(interrupted ? " [interrupted]\n" : "\n", stdout);
        if (tty_in) fputs("\n", stdout);
        fflush(stdout);
        /* the conversation keeps the reply's content (templates render what was said, not the thinking) */
        struct toy_chat_reply r;
        if (!toy_chat_reply_parse(&syn, c.text ? c.text : "", c.len, false, &r)) {
            json_array_append_new(msgs, json_pack("{s:s,s:s}", "role", "assistant", "content", r.content));
            toy_chat_reply_free(&r);
        }
    }
    free(line);
done:
    json_decref(msgs);
    toy_tokens_free(&ids);
    free(c.text);
    toy_generator_free(gen);
    toy_cli_draft_close(&dm);
    toy_threadpool_free(tp);
    toy_chat_template_free(tmpl);
    free(tmpl_text);
    toy_tokenizer_free(tok);
    toy_llama_free(m);
    return rc;
}
