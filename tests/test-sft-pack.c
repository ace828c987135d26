/* test-sft-pack.c: packed SFT rows (src/train/sft.c toy_sft_next_packed,
 * toy_llama_forward_packed, toy_attention_seg inside the Llama graph).
 *
 * A packed micro-batch must be nothing but a cheaper layout of the same
 * examples: each example's loss and the batch's gradients equal those of
 * the examples one per row (relative 1e-5), every example of an epoch is
 * placed exactly once, positions restart at 0 and only row tails are
 * padding. The packing efficiency of a synthetic set of short examples is
 * printed (and bounded). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "toy/toy.h"
#include "toy/finetune.h"
#include "toy/rng.h"

static struct toy_tokenizer *pack_tokenizer(void) {
    const char *text = "The red cat sat on the mat. The blue dog ran. Q: what color? A: red. user assistant\n";
    struct toy_bpe_train_opts bo = {.vocab_size = 300};
    struct toy_tokenizer *tok;
    cr_assert_eq(toy_tokenizer_train_bpe(text, strlen(text), &bo, &tok), TOY_OK, "%s", toy_last_error());
    return tok;
}

static const char *const words[] = {"red", "blue", "cat", "dog", "sat", "on", "the", "mat", "ran", "what", "color"};

/* n examples "Q: w w w ..." -> " A: w w ..." of random lengths (1..maxw words each side) */
static char *synthetic_jsonl(int n, int maxw, uint64_t seed) {
    struct toy_rng r;
    toy_rng_seed(&r, seed);
    size_t cap = (size_t)n * (size_t)(maxw * 16 + 64), len = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(s + len, cap - len, "{\"prompt\": \"Q:");
        int np = 1 + (int)toy_rng_below(&r, (uint64_t)maxw), nc = 1 + (int)toy_rng_below(&r, (uint64_t)maxw);
        for (int k = 0; k < np; k++) len += (size_t)snprintf(s + len, cap - len, " %s", words[toy_rng_below(&r, 11)]);
        len += (size_t)snprintf(s + len, cap - len, "\", \"completion\": \" A:");
        for (int k = 0; k < nc; k++) len += (size_t)snprintf(s + len, cap - len, " %s", words[toy_rng_below(&r, 11)]);
        len += (size_t)snprintf(s + len, cap - len, "\"}\n");
    }
    return s;
}

Test(sft_pack, rows_hold_whole_examples_with_restarting_positions) {
    struct toy_tokenizer *tok = pack_tokenizer();
    char *jsonl = synthetic_jsonl(300, 6, 3);
    struct toy_sft *d;
    const int64_t T = 256, B = 4;
    struct toy_sft_opts o = {.ctx = T, .heldout = 0, .seed = 5};
    cr_assert_eq(toy_sft_from_text(jsonl, strlen(jsonl), tok, &o, &d), TOY_OK, "%s", toy_last_error());
    int64_t n = toy_sft_n_train(d), positions = 0;
    int64_t predicted = toy_sft_packed_batches(d, B, 1, &positions);
    int32_t *x = malloc(B * T * 4), *y = malloc(B * T * 4), *pos = malloc(B * T * 4), *seg = malloc(B * T * 4);
    int *seen = calloc((size_t)n, sizeof *seen);
    int64_t batches = 0, real = 0, placed = 0;
    struct toy_sft_state st;
    do {
        int64_t got = toy_sft_next_packed(d, B, x, y, pos, seg);
        cr_assert_geq(got, 1);
        placed += got;
        batches++;
        for (int64_t b = 0; b < B; b++) {
            const int32_t *rx = x + b * T, *ry = y + b * T, *rp = pos + b * T, *rs = seg + b * T;
            int64_t t = 0, doc = 0;
            while (t < T && rs[t] >= 0) {
                /* one document: ids, seg = doc, pos 0, 1, ...; find which example it is */
                cr_assert_eq(rs[t], doc, "row %lld position %lld", (long long)b, (long long)t);
                int64_t L = 0;
                while (t + L < T && rs[t + L] == doc) {
                    cr_assert_eq(rp[t + L], L);
                    L++;
                }
                int64_t which = -1;
                for (int64_t i = 0; i < n && which < 0; i++) {
                    const int32_t *ids;
                    const unsigned char *mask;
                    int64_t en;
                    toy_sft_example(d, i, &ids, &mask, &en);
                    if (en - 1 != L || seen[i]) continue;
                    bool same = true;
                    for (int64_t k = 0; k < L && same; k++)
                        same = rx[t + k] == ids[k] && ry[t + k] == (mask[k + 1] ? ids[k + 1] : -100);
                    if (same) which = i;
                }
                cr_assert_geq(which, 0, "row %lld document %lld is no unplaced example", (long long)b, (long long)doc);
                seen[which] = 1;
                real += L;
                t += L;
                doc++;
            }
            for (; t < T; t++) { /* only the tail is padding, and it learns nothing */
                cr_assert_eq(rs[t], -1, "row %lld: padding inside the row at %lld", (long long)b, (long long)t);
                cr_assert_eq(ry[t], -100);
            }
        }
        toy_sft_get_state(d, &st);
    } while (st.epoch == 0 && st.pos < n);
    for (int64_t i = 0; i < n; i++) cr_assert(seen[i], "example %lld never placed", (long long)i);
    cr_assert_eq(placed, n);
    cr_assert_eq(batches, predicted, "toy_sft_packed_batches: %lld, the epoch took %lld", (long long)predicted,
                 (long long)batches);
    cr_assert_eq(real, positions);
    cr_assert_eq(toy_sft_positions(d), real);
    double eff = (double)real / (double)(batches * B * T);
    /* one example per row would run B*T positions per B examples */
    double unpacked = (double)real / (double)(n * T);
    fprintf(stderr, "sft_pack: %lld examples (mean %.1f positions) in %lld packed batches of %lldx%lld: "
            "%.1f%% of positions are example tokens (one per row: %.1f%%)\n", (long long)n,
            (double)real / (double)n, (long long)batches, (long long)B, (long long)T, 100 * eff, 100 * unpacked);
    cr_assert_gt(eff, 0.85, "packing efficiency %.3f", eff);
    /* the next call starts the next epoch */
    toy_sft_next_packed(d, B, x, y, pos, seg);
    toy_sft_get_state(d, &st);
    cr_assert_eq(st.epoch, 1);
    free(seen);
    free(x); free(y); free(pos); free(seg);
    free(jsonl);
    toy_sft_free(d);
    toy_tokenizer_free(tok);
}

/* loss of the model on rows tokens/targets (T, B) with positions pos ({T} or
 * {T*B}) and segments seg (NULL: unpacked); grads: every parameter's
 * gradient, concatenated, when not NULL */
static float run_rows(struct toy_llama *m, int64_t T, int64_t B, const int32_t *tokens, const int32_t *targets,
                      const int32_t *pos, const int32_t *seg, float *grads) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *tgt = toy_new_tensor_2d(ctx, TOY_I32, T, B);
    memcpy(tok->data, tokens, (size_t)(T * B) * 4);
    memcpy(tgt->data, targets, (size_t)(T * B) * 4);
    struct toy_tensor *p = toy_new_tensor_1d(ctx, TOY_I32, seg ? T * B : T), *s = NULL;
    memcpy(p->data, pos, (size_t)toy_nelements(p) * 4);
    if (seg) {
        s = toy_new_tensor_2d(ctx, TOY_I32, T, B);
        memcpy(s->data, seg, (size_t)(T * B) * 4);
    }
    struct toy_tensor *loss = toy_cross_entropy(ctx, toy_llama_forward_packed(ctx, m, tok, p, s), tgt, -100);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, loss);
    if (grads) {
        toy_graph_backward(g, loss);
        toy_graph_zero_grads(g);
    }
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK, "%s", toy_last_error());
    float l = *(float *)loss->data;
    if (grads) {
        for (int i = 0, off = 0; i < toy_llama_n_tensors(m); i++) {
            struct toy_tensor *w = toy_llama_tensor(m, i);
            memcpy(grads + off, w->grad->data, toy_nbytes(w));
            off += (int)toy_nelements(w);
        }
        for (int i = 0; i < toy_graph_n_params(g); i++) toy_graph_param(g, i)->grad = NULL; /* they live in ctx */
    }
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    return l;
}

/* The examples of one packed micro-batch, run (a) packed and (b) one per
 * row: the same loss for each example (targets of the others set to
 * -100) and the same gradients of the batch loss, to 1e-5 relative.
 * Grouped-query heads, untied head, a sliding window wider than a row. */
Test(sft_pack, packed_batch_equals_examples_one_per_row, .timeout = 120) {
    struct toy_tokenizer *tok = pack_tokenizer();
    char *jsonl = synthetic_jsonl(40, 3, 11);
    const int64_t T = 64, B = 2;
    struct toy_sft *d;
    struct toy_sft_opts o = {.ctx = T, .heldout = 0, .seed = 2};
    cr_assert_eq(toy_sft_from_text(jsonl, strlen(jsonl), tok, &o, &d), TOY_OK, "%s", toy_last_error());
    int32_t x[128], y[128], pos[128], seg[128];
    int64_t ndoc = toy_sft_next_packed(d, B, x, y, pos, seg);
    cr_assert_geq(ndoc, 4, "only %lld examples packed", (long long)ndoc);
    struct toy_llama_config c = toy_llama_preset("tiny");
    c.vocab = toy_tokenizer_n_vocab(tok);
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.tied = false;
    c.sliding_window = 100;
    struct toy_llama *m = toy_llama_new(&c, 21);
    cr_assert(m, "%s", toy_last_error());
    /* (b): document k of the packed rows alone in row k, positions 0..T-1 */
    int32_t *ux = calloc((size_t)(ndoc * T), 4), *uy = malloc((size_t)(ndoc * T) * 4), upos[64];
    int64_t *row_of = malloc((size_t)(B * T) * sizeof *row_of), k = 0;
    for (int64_t i = 0; i < ndoc * T; i++) uy[i] = -100;
    for (int64_t t = 0; t < T; t++) upos[t] = (int32_t)t;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            row_of[b * T + t] = -1;
            if (seg[b * T + t] < 0) continue;
            if (t > 0 && seg[b * T + t - 1] != seg[b * T + t]) k++;
            if (t == 0 && b > 0) k++;
            row_of[b * T + t] = k;
            ux[k * T + pos[b * T + t]] = x[b * T + t];
            uy[k * T + pos[b * T + t]] = y[b * T + t];
        }
    cr_assert_eq(k + 1, ndoc);
    int64_t np = toy_llama_n_params(m);
    float *gp = malloc((size_t)np * 4), *gu = malloc((size_t)np * 4);
    float lp = run_rows(m, T, B, x, y, pos, seg, gp);
    float lu = run_rows(m, T, ndoc, ux, uy, upos, NULL, gu);
    cr_assert_leq(fabsf(lp - lu), 1e-5f * fabsf(lu), "batch loss packed %.8f, one per row %.8f", lp, lu);
    double gmax = 0, gerr = 0;
    for (int64_t i = 0; i < np; i++) {
        gmax = fmax(gmax, fabs(gu[i]));
        gerr = fmax(gerr, fabs(gp[i] - gu[i]));
    }
    cr_assert_leq(gerr, 1e-5 * gmax, "gradients differ by %g (largest %g)", gerr, gmax);
    /* each example's own loss */
    int32_t ym[128], uym[64 * 64];
    double worst = 0;
    for (int64_t e = 0; e < ndoc; e++) {
        int64_t counted = 0;
        for (int64_t i = 0; i < B * T; i++) {
            ym[i] = row_of[i] == e ? y[i] : -100;
            counted += ym[i] != -100;
        }
        if (!counted) continue;
        for (int64_t i = 0; i < ndoc * T; i++) uym[i] = i / T == e ? uy[i] : -100;
        float a = run_rows(m, T, B, x, ym, pos, seg, NULL), bl = run_rows(m, T, ndoc, ux, uym, upos, NULL, NULL);
        worst = fmax(worst, fabs(a - bl) / fabs(bl));
    }
    fprintf(stderr, "sft_pack: %lld examples in %lldx%lld: batch loss %.6f packed vs %.6f one per row; gradients "
            "within %.2g of the largest; per-example losses within %.2g\n", (long long)ndoc, (long long)B,
            (long long)T, lp, lu, gerr / gmax, worst);
    cr_assert_leq(worst, 1e-5, "a per-example loss differs by %g relative", worst);
    free(gp); free(gu); free(ux); free(uy); free(row_of);
    toy_llama_free(m);
    free(jsonl);
    toy_sft_free(d);
    toy_tokenizer_free(tok);
}
