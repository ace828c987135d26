/* cmd-chat-template.c: `toy chat-template`: render a chat prompt with a
 * model's tokenizer.chat_template (GGUF or tokenizer_config.json) or a
 * built-in/explicit template, for messages given as JSON. Uses only
 * include/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli-error.h"
#include "paths.h"
#include "toy/chat-template.h"
#include "toy/file.h"
#include "toy/tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: toy chat-template [-m MODEL] [--template NAME|FILE|JINJA] --messages FILE.json\n"
            "  -m MODEL              a .gguf, tokenizer.json (with tokenizer_config.json) or folder; gives the\n"
            "                        template and the BOS/EOS text\n"
            "  --template NAME|FILE  a built-in (chatml, smollm2, llama3, llama2, mistral, gemma, phi3), a Jinja file\n"
            "                        or Jinja source; a model without a template gets chatml\n"
            "  --messages FILE       JSON: [{\"role\": ..., \"content\": ...}, ...] or {\"messages\": [...], \"tools\": ...};\n"
            "                        the object's other keys become template variables too (e.g. gpt-oss's\n"
            "                        \"reasoning_effort\"); '-' reads standard input. strftime_now reads\n"
            "                        SOURCE_DATE_EPOCH when set\n"
            "  --no-generation-prompt  do not open an assistant turn at the end\n"
            "  --bos TEXT, --eos TEXT  BOS/EOS text when there is no model\n"
            "  --print-template      print the template source instead of rendering\n");
}

int toy_cmd_chat_template(int argc, char **argv) {
    const char *model = NULL, *tmpl = NULL, *messages = NULL, *bos = NULL, *eos = NULL;
    bool gen = true, print = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--template") && i + 1 < argc) tmpl = argv[++i];
        else if (!strcmp(a, "--messages") && i + 1 < argc) messages = argv[++i];
        else if (!strcmp(a, "--bos") && i + 1 < argc) bos = argv[++i];
        else if (!strcmp(a, "--eos") && i + 1 < argc) eos = argv[++i];
        else if (!strcmp(a, "--no-generation-prompt")) gen = false;
        else if (!strcmp(a, "--print-template")) print = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else { fprintf(stderr, "toy chat-template: unknown argument %s\n", a); usage(stderr); return 2; }
    }
    if (!model && !tmpl) { fprintf(stderr, "toy chat-template: give -m MODEL or --template\n"); usage(stderr); return 2; }
    if (!messages && !print) { fprintf(stderr, "toy chat-template: --messages is required\n"); return 2; }
    struct toy_tokenizer *tok = NULL;
    char resolved[4096];
    if (model && !(model = toy_cli_tokenizer_source("chat-template", model, resolved, sizeof resolved))) return 1;
    if (model && toy_tokenizer_load(model, &tok)) { fprintf(stderr, "toy chat-template: %s\n", toy_cli_error("chat-template")); return 1; }
    char *file_src = NULL;
    const char *src = NULL;
    if (tmpl) {
        src = toy_cli_template_source(tmpl, &file_src); /* a name, Jinja source, or a file ("-": stdin) */
    } else {
        src = toy_tokenizer_chat_template(tok);
        if (!src) { /* as serve and finetune do */
            fprintf(stderr, "toy chat-template: note: %s has no chat template: using chatml (--template picks "
                    "another)\n", model);
            src = "chatml";
        }
    }
    int rc = 0;
    if (print) {
        const char *b = toy_chat_template_builtin(src);
        fputs(b ? b : src, stdout);
        putchar('\n');
        goto out;
    }
    char *msgs;
    size_t n_msgs;
    if (toy_file_read_all(messages, &msgs, &n_msgs)) {
        fprintf(stderr, "toy chat-template: %s\n", toy_last_error());
        rc = 1;
        goto out;
    }
    struct toy_chat_template *t;
    if (toy_chat_template_init(src, &t)) { fprintf(stderr, "toy chat-template: %s\n", toy_cli_error("chat-template")); free(msgs); rc = 1; goto out; }
    struct toy_chat_vars v = {.bos_token = bos, .eos_token = eos, .add_generation_prompt = gen};
    if (tok && !bos && toy_tokenizer_bos(tok) >= 0) v.bos_token = toy_tokenizer_piece(tok, toy_tokenizer_bos(tok));
    if (tok && !eos && toy_tokenizer_eos(tok) >= 0) v.eos_token = toy_tokenizer_piece(tok, toy_tokenizer_eos(tok));
    char *prompt;
    if (toy_chat_template_render_json(t, msgs, &v, &prompt)) {
        fprintf(stderr, "toy chat-template: %s\n", toy_cli_error("chat-template"));
        rc = 1;
    } else {
        fputs(prompt, stdout);
        free(prompt);
    }
    toy_chat_template_free(t);
    free(msgs);
out:
    free(file_src);
    toy_tokenizer_free(tok);
    return rc;
}
