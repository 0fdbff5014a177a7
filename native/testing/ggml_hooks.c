/* Test hooks of a ggml placement (pi_test_ggml_*; testing.h): zero a placed device tensor, and
 * trace the device's and the CPU half's busy intervals. */
#include <stdlib.h>

#include "device/ggml/gplaced.h"
#include "testing.h"

int pi_test_ggml_zero_rows(pi_context *c, int32_t layer, int32_t slot, int64_t row0, int64_t n_rows) {
    pi_gplaced *p = pi_gg_of(c, "pi_test_ggml_zero_rows");
    if (p == NULL) return PI_ERR_INVALID;
    if (layer < 0 || layer >= c->m->hp.n_layer || slot < 0 || slot >= PI_L_COUNT)
        return pi_set_error(PI_ERR_INVALID, "pi_test_ggml_zero_rows: layer %d / slot %d out of range", layer, slot);
    const pi_gg_hot *H = &p->H[layer];
    gt *t = slot == PI_L_FFN_GATE ? H->gate : slot == PI_L_FFN_UP ? H->up : slot == PI_L_FFN_DOWN ? H->down
                                                                                                 : p->L[layer].w[slot];
    if (t == NULL) return pi_set_error(PI_ERR_INVALID, "blk.%d: slot %d is not on the device", layer, slot);
    const pi_tensor *lt = &c->m->hp.layers[layer * PI_L_COUNT + slot];
    const int32_t type = slot == PI_L_FFN_DOWN ? H->down_type : lt->type; /* layout.c */
    const int64_t ne0 = slot == PI_L_FFN_DOWN ? H->n_down : lt->ne[0];
    const int64_t rows = pi_gg_is_ffn_rows(slot) ? (slot == PI_L_FFN_DOWN ? c->m->hp.n_embd : H->n_hot)
                                                 : lt->ne[1] * lt->ne[2] * lt->ne[3];
    if (row0 < 0 || n_rows < 1 || row0 + n_rows > rows)
        return pi_set_error(PI_ERR_INVALID, "blk.%d: rows [%lld, %lld) outside [0, %lld)", layer, (long long)row0,
                            (long long)(row0 + n_rows), (long long)rows);
    const int64_t rs = pi_row_size(type, ne0);
    p->g->backend_tensor_memset(t, 0, (size_t)(row0 * rs), (size_t)(n_rows * rs));
    return PI_OK;
}

int pi_test_ggml_trace(pi_context *c, int32_t cap) {
    pi_gplaced *p = pi_gg_of(c, "pi_test_ggml_trace");
    if (p == NULL) return PI_ERR_INVALID;
    if (cap < 0 || cap > (1 << 20)) return pi_set_error(PI_ERR_INVALID, "pi_test_ggml_trace: cap %d", cap);
    free(p->ev);
    p->ev = NULL;
    p->ev_n = 0;
    p->ev_cap = 0;
    if (cap == 0) return PI_OK;
    if ((p->ev = malloc((size_t)cap * sizeof *p->ev)) == NULL)
        return pi_set_error(PI_ERR_NOMEM, "pi_test_ggml_trace: out of memory");
    p->ev_cap = cap;
    return PI_OK;
}

int32_t pi_test_ggml_trace_read(pi_context *c, pi_test_ggml_event *out, int32_t cap) {
    pi_gplaced *p = pi_gg_of(c, "pi_test_ggml_trace_read");
    if (p == NULL || out == NULL || p->ev == NULL) return -1;
    int32_t n = p->ev_n < p->ev_cap ? p->ev_n : p->ev_cap;
    if (n > cap) n = cap;
    for (int32_t i = 0; i < n; i++)
        out[i] = (pi_test_ggml_event){p->ev[i].kind, p->ev[i].layer, p->ev[i].t0_ns, p->ev[i].t1_ns};
    p->ev_n = 0;
    return n;
}
