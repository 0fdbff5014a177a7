/* Rotary position embedding (Su et al. 2021, RoFormer). NORM rotates adjacent
 * pairs (x[2i], x[2i+1]) - the layout of llama GGUFs, whose Q/K rows the converter
 * permuted; NEOX rotates (x[i], x[i + n_rot/2]). theta_i = pos * freq_scale *
 * base^(-2i/n_rot) / freq_factors[i], computed by repeated multiplication as ggml
 * does so angles round the same way. */
#include <stdlib.h>

#include "pi_internal.h"

void pi_rope_cache(int64_t n_tok, int32_t n_rot, const int32_t *pos, float freq_base, float freq_scale,
                   const float *freq_factors, float *cs) {
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    const int half = n_rot / 2;
    for (int64_t t = 0; t < n_tok; t++, cs += n_rot) {
        float theta = (float)pos[t];
        for (int i = 0; i < half; i++) {
            const float ff = freq_factors != NULL ? freq_factors[i] : 1.0f;
            const float th = freq_scale * (theta / ff);
            cs[2 * i] = cosf(th);
            cs[2 * i + 1] = sinf(th);
            theta *= theta_scale;
        }
    }
}

void pi_rope_apply(float *x, int64_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot, const float *cs,
                   int32_t rope_type) {
    const int half = n_rot / 2;
    for (int64_t t = 0; t < n_tok; t++, cs += n_rot) {
        for (int h = 0; h < n_head; h++) {
            float *v = x + (t * n_head + h) * head_dim;
            for (int i = 0; i < half; i++) {
                const int a = rope_type == PI_ROPE_NEOX ? i : 2 * i;
                const int b = rope_type == PI_ROPE_NEOX ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                /* first product fused, second rounded: the rounding llama.cpp's CPU
                 * build gets from FMA contraction, so rotated values match bit for bit */
                v[a] = fmaf(x0, cs[2 * i], -(x1 * cs[2 * i + 1]));
                v[b] = fmaf(x0, cs[2 * i + 1], x1 * cs[2 * i]);
            }
        }
    }
}

int pi_op_rope(float *x, int64_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
               const int32_t *pos, float freq_base, float freq_scale, const float *freq_factors,
               int32_t rope_type) {
    if (x == NULL || pos == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_rope: NULL argument");
    if (n_tok < 0 || n_head < 1 || head_dim < 2 || n_rot < 2 || n_rot > head_dim || n_rot % 2 ||
        n_rot > 1024)
        return pi_set_error(PI_ERR_INVALID, "pi_op_rope: bad sizes (head_dim %d, n_rot %d)", head_dim, n_rot);
    if (rope_type != PI_ROPE_NORM && rope_type != PI_ROPE_NEOX)
        return pi_set_error(PI_ERR_INVALID, "pi_op_rope: unknown rope type %d", rope_type);
    if (!(freq_base > 0.0f)) return pi_set_error(PI_ERR_INVALID, "pi_op_rope: freq_base must be > 0");
    float *cs = malloc((size_t)(n_tok > 0 ? n_tok : 1) * (size_t)n_rot * sizeof(float));
    if (cs == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_op_rope: out of memory");
    pi_rope_cache(n_tok, n_rot, pos, freq_base, freq_scale, freq_factors, cs);
    pi_rope_apply(x, n_tok, n_head, head_dim, n_rot, cs, rope_type);
    free(cs);
    return PI_OK;
}
