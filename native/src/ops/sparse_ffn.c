/* Neuron-aware sparse FFN (PowerInfer / Deja Vu / CATS / TEAL style): the gate and
 * up products run only over the rows of the active neurons, and the down product
 * is an accumulation of the rows of a transposed down matrix (down_t, n_ff rows of
 * n_embd), one row per neuron kept.
 *
 * Three steps per call:
 *  1. x is converted once per token to the gate/up activation type (the ISA's
 *     from_float, as pi_matmul_multi does), so every gate_j.x / up_j.x has the bits
 *     of row j of the dense product.
 *  2. (pool job) h_j for each active (token, neuron), split across threads by
 *     neuron; each h_j is independent, so its bits do not depend on the split.
 *     The ReLU forms skip the up row when gate_j.x <= 0; the ungated form
 *     forms (PI_FFN_RELU_UP, PI_FFN_GELU_UP) read only the up row: h_j = act(up_j.x + b_j).
 *  3. (serial, O(n_active)) the kept neurons (|h| >= threshold, h != 0) are
 *     compacted per token, and counted for n_used.
 *  4. (pool job) the down accumulation, split across threads by output column in
 *     units of 32 columns: a thread owns y[t][c0:c1) and adds the kept rows in
 *     increasing id order. The sum of each output element therefore has one fixed
 *     order, y = ((0 + h_a*w_a) + h_b*w_b) + ..., for every pool size, and no
 *     partial-sum buffers are needed (the alternative, per-chunk partial rows
 *     reduced in chunk order, writes and rereads n_chunks * n_embd floats).
 *
 * The down accumulation has a portable path here and the ISA's whole-tile kernel
 * (pi_isa.down_tiles: isa/avx2_sparse.c for the avx2 and avx512 paths, none for
 * scalar). Both dequantize a 32-column tile of a row exactly, then do
 * acc = acc + h * w with a separate multiply and add, so both give the same bits.
 * A batch with a Q8_0 / Q4_0 down_t and enough kept neurons takes the batched form
 * instead (ops/sparse_down_batch.c), which gives these bits too. */
#include <stdlib.h>

#include "pi_internal.h"

#define TILE PI_DOWN_TILE
#define ROW_GROUP 8  /* kept rows added per pass over a tile of y */
#define SCRATCH_ALIGN 64

static int down_type_ok(int32_t t) {
    return t == PI_TYPE_F32 || t == PI_TYPE_F16 || t == PI_TYPE_Q8_0 || t == PI_TYPE_Q4_0;
}

/* ---- down accumulation kernels ------------------------------------------------ */

/* Exact float values of the first `w` elements (w <= TILE; w == TILE for the
 * quantized types) of tile `b` of a row segment. */
static inline void dequant_tile(int32_t type, const char *row, int64_t b, int w, float *out) {
    switch (type) {
    case PI_TYPE_F32:
        memcpy(out, (const float *)row + b * TILE, (size_t)w * sizeof(float));
        break;
    case PI_TYPE_F16: {
        const uint16_t *p = (const uint16_t *)row + b * TILE;
        for (int i = 0; i < w; i++) out[i] = pi_fp16_to_fp32(p[i]);
        break;
    }
    case PI_TYPE_Q8_0: {
        const pi_block_q8_0 *q = (const pi_block_q8_0 *)row + b;
        const float d = pi_fp16_to_fp32(q->d);
        for (int i = 0; i < TILE; i++) out[i] = (float)q->qs[i] * d;
        break;
    }
    default: { /* Q4_0 */
        const pi_block_q4_0 *q = (const pi_block_q4_0 *)row + b;
        const float d = pi_fp16_to_fp32(q->d);
        for (int i = 0; i < TILE / 2; i++) {
            out[i] = (float)((q->qs[i] & 0x0F) - 8) * d;
            out[i + TILE / 2] = (float)((q->qs[i] >> 4) - 8) * d;
        }
        break;
    }
    }
}

/* y[0:n) += sum over r < nr of h[r] * row r, rows added in order r = 0, 1, ...
 * rows[r] points at the segment's first element (block for quantized types). */
static void down_rows_scalar(int32_t type, int64_t n, float *y, const char *const *rows,
                             const float *h, int nr, const char *const *next, int n_next) {
    float acc[TILE], w[TILE];
    const int64_t tb = type == PI_TYPE_F32 ? TILE * 4 : type == PI_TYPE_F16 ? TILE * 2 : pi_row_size(type, TILE);
    for (int64_t b = 0; b * TILE < n; b++) {
        for (int r = 0; r < n_next; r++) pi_prefetch_bytes(next[r] + b * tb, tb);
        const int wd = n - b * TILE < TILE ? (int)(n - b * TILE) : TILE;
        float *yb = y + b * TILE;
        memcpy(acc, yb, (size_t)wd * sizeof(float));
        for (int r = 0; r < nr; r++) {
            dequant_tile(type, rows[r], b, wd, w);
            const float hr = h[r];
            for (int i = 0; i < wd; i++) {
                const float p = hr * w[i];
                acc[i] = acc[i] + p;
            }
        }
        memcpy(yb, acc, (size_t)wd * sizeof(float));
    }
}


/* rows: the nr rows to add now; next: the n_next rows of the next call, prefetched
 * tile by tile as these are read; tiles: the ISA's kernel for whole tiles, or NULL */
static void down_rows(pi_down_tiles_fn tiles, int32_t type, int64_t n, float *y, const char *const *rows,
                      const float *h, int nr, const char *const *next, int n_next) {
    if (tiles == NULL) {
        down_rows_scalar(type, n, y, rows, h, nr, next, n_next);
        return;
    }
    const int64_t full = n / TILE;
    tiles(type, full, y, rows, h, nr, next, n_next);
    if (full * TILE == n) return;
    /* partial last tile (F32/F16 rows of n % 32 != 0): rows advanced by `full` tiles */
    const int64_t tb = pi_row_size(type, full * TILE);
    const char *rr[ROW_GROUP];
    for (int r = 0; r < nr; r++) rr[r] = rows[r] + tb;
    down_rows_scalar(type, n - full * TILE, y + full * TILE, rr, h, nr, NULL, 0);
}

/* ---- the operator ----------------------------------------------------------- */

typedef struct {
    const pi_ffn_sparse_args *a;
    const pi_isa *isa;
    int64_t n_embd, n_ff;
    const void *xq; /* n_tok activation rows */
    int64_t xq_row;
    const int64_t *off; /* n_tok + 1 offsets of the active lists (relative to off[0]) */
    int64_t total;      /* off[n_tok] */
    float *h;           /* total floats; compacted in place to the kept values */
    int32_t *kid;       /* kept ids, compacted */
    int64_t *koff;      /* n_tok + 1 offsets of the kept lists */
} sparse_job;

static void h_task(void *varg, int ith, int nth) {
    const sparse_job *s = varg;
    const pi_ffn_sparse_args *a = s->a;
    int64_t lo, hi;
    pi_split(s->total, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const pi_vec_dot_fn dot = s->isa->vec_dot[a->up->type];
    const int64_t wrow = pi_row_size(a->up->type, s->n_embd);
    const int ungated = a->act == PI_FFN_RELU_UP || a->act == PI_FFN_GELU_UP;
    const char *gd = ungated ? a->up->data : a->gate->data, *ud = a->up->data; /* ungated: up is the first row read */
    int64_t t = 0;
    while (s->off[t + 1] <= lo) t++;
    for (int64_t k = lo; k < hi; k++) {
        while (s->off[t + 1] <= k) t++;
        const int64_t j = a->active ? a->active[a->active_off[0] + k] : k - s->off[t];
        const void *xt = (const char *)s->xq + t * s->xq_row;
        if (k + 1 < hi) { /* the next neuron's rows (the up row only where it is surely read) */
            int64_t tn = t;
            while (s->off[tn + 1] <= k + 1) tn++;
            const int64_t jn = a->active ? a->active[a->active_off[0] + k + 1] : k + 1 - s->off[tn];
            pi_prefetch_bytes(gd + jn * wrow, wrow);
            if (a->act == PI_FFN_SWIGLU || a->act == PI_FFN_GEGLU) pi_prefetch_bytes(ud + jn * wrow, wrow);
        }
        float g, u, h;
        dot(s->n_embd, &g, gd + j * wrow, xt);
        if (ungated) { /* h = act(up x + b); "gate" thresholding is then the product's */
            if (a->up_bias != NULL) g += a->up_bias[j];
            if (a->act == PI_FFN_RELU_UP)
                h = g > 0.0f ? g : 0.0f;
            else
                pi_ffn_act_mul(PI_ACT_GELU, &g, NULL, &h, 1);
            s->h[k] = a->on_gate && fabsf(h) < a->threshold ? 0.0f : h;
            continue;
        }
        if (a->on_gate) { /* CATS: a small gate activation skips the up row too */
            const float ga = pi_act1(a->act == PI_FFN_SWIGLU ? PI_ACT_SILU : a->act == PI_FFN_GEGLU ? PI_ACT_GELU
                                                                                                  : PI_ACT_RELU, g);
            if (fabsf(ga) < a->threshold) {
                s->h[k] = 0.0f;
                continue;
            }
        }
        switch (a->act) {
        case PI_FFN_SWIGLU:
        case PI_FFN_GEGLU: /* h as the dense FFN's (pi_ffn_act_mul) */
            dot(s->n_embd, &u, ud + j * wrow, xt);
            pi_ffn_act_mul(a->act == PI_FFN_SWIGLU ? PI_ACT_SILU : PI_ACT_GELU, &g, &u, &h, 1);
            break;
        case PI_FFN_RELU:
            h = 0.0f;
            if (g > 0.0f) {
                dot(s->n_embd, &u, ud + j * wrow, xt);
                h = g * u;
            }
            break;
        default: /* PI_FFN_DRELU */
            h = 0.0f;
            if (g > 0.0f) {
                dot(s->n_embd, &u, ud + j * wrow, xt);
                h = u > 0.0f ? g * u : 0.0f;
            }
            break;
        }
        s->h[k] = h;
    }
}

static void down_task(void *varg, int ith, int nth) {
    const sparse_job *s = varg;
    const pi_ffn_sparse_args *a = s->a;
    const int64_t n_units = (s->n_embd + TILE - 1) / TILE;
    int64_t ulo, uhi;
    pi_split(n_units, ith, nth, &ulo, &uhi);
    const int64_t c0 = ulo * TILE;
    const int64_t c1 = uhi * TILE < s->n_embd ? uhi * TILE : s->n_embd;
    if (c0 >= c1) return;
    const int32_t type = a->down_t->type;
    const int64_t drow = pi_row_size(type, s->n_embd);
    const int64_t coff = pi_row_size(type, c0); /* c0 is a multiple of 32: whole blocks */
    const char *dd = (const char *)a->down_t->data + coff;
    for (int64_t t = 0; t < a->n_tok; t++) {
        float *yt = a->y + t * s->n_embd + c0;
        if (a->phase != 2) memset(yt, 0, (size_t)(c1 - c0) * sizeof(float));
        const int64_t k1 = s->koff[t + 1];
        const char *bufs[2][ROW_GROUP];
        int nr = 0, cur = 0;
        if (s->koff[t] < k1) {
            nr = k1 - s->koff[t] < ROW_GROUP ? (int)(k1 - s->koff[t]) : ROW_GROUP;
            for (int r = 0; r < nr; r++) bufs[0][r] = dd + (int64_t)s->kid[s->koff[t] + r] * drow;
        }
        for (int64_t k = s->koff[t]; k < k1; k += ROW_GROUP) {
            const int64_t kn = k + ROW_GROUP;
            const int nn = kn < k1 ? (k1 - kn < ROW_GROUP ? (int)(k1 - kn) : ROW_GROUP) : 0;
            for (int r = 0; r < nn; r++) bufs[cur ^ 1][r] = dd + (int64_t)s->kid[kn + r] * drow;
            down_rows(s->isa->down_tiles, type, c1 - c0, yt, bufs[cur], s->h + k, nr, bufs[cur ^ 1], nn);
            cur ^= 1;
            nr = nn;
        }
    }
}

int64_t pi_ffn_sparse_scratch_size(int32_t gate_up_type, int64_t n_embd, int64_t n_ff, int64_t n_tok) {
    const int32_t vdt = pi_type_get(gate_up_type)->vec_dot_type;
    return pi_align_up(pi_row_size(vdt, n_embd) * n_tok, SCRATCH_ALIGN)  /* xq */
           + pi_align_up(n_tok * n_ff * 4, SCRATCH_ALIGN)               /* h */
           + pi_align_up(n_tok * n_ff * 4, SCRATCH_ALIGN)               /* kept ids */
           + pi_align_up((n_tok + 1) * 8, SCRATCH_ALIGN) * 2;           /* off, koff */
}

void pi_ffn_sparse(pi_pool *pool, const pi_ffn_sparse_args *a, void *scratch) {
    const pi_isa *isa = pi_isa_current();
    const int64_t n_embd = a->up->n_cols, n_ff = a->up->n_rows, n_tok = a->n_tok;
    const int32_t vdt = pi_type_get(a->up->type)->vec_dot_type;
    char *p = scratch;
    sparse_job s = {a, isa, n_embd, n_ff, NULL, pi_row_size(vdt, n_embd), NULL, 0, NULL, NULL, NULL};
    void *xq = p;
    p += pi_align_up(s.xq_row * n_tok, SCRATCH_ALIGN);
    s.h = (float *)p;
    p += pi_align_up(n_tok * n_ff * 4, SCRATCH_ALIGN);
    s.kid = (int32_t *)p;
    p += pi_align_up(n_tok * n_ff * 4, SCRATCH_ALIGN);
    int64_t *off = (int64_t *)p;
    p += pi_align_up((n_tok + 1) * 8, SCRATCH_ALIGN);
    s.koff = (int64_t *)p;

    for (int64_t t = 0; t <= n_tok; t++)
        off[t] = a->active ? a->active_off[t] - a->active_off[0] : t * n_ff;
    s.off = off;
    s.total = off[n_tok];

    if (a->phase == 2) { /* the kept rows of the phase-1 call, still in scratch (or in a->h) */
        if (a->h != NULL) s.h = a->h;
        pi_pool_run(pool, down_task, &s);
        return;
    }
    if (a->h != NULL) {
        s.h = a->h; /* compacted in place below, like the scratch rows */
    } else if (s.total > 0) {
        if (vdt == PI_TYPE_F32) {
            s.xq = a->x;
        } else {
            for (int64_t t = 0; t < n_tok; t++)
                isa->from_float[vdt](a->x + t * n_embd, (char *)xq + t * s.xq_row, n_embd);
            s.xq = xq;
        }
        pi_pool_run(pool, h_task, &s);
    }

    /* keep |h| >= threshold and h != 0 (NaN kept); compact in place, in id order */
    const float thr = a->on_gate ? 0.0f : a->threshold; /* gate mode: zeros were made in h_task */
    if (pi_sparse_down_batch(pool, a, isa, s.h, off, thr)) return; /* a batch: dense rows, skipped h +0 */
    if (a->h_dense != NULL) memset(a->h_dense, 0, (size_t)(n_tok * n_ff) * sizeof(float));
    int64_t m = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        s.koff[t] = m;
        for (int64_t k = off[t]; k < off[t + 1]; k++) {
            const float h = s.h[k];
            if (h == 0.0f || fabsf(h) < thr) continue;
            s.kid[m] = a->active ? a->active[a->active_off[0] + k] : (int32_t)(k - off[t]);
            if (a->h_dense != NULL) a->h_dense[t * n_ff + s.kid[m]] = h;
            s.h[m] = h;
            m++;
        }
        if (a->n_used) a->n_used[t] = m - s.koff[t];
    }
    s.koff[n_tok] = m;
    if (a->phase != 1) pi_pool_run(pool, down_task, &s);
}

/* The checks both entry points share (arguments of pi_op_ffn_sparse) */
static int check_op_args(const char *fn, int32_t gate_up_type, int64_t n_embd, int64_t n_ff, int32_t down_t_type,
                         int64_t n_tok, const int32_t *active, const int64_t *active_off, float threshold) {
    const pi_type_traits *tg = pi_type_get(gate_up_type), *td = pi_type_get(down_t_type);
    if (tg == NULL) return pi_set_error(PI_ERR_INVALID, "%s: unknown gate/up type %d", fn, gate_up_type);
    if (!pi_type_is_weight(gate_up_type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: %s is not a weight type", fn, tg->name);
    if (td == NULL) return pi_set_error(PI_ERR_INVALID, "%s: unknown down_t type %d", fn, down_t_type);
    if (!down_type_ok(down_t_type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: down_t type %s not supported (f32, f16, q8_0, q4_0)",
                            fn, td->name);
    if (n_embd < 1 || n_ff < 1 || n_tok < 1 || n_ff > INT32_MAX)
        return pi_set_error(PI_ERR_INVALID, "%s: sizes must be positive (n_ff < 2^31)", fn);
    if (n_embd % tg->block_size != 0 || n_embd % td->block_size != 0)
        return pi_set_error(PI_ERR_INVALID, "%s: n_embd %lld is not a multiple of the block size (%s, %s)",
                            fn, (long long)n_embd, tg->name, td->name);
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "%s: threshold must be finite and >= 0", fn);
    if (active != NULL) {
        if (active_off == NULL) return pi_set_error(PI_ERR_INVALID, "%s: active_off is NULL", fn);
        if (active_off[0] != 0) return pi_set_error(PI_ERR_INVALID, "%s: active_off[0] must be 0", fn);
        for (int64_t t = 0; t < n_tok; t++) {
            const int64_t k0 = active_off[t], k1 = active_off[t + 1];
            if (k1 < k0 || k1 - k0 > n_ff)
                return pi_set_error(PI_ERR_INVALID, "%s: token %lld: bad active_off range [%lld, %lld)", fn,
                                    (long long)t, (long long)k0, (long long)k1);
            for (int64_t k = k0; k < k1; k++) {
                const int32_t j = active[k];
                if (j < 0 || j >= n_ff)
                    return pi_set_error(PI_ERR_INVALID, "%s: token %lld: neuron id %d out of range [0, %lld)",
                                        fn, (long long)t, j, (long long)n_ff);
                if (k > k0 && j <= active[k - 1])
                    return pi_set_error(PI_ERR_INVALID,
                                        "%s: token %lld: neuron ids must be strictly increasing (%d after %d)",
                                        fn, (long long)t, j, active[k - 1]);
            }
        }
    }
    return PI_OK;
}

/* Allocate the scratch and run; gate NULL for the ungated form */
static int run_op(int32_t act, int32_t gate_up_type, const void *gate, const void *up, const float *up_bias,
                  int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t, const float *x,
                  int64_t n_tok, const int32_t *active, const int64_t *active_off, float threshold, float *y,
                  int64_t *n_used, pi_pool *pool, const char *fn) {
    void *scratch = malloc((size_t)pi_ffn_sparse_scratch_size(gate_up_type, n_embd, n_ff, n_tok));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    const pi_mat g = {gate, gate_up_type, n_embd, n_ff}, u = {up, gate_up_type, n_embd, n_ff};
    const pi_mat d = {down_t, down_t_type, n_embd, n_ff};
    const pi_ffn_sparse_args a = {.act = act, .gate = gate ? &g : NULL, .up = &u, .down_t = &d, .x = x,
                                  .n_tok = n_tok, .active = active, .active_off = active_off,
                                  .threshold = threshold, .y = y, .n_used = n_used, .up_bias = up_bias};
    pi_ffn_sparse(pool, &a, scratch);
    free(scratch);
    return PI_OK;
}

int pi_op_ffn_sparse(pi_pool *pool, int32_t act, int32_t gate_up_type, const void *gate,
                     const void *up, int64_t n_embd, int64_t n_ff, int32_t down_t_type,
                     const void *down_t, const float *x, int64_t n_tok, const int32_t *active,
                     const int64_t *active_off, float threshold, float *y, int64_t *n_used) {
    static const char *fn = "pi_op_ffn_sparse";
    if (pool == NULL || gate == NULL || up == NULL || down_t == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    if (act < PI_FFN_SWIGLU || act > PI_FFN_DRELU)
        return pi_set_error(PI_ERR_INVALID, "%s: unknown activation form %d (the ungated form is "
                            "pi_op_ffn_sparse_ungated)", fn, act);
    int rc = check_op_args(fn, gate_up_type, n_embd, n_ff, down_t_type, n_tok, active, active_off, threshold);
    if (rc) return rc;
    return run_op(act, gate_up_type, gate, up, NULL, n_embd, n_ff, down_t_type, down_t, x, n_tok, active, active_off,
                  threshold, y, n_used, pool, fn);
}

int pi_op_ffn_sparse_ungated(pi_pool *pool, int32_t act, int32_t up_type, const void *up, const float *up_bias,
                             int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t,
                             const float *x, int64_t n_tok, const int32_t *active, const int64_t *active_off,
                             float threshold, float *y, int64_t *n_used) {
    static const char *fn = "pi_op_ffn_sparse_ungated";
    if (pool == NULL || up == NULL || down_t == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    if (act != PI_FFN_RELU_UP && act != PI_FFN_GELU_UP)
        return pi_set_error(PI_ERR_INVALID, "%s: activation form %d is not an ungated one (%d, %d)", fn, act,
                            PI_FFN_RELU_UP, PI_FFN_GELU_UP);
    int rc = check_op_args(fn, up_type, n_embd, n_ff, down_t_type, n_tok, active, active_off, threshold);
    if (rc) return rc;
    return run_op(act, up_type, NULL, up, up_bias, n_embd, n_ff, down_t_type, down_t, x, n_tok, active,
                  active_off, threshold, y, n_used, pool, fn);
}

/* ---- transpose (done once per model; portable, single thread) ---------------- */

/* GGUF Q4_0 rule: d = (the element of largest magnitude) / -8, q = clamp(x/d + 8.5) */
static void quantize_q4_0_row(const float *x, pi_block_q4_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / PI_QK; b++) {
        const float *xb = x + b * PI_QK;
        float amax = 0.0f, vmax = 0.0f;
        for (int i = 0; i < PI_QK; i++)
            if (fabsf(xb[i]) > amax) {
                amax = fabsf(xb[i]);
                vmax = xb[i];
            }
        const float d = vmax / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = pi_fp32_to_fp16(d);
        for (int i = 0; i < PI_QK / 2; i++) {
            int q0 = (int)(int8_t)(xb[i] * id + 8.5f), q1 = (int)(int8_t)(xb[i + PI_QK / 2] * id + 8.5f);
            q0 = q0 < 15 ? q0 : 15;
            q1 = q1 < 15 ? q1 : 15;
            y[b].qs[i] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

#define TR_TILE 256 /* source columns per pass: a whole K-quant block (256), so tiles never split one */

int pi_op_transpose_to(int32_t type_out, const void *src, int32_t src_type, int64_t n_rows,
                       int64_t n_cols, void *dst) {
    static const char *fn = "pi_op_transpose_to";
    if (src == NULL || dst == NULL) return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    const pi_type_traits *ts = pi_type_get(src_type), *to = pi_type_get(type_out);
    if (ts == NULL || to == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: unknown type %d", fn, ts == NULL ? src_type : type_out);
    if (!pi_type_is_weight(src_type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: %s is not a weight type", fn, ts->name);
    if (!down_type_ok(type_out))
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: output type %s not supported (f32, f16, q8_0, q4_0)",
                            fn, to->name);
    if (n_rows < 1 || n_cols < 1) return pi_set_error(PI_ERR_INVALID, "%s: sizes must be positive", fn);
    if (n_cols % ts->block_size != 0 || n_rows % to->block_size != 0)
        return pi_set_error(PI_ERR_INVALID, "%s: n_cols %% %lld or n_rows %% %lld is not 0", fn,
                            (long long)ts->block_size, (long long)to->block_size);
    float *tile = malloc((size_t)(n_rows * TR_TILE) * sizeof(float));
    float *col = malloc((size_t)n_rows * sizeof(float));
    if (tile == NULL || col == NULL) {
        free(tile);
        free(col);
        return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    }
    const pi_isa *isa = pi_isa_current();
    const int64_t srow = pi_row_size(src_type, n_cols), drow = pi_row_size(type_out, n_rows);
    for (int64_t c0 = 0; c0 < n_cols; c0 += TR_TILE) {
        const int64_t w = n_cols - c0 < TR_TILE ? n_cols - c0 : TR_TILE; /* multiple of the block size */
        const int64_t cb = pi_row_size(src_type, c0);
        for (int64_t r = 0; r < n_rows; r++)
            pi_dequantize_row(src_type, (const char *)src + r * srow + cb, tile + r * TR_TILE, w);
        for (int64_t c = 0; c < w; c++) {
            for (int64_t r = 0; r < n_rows; r++) col[r] = tile[r * TR_TILE + c];
            char *out = (char *)dst + (c0 + c) * drow;
            switch (type_out) {
            case PI_TYPE_F32:
                memcpy(out, col, (size_t)n_rows * sizeof(float));
                break;
            case PI_TYPE_F16:
                for (int64_t r = 0; r < n_rows; r++) ((uint16_t *)out)[r] = pi_fp32_to_fp16(col[r]);
                break;
            case PI_TYPE_Q8_0:
                isa->from_float[PI_TYPE_Q8_0](col, out, n_rows);
                break;
            default:
                quantize_q4_0_row(col, (pi_block_q4_0 *)out, n_rows);
                break;
            }
        }
    }
    free(tile);
    free(col);
    return PI_OK;
}
