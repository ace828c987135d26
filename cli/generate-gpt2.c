/* generate-gpt2.c: `toy generate -m gpt2.gguf -p TEXT` (toy_cli_generate_gpt2
 * in generate-gpt2.h): the GPT-2 model mapped from its GGUF, the prompt
 * encoded with the file's own tokenizer (GPT-2 byte-level BPE, no BOS),
 * generation through the generic generator over toy_gpt2_lm, text streamed
 * to stdout or one toy/generate-v1 JSON object with --json; and the part
 * both families share (toy_cli_run_generator: the trace, the stop signals,
 * the output). */
#include <jansson.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "generate-gpt2.h"
#include "json-out.h"
#include "precision.h"
#include "stop-signals.h"
#include "toy/bert.h"
#include "toy/gguf.h"
#include "toy/gpt2.h"
#include "toy/llama.h"
#include "toy/models.h"
#include "toy/toy.h"
#include "toy/trace.h"

bool toy_cli_is_gpt2(const char *path) {
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) return false;
    bool yes = toy_gguf_is_gpt2(g);
    toy_gguf_close(g);
    return yes;
}

bool toy_cli_is_bert(const char *path) {
    struct toy_gguf *g;
    if (toy_gguf_open(path, &g)) return false;
    bool yes = toy_gguf_is_bert(g);
    toy_gguf_close(g);
    return yes;
}

void toy_cli_gen_echo(struct toy_cli_gen_out *o) {
    if (!o->json && !o->echoed && o->prompt) fputs(o->prompt, stdout);
    o->echoed = true;
}

int toy_cli_gen_finish(struct toy_cli_gen_out *o, const struct toy_tokens *prompt, const struct toy_generate_result *r,
                       const char *arch) {
    bool interrupted = r->reason == TOY_STOP_CALLER && toy_cli_stop;
    const char *reasons[] = {"length", "eos", "stop", "caller", "context"};
    /* decode steps: the first token comes from the prefill's logits */
    int64_t steps = r->n_generated > 0 ? r->n_generated - 1 : 0;
    double prefill = r->prefill_s > 0 ? r->n_prompt / r->prefill_s : 0.0, decode = r->decode_s > 0 ? steps / r->decode_s : 0.0;
    int rc = interrupted ? 130 : 0;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (o->json) {
        json_t *pa = json_array();
        for (int64_t i = 0; i < prompt->n; i++) json_array_append_new(pa, json_integer(prompt->ids[i]));
        json_t *res = json_pack("{s:s,s:o,s:O,s:o,s:O,s:s,s:f,s:f,s:f}", "format", "toy/generate-v1", "prompt_ids", pa,
                                "ids", o->ids, "text", toy_cli_json_text(o->text, o->len), "logprobs", o->lps,
                                "finish_reason", interrupted ? "interrupted" : reasons[r->reason],
                                "prefill_tokens_per_s", prefill, "decode_tokens_per_s", decode, "peak_rss_mb",
                                ru.ru_maxrss / 1024.0);
        if (res && arch) json_object_set_new(res, "arch", json_string(arch));
        if (res && o->spec) {
            json_t *sp = json_pack("{s:I,s:I,s:I}", "drafted", (json_int_t)r->n_drafted, "accepted",
                                   (json_int_t)r->n_accepted, "passes", (json_int_t)r->n_steps);
            if (sp && !strcmp(o->spec, "draft")) /* the draft model's own passes and time */
                json_object_update_new(sp, json_pack("{s:I,s:f}", "draft_passes", (json_int_t)r->n_draft_steps,
                                                     "draft_s", r->draft_s));
            json_object_set_new(res, o->spec, sp);
        }
        if (toy_cli_print_json("generate", res, JSON_COMPACT)) rc = 1;
    } else {
        toy_cli_gen_echo(o);
        putchar('\n');
        char kept[96] = "";
        if (r->n_drafted)
            snprintf(kept, sizeof kept, ", %lld of %lld drafted tokens kept", (long long)r->n_accepted,
                     (long long)r->n_drafted);
        if (isatty(2))
            fprintf(stderr, "[%lld prompt tokens at %.1f tok/s, %lld generated at %.1f tok/s%s, peak RSS %.0f MB%s]\n",
                    (long long)r->n_prompt, prefill, (long long)r->n_generated, decode, kept, ru.ru_maxrss / 1024.0,
                    interrupted ? ", interrupted" : "");
    }
    return rc;
}

bool toy_cli_gen_on_token(void *ud, int32_t id, const char *text, size_t len, float lp) {
    struct toy_cli_gen_out *o = ud;
    if (o->json) {
        if (id >= 0) {
            json_array_append_new(o->ids, json_integer(id));
            json_array_append_new(o->lps, isfinite(lp) ? json_real(lp) : json_null()); /* JSON has no NaN */
        }
        if (len && o->len + len + 1 > o->cap) {
            size_t cap = (o->len + len + 1) * 2;
            char *t = realloc(o->text, cap);
            if (!t) return false;
            o->text = t, o->cap = cap;
        }
        if (len) memcpy(o->text + o->len, text, len), o->len += len;
    } else {
        toy_cli_gen_echo(o);
        if (len) fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return !toy_cli_stop; /* Ctrl-C: the text so far is printed (or put in the JSON), and the exit code is 130 */
}

int toy_cli_parse_prompt_ids(const char *s, struct toy_tokens *ids) {
    for (const char *p = s;;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++; /* "1, 2 3", tabs and newlines alike */
        if (!*p) return 0;
        char *e;
        errno = 0;
        long long v = strtoll(p, &e, 10);
        if (e == p || (*e && *e != ',' && !isspace((unsigned char)*e)) || errno || v < 0 || v > INT32_MAX) {
            fprintf(stderr, "toy generate: --prompt-ids: '%.*s' is not a token id (a whole number from 0, the ids "
                            "separated by commas or spaces)\n", (int)strcspn(p, ", \t\n"), p);
            return 2;
        }
        if (ids->n == ids->cap) {
            int64_t nc = ids->cap ? ids->cap * 2 : 64;
            int32_t *n = realloc(ids->ids, (size_t)nc * sizeof *n);
            if (!n) {
                fprintf(stderr, "toy generate: out of memory\n");
                return 1;
            }
            ids->ids = n;
            ids->cap = nc;
        }
        ids->ids[ids->n++] = (int32_t)v;
        p = e;
    }
}

int toy_cli_draft_open(const char *cmd, const struct toy_cli_draft_opts *o, struct toy_cli_draft *d) {
    memset(d, 0, sizeof *d);
    char resolved[4096];
    struct toy_lm lm;
    if (toy_model_resolve(o->path, resolved, sizeof resolved)) goto fail;
    if (toy_cli_is_gpt2(resolved)) {
        if (toy_gpt2_load(resolved, false, &d->gpt2)) goto fail;
        lm = toy_gpt2_lm(d->gpt2);
    } else {
        if (toy_llama_load(resolved, false, &d->llama)) goto fail;
        lm = toy_llama_lm(d->llama);
    }
    /* no tokenizer: the vocabularies' sizes are compared, not their pieces */
    if (toy_tokenizer_load_gguf(d->gpt2 ? d->gpt2->gguf : d->llama->gguf, &d->tok)) d->tok = NULL;
    if (toy_generator_new_lm(&lm, d->tok, o->n_ctx, o->kv_type, o->tp, &d->gen)) goto fail;
    return 0;
fail:
    fprintf(stderr, "toy %s: --draft %s: %s\n", cmd, o->path, toy_last_error());
    toy_cli_draft_close(d);
    return 1;
}

void toy_cli_draft_close(struct toy_cli_draft *d) {
    toy_generator_free(d->gen);
    toy_tokenizer_free(d->tok);
    toy_llama_free(d->llama);
    toy_gpt2_free(d->gpt2);
    memset(d, 0, sizeof *d);
}

int toy_cli_run_generator(struct toy_generator *gen, const struct toy_tokens *ids, const struct toy_generate_params *gpp,
                          const char *prompt, bool json, const char *trace_path, const char *arch,
                          const struct toy_cli_draft_opts *draft) {
    struct toy_generate_params gp = *gpp;
    struct toy_cli_draft dm = {0};
    if (draft && draft->path) {
        if (toy_cli_draft_open("generate", draft, &dm)) return 1;
        gp.draft = dm.gen;
    }
    struct toy_trace *tr = NULL;
    if (trace_path && toy_trace_open(trace_path, 0, &tr)) { /* asked for: not generating without it */
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        toy_cli_draft_close(&dm);
        return 1;
    }
    if (tr) toy_generator_set_trace(gen, tr);
    if (tr && dm.gen) toy_generator_set_trace(dm.gen, tr);
    struct toy_cli_gen_out o = {.json = json, .prompt = prompt, .ids = json_array(), .lps = json_array(),
                                .spec = gp.draft ? "draft" : gp.lookup > 0 ? "lookup" : NULL};
    struct toy_generate_result r;
    int rc;
    toy_cli_stop_signals_install();
    if (toy_generate(gen, ids->ids, ids->n, &gp, toy_cli_gen_on_token, &o, &r)) {
        fprintf(stderr, "%stoy generate: %s\n", o.echoed ? "\n" : "", toy_last_error());
        rc = 1;
    } else {
        rc = toy_cli_gen_finish(&o, ids, &r, arch);
    }
    toy_cli_stop_signals_restore();
    json_decref(o.ids);
    json_decref(o.lps);
    free(o.text);
    if (tr && toy_trace_close(tr)) { /* asked for and not written: the command failed */
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        if (!rc) rc = 1;
    }
    toy_cli_draft_close(&dm);
    return rc;
}

int toy_cli_generate_gpt2(const char *path, const char *prompt, const char *prompt_ids,
                          const struct toy_generate_params *gp, int64_t n_ctx, enum toy_dtype kv_type, int threads,
                          bool json, bool special, const char *trace_path, bool bf16, const char *draft) {
    struct toy_gpt2 *m;
    if (toy_gpt2_load(path, false, &m)) { fprintf(stderr, "toy generate: %s\n", toy_last_error()); return 1; }
    if (bf16) toy_cli_infer_bf16("generate", NULL, m);
    struct toy_tokenizer *tok = NULL;
    if (toy_tokenizer_load_gguf(m->gguf, &tok) && !prompt_ids) {
        fprintf(stderr, "toy generate: %s has no usable tokenizer (%s); pass --prompt-ids\n", path, toy_last_error());
        toy_gpt2_free(m);
        return 1;
    }
    struct toy_tokens ids = {0};
    int rc = 0;
    if (prompt_ids) {
        if ((rc = toy_cli_parse_prompt_ids(prompt_ids, &ids))) goto done;
    } else {
        const char *text = prompt ? prompt : "";
        if (toy_tokenizer_encode(tok, text, strlen(text), special ? TOY_ENCODE_PARSE_SPECIAL : 0, &ids)) {
            fprintf(stderr, "toy generate: %s\n", toy_last_error());
            rc = 1;
            goto done;
        }
        if (ids.n == 0 && toy_tokenizer_eos(tok) >= 0) { /* GPT-2 starts an empty prompt from <|endoftext|> */
            ids.ids = malloc(sizeof *ids.ids);
            if (!ids.ids) { rc = 1; goto done; }
            ids.ids[0] = toy_tokenizer_eos(tok);
            ids.n = ids.cap = 1;
        }
    }
    if (n_ctx > m->cfg.max_ctx) /* the generator takes the model's context then, as for Llama models */
        fprintf(stderr, "toy generate: note: --ctx %lld is past the model's context of %lld tokens: using %lld\n",
                (long long)n_ctx, (long long)m->cfg.max_ctx, (long long)m->cfg.max_ctx);
    struct toy_threadpool *tp = toy_threadpool_new(threads);
    struct toy_lm lm = toy_gpt2_lm(m);
    struct toy_generator *gen;
    if (toy_generator_new_lm(&lm, tok, n_ctx, kv_type, tp, &gen)) {
        fprintf(stderr, "toy generate: %s\n", toy_last_error());
        rc = 1;
    } else {
        struct toy_cli_draft_opts dopt = {draft, n_ctx, kv_type, tp};
        rc = toy_cli_run_generator(gen, &ids, gp, prompt, json, trace_path, "gpt2", &dopt);
        toy_generator_free(gen);
    }
    toy_threadpool_free(tp);
done:
    toy_tokens_free(&ids);
    toy_tokenizer_free(tok);
    toy_gpt2_free(m);
    return rc;
}
