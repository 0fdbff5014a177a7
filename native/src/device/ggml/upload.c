/* Host to device copies of what a plan places. The model file is never permuted on the host:
 * attention and output tensors go as they are; hot gate/up rows are gathered in plan order
 * (whole rows keep quant blocks whole); hot down columns are dequantized from ffn_down
 * ([n_ff, n_embd]: each of its n_embd rows holds one value per neuron) and stored as
 * pi_gg_down_cols says (Q8_0 blocks of 32 hot neurons, zero past n_hot; F16 for an unquantized
 * file), except with every neuron hot (a whole layer), when ffn_down goes as stored, as
 * llama.cpp's layer split, and none where the host sums the layer's down (pi_gg_host_down). */
#include <stdlib.h>

#include "device/ggml/gplaced.h"

static int64_t bytes_of(const pi_tensor *t) { return pi_row_size(t->type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3]; }

/* rows hot_ids of a [n_embd, n_ff] matrix into dst */
static int gather_rows(const pi_ggml_api *g, gt *dst, const pi_tensor *w, const int32_t *hot_ids, int64_t n_hot) {
    const int64_t row = pi_row_size(w->type, w->ne[0]);
    char *tmp = malloc((size_t)(row * n_hot));
    if (tmp == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory gathering %lld hot rows", (long long)n_hot);
    for (int64_t r = 0; r < n_hot; r++) memcpy(tmp + r * row, (const char *)w->data + hot_ids[r] * row, (size_t)row);
    g->backend_tensor_set(dst, tmp, 0, (size_t)(row * n_hot));
    free(tmp);
    return PI_OK;
}

/* columns hot_ids of ffn_down as rows of n_down values of type dt (zeros past n_hot):
 * dst[e][r] = down[e][hot_ids[r]] */
static int gather_down(const pi_ggml_api *g, gt *dst, const pi_tensor *down, const int32_t *hot_ids, int64_t n_hot,
                       int32_t dt, int64_t n_down) {
    const int64_t F = down->ne[0], E = down->ne[1], row = pi_row_size(down->type, F), orow = pi_row_size(dt, n_down);
    float *full = malloc((size_t)F * sizeof *full);
    float *col = calloc((size_t)n_down, sizeof *col);
    char *out = malloc((size_t)(orow * E));
    int rc = PI_OK;
    if (full == NULL || col == NULL || out == NULL) {
        rc = pi_set_error(PI_ERR_NOMEM, "out of memory gathering %lld hot down columns", (long long)n_hot);
    } else {
        const pi_isa *isa = pi_isa_current();
        for (int64_t e = 0; e < E; e++) {
            pi_dequantize_row(down->type, (const char *)down->data + e * row, full, F);
            for (int64_t r = 0; r < n_hot; r++) col[r] = full[hot_ids[r]];
            if (dt == PI_TYPE_Q8_0)
                isa->from_float[PI_TYPE_Q8_0](col, out + e * orow, n_down);
            else
                for (int64_t r = 0; r < n_down; r++) ((uint16_t *)(out + e * orow))[r] = pi_fp32_to_fp16(col[r]);
        }
        g->backend_tensor_set(dst, out, 0, (size_t)(orow * E));
    }
    free(full);
    free(col);
    free(out);
    return rc;
}

int pi_gg_upload_layer(pi_gplaced *p, int l, const int32_t *hot_ids) {
    const pi_ggml_api *g = p->g;
    const pi_tensor *lt = &p->c->m->hp.layers[l * PI_L_COUNT];
    const pi_gg_layer *L = &p->L[l];
    for (int s = 0; s < PI_L_COUNT; s++)
        if (L->w[s] != NULL) g->backend_tensor_set(L->w[s], lt[s].data, 0, (size_t)bytes_of(&lt[s]));
    const pi_gg_hot *H = &p->H[l];
    if (H->n_hot == 0) return PI_OK;
    int rc = gather_rows(g, H->gate, &lt[PI_L_FFN_GATE], hot_ids, H->n_hot);
    if (rc == PI_OK) rc = gather_rows(g, H->up, &lt[PI_L_FFN_UP], hot_ids, H->n_hot);
    if (rc != PI_OK || H->down == NULL) return rc; /* the host sums this layer's down (pi_gg_host_down) */
    if (H->n_hot == lt[PI_L_FFN_DOWN].ne[0]) /* every neuron: ffn_down as stored */
        g->backend_tensor_set(H->down, lt[PI_L_FFN_DOWN].data, 0, (size_t)bytes_of(&lt[PI_L_FFN_DOWN]));
    else
        rc = gather_down(g, H->down, &lt[PI_L_FFN_DOWN], hot_ids, H->n_hot, H->down_type, H->n_down);
    return rc;
}

void pi_gg_upload_output(pi_gplaced *p) {
    const pi_ggml_api *g = p->g;
    const pi_model_params *hp = &p->c->m->hp;
    g->backend_tensor_set(p->O.norm, hp->output_norm.data, 0, (size_t)bytes_of(&hp->output_norm));
    if (p->O.norm_b != NULL) g->backend_tensor_set(p->O.norm_b, hp->output_norm_b.data, 0, (size_t)bytes_of(&hp->output_norm_b));
    const pi_tensor *o = pi_gg_output_matrix(p->c);
    g->backend_tensor_set(p->O.out, o->data, 0, (size_t)bytes_of(o));
}
