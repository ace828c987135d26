/* cmd-train.c: `toy train`: trains a Llama-family model (or GPT-2, --arch
 * gpt2) from scratch (or from a GGUF's weights) on a text or packed token
 * file, into a run bundle:
 *
 *   runs/<id>/train.json          the command's options (what --resume reads)
 *   runs/<id>/events.jsonl        the toy/v1 event stream
 *   runs/<id>/weights/step_N.gguf (+ .state.gguf, and `latest`)
 *
 * Text is tokenized with --tokenizer, or with a byte-level BPE trained on the
 * fly (--vocab-size) that is saved inside every checkpoint. On a terminal a
 * progress bar shows loss, tokens/s and ETA; in a pipe, `step N: loss=X`
 * lines. Ctrl-C stops after the current step with a checkpoint. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli-error.h"
#include "commands.h"
#include "progress.h"
#include "stop-signals.h"
#include "train-vit.h"
#include "flags.h"
#include "json-out.h"
#include "lm-data.h"
#include "paths.h"
#include "dp-agree.h"
#include "resume.h"
#include "toy/collective.h"
#include "toy/data.h"
#include "toy/events.h"
#include "toy/finetune.h"
#include "toy/gguf.h"
#include "toy/gpt2.h"
#include "toy/run-dir.h"
#include "toy/toy.h"
#include "toy/trace.h"
#include "toy/trainer.h"


/* Resuming a warm-started run whose donor had another width: the learned
 * projection is attached again (its frozen donor rows come from the donor
 * file), then the state file restores the projection and the residual
 * embedding exactly. Equal widths need nothing (the run trains plain
 * embeddings). */
static int warm_resume(struct toy_llama *m, const struct toy_tokenizer *tok, const char *donor, const char *state) {
    struct toy_gguf *g;
    /* states written before projections were saved: continue from the folded table */
    if (toy_gguf_open(state, &g)) return 0; /* the trainer reports it */
    bool saved = toy_gguf_find_tensor(g, "toy.param.token_embd_proj.weight") >= 0;
    toy_gguf_close(g);
    if (!saved) return 0;
    if (toy_gguf_open(donor, &g)) {
        fprintf(stderr, "toy train: cannot resume the warm-started run: %s\n", toy_last_error());
        return 1;
    }
    int64_t ti = toy_gguf_find_tensor(g, "token_embd.weight");
    int64_t dd = ti >= 0 ? toy_gguf_tensor(g, ti)->ne[0] : 0;
    toy_gguf_close(g);
    if (dd == m->cfg.d_model) return 0;
    if (toy_llama_warm_start(m, tok, donor, NULL)) {
        fprintf(stderr, "toy train: cannot resume the warm-started run: %s\n", toy_last_error());
        return 1;
    }
    return 0;
}

static int usage_to(FILE *f) {
    fprintf(f,
"usage: toy train --data FILE [options]          train from scratch\n"
"       toy train --resume runs/<id> [--steps N]  continue a run, bit-identically\n"
"data:      --data FILE (text, or a TOYT token file from `toy tokenize --corpus`; a pipe too)\n"
"           --no-bos (text: no BOS first, where the tokenizer asks for one; toy tokenize --corpus --no-bos)\n"
"           --tokenizer PATH (GGUF, tokenizer.json or folder; a pipe too) | --vocab-size N (BPE trained on the fly; 512)\n"
"           --heldout 0.1 (fraction held out for eval)\n"
"model:     --arch llama|gpt2|vit (GPT-2 presets: tiny|small|124m; vit: toy train --arch vit --help)\n"
"           --preset tiny|small|stories15m|smollm2-135m  --dim D --layers L --heads H --kv-heads K --ff F\n"
"           --experts E --experts-used 2 (a mixture of experts, Mixtral's routing) --moe-aux 0.01 (its\n"
"           load-balancing loss weight; 0: off)\n"
"           --init MODEL.gguf (start from these weights instead of random)\n"
"           --warm-start DONOR.gguf (token embeddings from a donor, matched by token; a learned projection,\n"
"           initialised by PCA, when widths differ)\n"
"training:  --steps 1000 --batch 8 --ctx 128 --accum 1 --lr 3e-3 --lr-min 3e-4 --warmup 50\n"
"           --schedule cosine|linear|constant --wd 0.1 --beta1 0.9 --beta2 0.95 --clip 1.0 --seed 1337\n"
"           --bf16 (bf16 matmuls, f32 master weights) --threads N\n"
"parallel:  mpirun -np N toy train ... (a `make MPI=1` build; --batch is per rank) --dp-timeout 300 (s)\n"
"           --dp-overlap 1 (all-reduce during the backward pass; 0: after it) --dp-bucket-mb 16\n"
"           --zero 0|1 (1: ZeRO-1, AdamW moments sharded over the ranks)\n"
"output:    --eval-every 100 --eval-batches 20 --ckpt-every 0 --runs DIR (runs) --out DIR\n"
"           --sample TEXT --sample-tokens 64 --log-every 10 --json\n"
"profiling: --trace out.json (Chrome trace: every op, thread and step; open in Perfetto) --op-timing\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

struct cfg {
    const char *data, *tokenizer, *preset, *init, *runs, *out, *resume, *sample, *trace, *arch, *warm;
    int64_t vocab_size, dim, layers, heads, kv_heads, ff, batch, ctx, experts, experts_used;
    double heldout;
    int threads, log_every;
    double dp_timeout; /* data parallelism: seconds a collective may wait */
    int dp_overlap;    /* 1: all-reduce buckets during the backward pass */
    double dp_bucket_mb;
    int zero;          /* 1: ZeRO-1 */
    int64_t world;     /* ranks (train.json: of the run that wrote it) */
    bool json;
    bool no_bos;       /* text: no BOS first (--no-bos; a run from before train.json's data_bos) */
    int text_bos;      /* text data: whether its stream starts with BOS (train.json's data_bos); -1: a token file */
    struct toy_train_opts o;
    json_t *keep;      /* --resume: the run's train.json, which the strings above point into */
    const char *data_fingerprint; /* toy_data_fingerprint in hex: train.json's, or this run's */
    int64_t data_tokens;
};

static json_t *cfg_json(const struct cfg *c) {
    json_t *j = json_pack("{s:s?,s:s?,s:s?,s:s?,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:f}", "data", c->data, "tokenizer",
                          c->tokenizer, "preset", c->preset, "init", c->init, "vocab_size", (json_int_t)c->vocab_size,
                          "dim", (json_int_t)c->dim, "layers", (json_int_t)c->layers, "heads", (json_int_t)c->heads,
                          "kv_heads", (json_int_t)c->kv_heads, "ff", (json_int_t)c->ff, "batch", (json_int_t)c->batch,
                          "ctx", (json_int_t)c->ctx, "heldout", c->heldout);
    json_object_set_new(j, "train", toy_train_opts_to_json(&c->o));
    int64_t world = c->world > 0 ? c->world : 1; /* the global batch: rows per optimizer step over all ranks */
    json_object_set_new(j, "world", json_integer(world));
    json_object_set_new(j, "global_batch", json_integer(c->batch * world * (c->o.accum > 0 ? c->o.accum : 1)));
    json_object_set_new(j, "threads", json_integer(toy_threads_resolve(c->threads))); /* float sums depend on it */
    if (c->arch) json_object_set_new(j, "arch", json_string(c->arch));
    if (c->experts) {
        json_object_set_new(j, "experts", json_integer(c->experts));
        json_object_set_new(j, "experts_used", json_integer(c->experts_used));
    }
    if (c->warm) json_object_set_new(j, "warm_start", json_string(c->warm)); /* resume re-attaches its projection */
    if (c->text_bos >= 0) json_object_set_new(j, "data_bos", json_boolean(c->text_bos)); /* how --resume encodes it */
    if (c->data_fingerprint) { /* --resume refuses other data */
        json_object_set_new(j, "data_tokens", json_integer(c->data_tokens));
        json_object_set_new(j, "data_fingerprint", json_string(c->data_fingerprint));
    }
    return j;
}

/* reads back what cfg_json wrote (strings point into c->keep) */
static void cfg_from_json(struct cfg *c, json_t *j) {
    json_t *v;
    c->keep = json_incref(j);
#define STR(k, f) if ((v = json_object_get(j, k)) && json_is_string(v)) c->f = json_string_value(v)
#define INT(k, f) if ((v = json_object_get(j, k)) && json_is_integer(v)) c->f = json_integer_value(v)
    STR("data", data);
    STR("tokenizer", tokenizer);
    STR("preset", preset);
    STR("init", init);
    STR("arch", arch);
    STR("warm_start", warm);
    STR("data_fingerprint", data_fingerprint);
    INT("data_tokens", data_tokens);
    INT("vocab_size", vocab_size);
    INT("dim", dim);
    INT("layers", layers);
    INT("heads", heads);
    INT("kv_heads", kv_heads);
    INT("ff", ff);
    INT("experts", experts);
    INT("experts_used", experts_used);
    INT("batch", batch);
    INT("ctx", ctx);
    INT("world", world);
    INT("threads", threads);
#undef STR
#undef INT
    if ((v = json_object_get(j, "heldout"))) c->heldout = json_number_value(v);
    /* a text trains on the stream it trained on: a run from before data_bos was recorded had no BOS first */
    v = json_object_get(j, "data_bos");
    c->no_bos = !json_is_true(v);
    c->text_bos = json_is_boolean(v) ? json_is_true(v) : -1; /* kept when train.json is written again */
    if ((v = json_object_get(j, "train"))) toy_train_opts_from_json(&c->o, v);
    if ((v = json_object_get(json_object_get(j, "train"), "sample_prompt")) && json_is_string(v) &&
        json_string_length(v))
        c->sample = json_string_value(v);
}

/* Largest counts a flag takes: sizes far past any machine, still exact in a double. */
#define BIG 1e12
#define DIM 1048576.0

static int parse(int argc, char **argv, struct cfg *c, bool *given_steps) {
    const char *schedule = NULL;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("--data", &c->data), TOY_FLAG_S("--tokenizer", &c->tokenizer), TOY_FLAG_S("--preset", &c->preset),
        TOY_FLAG_S("--init", &c->init), TOY_FLAG_S("--warm-start", &c->warm), TOY_FLAG_S("--runs", &c->runs),
        TOY_FLAG_S("--out", &c->out), TOY_FLAG_S("--resume", &c->resume), TOY_FLAG_S("--sample", &c->sample),
        TOY_FLAG_S("--trace", &c->trace), TOY_FLAG_S("--arch", &c->arch), TOY_FLAG_S("--schedule", &schedule),
        TOY_FLAG_B("--bf16", &c->o.bf16), TOY_FLAG_B("--json", &c->json), TOY_FLAG_B("--op-timing", &c->o.op_timing),
        TOY_FLAG_B("--no-bos", &c->no_bos),
        TOY_FLAG_N("--vocab-size", TOY_CLI_I64, &c->vocab_size, 1, INT32_MAX),
        TOY_FLAG_N("--dim", TOY_CLI_I64, &c->dim, 0, DIM), TOY_FLAG_N("--layers", TOY_CLI_I64, &c->layers, 0, 65536),
        TOY_FLAG_N("--heads", TOY_CLI_I64, &c->heads, 0, 65536),
        TOY_FLAG_N("--kv-heads", TOY_CLI_I64, &c->kv_heads, 0, 65536),
        TOY_FLAG_N("--ff", TOY_CLI_I64, &c->ff, 0, 16 * DIM), TOY_FLAG_N("--batch", TOY_CLI_I64, &c->batch, 1, DIM),
        TOY_FLAG_N("--experts", TOY_CLI_I64, &c->experts, 0, 4096),
        TOY_FLAG_N("--experts-used", TOY_CLI_I64, &c->experts_used, 1, 64),
        TOY_FLAG_N("--moe-aux", TOY_CLI_F32, &c->o.moe_aux, 0, 1e6),
        TOY_FLAG_N("--ctx", TOY_CLI_I64, &c->ctx, 1, 16 * DIM),
        TOY_FLAG_OPEN("--heldout", TOY_CLI_F64, &c->heldout, 0, 1),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &c->threads, 0, 4096),
        TOY_FLAG_N("--log-every", TOY_CLI_INT, &c->log_every, 0, INT32_MAX),
        TOY_FLAG_N("--dp-timeout", TOY_CLI_F64, &c->dp_timeout, 0, 1e9),
        TOY_FLAG_N("--dp-overlap", TOY_CLI_INT, &c->dp_overlap, 0, 1),
        TOY_FLAG_N("--dp-bucket-mb", TOY_CLI_F64, &c->dp_bucket_mb, 0, 1024),
        TOY_FLAG_N("--zero", TOY_CLI_INT, &c->zero, 0, 1), TOY_FLAG_N("--accum", TOY_CLI_I64, &c->o.accum, 1, DIM),
        TOY_FLAGS_OPTIM(c->o, BIG), TOY_FLAG_N("--eval-batches", TOY_CLI_I64, &c->o.eval_batches, 0, BIG),
        TOY_FLAG_N("--sample-tokens", TOY_CLI_I32, &c->o.sample_tokens, 0, INT32_MAX),
        TOY_FLAG_NG("--steps", TOY_CLI_I64, &c->o.steps, 0, BIG, given_steps),
        TOY_FLAG_END,
    };
    int rc = toy_cli_parse("train", argc, argv, flags, NULL, 0, NULL);
    if (rc == 1) usage_to(stdout); /* asked for: the help goes to standard output */
    if (rc) return rc;
    if (c->o.bf16) toy_cli_bf16_math();
    if (c->experts_used && !c->experts) {
        fprintf(stderr, "toy train: --experts-used needs --experts (how many experts a layer has)\n");
        return 2;
    }
    if (c->experts && !c->experts_used) c->experts_used = c->experts < 2 ? c->experts : 2;
    if (schedule) {
        int k = toy_lr_kind_from_name(schedule);
        if (k < 0) { fprintf(stderr, "toy train: --schedule is cosine, linear or constant, not '%s'\n", schedule); return 2; }
        c->o.schedule = (enum toy_lr_kind)k;
    }
    return 0;
}

/* The shape of a new model: the preset's with the flags' overrides
 * (d_model 0: an unknown preset). */
static struct toy_gpt2_config gpt2_config(const struct cfg *c, int64_t vocab) {
    struct toy_gpt2_config gc = toy_gpt2_preset(c->preset);
    if (!gc.d_model) return gc;
    if (c->dim) gc.d_model = c->dim;
    if (c->layers) gc.n_layers = c->layers;
    if (c->heads) gc.n_heads = c->heads;
    if (c->ff) gc.d_ff = c->ff;
    gc.vocab = vocab;
    if (gc.max_ctx < c->ctx) gc.max_ctx = c->ctx;
    return gc;
}

static struct toy_llama_config llama_config(const struct cfg *c, int64_t vocab) {
    struct toy_llama_config mc = toy_llama_preset(c->preset);
    if (!mc.d_model) return mc;
    if (c->dim) mc.d_model = c->dim;
    if (c->layers) mc.n_layers = c->layers;
    if (c->heads) mc.n_heads = c->heads;
    mc.n_kv_heads = c->kv_heads ? c->kv_heads : c->heads ? c->heads : mc.n_kv_heads;
    if (c->ff) mc.d_ff = c->ff;
    if (c->experts) { /* Mixtral's routing: softmax, the top k renormalised; written as a "llama" with experts */
        mc.n_experts = c->experts;
        mc.n_experts_used = c->experts_used;
        mc.moe_norm = true;
    }
    mc.vocab = vocab;
    if (mc.max_ctx < c->ctx) mc.max_ctx = c->ctx;
    return mc;
}

/* A GPT-2 for --arch gpt2: the checkpoint's or --init's weights, else a
 * random one of the preset's shape with the flags' overrides. */
static struct toy_gpt2 *train_gpt2_model(const struct cfg *c, const char *ckpt, struct toy_data *data) {
    struct toy_gpt2 *g = NULL;
    if (ckpt[0] || c->init) {
        if (toy_gpt2_load(ckpt[0] ? ckpt : c->init, true, &g)) fprintf(stderr, "toy train: %s\n", toy_last_error());
        return g;
    }
    struct toy_gpt2_config gc = gpt2_config(c, toy_data_vocab(data));
    if (!gc.d_model) { fprintf(stderr, "toy train: unknown GPT-2 preset '%s' (tiny, small, 124m)\n", c->preset); return NULL; }
    if (!(g = toy_gpt2_new(&gc, c->o.seed))) fprintf(stderr, "toy train: %s\n", toy_last_error());
    return g;
}

/* Resuming on another number of ranks keeps the global batch (the data
 * sampler's state is only valid for it): the per-rank batch becomes
 * batch x ranks-then / ranks-now, which must come out whole. */
static int dp_resize(struct cfg *c, int world) {
    int64_t then = c->world > 0 ? c->world : 1, global = c->batch * then;
    if (global % world) {
        fprintf(stderr, "toy train: cannot resume on %d ranks: the run's global batch is %lld rows (%lld per rank x "
                "%lld ranks), which %d ranks cannot split evenly; resume on a number of ranks that divides %lld\n",
                world, (long long)global, (long long)c->batch, (long long)then, world, (long long)global);
        return 1;
    }
    c->batch = global / world;
    return 0;
}

/* Every rank starts from rank 0's weights; then the trainer all-reduces the
 * gradients (overlapped with the backward pass unless --dp-overlap 0;
 * ZeRO-1 with --zero 1) and sums its per-step scalars through the
 * collective. Before the state is loaded: a sharded optimizer reads its part. */
static int dp_setup(struct toy_collective *coll, struct toy_trainer *tr, const struct cfg *c, struct toy_data *data) {
    int rank = toy_collective_rank(coll), world = toy_collective_world(coll);
    if (world == 1) return 0;
    struct toy_tensor *const *params;
    int n = toy_trainer_params(tr, &params);
    /* every rank started alike: the same options, data and model shapes (2: refused alike on every rank) */
    json_t *opts = json_pack("{s:o,s:I,s:I,s:f,s:i,s:f,s:i}", "train", toy_train_opts_to_json(&c->o), "batch",
                             (json_int_t)c->batch, "ctx", (json_int_t)c->ctx, "heldout", c->heldout, "dp_overlap",
                             c->dp_overlap, "dp_bucket_mb", c->dp_bucket_mb, "zero", c->zero);
    uint64_t fp[2] = {toy_data_fingerprint(data), (uint64_t)toy_data_count(data)};
    const struct toy_cli_agree items[] = {{"training options", toy_cli_hash_json(opts)},
                                          {"data", toy_cli_hash(TOY_CLI_HASH0, fp, sizeof fp)},
                                          {"model shapes", toy_cli_hash_shapes(params, n)}};
    int arc = toy_cli_dp_agree("train", coll, items, 3);
    if (arc) return arc;
    enum toy_status st = toy_collective_broadcast_tensors(coll, params, n, 0);
    if (!st) st = toy_trainer_use_collective(tr, coll, &(struct toy_dp_opts){.overlap = c->dp_overlap != 0, .zero = c->zero});
    if (st) toy_cli_rank_error("train", rank, world);
    return st ? 1 : 0;
}

int toy_cmd_train(int argc, char **argv) {
    if (toy_train_is_vit(argc, argv)) { /* image classification: cli/train-vit.c */
        const char *ranks = getenv("OMPI_COMM_WORLD_SIZE") ? getenv("OMPI_COMM_WORLD_SIZE") : getenv("PMI_SIZE");
        if (ranks && atoi(ranks) > 1) { /* N independent runs would write over each other */
            fprintf(stderr, "toy train --arch vit: not data-parallel yet (docs/distributed.md): run one process\n");
            return 2;
        }
        return toy_train_vit(argc, argv);
    }
    struct cfg c = {.runs = "runs", .vocab_size = 512, .batch = 8, .ctx = 128, .heldout = 0.1, .log_every = 10,
                    .preset = "small", .dp_overlap = 1, .text_bos = -1};
    c.o = (struct toy_train_opts){.steps = 1000, .accum = 1, .lr = 3e-3f, .lr_min = 3e-4f, .warmup = 50,
                                  .schedule = TOY_LR_COSINE, .weight_decay = 0.1f, .beta1 = 0.9f, .beta2 = 0.95f,
                                  .eps = 1e-8f, .clip = 1.0f, .seed = 1337, .eval_every = 100, .eval_batches = 20,
                                  .sample_tokens = 64, .moe_aux = 0.01f};
    bool given_steps = false;
    int rc = parse(argc, argv, &c, &given_steps);
    if (rc) return rc == 1 ? 0 : rc;

    /* data parallelism: under mpirun (in a `make MPI=1` build) this is one rank of many */
    struct toy_collective *coll = NULL;
    bool dp_consistent = false; /* a failure every rank saw alike (a NaN loss): finalize, no abort */
    struct toy_collective_opts copt = {.timeout_s = c.dp_timeout, .bucket_bytes = (size_t)(c.dp_bucket_mb * 1048576.0)};
    if (c.dp_bucket_mb > 0 && copt.bucket_bytes < 64) copt.bucket_bytes = 64;
    if (toy_collective_open(TOY_COLLECTIVE_AUTO, &copt, &coll)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        return 1;
    }
    const int rank = toy_collective_rank(coll), world = toy_collective_world(coll);
    char run_dir[1024] = "", run_id[1024] = "", ckpt[1600] = "", state[1700] = "";
    struct cfg cli = c;
    int run_lock = -1; /* toy_run_claim's: one process writes a run */
    bool made_run = false, started = false; /* a new run folder; its first step began */
    /* from here on every way out goes through `out`, which releases what exists (the collective included) */
    struct toy_tokenizer *tok = NULL;
    struct toy_data *data = NULL;
    struct toy_cli_data in = {0}; /* --data, read once */
    struct toy_llama *m = NULL;
    struct toy_gpt2 *g2 = NULL;
    struct toy_events *ev = NULL;
    struct toy_trainer *tr = NULL;
    json_t *resaved = NULL; /* --resume: train.json to write back (new --steps or thread count) */
    if (c.resume) {
        /* the run's own options, then the flags given now (e.g. more --steps) */
        json_t *j = toy_cli_resume_load("train", c.resume, "train.json");
        if (!j) { rc = 1; goto out; }
        /* what train.json leaves out is the run's default, not a flag given now (those are ignored, below) */
        c.arch = c.warm = c.init = c.tokenizer = c.sample = NULL;
        c.dim = c.layers = c.heads = c.kv_heads = c.ff = 0;
        cfg_from_json(&c, j);
        json_decref(j);
        if (rank == 0 && toy_run_claim(c.resume, false, &run_lock)) { /* rank 0 writes the run */
            fprintf(stderr, "toy train: cannot resume: %s\n", toy_last_error());
            rc = 1;
            goto out;
        }
        int64_t run_steps = c.o.steps;
        if (given_steps) c.o.steps = cli.o.steps;
        static const char *const applies[] = {"--resume", "--steps", "--threads", "--dp-overlap", "--dp-bucket-mb",
                                              "--zero", "--json", "--log-every", "--dp-timeout", "--trace",
                                              "--op-timing", NULL};
        if (rank == 0)
            toy_cli_resume_ignored("train", argc, argv, applies, "train.json",
                                   "--steps, --threads, --log-every, --json, --trace, --op-timing, --zero and the --dp-* "
                                   "flags");
        /* the run's thread count unless --threads says otherwise: the gradient norm's float sum depends on
         * how the work is split, so another count changes the losses in their last bits */
        int run_threads = c.threads;
        if (cli.threads > 0 || c.threads <= 0) c.threads = cli.threads;
        bool changed = rank == 0 && toy_cli_resume_changes("train", run_threads, c.threads, run_steps, c.o.steps,
                                                           c.o.schedule == TOY_LR_CONSTANT);
        resaved = changed ? cfg_json(&c) : NULL; /* as the run records it: before dp_resize's per-rank view */
        c.dp_overlap = cli.dp_overlap; /* how the ranks share work: chosen anew by each launch */
        c.dp_bucket_mb = cli.dp_bucket_mb;
        c.zero = cli.zero;
        c.json = cli.json;
        c.log_every = cli.log_every;
        if (dp_resize(&c, world)) { rc = 1; goto out; }
        snprintf(run_dir, sizeof run_dir, "%s", c.resume);
        const char *slash = strrchr(run_dir, '/');
        snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : run_dir);
        char path[1200], target[512];
        snprintf(path, sizeof path, "%s/weights/latest", run_dir);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) { fprintf(stderr, "toy train: cannot resume: %s has no weights/latest checkpoint\n", run_dir); rc = 1; goto out; }
        target[n] = 0;
        snprintf(ckpt, sizeof ckpt, "%s/weights/%s", run_dir, target);
        snprintf(state, sizeof state, "%.*s.state.gguf", (int)(strlen(ckpt) - 5), ckpt);
        struct toy_gguf *probe; /* named as the checkpoint, before its tokenizer or weights are read from it */
        if (toy_gguf_open(ckpt, &probe)) {
            fprintf(stderr, "toy train: cannot resume: the checkpoint weights/latest points to: %s\n", toy_last_error());
            rc = 1;
            goto out;
        }
        toy_gguf_close(probe);
    }
    c.world = world;
    if (rank != 0) { /* rank 0 alone reports; errors still reach stderr */
        c.json = true;
        if (!freopen("/dev/null", "w", stdout)) { rc = 1; goto out; }
    }
    if (!c.threads && world > 1 && !getenv("TOY_THREADS")) c.threads = toy_collective_threads(coll);
    if (!c.data) {
        fprintf(stderr, "toy train: --data FILE is required\n");
        if (rank == 0) usage();
        rc = 2;
        goto out;
    }
    if ((rc = toy_cli_dp_input("train", "--data", c.data, world))) goto out;
    rc = 1; /* what a `goto out` below means */
    /* the model's shape, checked now: the data (a BPE vocabulary to learn) may take a while */
    bool is_gpt2 = c.arch && !strcmp(c.arch, "gpt2");
    if (c.arch && !is_gpt2 && strcmp(c.arch, "llama")) {
        fprintf(stderr, "toy train: unknown --arch '%s' (llama, gpt2, vit)\n", c.arch);
        rc = 2;
        goto out;
    }
    if (!ckpt[0] && !c.init) {
        int64_t v = c.vocab_size > 0 ? c.vocab_size : 512; /* the data's, known later; its range is checked then */
        struct toy_gpt2_config gc = is_gpt2 ? gpt2_config(&c, v) : (struct toy_gpt2_config){0};
        struct toy_llama_config mc = is_gpt2 ? (struct toy_llama_config){0} : llama_config(&c, v);
        if (is_gpt2 ? !gc.d_model : !mc.d_model) {
            fprintf(stderr, "toy train: unknown %spreset '%s' (%s)\n", is_gpt2 ? "GPT-2 " : "", c.preset,
                    is_gpt2 ? "tiny, small, 124m" : "tiny, small, stories15m, smollm2-135m");
            rc = 2;
            goto out;
        }
        if (is_gpt2 ? toy_gpt2_check_config(&gc) : toy_llama_check_config(&mc)) {
            fprintf(stderr, "toy train: %s\n", toy_last_error());
            rc = 2;
            goto out;
        }
    }
    if (toy_cli_check_input("train", c.data)) { rc = 1; goto out; } /* a folder read as empty text */
    if (toy_cli_one_stream("train", "--data", c.data, "--tokenizer", c.tokenizer)) { rc = 2; goto out; }
    char abs_data[PATH_MAX], abs_tok[PATH_MAX], abs_init[PATH_MAX], abs_warm[PATH_MAX];
    if (!c.resume) { /* train.json keeps them, and --resume may run from another folder */
        c.data = toy_cli_abspath(c.data, abs_data, sizeof abs_data);
        c.tokenizer = toy_cli_abspath(c.tokenizer, abs_tok, sizeof abs_tok);
        c.init = toy_cli_abspath(c.init, abs_init, sizeof abs_init);
        c.warm = toy_cli_abspath(c.warm, abs_warm, sizeof abs_warm);
    }
    /* a new run's folder: claimed once the flags are known good, before any slow work, so that an old run
     * there is refused at once */
    if (!c.resume && c.out && rank == 0 && toy_run_claim(c.out, true, &run_lock)) {
        fprintf(stderr, "toy train: --out %s\n", toy_last_error());
        rc = 1;
        goto out;
    }
    if (!c.resume && c.out && rank == 0) made_run = true;
    c.o.sample_prompt = c.sample;
    c.o.stop = &toy_cli_stop;

    /* ---- tokenizer and data ---- */
    rc = 1;
    struct toy_data_opts dopt = {.batch = c.batch, .ctx = c.ctx, .heldout = c.heldout, .seed = c.o.seed,
                                 .rank = rank, .world = world};
    /* read once: --data may be a pipe (/dev/stdin) */
    if (toy_cli_data_read("train", c.data, &in)) goto out;
    bool packed = in.packed;
    const char *tok_src = ckpt[0] ? ckpt : c.init ? c.init : c.tokenizer;
    if (tok_src && toy_tokenizer_load(tok_src, &tok)) {
        if (!packed || c.tokenizer) { fprintf(stderr, "toy train: tokenizer: %s\n", toy_cli_error("train: tokenizer")); rc = 1; goto out; }
        tok = NULL; /* a token file needs none; samples are then skipped */
    }
    if (packed) {
        if (toy_cli_data_load(&in, NULL, 0, &dopt, &data)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        /* ids of another vocabulary would be trained as this tokenizer's tokens, and saved with it */
        if (tok && toy_data_vocab(data) != toy_tokenizer_n_vocab(tok)) {
            fprintf(stderr, "toy train: %s holds ids of a %lld-token vocabulary, the tokenizer of %s has %lld tokens: "
                    "tokenize the text with that tokenizer (toy tokenize -m %s --corpus ...), or train with the one that "
                    "made the file\n", c.data, (long long)toy_data_vocab(data), tok_src,
                    (long long)toy_tokenizer_n_vocab(tok), tok_src);
            goto out;
        }
        if (!tok && !c.resume)
            fprintf(stderr, "toy train: warning: %s holds token ids without their tokenizer, so the checkpoints will "
                    "have none (generating or evaluating text needs one): give the one that made it with --tokenizer\n",
                    c.data);
    } else {
        if (!tok) {
            struct toy_bpe_train_opts bo = {.vocab_size = c.vocab_size};
            if (!c.json && !c.resume) fprintf(stderr, "toy train: learning a %lld-token byte-level BPE vocabulary from %s\n",
                                               (long long)c.vocab_size, c.data);
            if (toy_tokenizer_train_bpe(in.bytes, in.len, &bo, &tok)) {
                fprintf(stderr, "toy train: tokenizer training: %s\n", toy_last_error());
                goto out;
            }
        }
        /* BOS as the tokenizer says, as toy tokenize --corpus puts it, unless --no-bos; a run resumed from
         * before train.json recorded data_bos trained on text without it, and goes on so (cfg_from_json) */
        unsigned fl = c.no_bos ? TOY_ENCODE_NO_BOS : 0;
        if (toy_cli_data_load(&in, tok, fl, &dopt, &data)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        c.text_bos = toy_tokenizer_corpus_bos(tok, fl) ? 1 : 0;
    }
    toy_cli_data_free(&in); /* the ids are the loader's */

    /* a resumed run continues on the tokens it trained on: another file's would be drawn at the saved
     * positions, and its held-out split would be another one */
    char fingerprint[17], saved[1100];
    snprintf(saved, sizeof saved, "%s/train.json", c.resume ? c.resume : "");
    if (toy_cli_resume_data("train", c.data, toy_data_fingerprint(data), toy_data_count(data), "tokens",
                            c.resume ? c.data_fingerprint : NULL, c.data_tokens, saved, fingerprint))
        goto out;
    c.data_fingerprint = fingerprint;
    c.data_tokens = toy_data_count(data);

    /* ---- model ---- */
    if (is_gpt2) {
        if (!(g2 = train_gpt2_model(&c, ckpt, data))) goto out;
    } else if (ckpt[0] || c.init) {
        if (toy_llama_load(ckpt[0] ? ckpt : c.init, true, &m)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        if (ckpt[0] && c.warm && warm_resume(m, tok, c.warm, state)) goto out;
    } else {
        struct toy_llama_config mc = llama_config(&c, toy_data_vocab(data));
        if (!mc.d_model) { fprintf(stderr, "toy train: unknown preset '%s'\n", c.preset); goto out; }
        if (!(m = toy_llama_new(&mc, c.o.seed))) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        struct toy_warm_start_report wr;
        if (c.warm && toy_llama_warm_start(m, tok, c.warm, &wr)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        if (c.warm && !c.json)
            fprintf(stderr, "toy train: warm start from %s: %lld of %lld token embeddings (d %lld -> %lld%s)\n", c.warm,
                    (long long)wr.mapped, (long long)(wr.mapped + wr.unmapped), (long long)wr.donor_d,
                    (long long)wr.model_d, wr.learned ? ", learned projection from the PCA" : wr.projected ? ", PCA" : "");
    }

    {
        /* without a tokenizer to match the ids against, the model's own vocabulary must be the data's */
        int64_t mv = g2 ? g2->cfg.vocab : m->cfg.vocab;
        if (!tok && toy_data_vocab(data) != mv) {
            fprintf(stderr, "toy train: %s holds ids of a %lld-token vocabulary, the model (%s) has %lld: its rows "
                    "would be trained as other tokens\n", c.data, (long long)toy_data_vocab(data),
                    ckpt[0] ? ckpt : c.init ? c.init : "new", (long long)mv);
            goto out;
        }
    }

    /* ---- the run bundle ---- */
    /* from here on a stop request ends the run with a checkpoint and run_end */
    toy_cli_stop_signals_install();
    if (!run_dir[0] && rank == 0) { /* rank 0 writes the run bundle */
        if (c.out) {
            snprintf(run_dir, sizeof run_dir, "%s", c.out);
            const char *slash = strrchr(c.out, '/');
            snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : c.out); /* claimed above */
        } else if (toy_run_create(c.runs, NULL, is_gpt2 ? "gpt2" : "llama", run_id, sizeof run_id, run_dir, sizeof run_dir) ||
                   toy_run_claim(run_dir, true, &run_lock)) { /* fresh: $TOY_RUN_ID may name a used folder */
            fprintf(stderr, "toy train: %s\n", toy_last_error());
            goto out;
        } else {
            made_run = true;
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/train.json", run_dir);
        if (toy_cli_write_json_file("train", cfg_json(&c), path)) goto out;
    }
    char evpath[1200];
    snprintf(evpath, sizeof evpath, "%s/events.jsonl", run_dir);
    if (rank == 0 && toy_events_open(evpath, c.resume ? TOY_EVENTS_APPEND : TOY_EVENTS_TRUNCATE, &ev)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    struct toy_trace *trace = NULL;
    if (cli.trace && rank == 0 && toy_trace_open(cli.trace, 0, &trace)) { /* rank 0 traces; the ranks run the same graph */
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    c.o.trace = trace;
    c.o.op_timing = cli.o.op_timing;
    struct toy_lm lm = g2 ? toy_gpt2_lm(g2) : toy_llama_lm(m);
    if (toy_trainer_new_lm(&lm, tok, data, &c.o, run_dir, ev, c.threads, &tr)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    if ((rc = dp_setup(coll, tr, &c, data))) {
        dp_consistent = rc == 2; /* every rank saw the difference: each ends alike, no abort */
        goto out;
    }
    rc = 1; /* what a `goto out` below means */
    if (state[0] && toy_trainer_load_state(tr, state)) {
        fprintf(stderr, "toy train: cannot resume from %s: %s\n", state, toy_last_error());
        goto out;
    }
    if (world > 1) { /* --resume: every rank's checkpoint is the same step (a stale copy of the run is not) */
        int64_t at = toy_trainer_step(tr);
        const struct toy_cli_agree it = {"checkpoint (the step it resumes at)", toy_cli_hash(TOY_CLI_HASH0, &at, sizeof at)};
        int arc = toy_cli_dp_agree("train", coll, &it, 1);
        if (arc) {
            rc = arc;
            dp_consistent = arc == 2;
            goto out;
        }
    }
    if (c.resume && toy_trainer_step(tr) >= c.o.steps) { /* nothing to train: the run stays as it is */
        if (rank == 0)
            fprintf(stderr, "toy train: %s is complete at step %lld of %lld: give --steps N (N > %lld) to train it "
                    "further\n", c.resume, (long long)toy_trainer_step(tr), (long long)c.o.steps,
                    (long long)toy_trainer_step(tr));
        rc = 0;
        if (c.json && rank == 0) /* a script still gets its line: the run, where it ends, no step trained now */
            rc = toy_cli_print_json("train", json_pack("{s:s,s:s,s:s,s:I,s:s,s:I}", "format", "toy/train-v1", "run_id",
                                                       run_id, "run_dir", run_dir, "steps",
                                                       (json_int_t)toy_trainer_step(tr), "reason", "completed",
                                                       "trained_steps", (json_int_t)0),
                                    JSON_COMPACT);
        goto out;
    }
    if (c.resume) toy_cli_resume_notes(); /* the run goes on: what changed */
    if (resaved) { /* what the next --resume continues with, once the run is known to resume */
        char saved[1200];
        snprintf(saved, sizeof saved, "%s/train.json", c.resume);
        int wrc = toy_cli_write_json_file("train", resaved, saved); /* takes it */
        resaved = NULL;
        if (wrc) { rc = 1; goto out; }
    }
    {
        struct toy_llama_config shown = {.vocab = lm.vocab}; /* GPT-2's numbers in the same summary */
        if (g2) {
            snprintf(shown.arch, sizeof shown.arch, "gpt2");
            shown.d_model = g2->cfg.d_model;
            shown.n_layers = g2->cfg.n_layers;
            shown.n_heads = shown.n_kv_heads = g2->cfg.n_heads;
            shown.d_ff = g2->cfg.d_ff;
        }
        const struct toy_llama_config *mc = g2 ? &shown : &m->cfg;
        int64_t n_params = g2 ? toy_gpt2_n_params(g2) : toy_llama_n_params(m);
        json_t *model = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:I}", "arch", mc->arch, "name", "toy",
                                  "vocab", (json_int_t)mc->vocab, "d_model", (json_int_t)mc->d_model, "n_layers",
                                  (json_int_t)mc->n_layers, "n_heads", (json_int_t)mc->n_heads, "n_kv",
                                  (json_int_t)mc->n_kv_heads, "d_head", (json_int_t)toy_llama_head_dim(mc), "d_ff",
                                  (json_int_t)mc->d_ff, "weight_type", c.o.bf16 ? "bf16" : "f32", "n_params",
                                  (json_int_t)n_params);
        json_t *config = cfg_json(&c);
        if (c.resume) json_object_set_new(config, "resumed_from_step", json_integer(toy_trainer_step(tr)));
        if (world > 1) {
            json_object_set_new(config, "dp_overlap", json_boolean(c.dp_overlap != 0));
            json_object_set_new(config, "zero", json_integer(c.zero));
        }
        json_object_set_new(config, "optim_state_bytes_per_rank", json_integer((json_int_t)toy_trainer_optim_state_bytes(tr)));
        struct toy_run_start rs = {.run_id = run_id, .phase = "train", .model = model, .config = config};
        if (ev) toy_events_run_start(ev, &rs);
        json_decref(model);
        json_decref(config);
        if (!c.json)
            fprintf(stderr, "toy train: run %s -> %s\n           %lld parameters (d %lld, %lld layers, %lld/%lld heads), "
                    "vocab %lld, %lld train / %lld held-out tokens, batch %lld x %lld%s\n",
                    run_id, run_dir, (long long)n_params, (long long)mc->d_model,
                    (long long)mc->n_layers, (long long)mc->n_heads, (long long)mc->n_kv_heads, (long long)mc->vocab,
                    (long long)toy_data_train_tokens(data), (long long)toy_data_heldout_tokens(data),
                    (long long)c.batch, (long long)c.ctx, c.resume ? ", resumed" : "");
        if (!c.json && world > 1)
            fprintf(stderr, "           %d ranks, all-reduce %s the backward pass; AdamW state %.1f MB per rank%s\n", world,
                    c.dp_overlap ? "overlapped with" : "after", toy_trainer_optim_state_bytes(tr) / 1e6,
                    c.zero ? " (ZeRO-1: sharded)" : "");
    }
    struct toy_step_progress pu = {.log_every = c.log_every > 0 ? c.log_every : 10, .json = c.json};
    toy_progress_start(&pu.pb, "train", c.o.steps, "tok/s");
    if (c.json) pu.pb.tty = false;
    if (toy_trainer_step(tr) > 0) pu.pb.total = c.o.steps;
    toy_trainer_on_step(tr, toy_progress_on_step, &pu);
    struct toy_train_result res;
    started = true;
    enum toy_status st = toy_trainer_run(tr, &res);
    dp_consistent = res.reason == TOY_RUN_ABORTED;
    toy_cli_stop_signals_restore();
    toy_progress_finish(&pu.pb);
    const char *reason = toy_run_reason_str(res.reason);
    if (c.json) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:I,s:o,s:o,s:s,s:s,s:f}", "format", "toy/train-v1", "run_id", run_id,
                              "run_dir", run_dir, "steps", (json_int_t)res.final_step, "seed", (json_int_t)c.o.seed,
                              "final_loss", isfinite(res.final_loss) ? json_real(res.final_loss) : json_null(),
                              "eval_loss", isfinite(res.final_eval_loss) ? json_real(res.final_eval_loss) : json_null(),
                              "reason", reason, "checkpoint", res.checkpoint, "tokens_per_s", res.tokens_per_s);
        if (toy_cli_print_json("train", j, JSON_COMPACT)) rc = 1;
    } else {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        char held[48] = "no held-out evaluation"; /* none made: --heldout 0, or the run ended before it */
        if (isfinite(res.final_eval_loss)) snprintf(held, sizeof held, "held-out loss %.4f", res.final_eval_loss);
        fprintf(stderr, "toy train: %s at step %lld: loss %.4f, %s (%.0f tokens/s, %.1f s, peak RSS %.0f MB)\n",
                reason, (long long)res.final_step, res.final_loss, held, res.tokens_per_s, res.seconds,
                ru.ru_maxrss / 1024.0);
        if (res.checkpoint[0]) fprintf(stderr, "toy train: checkpoint %s\n", res.checkpoint);
        const char *sample = toy_trainer_sample_text(tr);
        if (sample[0]) printf("sample: %s\n", sample);
    }
    if (st && res.reason != TOY_RUN_INTERRUPTED) fprintf(stderr, "toy train: %s\n", toy_last_error());
    rc = st ? 1 : res.reason == TOY_RUN_INTERRUPTED ? 130 : 0;
out:
    json_decref(resaved);
    toy_trainer_free(tr);
    bool trace_lost = c.o.trace && toy_trace_close(c.o.trace); /* after the run: fails the command, not the job */
    if (trace_lost) fprintf(stderr, "toy train: %s\n", toy_last_error());
    toy_events_close(ev);
    toy_llama_free(m);
    toy_gpt2_free(g2);
    toy_cli_data_free(&in);
    toy_data_free(data);
    json_decref(c.keep);
    toy_tokenizer_free(tok);
    toy_run_release(run_lock);
    if (rc && made_run && !started) /* refused: no run to resume; the folder goes if this run made it */
        toy_run_discard(c.out ? c.out : run_dir, !c.out);
    if ((rc == 1 || rc == 2) && world > 1 && !dp_consistent && !toy_collective_broken(coll)) {
        /* a failure (or a bad flag) of this rank alone: the others would wait for it, so end the job now */
        fprintf(stderr, "toy train: rank %d of %d failed: ending the job\n", rank, world);
        toy_collective_abort(coll, 1);
    }
    toy_collective_close(coll); /* broken by a dead or hung rank: rank 0 (checkpointed) ends the job */
    return rc ? rc : trace_lost ? 1 : 0;
}
