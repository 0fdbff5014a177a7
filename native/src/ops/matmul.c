/* Matrix products for every weight type: the activation is converted once to the
 * weight type's vec_dot type (as llama.cpp does), then each thread takes a
 * contiguous range of output rows and runs the ISA's dot kernel over all tokens, or
 * for several tokens its tiled kernel where the type has one (same bits), which also
 * reads the activation's block scales (and offset / chunk sums) that the conversion
 * laid out beside the rows once per call (pi_tile_act). */
#include <stdlib.h>
#include <string.h>

#include "pi_internal.h"

#define ROW_TILE 16 /* rows per tile: a tile of weights stays in L1 across tokens */
/* activations of at most this many floats are converted on the calling thread: a few
 * microseconds, less than a pool job's wake-up and join (N sequences decoding together
 * pay that once per product, ~120 times a step on SmolLM2) */
#define QUANTIZE_INLINE 16384

/* pi_tile_act's side data: bytes per (block, token) entry for an activation type */
static int64_t side_entry(int32_t vdt) {
    switch (vdt) {
    case PI_TYPE_Q8_0: return 32 + 4 + 4; /* aux (8 int32) + d + ysum */
    case PI_TYPE_Q8_1: return 4 + 4;  /* d + s */
    case PI_TYPE_Q8_K: return 16 + 4; /* aux (8 int16) + d */
    default: return 0;
    }
}

/* side arrays of n_tok tokens: blocks x (n_tok + 8) entries, and 64 bytes to align them */
static int64_t side_size(int32_t vdt, int64_t n_cols, int64_t n_tok) {
    const int64_t e = side_entry(vdt);
    return e == 0 ? 0 : n_cols / pi_type_get(vdt)->block_size * (n_tok + 8) * e + 64;
}

int64_t pi_matmul_scratch_size(int32_t type, int64_t n_cols, int64_t n_tok) {
    const pi_type_traits *t = pi_type_get(type);
    return pi_row_size(t->vec_dot_type, n_cols) * n_tok + side_size(t->vec_dot_type, n_cols, n_tok);
}

int64_t pi_matmul_scratch_fixed(int32_t type, int64_t n_cols) {
    return side_size(pi_type_get(type)->vec_dot_type, n_cols, 0); /* side_size is affine in n_tok */
}

_Thread_local int64_t pi_weight_passes;

typedef struct {
    const pi_matmul_out *outs;
    int n_outs;
    int64_t total_rows;
    int64_t n_tok;
    pi_tile_act act;
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
        if (w->grouped) { /* whole groups: every part boundary rounded down alike */
            const int64_t g0 = r0 / PI_GROUP_ROWS * PI_GROUP_ROWS, g1 = r1 / PI_GROUP_ROWS * PI_GROUP_ROWS;
            if (g1 > g0)
                j->isa->matmul_groups[w->type](w->n_cols, g1 - g0, j->n_tok, j->outs[o].y + g0, j->outs[o].ldy,
                                               (const char *)w->data + g0 * pi_row_size(w->type, w->n_cols), &j->act);
            continue;
        }
        const pi_vec_dot_fn dot = j->isa->vec_dot[w->type];
        const pi_matmul_tiles_fn tiles = j->n_tok > 1 ? j->isa->matmul_tiles[w->type] : NULL;
        const pi_matvec_fn matvec = j->n_tok == 1 ? j->isa->matvec[w->type] : NULL;
        const int64_t wrow = pi_row_size(w->type, w->n_cols);
        const char *wd = w->data;
        float *y = j->outs[o].y;
        const int64_t ldy = j->outs[o].ldy;
        if (matvec != NULL) { /* decode: the same bits as the row loop below, several rows per step */
            matvec(w->n_cols, r1 - r0, y + r0, wd + r0 * wrow, wrow, j->act.x);
            continue;
        }
        for (int64_t rt = r0; rt < r1; rt += ROW_TILE) {
            const int64_t re = rt + ROW_TILE < r1 ? rt + ROW_TILE : r1;
            if (tiles != NULL) { /* the same bits as the loop below, several rows x tokens at a time */
                tiles(w->n_cols, re - rt, j->n_tok, y + rt, ldy, wd + rt * wrow, wrow, &j->act);
                continue;
            }
            for (int64_t t = 0; t < j->n_tok; t++) {
                const void *xt = j->act.x + t * j->act.xrow;
                for (int64_t r = rt; r < re; r++) dot(w->n_cols, &y[t * ldy + r], wd + r * wrow, xt);
            }
        }
    }
}

typedef struct {
    pi_from_float_fn cvt;
    const float *x;
    int64_t n;
    int64_t n_tok;
    int32_t vdt;
    int side;         /* fill act's side arrays (a tiled kernel will run) */
    pi_tile_act *act; /* x, xrow: the destination rows */
} quantize_job;

/* token t's entries of the side arrays (pi_tile_act), from its converted row */
static void fill_side(const quantize_job *q, int64_t t) {
    pi_tile_act *a = q->act;
    const char *row = a->x + t * a->xrow;
    float *d = (float *)a->d, *s = (float *)a->s;
    void *aux = (void *)a->aux;
    if (q->vdt == PI_TYPE_Q8_K) {
        const pi_block_q8_K *b = (const pi_block_q8_K *)row;
        for (int64_t i = 0; i < q->n / PI_QK_K; i++) {
            d[i * a->ld + t] = b[i].d;
            int16_t *c = (int16_t *)aux + (i * a->ld + t) * 8;
            for (int j = 0; j < 8; j++) c[j] = (int16_t)(b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
    } else if (q->vdt == PI_TYPE_Q8_1) {
        const pi_block_q8_1 *b = (const pi_block_q8_1 *)row;
        for (int64_t i = 0; i < q->n / PI_QK; i++) {
            d[i * a->ld + t] = pi_fp16_to_fp32(b[i].d);
            s[i * a->ld + t] = pi_fp16_to_fp32(b[i].s);
        }
    } else { /* Q8_0 */
        const pi_block_q8_0 *b = (const pi_block_q8_0 *)row;
        for (int64_t i = 0; i < q->n / PI_QK; i++) {
            d[i * a->ld + t] = pi_fp16_to_fp32(b[i].d);
            if (a->ysum != NULL) {
                int32_t sum = 0;
                for (int k = 0; k < PI_QK; k++) sum += b[i].qs[k];
                ((int32_t *)a->ysum)[i * a->ld + t] = sum;
            }
            if (aux == NULL) continue;
            int32_t *o = (int32_t *)aux + (i * a->ld + t) * 8;
            for (int k = 0; k < 8; k++) {
                const int8_t *q = b[i].qs + 4 * k;
                o[k] = -8 * (q[0] + q[1] + q[2] + q[3]);
            }
        }
    }
}

static void quantize_task(void *varg, int ith, int nth) {
    const quantize_job *q = varg;
    int64_t lo, hi;
    pi_split(q->n_tok, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        q->cvt(q->x + t * q->n, (char *)q->act->x + t * q->act->xrow, q->n);
        if (q->side) fill_side(q, t);
    }
}

/* Lays out act's side arrays in scratch after the n_tok rows (zeroing the padding
 * entries); returns whether the call has a tiled or row-group kernel that reads them. */
static int side_layout(const pi_isa *isa, const pi_matmul_out *outs, int n_outs, int32_t vdt, int64_t n,
                       int64_t n_tok, char *scratch, pi_tile_act *a) {
    int tiles = 0, offset = 0, grouped = 0;
    for (int o = 0; o < n_outs; o++) {
        const pi_mat *w = outs[o].w;
        grouped |= w->grouped;
        tiles |= !w->grouped && isa->matmul_tiles[w->type] != NULL;
        offset |= !w->grouped && (w->type == PI_TYPE_Q4_0 || w->type == PI_TYPE_Q5_0);
    }
    if (side_entry(vdt) == 0 || !(grouped || (n_tok > 1 && tiles))) return 0;
    const int64_t nb = n / pi_type_get(vdt)->block_size, ld = n_tok + 8, entries = nb * ld;
    char *p = (char *)pi_align_up((int64_t)(uintptr_t)(scratch + a->xrow * n_tok), 64);
    const int64_t aux_size = vdt == PI_TYPE_Q8_K ? 16 : vdt == PI_TYPE_Q8_0 ? 32 : 0;
    a->ld = ld;
    a->aux = aux_size > 0 && (vdt == PI_TYPE_Q8_K || offset) ? (const void *)p : NULL;
    a->d = (const float *)(p + entries * aux_size);
    a->s = vdt == PI_TYPE_Q8_1 ? a->d + entries : NULL;
    a->ysum = grouped && vdt == PI_TYPE_Q8_0 ? (const int32_t *)(a->d + entries) : NULL;
    for (int64_t i = 0; i < nb; i++) {
        memset((float *)a->d + i * ld + n_tok, 0, 8 * sizeof(float));
        if (a->s) memset((float *)a->s + i * ld + n_tok, 0, 8 * sizeof(float));
        if (a->ysum) memset((int32_t *)a->ysum + i * ld + n_tok, 0, 8 * sizeof(int32_t));
        if (a->aux) memset((char *)p + (i * ld + n_tok) * aux_size, 0, (size_t)(8 * aux_size));
    }
    return 1;
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
    matmul_job j = {outs, n_outs, 0, n_tok, {(const char *)x, pi_row_size(vdt, n), 0, NULL, NULL, NULL, NULL}, isa};
    if (vdt != PI_TYPE_F32) {
        j.act.x = scratch;
        quantize_job q = {isa->from_float[vdt], x, n, n_tok, vdt, 0, &j.act};
        q.side = side_layout(isa, outs, n_outs, vdt, n, n_tok, scratch, &j.act);
        if (n_tok * n <= QUANTIZE_INLINE)
            quantize_task(&q, 0, 1); /* decode, a few sequences: not worth waking the workers */
        else
            pi_pool_run(pool, quantize_task, &q);
    }
    pi_weight_passes += n_outs;
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

int pi_matmul_has_matvec(int32_t type) {
    const pi_type_traits *t = pi_type_get(type);
    return t != NULL && pi_type_is_weight(type) && pi_isa_current()->matvec[type] != NULL;
}
