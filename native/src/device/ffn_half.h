/* One layer's FFN split between a device (hot rows) and the CPU (cold rows): the half's
 * interface, implemented by the ggml device (device/ggml/), and the split over it
 * (ffn_split.c). */
#ifndef PI_FFN_HALF_H
#define PI_FFN_HALF_H

#include "pi_internal.h"

typedef struct pi_device_ffn pi_device_ffn;

typedef struct pi_ffn_half_i {
    /* start the device's sum over its hot rows for n_tok rows x (n_hot > 0); n_used: the
     * per-token counts of kept hot rows, filled by the time finish returns */
    int (*start)(pi_device_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold, int64_t *n_used);
    /* wait for it: y = its partial sum, n_tok rows of n_embd */
    int (*finish)(pi_device_ffn *f, int64_t n_tok, float *y, int64_t *n_used);
} pi_ffn_half_i;

/* The first member of each implementation's half (freed with pi_device_ffn_free). */
struct pi_device_ffn {
    const pi_ffn_half_i *iface;
    int64_t n_embd, n_ff, n_hot;
    int32_t *cold; /* host: the other n_ff - n_hot ids, increasing */
};

/* free a half made by pi_ffn_half_new (NULL is a no-op) */
void pi_device_ffn_free(pi_device_ffn *f);

/* PI_OK when hot_ids is strictly increasing in [0, n_ff); fn names the caller */
int pi_ffn_check_hot_ids(const char *fn, const int32_t *hot_ids, int64_t n_hot, int64_t n_ff);
/* a zeroed half of `size` bytes with its sizes and cold list, or NULL (out of memory) */
pi_device_ffn *pi_ffn_half_new(size_t size, const pi_ffn_half_i *iface, const int32_t *hot_ids, int64_t n_hot,
                               int64_t n_embd, int64_t n_ff);

/* The split FFN: the device sums its hot rows while the CPU computes the cold rows' h;
 * then the CPU continues the device's sum with the cold rows (ids increasing). The
 * result equals one CPU sum over the hot ids, then the cold ids - bit for bit the
 * unsplit run when the hot ids are the layer's lowest (docs/placement.md, Exactness).
 * In two steps, for a caller that returns between them: start (the device half), then
 * finish (the CPU half, the wait, the merge) unless start failed. ids_buf (n_tok x
 * n_cold) and off_buf (n_tok + 1): optional buffers, else allocated. */
int pi_ffn_split_start(pi_device_ffn *f, const pi_ffn_sparse_args *base, int64_t *n_used_device);
int pi_ffn_split_finish(pi_pool *pool, pi_device_ffn *f, const pi_ffn_sparse_args *base, void *scratch,
                        int32_t *ids_buf, int64_t *off_buf, int64_t *n_used_device, float *y_device);

#endif
