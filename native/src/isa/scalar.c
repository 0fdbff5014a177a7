/* Portable scalar kernels (plain C, no intrinsics).
 *
 * This is the reference path: the SIMD files must agree with it (bit for bit for
 * the activation quantizers, within float rounding for the dot products).
 *
 * Dot products of quantized rows work per block of 32: the integer sum of the
 * quant products is exact, then it is scaled by d_w * d_x in float. Q4_1 adds
 * m_w * s_x per block, where s_x = d_x * sum(q_x) was stored by the Q8_1 quantizer.
 * Float rows use 8 independent partial sums (better rounding than one running sum,
 * and the compiler can keep them in vector registers without reassociation).
 */
#include "pi_internal.h"

#define NACC 8

static float sum_partials(const float acc[NACC]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* ---- float rows ---------------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *vx) {
    const float *w = vw, *x = vx;
    float acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += w[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += w[i] * x[i];
    *s = sum_partials(acc);
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
    float acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += pi_fp16_to_fp32(w[i + j]) * pi_fp16_to_fp32(x[i + j]);
    for (int j = 0; i < n; i++, j++) acc[j] += pi_fp16_to_fp32(w[i]) * pi_fp16_to_fp32(x[i]);
    *s = sum_partials(acc);
}

static void vec_dot_bf16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
    float acc[NACC] = {0};
    int64_t i = 0;
    for (; i + NACC <= n; i += NACC)
        for (int j = 0; j < NACC; j++) acc[j] += pi_bf16_to_fp32(w[i + j]) * pi_bf16_to_fp32(x[i + j]);
    for (int j = 0; i < n; i++, j++) acc[j] += pi_bf16_to_fp32(w[i]) * pi_bf16_to_fp32(x[i]);
    *s = sum_partials(acc);
}

/* ---- quantized rows ------------------------------------------------------------ */

/* Q4_0 weights x Q8_0 activations: w = d * (nibble - 8) */
static void vec_dot_q4_0(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q4_0 *w = vw;
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < PI_QK / 2; j++) {
            const int32_t lo = (int32_t)(w[i].qs[j] & 0x0F) - 8;
            const int32_t hi = (int32_t)(w[i].qs[j] >> 4) - 8;
            sumi += lo * x[i].qs[j] + hi * x[i].qs[j + PI_QK / 2];
        }
        sum += (float)sumi * (pi_fp16_to_fp32(w[i].d) * pi_fp16_to_fp32(x[i].d));
    }
    *s = sum;
}

/* Q4_1 weights x Q8_1 activations: w = d * nibble + m */
static void vec_dot_q4_1(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q4_1 *w = vw;
    const pi_block_q8_1 *x = vx;
    const int64_t nb = n / PI_QK;
    float sum = 0.0f, summ = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < PI_QK / 2; j++) {
            sumi += (int32_t)(w[i].qs[j] & 0x0F) * x[i].qs[j];
            sumi += (int32_t)(w[i].qs[j] >> 4) * x[i].qs[j + PI_QK / 2];
        }
        sum += (float)sumi * (pi_fp16_to_fp32(w[i].d) * pi_fp16_to_fp32(x[i].d));
        summ += pi_fp16_to_fp32(w[i].m) * pi_fp16_to_fp32(x[i].s);
    }
    *s = sum + summ;
}

/* Q8_0 weights x Q8_0 activations */
static void vec_dot_q8_0(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q8_0 *w = vw;
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; i++) {
        int32_t sumi = 0;
        for (int j = 0; j < PI_QK; j++) sumi += (int32_t)w[i].qs[j] * x[i].qs[j];
        sum += (float)sumi * (pi_fp16_to_fp32(w[i].d) * pi_fp16_to_fp32(x[i].d));
    }
    *s = sum;
}

/* ---- activation conversion ----------------------------------------------------- */

/* roundf for |v| <= 127 without a libm call: half away from zero. Non-finite
 * input (NaN or inf in x) gives 0 rather than an undefined conversion. */
static inline float round_half_away(float v) {
    if (!(v >= -128.0f && v <= 128.0f)) return 0.0f;
    const float t = (float)(int32_t)v;   /* truncation toward zero */
    const float f = v - t;                /* exact, |f| < 1 */
    return t + (float)(int32_t)(f + f);   /* +-1 exactly when |f| >= 0.5 */
}

/* One block of 32: d = amax / 127, q = round(x / d); returns sum(q). */
static int32_t quantize_block_q8(const float *x, int8_t *q, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < PI_QK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < PI_QK; j++) {
        const int32_t v = (int32_t)round_half_away(x[j] * id);
        q[j] = (int8_t)v;
        sum += v;
    }
    *d_out = d;
    return sum;
}

static void from_float_q8_0(const float *x, void *vy, int64_t n) {
    pi_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        float d;
        quantize_block_q8(x + i * PI_QK, y[i].qs, &d);
        y[i].d = pi_fp32_to_fp16(d);
    }
}

static void from_float_q8_1(const float *x, void *vy, int64_t n) {
    pi_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        float d;
        const int32_t sum = quantize_block_q8(x + i * PI_QK, y[i].qs, &d);
        y[i].d = pi_fp32_to_fp16(d);
        y[i].s = pi_fp32_to_fp16((float)sum * d);
    }
}

static void from_float_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = pi_fp32_to_fp16(x[i]);
}

static void from_float_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++) y[i] = pi_fp32_to_bf16(x[i]);
}

static void from_float_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

const pi_isa pi_isa_scalar = {
    .name = "scalar",
    .vec_dot =
        {
            [PI_TYPE_F32] = vec_dot_f32,
            [PI_TYPE_F16] = vec_dot_f16,
            [PI_TYPE_BF16] = vec_dot_bf16,
            [PI_TYPE_Q4_0] = vec_dot_q4_0,
            [PI_TYPE_Q4_1] = vec_dot_q4_1,
            [PI_TYPE_Q8_0] = vec_dot_q8_0,
        },
    .from_float =
        {
            [PI_TYPE_F32] = from_float_f32,
            [PI_TYPE_F16] = from_float_f16,
            [PI_TYPE_BF16] = from_float_bf16,
            [PI_TYPE_Q8_0] = from_float_q8_0,
            [PI_TYPE_Q8_1] = from_float_q8_1,
        },
};
