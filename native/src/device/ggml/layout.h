/* What a plan puts in the device's buffers (layout.c), tensor by tensor in one order shared by
 * the byte rule (the Python plan counts the same), the allocation and the compute sizing:
 * "weights": per layer with attention on the device every slot but ffn_gate/up/down in its type
 * and shape, per layer with hot neurons gate and up rows [n_embd, n_hot] in their types and down
 * columns (pi_gg_down_cols: Q8_0 [n_hot rounded up to 32, n_embd] for a quantized ffn_down, else
 * F16 [n_hot, n_embd]; with every neuron hot, ffn_down [n_ff, n_embd] in its type; none where the
 * host sums the layer's whole down, pi_gg_host_down), with the output on the device output_norm
 * (+ bias) and the output
 * matrix; "kv": per layer with attention K and V, [kv_row, n_cells] each in the KV type. */
#ifndef PI_GGML_LAYOUT_H
#define PI_GGML_LAYOUT_H

#include "device/ggml/graphs.h"

/* called once per tensor: its ggml type and 2-D shape, and where the tensor goes */
typedef struct {
    void (*fn)(void *user, int32_t type, int64_t ne0, int64_t ne1, gt **dst);
    void *user;
} pi_gg_visit;

/* with_down 0: no down tensor (H->down NULL), for a layer whose down the host sums (pi_gg_host_down) */
void pi_gg_layer_tensors(const pi_context *c, int l, int attn_on, int64_t n_hot, int with_down, const pi_gg_visit *v,
                         pi_gg_layer *L, pi_gg_hot *H);
void pi_gg_kv_tensors(const pi_context *c, const pi_gg_visit *v, pi_gg_layer *L);
void pi_gg_output_tensors(const pi_context *c, const pi_gg_visit *v, pi_gg_output *O);
/* the type of layer l's gathered hot down columns and their row length (ne0) for n_hot < n_ff
 * neurons: Q8_0 over n_hot rounded up to a block of 32 (zero columns past n_hot) when ffn_down
 * is quantized (the file's blocks run along n_ff, so a column gather cannot keep them), else F16 */
int32_t pi_gg_down_cols(const pi_context *c, int l, int64_t n_hot, int64_t *ne0);
/* the output matrix: output, or tok_embd when tied */
const pi_tensor *pi_gg_output_matrix(const pi_context *c);
/* 1: layer l's FFN sums its whole down product on the host, over the GGUF ffn_down (c->ffn_dense_down,
 * set before placing and fixed while placed): its hot neurons' gate and up products come from the
 * device (pi_gg_h_only), which then holds no down columns for the layer */
static inline int pi_gg_host_down(const pi_context *c, int l) { return c->ffn_dense_down != NULL && c->ffn_dense_down[l]; }
/* 1 for the slots that stay on the CPU with a placed attention block (the FFN rows) */
static inline int pi_gg_is_ffn_rows(int s) { return s == PI_L_FFN_GATE || s == PI_L_FFN_UP || s == PI_L_FFN_DOWN; }

#endif
