/* The C library's test hooks: entry points only tests call (not a stable API), compiled into a
   build made with POWERINFER_TESTING=1 (README's test command; and the sanitizer build), never
   into a normal one (powerinfer_backend/_native/_build.py). Python: powerinfer_backend.engine.testing. */
#ifndef PI_TESTING_H
#define PI_TESTING_H

#include <stdint.h>

#include "powerinfer.h"

/* ---- A context's placement on a ggml device (ggml_hooks.c) ----
 * pi_test_ggml_zero_rows: zero rows [row0, row0 + n_rows) (ne1 index) of a placed device tensor of
 * `layer`: an attention slot (PI_L_ATTN_Q, ...), or with PI_L_FFN_GATE / PI_L_FFN_UP the hot rows (row r =
 * the plan's r-th hot neuron), PI_L_FFN_DOWN the hot down columns' F16 rows (row e = output element e).
 * pi_test_ggml_trace(c, cap): record up to cap events from now (cap 0 stops and frees); each is one device
 * step (kind 0 attention, 1 hot FFN, 2 output; layer n_layer for the output) or the CPU half of a split
 * FFN computing the cold neurons' activations (kind 3), with CLOCK_MONOTONIC start and end in ns.
 * pi_test_ggml_trace_read copies up to cap events recorded since the last read and returns their number
 * (-1 when tracing is off). */
typedef struct pi_test_ggml_event {
    int32_t kind, layer;
    int64_t t0_ns, t1_ns;
} pi_test_ggml_event;
int pi_test_ggml_zero_rows(pi_context *c, int32_t layer, int32_t slot, int64_t row0, int64_t n_rows);
int pi_test_ggml_trace(pi_context *c, int32_t cap);
int32_t pi_test_ggml_trace_read(pi_context *c, pi_test_ggml_event *out, int32_t cap);

/* ---- A context's thread pool (pool_hooks.c) ----
 * pi_test_pool_stall: worker `worker` (0 = the calling thread) sleeps `ms` ms inside the next chunk it
 * takes (once). pi_test_pool_counts: per worker, the chunks it has run since the context was made
 * (total) and those it ran in the job the last stall fired in (stalled_job; -1 before one fired), up to
 * cap entries each (either may be NULL); returns n_threads. */
int pi_test_pool_stall(pi_context *c, int32_t worker, int32_t ms);
int32_t pi_test_pool_counts(pi_context *c, int64_t *total, int64_t *stalled_job, int32_t cap);

#endif
