/* toy/trace.h: Chrome Trace Event files (open in Perfetto or
 * chrome://tracing) of what a graph run does: one complete event per op per
 * thread, plus caller-defined spans (training steps, prefill, decode).
 *
 *     struct toy_trace *tr;
 *     toy_trace_open("trace.json", 0, &tr);   // 0: keeps up to 1M events
 *     toy_graph_set_trace(graph, tr);      // every node, on every thread
 *     toy_trace_span(tr, "step 1", "step", t0_us, t1_us, 0);
 *     toy_trace_close(tr);                 // writes the file
 *
 * Events go to a fixed in-memory buffer (lock-free append; when it is full
 * later events are counted and dropped), written once at close. With no
 * trace set, a graph run pays one pointer test per node.
 */
#ifndef TOY_TRACE_H
#define TOY_TRACE_H

#include <stdint.h>

#include "toy/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct toy_trace;

/* capacity: events kept (0: 1M). The file is written at close; a path
 * that could not be written then (a folder, a device, a missing folder) is
 * an error now, and a file already there is left as it is until close. */
enum toy_status toy_trace_open(const char *path, int64_t capacity, struct toy_trace **out);
/* Writes the JSON file (atomically: temp + rename) and frees the trace. */
enum toy_status toy_trace_close(struct toy_trace *tr);
/* Microseconds on the trace's clock (CLOCK_MONOTONIC since open). */
double toy_trace_now(const struct toy_trace *tr);
/* A complete event: name and category must be static strings (not copied). */
void toy_trace_span(struct toy_trace *tr, const char *name, const char *cat, double ts_us, double end_us, int tid);
/* A span whose name is copied (up to 47 bytes), for tensor names. */
void toy_trace_span_copy(struct toy_trace *tr, const char *name, const char *cat, double ts_us, double end_us, int tid);
int64_t toy_trace_dropped(const struct toy_trace *tr);

#ifdef __cplusplus
}
#endif
#endif
