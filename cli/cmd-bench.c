/* cmd-bench.c: `toy bench -m MODEL.gguf`: how fast toy runs a user's own
 * model (Llama family or GPT-2) on this machine, as `toy generate` runs it (weights
 * mapped from the file, quantized matrices packed for inference): prefill
 * tokens/s of a prompt, decode tokens/s after it, at each thread count, with
 * decode's memory-bandwidth bound measured in the same run, right after
 * each decode (the larger of the STREAM triad and the read-only bandwidth,
 * GB/s / weight bytes read per token) and the process's peak RSS. The
 * prompt is synthetic token ids, so no tokenizer is needed; `make bench`
 * compares the same protocol against PyTorch and llama.cpp. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "flags.h"
#include "generate-gpt2.h"
#include "json-out.h"
#include "precision.h"
#include "toy/generate.h"
#include "toy/models.h"
#include "toy/toy.h"

static int usage_to(FILE *out) {
    fprintf(out, "usage: toy bench -m MODEL.gguf [--threads 1,2] [--prompt 256] [--gen 32] [--reps 3]\n"
                    "                 [--kv-type f16|f32] [--bf16] [--json]\n"
                    "--threads: up to 16 counts; --gen: at least 2.\n"
                    "Prefill and decode tokens/s of a Llama-family or GPT-2 GGUF at each thread count,\n"
                    "against the memory-bandwidth bound of decode measured now; peak RSS. Decode tokens/s\n"
                    "counts decode steps (the first generated token comes with the prompt). --bf16: the\n"
                    "prompt's products over f32 or f16 weights in bf16, as toy generate --bf16.\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

static bool count_token(void *ud, int32_t id, const char *text, size_t len, float lp) {
    (void)id; (void)text; (void)len; (void)lp;
    (*(int64_t *)ud)++;
    return true;
}


/* what the figures depend on: CPU model, cores, the ISA extensions toy's
 * kernels use (from /proc/cpuinfo) and the BLAS core type */
static json_t *machine(char *line, size_t cap) {
    char model[256] = "unknown CPU", flags_seen[160] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    char buf[8192];
    bool got_model = false, got_flags = false;
    while (f && fgets(buf, sizeof buf, f) && !(got_model && got_flags)) {
        char *colon = strchr(buf, ':');
        if (!colon) continue;
        char *v = colon + 1 + (colon[1] == ' ');
        v[strcspn(v, "\n")] = 0;
        if (!got_model && !strncmp(buf, "model name", 10)) {
            snprintf(model, sizeof model, "%s", v);
            got_model = true;
        } else if (!got_flags && !strncmp(buf, "flags", 5)) {
            static const char *const want[] = {"avx2", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16"};
            char padded[8200]; /* " flag flag ... ": whole words match */
            snprintf(padded, sizeof padded, " %s ", v);
            for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
                char pat[40];
                snprintf(pat, sizeof pat, " %s ", want[i]);
                if (strstr(padded, pat)) {
                    size_t n = strlen(flags_seen);
                    snprintf(flags_seen + n, sizeof flags_seen - n, "%s%s", n ? " " : "", want[i]);
                }
            }
            got_flags = true;
        }
    }
    if (f) fclose(f);
    const char *blas = toy_blas_core(), *note = toy_blas_core_note();
    snprintf(line, cap, "machine: %s, %d cores, %s, OpenBLAS %s%s%s%s, bf16 products: %s", model, toy_num_cores(),
             flags_seen[0] ? flags_seen : "no AVX2", blas, note ? " (" : "", note ? note : "", note ? ")" : "",
             toy_cpu_bf16_gemm());
    return json_pack("{s:s,s:i,s:s,s:s,s:s?,s:s}", "cpu", model, "cores", toy_num_cores(), "isa", flags_seen,
                     "blas_core", blas, "blas_note", note, "bf16_gemm", toy_cpu_bf16_gemm());
}

int toy_cmd_bench(int argc, char **argv) {
    const char *model = NULL, *threads_arg = NULL;
    int64_t n_prompt = 256, n_gen = 32, reps = 3;
    bool json = false, bf16 = false;
    enum toy_dtype kv_type = TOY_F16;
    const char *kv = NULL;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("--kv-type", &kv),
        TOY_FLAG_S("--threads", &threads_arg), TOY_FLAG_N("--prompt", TOY_CLI_I64, &n_prompt, 1, 1 << 20),
        TOY_FLAG_N("--gen", TOY_CLI_I64, &n_gen, 1, 1 << 20), TOY_FLAG_N("--reps", TOY_CLI_I64, &reps, 1, 1000),
        TOY_FLAG_B("--json", &json), TOY_FLAG_B("--bf16", &bf16), TOY_FLAG_END};
    int prc = toy_cli_parse("bench", argc, argv, flags, NULL, 0, NULL);
    if (prc == 1) return usage_to(stdout), 0;
    if (prc) return prc;
    if (n_gen < 2) { /* it was raised to 2 without a word */
        fprintf(stderr, "toy bench: --gen %lld: at least 2 (the first token comes with the prefill; decode tok/s "
                "needs a decode step after it)\n", (long long)n_gen);
        return 2;
    }
    if (kv) {
        kv_type = (enum toy_dtype)toy_dtype_from_name(kv);
        if (kv_type != TOY_F32 && kv_type != TOY_F16) { fprintf(stderr, "toy bench: --kv-type f32|f16\n"); return 2; }
    }
    if (!model) return usage();
    enum { MAX_COUNTS = 16 };
    int threads[MAX_COUNTS], n_threads = 0;
    if (threads_arg) {
        const char *p = threads_arg;
        while (*p) {
            if (n_threads == MAX_COUNTS) { /* the counts past 16 were dropped without a word */
                fprintf(stderr, "toy bench: --threads takes at most %d counts\n", MAX_COUNTS);
                return 2;
            }
            char *end;
            long t = strtol(p, &end, 10);
            if (end == p || t < 1 || t > 1024 || (*end && *end != ',')) {
                fprintf(stderr, "toy bench: --threads takes counts like 1,2,4\n");
                return 2;
            }
            threads[n_threads++] = (int)t;
            p = *end ? end + 1 : end;
        }
    } else {
        int cores = toy_num_cores();
        threads[n_threads++] = 1;
        if (cores > 1) threads[n_threads++] = cores;
    }
    char resolved[4096];
    if (toy_model_resolve(model, resolved, sizeof resolved)) { fprintf(stderr, "toy bench: %s\n", toy_last_error()); return 1; }
    /* the model, a Llama-family one (m) or a GPT-2 (g), and what the report says of it */
    struct toy_llama *m = NULL;
    struct toy_gpt2 *g = NULL;
    int64_t vocab, max_ctx, params;
    double bytes, kv_row; /* weight bytes a decode step reads; K and V bytes a position keeps */
    enum toy_dtype wtype;
    bool bf16_on = false;
    const char *device = toy_device_default();
    const bool on_cpu = !strcmp(device, "cpu");
    if (toy_cli_is_gpt2(resolved)) { /* GPT-2: its own model, the same generator */
        if (toy_gpt2_load(resolved, false, &g)) { fprintf(stderr, "toy bench: %s\n", toy_last_error()); return 1; }
        bf16_on = bf16 && toy_cli_infer_bf16("bench", NULL, g);
        vocab = g->cfg.vocab, max_ctx = g->cfg.max_ctx, params = toy_gpt2_n_params(g);
        bytes = toy_gpt2_decode_bytes(g);
        kv_row = 2.0 * (double)g->cfg.n_layers * (double)g->cfg.d_model * (kv_type == TOY_F16 ? 2 : 4);
        wtype = g->layers[0].w_qkv->type;
    } else {
        if (toy_llama_load(resolved, false, &m)) { fprintf(stderr, "toy bench: %s\n", toy_last_error()); return 1; }
        bf16_on = bf16 && toy_cli_infer_bf16("bench", m, NULL);
        vocab = m->cfg.vocab, max_ctx = m->cfg.max_ctx, params = toy_llama_n_params(m);
        bytes = toy_llama_decode_bytes(m);
        kv_row = 2.0 * (double)m->cfg.n_layers * (double)m->cfg.n_kv_heads * (double)toy_llama_head_dim(&m->cfg) *
                 (kv_type == TOY_F16 ? 2 : 4);
        if (m->cfg.kv_lora_rank) /* latent attention: one latent a position and layer, the keys and the values */
            kv_row = (double)m->cfg.n_layers * (double)(m->cfg.kv_lora_rank + m->cfg.rope_dim) * (kv_type == TOY_F16 ? 2 : 4);
        wtype = m->layers[0].wo->type;
    }
    int rc = 0;
    int32_t *prompt = NULL;
    json_t *mach = NULL;
    if (n_prompt + n_gen + 1 > max_ctx) {
        fprintf(stderr, "toy bench: --prompt %lld + --gen %lld does not fit the model's context of %lld\n",
                (long long)n_prompt, (long long)n_gen, (long long)max_ctx);
        rc = 2;
        goto out;
    }
    if (!(prompt = malloc((size_t)n_prompt * sizeof *prompt))) {
        rc = 1;
        goto out;
    }
    for (int64_t i = 0; i < n_prompt; i++) prompt[i] = (int32_t)((i * 31 + 7) % vocab);
    /* the cache a decode step reads besides the weights, at the middle of the generation (not in the bound) */
    double kv_bytes = kv_row * (double)(n_prompt + n_gen / 2);
    char mline[512];
    mach = machine(mline, sizeof mline);
    if (!json) printf("%s\n", mline);
    if (!json)
        printf("%s: %s%s%s, %.1fM parameters, %.1f MB of weights read per decoded token (+ %.1f MB of %s KV "
               "cache);\nprompt %lld, %lld generated, best of %lld\n",
               resolved, g ? "GPT-2, " : "", toy_dtype_name(wtype), bf16_on ? " (bf16 products)" : "",
               (double)params / 1e6, bytes / 1e6, kv_bytes / 1e6, toy_dtype_name(kv_type), (long long)n_prompt,
               (long long)n_gen, (long long)reps);
    /* Each decode run is followed by the bandwidth tests, and a run's bound
     * is the bandwidth measured right after it: this machine's bandwidth
     * swings by a third over minutes, and a rate means something only
     * against the bandwidth of its own moment. Two bounds: the best of the
     * probes' few-ms rounds (a peak), and the read rate sustained for as
     * long as the run took (what it could have streamed on average). The
     * reported decode is the best run's, with its own bounds. Peak RSS is
     * read after the first run, before the tests' buffers (256 MB) could
     * hide the model's own. */
    double bp[MAX_COUNTS] = {0}, bd[MAX_COUNTS] = {0}, bg[MAX_COUNTS] = {0}, bs[MAX_COUNTS] = {0};
    long shared[MAX_COUNTS] = {0}; /* the pool's looks that found the cores shared */
    long peak_kb = 0;
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        struct toy_threadpool *tp = toy_threadpool_new(threads[ti]);
        struct toy_generator *gen = NULL;
        struct toy_lm lm = m ? toy_llama_lm(m) : toy_gpt2_lm(g);
        if (!tp || toy_generator_new_lm(&lm, NULL, n_prompt + n_gen + 1, kv_type, tp, &gen)) {
            fprintf(stderr, "toy bench: %s\n", toy_last_error());
            toy_threadpool_free(tp);
            rc = 1;
            break;
        }
        struct toy_generate_params gp = {.n_predict = n_gen, .ignore_eos = true};
        for (int64_t r = 0; r < reps && !rc; r++) {
            struct toy_generate_result res;
            int64_t n = 0;
            if (toy_generate(gen, prompt, n_prompt, &gp, count_token, &n, &res)) {
                fprintf(stderr, "toy bench: %s\n", toy_last_error());
                rc = 1;
                break;
            }
            if (!peak_kb) {
                struct rusage ru;
                getrusage(RUSAGE_SELF, &ru);
                peak_kb = ru.ru_maxrss;
            }
            /* first: the rate sustained as long as the run took, right after it (the CPU's memory: on a
             * GPU the weights stream from the device's, which this does not measure) */
            double sus = 0, rd = on_cpu ? toy_memory_read_rates(tp, res.decode_s, &sus) : 0;
            double triad = on_cpu ? toy_memory_bandwidth_gbs(tp) : 0;
            double gbs = triad > rd ? triad : rd; /* the best streaming rate measured now */
            if (res.prefill_s > 0 && res.n_prompt / res.prefill_s > bp[ti]) bp[ti] = res.n_prompt / res.prefill_s;
            /* per decode step: the first token comes from the prompt's logits */
            double steps = (double)(res.n_generated - 1);
            if (res.decode_s > 0 && steps / res.decode_s > bd[ti]) {
                bd[ti] = steps / res.decode_s;
                bg[ti] = gbs;
                bs[ti] = sus;
            }
        }
        shared[ti] = toy_threadpool_shared(tp);
        toy_generator_free(gen);
        toy_threadpool_free(tp);
    }
    long llc = toy_llc_bytes();
    json_t *rows = json_array();
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        double gbs = bg[ti], bound = gbs * 1e9 / bytes, sbound = bs[ti] * 1e9 / bytes;
        if (json && !on_cpu) /* no bound: the device's memory is not measured */
            json_array_append_new(rows, json_pack("{s:i,s:f,s:f,s:n,s:n,s:n,s:n}", "threads", threads[ti],
                                                  "prefill_tok_s", bp[ti], "decode_tok_s", bd[ti], "bandwidth_gbs",
                                                  "decode_bound_tok_s", "sustained_read_gbs",
                                                  "decode_bound_sustained_tok_s"));
        else if (json)
            json_array_append_new(rows, json_pack("{s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:b}", "threads", threads[ti],
                                                  "prefill_tok_s", bp[ti], "decode_tok_s", bd[ti], "bandwidth_gbs",
                                                  gbs, "decode_bound_tok_s", bound, "sustained_read_gbs", bs[ti],
                                                  "decode_bound_sustained_tok_s", sbound, "cores_shared",
                                                  shared[ti] > 0));
        else if (!on_cpu)
            printf("  %2d thread%s: prefill %8.1f tok/s   decode %7.1f tok/s on %s (no memory bound: it would be "
                   "the device's)\n", threads[ti], threads[ti] > 1 ? "s" : " ", bp[ti], bd[ti], device);
        else
            printf("  %2d thread%s: prefill %8.1f tok/s   decode %7.1f tok/s = %3.0f%% of the bound %.1f tok/s "
                   "(%.1f GB/s; %.0f%% of the %.1f GB/s read sustained as long)%s\n", threads[ti],
                   threads[ti] > 1 ? "s" : " ", bp[ti], bd[ti], bound > 0 ? 100 * bd[ti] / bound : 0.0, bound, gbs,
                   sbound > 0 ? 100 * bd[ti] / sbound : 0.0, bs[ti], shared[ti] ? "; other work shared the cores" : "");
        fflush(stdout);
    }
    if (!rc && json) {
        json_t *j = json_pack("{s:s,s:o,s:o,s:s,s:s,s:f,s:f,s:I,s:I,s:o,s:f}", "format", "toy/bench-v1", "machine",
                              mach, "model", toy_cli_json_text(resolved, strlen(resolved)), "weight_type",
                              toy_dtype_name(wtype), "kv_type",
                              toy_dtype_name(kv_type), "decode_bytes", bytes, "kv_bytes", kv_bytes, "prompt",
                              (json_int_t)n_prompt, "generated", (json_int_t)n_gen, "runs", rows, "peak_rss_mb",
                              peak_kb / 1024.0);
        mach = NULL; /* j holds it */
        if (j && llc > 0) json_object_set_new(j, "llc_bytes", json_integer((json_int_t)llc));
        if (j) json_object_set_new(j, "bf16_products", json_boolean(bf16_on));
        if (j) json_object_set_new(j, "arch", json_string(g ? "gpt2" : "llama"));
        if (j) json_object_set_new(j, "device", json_string(device));
        if (toy_cli_print_json("bench", j, JSON_COMPACT)) rc = 1;
    } else {
        json_decref(rows);
        if (!rc) printf("  peak RSS %.0f MB (weights read per token: %.1f MB)\n", peak_kb / 1024.0, bytes / 1e6);
        if (!rc && on_cpu && llc > 0 && bytes < (double)llc)
            printf("  note: the weights fit in this CPU's %.0f MB of last-level cache, so part of each token's reads\n"
                   "  can come from cache and decode can pass the memory bound\n", (double)llc / 1e6);
    }
out:
    json_decref(mach);
    free(prompt);
    toy_llama_free(m);
    toy_gpt2_free(g);
    return rc;
}
