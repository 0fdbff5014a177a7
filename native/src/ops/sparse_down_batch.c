/* The sparse FFN's down accumulation for a batch (prefill, perplexity, several sequences):
 * the per-token path (ops/sparse_ffn.c) dequantizes every kept row of down_t once per token;
 * here each dequantized row serves a block of tokens.
 *
 * Masked dense form: the h rows are made dense, a skipped neuron's h +0 (a kept one's h is
 * never 0: h != 0, |h| >= threshold, NaN kept), and every token adds h * w_j for every neuron
 * j in increasing id order, a zero h adding +0 exactly (the kernel masks the product where a
 * weight is not finite: 0 * inf is NaN). acc + (+0) == acc for every acc but -0, and a sum
 * that starts at +0 never becomes -0 in round-to-nearest (x + y is -0 only when both are), so
 * each output element has the bits of the per-token fold over the kept rows,
 * ((0 + h_a*w_a) + h_b*w_b) + ..., and a token's output does not depend on its batch. Hence
 * phase 0 only (phase 2 continues a partial sum that may be -0), and whole 32-blocks (Q8_0,
 * Q4_0; the kernel is pi_isa.down_batch).
 *
 * The cost is one multiply and add per (token, neuron, 8 columns) whatever the density, so
 * the per-token gather stays below MIN_DENSITY. Threads split the columns in units of 32 as
 * the per-token path does; each runs blocks of TOK_BLOCK tokens x PI_DOWN_BATCH_K neurons (y
 * holds the exact partial sum in between, and the order per element stays increasing j). */
#include "pi_internal.h"

#define TOK_BLOCK 64     /* tokens whose h (PI_DOWN_BATCH_K of each) stay in L2 */
#define MIN_DENSITY 0.2  /* kept / (n_tok * n_ff) from which the masked form is faster */

static inline int kept(float h, float thr) { return !(h == 0.0f || fabsf(h) < thr); }

typedef struct {
    const pi_ffn_sparse_args *a;
    pi_down_batch_fn fn;
    int64_t n_embd, n_ff;
    const float *h; /* n_tok rows of n_ff, skipped neurons +0 */
} batch_job;

static void batch_task(void *varg, int ith, int nth) {
    const batch_job *s = varg;
    const pi_ffn_sparse_args *a = s->a;
    int64_t ulo, uhi;
    pi_split(s->n_embd / PI_DOWN_TILE, ith, nth, &ulo, &uhi);
    if (ulo >= uhi) return;
    const int64_t c0 = ulo * PI_DOWN_TILE, nc = (uhi - ulo) * PI_DOWN_TILE, E = s->n_embd, F = s->n_ff;
    const int32_t type = a->down_t->type;
    const int64_t drow = pi_row_size(type, E);
    const char *dd = (const char *)a->down_t->data + pi_row_size(type, c0);
    for (int64_t t = 0; t < a->n_tok; t++) memset(a->y + t * E + c0, 0, (size_t)nc * sizeof(float));
    for (int64_t t0 = 0; t0 < a->n_tok; t0 += TOK_BLOCK) {
        const int64_t nt = a->n_tok - t0 < TOK_BLOCK ? a->n_tok - t0 : TOK_BLOCK;
        for (int64_t k0 = 0; k0 < F; k0 += PI_DOWN_BATCH_K) {
            const int64_t nk = F - k0 < PI_DOWN_BATCH_K ? F - k0 : PI_DOWN_BATCH_K;
            s->fn(type, nc, nt, nk, a->y + t0 * E + c0, E, dd + k0 * drow, drow, s->h + t0 * F + k0, F);
        }
    }
}

/* h (the lists at off[t] .. off[t+1]) -> dense rows in place, skipped neurons +0, and n_used.
 * With active lists the rows are rewritten from the end: the slot t * n_ff + j of a neuron is
 * at or after its list entry (off[t] <= t * n_ff, an entry's rank <= its id), so no entry is
 * overwritten before it is read. */
static void dense_lists(const pi_ffn_sparse_args *a, float *h, const int64_t *off, float thr, int64_t F) {
    const int32_t *ids = a->active + a->active_off[0];
    for (int64_t t = a->n_tok - 1; t >= 0; t--) {
        float *ht = h + t * F;
        int64_t n = 0, k = off[t + 1] - 1;
        for (int64_t j = F - 1; j >= 0; j--) {
            const float v = k >= off[t] && ids[k] == j ? h[k--] : 0.0f;
            const int kp = kept(v, thr);
            ht[j] = kp ? v : 0.0f;
            n += kp;
        }
        if (a->n_used) a->n_used[t] = n;
    }
}

typedef struct {
    const pi_ffn_sparse_args *a;
    float *h;
    float thr;
    int64_t n_ff;
} zero_job;

/* all neurons: the rows are already dense; zero the skipped h, split by token */
static void zero_task(void *varg, int ith, int nth) {
    const zero_job *z = varg;
    int64_t lo, hi;
    pi_split(z->a->n_tok, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *ht = z->h + t * z->n_ff;
        int64_t n = 0;
        for (int64_t j = 0; j < z->n_ff; j++) {
            const int kp = kept(ht[j], z->thr);
            ht[j] = kp ? ht[j] : 0.0f;
            n += kp;
        }
        if (z->a->n_used) z->a->n_used[t] = n;
    }
}

int pi_sparse_down_batch(pi_pool *pool, const pi_ffn_sparse_args *a, const pi_isa *isa, float *h,
                         const int64_t *off, float thr) {
    const int32_t type = a->down_t->type;
    if (a->phase != 0 || a->h_dense != NULL || a->n_tok < 2 || isa->down_batch == NULL ||
        (type != PI_TYPE_Q8_0 && type != PI_TYPE_Q4_0))
        return 0;
    /* the density of every 8th token decides: both forms give the same bits */
    const int64_t F = a->up->n_rows;
    int64_t n = 0, n_all = 0;
    for (int64_t t = 0; t < a->n_tok; t += 8) {
        for (int64_t k = off[t]; k < off[t + 1]; k++) n += kept(h[k], thr);
        n_all += F;
    }
    if ((double)n < MIN_DENSITY * (double)n_all) return 0;
    if (a->active != NULL) {
        dense_lists(a, h, off, thr, F);
    } else {
        zero_job z = {a, h, thr, F};
        pi_pool_run(pool, zero_task, &z);
    }
    batch_job s = {a, isa->down_batch, a->up->n_cols, F, h};
    pi_pool_run(pool, batch_task, &s);
    return 1;
}
