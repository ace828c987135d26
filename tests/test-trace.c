/* test-trace.c: Chrome traces of graph runs: every node appears once per
 * thread that ran it, with the op's name, and the file is valid JSON. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "toy/file.h"
#include "toy/toy.h"
#include "toy/trace.h"

Test(trace, graph_ops_land_in_a_chrome_trace) {
    char path[] = "/tmp/toy-trace-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    struct toy_trace *tr;
    cr_assert_eq(toy_trace_open(path, 0, &tr), TOY_OK);
    struct toy_ctx *ctx = toy_ctx_init(true);
    struct toy_tensor *x = toy_new_tensor_2d(ctx, TOY_F32, 256, 256), *w = toy_new_tensor_2d(ctx, TOY_F32, 256, 256);
    struct toy_tensor *y = toy_sum_all(ctx, toy_silu(ctx, toy_linear(ctx, x, w, NULL)));
    struct toy_graph *g = toy_graph_new(ctx);
    toy_graph_build(g, y);
    toy_graph_set_trace(g, tr);
    struct toy_threadpool *tp = toy_threadpool_new(2);
    cr_assert_eq(toy_graph_compute(g, tp), TOY_OK);
    toy_trace_span(tr, "my span", "test", 0, toy_trace_now(tr), 0);
    cr_assert_eq(toy_trace_close(tr), TOY_OK);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    cr_assert(root, "not JSON: %s", err.text);
    json_t *ev = json_object_get(root, "traceEvents");
    int matmul = 0, span = 0;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        cr_assert_str_eq(json_string_value(json_object_get(e, "ph")), "X");
        cr_assert(json_number_value(json_object_get(e, "dur")) >= 0);
        matmul += !strcmp(name, "MATMUL");
        span += !strcmp(name, "my span");
    }
    cr_assert_eq(matmul, 2, "the matmul ran on both threads: %d events", matmul);
    cr_assert_eq(span, 1);
    json_decref(root);
    toy_threadpool_free(tp);
    toy_ctx_free(ctx);
    unlink(path);
}

Test(trace, unwritable_path_is_an_error) {
    struct toy_trace *tr;
    cr_assert_eq(toy_trace_open("/nonexistent-dir/trace.json", 0, &tr), TOY_ERR_IO);
}

/* refused at open, before a run, where the write at close would fail; and a
 * trace already at the path is not cut short by opening a new one */
Test(trace, open_checks_the_path_and_keeps_an_old_trace) {
    struct toy_trace *tr;
    cr_assert_eq(toy_trace_open("/dev/null", 0, &tr), TOY_ERR_IO);
    cr_assert(strstr(toy_last_error(), "not a regular file"), "%s", toy_last_error());
    cr_assert_eq(toy_trace_open("/tmp", 0, &tr), TOY_ERR_IO);
    cr_assert(strstr(toy_last_error(), "a folder"), "%s", toy_last_error());
    th_mkdir("trace");
    char path[300], tmp[340];
    snprintf(path, sizeof path, "%s/t.json", th_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"old\":1}\n", f);
    fclose(f);
    cr_assert_eq(toy_trace_open(path, 0, &tr), TOY_OK);
    char *text = NULL;
    size_t n = 0;
    cr_assert_eq(toy_file_read_all(path, &text, &n), TOY_OK);
    cr_assert_str_eq(text, "{\"old\":1}\n", "opening left the old trace whole");
    free(text);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()); /* toy_file_replace_begin's temp name */
    cr_assert_neq(access(tmp, F_OK), 0, "the check's temp file was left beside it");
    cr_assert_eq(toy_trace_close(tr), TOY_OK);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    cr_assert(root && json_object_get(root, "traceEvents"), "replaced at close");
    json_decref(root);
    th_rmdir();
}
