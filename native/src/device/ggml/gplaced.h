/* A context's placement on a ggml device (ggml_placed.c): its buffers and device tensors, the
 * steps run as graphs (steps.c), the device thread and the hot FFN halves (worker.c), the copies
 * (upload.c); the test hooks (native/testing/ggml_hooks.c) reach it too. */
#ifndef PI_GGML_GPLACED_H
#define PI_GGML_GPLACED_H

#include <pthread.h>
#include <stdatomic.h>

#include "device/device.h"
#include "device/ggml/backend.h"
#include "device/ggml/layout.h"

enum { JOB_NONE, JOB_POSTED, JOB_TAKEN };
enum { PI_GG_EV_ATTN = 0, PI_GG_EV_FFN = 1, PI_GG_EV_OUTPUT = 2, PI_GG_EV_COLD = 3 }; /* pi_gg_event.kind */

/* one traced interval (native/testing/testing.h: pi_test_ggml_trace) */
typedef struct pi_gg_event {
    int32_t kind, layer;
    int64_t t0_ns, t1_ns;
} pi_gg_event;

typedef struct pi_gplaced {
    pi_dev base; /* what the context holds; base.impl is this */
    pi_context *c;
    pi_gdev *d;
    const pi_ggml_api *g;
    gctx *wctx, *kvctx;      /* metadata of the weights and KV tensors */
    gbuf_t wbuf, kvbuf;      /* their buffers (NULL when empty) */
    struct ggml_gallocr *ga; /* the compute buffer, shared by every step (one at a time) */
    int flash;               /* ggml_flash_attn_ext, else mul_mat + soft_max_ext */
    pi_gg_layer *L;          /* per layer (w[] and k/v NULL when on the CPU) */
    pi_gg_hot *H;            /* per layer (n_hot 0 when none) */
    pi_gg_output O;
    int out_on;
    int32_t **cold;      /* per layer: the ids not in H[l] (increasing), NULL without hot neurons */
    int32_t **hot;       /* per layer: H[l]'s ids (increasing), NULL without hot neurons */
    int32_t *cold_ids;   /* the CPU half's candidate lists (pi_dev_cold) */
    int64_t *cold_off;
    uint8_t *skips;      /* per layer: its device half computes only the hot neurons the predictor selects */
    int32_t *sel_pos;    /* the job's selected hot neurons per token (rows of H[l]), CSR by sel_off; n_batch x max_hot */
    int64_t *sel_off;    /* n_batch + 1 */
    int32_t *sel_in;     /* a group's ids then map inputs (pi_gg_ffn): max_hot + n_batch x max_down */
    float *mask;          /* host staging: n_batch x n_cells mask rows */
    int64_t *kv_idx;      /* n_batch cell indices */
    float *y_dev;         /* n_batch rows of the device's FFN partial sum, or (pi_gg_h_only) its gate then up products */
    char *graph_meta;     /* graph metadata of the step running (steps are serialized) */
    int error;            /* first failure in this eval (pi_device_i.error) */
    /* the device thread and its one job: layer job_l's hot FFN on job_x */
    pthread_t thread;
    int thread_on;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t job_seq, done_seq; /* jobs posted, jobs finished */
    atomic_int job_state;                    /* JOB_*: the posted job's claim */
    atomic_int sleeping, waiting, stop;     /* the device thread / the caller sleep on cv */
    int64_t spin_ns;                         /* how long either spins before sleeping (0: never) */
    int job_l;
    int job_skips; /* the job computes the selected hot neurons only (sel_pos) */
    const float *job_x;
    int job_rc;
    char job_msg[512];
    /* the test hooks' trace (pi_test_ggml_trace_*), off (NULL) unless a test turns it on */
    pi_gg_event *ev;
    int32_t ev_cap, ev_n;
    int64_t ev_t0; /* when the CPU half of the FFN in flight started (its device half posted) */
} pi_gplaced;

/* steps.c: one step over the context's row groups (c->grp_off), a graph per group, on the device
 * (any host thread; one at a time); row t of x / y / logits / embd is the step's row t */
int pi_gg_run_attn(pi_gplaced *p, int l, const int32_t *pos, const int32_t *cell0);
int pi_gg_run_ffn(pi_gplaced *p, int l, const float *x, float *y);
int pi_gg_run_output(pi_gplaced *p, const float *x, float *logits, float *embd);
void pi_gg_trace_add(pi_gplaced *p, int kind, int l, int64_t t0, int64_t t1);

/* worker.c: the device thread, and layer l's hot FFN half run on it: post starts it on the rows
 * x of c's groups, wait returns when y (n_tok rows) holds its partial sum (PI_OK or its failure;
 * y NULL: left in p->y_dev, the gate and up products with pi_gg_h_only: steps.c) */
int pi_gg_worker_start(pi_gplaced *p);
void pi_gg_worker_stop(pi_gplaced *p);
void pi_gg_ffn_post(pi_gplaced *p, int l, const float *x);
int pi_gg_ffn_wait(pi_gplaced *p, int64_t n_tok, float *y);

/* upload.c: copy layer l's placed tensors (attention slots, hot rows and columns) and the output block */
int pi_gg_upload_layer(pi_gplaced *p, int l, const int32_t *hot_ids);
void pi_gg_upload_output(pi_gplaced *p);

/* the device rows of the n_sel selected hot neurons of row t (sel_pos) */
static inline const int32_t *pi_gg_sel(const pi_gplaced *p, int64_t t, int64_t *n_sel) {
    *n_sel = p->sel_off[t + 1] - p->sel_off[t];
    return p->sel_pos + p->sel_off[t];
}

/* 1: layer l's split sums its down on the host, densely over the GGUF ffn_down (the cold half's
 * ffn_dense_down): the device's FFN step stops at the hot neurons' gate and up products; the host
 * applies the activation and its dense down takes them with the cold ones, so the layer sums as
 * the CPU engine's dense FFN does (ggml's down and activation round differently: docs/placement.md);
 * the device holds no down columns for such a layer */
static inline int pi_gg_h_only(const pi_gplaced *p, int l) { return pi_gg_host_down(p->c, l); }

/* the placement of c when it is on a ggml device, else NULL (with an error naming fn) */
pi_gplaced *pi_gg_of(const pi_context *c, const char *fn);

#endif
