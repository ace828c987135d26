/* test-cli-gguf.c: the `toy describe`, `toy quantize` and `toy models`
 * commands (cli/cmd-describe.c, cmd-convert.c, cmd-models.c) run as a user
 * would, on llama.cpp's llama-2-tiny-random. Needs TOY_BIN (set by
 * `make check`); skips without it. */
#include <criterion/criterion.h>
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "toy/gguf.h"
#include "toy/llama.h"
#include "toy/threadpool.h"
#include "harness.h"

#define TINY "../shared/testdata/model-gguf-llama2-tiny-random/llama-2-tiny-random.gguf"

static char *run(const char *cmd, int *rc) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t k;
    while ((k = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += k;
        if (cap - len < 1024) out = realloc(out, cap *= 2);
    }
    out[len] = 0;
    *rc = pclose(p);
    return out;
}

/* runs cmd, which must succeed and print one JSON document; returns it */
static json_t *run_json(const char *cmd) {
    int rc;
    char *out = run(cmd, &rc);
    cr_assert_eq(rc, 0, "%s: %s", cmd, out);
    json_error_t err;
    json_t *j = json_loads(out, 0, &err);
    cr_assert(j, "%s: %s", err.text, out);
    free(out);
    return j;
}

static const char *bin(void) {
    const char *b = getenv("TOY_BIN");
    struct stat sb;
    if (!b || stat(b, &sb)) cr_skip("TOY_BIN not set (run through make check)");
    if (stat(TINY, &sb)) cr_skip("testdata absent");
    static char abs_path[4096]; /* the models test runs it from another directory */
    return realpath(b, abs_path) ? abs_path : b;
}

/* A random model samples byte tokens that do not form characters: the
 * JSON result must still be valid (U+FFFD in their place), not a crash
 * (jansson refuses invalid UTF-8; the result was NULL and printed). */
Test(cli_gguf, generate_json_with_broken_characters) {
    const char *b = bin();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 48 --temp 1.5 --seed 1 --json", b, TINY);
    json_t *j = run_json(cmd);
    cr_expect_eq(json_array_size(json_object_get(j, "ids")), 48);
    const char *text = json_string_value(json_object_get(j, "text"));
    cr_assert(text);
    cr_expect(strstr(text, "\xef\xbf\xbd"), "no replacement character in %s", text);
    json_decref(j);
}

/* --prompt-ids takes the ids -p would make ("1,15043" is BOS + "Hello"
 * for this vocabulary) and refuses anything that is not an id */
Test(cli_gguf, generate_prompt_ids) {
    const char *b = bin();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate -m %s --prompt-ids '1, 15043' -n 4 --temp 0 --json", b, TINY);
    json_t *a = run_json(cmd);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 4 --temp 0 --json", b, TINY);
    json_t *c = run_json(cmd);
    cr_expect(json_equal(json_object_get(a, "prompt_ids"), json_object_get(c, "prompt_ids")));
    cr_expect(json_equal(json_object_get(a, "ids"), json_object_get(c, "ids")));
    json_decref(a);
    json_decref(c);
    const char *bad[] = {"1,x", "1x2", "-1", "99999999999"};
    for (int i = 0; i < 4; i++) {
        int rc;
        snprintf(cmd, sizeof cmd, "%s generate -m %s --prompt-ids '%s' -n 1 2>&1", b, TINY, bad[i]);
        char *out = run(cmd, &rc);
        cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "%s: exit %d", bad[i], rc);
        cr_expect(strstr(out, "is not a token id"), "%s: %s", bad[i], out);
        free(out);
    }
}

/* --lookup (prompt lookup): the ids and text of plain decoding, greedy and sampled, with what the drafts did in
 * --json; a draft past 15 tokens is refused */
Test(cli_gguf, generate_lookup_gives_the_plain_text) {
    const char *b = bin();
    char cmd[2048];
    const char *modes[] = {"--temp 0", "--temp 0.9 --seed 4"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'one two one two one two' -n 40 %s --json", b, TINY, modes[i]);
        json_t *a = run_json(cmd);
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'one two one two one two' -n 40 %s --lookup 6 --json", b, TINY,
                 modes[i]);
        json_t *c = run_json(cmd);
        cr_expect(json_equal(json_object_get(a, "ids"), json_object_get(c, "ids")), "%s", modes[i]);
        cr_expect_str_eq(json_string_value(json_object_get(a, "text")), json_string_value(json_object_get(c, "text")));
        cr_expect_null(json_object_get(a, "lookup"));
        json_t *lk = json_object_get(c, "lookup");
        cr_assert(lk, "the drafts' counts");
        cr_expect_geq(json_integer_value(json_object_get(lk, "drafted")), json_integer_value(json_object_get(lk, "accepted")));
        cr_expect_eq(json_integer_value(json_object_get(lk, "passes")), 39 - json_integer_value(json_object_get(lk, "accepted")));
        json_decref(a);
        json_decref(c);
    }
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi --lookup 16 2>&1", b, TINY);
    char *out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--lookup"), "%s", out);
    free(out);
}

/* --draft: the same ids and text as without, greedy and sampled; the model drafting for itself greedily has
 * every draft kept; --json says what the drafts did; a draft of another vocabulary, or a bound out of range, is
 * refused */
Test(cli_gguf, generate_draft_gives_the_plain_text) {
    const char *b = bin();
    char cmd[2048];
    const char *modes[] = {"--temp 0", "--temp 0.9 --seed 4"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once upon a time' -n 30 %s --json", b, TINY, modes[i]);
        json_t *a = run_json(cmd);
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once upon a time' -n 30 %s --draft %s --draft-max 5 "
                 "--draft-p-min 0 --json", b, TINY, modes[i], TINY);
        json_t *c = run_json(cmd);
        cr_expect(json_equal(json_object_get(a, "ids"), json_object_get(c, "ids")), "%s", modes[i]);
        cr_expect_str_eq(json_string_value(json_object_get(a, "text")), json_string_value(json_object_get(c, "text")));
        json_t *dr = json_object_get(c, "draft");
        cr_assert(dr, "the drafts' counts");
        json_int_t drafted = json_integer_value(json_object_get(dr, "drafted")),
                   accepted = json_integer_value(json_object_get(dr, "accepted"));
        cr_expect_gt(drafted, 0);
        cr_expect_geq(drafted, accepted);
        if (i == 0) cr_expect_eq(accepted, drafted, "its own greedy drafts are kept");
        cr_expect_eq(json_integer_value(json_object_get(dr, "passes")), 29 - accepted);
        cr_expect_gt(json_integer_value(json_object_get(dr, "draft_passes")), 0);
        json_decref(a);
        json_decref(c);
    }
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi --draft %s --draft-max 16 2>&1", b, TINY, TINY);
    char *out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && strstr(out, "--draft-max"), "exit %d: %s", rc, out);
    free(out);
    static const char *const answer[] = {"Hi", NULL};
    struct th_script_model sm = {"{% for m in messages %}{{ m.content }}{% endfor %}", {answer}, "<|end|>", false};
    th_mkdir("draft");
    char other[300];
    snprintf(other, sizeof other, "%s/other.gguf", th_dir);
    th_script_model_write(&sm, other);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 4 --draft %s 2>&1", b, TINY, other);
    out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(out, "draft model's vocabulary"), "exit %d: %s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 4 --draft %s/missing.gguf 2>&1", b, TINY, th_dir);
    out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(out, "--draft"), "exit %d: %s", rc, out);
    free(out);
    th_rmdir();
}

/* Output that cannot be written is exit 1, not 0; -p with --prompt-ids is
 * refused (the ids were used and the -p text printed as their prompt); and
 * Ctrl-C ends a generation with what it made so far and exit 130 (it
 * killed the process, losing a --json result whole). */
Test(cli_gguf, generate_write_errors_interrupts_and_prompt_flags, .timeout = 60) {
    const char *b = bin();
    char cmd[3 * PATH_MAX];
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 8 > /dev/full 2>&1", b, TINY);
    char *out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1, "exit %#x: %s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 8 --json 2>&1 > /dev/full", b, TINY);
    out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 1 && strstr(out, "cannot write the output"), "%#x: %s", rc, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi --prompt-ids '1 2' -n 1 2>&1", b, TINY);
    out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && strstr(out, "not both"), "%#x: %s", rc, out);
    free(out);
    /* the whole 4096-token context takes seconds: the signal comes once the first text is out */
    char tiny[PATH_MAX];
    cr_assert(realpath(TINY, tiny));
    snprintf(cmd, sizeof cmd, "d=$(mktemp -d) && cd $d && { %s generate -m %s -p Hi -n 0 --ignore-eos --threads 1 "
             "> out.txt & p=$!; i=0; while [ ! -s out.txt ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done; "
             "kill -INT $p; wait $p; echo \"rc=$?\"; wc -c < out.txt; cd /; rm -rf $d; }", b, tiny);
    out = run(cmd, &rc);
    cr_expect(strstr(out, "rc=130"), "%s", out);
    free(out);
}

/* Of several stop strings the one that starts first ends the text, though
 * another is listed first (" randomly" is one token holding both: the text
 * went on to "et ran"); and an incomplete last character (byte token
 * <0xA7>, seed 82) is printed as its bytes, as decoding the ids gives, not
 * dropped. */
Test(cli_gguf, generate_earliest_stop_and_last_bytes) {
    const char *b = bin();
    char cmd[2048];
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 40 --temp 0 --stop dom --stop ran", b, TINY);
    char *out = run(cmd, &rc);
    size_t n = strlen(out);
    cr_expect(rc == 0 && n > 11 && !strcmp(out + n - 11, "player et \n"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 4 --temp 2 --top-k 0 --seed 82 --threads 1 --json", b, TINY);
    json_t *j = run_json(cmd);
    json_t *ids = json_object_get(j, "ids");
    cr_assert_eq(json_array_size(ids), 4);
    if (json_integer_value(json_array_get(ids, 3)) == 170) { /* <0xA7> on this CPU's logits */
        const char *text = json_string_value(json_object_get(j, "text"));
        cr_expect(strlen(text) >= 3 && !strcmp(text + strlen(text) - 3, "\xef\xbf\xbd"), "%s", text); /* U+FFFD */
        snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hi -n 4 --temp 2 --top-k 0 --seed 82 --threads 1", b, TINY);
        out = run(cmd, &rc);
        n = strlen(out);
        cr_expect(n >= 2 && (unsigned char)out[n - 2] == 0xA7, "%s", out);
        free(out);
    }
    json_decref(j);
}

/* A signal while quantize writes removes its temp file (a partial
 * "out.gguf.tmp.PID" of up to the whole size was left), and the output
 * that was there stays as it was. */
Test(cli_gguf, a_signal_mid_quantize_leaves_no_temp_file, .timeout = 60) {
    const char *b = bin();
    char dir[] = "/tmp/toy-quant-XXXXXX", path[PATH_MAX], cmd[3 * PATH_MAX];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/big.gguf", dir);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    const int64_t ne[2] = {4096, 2048};
    float *data = malloc(4096 * 2048 * sizeof *data);
    for (int64_t i = 0; i < 4096 * 2048; i++) data[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    char name[32];
    for (int t = 0; t < 6; t++) { /* 6 x 32 MB of f32 */
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", t);
        cr_assert_eq(toy_gguf_writer_add_tensor(w, name, TOY_F32, 2, ne, data), TOY_OK, "%s", toy_last_error());
    }
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    free(data);
    for (int k = 0; k < 2; k++) {
        const char *sig = k ? "INT" : "TERM";
        snprintf(cmd, sizeof cmd, "cd %s && echo old > out.gguf && { %s quantize big.gguf out.gguf q4_k > log.txt 2>&1 "
                 "& p=$!; i=0; while ! ls out.gguf.tmp.* > /dev/null 2>&1 && [ $i -lt 3000 ]; do sleep 0.005; "
                 "i=$((i+1)); done; kill -%s $p; wait $p; echo \"rc=$?\"; ls; cat out.gguf; }", dir, b, sig);
        int rc;
        char *out = run(cmd, &rc);
        cr_expect(strstr(out, k ? "rc=130" : "rc=143") && !strstr(out, ".tmp.") && strstr(out, "old"), "SIG%s: %s",
                  sig, out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

Test(cli_gguf, describe_json) {
    const char *b = bin();
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s describe %s --json", b, TINY);
    json_t *j = run_json(cmd);
    cr_expect_str_eq(json_string_value(json_object_get(j, "architecture")), "llama");
    cr_expect_eq(json_integer_value(json_object_get(j, "params")), 513048);
    cr_expect_str_eq(json_string_value(json_object_get(j, "file_type_name")), "F16");
    json_t *hp = json_object_get(j, "hparams");
    cr_expect_eq(json_integer_value(json_object_get(hp, "embedding_length")), 8);
    cr_expect_eq(json_integer_value(json_object_get(hp, "vocab_size")), 32000);
    json_t *types = json_object_get(j, "tensor_types");
    cr_expect_eq(json_array_size(types), 2);
    cr_expect_eq(json_integer_value(json_object_get(json_array_get(types, 1), "bytes")), 1026048);
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(j, "tokenizer"), "tokens")), 32000);
    const char *card = json_string_value(json_object_get(j, "algorithm"));
    cr_expect(strstr(card, "W_e ∈ R^(d_e×N_V) = (8×32000)"), "%s", card);
    cr_expect(strstr(card, "SiLU(W_gate X̃) ⊙ W_up X̃"));
    json_decref(j);

    int rc;
    snprintf(cmd, sizeof cmd, "%s describe %s", b, TINY);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0);
    cr_expect(strstr(out, "parameters     513.05K (513048)"), "%s", out);
    cr_expect(strstr(out, "bos 1 <s>, eos 2 </s>"), "%s", out);
    free(out);

    snprintf(cmd, sizeof cmd, "%s describe /nonexistent.gguf 2>&1", b);
    out = run(cmd, &rc);
    cr_expect_neq(rc, 0);
    cr_expect(strstr(out, "/nonexistent.gguf"), "%s", out);
    free(out);
}

/* a DeepSeek file (latent attention, a dense first layer, sigmoid routing with a bias): the dimensions line and
 * the card say what the file holds, in its keys' terms */
Test(cli_gguf, describe_latent_attention) {
    th_mkdir("cli-mla");
    struct toy_llama_config c = toy_llama_preset("tiny");
    snprintf(c.arch, sizeof c.arch, "deepseek2");
    c.vocab = 64, c.n_kv_heads = 1, c.kv_lora_rank = 32, c.q_lora_rank = 16, c.rope_dim = 8, c.head_dim = 24;
    c.head_dim_v = 16, c.n_layers = 3, c.n_dense_lead = 1, c.n_experts = 4, c.n_experts_used = 2, c.d_ff_expert = 32;
    c.d_ff_shared = 64, c.shared_ungated = true, c.moe_norm = true, c.moe_scale = 2.5f, c.moe_sigmoid = true;
    c.moe_bias = true;
    struct toy_llama *m = toy_llama_new(&c, 1);
    cr_assert(m, "%s", toy_last_error());
    char path[400], cmd[1024];
    snprintf(path, sizeof path, "%s/ds.gguf", th_dir);
    th_save_llama(m, TOY_F32, path);
    toy_llama_free(m);
    int rc;
    snprintf(cmd, sizeof cmd, "%s describe %s", bin(), path);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    const char *want[] = {"latent attention (kv rank 32, q rank 16, value head dim 16, rope dims 8)",
                          "1 dense layer first", "experts 4 (2 a token, d_ff 32, a shared one of d_ff 64)",
                          "W_k,hᵀ = (32×16), h ∈ [4]", "b_r ∈ R^4", "P ← σ(W_r X̃)", "the 2 largest of P[:, t] + b_r",
                          "w_t,e ← 2.5 · P[e, t] / Σ", "l ≤ L_d: X ← X + W_down", "C and K^r, 40 numbers a position"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_expect(strstr(out, want[i]), "no '%s' in\n%s", want[i], out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s describe %s --json", bin(), path);
    json_t *j = run_json(cmd);
    json_t *la = json_object_get(j, "latent_attention");
    cr_expect(json_integer_value(json_object_get(la, "kv_lora_rank")) == 32 &&
              json_integer_value(json_object_get(la, "value_head_dim")) == 16, "latent_attention in the JSON");
    cr_expect_eq(json_integer_value(json_object_get(j, "leading_dense_layers")), 1);
    json_decref(j);
    th_rmdir();
}

/* where needle first is in hay, or NULL: the card's lines in order */
static const char *after(const char *hay, const char *needle) { return hay ? strstr(hay, needle) : NULL; }

/* gpt-oss (tests/test-llama.c's f_gptoss): the card drew it as a plain mixture, without the attention sinks, the
 * attention-output, router and expert biases or the clamped SwiGLU, and looked for an ffn_norm ("absent") where
 * gpt-oss keeps the MLP's norm under the name post_attention_norm. It has them all, in the forward pass's order, with
 * the alternating window and YaRN; a Llama's card has none of it. */
Test(cli_gguf, describe_gpt_oss_sinks_biases_and_clamped_swiglu) {
    th_mkdir("cli-gptoss");
    struct toy_llama_config c = toy_llama_preset("tiny");
    snprintf(c.arch, sizeof c.arch, "gpt-oss");
    c.vocab = 61, c.d_ff = 96, c.max_ctx = 64, c.rope_mode = TOY_ROPE_NEOX, c.head_dim = 24;
    c.qkv_bias = true, c.out_bias = true, c.attn_sinks = true, c.moe_biases = true, c.swiglu_limit = 7.0f;
    c.n_experts = 4, c.n_experts_used = 2, c.d_ff_expert = 32, c.moe_norm = true;
    c.sliding_window = 4, c.swa_period = 2;
    c.rope_scaling = TOY_ROPE_SCALING_YARN, c.rope_factor = 4, c.rope_orig_ctx = 8;
    c.tied = false;
    struct toy_llama *m = toy_llama_new(&c, 1);
    cr_assert(m, "%s", toy_last_error());
    char path[400], cmd[1024];
    snprintf(path, sizeof path, "%s/oss.gguf", th_dir);
    th_save_llama(m, TOY_F32, path);
    toy_llama_free(m);
    int rc;
    snprintf(cmd, sizeof cmd, "%s describe %s", bin(), path);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    const char *want[] = {"heads 4 (kv 2, head dim 24)", "experts 4 (2 a token, d_ff 32)", "attention sinks",
                          "YaRN ×4 past 8", "attn_q.{weight,bias}", "W_q = (H·d_h×d_e) = (96×64), b_q",
                          "W_o = (d_e×H·d_h) = (64×96), b_o", "s ∈ R^4", "b_gate,e, b_up,e ∈ R^32",
                          "b_down,e ∈ R^64", "W_r = (N_E×d_e) = (4×64), b_r", "cos and sin × 1.139",
                          "on pairs (i, i + 12)", "window 4 for odd l (blk.0, 2, …)", "E_t ← the 2 largest of P[:, t]",
                          "w_t,e ← P[e, t] / Σ_{e' ∈ E_t} P[e', t]", "(32×1) → (64×1), 2 of 4"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_expect(strstr(out, want[i]), "no '%s' in\n%s", want[i], out);
    /* the parameters in the file's terms and the steps in the forward pass's order: the sinks join the softmax, the
     * output bias the residual, and the MLP's norm (post_attention_norm) comes after it and before the router */
    const char *p = after(after(after(after(after(out, "attn_output.{weight,bias}"), "attn_sinks.weight"),
                                      "post_attention_norm.weight"), "ffn_gate_inp.{weight,bias}"),
                          "ffn_{gate,up}_exps.bias");
    cr_expect(after(p, "ffn_down_exps.bias"), "parameters out of order or missing:\n%s", out);
    p = after(out, "Q ← W_q X̃ + b_q; K ← W_k X̃ + b_k; V ← W_v X̃ + b_v");
    p = after(after(p, "RoPE(Q, θ)"), "A ← softmax([S + M; s_h 1ᵀ])");
    p = after(after(p, "Y_h ← V_g A[1:T, :]"), "X ← X + W_o [Y_1; …; Y_4] + b_o");
    p = after(after(p, "X̃ ← RMSNorm(X | γ_ffn)"), "P ← softmax(W_r X̃ + b_r)");
    p = after(p, "g_t,e ← min(W_gate,e x̃_t + b_gate,e, 7); u_t,e ← clamp(W_up,e x̃_t + b_up,e, −7, 7)");
    p = after(p, "Σ_{e ∈ E_t} w_t,e (W_down,e (g_t,e ⊙ σ(1.702 g_t,e) ⊙ (u_t,e + 1)) + b_down,e)");
    cr_expect(after(p, "X ← RMSNorm(X | γ_f)"), "steps out of order or missing:\n%s", out);
    cr_expect(strstr(out, "γ_ffn ∈ R^64 (the MLP's norm, before it)"), "%s", out);
    cr_expect(strstr(out, "gpt-oss stores it as post_attention_norm"), "%s", out);
    /* no sandwich norm, no ffn_norm looked for, no plain SiLU */
    const char *not[] = {"absent", "γ_post_att", "ffn_norm.weight", "SiLU", "tied"};
    for (size_t i = 0; i < sizeof not / sizeof not[0]; i++) cr_expect(!strstr(out, not[i]), "'%s' in\n%s", not[i], out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s describe %s --json", bin(), path);
    json_t *j = run_json(cmd);
    json_t *o = json_object_get(j, "gpt_oss");
    cr_expect(json_is_true(json_object_get(o, "attention_sinks")) &&
                  json_is_true(json_object_get(o, "attention_output_bias")) &&
                  json_is_true(json_object_get(o, "router_bias")) && json_is_true(json_object_get(o, "expert_biases")),
              "gpt_oss's flags in the JSON");
    cr_expect_eq(json_number_value(json_object_get(o, "swiglu_limit")), 7.0);
    cr_expect_str_eq(json_string_value(json_object_get(o, "mlp_norm")), "post_attention_norm.weight");
    cr_expect_eq(json_integer_value(json_object_get(o, "sliding_window")), 4);
    cr_expect_eq(json_integer_value(json_object_get(o, "sliding_window_period")), 2);
    cr_expect_str_eq(json_string_value(json_object_get(o, "rope_scaling")), "yarn");
    cr_expect_eq(json_number_value(json_object_get(o, "rope_scaling_factor")), 4.0);
    const char *card = json_string_value(json_object_get(j, "algorithm"));
    cr_expect(card && strstr(card, "A ← softmax([S + M; s_h 1ᵀ])"), "%s", card ? card : "(no algorithm)");
    json_decref(j);
    th_rmdir();
    /* a Llama's card has none of it */
    snprintf(cmd, sizeof cmd, "%s describe %s --json", bin(), TINY);
    j = run_json(cmd);
    cr_expect(!json_object_get(j, "gpt_oss"));
    card = json_string_value(json_object_get(j, "algorithm"));
    const char *llama_not[] = {"sink", "b_o", "b_r", "min(", "clamp", "post_attention_norm", "YaRN"};
    for (size_t i = 0; i < sizeof llama_not / sizeof llama_not[0]; i++)
        cr_expect(!strstr(card, llama_not[i]), "'%s' in\n%s", llama_not[i], card);
    cr_expect(strstr(card, "X ← X + W_o [Y_1; …; Y_") && strstr(card, "X̃ ← RMSNorm(X | γ_ffn)"), "%s", card);
    json_decref(j);
}

Test(cli_gguf, quantize_and_models) {
    const char *b = bin();
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX";
    cr_assert(mkdtemp(dir));
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/tiny-q8.gguf q8_0 2>&1", b, TINY, dir);
    int rc;
    char *out = run(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "Q8_0"), "%s", out); /* one summary line in a pipe, no bar */
    cr_expect(!strchr(out, '\r'), "progress bar drawn in a pipe");
    free(out);
    char path[512];
    snprintf(path, sizeof path, "%s/tiny-q8.gguf", dir);
    struct toy_gguf *g;
    cr_assert_eq(toy_gguf_open(path, &g), TOY_OK);
    /* rows of 32 take q8_0; rows of 8 cannot, and stay f16; norms stay f32 */
    cr_expect_eq(toy_gguf_tensor(g, toy_gguf_find_tensor(g, "blk.0.ffn_down.weight"))->type, TOY_Q8_0);
    cr_expect_eq(toy_gguf_tensor(g, toy_gguf_find_tensor(g, "token_embd.weight"))->type, TOY_F16);
    cr_expect_eq(toy_gguf_tensor(g, toy_gguf_find_tensor(g, "output_norm.weight"))->type, TOY_F32);
    uint32_t ft;
    cr_expect_eq(toy_gguf_get_u32(g, "general.file_type", &ft), TOY_OK);
    cr_expect_eq(ft, 7);
    toy_gguf_close(g);

    snprintf(cmd, sizeof cmd, "cd %s && HOME=%s TOY_MODEL_DIR=%s %s models --json", dir, dir, dir, b);
    out = run(cmd, &rc);
    cr_assert_eq(rc, 0, "%s", out);
    json_t *j = json_loads(out, 0, NULL);
    cr_assert(json_is_array(j), "%s", out);
    cr_expect_eq(json_array_size(j), 1);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(j, 0), "name")), "tiny-q8");
    json_decref(j);
    free(out);
    /* a listed name works where a path does */
    snprintf(cmd, sizeof cmd, "cd %s && HOME=%s TOY_MODEL_DIR=%s %s describe tiny-q8 --json", dir, dir, dir, b);
    out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "\"Q8_0\""), "%s", out);
    free(out);
    const char *by_name[] = {"tokenize -m tiny-q8 Hello", "chat-template -m tiny-q8 --template chatml --print-template",
                             "generate -m tiny-q8 -p Hello -n 1"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && HOME=%s TOY_MODEL_DIR=%s %s %s 2>&1", dir, dir, dir, b, by_name[i]);
        out = run(cmd, &rc);
        cr_expect_eq(rc, 0, "%s: %s", by_name[i], out);
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/x.gguf q9_9 2>&1", b, TINY, dir);
    out = run(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2);
    free(out);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* `toy bench` on a user's model: one JSON result with a run per thread
 * count, positive speeds and bound, whether the cores were shared, the
 * peak RSS, the machine (CPU, cores, ISA extensions, BLAS core), the cache
 * type and the cache bytes a step reads (an f32 cache twice an f16 one);
 * a bad cache type and a prompt that does not fit the context are usage
 * errors. */
Test(cli_gguf, bench_reports_speed_against_the_bound) {
    const char *b = bin();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1,2 --prompt 16 --gen 4 --reps 1 --json", b, TINY);
    json_t *j = run_json(cmd);
    cr_expect_str_eq(json_string_value(json_object_get(j, "format")), "toy/bench-v1");
    json_t *runs = json_object_get(j, "runs");
    cr_assert_eq(json_array_size(runs), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(runs, i);
        cr_expect_eq(json_integer_value(json_object_get(r, "threads")), (json_int_t)i + 1);
        cr_expect_gt(json_real_value(json_object_get(r, "prefill_tok_s")), 0);
        cr_expect_gt(json_real_value(json_object_get(r, "decode_tok_s")), 0);
        cr_expect_gt(json_real_value(json_object_get(r, "decode_bound_tok_s")), 0);
        cr_expect_gt(json_real_value(json_object_get(r, "decode_bound_sustained_tok_s")), 0);
        cr_expect_gt(json_real_value(json_object_get(r, "sustained_read_gbs")), 0);
        /* whether other work shared the cores (the pool saw it), which CI's parallel tests may well do */
        cr_expect(json_is_boolean(json_object_get(r, "cores_shared")));
    }
    cr_expect_gt(json_real_value(json_object_get(j, "peak_rss_mb")), 0);
    cr_expect_str_eq(json_string_value(json_object_get(j, "kv_type")), "f16"); /* the CLI's default cache */
    json_t *mach = json_object_get(j, "machine"); /* what the figures depend on */
    cr_expect(json_string_length(json_object_get(mach, "cpu")) > 0);
    cr_expect_gt(json_integer_value(json_object_get(mach, "cores")), 0);
    cr_expect(json_is_string(json_object_get(mach, "isa")) && json_is_string(json_object_get(mach, "blas_core")));
    cr_expect(json_is_string(json_object_get(mach, "bf16_gemm")));
    double kv16 = json_real_value(json_object_get(j, "kv_bytes"));
    cr_expect_gt(kv16, 0);
    /* a model smaller than the last-level cache is said to be (decode can then pass the DRAM bound) */
    long llc = toy_llc_bytes();
    double wbytes = json_real_value(json_object_get(j, "decode_bytes"));
    if (llc > 0) cr_expect_eq(json_integer_value(json_object_get(j, "llc_bytes")), (json_int_t)llc);
    else cr_expect_null(json_object_get(j, "llc_bytes"));
    json_decref(j);
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1 --prompt 16 --gen 4 --reps 1", b, TINY);
    int rct;
    char *text = run(cmd, &rct);
    cr_expect_eq(WEXITSTATUS(rct), 0, "%s", text);
    cr_expect(!!strstr(text, "last-level cache") == (llc > 0 && wbytes < (double)llc), "llc %ld, weights %.0f: %s", llc,
              wbytes, text);
    free(text);
    /* an f32 cache: twice the bytes a step reads from it */
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1 --prompt 16 --gen 4 --reps 1 --kv-type f32 --json", b, TINY);
    j = run_json(cmd);
    cr_expect_str_eq(json_string_value(json_object_get(j, "kv_type")), "f32");
    cr_expect_float_eq(json_real_value(json_object_get(j, "kv_bytes")), 2 * kv16, 1e-6 * kv16);
    json_decref(j);
    int rc;
    snprintf(cmd, sizeof cmd, "%s bench -m %s --kv-type q8_0 2>&1", b, TINY);
    char *out = run(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2, "%s", out);
    cr_expect(strstr(out, "--kv-type"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s bench -m %s --prompt 100000 2>&1", b, TINY);
    out = run(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2, "%s", out);
    cr_expect(strstr(out, "100000") && strstr(out, "context"), "%s", out);
    free(out);
}

/* a copy of the tiny model at `out` with the u32 / f32 value of `key` replaced */
static void patched_copy(const char *out, const char *key, const void *val4) {
    FILE *f = fopen(TINY, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *d = malloc((size_t)n);
    cr_assert_eq(fread(d, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    size_t kl = strlen(key);
    char *p = memmem(d, (size_t)n, key, kl);
    cr_assert(p, "%s not in the model", key);
    memcpy(p + kl + 4, val4, 4); /* after the key: its u32 type, then the value */
    f = fopen(out, "wb");
    cr_assert(f);
    fwrite(d, 1, (size_t)n, f);
    fclose(f);
    free(d);
}

static void expect_exit(const char *cmd, int code, const char *needle) {
    int rc;
    char *out = run(cmd, &rc);
    cr_expect(WIFEXITED(rc) && WEXITSTATUS(rc) == code, "%s: exit %d, not %d: %s", cmd, rc, code, out);
    if (needle) cr_expect(strstr(out, needle), "%s: no '%s' in: %s", cmd, needle, out);
    free(out);
}

/* TINY copied to path, with key (if given) replaced by the string value and one more 1-D f32 tensor (if given) */
static void tiny_variant(const char *path, const char *key, const char *value, const char *tname, const float *tdata,
                         const int64_t *tne) {
    struct toy_gguf *src;
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_open(TINY, &src), TOY_OK);
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_kv(src); i++)
        if (!key || strcmp(toy_gguf_kv_key(src, i), key)) cr_assert_eq(toy_gguf_writer_copy_kv(w, src, i), TOY_OK);
    if (key) cr_assert_eq(toy_gguf_writer_set_str(w, key, value), TOY_OK);
    for (int64_t i = 0; i < toy_gguf_n_tensors(src); i++) {
        const struct toy_gguf_tensor *t = toy_gguf_tensor(src, i);
        cr_assert_eq(toy_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data), TOY_OK);
    }
    if (tname) cr_assert_eq(toy_gguf_writer_add_tensor(w, tname, TOY_F32, 1, tne, tdata), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    toy_gguf_close(src);
}

/* Bad input is an error naming what is wrong, never a crash: a base that is not there for merge, a context too
 * big to cache, broken hyperparameters, an adapter where a model belongs, flags that do not exist */
Test(cli_gguf, bad_inputs_are_errors_not_crashes) {
    const char *b = bin();
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", cmd[4096], f[256];
    cr_assert(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "%s merge %s/none.gguf %s -o %s/m.gguf 2>&1", b, dir, TINY, dir);
    expect_exit(cmd, 1, "none.gguf");
    uint32_t huge = 2000000000u;
    snprintf(f, sizeof f, "%s/ctx.gguf", dir);
    patched_copy(f, "llama.context_length", &huge);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi -n 2 2>&1", b, f);
    expect_exit(cmd, 1, "kv cache");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi -n 2 --ctx 64 2>&1", b, f);
    expect_exit(cmd, 0, NULL);
    float nan = NAN;
    snprintf(f, sizeof f, "%s/eps.gguf", dir);
    patched_copy(f, "llama.attention.layer_norm_rms_epsilon", &nan);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi -n 2 2>&1", b, f);
    expect_exit(cmd, 1, "norm epsilon");
    snprintf(cmd, sizeof cmd, "%s describe %s --json", b, f);
    json_t *j = run_json(cmd);
    json_t *hp = json_object_get(j, "hparams");
    cr_expect(json_is_object(hp) && json_is_null(json_object_get(hp, "norm_eps")), "NaN is null, the rest stays");
    cr_expect_eq(json_integer_value(json_object_get(hp, "embedding_length")), 8);
    json_decref(j);
    /* an attention-output bias the Llama graph would leave out is refused, not dropped */
    float bias[8] = {0};
    int64_t bne[1] = {8};
    snprintf(f, sizeof f, "%s/obias.gguf", dir);
    tiny_variant(f, NULL, NULL, "blk.0.attn_output.bias", bias, bne);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi -n 1 2>&1", b, f);
    expect_exit(cmd, 1, "attn_output.bias");
    /* a hyperparameter of the wrong type is an error naming it, not its default read in silence */
    snprintf(f, sizeof f, "%s/strbase.gguf", dir);
    tiny_variant(f, "llama.rope.freq_base", "500000", NULL, NULL, NULL);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi -n 1 2>&1", b, f);
    expect_exit(cmd, 1, "key 'llama.rope.freq_base' is str, expected a number");
    /* describe names it as a key of the wrong type, not as one missing from the file */
    snprintf(cmd, sizeof cmd, "%s describe %s 2>&1", b, f);
    int drc;
    char *dout = run(cmd, &drc);
    cr_expect(strstr(dout, "wrong type     llama.rope.freq_base: str, not a number"), "%s", dout);
    cr_expect(!strstr(dout, "not in the file"), "%s", dout);
    free(dout);
    snprintf(cmd, sizeof cmd, "%s describe %s --json", b, f);
    j = run_json(cmd);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "hparams_wrong_type"),
                                                       "llama.rope.freq_base")) ?: "", "str");
    cr_expect(json_is_null(json_object_get(json_object_get(j, "hparams"), "rope_freq_base")));
    json_decref(j);
    /* a LoRA adapter is described as one, and refused as a model */
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.type", "adapter");
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    float a[8] = {0};
    int64_t ne[2] = {8, 1};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", TOY_F32, 2, ne, a), TOY_OK);
    snprintf(f, sizeof f, "%s/adapter.gguf", dir);
    cr_assert_eq(toy_gguf_writer_write(w, f), TOY_OK);
    toy_gguf_writer_free(w);
    snprintf(cmd, sizeof cmd, "%s describe %s 2>&1", b, f);
    expect_exit(cmd, 0, "LoRA adapter");
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/q.gguf q8_0 2>&1", b, f, dir);
    expect_exit(cmd, 1, "LoRA adapter");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi 2>&1", b, f);
    expect_exit(cmd, 1, "LoRA adapter");
    /* flags: unknown ones named as such, values whole and in range, --help is not an error */
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p x --bogus 2>&1", b, TINY);
    expect_exit(cmd, 2, "unknown flag --bogus");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p x -n 1e30 2>&1", b, TINY);
    expect_exit(cmd, 2, "whole number");
    snprintf(cmd, sizeof cmd, "%s bench -m %s --thread 2 2>&1", b, TINY);
    expect_exit(cmd, 2, "unknown flag --thread");
    const char *cmds[] = {"describe", "quantize", "merge", "models", "convert", "generate", "bench"};
    for (int i = 0; i < 7; i++) {
        snprintf(cmd, sizeof cmd, "%s %s --help 2>/dev/null", b, cmds[i]);
        expect_exit(cmd, 0, "usage");
    }
    /* a refused prompt prints nothing on stdout; nor does a trace that cannot be written */
    snprintf(cmd, sizeof cmd, "%s generate -m %s --ctx 4 -p 'a prompt longer than four positions' 2>/dev/null", b,
             TINY);
    expect_exit(cmd, 1, NULL);
    int rc;
    char *out = run(cmd, &rc);
    cr_expect_str_eq(out, "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi --trace %s/no/such/t.json 2>&1", b, TINY, dir);
    expect_exit(cmd, 1, "t.json");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p hi --trace /dev/null 2>&1", b, TINY);
    expect_exit(cmd, 1, "/dev/null: not a regular file");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* --json's text is what text mode prints after the prompt, stop strings cut the same way, and a continuation
 * keeps its first space */
Test(cli_gguf, generate_json_text_is_the_printed_text) {
    const char *b = bin();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 12 --temp 0 --json", b, TINY);
    json_t *j = run_json(cmd);
    char *full = strdup(json_string_value(json_object_get(j, "text")));
    json_decref(j);
    cr_assert(strlen(full) > 8, "%s", full);
    cr_expect_eq(full[0], ' ', "'%s': Hello's continuation starts with its token's space", full);
    char stop[8];
    snprintf(stop, sizeof stop, "%.2s", full + 5);
    if (strchr(stop, '\'') || strchr(stop, '\\') || (unsigned char)stop[0] >= 0x80 || (unsigned char)stop[1] >= 0x80)
        snprintf(stop, sizeof stop, "%.1s", full + 5);
    size_t cut = (size_t)(strstr(full, stop) - full);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 12 --temp 0 --stop '%s' --json", b, TINY, stop);
    j = run_json(cmd);
    const char *t = json_string_value(json_object_get(j, "text"));
    cr_expect(strlen(t) == cut && !strncmp(t, full, cut), "json '%s' vs '%.*s' (stop '%s')", t, (int)cut, full, stop);
    json_decref(j);
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p Hello -n 12 --temp 0 --stop '%s'", b, TINY, stop);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0);
    char want[256];
    snprintf(want, sizeof want, "Hello%.*s\n", (int)cut, full);
    cr_expect_str_eq(out, want);
    free(out);
    free(full);
}

/* `toy models` as a user meets it: two tiny.gguf in two places are
 * dir:tiny and models:tiny and `-m tiny` is refused naming both (it took
 * one silently); an adapter is left out with a count on stderr; a file
 * that cannot be read is named with why; an Ollama model from hf.co keeps
 * its host and `generate -m` takes that name. */
Test(cli_gguf, models_names_are_unique_and_only_models) {
    const char *b = bin();
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", cmd[32768];
    cr_assert(mkdtemp(dir));
    char tiny[PATH_MAX];
    cr_assert(realpath(TINY, tiny));
    snprintf(cmd, sizeof cmd,
             "cd %s && mkdir -p mine models home/.ollama/models/blobs home/.ollama/models/manifests/hf.co/bartowski/T-GGUF"
             " && cp %s mine/tiny.gguf && %s quantize %s models/tiny.gguf q8_0 2>/dev/null"
             " && echo junk > mine/junk.gguf && cp %s home/.ollama/models/blobs/sha256-1234"
             " && echo '{\"layers\":[{\"mediaType\":\"application/vnd.ollama.image.model\",\"digest\":\"sha256:1234\"}]}'"
             " > home/.ollama/models/manifests/hf.co/bartowski/T-GGUF/Q8_0",
             dir, tiny, b, tiny, tiny);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    /* an adapter beside them */
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.type", "adapter");
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    float a[8] = {0};
    int64_t ne[2] = {8, 1};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.attn_q.weight.lora_a", TOY_F32, 2, ne, a), TOY_OK);
    char f[PATH_MAX];
    snprintf(f, sizeof f, "%s/mine/adapter.gguf", dir);
    cr_assert_eq(toy_gguf_writer_write(w, f), TOY_OK);
    toy_gguf_writer_free(w);

    char env[1024];
    snprintf(env, sizeof env, "cd %s && HOME=%s/home TOY_MODEL_DIR=%s/mine HF_HOME= OLLAMA_MODELS=", dir, dir, dir);
    snprintf(cmd, sizeof cmd, "%s %s models 2>&1", env, b);
    int rc;
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "dir:tiny ") && strstr(out, "models:tiny "), "%s", out);
    cr_expect(strstr(out, "hf.co/bartowski/T-GGUF:Q8_0"), "%s", out);
    cr_expect(!strstr(out, "adapter "), "an adapter listed as a model: %s", out);
    cr_expect(strstr(out, "left out 1 GGUF file that is not a model"), "%s", out);
    cr_expect(strstr(out, "cannot read") && strstr(out, "junk.gguf"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s %s generate -m tiny -p hi -n 1 2>&1", env, b);
    expect_exit(cmd, 1, "ambiguous");
    snprintf(cmd, sizeof cmd, "%s %s generate -m models:tiny -p hi -n 1 2>&1", env, b);
    expect_exit(cmd, 0, NULL);
    snprintf(cmd, sizeof cmd, "%s %s generate -m hf.co/bartowski/T-GGUF:Q8_0 -p hi -n 1 2>&1", env, b);
    expect_exit(cmd, 0, NULL);
    snprintf(cmd, sizeof cmd, "%s %s generate -m junk -p hi -n 1 2>&1", env, b);
    expect_exit(cmd, 1, "GGUF header");
    snprintf(cmd, sizeof cmd, "%s %s generate -m adapter -p hi -n 1 2>&1", env, b);
    expect_exit(cmd, 1, "LoRA adapter");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* writes a metadata-only GGUF of arch with the given u32 keys (NULL-ended
 * pairs) and, if with_embd, one f32 token_embd.weight (64 x 10) */
static void meta_gguf(const char *path, const char *arch, bool with_embd, const char *const *keys, const uint32_t *vals,
                      int n) {
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", arch);
    char k[128];
    for (int i = 0; i < n; i++) {
        snprintf(k, sizeof k, "%s.%s", arch, keys[i]);
        toy_gguf_writer_set_u32(w, k, vals[i]);
    }
    static float zeros[640];
    int64_t ne[2] = {64, 10};
    if (with_embd) cr_assert_eq(toy_gguf_writer_add_tensor(w, "token_embd.weight", TOY_F32, 2, ne, zeros), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
}

/* describe printed defaults as facts: "rms eps 1e-05" for a LayerNorm
 * (MPT) file, "rope base 10000" where the key is absent, "tied embeddings"
 * and a forward pass for a file without tensors, "for l = 1..0" for a file
 * without block_count. It shows what the file says, marks what it lacks. */
Test(cli_gguf, describe_shows_only_what_the_file_says) {
    const char *b = bin();
    char cmd[8192];
    int rc;
    const char *mpt = "../shared/testdata/llamacpp-vocab-gguf/ggml-vocab-mpt.gguf";
    struct stat sb;
    if (!stat(mpt, &sb)) {
        snprintf(cmd, sizeof cmd, "%s describe %s", b, mpt);
        char *out = run(cmd, &rc);
        cr_expect_eq(rc, 0, "%s", out);
        cr_expect(strstr(out, "ln eps 1e-05") && !strstr(out, "rms eps"), "%s", out);
        cr_expect(!strstr(out, "rope base 10000") && strstr(out, "not in the file: rope base"), "%s", out);
        cr_expect(!strstr(out, "tied") && !strstr(out, "for l ="), "%s", out);
        cr_expect(strstr(out, "no tensors: a vocabulary-only file"), "%s", out);
        free(out);
        snprintf(cmd, sizeof cmd, "%s describe %s --json", b, mpt);
        json_t *j = run_json(cmd);
        json_t *hp = json_object_get(j, "hparams");
        cr_expect(json_is_null(json_object_get(hp, "rope_freq_base")));
        cr_expect(json_is_null(json_object_get(hp, "tied_embeddings")));
        cr_expect(json_real_value(json_object_get(hp, "norm_eps")) > 0);
        json_decref(j);
    }
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", f[256];
    cr_assert(mkdtemp(dir));
    /* tensors but no block_count: no card over zeros */
    snprintf(f, sizeof f, "%s/nolayers.gguf", dir);
    const char *k1[] = {"embedding_length"};
    const uint32_t v1[] = {64};
    meta_gguf(f, "llama", true, k1, v1, 1);
    snprintf(cmd, sizeof cmd, "%s describe %s", b, f);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(!strstr(out, "for l = 1..0") && strstr(out, "no algorithm card"), "%s", out);
    cr_expect(strstr(out, "layers ?") && strstr(out, "not in the file: layers"), "%s", out);
    cr_expect(!strstr(out, "rms eps") && !strstr(out, "rope base 10000"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Gemma 2 slides its window on blk.0, blk.2, ... (0-based even, as
 * src/models/llama.c and llama.cpp's set_swa_pattern(2) do), which the
 * card's 1-based l = 1..L calls odd; the card said "even l", and on the
 * soft-capping line rather than the mask's. */
Test(cli_gguf, describe_gemma2_window_is_on_odd_one_based_layers) {
    const char *b = bin();
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", f[256], cmd[8192];
    cr_assert(mkdtemp(dir));
    snprintf(f, sizeof f, "%s/g2.gguf", dir);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", "gemma2");
    const char *keys[] = {"gemma2.embedding_length", "gemma2.block_count", "gemma2.attention.head_count",
                          "gemma2.attention.head_count_kv", "gemma2.feed_forward_length", "gemma2.context_length",
                          "gemma2.attention.sliding_window"};
    const uint32_t vals[] = {64, 4, 2, 1, 128, 64, 16};
    for (int i = 0; i < 7; i++) toy_gguf_writer_set_u32(w, keys[i], vals[i]);
    toy_gguf_writer_set_f32(w, "gemma2.attn_logit_softcapping", 50);
    toy_gguf_writer_set_f32(w, "gemma2.attention.layer_norm_rms_epsilon", 1e-6f);
    static float zeros[640];
    int64_t ne[2] = {64, 10};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "token_embd.weight", TOY_F32, 2, ne, zeros), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, f), TOY_OK);
    toy_gguf_writer_free(w);
    snprintf(cmd, sizeof cmd, "%s describe %s", b, f);
    int rc;
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(!strstr(out, "even l"), "%s", out);
    const char *mask = strstr(out, "softmax(S + M)");
    cr_assert(mask, "%s", out);
    const char *eol = strchr(mask, '\n');
    const char *win = strstr(mask, "window 16 for odd l (blk.0, 2");
    cr_expect(win && eol && win < eol, "the window is not on the mask's line: %s", out);
    const char *cap = strstr(out, "50·tanh(S/50)");
    cr_expect(cap && strchr(cap, '\n') && !memchr(cap, 'w', (size_t)(strchr(cap, '\n') - cap)), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* `toy describe` of a GGUF of architecture arch holding the u32 and f32 keys arch.KEY given (lists ending in a NULL
 * key), a token_embd of d_model 64, and 1-D tensors `vecs` of n_vec (a NULL-ended list): its output, to free */
struct key_u32 { const char *key; uint32_t v; };
struct key_f32 { const char *key; float v; };
static char *describe_keys(const char *arch, const struct key_u32 *u, const struct key_f32 *f, const char *const *vecs,
                           int64_t n_vec) {
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", path[256], key[128], cmd[8192];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", arch);
    for (; u && u->key; u++) snprintf(key, sizeof key, "%s.%s", arch, u->key), toy_gguf_writer_set_u32(w, key, u->v);
    for (; f && f->key; f++) snprintf(key, sizeof key, "%s.%s", arch, f->key), toy_gguf_writer_set_f32(w, key, f->v);
    static float zeros[640];
    int64_t ne[2] = {64, 10};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "token_embd.weight", TOY_F32, 2, ne, zeros), TOY_OK);
    for (; vecs && *vecs; vecs++) cr_assert_eq(toy_gguf_writer_add_tensor(w, *vecs, TOY_F32, 1, &n_vec, zeros), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, path), TOY_OK);
    toy_gguf_writer_free(w);
    snprintf(cmd, sizeof cmd, "%s describe %s", bin(), path);
    int rc;
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    return out;
}

/* Gemma 3: of each 6 layers the last is global (llama.cpp's default, no key), the others slide and rotate with
 * base 10000; QK-norm and the sandwich norms on the card */
Test(cli_gguf, describe_gemma3_sliding_layers_and_their_rope_base) {
    char *out = describe_keys("gemma3",
                              (struct key_u32[]){{"embedding_length", 64}, {"block_count", 12},
                                                 {"attention.head_count", 2}, {"attention.head_count_kv", 1},
                                                 {"feed_forward_length", 128}, {"context_length", 64},
                                                 {"attention.sliding_window", 512}, {"attention.key_length", 32},
                                                 {NULL, 0}},
                              (struct key_f32[]){{"rope.freq_base", 1e6f}, {"attention.layer_norm_rms_epsilon", 1e-6f},
                                                 {NULL, 0}},
                              (const char *[]){"blk.0.attn_q_norm.weight", "blk.0.post_attention_norm.weight", NULL}, 32);
    cr_expect(strstr(out, "window 512 unless 6 | l"), "%s", out);
    cr_expect(strstr(out, "θ_l = 10000 where l slides"), "%s", out);
    cr_expect(strstr(out, "RoPE base θ = 1e+06"), "%s", out);
    cr_expect(strstr(out, "Q_h ← RMSNorm(Q_h | γ_q)"), "%s", out);
    cr_expect(strstr(out, "γ_post_att"), "%s", out);
    cr_expect(!strstr(out, "tanh"), "no softcaps: %s", out);
    free(out);
}

/* OLMo 2 norms after attention and the MLP, not before: the card has no γ_att or γ_ffn and says so; Granite's
 * multipliers are on the card, with 1/sqrt(d_h) where the file has no attention scale */
Test(cli_gguf, describe_olmo2_norms_after_and_granite_multipliers) {
    const struct key_u32 shape[] = {{"embedding_length", 64}, {"block_count", 2}, {"attention.head_count", 4},
                                    {"attention.head_count_kv", 4}, {"feed_forward_length", 128},
                                    {"context_length", 64}, {NULL, 0}};
    char *out = describe_keys("olmo2", shape, NULL, (const char *[]){"blk.0.post_attention_norm.weight", NULL}, 64);
    cr_expect(strstr(out, "X̃ ← X (no norm before attention)"), "%s", out);
    cr_expect(strstr(out, "RMSNorm(W_down(SiLU(W_gate X) ⊙ W_up X) | γ_post_ffn)"), "%s", out);
    cr_expect(!strstr(out, "γ_att ∈") && !strstr(out, "γ_ffn ∈"), "%s", out);
    free(out);
    /* with a window it is OLMo 3's: 3 of each 4 layers slide, rotated with the global base unscaled */
    const struct key_u32 olmo3[] = {{"embedding_length", 64}, {"block_count", 8}, {"attention.head_count", 4},
                                    {"attention.head_count_kv", 4}, {"feed_forward_length", 128},
                                    {"context_length", 64}, {"attention.sliding_window", 16}, {NULL, 0}};
    out = describe_keys("olmo2", olmo3, NULL, (const char *[]){"blk.0.post_attention_norm.weight", NULL}, 64);
    cr_expect(strstr(out, "window 16 unless 4 | l"), "%s", out);
    cr_expect(strstr(out, "K ← RoPE(K, θ), unscaled where l slides"), "%s", out);
    free(out);
    out = describe_keys("granite", shape,
                        (struct key_f32[]){{"embedding_scale", 12}, {"residual_scale", 0.25f}, {"logit_scale", 8},
                                           {NULL, 0}},
                        NULL, 0);
    cr_expect(strstr(out, "X times 12 after the embedding, each attention and MLP output times 0.25 before its "
                          "residual add, S times 0.25 in place of 1/√d_h, Z divided by 8"), "%s", out);
    free(out);
}

/* Phi-3: the fused attn_qkv and gate-up ffn_up on the card; 12 of 16 dims rotated, LongRoPE's tables and its
 * attention factor, on the summary and in the RoPE step */
Test(cli_gguf, describe_phi3_fused_projections_and_longrope) {
    char *out = describe_keys("phi3",
                              (struct key_u32[]){{"embedding_length", 64}, {"block_count", 2},
                                                 {"attention.head_count", 4}, {"attention.head_count_kv", 2},
                                                 {"feed_forward_length", 96}, {"context_length", 64},
                                                 {"rope.dimension_count", 12},
                                                 {"rope.scaling.original_context_length", 8}, {NULL, 0}},
                              (struct key_f32[]){{"rope.scaling.attn_factor", 1.19f}, {NULL, 0}},
                              (const char *[]){"blk.0.attn_qkv.weight", "blk.0.ffn_up.weight",
                                               "rope_factors_long.weight", "rope_factors_short.weight", NULL}, 6);
    const char *want[] = {"head dim 16, 12 rotated", "LongRoPE past 8", "rope attn factor 1.19",
                          "[W_q; W_k; W_v] = (128×64)", "[W_gate; W_up] = (2·96×64)",
                          "ρ_long, ρ_short ∈ R^6", "on the first 12 of each head's 16 dims",
                          "ρ = ρ_long for a context past 8, else ρ_short", "cos and sin × 1.19"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) cr_expect(strstr(out, want[i]), "no '%s' in %s", want[i], out);
    free(out);
}

/* Ministral 3 (mistral3): the queries' temperature on the summary and as a step of the card */
Test(cli_gguf, describe_mistral3_query_temperature) {
    char *out = describe_keys("mistral3",
                              (struct key_u32[]){{"embedding_length", 64}, {"block_count", 2},
                                                 {"attention.head_count", 4}, {"attention.head_count_kv", 2},
                                                 {"feed_forward_length", 96}, {"context_length", 64},
                                                 {"rope.scaling.original_context_length", 16384}, {NULL, 0}},
                              (struct key_f32[]){{"attention.temperature_scale", 0.1f}, {NULL, 0}}, NULL, 0);
    cr_expect(strstr(out, "query temperature 0.1"), "%s", out);
    cr_expect(strstr(out, "Q[:, t] ← Q[:, t] · (1 + 0.1 ln(1 + ⌊t / 16384⌋))"), "%s", out);
    free(out);
}

/* quantize's note blamed row length for an i32 matrix it cannot convert at
 * all ("i32, rows of 64: f32 needs a multiple of 1"): it says the tensor is
 * copied as it is; a row-length fallback is still explained by its rows.
 * A file without tensors "quantized" into a file labelled Q4_0: refused. */
Test(cli_gguf, quantize_notes_say_what_happened_and_refuse_no_tensors) {
    const char *b = bin();
    char dir[] = "/tmp/toy-cli-gguf-XXXXXX", f[256], cmd[8192];
    cr_assert(mkdtemp(dir));
    snprintf(f, sizeof f, "%s/mixed.gguf", dir);
    struct toy_gguf_writer *w;
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    static float fz[64 * 64];
    static int32_t iz[64 * 4];
    int64_t sq[2] = {64, 64}, ids[2] = {64, 4}, odd[2] = {48, 5};
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", TOY_F32, 2, sq, fz), TOY_OK);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.ids", TOY_I32, 2, ids, iz), TOY_OK);
    cr_assert_eq(toy_gguf_writer_add_tensor(w, "blk.0.odd.weight", TOY_F32, 2, odd, fz), TOY_OK);
    cr_assert_eq(toy_gguf_writer_write(w, f), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    int rc;
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/f32.gguf f32 2>&1", b, f, dir);
    char *out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "1 of 3 matrices are copied as they are (e.g. i32)"), "%s", out);
    cr_expect(!strstr(out, "needs a multiple of 1"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/q4.gguf q4_0 2>&1", b, f, dir);
    out = run(cmd, &rc);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "copied as they are (e.g. i32)"), "%s", out);
    cr_expect(strstr(out, "rows of 48: q4_0 needs a multiple of 32"), "%s", out);
    free(out);
    /* no tensors */
    snprintf(f, sizeof f, "%s/vocab.gguf", dir);
    cr_assert_eq(toy_gguf_writer_init(&w), TOY_OK);
    toy_gguf_writer_set_str(w, "general.architecture", "llama");
    toy_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    cr_assert_eq(toy_gguf_writer_write(w, f), TOY_OK, "%s", toy_last_error());
    toy_gguf_writer_free(w);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/vq.gguf q4_0 2>&1", b, f, dir);
    expect_exit(cmd, 1, "no tensors to quantize");
    snprintf(f, sizeof f, "%s/vq.gguf", dir);
    struct stat sb;
    cr_expect(stat(f, &sb) != 0, "a file was written");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* bench kept the first 16 of 17 thread counts and ran --gen 1 as 2, both
 * without a word: both are usage errors now (exit 2, saying why). */
Test(cli_gguf, bench_refuses_what_it_would_change_silently) {
    const char *b = bin();
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17 --prompt 4 --gen 2 "
             "--reps 1 2>&1", b, TINY);
    expect_exit(cmd, 2, "at most 16 counts");
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1 --prompt 4 --gen 1 --reps 1 2>&1", b, TINY);
    expect_exit(cmd, 2, "--gen 1: at least 2");
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1 --prompt 4 --gen 2 --reps 1 2>&1", b, TINY);
    expect_exit(cmd, 0, "1 thread");
}

/* eval --ctx past the model's context uses the model's (it became 256
 * without a word), and the JSON says which */
Test(cli_gguf, eval_ctx_is_capped_at_the_models_and_reported) {
    const char *b = bin();
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s eval -m %s --data ../shared/testdata/corpus-tinyshakespeare/input.txt --ctx 5000 "
             "--max-windows 2 --json", b, TINY);
    json_t *j = run_json(cmd);
    cr_expect_eq(json_integer_value(json_object_get(j, "ctx")), 4096);
    cr_expect_eq(json_integer_value(json_object_get(j, "windows")), 2);
    json_decref(j);
}

/* --bf16 on eval, generate and bench: the tiny model (f16) and an f32 copy
 * evaluate with bf16 products (the JSON says so) to nearly their loss; a
 * bf16 copy has no f32 or f16 matrix, so there --bf16 says it changes
 * nothing and gives the same loss to the bit */
Test(cli_gguf, bf16_inference_rounds_float_weights_and_says_where_it_does_not) {
    const char *b = bin();
    th_mkdir("cli-bf16");
    const char *types[] = {"f16", "f32", "bf16"};
    char cmd[2048], path[3][400];
    snprintf(path[0], sizeof path[0], "%s", TINY);
    for (int t = 1; t < 3; t++) {
        snprintf(path[t], sizeof path[t], "%s/tiny-%s.gguf", th_dir, types[t]);
        snprintf(cmd, sizeof cmd, "%s quantize %s %s %s 2>&1", b, TINY, path[t], types[t]);
        expect_exit(cmd, 0, NULL);
    }
    bool native = toy_cpu_bf16_native();
    for (int t = 0; t < 3; t++) {
        double loss[2];
        for (int bf16 = 0; bf16 < 2; bf16++) {
            snprintf(cmd, sizeof cmd, "%s eval -m %s --data ../shared/testdata/corpus-tinyshakespeare/input.txt "
                     "--ctx 64 --max-windows 8 --json%s 2>/dev/null", b, path[t], bf16 ? " --bf16" : "");
            json_t *j = run_json(cmd);
            loss[bf16] = json_real_value(json_object_get(j, "loss"));
            bool on = json_is_true(json_object_get(j, "bf16"));
            cr_expect_eq(on, bf16 && native && t < 2, "%s%s: bf16 %d", types[t], bf16 ? " --bf16" : "", on);
            json_decref(j);
        }
        cr_expect(fabs(loss[1] - loss[0]) <= 1e-3 * loss[0], "%s: loss %.9g, with --bf16 %.9g", types[t], loss[0],
                  loss[1]);
        if (native && t < 2) cr_expect_neq(loss[0], loss[1], "%s: --bf16 changed no bit of the loss", types[t]);
        else cr_expect_eq(loss[0], loss[1], "%s: --bf16 changed the loss: %.9g, %.9g", types[t], loss[0], loss[1]);
    }
    snprintf(cmd, sizeof cmd, "%s eval -m %s --data ../shared/testdata/corpus-tinyshakespeare/input.txt --ctx 64 "
             "--max-windows 1 --bf16 2>&1", b, path[2]);
    expect_exit(cmd, 0, native ? "f32 and f16 weights only; this model's are bf16" : "no faster than f32");
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p 'Once upon a time there was' -n 4 --temp 0 --bf16 2>&1", b, path[1]);
    expect_exit(cmd, 0, NULL);
    snprintf(cmd, sizeof cmd, "%s bench -m %s --threads 1 --prompt 16 --gen 2 --reps 1 --bf16 --json", b, path[1]);
    json_t *j = run_json(cmd);
    cr_expect_eq(json_is_true(json_object_get(j, "bf16_products")), native);
    json_decref(j);
    th_rmdir();
}

/* toy generate --json-schema / --json-object: a random model at temperature 1 writes JSON the schema takes
 * (the end comes only once the value is whole); schemas toy cannot enforce, or cannot read, are exit 2 */
Test(cli_gguf, generate_json_schema) {
    const char *b = bin();
    char cmd[8192];
    int ended = 0;
    for (int seed = 1; seed <= 4; seed++) {
        snprintf(cmd, sizeof cmd,
                 "%s generate -m %s -p 'JSON:' -n 300 --temp 1 --seed %d --json %s 2>&1", b, TINY, seed,
                 seed % 2 ? "--json-object"
                          : "--json-schema '{\"type\":\"object\",\"properties\":{\"ok\":{\"type\":\"boolean\"},"
                            "\"n\":{\"enum\":[1,2]}},\"required\":[\"ok\",\"n\"]}'");
        json_t *j = run_json(cmd);
        const char *text = json_string_value(json_object_get(j, "text"));
        cr_assert(text, "%s", cmd);
        const char *finish = json_string_value(json_object_get(j, "finish_reason"));
        cr_assert(finish, "%s", cmd);
        if (strcmp(finish, "eos")) {
            json_decref(j);
            continue;
        }
        json_t *v = json_loads(text, 0, NULL);
        cr_assert(json_is_object(v), "seed %d: not a JSON object: %s", seed, text);
        if (seed % 2 == 0) {
            cr_expect(json_is_boolean(json_object_get(v, "ok")), "%s", text);
            json_int_t n = json_integer_value(json_object_get(v, "n"));
            cr_expect(n == 1 || n == 2, "%s", text);
        }
        ended++;
        json_decref(v);
        json_decref(j);
    }
    cr_expect_geq(ended, 3, "%d of 4 ended within 300 tokens", ended);
    int rc;
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p x --json-schema '{\"type\":\"string\",\"pattern\":\"a\"}' 2>&1", b,
             TINY);
    char *out = run(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2, "%s", out);
    cr_expect(strstr(out, "'pattern' is not supported"), "%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s generate -m %s -p x --json-schema /nonexistent.json 2>&1", b, TINY);
    out = run(cmd, &rc);
    cr_expect_eq(WEXITSTATUS(rc), 2, "%s", out);
    cr_expect(strstr(out, "/nonexistent.json"), "%s", out);
    free(out);
}

/* toy chat on a scripted gpt-oss-like model: each line is a turn (the second sees the first's reply in the
 * conversation), the analysis channel is shown only when asked, <|end|> does not end a reply, and the
 * final channel is what is printed */
Test(cli_gguf, chat_turns_split_replies) {
    const char *b = getenv("TOY_BIN");
    if (!b) cr_skip("TOY_BIN not set (run through make check)");
    static const char *const answer[] = {"<|channel|>", "analysis", "<|message|>", "User greets. Reply.", "<|end|>",
                                         "<|start|>", "assistant", "<|channel|>", "final", "<|message|>",
                                         "Hello! How can I help?", "<|return|>", NULL};
    static const char *const second[] = {"<|channel|>", "analysis", "<|message|>", "Again.", "<|end|>", "<|start|>",
                                         "assistant", "<|channel|>", "final", "<|message|>", "Still here.", NULL};
    struct th_script_model sm = {"{# gpt-oss: <|channel|>final<|message|> #}{% for m in messages %}{{ m.content }}"
                                 "{% endfor %}",
                                 {answer, second}, "<|return|>", false};
    th_mkdir("chat");
    char path[300], cmd[1024];
    snprintf(path, sizeof path, "%s/scripted.gguf", th_dir);
    th_script_model_write(&sm, path);
    snprintf(cmd, sizeof cmd, "%s describe %s", b, path); /* describe names how its replies split */
    int drc;
    char *desc = run(cmd, &drc);
    cr_expect(strstr(desc, "chat template yes (replies: tool calls harmony)"), "%s", desc);
    free(desc);
    snprintf(cmd, sizeof cmd, "%s describe %s --json", b, path);
    json_t *dj = run_json(cmd);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(json_object_get(dj, "tokenizer"), "chat_replies"),
                                                       "format")), "harmony");
    json_decref(dj);
    const char *want[] = {"Hello! How can I help?\nStill here.\n",
                          "User greets. Reply.\n\nHello! How can I help?\nAgain.\n\nStill here.\n"};
    for (int show = 0; show < 2; show++) {
        /* the model drafting for itself changes nothing but the passes */
        snprintf(cmd, sizeof cmd, "printf '<|go1|>\\n/reset\\n<|go1|>\\n<|go2|>\\n' | %s chat -m %s --temp 0%s%s%s", b,
                 path, show ? " --show-reasoning" : "", show ? " --draft " : "", show ? path : "");
        int rc;
        char *out = run(cmd, &rc);
        cr_expect_eq(rc, 0, "%s", out);
        /* /reset leaves one reply before it */
        char both[512];
        snprintf(both, sizeof both, "%s%s", show ? "User greets. Reply.\n\nHello! How can I help?\n" : "Hello! How can I help?\n",
                 want[show]);
        cr_expect_str_eq(out, both, "show %d", show);
        free(out);
    }
    th_rmdir();
}
