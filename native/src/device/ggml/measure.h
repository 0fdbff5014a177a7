/* Sizing the compute buffer (measure.c): a constant of (model, n_ctx, n_batch, device). */
#ifndef PI_GGML_MEASURE_H
#define PI_GGML_MEASURE_H

#include "device/ggml/backend.h"
#include "device/ggml/layout.h"

/* 1 when d runs ggml_flash_attn_ext on this context's worst-case attention shapes and KV type, and
 * is not ggml's CPU backend (POWERINFER_GGML_FLASH_ATTN "0" / "1" turns it off / on) */
int pi_gg_flash_supported(const pi_gdev *d, const pi_context *c);
/* PI_OK when d runs the graphs that skip unselected hot neurons (pi_gg_ffn's n_sel) over layer l's
 * gate and up types; else PI_ERR_UNSUPPORTED naming the op and type */
int pi_gg_skips_supported(const pi_gdev *d, const pi_context *c, int l);
/* the largest compute buffer of the worst-case graphs: every layer's attention (n_batch tokens over
 * n_cells cells) and hot FFN (all n_ff neurons), and the output block (n_batch rows). With
 * reserve != NULL the graphs are reserved on it (its buffer is allocated, of that size); else only
 * measured. Weights are stand-ins in an untouched host block: sizing reads no tensor data. */
int pi_gg_measure(const pi_gdev *d, const pi_context *c, int flash, struct ggml_gallocr *reserve, int64_t *out);

#endif
