/* Causal grouped-query attention over the KV cache (Vaswani et al. 2017; GQA,
 * Ainslie et al. 2023). Work is split over (token, head) pairs. The products use
 * the ISA's F16/F32 dot kernels: K rows against q, and V's transposed rows
 * against the softmax weights, so an F16 cache rounds exactly where llama.cpp's
 * non-flash path does. */
#include <stdlib.h>

#include "pi_internal.h"

static int64_t pad_kv(int64_t n) { return (n + PI_KV_PAD - 1) / PI_KV_PAD * PI_KV_PAD; }


int64_t pi_attention_scratch_floats(int64_t n_kv, int32_t head_dim) {
    /* scores (f32) + weights (f16 or f32) + their floats + q + its floats */
    return pad_kv(n_kv) * 3 + 2 * (int64_t)head_dim + 16;
}

typedef struct {
    const float *q;
    int64_t n_tok;
    int32_t n_head, n_head_kv, head_dim;
    const void *k, *v;
    int64_t v_ld;
    int32_t kv_type;
    int64_t n_kv;
    const int32_t *pos;
    const int32_t *cell0; /* per token: first cell of its sequence's slot; NULL = 0 */
    float *out;
    float *scratch;
    const pi_isa *isa;
    float scale;
    int32_t n_swa;
} attn_job;

static void attn_task(void *varg, int ith, int nth) {
    const attn_job *j = varg;
    const int32_t hd = j->head_dim;
    const int64_t esz = j->kv_type == PI_TYPE_F16 ? 2 : 4;
    const int64_t kv_row = (int64_t)j->n_head_kv * hd;
    const int group = j->n_head / j->n_head_kv;
    /* F16: the q and weight vectors rounded to F16 (as llama.cpp's), then held as floats,
     * each converted once instead of once per K row / V row (the same products) */
    const int f16 = j->kv_type == PI_TYPE_F16;
    const pi_vec_dot_fn dot = f16 ? j->isa->dot_f16_f32 : j->isa->vec_dot[j->kv_type];
    const pi_from_float_fn cvt = j->isa->from_float[j->kv_type];
    const float scale = j->scale;
    float *scores = j->scratch + pi_pool_worker() * pi_attention_scratch_floats(j->n_kv, hd);
    void *weights = scores + pad_kv(j->n_kv);
    float *wf = scores + 2 * pad_kv(j->n_kv);
    void *qc = wf + pad_kv(j->n_kv);
    float *qf = (float *)qc + hd;
    int64_t lo, hi;
    pi_split(j->n_tok * j->n_head, ith, nth, &lo, &hi);
    for (int64_t u = lo; u < hi; u++) {
        const int64_t t = u / j->n_head;
        const int h = (int)(u % j->n_head), g = h / group;
        const int64_t n = (int64_t)j->pos[t] + 1, c0 = j->cell0 != NULL ? j->cell0[t] : 0;
        cvt(j->q + (t * j->n_head + h) * hd, qc, hd);
        if (f16) j->isa->f16_floats(qc, qf, hd);
        const void *qx = f16 ? (const void *)qf : qc;
        const char *kb = (const char *)j->k + (c0 * kv_row + g * hd) * esz;
        /* sliding window: keys before lo are masked like future ones (weight 0, still
         * in the sums, as in llama.cpp's masked softmax) */
        const int64_t lo = j->n_swa > 0 && n > j->n_swa ? n - j->n_swa : 0;
        for (int64_t p = 0; p < lo; p++) scores[p] = -INFINITY;
        for (int64_t p = lo; p < n; p++) {
            float s;
            dot(hd, &s, kb + p * kv_row * esz, qx);
            scores[p] = s * scale;
        }
        /* Softmax and V products run over whole PI_KV_PAD blocks, masked cells
         * getting weight 0, so sums group as in llama.cpp's padded KV view. */
        const int64_t np = c0 + pad_kv(n) <= j->v_ld ? pad_kv(n) : n;
        for (int64_t p = n; p < np; p++) scores[p] = -INFINITY;
        j->isa->softmax(scores, np);
        cvt(scores, weights, np);
        if (f16) j->isa->f16_floats(weights, wf, np);
        const void *wx = f16 ? (const void *)wf : weights;
        float *o = j->out + (t * j->n_head + h) * hd;
        const char *vb = (const char *)j->v + ((int64_t)g * hd * j->v_ld + c0) * esz;
        for (int d = 0; d < hd; d++) dot(np, &o[d], vb + d * j->v_ld * esz, wx);
    }
}

void pi_attention(pi_pool *pool, const float *q, int64_t n_tok, int32_t n_head, int32_t n_head_kv,
                  int32_t head_dim, const void *k, const void *v, int64_t v_ld, int32_t kv_type,
                  int64_t n_kv, const int32_t *pos, const int32_t *cell0, float scale, int32_t n_swa, float *out,
                  float *scratch) {
    attn_job j = {q, n_tok, n_head, n_head_kv, head_dim, k, v, v_ld, kv_type, n_kv, pos, cell0, out, scratch,
                  pi_isa_current(), scale, n_swa};
    pi_pool_run(pool, attn_task, &j);
}

int pi_op_attention(pi_pool *pool, const float *q, int64_t n_tok, int32_t n_head,
                    int32_t n_head_kv, int32_t head_dim, const void *k, const void *v,
                    int64_t v_ld, int32_t kv_type, int64_t n_kv, const int32_t *pos, float *out) {
    if (pool == NULL || q == NULL || k == NULL || v == NULL || pos == NULL || out == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_op_attention: NULL argument");
    if (kv_type != PI_TYPE_F16 && kv_type != PI_TYPE_F32)
        return pi_set_error(PI_ERR_UNSUPPORTED, "pi_op_attention: KV type must be F16 or F32");
    if (n_tok < 1 || n_head < 1 || n_head_kv < 1 || n_head % n_head_kv || head_dim < 1 || n_kv < 1 ||
        v_ld < n_kv)
        return pi_set_error(PI_ERR_INVALID, "pi_op_attention: bad sizes");
    for (int64_t t = 0; t < n_tok; t++)
        if (pos[t] < 0 || pos[t] >= n_kv)
            return pi_set_error(PI_ERR_INVALID, "pi_op_attention: pos[%lld] = %d outside [0, %lld)",
                                (long long)t, pos[t], (long long)n_kv);
    const int64_t per = pi_attention_scratch_floats(n_kv, head_dim);
    float *scratch = malloc((size_t)(per * pi_pool_size(pool)) * sizeof(float));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_op_attention: out of memory");
    pi_attention(pool, q, n_tok, n_head, n_head_kv, head_dim, k, v, v_ld, kv_type, n_kv, pos, NULL,
                 1.0f / sqrtf((float)head_dim), 0, out, scratch);
    free(scratch);
    return PI_OK;
}
