/* train-vit.c: `toy train --arch vit --data IMAGES`: trains a ViT image
 * classifier (toy/vit.h, toy/classify.h) into the same run bundle as
 * `toy train` (train.json, events.jsonl, weights/step_N.gguf + .state.gguf,
 * latest) and resumes it with --resume. cmd-train.c hands `--arch vit`
 * command lines here. The image set is an IDX pair (MNIST), a TOYI file or
 * a folder of class sub-folders of PNG/JPEG (toy/images.h); without --test
 * a seeded --heldout fraction is split off for evaluation. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "progress.h"
#include "resume.h"
#include "stop-signals.h"
#include "flags.h"
#include "json-out.h"
#include "paths.h"
#include "toy/classify.h"
#include "toy/run-dir.h"
#include "toy/toy.h"
#include "train-vit.h"


static int usage_to(FILE *f) {
    fprintf(f,
"usage: toy train --arch vit --data IMAGES [options]    train a ViT image classifier\n"
"       toy train --arch vit --resume runs/<id> [--steps N]\n"
"data:      --data PATH (MNIST IDX file or folder, TOYI file, or a folder of class folders of PNG/JPEG; a TOYI\n"
"           or IDX file may be a pipe: /dev/stdin, -, a FIFO)\n"
"           --test PATH (held-out set; default: split --heldout 0.2 off --data)\n"
"model:     --preset mnist|small-cpu|tiny  --image-size N --patch P --dim D --layers L --heads H --ff F\n"
"training:  --steps 1000 --batch 64 --lr 2e-3 --lr-min 1e-4 --warmup 50 --schedule cosine|linear|constant\n"
"           --wd 0.05 --beta1 0.9 --beta2 0.999 --clip 1.0 --seed 1337 --crop-pad 0 --flip --threads N\n"
"output:    --eval-every 200 --ckpt-every 0 --runs DIR (runs) --out DIR --log-every 50 --json\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

struct vcfg {
    const char *data, *test, *preset, *runs, *out, *resume;
    int64_t image_size, patch, dim, layers, heads, ff;
    double heldout;
    int threads, log_every;
    bool json;
    struct toy_classify_opts o;
    json_t *keep;      /* --resume: the run's train.json, which the strings above point into */
};

static json_t *vcfg_json(const struct vcfg *c) {
    return json_pack("{s:s,s:s?,s:s?,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:I,s:I,s:f,s:f,s:I,s:s,s:f,s:f,s:f,s:f,s:f,"
                     "s:I,s:I,s:I,s:i,s:b}",
                     "arch", "vit", "data", c->data, "test", c->test, "preset", c->preset, "image_size",
                     (json_int_t)c->image_size, "patch", (json_int_t)c->patch, "dim", (json_int_t)c->dim, "layers",
                     (json_int_t)c->layers, "heads", (json_int_t)c->heads, "ff", (json_int_t)c->ff, "heldout",
                     c->heldout, "steps", (json_int_t)c->o.steps, "batch", (json_int_t)c->o.batch, "lr",
                     (double)c->o.lr, "lr_min", (double)c->o.lr_min, "warmup", (json_int_t)c->o.warmup, "schedule",
                     c->o.schedule == TOY_LR_COSINE ? "cosine" : c->o.schedule == TOY_LR_LINEAR ? "linear" : "constant",
                     "wd", (double)c->o.weight_decay, "beta1", (double)c->o.beta1, "beta2", (double)c->o.beta2, "eps",
                     (double)c->o.eps, "clip", (double)c->o.clip, "seed", (json_int_t)c->o.seed, "eval_every",
                     (json_int_t)c->o.eval_every, "ckpt_every", (json_int_t)c->o.ckpt_every, "crop_pad",
                     (int)c->o.aug.crop_pad, "flip", c->o.aug.flip);
}

static void vcfg_from_json(struct vcfg *c, json_t *j) {
    json_t *v;
    c->keep = json_incref(j);
#define STR(k, f) if ((v = json_object_get(j, k)) && json_is_string(v)) c->f = json_string_value(v)
#define INT(k, f) if ((v = json_object_get(j, k)) && json_is_integer(v)) c->f = json_integer_value(v)
#define NUM(k, f) if ((v = json_object_get(j, k)) && json_is_number(v)) c->f = json_number_value(v)
    STR("data", data); STR("test", test); STR("preset", preset);
    INT("image_size", image_size); INT("patch", patch); INT("dim", dim); INT("layers", layers); INT("heads", heads);
    INT("ff", ff); NUM("heldout", heldout); INT("steps", o.steps); INT("batch", o.batch); NUM("lr", o.lr);
    NUM("lr_min", o.lr_min); INT("warmup", o.warmup); NUM("wd", o.weight_decay); NUM("beta1", o.beta1);
    NUM("beta2", o.beta2); NUM("eps", o.eps); NUM("clip", o.clip); INT("seed", o.seed); INT("eval_every", o.eval_every);
    INT("ckpt_every", o.ckpt_every); INT("crop_pad", o.aug.crop_pad);
#undef STR
#undef INT
#undef NUM
    if ((v = json_object_get(j, "flip"))) c->o.aug.flip = json_is_true(v);
    if ((v = json_object_get(j, "schedule")) && json_is_string(v) && toy_lr_kind_from_name(json_string_value(v)) >= 0)
        c->o.schedule = (enum toy_lr_kind)toy_lr_kind_from_name(json_string_value(v));
}

static int parse(int argc, char **argv, struct vcfg *c, bool *given_steps) {
    const char *schedule = NULL, *arch = NULL;
    const double big = 1e12, dim = 1048576;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("--data", &c->data), TOY_FLAG_S("--test", &c->test), TOY_FLAG_S("--preset", &c->preset),
        TOY_FLAG_S("--runs", &c->runs), TOY_FLAG_S("--out", &c->out), TOY_FLAG_S("--resume", &c->resume),
        TOY_FLAG_S("--arch", &arch), TOY_FLAG_S("--schedule", &schedule), TOY_FLAG_B("--json", &c->json),
        TOY_FLAG_B("--flip", &c->o.aug.flip),
        TOY_FLAG_N("--image-size", TOY_CLI_I64, &c->image_size, 0, 65536),
        TOY_FLAG_N("--patch", TOY_CLI_I64, &c->patch, 0, 65536), TOY_FLAG_N("--dim", TOY_CLI_I64, &c->dim, 0, dim),
        TOY_FLAG_N("--layers", TOY_CLI_I64, &c->layers, 0, 65536),
        TOY_FLAG_N("--heads", TOY_CLI_I64, &c->heads, 0, 65536), TOY_FLAG_N("--ff", TOY_CLI_I64, &c->ff, 0, 16 * dim),
        TOY_FLAG_OPEN("--heldout", TOY_CLI_F64, &c->heldout, 0, 1),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &c->threads, 0, 4096),
        TOY_FLAG_N("--log-every", TOY_CLI_INT, &c->log_every, 0, INT32_MAX),
        TOY_FLAG_N("--batch", TOY_CLI_I64, &c->o.batch, 1, dim), TOY_FLAGS_OPTIM(c->o, big),
        TOY_FLAG_N("--crop-pad", TOY_CLI_I32, &c->o.aug.crop_pad, 0, 65536),
        TOY_FLAG_NG("--steps", TOY_CLI_I64, &c->o.steps, 0, big, given_steps),
        TOY_FLAG_END,
    };
    int rc = toy_cli_parse("train --arch vit", argc, argv, flags, NULL, 0, NULL);
    if (rc == 1) usage_to(stdout); /* asked for: the help goes to standard output */
    if (rc) return rc;
    if (schedule) {
        int k = toy_lr_kind_from_name(schedule);
        if (k < 0) { fprintf(stderr, "toy train: --schedule is cosine, linear or constant, not '%s'\n", schedule); return 2; }
        c->o.schedule = (enum toy_lr_kind)k;
    }
    return 0;
}

struct pud {
    struct toy_progress pb;
    int log_every;
    bool json;
    int64_t batch;
};

static void on_step(void *ud, const struct toy_classify_step *s) {
    struct pud *p = ud;
    char extra[96];
    if (isnan(s->test_acc)) snprintf(extra, sizeof extra, "loss %.4f  lr %.2e", s->loss, s->lr);
    else snprintf(extra, sizeof extra, "loss %.4f  acc %.2f%%  lr %.2e", s->loss, 100 * s->test_acc, s->lr);
    if (p->pb.tty) {
        toy_progress_update(&p->pb, s->step, (double)(s->step * p->batch), extra);
    } else if (!p->json && (s->step % p->log_every == 0 || s->step == s->steps || !isnan(s->test_acc))) {
        printf("step %lld: loss=%.6f", (long long)s->step, s->loss);
        if (!isnan(s->test_acc)) printf(" test_loss=%.6f test_acc=%.4f", s->test_loss, s->test_acc);
        printf("\n");
        fflush(stdout);
    }
}

bool toy_train_is_vit(int argc, char **argv) {
    /* a resumed run is what its train.json says, whatever --arch is given (it is ignored then) */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--resume")) {
            char path[1200];
            snprintf(path, sizeof path, "%s/train.json", argv[i + 1]);
            json_t *j = json_load_file(path, 0, NULL);
            const char *a = json_string_value(json_object_get(j, "arch"));
            bool vit = a && !strcmp(a, "vit");
            json_decref(j);
            return vit;
        }
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--arch")) return !strcmp(argv[i + 1], "vit");
    return false;
}

int toy_train_vit(int argc, char **argv) {
    struct vcfg c = {.runs = "runs", .preset = "mnist", .heldout = 0.2, .log_every = 50};
    c.o = (struct toy_classify_opts){.steps = 1000, .batch = 64, .lr = 2e-3f, .lr_min = 1e-4f, .warmup = 50,
                                     .schedule = TOY_LR_COSINE, .weight_decay = 0.05f, .beta1 = 0.9f,
                                     .beta2 = 0.999f, .eps = 1e-8f, .clip = 1.0f, .seed = 1337, .eval_every = 200};
    bool given_steps = false;
    int rc = parse(argc, argv, &c, &given_steps);
    if (rc) return rc == 1 ? 0 : rc;
    char run_dir[1024] = "", run_id[1024] = "", ckpt[1600] = "", state[1700] = "";
    struct vcfg cli = c;
    int run_lock = -1; /* toy_run_claim's: one process writes a run */
    int64_t run_steps = 0;
    bool started = false; /* the run's first step began: its folder is kept whatever happens */
    if (c.resume) {
        json_t *j = toy_cli_resume_load("train", c.resume, "train.json");
        if (!j) return 1;
        c.test = NULL; /* train.json's null is the run's: no --test, a split of --data */
        vcfg_from_json(&c, j);
        json_decref(j);
        if (toy_run_claim(c.resume, false, &run_lock)) {
            fprintf(stderr, "toy train: cannot resume: %s\n", toy_last_error());
            json_decref(c.keep);
            return 1;
        }
        run_steps = c.o.steps;
        if (given_steps) c.o.steps = cli.o.steps;
        static const char *const applies[] = {"--resume", "--steps", "--threads", "--json", "--log-every", NULL};
        toy_cli_resume_ignored("train", argc, argv, applies, "train.json", "--steps, --threads, --log-every and --json");
        snprintf(run_dir, sizeof run_dir, "%s", c.resume);
        const char *slash = strrchr(run_dir, '/');
        snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : run_dir);
        char path[1200], target[512];
        snprintf(path, sizeof path, "%s/weights/latest", run_dir);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) { fprintf(stderr, "toy train: cannot resume: %s has no weights/latest\n", run_dir); return 1; }
        target[n] = 0;
        snprintf(ckpt, sizeof ckpt, "%s/weights/%s", run_dir, target);
        snprintf(state, sizeof state, "%.*s.state.gguf", (int)(strlen(ckpt) - 5), ckpt); /* step_N.state.gguf */
    }
    char abs_data[PATH_MAX], abs_test[PATH_MAX];
    if (!c.resume) { /* train.json keeps them, and --resume may run from another folder */
        c.data = toy_cli_abspath(c.data, abs_data, sizeof abs_data);
        c.test = toy_cli_abspath(c.test, abs_test, sizeof abs_test);
    }
    c.o.stop = &toy_cli_stop;
    if (!c.data) { fprintf(stderr, "toy train: --data IMAGES is required\n"); return usage(); }
    if (toy_cli_one_stream("train", "--data", c.data, "--test", c.test)) return 2;

    struct toy_vit *m = NULL;
    struct toy_image_set *all = NULL, *train = NULL, *test = NULL;
    struct toy_events *ev = NULL;
    struct toy_classifier *tr = NULL;
    rc = 1;
    struct toy_vit_config vc = toy_vit_preset(c.preset);
    if (!vc.d_model) { fprintf(stderr, "toy train: unknown ViT preset '%s' (mnist, small-cpu, tiny)\n", c.preset); return 2; }
    /* a new run's folder: claimed once the flags are known good, before any slow work, so that an old run
     * there is refused at once */
    if (!c.resume && c.out && toy_run_claim(c.out, true, &run_lock)) {
        fprintf(stderr, "toy train: --out %s\n", toy_last_error());
        return 1;
    }
    if (c.image_size) vc.image_h = vc.image_w = c.image_size;
    if (c.patch) vc.patch = c.patch;
    if (c.dim) vc.d_model = c.dim;
    if (c.layers) vc.n_layers = c.layers;
    if (c.heads) vc.n_heads = c.heads;
    if (c.ff) vc.d_ff = c.ff;
    struct toy_image_load_opts lo = {.channels = vc.channels, .height = vc.image_h, .width = vc.image_w};
    if (toy_images_load(c.data, &lo, &all)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
    if (c.test) {
        if (toy_images_load(c.test, &lo, &test)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
        train = all;
        all = NULL;
    } else if (toy_images_split(all, c.heldout, c.o.seed, &train, &test)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    if (train->n_classes < 2) { /* one class is learnt at loss 0 and 100% "accuracy": nothing to classify */
        fprintf(stderr, "toy train: %s has %lld class%s: a classifier needs at least 2\n", c.data,
                (long long)train->n_classes, train->n_classes == 1 ? "" : "es");
        goto out;
    }
    /* the data decide the input shape and the classes */
    vc.channels = train->channels, vc.image_h = train->height, vc.image_w = train->width;
    if (train->n_classes > vc.n_classes || !c.resume) vc.n_classes = train->n_classes;
    if (ckpt[0]) {
        if (toy_vit_load(ckpt, true, &m)) { fprintf(stderr, "toy train: %s\n", toy_last_error()); goto out; }
    } else if (!(m = toy_vit_new(&vc, c.o.seed))) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    toy_cli_stop_signals_install(); /* from here on a stop request ends the run with a checkpoint and run_end */
    if (!run_dir[0]) {
        if (c.out) {
            snprintf(run_dir, sizeof run_dir, "%s", c.out);
            const char *slash = strrchr(c.out, '/');
            snprintf(run_id, sizeof run_id, "%s", slash && slash[1] ? slash + 1 : c.out); /* claimed above */
        } else if (toy_run_create(c.runs, NULL, "vit", run_id, sizeof run_id, run_dir, sizeof run_dir) ||
                   toy_run_claim(run_dir, true, &run_lock)) { /* fresh: $TOY_RUN_ID may name a used folder */
            fprintf(stderr, "toy train: %s\n", toy_last_error());
            goto out;
        }
        char path[1200];
        snprintf(path, sizeof path, "%s/train.json", run_dir);
        if (toy_cli_write_json_file("train", vcfg_json(&c), path)) goto out;
    }
    char evpath[1200];
    snprintf(evpath, sizeof evpath, "%s/events.jsonl", run_dir);
    if (toy_events_open(evpath, c.resume ? TOY_EVENTS_APPEND : TOY_EVENTS_TRUNCATE, &ev)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    if (toy_classifier_new(m, train, test, &c.o, run_dir, ev, cli.threads, &tr)) {
        fprintf(stderr, "toy train: %s\n", toy_last_error());
        goto out;
    }
    if (state[0] && toy_classifier_load_state(tr, state)) {
        fprintf(stderr, "toy train: cannot resume from %s: %s\n", state, toy_last_error());
        goto out;
    }
    /* a new --steps is the run's from now on, so that a later --resume keeps it: saved only once the run
     * is known to continue */
    if (c.resume && toy_cli_resume_changes("train", 0, 0, run_steps, c.o.steps, c.o.schedule == TOY_LR_CONSTANT)) {
        toy_cli_resume_notes();
        char path[1200];
        snprintf(path, sizeof path, "%s/train.json", run_dir);
        if (toy_cli_write_json_file("train", vcfg_json(&c), path)) goto out;
    }
    {
        const struct toy_vit_config *mc = &m->cfg;
        json_t *model = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:s,s:I}", "arch", "vit", "name",
                                  "toy", "image_h", (json_int_t)mc->image_h, "image_w", (json_int_t)mc->image_w,
                                  "channels", (json_int_t)mc->channels, "patch", (json_int_t)mc->patch, "classes",
                                  (json_int_t)mc->n_classes, "d_model", (json_int_t)mc->d_model, "n_layers",
                                  (json_int_t)mc->n_layers, "n_heads", (json_int_t)mc->n_heads, "d_head",
                                  (json_int_t)(mc->d_model / mc->n_heads), "d_ff", (json_int_t)mc->d_ff,
                                  "weight_type", "f32", "n_params", (json_int_t)toy_vit_n_params(m));
        json_t *config = vcfg_json(&c);
        if (c.resume) json_object_set_new(config, "resumed_from_step", json_integer(toy_classifier_step(tr)));
        toy_events_run_start(ev, &(struct toy_run_start){.run_id = run_id, .phase = "train",
                                                         .model = model, .config = config});
        json_decref(model);
        json_decref(config);
        if (!c.json)
            fprintf(stderr, "toy train: run %s -> %s\n           ViT %lld parameters (%lldx%lldx%lld, patch %lld, d %lld, "
                    "%lld layers, %lld heads), %lld classes, %lld train / %lld test images, batch %lld%s\n",
                    run_id, run_dir, (long long)toy_vit_n_params(m), (long long)mc->channels, (long long)mc->image_h,
                    (long long)mc->image_w, (long long)mc->patch, (long long)mc->d_model, (long long)mc->n_layers,
                    (long long)mc->n_heads, (long long)mc->n_classes, (long long)train->n, (long long)test->n,
                    (long long)c.o.batch, c.resume ? ", resumed" : "");
    }
    struct pud pu = {.log_every = cli.log_every > 0 ? cli.log_every : 50, .json = cli.json, .batch = c.o.batch};
    toy_progress_start(&pu.pb, "train", c.o.steps, "img/s");
    if (cli.json) pu.pb.tty = false;
    toy_classifier_on_step(tr, on_step, &pu);
    struct toy_classify_result res;
    started = true;
    enum toy_status st = toy_classifier_run(tr, &res);
    toy_cli_stop_signals_restore();
    toy_progress_finish(&pu.pb);
    toy_events_run_end(ev, &(struct toy_run_end){.reason = res.reason, .error = st ? toy_last_error() : NULL,
                                                 .final_step = res.final_step, .final_loss = res.final_loss,
                                                 .exit_code = st ? 1 : toy_run_reason_exit_code(res.reason)});
    if (cli.json) {
        json_t *j = json_pack("{s:s,s:s,s:s,s:I,s:o,s:o,s:o,s:s,s:s,s:f,s:f}", "format", "toy/train-v1", "run_id",
                              run_id, "run_dir", run_dir, "steps", (json_int_t)res.final_step, "final_loss",
                              isfinite(res.final_loss) ? json_real(res.final_loss) : json_null(), "test_loss",
                              isfinite(res.test_loss) ? json_real(res.test_loss) : json_null(), "test_acc",
                              isfinite(res.test_acc) ? json_real(res.test_acc) : json_null(), "reason",
                              toy_run_reason_str(res.reason), "checkpoint", res.checkpoint, "images_per_s",
                              res.images_per_s, "seconds", res.seconds);
        if (toy_cli_print_json("train", j, JSON_COMPACT)) rc = 1;
    } else {
        char acc[96] = "no test evaluation"; /* none yet: a run that stopped before its first */
        if (!isnan(res.test_acc))
            snprintf(acc, sizeof acc, "test accuracy %.2f%% (loss %.4f)", 100 * res.test_acc, res.test_loss);
        fprintf(stderr, "toy train: %s at step %lld: loss %.4f, %s, %.0f images/s, %.1f s\n",
                toy_run_reason_str(res.reason), (long long)res.final_step, res.final_loss, acc, res.images_per_s,
                res.seconds);
        if (res.checkpoint[0]) fprintf(stderr, "toy train: checkpoint %s\n", res.checkpoint);
    }
    if (st && res.reason != TOY_RUN_INTERRUPTED) fprintf(stderr, "toy train: %s\n", toy_last_error());
    rc = st ? 1 : res.reason == TOY_RUN_INTERRUPTED ? 130 : 0;
out:
    toy_classifier_free(tr);
    toy_events_close(ev);
    toy_vit_free(m);
    toy_images_free(all);
    toy_images_free(train);
    toy_images_free(test);
    json_decref(c.keep);
    toy_run_release(run_lock);
    if (rc && !c.resume && run_dir[0] && !started) /* refused: no run to resume; the folder goes if this run made it */
        toy_run_discard(c.out ? c.out : run_dir, !c.out);
    return rc;
}
