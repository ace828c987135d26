/* cmd-classify.c: `toy classify -m vit.gguf image.png ...`: runs a ViT
 * classifier (toy/vit.h) on image files (PNG, JPEG, BMP through stb_image,
 * resized to the model's input and normalised with the mean/std stored in
 * its GGUF) and prints the top-k classes with their probabilities; or, with
 * --data, the accuracy and mean loss over a labelled image set. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"
#include "json-out.h"
#include "toy/classify.h"
#include "toy/graph.h"
#include "toy/toy.h"
#include "toy/vit.h"

static int usage_to(FILE *f) {
    fprintf(f,
            "usage: toy classify -m VIT.gguf [-k 5] [--json] [--threads N] IMAGE...\n"
            "       toy classify -m VIT.gguf --data IMAGES   (accuracy over a labelled set: IDX, TOYI, class folders)\n");
    return 2;
}
static int usage(void) { return usage_to(stderr); }

int toy_cmd_classify(int argc, char **argv) {
    const char *model = NULL, *data = NULL;
    int n_files = 0, k = 5, threads = 0;
    bool json = false;
    const char **files = malloc((size_t)argc * sizeof *files); /* every image named (there is no limit) */
    if (!files) return 1;
    const struct toy_cli_flag flags[] = {
        TOY_FLAG_S("-m", &model), TOY_FLAG_S("--model", &model), TOY_FLAG_S("--data", &data),
        TOY_FLAG_N("-k", TOY_CLI_INT, &k, 1, 1 << 20), TOY_FLAG_N("--top-k", TOY_CLI_INT, &k, 1, 1 << 20),
        TOY_FLAG_N("--threads", TOY_CLI_INT, &threads, 0, 1024), TOY_FLAG_B("--json", &json), TOY_FLAG_END};
    int prc = toy_cli_parse("classify", argc, argv, flags, files, argc, &n_files);
    if (prc) {
        free(files);
        if (prc == 1) return usage_to(stdout), 0;
        return prc;
    }
    if (!model || (!data && n_files == 0)) { free(files); return usage(); }
    struct toy_vit *m;
    if (toy_vit_load(model, false, &m)) { fprintf(stderr, "toy classify: %s\n", toy_last_error()); free(files); return 1; }
    const struct toy_vit_config *c = &m->cfg;
    struct toy_threadpool *tp = toy_threadpool_new(threads);
    int rc = 0;
    if (data) {
        struct toy_image_set *s;
        struct toy_image_load_opts lo = {.channels = c->channels, .height = c->image_h, .width = c->image_w};
        float loss, acc;
        if (toy_images_load(data, &lo, &s) || toy_vit_evaluate(m, s, 64, tp, &loss, &acc)) {
            fprintf(stderr, "toy classify: %s\n", toy_last_error());
            rc = 1;
        } else if (json) {
            printf("{\"format\":\"toy/classify-eval-v1\",\"images\":%lld,\"accuracy\":%.6f,\"loss\":%.6f}\n",
                   (long long)s->n, acc, loss);
        } else {
            printf("%lld images: accuracy %.2f%%, mean loss %.4f\n", (long long)s->n, 100 * acc, loss);
        }
        toy_images_free(s);
        goto done;
    }
    if (k < 1) k = 1;
    if (k > c->n_classes) k = (int)c->n_classes;
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *img = toy_new_tensor_4d(ctx, TOY_F32, c->image_w, c->image_h, c->channels, 1);
    struct toy_tensor *lg = toy_vit_forward(ctx, m, img);
    toy_set_output(lg);
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, lg);
    int64_t npx = c->channels * c->image_h * c->image_w, K = c->n_classes;
    uint8_t *px = malloc((size_t)npx);
    double *prob = malloc((size_t)K * sizeof *prob);
    int *order = malloc((size_t)K * sizeof *order);
    for (int f = 0; f < n_files && px && prob && order; f++) {
        if (toy_image_read_file(files[f], c->channels, c->image_h, c->image_w, px)) {
            fprintf(stderr, "toy classify: %s\n", toy_last_error());
            rc = 1;
            continue;
        }
        float *x = img->data; /* (C, H, W), normalised */
        for (int64_t ch = 0; ch < c->channels; ch++)
            for (int64_t i = 0; i < c->image_h * c->image_w; i++) {
                int64_t j = ch * c->image_h * c->image_w + i;
                x[j] = ((float)px[j] / 255.0f - m->mean[ch]) / m->std[ch];
            }
        if (toy_graph_compute(g, tp)) { fprintf(stderr, "toy classify: %s\n", toy_last_error()); rc = 1; break; }
        const float *l = lg->data;
        double mx = l[0], sum = 0;
        for (int64_t i = 1; i < K; i++) mx = l[i] > mx ? l[i] : mx;
        for (int64_t i = 0; i < K; i++) sum += prob[i] = exp(l[i] - mx);
        for (int64_t i = 0; i < K; i++) prob[i] /= sum, order[i] = (int)i;
        for (int a = 0; a < k; a++) /* partial selection sort: k is small */
            for (int64_t b = a + 1; b < K; b++)
                if (prob[order[b]] > prob[order[a]]) { int t = order[a]; order[a] = order[b]; order[b] = t; }
        if (json) {
            json_t *top = json_array();
            for (int a = 0; a < k; a++)
                json_array_append_new(top, json_pack("{s:i,s:s?,s:f}", "class", order[a], "label",
                                                     m->class_names ? m->class_names[order[a]] : NULL, "prob",
                                                     prob[order[a]]));
            json_t *o = json_pack("{s:s,s:o,s:o}", "format", "toy/classify-v1", "image",
                                  toy_cli_json_text(files[f], strlen(files[f])), "top", top); /* names need not be UTF-8 */
            if (toy_cli_print_json("classify", o, JSON_COMPACT)) rc = 1;
        } else {
            printf("%s\n", files[f]);
            for (int a = 0; a < k; a++) {
                if (m->class_names) printf("  %6.2f%%  %s (%d)\n", 100 * prob[order[a]], m->class_names[order[a]], order[a]);
                else printf("  %6.2f%%  class %d\n", 100 * prob[order[a]], order[a]);
            }
        }
    }
    free(px);
    free(prob);
    free(order);
    toy_ctx_free(ctx);
done:
    toy_threadpool_free(tp);
    toy_vit_free(m);
    free(files);
    return rc;
}
