/* bench-bert.c: encoding speed of a BERT-base embedding model (bge-base's
 * shape: vocab 30522, d 768, 12 layers, 12 heads, d_ff 3072), one JSON line
 * for bench/torch_bert.py, which times PyTorch on the same shapes in the
 * same run and prints the ratios: a query (B 1, T 32), and a batch of
 * passages (B 8, T 128), texts/s. Weights random, f32. The first run
 * (planning, warm-up) is not timed; best of the rest.
 * Usage: bench-bert THREADS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "toy/bert.h"
#include "toy/toy.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* best seconds of `runs` timed runs of the pooled embeddings of B texts of T tokens */
static double encode_time(struct toy_bert *m, struct toy_threadpool *tp, int64_t T, int64_t B, int runs) {
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *tok = toy_new_tensor_2d(ctx, TOY_I32, T, B), *pos = toy_new_tensor_1d(ctx, TOY_I32, T);
    for (int64_t i = 0; i < T * B; i++) ((int32_t *)tok->data)[i] = (int32_t)((i * 7919 + 101) % m->cfg.vocab);
    for (int64_t t = 0; t < T; t++) ((int32_t *)pos->data)[t] = (int32_t)t;
    struct toy_tensor *e = toy_bert_pool(ctx, toy_bert_forward(ctx, m, tok, pos), TOY_POOLING_MEAN);
    toy_set_output(e);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, e);
    double best = 1e30;
    for (int i = 0; i < runs + 1; i++) {
        double t0 = now();
        if (toy_graph_compute(g, tp)) {
            fprintf(stderr, "bench-bert: %s\n", toy_last_error());
            exit(1);
        }
        double dt = now() - t0;
        if (i > 0 && dt < best) best = dt;
    }
    toy_ctx_free(ctx);
    return best;
}

int main(int argc, char **argv) {
    int nth = argc > 1 ? atoi(argv[1]) : 2;
    struct toy_threadpool *tp = toy_threadpool_new(nth);
    struct toy_bert_config c = {.vocab = 30522, .d_model = 768, .n_layers = 12, .n_heads = 12, .d_ff = 3072,
                                .max_ctx = 512, .n_types = 2, .norm_eps = 1e-12f, .pooling = TOY_POOLING_CLS};
    struct toy_bert *m = toy_bert_new(&c, 1);
    if (!m || toy_bert_pack_weights(m)) {
        fprintf(stderr, "bench-bert: %s\n", toy_last_error());
        return 1;
    }
    double q = encode_time(m, tp, 32, 1, 5), p = encode_time(m, tp, 128, 8, 2);
    printf("{\"bench\":\"bert_encode\",\"shape\":\"bge-base\",\"threads\":%d,\"query_s\":%.5f,\"batch_s\":%.4f,"
           "\"query_texts_s\":%.2f,\"batch_texts_s\":%.2f}\n", nth, q, p, 1 / q, 8 / p);
    toy_bert_free(m);
    toy_threadpool_free(tp);
    return 0;
}
