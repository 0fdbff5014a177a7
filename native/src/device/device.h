/* The device interface: the function table (ggml_backend_i style) through which the
 * forward pass hands placed steps to a device, shaped for an asynchronous one. */
#ifndef PI_DEVICE_H
#define PI_DEVICE_H

#include "pi_internal.h"

typedef struct pi_dev pi_dev;

/* Each submit_* starts a step and returns 1, or returns 0 when the step is not placed on
 * the device (the CPU runs it); after a 1 the caller calls wait before the next step. */
typedef struct pi_device_i {
    const char *name;
    /* layer l's attention block and FFN input norm: c->x and the batch's RoPE tables in,
     * c->x and c->xn out */
    int (*submit_attn)(pi_dev *d, pi_context *c, int l, const int32_t *pos, int64_t n_tok);
    /* the device half (hot rows) of layer l's split FFN on c->xn; the CPU half (cold rows)
     * runs inside wait, while the device works; c->ffn_y and c->ffn_used_tok out */
    int (*submit_ffn)(pi_dev *d, pi_context *c, int l, int64_t n_tok);
    /* output norm and matmul of n_out rows x: logits and c->embd out */
    int (*submit_output)(pi_dev *d, pi_context *c, const float *x, int64_t n_out, float *logits);
    /* until the submitted step's results are in the context */
    void (*wait)(pi_dev *d, pi_context *c);
    /* the first failure since the last call (then cleared), PI_OK when none: a failed
     * step leaves its outputs undefined and fails pi_eval */
    int (*error)(pi_dev *d);
    void (*free)(pi_dev *d);
} pi_device_i;

struct pi_dev {
    pi_device_i iface;
    void *impl; /* the implementation's state */
};

#endif
