/* Activation predictors (Deja Vu, ICML'23; PowerInfer, SOSP'24): per FFN layer a
 * bias-free low-rank MLP scores every neuron from the FFN input x,
 *
 *     score = fc2 . relu(fc1 . x)        fc1: rank rows of n_embd, fc2: n_ff rows of rank
 *
 * and neuron j is predicted active when score_j >= threshold. The active ids (in
 * increasing order, CSR per token) then drive the sparse FFN operator, so gate, up
 * and down are read only for predicted neurons.
 *
 * Both products are pi_matmul_multi calls: the input row is converted once to the
 * weight type's activation type and each output element is one vec_dot of a row,
 * so every score has the same bits for any thread count (threads split rows, never
 * a sum). Any weight type the dense matmul supports works (F32, F16, BF16, Q4_0,
 * Q4_1, Q8_0); for quantized fc2, rank must be a multiple of 32. */
#define _POSIX_C_SOURCE 199309L
#include <stdlib.h>
#include <time.h>

#include "pi_internal.h"

int64_t pi_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t pi_predictor_scratch_size(const pi_mat *fc1, const pi_mat *fc2, int64_t n_tok) {
    const int64_t a = pi_matmul_scratch_size(fc1->type, fc1->n_cols, n_tok);
    const int64_t b = pi_matmul_scratch_size(fc2->type, fc2->n_cols, n_tok);
    return (a > b ? a : b) + n_tok * fc1->n_rows * (int64_t)sizeof(float) + 64;
}

void pi_predictor_scores(pi_pool *pool, const pi_mat *fc1, const pi_mat *fc2, const float *x, int64_t n_tok,
                         float *scores, void *scratch) {
    const int64_t rank = fc1->n_rows;
    const int64_t a = pi_matmul_scratch_size(fc1->type, fc1->n_cols, n_tok);
    const int64_t b = pi_matmul_scratch_size(fc2->type, fc2->n_cols, n_tok);
    const int64_t mm = ((a > b ? a : b) + 63) / 64 * 64;
    float *z = (float *)((char *)scratch + mm);
    const pi_matmul_out o1 = {fc1, z, rank};
    pi_matmul_multi(pool, &o1, 1, x, n_tok, scratch);
    for (int64_t i = 0; i < n_tok * rank; i++) z[i] = z[i] > 0.0f ? z[i] : 0.0f;
    const pi_matmul_out o2 = {fc2, scores, fc2->n_rows};
    pi_matmul_multi(pool, &o2, 1, z, n_tok, scratch);
}

int64_t pi_predictor_select(const float *scores, int64_t n_tok, int64_t n_ff, float threshold, const int32_t *among,
                            int64_t n_among, int32_t *active, int64_t *active_off) {
    int64_t m = 0, all = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        active_off[t] = m;
        const float *s = scores + t * n_ff;
        if (among == NULL) {
            for (int64_t j = 0; j < n_ff; j++)
                if (s[j] >= threshold) active[m++] = (int32_t)j;
            continue;
        }
        for (int64_t i = 0; i < n_among; i++)
            if (s[among[i]] >= threshold) active[m++] = among[i];
        for (int64_t j = 0; j < n_ff; j++) all += s[j] >= threshold;
    }
    active_off[n_tok] = m;
    return among == NULL ? m : all;
}

static int pred_type_ok(int32_t t) {
    const pi_type_traits *tr = pi_type_get(t);
    return tr != NULL && t != PI_TYPE_Q8_1;
}

int pi_op_predictor_scores(pi_pool *pool, int32_t fc1_type, const void *fc1, int32_t fc2_type, const void *fc2,
                           int64_t n_embd, int64_t rank, int64_t n_ff, const float *x, int64_t n_tok,
                           float *scores) {
    static const char *fn = "pi_op_predictor_scores";
    if (pool == NULL || fc1 == NULL || fc2 == NULL || x == NULL || scores == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    if (!pred_type_ok(fc1_type) || !pred_type_ok(fc2_type))
        return pi_set_error(PI_ERR_INVALID, "%s: unknown or unsupported type (fc1 %d, fc2 %d)", fn, fc1_type,
                            fc2_type);
    if (n_embd < 1 || rank < 1 || n_ff < 1 || n_tok < 1)
        return pi_set_error(PI_ERR_INVALID, "%s: sizes must be positive", fn);
    if (pi_row_size(fc1_type, n_embd) < 0 || pi_row_size(fc2_type, rank) < 0 ||
        n_embd % pi_type_get(fc1_type)->block_size || rank % pi_type_get(fc2_type)->block_size)
        return pi_set_error(PI_ERR_INVALID, "%s: n_embd %lld / rank %lld not a multiple of the block size", fn,
                            (long long)n_embd, (long long)rank);
    const pi_mat m1 = {fc1, fc1_type, n_embd, rank}, m2 = {fc2, fc2_type, rank, n_ff};
    void *scratch = malloc((size_t)pi_predictor_scratch_size(&m1, &m2, n_tok));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    pi_predictor_scores(pool, &m1, &m2, x, n_tok, scores, scratch);
    free(scratch);
    return PI_OK;
}
