/* The blocks of a decoder layer: the layer below the forward pass (forward.c) and the
 * devices (device/), which both call them; the blocks reach a device only through its
 * table (device/device.h), for the split FFN. */
#ifndef PI_BLOCKS_H
#define PI_BLOCKS_H

#include "context.h"

/* What one attention block reads and writes: the host's buffers and tensors, or a
 * device's copies (device/ggml/). */
typedef struct {
    pi_pool *pool;
    const pi_tensor *lt;         /* the layer's PI_L_COUNT tensors */
    const pi_mat *lm;            /* their matrix views */
    char *kc, *vc;               /* the layer's K and V cache */
    float *x, *xn, *q, *k, *v, *attn;
    void *act_scratch;
    float *attn_scratch;
    const float *rope_cs, *rope_cs_swa;
    float *x_par; /* parallel residual (Falcon): a copy of the layer input; NULL otherwise */
} pi_attn_site;

/* ---- blocks/attn.c ---- */
/* x += attention(norm(x)) and xn = ffn_norm(x) for layer l, in site s; token t at
 * position pos[t] of the sequence whose slot starts at cell cell0[t] (NULL: sequence 0) */
void pi_attn_block(const pi_context *c, const pi_attn_site *s, int l, const int32_t *pos, const int32_t *cell0,
                   int64_t n_tok);
/* y = the norm of n_rows rows x with weight w: RMSNorm, or LayerNorm plus the optional
 * bias b (Falcon, OPT) */
void pi_norm_rows(const pi_model_params *hp, const float *x, const pi_tensor *w, const pi_tensor *b, int64_t n_rows,
                  float *y);

/* ---- blocks/ffn.c: each reads the normed rows c->xn and adds its output to c->x ---- */
void pi_ffn_dense(pi_context *c, int l, int64_t n_tok);
void pi_ffn_sparse_layer(pi_context *c, int l, int64_t n_tok); /* layer l has a down_t */
/* layer l's FFN split with the context's device when it holds hot rows of it (returns 1;
 * else 0, nothing done): the device's half started, the cold rows here, the device's
 * partial sum continued by them in id order - one CPU sum over the hot ids, then the cold
 * ids (bit for bit the unsplit run when the hot ids are the layer's lowest: docs/placement.md) */
int pi_ffn_split_layer(pi_context *c, int l, int64_t n_tok);
/* after a sparse or split FFN wrote c->ffn_y and c->ffn_used_tok: the layer's counts,
 * then x += post_ffn_norm(ffn_y + down bias) */
void pi_ffn_sparse_done(pi_context *c, int l, int64_t n_tok);
/* the sparse FFN's arguments for layer l that a device split shares: its form, gate, up
 * and down_t, threshold; c->xn in, c->ffn_y and c->ffn_used_tok out */
pi_ffn_sparse_args pi_ffn_sparse_base(const pi_context *c, int l, int64_t n_tok);

/* ---- helpers the blocks share ---- */
static inline void pi_matmul1(pi_context *c, const pi_mat *w, const float *x, int64_t n_tok, float *y) {
    const pi_matmul_out o = {w, y, w->n_rows};
    pi_matmul_multi(c->pool, &o, 1, x, n_tok, c->act_scratch);
}

static inline void pi_add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* x[t] += b for n_tok rows of n floats, when the optional bias b is present */
static inline void pi_bias_opt(const pi_tensor *b, float *x, int64_t n, int64_t n_tok) {
    if (b->data != NULL)
        for (int64_t t = 0; t < n_tok; t++) pi_add_rows(x + t * n, b->data, n);
}

/* rows = RMSNorm(rows) * w in place, when the optional norm w is present */
static inline void pi_norm_opt(const pi_tensor *w, float *rows, int64_t n, int64_t n_rows, float eps) {
    if (w->data != NULL) pi_rmsnorm_rows(rows, w->data, n, n_rows, eps, rows);
}

#endif
