/* Matrix products for every weight type: the activation is converted once to the
 * weight type's vec_dot type (as llama.cpp does), then each thread takes a
 * contiguous range of output rows and runs the ISA's dot kernel over all tokens, or
 * for several tokens its tiled kernel where the type has one (same bits). */
#include <stdlib.h>

#include "pi_internal.h"

#define ROW_TILE 16 /* rows per tile: a tile of weights stays in L1 across tokens */

int64_t pi_matmul_scratch_size(int32_t type, int64_t n_cols, int64_t n_tok) {
    const pi_type_traits *t = pi_type_get(type);
    return pi_row_size(t->vec_dot_type, n_cols) * n_tok;
}

_Thread_local int64_t pi_weight_passes;

typedef struct {
    const pi_matmul_out *outs;
    int n_outs;
    int64_t total_rows;
    int64_t n_tok;
    const void *xq;
    int64_t xq_row;
    const pi_isa *isa;
} matmul_job;

static void matmul_task(void *varg, int ith, int nth) {
    const matmul_job *j = varg;
    int64_t lo, hi;
    pi_split(j->total_rows, ith, nth, &lo, &hi);
    int64_t base = 0;
    for (int o = 0; o < j->n_outs; o++) {
        const pi_mat *w = j->outs[o].w;
        const int64_t r0 = lo - base > 0 ? lo - base : 0;
        const int64_t r1 = hi - base < w->n_rows ? hi - base : w->n_rows;
        base += w->n_rows;
        if (r0 >= r1) continue;
        const pi_vec_dot_fn dot = j->isa->vec_dot[w->type];
        const pi_matmul_tiles_fn tiles = j->n_tok > 1 ? j->isa->matmul_tiles[w->type] : NULL;
        const int64_t wrow = pi_row_size(w->type, w->n_cols);
        const char *wd = w->data;
        float *y = j->outs[o].y;
        const int64_t ldy = j->outs[o].ldy;
        for (int64_t rt = r0; rt < r1; rt += ROW_TILE) {
            const int64_t re = rt + ROW_TILE < r1 ? rt + ROW_TILE : r1;
            if (tiles != NULL) { /* the same bits as the loop below, several rows x tokens at a time */
                tiles(w->n_cols, re - rt, j->n_tok, y + rt, ldy, wd + rt * wrow, wrow, j->xq, j->xq_row);
                continue;
            }
            for (int64_t t = 0; t < j->n_tok; t++) {
                const void *xt = (const char *)j->xq + t * j->xq_row;
                for (int64_t r = rt; r < re; r++) dot(w->n_cols, &y[t * ldy + r], wd + r * wrow, xt);
            }
        }
    }
}

typedef struct {
    pi_from_float_fn cvt;
    const float *x;
    int64_t n;
    void *dst;
    int64_t dst_row;
    int64_t n_tok;
} quantize_job;

static void quantize_task(void *varg, int ith, int nth) {
    const quantize_job *q = varg;
    int64_t lo, hi;
    pi_split(q->n_tok, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) q->cvt(q->x + t * q->n, (char *)q->dst + t * q->dst_row, q->n);
}

void pi_matmul_multi(pi_pool *pool, const pi_matmul_out *outs, int n_outs, const float *x,
                     int64_t n_tok, void *scratch) {
    const pi_isa *isa = pi_isa_current();
    const pi_mat *w0 = outs[0].w;
    const int32_t vdt = pi_type_get(w0->type)->vec_dot_type;
    for (int o = 1; o < n_outs; o++)
        if (pi_type_get(outs[o].w->type)->vec_dot_type != vdt) { /* mixed activation types: one at a time */
            for (int i = 0; i < n_outs; i++) pi_matmul_multi(pool, &outs[i], 1, x, n_tok, scratch);
            return;
        }
    const int64_t n = w0->n_cols;
    const int64_t xq_row = pi_row_size(vdt, n);
    const void *xq = x;
    if (vdt != PI_TYPE_F32) {
        quantize_job q = {isa->from_float[vdt], x, n, scratch, xq_row, n_tok};
        if (n_tok == 1)
            quantize_task(&q, 0, 1); /* decode: not worth waking the workers */
        else
            pi_pool_run(pool, quantize_task, &q);
        xq = scratch;
    }
    pi_weight_passes += n_outs;
    matmul_job j = {outs, n_outs, 0, n_tok, xq, xq_row, isa};
    for (int o = 0; o < n_outs; o++) j.total_rows += outs[o].w->n_rows;
    pi_pool_run(pool, matmul_task, &j);
}

int pi_op_matmul(pi_pool *pool, int32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                 const float *x, int64_t n_tok, float *y) {
    const pi_type_traits *t = pi_type_get(type);
    if (pool == NULL || w == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_op_matmul: NULL argument");
    if (t == NULL || !pi_type_is_weight(type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "pi_op_matmul: unsupported weight type %d", type);
    if (n_rows < 1 || n_cols < 1 || n_tok < 1)
        return pi_set_error(PI_ERR_INVALID, "pi_op_matmul: sizes must be positive");
    if (n_cols % t->block_size != 0)
        return pi_set_error(PI_ERR_INVALID, "pi_op_matmul: n_cols %lld is not a multiple of %lld for %s",
                            (long long)n_cols, (long long)t->block_size, t->name);
    void *scratch = malloc((size_t)pi_matmul_scratch_size(type, n_cols, n_tok));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_op_matmul: out of memory");
    const pi_mat m = {w, type, n_cols, n_rows};
    const pi_matmul_out o = {&m, y, n_rows};
    pi_matmul_multi(pool, &o, 1, x, n_tok, scratch);
    free(scratch);
    return PI_OK;
}

int pi_matmul_has_tiles(int32_t type) {
    const pi_type_traits *t = pi_type_get(type);
    return t != NULL && pi_type_is_weight(type) && pi_isa_current()->matmul_tiles[type] != NULL;
}
