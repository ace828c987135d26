/* cmd-finetune.c: `toy finetune`: LoRA, QLoRA or full fine-tuning of a
 * Llama-family GGUF on SFT JSONL ({"prompt","completion"} or {"messages"}),
 * into the same run bundle as `toy train`:
 *
 *   runs/<id>/finetune.json        the options (what --resume reads)
 *   runs/<id>/events.jsonl         the toy/v1 event stream
 *   runs/<id>/weights/step_N.gguf  the adapter (lora, qlora; llama.cpp's
 *                                  adapter GGUF) or the model (full), with
 *                                  step_N.state.gguf and `latest`
 *
 * The library side is toy/finetune.h. Ctrl-C stops after the current step
 * with a checkpoint; --resume continues bit-identically. */
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "progress.h"
#include "stop-signals.h"
#include "flags.h"
#include "json-out.h"
#include "paths.h"
#include "dp-agree.h"
#include "resume.h"
#include "toy/gguf.h"
#include "toy/threadpool.h"
#include "toy/chat-template.h"
#include "toy/collective.h"
#include "toy/finetune.h"
#include "toy/run-dir.h"
#include "toy/toy.h"


static int usage_to(FILE *f) {
    fprintf(f,
"usage: toy finetune --base MODEL.gguf --data SFT.jsonl [--method lora|qlora|full] [options]\n"
"       toy finetune --resume runs/<id> [--steps N]\n"
"data:     --data FILE (JSONL: {\"prompt\",\"completion\"} or {\"messages\":[{\"role\",\"content\"},...]}; a pipe too)\n"
"          --template NAME|JINJA|FILE (for messages; default the model's, else chatml) --ctx 256 --heldout 0.1\n"
"          --no-pack (one example per row; default: examples packed into rows, attention kept within each)\n"
"method:   --method lora (default) | qlora (quantized base, e.g. from `toy quantize`) | full\n"
"lora:     --rank 8 --alpha 16 --targets q,v (q,k,v,o,gate,up,down, all) --dropout 0\n"
"full:     --freeze-embeddings\n"
"training: --epochs 1 | --steps N, --batch 4 --grad-accum 1 --lr 2e-4 (full: 2e-5) --lr-min 0 --warmup 10\n"
"          --schedule cosine|linear|constant --wd 0 --beta1 0.9 --beta2 0.999 --clip 1.0 --seed 42\n"
"          --bf16 --threads N\n"
"output:   --eval-every 50 --eval-batches 0 (all) --ckpt-every 0 --runs DIR (runs) --out DIR --log-every 10 --json\n"
"parallel: mpirun -np N toy finetune ... (a `make MPI=1` build; --batch is per rank) --dp-timeout 300 (s)\n");
    return 2;
}

struct cfg {
    const char *base, *data, *method, *targets, *tmpl, *runs, *out, *resume;
    int64_t ctx, rank;
    double heldout, alpha, dropout;
    int threads, log_every;
    bool json, lr_given, ctx_given;
    double dp_timeout; /* data parallelism: seconds a collective may wait */
    int64_t world;     /* ranks (finetune.json: of the run that wrote it) */
    struct toy_finetune_opts o;
    const char *data_fingerprint; /* toy_sft_fingerprint in hex: finetune.json's, or this run's */
    int64_t data_examples;
};

static json_t *cfg_json(const struct cfg *c) {
    json_t *j = json_pack("{s:s?,s:s?,s:s,s:s?,s:s?,s:I,s:I,s:f,s:f,s:f}", "base", c->base, "data", c->data, "method",
                          c->method, "targets", c->targets, "template", c->tmpl, "ctx", (json_int_t)c->ctx, "rank",
                          (json_int_t)c->rank, "heldout", c->heldout, "alpha", c->alpha, "dropout", c->dropout);
    json_object_set_new(j, "batch", json_integer(c->o.batch));
    json_object_set_new(j, "epochs", json_integer(c->o.epochs));
    json_object_set_new(j, "freeze_embeddings", json_boolean(c->o.freeze_embeddings));
    json_object_set_new(j, "pack", json_boolean(!c->o.no_pack));
    json_object_set_new(j, "train", toy_train_opts_to_json(&c->o.train));
    int64_t world = c->world > 0 ? c->world : 1; /* the global batch: rows per optimizer step over all ranks */
    json_object_set_new(j, "world", json_integer(world));
    json_object_set_new(j, "global_batch", json_integer(c->o.batch * world * (c->o.train.accum > 0 ? c->o.train.accum : 1)));
    json_object_set_new(j, "threads", json_integer(toy_threads_resolve(c->threads))); /* float sums depend on it */
    if (c->data_fingerprint) { /* --resume refuses other data */
        json_object_set_new(j, "data_examples", json_integer(c->data_examples));
        json_object_set_new(j, "data_fingerprint", json_string(c->data_fingerprint));
    }
    return j;
}

static void cfg_from_json(struct cfg *c, json_t *j) {
    json_t *v;
#define STR(k, f) if ((v = json_object_get(j, k)) && json_is_string(v)) c->f = json_string_value(v) /* j outlives c */
#define INT(k, f) if ((v = json_object_get(j, k)) && json_is_integer(v)) c->f = json_integer_value(v)
#define NUM(k, f) if ((v = json_object_get(j, k)) && json_is_number(v)) c->f = json_number_value(v)
    STR("base", base);
    STR("data", data);
    STR("method", method);
    STR("targets", targets);
    STR("template", tmpl);
    STR("data_fingerprint", data_fingerprint);
    INT("data_examples", data_examples);
    INT("ctx", ctx);
    INT("rank", rank);
    INT("batch", o.batch);
    INT("epochs", o.epochs);
    INT("world", world);
    INT("threads", threads);
    NUM("heldout", heldout);
    NUM("alpha", alpha);
    NUM("dropout", dropout);
#undef STR
#undef INT
#undef NUM
    if ((v = json_object_get(j, "freeze_embeddings"))) c->o.freeze_embeddings = json_is_true(v);
    v = json_object_get(j, "pack"); /* runs from before packing had one example per row */
    c->o.no_pack = !v || !json_is_true(v);
    if ((v = json_object_get(j, "train"))) toy_train_opts_from_json(&c->o.train, v);
}

static int parse(int argc, char **argv, struct cfg *c, bool *given_steps) {
    const char *schedule = NULL;
    const double big = 1e12, dim = 1048576;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("--base", &c->base), TOY_FLAG_S("-m", &c->base), TOY_FLAG_S("--data", &c->data),
        TOY_FLAG_S("--method", &c->method), TOY_FLAG_S("--targets", &c->targets), TOY_FLAG_S("--template", &c->tmpl),
        TOY_FLAG_S("--runs", &c->runs), TOY_FLAG_S("--out", &c->out), TOY_FLAG_S("--resume", &c->resume),
        TOY_FLAG_S("--schedule", &schedule), TOY_FLAG_B("--bf16", &c->o.train.bf16), TOY_FLAG_B("--json", &c->json),
        TOY_FLAG_B("--freeze-embeddings", &c->o.freeze_embeddings), TOY_FLAG_B("--no-pack", &c->o.no_pack),
        TOY_FLAG_NG("--lr", TOY_CLI_F32, &c->o.train.lr, 0, 1e30, &c->lr_given),
        TOY_FLAG_NG("--steps", TOY_CLI_I64, &c->o.train.steps, 1, big, given_steps),
        TOY_FLAG_N("--rank", TOY_CLI_I64, &c->rank, 1, 65536), TOY_FLAG_N("--alpha", TOY_CLI_F64, &c->alpha, 0, 1e30),
        TOY_FLAG_OPEN("--dropout", TOY_CLI_F64, &c->dropout, 0, 1), TOY_FLAG_NG("--ctx", TOY_CLI_I64, &c->ctx, 1, 16 * dim, &c->ctx_given),
        TOY_FLAG_OPEN("--heldout", TOY_CLI_F64, &c->heldout, 0, 1),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &c->threads, 0, 4096),
        TOY_FLAG_N("--log-every", TOY_CLI_INT, &c->log_every, 0, INT32_MAX),
        TOY_FLAG_N("--batch", TOY_CLI_I64, &c->o.batch, 1, dim), TOY_FLAG_N("--epochs", TOY_CLI_I64, &c->o.epochs, 1, big),
        TOY_FLAG_N("--grad-accum", TOY_CLI_I64, &c->o.train.accum, 1, dim),
        TOY_FLAG_N("--accum", TOY_CLI_I64, &c->o.train.accum, 1, dim),
        TOY_FLAG_N("--lr-min", TOY_CLI_F32, &c->o.train.lr_min, 0, 1e30),
        TOY_FLAG_N("--warmup", TOY_CLI_I64, &c->o.train.warmup, 0, big),
        TOY_FLAG_N("--wd", TOY_CLI_F32, &c->o.train.weight_decay, 0, 1e30),
        TOY_FLAG_OPEN("--beta1", TOY_CLI_F32, &c->o.train.beta1, 0, 1),
        TOY_FLAG_OPEN("--beta2", TOY_CLI_F32, &c->o.train.beta2, 0, 1),
        TOY_FLAG_N("--clip", TOY_CLI_F32, &c->o.train.clip, 0, 1e30), TOY_FLAG_U("--seed", &c->o.train.seed),
        TOY_FLAG_N("--eval-every", TOY_CLI_I64, &c->o.train.eval_every, 0, big),
        TOY_FLAG_N("--eval-batches", TOY_CLI_I64, &c->o.train.eval_batches, 0, big),
        TOY_FLAG_N("--ckpt-every", TOY_CLI_I64, &c->o.train.ckpt_every, 0, big),
        TOY_FLAG_N("--dp-timeout", TOY_CLI_F64, &c->dp_timeout, 0, 1e9),
        TOY_FLAG_END,
    };
    int rc = toy_cli_parse("finetune", argc, argv, flags, NULL, 0, NULL);
    if (rc == 1) usage_to(stdout); /* asked for: the help goes to standard output */
    if (rc) return rc;
    if (c->o.train.bf16) toy_cli_bf16_math();
    if (schedule) {
        int k = toy_lr_kind_from_name(schedule);
        if (k < 0) { fprintf(stderr, "toy finetune: --schedule is cosine, linear or constant, not '%s'\n", schedule); return 2; }
        c->o.train.schedule = (enum toy_lr_kind)k;
    }
    return 0;
}

static int ft_main(struct cfg *cp, bool given_steps, struct toy_collective *coll, int rank, int world);
static bool dp_consistent; /* a failure every rank saw alike (a NaN loss): finalize, no abort */

int toy_cmd_finetune(int argc, char **argv) {
    struct cfg c = {.runs = "runs", .method = "lora", .targets = "q,v", .ctx = 256, .rank = 8, .alpha = 16,
                    .heldout = 0.1, .log_every = 10};
    c.o = (struct toy_finetune_opts){.batch = 4, .epochs = 1};
    c.o.train = (struct toy_train_opts){.accum = 1, .lr = 2e-4f, .warmup = 10, .schedule = TOY_LR_COSINE,
                                        .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f, .seed = 42,
                                        .eval_every = 50};
    bool given_steps = false;
    int rc = parse(argc, argv, &c, &given_steps);
    if (rc) return rc == 1 ? 0 : rc;
    /* data parallelism: under mpirun (in a `make MPI=1` build) this is one rank of many */
    struct toy_collective *coll = NULL;
    struct toy_collective_opts copt = {.timeout_s = c.dp_timeout};
    if (toy_collective_open(TOY_COLLECTIVE_AUTO, &copt, &coll)) {
        fprintf(stderr, "toy finetune: %s\n", toy_last_error());
        return 1;
    }
    const int rank = toy_collective_rank(coll), world = toy_collective_world(coll);
    static const char *const applies[] = {"--resume", "--steps", "--threads", "--json", "--log-every", "--dp-timeout",
                                          NULL};
    if (c.resume && rank == 0)
        toy_cli_resume_ignored("finetune", argc, argv, applies, "finetune.json",
                               "--steps, --threads, --log-every, --json and --dp-timeout");
    /* --template FILE: its text is what the run keeps (finetune.json), so that --resume reads no file again */
    char *tmpl_text = NULL;
    c.tmpl = toy_cli_template_source(c.tmpl, &tmpl_text);
    rc = ft_main(&c, given_steps, coll, rank, world);
    free(tmpl_text);
    if ((rc == 1 || rc == 2) && world > 1 && !dp_consistent && !toy_collective_broken(coll)) { /* 2: a bad flag */
        fprintf(stderr, "toy finetune: rank %d of %d failed: ending the job\n", rank, world);
        toy_collective_abort(coll, 1);
    }
    toy_collective_close(coll); /* broken by a dead or hung rank: rank 0 (checkpointed) ends the job */
    return rc;
}

/* Resuming on another number of ranks keeps the micro-batches (packing
 * fills rows per micro-batch, so their size decides which rows there are)
 * and the micro-batches per step: --grad-accum becomes accum x
 * ranks-then / ranks-now, which must come out whole. */
static int dp_resize(struct cfg *c, int world) {
    int64_t then = c->world > 0 ? c->world : 1, accum = c->o.train.accum > 0 ? c->o.train.accum : 1;
    int64_t micro = accum * then;
    if (micro % world) {
        fprintf(stderr, "toy finetune: cannot resume on %d ranks: the run's steps are %lld micro-batches (--grad-accum "
                "%lld x %lld ranks), which %d ranks cannot split evenly; resume on a number of ranks that divides %lld\n",
                world, (long long)micro, (long long)accum, (long long)then, world, (long long)micro);
        return 1;
    }
    c->o.train.accum = micro / world;
    return 0;
}


static int ft_main(struct cfg *cp, bool given_steps, struct toy_collective *coll, int rank, int world) {
    struct cfg c = *cp;
    int rc;
    struct cfg cli = c;
    char run_dir[1024] = "", run_id[1024] = "", ckpt[1600] = "", state[1700] = "";
    json_t *saved = NULL; /* the resumed run's options; c borrows its strings */
    json_t *resaved = NULL; /* --resume: finetune.json to write back (new --steps or thread count) */
    int run_lock = -1;    /* toy_run_claim's: one process writes a run */
    bool made_run = false, started = false; /* a new run folder; its first step began */
    if (c.resume) {
        json_t *j = toy_cli_resume_load("finetune", c.resume, "finetune.json");
        if (!j) return 1;
        c.tmpl = NULL; /* finetune.json's null is the run's: the model's template (or chatml), not a --template now */
        cfg_from_json(&c, j);
        saved = j;
        if (rank == 0 && toy_run_claim(c.resume, false, &run_lock)) { /* rank 0 writes the run */
            fprintf(stderr, "toy finetune: cannot resume: %s\n", toy_last_error());
            json_decref(saved);
            json_decref(resaved);
            return 1;
        }
        int64_t run_steps = c.o.train.steps;
        if (given_steps) c.o.train.steps = cli.o.train.steps;
        int run_threads = c.threads; /* the run's count unless --threads says otherwise (as toy train) */
        if (cli.threads > 0 || c.threads <= 0) c.threads = cli.threads;
        resaved = rank == 0 && toy_cli_resume_changes("finetune", run_threads, c.threads, run_steps,
                                                              c.o.train.steps, c.o.train.schedule == TOY_LR_CONSTANT)
                              ? cfg_json(&c) /* written back once the run is known to resume */
                              : NULL;
        c.json = cli.json;
        c.log_every = cli.log_every;
        c.dp_timeout = cli.dp_timeout;
        if (dp_resize(&c, world)) {
            json_decref(saved);
            json_decref(resaved);
            return 1;
        }
        snprintf(run_dir, sizeof run_dir, "%s", c.resume);
        const char *slash = strrchr(run_dir, '/');
        snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : run_dir);
        char path[1200], target[512];
        snprintf(path, sizeof path, "%s/weights/latest", run_dir);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) {
            fprintf(stderr, "toy finetune: cannot resume: %s has no weights/latest\n", run_dir);
            json_decref(saved);
            json_decref(resaved);
            return 1;
        }
        target[n] = 0;
        snprintf(ckpt, sizeof ckpt, "%s/weights/%s", run_dir, target);
        snprintf(state, sizeof state, "%.*s.state.gguf", (int)(strlen(ckpt) - 5), ckpt);
        struct toy_gguf *probe; /* named as the checkpoint, before anything is read from it */
        if (toy_gguf_open(ckpt, &probe)) {
            fprintf(stderr, "toy finetune: cannot resume: the checkpoint weights/latest points to: %s\n",
                    toy_last_error());
            json_decref(saved);
            json_decref(resaved);
            return 1;
        }
        toy_gguf_close(probe);
    }
    int method = toy_ft_method_from_name(c.method);
    unsigned targets = 0;
    if (!c.base || !c.data || method < 0 || toy_lora_parse_targets(c.targets, &targets)) {
        if (!c.base || !c.data) fprintf(stderr, "toy finetune: --base MODEL and --data FILE are required\n");
        else if (method < 0) fprintf(stderr, "toy finetune: --method is lora, qlora or full\n");
        else fprintf(stderr, "toy finetune: %s\n", toy_last_error());
        json_decref(saved);
        json_decref(resaved);
        return 2;
    }
    struct toy_chat_template *tp = NULL;
    /* parsed now, before the model is loaded; a misspelt built-in name (text without a Jinja tag) is refused there */
    if (c.tmpl && toy_chat_template_init(c.tmpl, &tp)) {
        fprintf(stderr, "toy finetune: --template: %s\n", toy_last_error());
        json_decref(saved);
        json_decref(resaved);
        return 2;
    }
    toy_chat_template_free(tp);
    if (toy_cli_dp_input("finetune", "--data", c.data, world)) {
        json_decref(saved);
        json_decref(resaved);
        return 2;
    }
    if (c.data && toy_cli_check_input("finetune", c.data)) { /* a folder read as a failed read */
        json_decref(saved);
        json_decref(resaved);
        return 1;
    }
    char abs_base[PATH_MAX], abs_data[PATH_MAX];
    if (!c.resume) { /* finetune.json keeps them, and --resume may run from another folder */
        c.base = toy_cli_abspath(c.base, abs_base, sizeof abs_base);
        c.data = toy_cli_abspath(c.data, abs_data, sizeof abs_data);
    }
    /* a new run's folder: claimed once the flags are known good, before any slow work, so that an old run
     * there is refused at once */
    if (!c.resume && c.out && rank == 0 && toy_run_claim(c.out, true, &run_lock)) {
        fprintf(stderr, "toy finetune: --out %s\n", toy_last_error());
        json_decref(saved);
        json_decref(resaved);
        return 1;
    }
    if (!c.resume && c.out && rank == 0) made_run = true;
    c.o.method = (enum toy_ft_method)method;
    if (method == TOY_FT_FULL && !c.lr_given && !c.resume) c.o.train.lr = 2e-5f;
    c.o.train.stop = &toy_cli_stop;
    c.world = world;
    c.o.rank = rank;
    c.o.world = world;
    if (rank != 0) { /* rank 0 alone reports; errors still reach stderr */
        c.json = true;
        if (!freopen("/dev/null", "w", stdout)) return 1;
    }
    if (!c.threads && world > 1 && !getenv("TOY_THREADS")) c.threads = toy_collective_threads(coll);

    struct toy_llama *m = NULL;
    struct toy_tokenizer *tok = NULL;
    struct toy_lora *lora = NULL;
    struct toy_sft *data = NULL;
    struct toy_events *ev = NULL;
    struct toy_finetuner *ft = NULL;
    rc = 1;
    const char *model_path = method == TOY_FT_FULL && ckpt[0] ? ckpt : c.base;
    if (toy_llama_load(model_path, method == TOY_FT_FULL, &m)) { fprintf(stderr, "toy finetune: %s\n", toy_last_error()); goto out; }
    if (toy_tokenizer_load_gguf_file(model_path, &tok)) {
        fprintf(stderr, "toy finetune: %s: no tokenizer: %s\n", model_path, toy_last_error());
        goto out;
    }
    if (method != TOY_FT_FULL) {
        enum toy_status st;
        if (ckpt[0]) {
            st = toy_lora_load(m, ckpt, 1.0f, true, &lora);
        } else {
            struct toy_lora_opts lo = {.rank = (int32_t)c.rank, .alpha = (float)c.alpha, .targets = targets,
                                       .dropout = (float)c.dropout, .seed = c.o.train.seed};
            st = toy_lora_attach(m, &lo, &lora);
        }
        if (st) { fprintf(stderr, "toy finetune: %s\n", toy_last_error()); goto out; }
    }
    if (!c.ctx_given && !c.resume && c.ctx > m->cfg.max_ctx) c.ctx = m->cfg.max_ctx; /* the default fits the model */
    struct toy_sft_opts so = {.ctx = c.ctx, .heldout = c.heldout, .seed = c.o.train.seed, .chat_template = c.tmpl};
    if (toy_sft_open(c.data, tok, &so, &data)) { fprintf(stderr, "toy finetune: %s\n", toy_last_error()); goto out; }
    /* a resumed run continues on the examples it trained on, in the same split */
    char fingerprint[17], saved_at[1100];
    snprintf(saved_at, sizeof saved_at, "%s/finetune.json", c.resume ? c.resume : "");
    int64_t n_examples = toy_sft_n_train(data) + toy_sft_n_heldout(data);
    if (toy_cli_resume_data("finetune", c.data, toy_sft_fingerprint(data), n_examples, "examples",
                            c.resume ? c.data_fingerprint : NULL, c.data_examples, saved_at, fingerprint))
        goto out;
    c.data_fingerprint = fingerprint;
    c.data_examples = n_examples;

    toy_cli_stop_signals_install(); /* from here on a stop request ends the run with a checkpoint and run_end */
    if (!run_dir[0] && rank == 0) { /* rank 0 writes the run bundle */
        if (c.out) {
            snprintf(run_dir, sizeof run_dir, "%s", c.out);
            const char *slash = strrchr(c.out, '/');
            snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : c.out); /* claimed above */
        } else if (toy_run_create(c.runs, NULL, c.method, run_id, sizeof run_id, run_dir, sizeof run_dir) ||
                   toy_run_claim(run_dir, true, &run_lock)) { /* fresh: $TOY_RUN_ID may name a used folder */
            fprintf(stderr, "toy finetune: %s\n", toy_last_error());
            goto out;
        } else {
            made_run = true;
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/finetune.json", run_dir);
        if (toy_cli_write_json_file("finetune", cfg_json(&c), path)) goto out;
    }
    char evpath[1200];
    snprintf(evpath, sizeof evpath, "%s/events.jsonl", run_dir);
    if (rank == 0 && toy_events_open(evpath, c.resume ? TOY_EVENTS_APPEND : TOY_EVENTS_TRUNCATE, &ev)) {
        fprintf(stderr, "toy finetune: %s\n", toy_last_error());
        goto out;
    }
    if (toy_finetuner_new(m, lora, tok, data, &c.o, run_dir, ev, c.threads, &ft)) {
        fprintf(stderr, "toy finetune: %s\n", toy_last_error());
        goto out;
    }
    if (world > 1) { /* every rank starts from rank 0's trainable weights, then averages gradients */
        struct toy_tensor *const *params;
        int n = toy_finetuner_params(ft, &params);
        /* first, every rank started alike: options, examples, base model and trainable shapes (2: refused alike) */
        json_t *opts = json_pack("{s:o,s:I,s:I,s:b,s:b,s:s?,s:s?,s:s?,s:I,s:I,s:f,s:f,s:f}", "train",
                                 toy_train_opts_to_json(&c.o.train), "batch", (json_int_t)c.o.batch, "epochs",
                                 (json_int_t)c.o.epochs, "pack", !c.o.no_pack, "freeze", c.o.freeze_embeddings,
                                 "method", c.method, "targets", c.targets, "template", c.tmpl, "ctx",
                                 (json_int_t)c.ctx, "rank", (json_int_t)c.rank, "alpha", c.alpha, "dropout", c.dropout,
                                 "heldout", c.heldout);
        uint64_t fp[2] = {toy_sft_fingerprint(data), (uint64_t)n_examples};
        const struct toy_cli_agree items[] = {{"fine-tuning options", toy_cli_hash_json(opts)},
                                              {"examples", toy_cli_hash(TOY_CLI_HASH0, fp, sizeof fp)},
                                              {"base model", toy_cli_hash_gguf(m->gguf)},
                                              {"trainable shapes", toy_cli_hash_shapes(params, n)}};
        int arc = toy_cli_dp_agree("finetune", coll, items, 4);
        if (arc) {
            dp_consistent = arc == 2; /* every rank saw the difference: each ends alike, no abort */
            rc = arc;
            goto out;
        }
        if (toy_collective_broadcast_tensors(coll, params, n, 0) ||
            toy_finetuner_set_collective(ft, toy_collective_allreduce_grads, toy_collective_reduce_sum, coll)) {
            toy_cli_rank_error("finetune", rank, world);
            goto out;
        }
    }
    if (state[0] && toy_finetuner_load_state(ft, state)) {
        fprintf(stderr, "toy finetune: cannot resume from %s: %s\n", state, toy_last_error());
        goto out;
    }
    if (world > 1) { /* --resume: every rank's checkpoint is the same step (a stale copy of the run is not) */
        int64_t at = toy_finetuner_step(ft);
        const struct toy_cli_agree it = {"checkpoint (the step it resumes at)", toy_cli_hash(TOY_CLI_HASH0, &at, sizeof at)};
        int arc = toy_cli_dp_agree("finetune", coll, &it, 1);
        if (arc) {
            dp_consistent = arc == 2;
            rc = arc;
            goto out;
        }
    }
    if (c.resume && toy_finetuner_step(ft) >= toy_finetuner_steps(ft)) { /* nothing to train: the run stays */
        if (rank == 0)
            fprintf(stderr, "toy finetune: %s is complete at step %lld of %lld: give --steps N (N > %lld) to train "
                    "it further\n", c.resume, (long long)toy_finetuner_step(ft), (long long)toy_finetuner_steps(ft),
                    (long long)toy_finetuner_step(ft));
        rc = 0;
        if (c.json && rank == 0) /* a script still gets its line: the run, where it ends, no step trained now */
            rc = toy_cli_print_json("finetune", json_pack("{s:s,s:s,s:s,s:s,s:I,s:s,s:I}", "format",
                                                          "toy/finetune-v1", "run_id", run_id, "run_dir", run_dir,
                                                          "method", c.method, "steps", (json_int_t)toy_finetuner_step(ft),
                                                          "reason", "completed", "trained_steps", (json_int_t)0),
                                    JSON_COMPACT);
        goto out;
    }
    if (c.resume) toy_cli_resume_notes(); /* the run goes on: what changed */
    if (resaved) { /* what the next --resume reads, once the run is known to resume */
        char path[1200];
        snprintf(path, sizeof path, "%s/finetune.json", c.resume);
        int wrc = toy_cli_write_json_file("finetune", resaved, path); /* takes it */
        resaved = NULL;
        if (wrc) { rc = 1; goto out; }
    }
    {
        const struct toy_llama_config *mc = &m->cfg;
        int64_t trainable = lora                    ? toy_lora_n_params(lora)
                            : c.o.freeze_embeddings ? toy_llama_n_params(m) - toy_nelements(m->tok_embd)
                                                    : toy_llama_n_params(m);
        const char *slash = strrchr(c.base, '/');
        json_t *model = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:I,s:I}", "arch", mc->arch, "name",
                                  slash ? slash + 1 : c.base, "vocab", (json_int_t)mc->vocab, "d_model", (json_int_t)mc->d_model,
                                  "n_layers", (json_int_t)mc->n_layers, "n_heads", (json_int_t)mc->n_heads, "n_kv",
                                  (json_int_t)mc->n_kv_heads, "d_head", (json_int_t)toy_llama_head_dim(mc), "d_ff",
                                  (json_int_t)mc->d_ff, "weight_type", toy_dtype_name(m->layers[0].wo->type),
                                  "n_params", (json_int_t)toy_llama_n_params(m), "n_trainable", (json_int_t)trainable);
        json_t *config = cfg_json(&c);
        if (c.resume) json_object_set_new(config, "resumed_from_step", json_integer(toy_finetuner_step(ft)));
        struct toy_run_start rs = {.run_id = run_id, .phase = "train", .model = model, .config = config};
        toy_events_run_start(ev, &rs);
        json_decref(model);
        json_decref(config);
        if (!c.json)
            fprintf(stderr, "toy finetune: run %s -> %s\n              %s on %s (%s), %lld trainable of %lld parameters, "
                    "%lld train / %lld held-out examples (%lld dropped: no completion token within the context), batch %lld x %lld%s, %lld steps%s\n",
                    run_id, run_dir, c.method, c.base, toy_dtype_name(m->layers[0].wo->type), (long long)trainable,
                    (long long)toy_llama_n_params(m), (long long)toy_sft_n_train(data),
                    (long long)toy_sft_n_heldout(data), (long long)toy_sft_dropped(data), (long long)c.o.batch,
                    (long long)c.ctx, world > 1 ? " per rank" : "", (long long)toy_finetuner_steps(ft),
                    c.resume ? ", resumed" : "");
    }
    struct toy_step_progress pu = {.log_every = c.log_every > 0 ? c.log_every : 10, .json = c.json};
    toy_progress_start(&pu.pb, "finetune", toy_finetuner_steps(ft), "tok/s");
    if (c.json) pu.pb.tty = false;
    toy_finetuner_on_step(ft, toy_progress_on_step, &pu);
    struct toy_train_result res;
    started = true;
    enum toy_status st = toy_finetuner_run(ft, &res);
    toy_cli_stop_signals_restore();
    toy_progress_finish(&pu.pb);
    const char *reason = toy_run_reason_str(res.reason);
    if (c.json) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:I,s:o,s:o,s:s,s:s,s:f}", "format", "toy/finetune-v1", "run_id", run_id,
                              "run_dir", run_dir, "method", c.method, "steps", (json_int_t)res.final_step,
                              "final_loss", isfinite(res.final_loss) ? json_real(res.final_loss) : json_null(),
                              "eval_loss", isfinite(res.final_eval_loss) ? json_real(res.final_eval_loss) : json_null(),
                              "reason", reason, "checkpoint", res.checkpoint, "tokens_per_s", res.tokens_per_s);
        json_object_set_new(j, "activation_bytes", json_integer((json_int_t)toy_finetuner_activation_bytes(ft)));
        json_object_set_new(j, "trainable_bytes", json_integer((json_int_t)toy_finetuner_trainable_bytes(ft)));
        double pe = toy_finetuner_pack_efficiency(ft);
        json_object_set_new(j, "pack_efficiency", isfinite(pe) ? json_real(pe) : json_null());
        if (toy_cli_print_json("finetune", j, JSON_COMPACT)) rc = 1;
    } else {
        char held[48] = "no held-out examples";
        if (isfinite(res.final_eval_loss)) snprintf(held, sizeof held, "held-out loss %.4f", res.final_eval_loss);
        fprintf(stderr, "toy finetune: %s at step %lld: loss %.4f, %s (%.0f target tokens/s, %.1f s, "
                "%.0f%% of positions are example tokens%s)\n", reason, (long long)res.final_step, res.final_loss,
                held, res.tokens_per_s, res.seconds,
                isfinite(toy_finetuner_pack_efficiency(ft)) ? 100 * toy_finetuner_pack_efficiency(ft) : 0.0,
                c.o.no_pack ? ", unpacked" : ", packed");
        if (res.checkpoint[0])
            fprintf(stderr, "toy finetune: %s %s\n", lora ? "adapter" : "checkpoint", res.checkpoint);
    }
    if (st && res.reason != TOY_RUN_INTERRUPTED) fprintf(stderr, "toy finetune: %s\n", toy_last_error());
    rc = st ? 1 : res.reason == TOY_RUN_INTERRUPTED ? 130 : 0;
    dp_consistent = res.reason == TOY_RUN_ABORTED;
out:
    toy_finetuner_free(ft);
    toy_events_close(ev);
    toy_sft_free(data);
    toy_lora_free(lora);
    toy_tokenizer_free(tok);
    toy_llama_free(m);
    json_decref(saved);
    json_decref(resaved);
    toy_run_release(run_lock);
    if (rc && made_run && !started) /* refused: no run to resume; the folder goes if this run made it */
        toy_run_discard(c.out ? c.out : run_dir, !c.out);
    return rc;
}
