/* The ggml graphs of a placed model's device steps (graphs.c): one layer's attention block
 * (norms, q/k/v/o and biases, q/k norms, RoPE, the KV cache store, attention, post-norm,
 * residual and the FFN's input norm), one layer's hot FFN neurons, and the output block.
 * The same builders size the compute buffer (measure.c) and run the steps (ggml_placed.c). */
#ifndef PI_GGML_GRAPHS_H
#define PI_GGML_GRAPHS_H

#include "context.h"
#include "device/ggml/api.h"

#define PI_GG_GRAPH_NODES 512 /* upper bound of any graph here (attention: ~40 nodes) */

/* a layer's device tensors: the PI_L_* slots (NULL: absent or not placed) and the KV cache
 * ([kv_row, n_cells] each, one row per cell) */
typedef struct {
    gt *w[PI_L_COUNT];
    gt *k, *v;
} pi_gg_layer;

/* a layer's hot neurons: gate and up rows [n_embd, n_hot], down columns [n_down, n_embd]
 * (layout.h: n_down > n_hot for Q8_0 columns padded to a whole block; h is padded with zeros) */
typedef struct {
    gt *gate, *up, *down;
    int64_t n_hot, n_down;
    int32_t down_type;
} pi_gg_hot;

typedef struct {
    gt *norm, *norm_b, *out; /* output_norm (+ bias), the output matrix (tok_embd when tied) */
} pi_gg_output;

/* inputs (set before compute) and outputs (read after) of a built graph; NULL = not in it */
typedef struct {
    struct ggml_cgraph *gf;
    gt *x;                           /* F32 [n_embd, n_tok] */
    gt *pos, *kv_idx, *mask, *freqs; /* I32 [n_tok], I64 [n_tok], F32 [n_kv, n_tok], F32 [n_rot / 2] */
    gt *ids, *map;                   /* FFN with n_sel: I32 [n_sel, n_tok] rows, I32 [n_down, n_tok] (pi_gg_ffn) */
    gt *out0, *out1;                 /* attention: x, xn; FFN: y; output: embd, logits */
} pi_gg_io;

/* 1: layer l is a sliding-window layer (pi_model_params.swa_pattern) */
int pi_gg_is_swa(const pi_model_params *hp, int l);
/* the attention graph of layer l for n_tok rows of one sequence attending to the n_kv cells from
 * cell0 (its slot's first; kv_idx: absolute cells) (flash: ggml_flash_attn_ext, else mul_mat +
 * soft_max_ext); ctx: a no_alloc metadata context */
int pi_gg_attn(const pi_ggml_api *g, gctx *ctx, const pi_context *c, int l, const pi_gg_layer *L, int64_t n_tok,
               int64_t cell0, int64_t n_kv, int flash, pi_gg_io *io);
/* y = down . act(gate x) * (up x) over the hot neurons, act an enum pi_act; with h_only the
 * graph stops at the products: out0 = gate x, out1 = up x ([n_hot or n_sel, n_tok] each).
 * n_sel < 0: every hot neuron; 0: every hot row is read and h goes through map (per token and
 * down column: its hot row, or n_hot for 0: the neurons a predictor did not select); > 0 (a
 * token alone): only the n_sel hot rows ids lists are read (ggml_mul_mat_id), h through map
 * (the index in ids, or n_sel for 0) */
int pi_gg_ffn(const pi_ggml_api *g, gctx *ctx, const pi_context *c, const pi_gg_hot *H, int64_t n_tok, int h_only,
              int64_t n_sel, pi_gg_io *io);
/* embd = output_norm(x), logits = output . embd for n_out rows */
int pi_gg_output_graph(const pi_ggml_api *g, gctx *ctx, const pi_context *c, const pi_gg_output *O, int64_t n_out,
                       pi_gg_io *io);
/* the n_tok x n_kv mask rows (0 or -INFINITY): causal, and the sliding window on swa layers */
void pi_gg_fill_mask(const pi_context *c, int l, const int32_t *pos, int64_t n_tok, int64_t n_kv, float *mask);
/* a no_alloc metadata context for one graph in buf (pi_gg_meta_bytes bytes) */
size_t pi_gg_meta_bytes(const pi_ggml_api *g);
gctx *pi_gg_meta(const pi_ggml_api *g, void *buf);

#endif
