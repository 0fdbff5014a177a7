/* Per-neuron histograms of FFN activation magnitudes |h| (h = act(gate x) * up x),
 * the statistics threshold calibration works from (docs/sparsity.md): the FFN
 * observer (pi_ffn_obs) that pi_context_set_ffn_hist registers on a context.
 *
 * Bins are read straight off the float's bits: exponent plus the top two mantissa
 * bits gives four bins per octave (linear within it), no log() per value. Bin 0 holds |h|
 * below 2^PI_FFN_HIST_MIN_EXP (zeros included), the last bin everything above the
 * range. Each thread owns a range of neurons, so counts need no atomics and the
 * result does not depend on the thread count. */
#include "pi_internal.h"

typedef struct {
    uint32_t *hist; /* n_ff rows of PI_FFN_HIST_BINS */
    const float *v; /* n_tok rows of n_ff */
    int64_t n_tok, n_ff;
    int32_t act; /* >= 0: bin pi_act1(act, v) */
} hist_job;

static inline int hist_bin(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    const int32_t first = (127 + PI_FFN_HIST_MIN_EXP) << 2; /* bits >> 21 of 2^MIN_EXP */
    const int32_t k = (int32_t)((b & 0x7fffffffu) >> 21) - first + 1;
    return k < 0 ? 0 : (k >= PI_FFN_HIST_BINS ? PI_FFN_HIST_BINS - 1 : k);
}

static void hist_task(void *arg, int ith, int nth) {
    const hist_job *j = arg;
    const int64_t lo = j->n_ff * ith / nth, hi = j->n_ff * (ith + 1) / nth;
    for (int64_t t = 0; t < j->n_tok; t++) {
        const float *row = j->v + t * j->n_ff;
        if (j->act >= 0)
            for (int64_t i = lo; i < hi; i++) j->hist[i * PI_FFN_HIST_BINS + hist_bin(pi_act1(j->act, row[i]))]++;
        else
            for (int64_t i = lo; i < hi; i++) j->hist[i * PI_FFN_HIST_BINS + hist_bin(row[i])]++;
    }
}

/* Add n_tok rows of n_ff values v to the per-neuron histograms of |v|, or of
 * |pi_act1(act, v)| when act >= 0 */
static void hist_add(pi_pool *pool, uint32_t *hist, const float *v, int64_t n_tok, int64_t n_ff, int32_t act) {
    hist_job j = {hist, v, n_tok, n_ff, act};
    if (pool == NULL || n_tok * n_ff < 65536)
        hist_task(&j, 0, 1);
    else
        pi_pool_run(pool, hist_task, &j);
}

void pi_ffn_hist_observe(void *user, const pi_ffn_obs *o) {
    const pi_ffn_hists *hs = user;
    uint32_t *product = hs->product, *gate = hs->gate;
    if (hs->follow != NULL) { /* what the threshold compares: the gate activation, or the product h */
        if (o->on_gate)
            gate = hs->follow;
        else
            product = hs->follow;
    }
    const size_t at = (size_t)o->layer * o->n_ff * PI_FFN_HIST_BINS;
    if (gate != NULL) hist_add(o->pool, gate + at, o->pre, o->n_tok, o->n_ff, o->act);
    if (product != NULL) hist_add(o->pool, product + at, o->h, o->n_tok, o->n_ff, -1);
}
