/* test-cli-train.c: `toy train`, `toy finetune`, `toy eval`, `toy tokenize`
 * and `toy tokenizer train` end to end, through the command line ($TOY_BIN,
 * set by make check; default build/toy), for what only the command shows:
 * exit statuses, messages, the files of a run bundle. Each test works in its
 * own mkdtemp folder (the commands run there, so relative paths are
 * relative to it) holding text.txt, a small corpus with structure. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/toy.h"

static char tmp[256];
static char bin[PATH_MAX];
static char out[1 << 16]; /* the last command's stdout and stderr */

static void setup(void) {
    const char *b = getenv("TOY_BIN") ? getenv("TOY_BIN") : "build/toy";
    if (!realpath(b, bin) || access(bin, X_OK)) cr_skip_test("no %s (run through make check)", b);
    snprintf(tmp, sizeof tmp, "/tmp/toy-test-cli-train-XXXXXX");
    cr_assert(mkdtemp(tmp));
    char path[400];
    snprintf(path, sizeof path, "%s/text.txt", tmp);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int i = 0; i < 1500; i++)
        fprintf(f, "the %s fox jumps over the %s dog. ", i % 3 ? "quick" : "slow", i % 5 ? "lazy" : "sleepy");
    fclose(f);
}

static void teardown(void) {
    if (!tmp[0]) return;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
}

TestSuite(cli_train, .init = setup, .fini = teardown);

/* Runs a shell command in tmp with $W the toy binary; its output lands in
 * `out`. Returns the exit status (128 + N for a signal). */
static int sh(const char *fmt, ...) {
    char cmd[4096], full[8800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(full, sizeof full, "cd '%s' && W='%s' && (%s) > .out.txt 2>&1", tmp, bin, cmd);
    int st = system(full);
    char path[400];
    snprintf(path, sizeof path, "%s/.out.txt", tmp);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

#define TRAIN "$W train --preset tiny --ctx 32 --batch 2 --threads 2 --vocab-size 300 --eval-every 0"

/* a small trained model at tmp/m/weights/latest */
static void train_model(void) {
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 2 --out m"), 0, "%s", out);
}

/* the integer field key of the JSON object the last command printed */
static json_int_t out_int(const char *key) {
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "not JSON: %s", out);
    json_int_t v = json_integer_value(json_object_get(j, key));
    json_decref(j);
    return v;
}

/* toy eval without --heldout evaluates the whole file (it used to ask the
 * loader for a 0.999999 held-out fraction, which every file failed) */
Test(cli_train, eval_without_heldout_reads_the_whole_file) {
    train_model();
    cr_assert_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --json"), 0, "%s", out);
    json_int_t windows = out_int("windows");
    cr_assert_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --heldout 0.1 --json"), 0, "%s", out);
    json_int_t tail = out_int("windows");
    cr_expect_gt(windows, 5 * tail, "the whole file gave %lld windows, its last tenth %lld", (long long)windows,
                 (long long)tail);
    cr_expect_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --heldout 0"), 0, "%s", out);
}

/* Every weight of the GGUF at tmp/path is finite. */
static bool weights_finite(const char *path) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", tmp, path);
    struct toy_llama *m;
    cr_assert_eq(toy_llama_load(p, false, &m), TOY_OK, "%s", toy_last_error());
    bool ok = true;
    for (int i = 0; i < toy_llama_n_tensors(m) && ok; i++) {
        struct toy_tensor *t = toy_llama_tensor(m, i);
        if (t->type != TOY_F32) continue;
        for (int64_t k = 0, n = toy_nelements(t); k < n && ok; k++) ok = isfinite(((const float *)t->data)[k]);
    }
    toy_llama_free(m);
    return ok;
}

/* lr 1e4 makes a step whose loss is finite but whose gradient norm is not;
 * its update used to be applied, so the "last good" checkpoint written when
 * the next loss came out NaN held non-finite weights. */
Test(cli_train, a_non_finite_gradient_norm_stops_before_the_update) {
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 30 --warmup 0 --lr 1e4 --schedule constant --ckpt-every 1 --out n"),
                 1, "%s", out);
    cr_expect(strstr(out, "gradient norm is NaN") || strstr(out, "gradient norm is infinite"), "%s", out);
    cr_expect(weights_finite("n/weights/latest"), "the last checkpoint holds non-finite weights");
    /* the stopped step has its event (grad_norm null), and run_end says aborted */
    cr_expect_eq(sh("tail -2 n/events.jsonl | head -1 | grep -q '\"grad_norm\":null'"), 0, "%s", out);
    cr_expect_eq(sh("tail -1 n/events.jsonl | grep -q '\"reason\":\"aborted\"'"), 0, "%s", out);
}

/* A run's weights/latest is a GGUF without the .gguf suffix: the tokenizer
 * loader knows it by its magic (it used to parse it as tokenizer.json). */
Test(cli_train, weights_latest_serves_as_a_tokenizer) {
    train_model();
    cr_expect_eq(sh("$W tokenize -m m/weights/latest hello"), 0, "%s", out);
    cr_expect_eq(sh(TRAIN " --data text.txt --steps 1 --init m/weights/latest --out i"), 0, "%s", out);
    cr_expect_eq(sh(TRAIN " --data text.txt --steps 1 --tokenizer m/weights/latest --out t"), 0, "%s", out);
}

/* Starts `toy train` on text.txt into tmp/<run> for many steps, a model
 * big enough that its checkpoint takes a while (51 MB), and returns its pid
 * once step 3 is in its events. */
static pid_t start_long_run(const char *run) {
    char runp[400], textp[400], ev[500];
    snprintf(runp, sizeof runp, "%s/%s", tmp, run);
    snprintf(textp, sizeof textp, "%s/text.txt", tmp);
    snprintf(ev, sizeof ev, "%s/events.jsonl", runp);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execl(bin, "toy", "train", "--data", textp, "--preset", "tiny", "--dim", "256", "--layers", "4", "--ff",
              "1024", "--vocab-size", "300", "--steps", "1000000", "--batch", "2", "--ctx", "32", "--eval-every", "0",
              "--threads", "1", "--out", runp, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 1200; i++) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "grep -q '\"step\":3,' '%s' 2>/dev/null", ev);
        if (!system(cmd)) break;
        usleep(20000);
    }
    return pid;
}

/* Two signals 10 ms apart, as GNU timeout sends them (to the child, then
 * to its process group), or a nervous double Ctrl-C: the second used to
 * _exit(130) from the handler while the first's checkpoint was being
 * written, leaving no weights and no run_end. Now the run ends as for one
 * signal, and run_end's exit_code is the process's 130 (it said 0). */
static void double_signal(const char *run, int sig) {
    pid_t pid = start_long_run(run);
    cr_assert_eq(kill(pid, sig), 0);
    usleep(10000);
    kill(pid, sig);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 130, "%s: status %#x", strsignal(sig), status);
    cr_assert_eq(sh("tail -1 %s/events.jsonl | grep '\"kind\":\"run_end\"' | grep '\"reason\":\"interrupted\"' "
                    "| grep -q '\"exit_code\":130'", run), 0, "%s: the last event is not run_end interrupted with exit "
                 "code 130", strsignal(sig));
    char latest[400];
    snprintf(latest, sizeof latest, "%s/weights/latest", run);
    cr_expect(weights_finite(latest));
}

Test(cli_train, a_second_signal_does_not_kill_the_checkpoint, .timeout = 120) {
    double_signal("term", SIGTERM);
    double_signal("int", SIGINT);
}

/* --trace writes a Chrome trace of the run; a path that could not take it is
 * refused before the run starts, and leaves no run behind to resume */
Test(cli_train, trace_is_written_or_refused_before_the_run) {
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 2 --out tr --trace /dev/null"), 1, "%s", out);
    cr_expect(strstr(out, "/dev/null: not a regular file"), "%s", out);
    cr_expect_neq(sh("test -e tr/train.json"), 0, "the refused run left its bundle");
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 2 --out tr --trace t.json"), 0, "%s", out);
    cr_expect_eq(sh("grep -q '\"name\":\"MATMUL\"' t.json"), 0, "no ops in the trace");
}

/* train.json and finetune.json keep absolute paths: --resume from another
 * folder used to look for the relative --data there */
Test(cli_train, saved_options_hold_absolute_paths) {
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 2 --out m"), 0, "%s", out);
    cr_assert_eq(sh("cd / && $W train --resume '%s/m' --steps 3 --threads 2", tmp), 0, "%s", out);
    cr_expect_eq(sh("grep -q '\"step\":3,' m/events.jsonl"), 0, "the resumed run did not reach step 3");
    /* a setting the run keeps is said to be ignored */
    cr_assert_eq(sh("$W train --resume m --steps 4 --threads 2 --lr 0.5"), 0, "%s", out);
    cr_expect(strstr(out, "--lr is ignored with --resume"), "%s", out);
    /* ... and really is: an --arch given now neither runs nor lands in train.json (it was read, failed, and saved,
     * so no later --resume could run) */
    cr_assert_eq(sh("$W train --resume m --steps 5 --threads 2 --arch gpt2 --sample x"), 0, "%s", out);
    cr_expect(strstr(out, "--arch is ignored with --resume") && strstr(out, "--sample is ignored"), "%s", out);
    cr_expect_eq(sh("grep -q gpt2 m/train.json"), 1, "--arch gpt2 was saved");
    cr_assert_eq(sh("$W train --resume m --steps 6 --threads 2"), 0, "%s", out);
    cr_assert_eq(sh("for i in $(seq 40); do echo '{\"prompt\":\"the quick fox\",\"completion\":\" jumps over\"}'; done "
                    "> sft.jsonl && $W finetune --base m/weights/latest --data sft.jsonl --ctx 32 --batch 2 --steps 1 "
                    "--threads 2 --out f"), 0, "%s", out);
    char path[400];
    snprintf(path, sizeof path, "%s/f/finetune.json", tmp);
    json_t *j = json_load_file(path, 0, NULL);
    cr_assert(j, "no %s", path);
    const char *base = json_string_value(json_object_get(j, "base")), *data = json_string_value(json_object_get(j, "data"));
    cr_expect(base && base[0] == '/', "base %s", base ? base : "(none)");
    cr_expect(data && data[0] == '/', "data %s", data ? data : "(none)");
    json_decref(j);
    cr_expect_eq(sh("cd / && $W finetune --resume '%s/f' --steps 2 --threads 2", tmp), 0, "%s", out);
    /* a --template given now is said to be ignored, and is (it made the run's examples differ, refused ever after) */
    cr_expect_eq(sh("$W finetune --resume f --steps 3 --threads 2 --template llama3"), 0, "%s", out);
    cr_expect(strstr(out, "--template is ignored with --resume"), "%s", out);
    cr_expect_eq(sh("$W finetune --resume f --steps 4 --threads 2"), 0, "%s", out);
}

/* --out naming a folder that holds a run is refused, before any work, and
 * the run is left as it was (its events were replaced, old step files
 * mixed with new); an empty folder is fine */
Test(cli_train, out_refuses_a_folder_that_holds_a_run) {
    train_model();
    cr_assert_eq(sh("cp m/events.jsonl before.jsonl"), 0);
    cr_expect_eq(sh(TRAIN " --data text.txt --steps 1 --out m"), 1, "%s", out);
    cr_expect(strstr(out, "not empty") && strstr(out, "--resume"), "%s", out);
    cr_expect_eq(sh("cmp -s before.jsonl m/events.jsonl"), 0, "the run's events changed");
    cr_expect_eq(sh("test -e m/weights/step_2.gguf && ! test -e m/weights/step_1.gguf"), 0, "the run's weights changed");
    cr_expect_eq(sh("mkdir empty && " TRAIN " --data text.txt --steps 1 --out empty"), 0, "%s", out);
}

/* --resume says what the folder is when it is not a run of this command:
 * missing, not a run, the other command's run (naming the command that
 * continues it), a demo run (not resumable); a refused resume prints no
 * "the run now ends at step N" note first; --out on a folder with no run
 * does not suggest --resume */
Test(cli_train, resume_names_what_the_folder_is) {
    train_model();
    cr_expect_eq(sh("$W train --resume nope --steps 3"), 1, "%s", out);
    cr_expect(strstr(out, "cannot resume: nope: No such file or directory"), "%s", out);
    cr_expect_eq(sh("$W train --resume m/weights --steps 3"), 1, "%s", out);
    cr_expect(strstr(out, "m/weights is not a run folder (it has no train.json)"), "%s", out);
    cr_expect_eq(sh("$W finetune --resume m --steps 3"), 1, "%s", out);
    cr_expect(strstr(out, "m is a `toy train` run: continue it with toy train --resume m"), "%s", out);
    cr_expect_eq(sh("mkdir -p runs/demo-1 && touch runs/demo-1/events.jsonl && $W train --resume runs/demo-1"), 1,
                 "%s", out);
    cr_expect(strstr(out, "is a `toy demo` run, which cannot be resumed"), "%s", out);
    cr_expect_eq(sh("cp text.txt copy.txt && " TRAIN " --data copy.txt --steps 2 --out c && echo more >> copy.txt && "
                    "$W train --resume c --steps 4"), 1, "%s", out);
    cr_expect(strstr(out, "is not the data this run trained on") && !strstr(out, "now ends at step"), "%s", out);
    cr_expect_eq(sh("mkdir junk && touch junk/x && " TRAIN " --data text.txt --steps 1 --out junk"), 1, "%s", out);
    cr_expect(strstr(out, "it holds x, and no run") && !strstr(out, "--resume"), "%s", out);
}

/* Every command's --help goes to standard output with exit 0 (toy train --help | less), and toy help
 * COMMAND is that help; train, finetune, demo and classify wrote theirs to standard error */
Test(cli_train, help_goes_to_stdout) {
    const char *cmds[] = {"demo", "train", "finetune", "merge", "eval", "classify", "generate", "bench", "describe",
                          "models", "convert", "quantize", "runs", "tokenize", "tokenizer", "chat-template",
                          "devices", "serve", "train --arch vit"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        cr_expect_eq(sh("$W %s --help 2>err.txt | grep -q usage && ! test -s err.txt", cmds[i]), 0, "%s: %s", cmds[i],
                     out);
    }
    cr_expect_eq(sh("$W help train | grep -q 'toy train --resume'"), 0, "%s", out);
    cr_expect_eq(sh("$W train"), 2, "%s", out); /* a usage error still goes to standard error, exit 2 */
    cr_expect(strstr(out, "--data FILE is required"), "%s", out);
}

/* toy --manifest: every command (each of which answers --help), the version, the exit codes, as JSON */
Test(cli_train, manifest_lists_every_command) {
    cr_assert_eq(sh("$W --manifest > m.json"), 0, "%s", out);
    char path[400];
    snprintf(path, sizeof path, "%s/m.json", tmp);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    cr_assert(m, "manifest is not JSON: %s", je.text);
    cr_expect_str_eq(json_string_value(json_object_get(m, "format")), "toy/manifest-v1");
    cr_expect_str_eq(json_string_value(json_object_get(m, "version")), TOY_VERSION);
    cr_expect(json_object_get(json_object_get(m, "exit_codes"), "2") != NULL);
    json_t *cmds = json_object_get(m, "commands");
    cr_assert(json_array_size(cmds) >= 18, "%zu commands", json_array_size(cmds));
    size_t i;
    json_t *c;
    json_array_foreach(cmds, i, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        cr_assert(name && *json_string_value(json_object_get(c, "summary")));
        cr_expect_eq(sh("$W %s --help > /dev/null", name), 0, "%s: %s", name, out);
    }
    json_decref(m);
    if (access("/dev/full", W_OK) == 0) {
        cr_expect_eq(sh("$W --manifest > /dev/full"), 1, "%s", out);
        cr_expect(strstr(out, "cannot write"), "%s", out);
    }
}

/* toy demo (what make demo runs), small: a run bundle with a checkpoint
 * that generates, a sample, and flags read like every command's */
Test(cli_train, demo_trains_a_run_that_generates) {
    cr_assert_eq(sh("$W demo --steps 20 --dim 32 --layers 1 --ctx 16 --batch 2 --threads 2"), 0, "%s", out);
    cr_expect(strstr(out, "trained 20 steps") && strstr(out, "sample (temperature 0.8):"), "%s", out);
    cr_expect_eq(sh("tail -1 runs/demo-*/events.jsonl | grep -q '\"reason\":\"completed\"'"), 0, "no run_end");
    cr_expect_eq(sh("$W generate -m runs/demo-*/weights/latest -p 'the child' -n 5 --seed 1"), 0, "%s", out);
    cr_expect_eq(sh("$W demo --steps 2.5"), 2, "%s", out);
    cr_expect(strstr(out, "bad value '2.5' for --steps"), "%s", out);
    cr_expect_eq(sh("$W demo --dim 48"), 2, "%s", out);
}

/* --resume keeps the run's thread count (the gradient norm's float sum
 * depends on it, so another one is a note), and a new --steps is saved, so
 * that the next plain --resume continues to it (it went back to the old
 * end and reported the run completed there) */
Test(cli_train, resume_keeps_threads_and_saves_new_steps) {
    cr_assert_eq(sh("$W train --preset tiny --ctx 32 --batch 2 --threads 1 --vocab-size 300 --eval-every 0 "
                    "--data text.txt --steps 2 --out t"), 0, "%s", out);
    cr_assert_eq(sh("$W train --resume t --steps 3"), 0, "%s", out);
    cr_expect(!strstr(out, "threads"), "%s", out);
    cr_expect(strstr(out, "now ends at step 3, not 2"), "%s", out);
    cr_expect_eq(sh("tail -1 t/events.jsonl | grep -q '\"final_step\":3'"), 0, "did not reach step 3");
    cr_expect_eq(sh("grep -c '\"threads\":1' t/events.jsonl | grep -qx 2"), 0, "a segment ran on another count");
    cr_assert_eq(sh("$W train --resume t --steps 4 --threads 2"), 0, "%s", out);
    cr_expect(strstr(out, "trained on 1 threads and continues on 2"), "%s", out);
    cr_expect_eq(sh("grep -q '\"steps\": 4,' t/train.json && grep -q '\"threads\": 2' t/train.json"), 0,
                 "train.json keeps the old steps or threads");
    /* a complete run is left as it is (it gained an empty segment and a rewritten checkpoint) */
    cr_assert_eq(sh("wc -l < t/events.jsonl > n.txt && $W train --resume t"), 0, "%s", out);
    cr_expect(strstr(out, "is complete at step 4 of 4") && !strstr(out, "note:"), "%s", out);
    cr_expect_eq(sh("wc -l < t/events.jsonl | cmp -s - n.txt"), 0, "the complete run's events changed");
    /* under --json it still prints its line (it printed nothing) */
    cr_assert_eq(sh("$W train --resume t --json 2>/dev/null"), 0, "%s", out);
    cr_expect_eq(out_int("steps"), 4, "%s", out);
    cr_expect_eq(out_int("trained_steps"), 0, "%s", out);
}

/* toy train --experts: a Mixtral-shaped mixture from scratch, with its
 * load-balancing term in the differentiated loss (--moe-aux; the reported
 * loss is the cross-entropy); a resumed run continues it bit for bit, and
 * the checkpoint is a llama with experts that describe and generate read */
Test(cli_train, a_mixture_of_experts_trains_and_resumes) {
#define MOE TRAIN " --data text.txt --experts 4 --experts-used 2"
    cr_assert_eq(sh(MOE " --steps 4 --out a"), 0, "%s", out);
    cr_assert_eq(sh(MOE " --steps 2 --out b && $W train --resume b --steps 4"), 0, "%s", out);
    cr_assert_eq(sh(MOE " --steps 4 --moe-aux 0 --out c"), 0, "%s", out);
#undef MOE
    cr_assert_eq(sh("tail -1 a/events.jsonl | grep -o '\"final_loss\":[^,]*' > a.txt && "
                    "tail -1 b/events.jsonl | grep -o '\"final_loss\":[^,]*' > b.txt && "
                    "tail -1 c/events.jsonl | grep -o '\"final_loss\":[^,]*' > c.txt && cat a.txt c.txt"), 0, "%s", out);
    cr_expect_eq(sh("cmp a.txt b.txt"), 0, "the resumed run's loss differs: %s", out);
    cr_expect_neq(sh("cmp a.txt c.txt"), 0, "the balancing term changed nothing");
    cr_expect_eq(sh("grep '\"kind\":\"step\"' a/events.jsonl | grep -c '\"moe_balance\":[0-9]' | grep -qx 4"), 0,
                 "a step event lacks the balancing term");
    cr_expect_eq(sh("grep -c moe_balance c/events.jsonl | grep -qx 0"), 0, "--moe-aux 0 still reports the term");
    cr_expect_eq(sh("grep -q '\"experts\": 4' b/train.json && grep -q '\"experts_used\": 2' b/train.json && grep -q '\"moe_aux\": 0.0099' b/train.json"), 0,
                 "train.json lacks the mixture");
    cr_assert_eq(sh("$W describe a/weights/latest"), 0, "%s", out);
    cr_expect(strstr(out, "experts 4 (2 a token)"), "%s", out);
    cr_assert_eq(sh("$W generate -m a/weights/latest -p 'the quick' -n 4 --temp 0"), 0, "%s", out);
    cr_expect_neq(sh("$W train --data text.txt --preset tiny --experts 2 --experts-used 3 --steps 1 --out d"), 0,
                  "%s", out);
    cr_expect(strstr(out, "3 experts used of 2"), "%s", out);
    cr_expect_eq(sh("$W train --data text.txt --preset tiny --experts-used 2 --steps 1 --out e"), 2, "%s", out);
    cr_expect(strstr(out, "--experts-used needs --experts"), "%s", out);
}

/* --resume removes the temporary files a killed writer (kill -9, the OOM killer) left in the run: those of
 * processes that are gone; a live process's are left alone */
Test(cli_train, resume_removes_a_dead_writers_temporary_files) {
    train_model();
    cr_assert_eq(sh("dead=$(sh -c 'echo $$') && touch m/weights/step_9.gguf.tmp.$dead m/weights/.latest.tmp.$dead "
                    "m/events.jsonl.tmp.$dead m/weights/step_8.gguf.tmp.1 m/weights/notes.txt"), 0, "%s", out);
    cr_assert_eq(sh("$W train --resume m --steps 3"), 0, "%s", out);
    cr_expect_eq(sh("ls -A m m/weights | grep tmp | grep -v 'tmp\\.1$'"), 1, "left: %s", out);
    cr_expect_eq(sh("test -f m/weights/step_8.gguf.tmp.1 && test -f m/weights/notes.txt"), 0, "removed too much");
}

/* Past a file-size limit the checkpoint's write fails like a full disk:
 * an error naming the file, exit 1, no temporary file left (SIGXFSZ
 * killed the process without a word, leaving one) */
Test(cli_train, a_file_size_limit_is_an_error_not_a_kill) {
    cr_expect_eq(sh("ulimit -f 100; " TRAIN " --data text.txt --steps 3 --out big"), 1, "%s", out);
    cr_expect(strstr(out, "File too large") && strstr(out, "big/weights/"), "%s", out);
    cr_expect_eq(sh("ls big/weights | grep -c tmp"), 1, "a temporary file was left: %s", out);
    /* the events file reaching the limit first stops the run there, not 5000 steps later */
    cr_expect_eq(sh("ulimit -f 20; " TRAIN " --data text.txt --steps 5000 --out ev"), 1, "%s", out);
    cr_expect(strstr(out, "File too large: stopping at step") && !strstr(out, "going on without them"), "%s", out);
    cr_expect_eq(sh("tail -1 ev/events.jsonl | grep -q '\"step\":[0-9]*,' && ! grep -q '\"step\":4999' "
                    "ev/events.jsonl"), 0, "%s", out);
}

/* $TOY_RUN_ID naming a run that exists is refused, and that run is left
 * as it was (its events were cut to the new run's, or deleted when the new
 * run failed early) */
Test(cli_train, a_fixed_run_id_never_reuses_a_run) {
    cr_assert_eq(sh(TRAIN " --data text.txt --steps 2 --runs rr"), 0, "%s", out);
    cr_assert_eq(sh("ls rr | head -1 > id.txt && cp rr/$(cat id.txt)/events.jsonl before.jsonl"), 0);
    cr_expect_eq(sh("TOY_RUN_ID=$(cat id.txt) " TRAIN " --data text.txt --steps 3 --runs rr"), 1, "%s", out);
    cr_expect(strstr(out, "is not empty") && strstr(out, "--resume"), "%s", out);
    cr_expect_eq(sh("cmp before.jsonl rr/$(cat id.txt)/events.jsonl && test -f rr/$(cat id.txt)/train.json"), 0,
                 "the existing run changed");
    cr_expect_eq(sh("TOY_RUN_ID=fresh " TRAIN " --data text.txt --steps 1 --runs rr && test -f rr/fresh/train.json"),
                 0, "%s", out);
}

/* A run resumes only on the tokens it trained on: a changed file is named,
 * with both token counts, and the original one resumes as before */
Test(cli_train, resume_refuses_other_data) {
    cr_assert_eq(sh("cp text.txt mine.txt && " TRAIN " --data mine.txt --steps 2 --out d"), 0, "%s", out);
    cr_assert_eq(sh("cp mine.txt kept.txt && echo 'one more line' >> mine.txt && $W train --resume d --steps 3"), 1,
                 "%s", out);
    cr_expect(strstr(out, "is not the data this run trained on") && strstr(out, "d/train.json records"), "%s", out);
    cr_expect_eq(sh("grep -q '\"step\":3,' d/events.jsonl"), 1, "the refused resume trained");
    cr_expect_eq(sh("grep -q '\"steps\": 2,' d/train.json"), 0, "the refused resume rewrote train.json");
    cr_assert_eq(sh("cp kept.txt mine.txt && $W train --resume d --steps 3 --threads 2"), 0, "%s", out);
    cr_expect_eq(sh("grep -q '\"step\":3,' d/events.jsonl"), 0, "the resumed run did not reach step 3");
    /* and a fine-tune on the examples it trained on */
    cr_assert_eq(sh("for i in $(seq 20); do echo '{\"prompt\":\"a\",\"completion\":\" b\"}'; done > s.jsonl && "
                    "$W finetune --base d/weights/latest --data s.jsonl --ctx 16 --batch 2 --steps 1 --threads 2 "
                    "--out f"), 0, "%s", out);
    cr_assert_eq(sh("sed -i 's/ b/ c/' s.jsonl && $W finetune --resume f --steps 2 --threads 2"), 1, "%s", out);
    cr_expect(strstr(out, "is not the data this run trained on (20 examples") && strstr(out, "f/finetune.json"),
              "%s", out);
}

/* Two processes on one run (a second --resume while the first trains):
 * the second is refused, naming the first's pid. */
Test(cli_train, a_run_is_written_by_one_process_at_a_time, .timeout = 120) {
    pid_t pid = start_long_run("l");
    cr_expect_eq(sh("$W train --resume l --steps 2000000"), 1, "%s", out);
    cr_expect(strstr(out, "another process"), "%s", out);
    char pids[32];
    snprintf(pids, sizeof pids, "pid %d", (int)pid);
    cr_expect(strstr(out, pids), "'%s' does not name %s", out, pids);
    kill(pid, SIGINT);
    int status;
    waitpid(pid, &status, 0);
    cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 130, "status %#x", status);
    /* the lock went with the process: the run resumes now */
    cr_expect_eq(sh("$W train --resume l --steps 1 --threads 2"), 0, "%s", out);
}

/* Integer flags take whole numbers in range: 1e30 and 99999999999999999999
 * used to wrap to a run that "completed" at step 0 with loss nan, 2.5 was
 * cut to 2. Exit 2 (bad usage). */
Test(cli_train, integer_flags_take_whole_numbers_in_range) {
    const char *bad[] = {
        TRAIN " --data text.txt --steps 1e30 --out a",
        TRAIN " --data text.txt --steps 99999999999999999999 --out a",
        TRAIN " --data text.txt --steps 2.5 --out a",
        TRAIN " --data text.txt --steps -1 --out a",
        TRAIN " --data text.txt --seed 1.5 --out a",
        "$W finetune --base x.gguf --data y.jsonl --steps 2.5",
        "$W finetune --base x.gguf --data y.jsonl --rank 1e30",
        "$W eval -m x.gguf --data text.txt --ctx 99999999999999999999",
        "$W eval -m x.gguf --data text.txt --batch 2.5",
        "$W tokenizer train --vocab-size 1e30 text.txt -o t.gguf",
        "$W tokenizer train --vocab-size 300.5 text.txt -o t.gguf",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(sh("%s", bad[i]), 2, "%s: %s", bad[i], out);
        cr_expect(strstr(out, "bad value"), "%s: %s", bad[i], out);
    }
    cr_expect_eq(sh("test -e a || test -e t.gguf"), 1, "a refused command left files");
    /* 1e1 is a whole number */
    cr_expect_eq(sh(TRAIN " --data text.txt --steps 1e1 --out b --json"), 0, "%s", out);
    cr_expect(strstr(out, "\"steps\":10,"), "%s", out);
}

/* An unknown flag is named as one, and so is a stray argument; it used to
 * take the next argument as its value ("--frobnicate needs a value", "bad
 * value '--steps' for --frobnicate", "bad value '--preset' for extra.txt"). */
Test(cli_train, unknown_flags_and_stray_arguments_are_named) {
    train_model();
    const struct {
        const char *cmd, *msg;
    } cases[] = {
        {TRAIN " --data text.txt --frobnicate", "unknown flag --frobnicate"},
        {TRAIN " --data text.txt --frobnicate --steps 3", "unknown flag --frobnicate"},
        {"$W train --data text.txt extra.txt --preset tiny", "unexpected argument 'extra.txt'"},
        {"$W finetune --base m/weights/latest --data x.jsonl --frobnicate", "unknown flag --frobnicate"},
        {"$W finetune --base m/weights/latest extra.txt --data x.jsonl", "unexpected argument 'extra.txt'"},
        {"$W eval -m m/weights/latest --data text.txt --frobnicate", "unknown flag --frobnicate"},
        {"$W eval -m m/weights/latest --data text.txt extra.txt", "unexpected argument 'extra.txt'"},
        {"$W tokenize -m m/weights/latest --frobnicate hello", "unknown flag --frobnicate"},
        {"$W tokenize -m m/weights/latest hello extra.txt", "unexpected argument 'extra.txt'"},
        {"$W tokenizer train --vocab-size 300 text.txt -o t.gguf --frobnicate", "unknown flag --frobnicate"},
        {"$W train --data text.txt --steps", "--steps needs a value"},
        {"$W train --data --steps 3", "--data needs a value"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cr_expect_eq(sh("%s", cases[i].cmd), 2, "%s: %s", cases[i].cmd, out);
        cr_expect(strstr(out, cases[i].msg), "%s: '%s' lacks '%s'", cases[i].cmd, out, cases[i].msg);
    }
}

/* Bad usage is refused before any slow work (learning a BPE vocabulary,
 * loading a model, making a run folder), with exit status 2. */
Test(cli_train, bad_usage_is_refused_up_front) {
    train_model();
    const char *train[] = {"--batch 0", "--ctx 0", "--preset huge", "--arch foo", "--heldout 2", "--beta1 1.5",
                           "--accum 0", "--heads 3", "--arch gpt2 --preset huge"};
    for (size_t i = 0; i < sizeof train / sizeof train[0]; i++) {
        cr_expect_eq(sh("$W train --data text.txt --vocab-size 300 --out r %s", train[i]), 2, "%s: %s", train[i], out);
        cr_expect(!strstr(out, "learning"), "%s: a BPE vocabulary was learnt first: %s", train[i], out);
        cr_expect_eq(sh("test -e r"), 1, "%s: made the run folder", train[i]);
    }
    const char *ft[] = {"--rank 0", "--batch 0", "--accum 0", "--grad-accum 0", "--epochs 0", "--steps 0",
                        "--method foo", "--heldout 1"};
    for (size_t i = 0; i < sizeof ft / sizeof ft[0]; i++) {
        cr_expect_eq(sh("$W finetune --base m/weights/latest --data x.jsonl --out r %s", ft[i]), 2, "%s: %s", ft[i],
                     out);
        cr_expect_eq(sh("test -e r"), 1, "%s: made the run folder", ft[i]);
    }
}

/* A folder given as an input file is named as one; it read as empty data
 * ("Cannot allocate memory", "read error", "cannot read data") or gave
 * empty output files. An empty corpus learns no tokenizer. */
Test(cli_train, a_folder_as_input_is_named) {
    train_model();
    const char *cmds[] = {
        "$W train --data dir/ --preset tiny --out r",
        "$W finetune --base m/weights/latest --data dir/ --out r",
        "$W eval -m m/weights/latest --data dir",
        "$W tokenize -m m/weights/latest --corpus dir -o d.bin",
        "$W tokenizer train --vocab-size 300 dir -o t.gguf",
    };
    cr_assert_eq(sh("mkdir dir"), 0);
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        cr_expect_eq(sh("%s", cmds[i]), 1, "%s: %s", cmds[i], out);
        cr_expect(strstr(out, "dir: is a directory") || strstr(out, "dir/: is a directory"), "%s: %s", cmds[i], out);
    }
    cr_expect_eq(sh("test -e r || test -e d.bin || test -e t.gguf"), 1, "a refused command left files");
    cr_expect_eq(sh(": > empty.txt && $W tokenizer train --vocab-size 300 empty.txt -o t.gguf"), 1, "%s", out);
    cr_expect(strstr(out, "empty"), "%s", out);
    cr_expect_eq(sh("test -e t.gguf"), 1, "a tokenizer was written from an empty corpus");
}

/* Token ids of one vocabulary trained or evaluated with another's tokenizer
 * or model: a TOYT file of a 280-token tokenizer trained with --tokenizer
 * of m's (292 tokens) wrote a GGUF whose token_embd had 280 rows and a
 * 292-token vocabulary; --init and eval took such pairs silently. */
Test(cli_train, token_data_must_match_the_tokenizer_and_model_vocabulary) {
    train_model();
    cr_assert_eq(sh("$W tokenizer train --vocab-size 280 text.txt -o t280.gguf && "
                    "$W tokenize -m t280.gguf --corpus text.txt -o d280.bin"), 0, "%s", out);
    cr_expect_eq(sh(TRAIN " --data d280.bin --tokenizer m/weights/latest --steps 1 --out a"), 1, "%s", out);
    cr_expect(strstr(out, "280-token vocabulary"), "%s", out);
    cr_expect_eq(sh(TRAIN " --data d280.bin --init m/weights/latest --steps 1 --out b"), 1, "%s", out);
    cr_expect(strstr(out, "280-token vocabulary"), "%s", out);
    cr_expect_eq(sh("$W eval -m m/weights/latest --data d280.bin --ctx 32"), 1, "%s", out);
    cr_expect(strstr(out, "280-token vocabulary"), "%s", out);
    /* the matching pairs work; without --tokenizer a warning says the checkpoint will have none */
    cr_expect_eq(sh(TRAIN " --data d280.bin --tokenizer t280.gguf --steps 1 --out c"), 0, "%s", out);
    cr_expect(!strstr(out, "warning"), "%s", out);
    cr_expect_eq(sh("$W eval -m c/weights/latest --data d280.bin --ctx 32"), 0, "%s", out);
    cr_expect_eq(sh(TRAIN " --data d280.bin --steps 1 --out d"), 0, "%s", out);
    cr_expect(strstr(out, "warning") && strstr(out, "--tokenizer"), "%s", out);
    /* a model without a tokenizer: its vocabulary must be the data's */
    cr_expect_eq(sh(TRAIN " --data d280.bin --init d/weights/latest --steps 1 --out e"), 0, "%s", out);
    cr_assert_eq(sh("$W tokenizer train --vocab-size 270 text.txt -o t270.gguf && "
                    "$W tokenize -m t270.gguf --corpus text.txt -o d270.bin"), 0, "%s", out);
    cr_expect_eq(sh(TRAIN " --data d270.bin --init d/weights/latest --steps 1 --out f"), 1, "%s", out);
    cr_expect(strstr(out, "270-token vocabulary"), "%s", out);
    cr_expect_eq(sh("$W eval -m d/weights/latest --data d270.bin --ctx 32"), 1, "%s", out);
}

/* finetune --template takes a built-in's name or Jinja text; a misspelt
 * name used to be rendered as a template of its own text, so every
 * example became that string. */
Test(cli_train, finetune_template_is_a_builtin_or_jinja) {
    train_model();
    cr_assert_eq(sh("for i in $(seq 40); do echo '{\"messages\":[{\"role\":\"user\",\"content\":\"the quick fox\"},"
                    "{\"role\":\"assistant\",\"content\":\"jumps over\"}]}'; done > chat.jsonl"), 0);
    const char *ft = "$W finetune --base m/weights/latest --data chat.jsonl --ctx 128 --batch 2 --steps 1 --threads 2";
    cr_expect_eq(sh("%s --template nonexist_tpl --out a", ft), 2, "%s", out);
    cr_expect(strstr(out, "nonexist_tpl") && strstr(out, "built-in"), "%s", out);
    cr_expect_eq(sh("%s --template '{{ unclosed' --out a", ft), 2, "%s", out);
    cr_expect_eq(sh("test -e a"), 1, "a refused command made its run folder");
    cr_expect_eq(sh("%s --template chatml --out b", ft), 0, "%s", out);
    cr_expect_eq(sh("%s --template \"{%% for m in messages %%}{{ m.content }}{%% endfor %%}\" --out c", ft), 0, "%s", out);
    /* a file of Jinja, as chat-template takes one: the run keeps its text, so --resume reads no file */
    cr_expect_eq(sh("printf '{%%%% for m in messages %%%%}<{{ m.role }}>{{ m.content }}{%%%% endfor %%%%}' > t.jinja && "
                    "%s --template t.jinja --out d && rm t.jinja", ft), 0, "%s", out);
    cr_expect_eq(sh("grep -q '<{{ m.role }}>' d/finetune.json"), 0, "the template's text is not in finetune.json");
    cr_expect_eq(sh("$W finetune --resume d --steps 2"), 0, "%s", out);
    /* chat-template takes the same three, and a model without a template gets chatml as serve and finetune */
    cr_expect_eq(sh("echo '[{\"role\":\"user\",\"content\":\"hi\"}]' > c.json && $W chat-template -m m/weights/latest "
                    "--messages c.json"), 0, "%s", out);
    cr_expect(strstr(out, "using chatml") && strstr(out, "<|im_start|>user\nhi<|im_end|>"), "%s", out);
    cr_expect_eq(sh("$W chat-template --template '{{ messages[0].content }}!' --messages c.json"), 0, "%s", out);
    cr_expect(strstr(out, "hi!"), "%s", out);
}

/* A new run refused before its first step leaves no run behind: the next --out of the folder starts afresh and
 * `toy runs` lists no empty run (qlora on an f32 base is refused after the folder is made). The default
 * finetune context fits a model shorter than it (tiny: 128 positions, the default 256). */
Test(cli_train, a_refused_run_leaves_no_run_folder) {
    train_model();
    cr_assert_eq(sh("for i in $(seq 40); do echo '{\"prompt\":\"the quick fox\",\"completion\":\" jumps over\"}'; done "
                    "> sft.jsonl"), 0);
    cr_expect_eq(sh("$W finetune --base m/weights/latest --data sft.jsonl --method qlora --steps 1 --threads 2 "
                    "--runs rr"), 1, "%s", out);
    cr_expect_eq(sh("test -z \"$(ls -A rr)\""), 0, "rr holds: %s", out);
    cr_expect_eq(sh("$W finetune --base m/weights/latest --data sft.jsonl --method qlora --steps 1 --threads 2 "
                    "--out f1"), 1, "%s", out);
    cr_expect_eq(sh("$W finetune --base m/weights/latest --data sft.jsonl --steps 1 --threads 2 --out f1"), 0, "%s",
                 out);
}

/* On a terminal the bar is redrawn in place, and each evaluation stays on screen as a line above it (it showed
 * for one redraw only); `script` gives the command a terminal */
Test(cli_train, evaluations_stay_on_a_terminal) {
    if (sh("command -v script")) cr_skip_test("no script(1)");
    cr_assert_eq(sh("script -qec \"$W train --preset tiny --ctx 32 --batch 2 --threads 2 --vocab-size 300 "
                    "--data text.txt --steps 20 --eval-every 10 --eval-batches 1 --out t\" /dev/null"), 0, "%s", out);
    cr_expect(strstr(out, "step 10: loss=") && strstr(out, " eval="), "%s", out);
}

/* The JSON object `toy eval --json` (or any command) printed last, as "loss tokens windows" */
static void eval_summary(char *buf, size_t n) {
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(j, "not JSON: %s", out);
    snprintf(buf, n, "%.17g %lld %lld", json_real_value(json_object_get(j, "loss")),
             (long long)json_integer_value(json_object_get(j, "tokens")),
             (long long)json_integer_value(json_object_get(j, "windows")));
    json_decref(j);
}

/* A byte-level BPE tokenizer.json that asks for BOS (add_bos_token), at tmp/tok, and a model trained with it
 * on text.txt at tmp/m */
static void train_with_bos_tokenizer(void) {
    cr_assert_eq(sh("mkdir tok && $W tokenizer train --vocab-size 300 --special '<s>' --special '</s>' text.txt "
                    "-o tok/tokenizer.json && echo '{\"add_bos_token\": true}' > tok/tokenizer_config.json"),
                 0, "%s", out);
    cr_assert_eq(sh(TRAIN " --tokenizer tok --data text.txt --steps 2 --out m"), 0, "%s", out);
}

/* train.json's value of key in run/, as its JSON text ("true", "\"96e3...\"") */
static void train_json_value(const char *run, const char *key, char *buf, size_t n) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s/train.json", tmp, run);
    json_t *j = json_load_file(p, 0, NULL);
    cr_assert(j, "%s", p);
    json_t *v = json_object_get(j, key);
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY) : NULL;
    snprintf(buf, n, "%s", s ? s : "(none)");
    free(s);
    json_decref(j);
}

/* A text and the token file `toy tokenize --corpus` makes of it are the same tokens: toy eval scores them
 * alike and toy train trains on the same stream (its fingerprint). Text used to be encoded without the BOS
 * that tokenize --corpus puts first for a tokenizer that asks for one. */
Test(cli_train, a_text_and_its_token_file_are_the_same_tokens) {
    train_with_bos_tokenizer();
    cr_assert_eq(sh("$W tokenize -m m/weights/latest --corpus text.txt -o t.bin --json"), 0, "%s", out);
    json_int_t n_tokens = out_int("n_tokens");
    char text[128], toyt[128], v[128];
    cr_assert_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --json"), 0, "%s", out);
    eval_summary(text, sizeof text);
    cr_assert_eq(sh("$W eval -m m/weights/latest --data t.bin --ctx 32 --json"), 0, "%s", out);
    eval_summary(toyt, sizeof toyt);
    cr_expect_str_eq(text, toyt, "text: %s, token file: %s", text, toyt);
    /* the stream starts with BOS: the run recorded it, and holds one token more than the plain encoding */
    train_json_value("m", "data_bos", v, sizeof v);
    cr_expect_str_eq(v, "true");
    train_json_value("m", "data_tokens", v, sizeof v);
    cr_expect_eq(atoll(v), (long long)n_tokens, "train read %s tokens, tokenize wrote %lld", v, (long long)n_tokens);
    cr_assert_eq(sh("$W tokenize -m m/weights/latest --corpus text.txt -o plain.bin --no-bos --json"), 0, "%s", out);
    cr_expect_eq(out_int("n_tokens"), n_tokens - 1, "%s", out);
    /* training on either is training on the same tokens */
    char fp_text[64], fp_toyt[64];
    cr_assert_eq(sh(TRAIN " --tokenizer tok --data t.bin --steps 1 --out k"), 0, "%s", out);
    train_json_value("m", "data_fingerprint", fp_text, sizeof fp_text);
    train_json_value("k", "data_fingerprint", fp_toyt, sizeof fp_toyt);
    cr_expect_str_eq(fp_text, fp_toyt);
    /* --no-bos reads the text as tokenize --corpus --no-bos does */
    cr_assert_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --json --no-bos"), 0, "%s", out);
    eval_summary(text, sizeof text);
    cr_assert_eq(sh("$W eval -m m/weights/latest --data plain.bin --ctx 32 --json"), 0, "%s", out);
    eval_summary(toyt, sizeof toyt);
    cr_expect_str_eq(text, toyt);
}

/* A run trained on text before train.json recorded data_bos had no BOS first: --resume encodes the text as it
 * did then, so the run goes on (its fingerprint matches) instead of being refused as other data. */
Test(cli_train, a_text_run_from_before_data_bos_resumes) {
    train_with_bos_tokenizer();
    /* such a run, as it was written: its text without BOS, and no data_bos key */
    cr_assert_eq(sh(TRAIN " --tokenizer tok --data text.txt --no-bos --steps 2 --out old"), 0, "%s", out);
    char p[600];
    snprintf(p, sizeof p, "%s/old/train.json", tmp);
    json_t *j = json_load_file(p, 0, NULL);
    cr_assert(j);
    cr_assert(json_is_false(json_object_get(j, "data_bos")));
    json_object_del(j, "data_bos");
    cr_assert_eq(json_dump_file(j, p, JSON_INDENT(2)), 0);
    json_decref(j);
    cr_assert_eq(sh("$W train --resume old --steps 3"), 0, "%s", out);
    cr_expect(!strstr(out, "cannot resume"), "%s", out);
    cr_expect_eq(sh("grep -q '\"step\":3,' old/events.jsonl"), 0, "the resumed run did not reach step 3");
    /* and a run of today resumes on the stream it recorded (BOS first) */
    cr_assert_eq(sh("$W train --resume m --steps 3"), 0, "%s", out);
}

/* --data from a pipe: toy eval and toy train read it to its end (they seeked to its end to learn its size,
 * which a pipe cannot do), as text or as a token file, and the same as the file */
Test(cli_train, data_from_a_pipe) {
    train_model();
    char file[128], piped[128];
    cr_assert_eq(sh("$W eval -m m/weights/latest --data text.txt --ctx 32 --json"), 0, "%s", out);
    eval_summary(file, sizeof file);
    cr_assert_eq(sh("cat text.txt | $W eval -m m/weights/latest --data /dev/stdin --ctx 32 --json"), 0, "%s", out);
    eval_summary(piped, sizeof piped);
    cr_expect_str_eq(file, piped);
    cr_assert_eq(sh("$W tokenize -m m/weights/latest --corpus text.txt -o t.bin"), 0, "%s", out);
    cr_assert_eq(sh("cat t.bin | $W eval -m m/weights/latest --data /dev/stdin --ctx 32 --json"), 0, "%s", out);
    eval_summary(piped, sizeof piped);
    cr_expect_str_eq(file, piped);
    cr_assert_eq(sh("cat t.bin | $W eval -m m/weights/latest --data - --ctx 32 --json"), 0, "%s", out);
    eval_summary(piped, sizeof piped);
    cr_expect_str_eq(file, piped);
    /* training: the same tokens as from the file (the BPE vocabulary learned from the same text) */
    char fp_file[64], fp_pipe[64];
    cr_assert_eq(sh("cat text.txt | " TRAIN " --data /dev/stdin --steps 2 --out p"), 0, "%s", out);
    train_json_value("m", "data_fingerprint", fp_file, sizeof fp_file);
    train_json_value("p", "data_fingerprint", fp_pipe, sizeof fp_pipe);
    cr_expect_str_eq(fp_file, fp_pipe);
    cr_assert_eq(sh("cat t.bin | " TRAIN " --tokenizer m/weights/latest --data /dev/stdin --steps 1 --out q"), 0, "%s",
                 out);
    /* a read that fails is an error naming the file (reading /proc/self/mem at offset 0 is EIO) */
    if (access("/proc/self/mem", R_OK) == 0) {
        cr_expect_eq(sh("$W eval -m m/weights/latest --data /proc/self/mem --ctx 32"), 1, "%s", out);
        cr_expect(strstr(out, "toy eval: /proc/self/mem: read error"), "%s", out);
        cr_expect_eq(sh(TRAIN " --data /proc/self/mem --steps 1 --out r"), 1, "%s", out);
        cr_expect(strstr(out, "/mem: read error"), "%s", out);
    }
}

/* A message names its command once: the library's "generate: ..." and "chat template: ..." printed after
 * "toy generate: " and "toy chat-template: " said it twice. */
Test(cli_train, a_message_names_its_command_once) {
    train_model();
    cr_expect_eq(sh("$W generate -m m/weights/latest --prompt-ids \"$(seq -s ' ' 1 200)\" -n 2"), 1, "%s", out);
    cr_expect(strstr(out, "toy generate: prompt of 200 tokens does not fit the context"), "%s", out);
    cr_expect(!strstr(out, "generate: generate:"), "%s", out);
    cr_assert_eq(sh("echo '[{\"role\":\"user\",\"content\":\"hi\"}]' > msgs.json && "
                    "printf '{%%%% if %%%%}x{%%%% endif %%%%}' > bad.jinja && "
                    "$W chat-template --template bad.jinja --messages msgs.json"), 1, "%s", out);
    cr_expect(strstr(out, "toy chat-template: line 1:"), "%s", out);
    cr_expect(!strstr(out, "chat template: line"), "%s", out);
}

/* Files a and b (relative to tmp) hold the same bytes */
static bool same_file(const char *a, const char *b) {
    return sh("cmp '%s' '%s'", a, b) == 0;
}

#define VIT "$W train --arch vit --preset tiny --patch 4 --dim 16 --layers 1 --heads 2 --ff 32 --steps 2 --batch 4 " \
            "--threads 2 --eval-every 0"

/* --arch vit --data from a pipe: the image set is read once (its first bytes were read to tell TOYI from IDX,
 * then the file was opened again, which finds a pipe drained), so /dev/stdin, "-" and a FIFO named as an IDX
 * images file train as the file does: the same weights */
/* set.toyi in tmp: 24 8x8 images of 2 classes */
static void write_image_set(void) {
    int32_t labels[24];
    struct toy_image_set s = {.n = 24, .channels = 1, .height = 8, .width = 8, .n_classes = 2, .labels = labels};
    uint8_t px[24 * 64];
    s.pixels = px;
    for (int i = 0; i < 24; i++) {
        labels[i] = i % 2;
        for (int k = 0; k < 64; k++) px[i * 64 + k] = (uint8_t)((labels[i] && k % 8 < 4 ? 200 : 30) + (i * 7 + k) % 20);
    }
    char p[400];
    snprintf(p, sizeof p, "%s/set.toyi", tmp);
    cr_assert_eq(toy_images_save_toyi(&s, p), TOY_OK, "%s", toy_last_error());
}

Test(cli_train, image_data_from_a_pipe) {
    /* the images as TOYI and as an IDX pair (plain, gzip); fifo/ has the labels under both names, plain (under
     * .gz too: plain bytes read as they are, as zlib's gzread read them) */
    write_image_set();
    cr_assert_eq(sh("mkdir idx fifo && tail -c %d set.toyi > px.bin && "
                    "{ printf '\\0\\0\\10\\3\\0\\0\\0\\30\\0\\0\\0\\10\\0\\0\\0\\10'; cat px.bin; } > idx/s-images-idx3-ubyte && "
                    "{ printf '\\0\\0\\10\\1\\0\\0\\0\\30'; for i in $(seq 12); do printf '\\0\\1'; done; } "
                    "> idx/s-labels-idx1-ubyte && gzip -k idx/s-images-idx3-ubyte && "
                    "cp idx/s-labels-idx1-ubyte fifo/ && cp idx/s-labels-idx1-ubyte fifo/s-labels-idx1-ubyte.gz && "
                    "mkfifo fifo/s-images-idx3-ubyte fifo/s-images-idx3-ubyte.gz", 24 * 64), 0, "%s", out);
    cr_assert_eq(sh(VIT " --data set.toyi --out f"), 0, "%s", out);
    cr_assert_eq(sh(VIT " --data idx/s-images-idx3-ubyte --out i"), 0, "%s", out);
    cr_expect(same_file("f/weights/step_2.gguf", "i/weights/step_2.gguf"), "IDX and TOYI of the same images differ");
    cr_assert_eq(sh("cat set.toyi | " VIT " --data /dev/stdin --out p1"), 0, "%s", out);
    cr_expect(same_file("f/weights/step_2.gguf", "p1/weights/step_2.gguf"));
    cr_assert_eq(sh("cat set.toyi | " VIT " --data - --out p2"), 0, "%s", out);
    cr_expect(same_file("f/weights/step_2.gguf", "p2/weights/step_2.gguf"));
    /* FIFOs, the labels beside them; timeout: a second open of a drained FIFO waits for a writer forever */
    cr_assert_eq(sh("(cat idx/s-images-idx3-ubyte > fifo/s-images-idx3-ubyte &) && "
                    "timeout 60 " VIT " --data fifo/s-images-idx3-ubyte --out p3"), 0, "%s", out);
    cr_expect(same_file("f/weights/step_2.gguf", "p3/weights/step_2.gguf"));
    cr_assert_eq(sh("(cat idx/s-images-idx3-ubyte.gz > fifo/s-images-idx3-ubyte.gz &) && "
                    "timeout 60 " VIT " --data fifo/s-images-idx3-ubyte.gz --out p4"), 0, "%s", out);
    cr_expect(same_file("f/weights/step_2.gguf", "p4/weights/step_2.gguf"));
    /* what is not an image set is still named so, from a pipe too */
    cr_expect_eq(sh("cat text.txt | " VIT " --data - --out p5"), 1, "%s", out);
    cr_expect(strstr(out, "toy train: -: not an image set"), "%s", out);
}

/* a ViT --resume names the flags it ignores, and a new --steps is saved in train.json once the run goes on,
 * so that the next --resume ends there too */
Test(cli_train, vit_resume_saves_new_steps_and_names_ignored_flags) {
    write_image_set();
    char v[64];
    cr_assert_eq(sh(VIT " --data set.toyi --out v"), 0, "%s", out);
    cr_assert_eq(sh("$W train --resume v --steps 4 --lr 5 --threads 2 --json"), 0, "%s", out);
    cr_expect(strstr(out, "toy train: --lr is ignored with --resume"), "%s", out);
    cr_expect(!strstr(out, "--steps is ignored") && !strstr(out, "--threads is ignored"), "%s", out);
    cr_expect(strstr(out, "the run now ends at step 4, not 2"), "%s", out);
    train_json_value("v", "steps", v, sizeof v);
    cr_expect_str_eq(v, "4");
    train_json_value("v", "lr", v, sizeof v);
    cr_expect_neq(atof(v), 5.0);
    cr_assert_eq(sh("$W train --resume v"), 0, "%s", out);
    cr_expect(strstr(out, "completed at step 4"), "%s", out);
    cr_expect_eq(sh("test -f v/weights/step_4.gguf"), 0);
    /* describe knows a ViT: its image, patch and classes, no "context ?, vocab ?", and a card */
    cr_assert_eq(sh("$W describe v/weights/latest"), 0, "%s", out);
    cr_expect(strstr(out, "patch 4") && strstr(out, "classes") && !strstr(out, "vocab ?") &&
              !strstr(out, "not in the file") && strstr(out, "Vision Transformer"), "%s", out);
    cr_assert_eq(sh("$W describe v/weights/latest --json"), 0, "%s", out);
    cr_expect(strstr(out, "\"patch_size\": 4"), "%s", out);
}

/* --tokenizer from a pipe: a GGUF (it was mapped, and a pipe cannot be) or a tokenizer.json (sized by seeking
 * to its end) read from /dev/stdin, "-" or a FIFO gives the tokens the file gives (the data's fingerprint) */
Test(cli_train, tokenizer_from_a_pipe) {
    train_model();
    char want[64], got[64];
    cr_assert_eq(sh(TRAIN " --tokenizer m/weights/latest --data text.txt --steps 1 --out f"), 0, "%s", out);
    train_json_value("f", "data_fingerprint", want, sizeof want);
    cr_assert_eq(sh("cat m/weights/latest | " TRAIN " --tokenizer /dev/stdin --data text.txt --steps 1 --out p1"), 0,
                 "%s", out);
    train_json_value("p1", "data_fingerprint", got, sizeof got);
    cr_expect_str_eq(want, got);
    cr_assert_eq(sh("cat m/weights/latest | " TRAIN " --tokenizer - --data text.txt --steps 1 --out p2"), 0, "%s", out);
    train_json_value("p2", "data_fingerprint", got, sizeof got);
    cr_expect_str_eq(want, got);
    /* tokenizer.json: alone from a pipe; from a FIFO with the tokenizer_config.json beside it (add_bos) */
    cr_assert_eq(sh("$W tokenizer train --vocab-size 300 --special '<s>' text.txt -o tok.json && "
                    "mkdir tok fifo && cp tok.json tok/tokenizer.json && "
                    "echo '{\"bos_token\": \"<s>\", \"add_bos_token\": true}' > tok/tokenizer_config.json && "
                    "cp tok/tokenizer_config.json fifo/ && mkfifo fifo/tokenizer.json"), 0, "%s", out);
    cr_assert_eq(sh(TRAIN " --tokenizer tok.json --data text.txt --steps 1 --out j"), 0, "%s", out);
    train_json_value("j", "data_fingerprint", want, sizeof want);
    cr_assert_eq(sh("cat tok.json | " TRAIN " --tokenizer /dev/stdin --data text.txt --steps 1 --out p3"), 0, "%s", out);
    train_json_value("p3", "data_fingerprint", got, sizeof got);
    cr_expect_str_eq(want, got);
    cr_assert_eq(sh(TRAIN " --tokenizer tok/tokenizer.json --data text.txt --steps 1 --out jb"), 0, "%s", out);
    train_json_value("jb", "data_fingerprint", want, sizeof want);
    cr_assert_eq(sh("(cat tok.json > fifo/tokenizer.json &) && "
                    "timeout 60 " TRAIN " --tokenizer fifo/tokenizer.json --data text.txt --steps 1 --out p4"), 0, "%s",
                 out);
    train_json_value("p4", "data_fingerprint", got, sizeof got);
    cr_expect_str_eq(want, got);
    train_json_value("p4", "data_bos", got, sizeof got);
    cr_expect_str_eq(got, "true");
    /* an empty pipe is named as such */
    cr_expect_eq(sh(": | " TRAIN " --tokenizer - --data text.txt --steps 1 --out p5"), 1, "%s", out);
    cr_expect(strstr(out, "-: empty (0 bytes), not a tokenizer"), "%s", out);
    /* --data and --tokenizer from one stream: refused, naming both, rather than the second finding it drained */
    const char *both[] = {"--data - --tokenizer -", "--data /dev/stdin --tokenizer -",
                          "--data - --tokenizer /dev/stdin"};
    for (int i = 0; i < 3; i++) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "cat text.txt | " TRAIN " %s --steps 1 --out p6", both[i]);
        cr_expect_eq(sh(cmd), 2, "%s: %s", both[i], out);
        cr_expect(strstr(out, "both read one stream"), "%s: %s", both[i], out);
    }
    cr_expect_eq(sh("test -e p6"), 1, "a refused run made its folder");
}

/* toy finetune --data from a pipe, as train and eval take it: "-" was opened as a file named "-" */
Test(cli_train, finetune_data_from_a_pipe) {
    train_model();
    const char *ft = "$W finetune --base m/weights/latest --ctx 32 --batch 2 --steps 1 --threads 2";
    cr_assert_eq(sh("for i in $(seq 20); do echo '{\"prompt\":\"the quick fox\",\"completion\":\" jumps over\"}'; "
                    "done > sft.jsonl && %s --data sft.jsonl --out f", ft), 0, "%s", out);
    char want[64], got[64], p[400];
    snprintf(p, sizeof p, "%s/f/finetune.json", tmp);
    json_t *j = json_load_file(p, 0, NULL);
    cr_assert(j, "%s", p);
    snprintf(want, sizeof want, "%s", json_string_value(json_object_get(j, "data_fingerprint")));
    json_decref(j);
    const char *runs[] = {"p1", "p2"}, *paths[] = {"/dev/stdin", "-"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(sh("cat sft.jsonl | %s --data %s --out %s", ft, paths[i], runs[i]), 0, "%s: %s", paths[i], out);
        snprintf(p, sizeof p, "%s/%s/finetune.json", tmp, runs[i]);
        j = json_load_file(p, 0, NULL);
        cr_assert(j, "%s", p);
        snprintf(got, sizeof got, "%s", json_string_value(json_object_get(j, "data_fingerprint")));
        json_decref(j);
        cr_expect_str_eq(want, got, "%s", paths[i]);
    }
}
