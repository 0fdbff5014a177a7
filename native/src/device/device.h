/* The device interface: the one function table (ggml_backend_i style) through which the
 * forward pass hands placed steps to a device, shaped for an asynchronous one. */
#ifndef PI_DEVICE_H
#define PI_DEVICE_H

#include "pi_internal.h"

typedef struct pi_dev pi_dev;

/* pi_device_i.kind: which implementation a device is (its impl's type) */
enum { PI_DEV_GGML = 1 };

/* What the CPU half of a split FFN needs from the device's start: the layer's cold neurons
 * (increasing ids) and scratch for their per-token candidate lists. */
typedef struct pi_dev_cold {
    const int32_t *ids;
    int64_t n;
    int32_t *ids_buf; /* n_batch x n ids */
    int64_t *off_buf; /* n_batch + 1 offsets */
} pi_dev_cold;

/* The neurons a predictor selected in a layer, per token: token t's are ids[off[t]] ..
 * ids[off[t + 1] - 1], increasing, any of the layer's n_ff (the device takes its hot ones). */
typedef struct pi_dev_active {
    const int32_t *ids;
    const int64_t *off;
} pi_dev_active;

/* The batch's rows by sequence (c->n_grp groups, c->grp_off): a device runs each group as
 * its own graph, so a sequence gets the bits it gets alone whatever else is in the batch
 * (ggml picks its kernels by row count). attn and output return 1 when they ran the step
 * (its results are in the context), 0 when it is not placed (the CPU runs it). */
typedef struct pi_device_i {
    int32_t kind; /* PI_DEV_* */
    const char *name;
    /* layer l's attention block and FFN input norm: c->x and the batch's positions in,
     * c->x and c->xn out; token t in the slot starting at cell cell0[t] (NULL: sequence 0) */
    int (*attn)(pi_dev *d, pi_context *c, int l, const int32_t *pos, const int32_t *cell0, int64_t n_tok);
    /* 1 when layer l is split and its device half computes only the hot neurons a predictor
     * selects: ffn_start then needs them (act); 0: it computes every hot neuron (act NULL) */
    int (*ffn_skips)(pi_dev *d, int l);
    /* start the device's half (hot rows) of layer l's split FFN on c->xn and return 1 with
     * *cold filled, or return 0 when layer l has no hot rows (the CPU runs the whole FFN).
     * After a 1 the caller computes the cold rows (blocks/ffn.c), then calls ffn_finish. */
    int (*ffn_start)(pi_dev *d, pi_context *c, int l, int64_t n_tok, const pi_dev_active *act, pi_dev_cold *cold);
    /* wait for the hot half: y = its partial sum (n_tok rows of n_embd), n_used[t] = the hot
     * rows it computed for token t; PI_OK or the half's failure. A layer whose cold half sums its
     * down densely (c->ffn_dense_down[l]) gets the hot rows' h in c->ffn_hd instead (y as it
     * was): the host's dense down then sums every neuron as the CPU engine's dense FFN does */
    int (*ffn_finish)(pi_dev *d, pi_context *c, int l, int64_t n_tok, float *y, int64_t *n_used);
    /* output norm and matmul of n_out rows x: logits and c->embd out */
    int (*output)(pi_dev *d, pi_context *c, const float *x, int64_t n_out, float *logits);
    /* the first failure since the last call (then cleared), PI_OK when none: a failed
     * step leaves its outputs undefined and fails pi_eval */
    int (*error)(pi_dev *d);
    void (*free)(pi_dev *d);
} pi_device_i;

struct pi_dev {
    pi_device_i iface;
    void *impl; /* the implementation's state */
};

/* PI_OK when hot_ids is strictly increasing in [0, n_ff); fn names the caller (hot_ids.c) */
int pi_ffn_check_hot_ids(const char *fn, const int32_t *hot_ids, int64_t n_hot, int64_t n_ff);
/* the n_ff - n_hot ids not in hot_ids (increasing) into cold */
void pi_ffn_cold_ids(const int32_t *hot_ids, int64_t n_hot, int64_t n_ff, int32_t *cold);

#endif
