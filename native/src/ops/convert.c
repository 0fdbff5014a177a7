/* Conversions between floats and stored types: the embedding lookup (dequantize
 * one row) and the activation / KV-cache quantization entry point. */
#include "kquants.h"
#include "pi_internal.h"

void pi_dequantize_row(int32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case PI_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case PI_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = pi_fp16_to_fp32(((const uint16_t *)src)[i]);
        break;
    case PI_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = pi_bf16_to_fp32(((const uint16_t *)src)[i]);
        break;
    case PI_TYPE_Q4_0:
        for (int64_t b = 0; b < n / PI_QK; b++) {
            const pi_block_q4_0 *x = (const pi_block_q4_0 *)src + b;
            const float d = pi_fp16_to_fp32(x->d);
            for (int j = 0; j < PI_QK / 2; j++) {
                dst[b * PI_QK + j] = ((x->qs[j] & 0x0F) - 8) * d;
                dst[b * PI_QK + j + PI_QK / 2] = ((x->qs[j] >> 4) - 8) * d;
            }
        }
        break;
    case PI_TYPE_Q4_1:
        for (int64_t b = 0; b < n / PI_QK; b++) {
            const pi_block_q4_1 *x = (const pi_block_q4_1 *)src + b;
            const float d = pi_fp16_to_fp32(x->d), m = pi_fp16_to_fp32(x->m);
            for (int j = 0; j < PI_QK / 2; j++) {
                dst[b * PI_QK + j] = (x->qs[j] & 0x0F) * d + m;
                dst[b * PI_QK + j + PI_QK / 2] = (x->qs[j] >> 4) * d + m;
            }
        }
        break;
    case PI_TYPE_Q8_0:
        for (int64_t b = 0; b < n / PI_QK; b++) {
            const pi_block_q8_0 *x = (const pi_block_q8_0 *)src + b;
            const float d = pi_fp16_to_fp32(x->d);
            for (int j = 0; j < PI_QK; j++) dst[b * PI_QK + j] = x->qs[j] * d;
        }
        break;
    case PI_TYPE_Q5_0:
        for (int64_t b = 0; b < n / PI_QK; b++) {
            const pi_block_q5_0 *x = (const pi_block_q5_0 *)src + b;
            const float d = pi_fp16_to_fp32(x->d);
            int8_t q[PI_QK];
            pi_decode_q5_0(x, q);
            for (int j = 0; j < PI_QK; j++) dst[b * PI_QK + j] = q[j] * d;
        }
        break;
    case PI_TYPE_Q4_K:
    case PI_TYPE_Q5_K:
        for (int64_t b = 0; b < n / PI_QK_K; b++) {
            /* Q4_K and Q5_K share the head (d, dmin, scales); only the quants differ */
            const pi_block_q4_K *x4 = (const pi_block_q4_K *)src + b;
            const pi_block_q5_K *x5 = (const pi_block_q5_K *)src + b;
            const uint16_t *hd = type == PI_TYPE_Q4_K ? &x4->d : &x5->d;
            const uint8_t *scales = type == PI_TYPE_Q4_K ? x4->scales : x5->scales;
            const float d = pi_fp16_to_fp32(hd[0]), dmin = pi_fp16_to_fp32(hd[1]);
            uint8_t q[PI_QK_K], sc[8], mn[8];
            if (type == PI_TYPE_Q4_K)
                pi_decode_q4_K(x4, q);
            else
                pi_decode_q5_K(x5, q);
            pi_decode_k4_scales(scales, sc, mn);
            for (int s = 0; s < 8; s++) {
                const float ds = d * sc[s], ms = dmin * mn[s];
                for (int j = 0; j < 32; j++) dst[b * PI_QK_K + 32 * s + j] = ds * q[32 * s + j] - ms;
            }
        }
        break;
    case PI_TYPE_Q6_K:
        for (int64_t b = 0; b < n / PI_QK_K; b++) {
            const pi_block_q6_K *x = (const pi_block_q6_K *)src + b;
            const float d = pi_fp16_to_fp32(x->d);
            int8_t q[PI_QK_K];
            pi_decode_q6_K(x, q);
            for (int e = 0; e < PI_QK_K; e++) dst[b * PI_QK_K + e] = d * x->scales[e / 16] * q[e];
        }
        break;
    default:
        break; /* types are validated when the model is created */
    }
}

/* round to nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves the
 * rounded integer in the low mantissa bits (the form llama.cpp's Q8_K quantizer
 * uses, so activation bytes match it) */
static inline int32_t nearest_even(float v) {
    const float t = v + 12582912.0f;
    uint32_t u;
    memcpy(&u, &t, 4);
    return (int32_t)(u & 0x007FFFFF) - 0x00400000;
}

/* Q8_K, per super-block of 256: the element of largest magnitude, vmax, maps to
 * -127 (iscale = -127 / vmax, d = 1 / iscale: llama.cpp's sign convention, which
 * its kernels and ours share), q = round-half-even(x * iscale), and bsums holds the
 * sums of each 16 quants (the Q4_K / Q5_K min terms use them). The scalar path's; the
 * x86 paths run a twin with the same bytes (from_float_q8_K in isa/x86_256.h). */
void pi_quantize_row_q8_K(const float *x, void *vy, int64_t n) {
    pi_block_q8_K *y = vy;
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        float amax = 0.0f, vmax = 0.0f;
        for (int j = 0; j < PI_QK_K; j++) {
            const float a = fabsf(x[j]);
            if (a > amax) {
                amax = a;
                vmax = x[j];
            }
        }
        memset(y[b].bsums, 0, sizeof y[b].bsums);
        if (amax == 0.0f) {
            y[b].d = 0.0f;
            memset(y[b].qs, 0, sizeof y[b].qs);
            continue;
        }
        const float iscale = -127.0f / vmax;
        for (int j = 0; j < PI_QK_K; j++) {
            const int32_t v = nearest_even(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int j = 0; j < PI_QK_K; j++) y[b].bsums[j / 16] = (int16_t)(y[b].bsums[j / 16] + y[b].qs[j]);
        y[b].d = 1.0f / iscale;
    }
}

int pi_op_quantize(int32_t type, const float *x, int64_t n, void *y) {
    const pi_type_traits *t = pi_type_get(type);
    if (x == NULL || y == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_quantize: NULL argument");
    if (t == NULL || t->vec_dot_type != type || type == PI_TYPE_Q4_0)
        return pi_set_error(PI_ERR_UNSUPPORTED, "pi_op_quantize: type %d is not an activation type", type);
    if (n < 0 || n % t->block_size != 0)
        return pi_set_error(PI_ERR_INVALID, "pi_op_quantize: n %lld is not a multiple of %lld",
                            (long long)n, (long long)t->block_size);
    pi_isa_current()->from_float[type](x, y, n);
    return PI_OK;
}

int pi_op_dequantize(int32_t type, const void *x, int64_t n, float *y) {
    const pi_type_traits *t = pi_type_get(type);
    if (x == NULL || y == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_dequantize: NULL argument");
    if (t == NULL || !pi_type_is_weight(type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "pi_op_dequantize: type %d is not a weight type", type);
    if (n < 0 || n % t->block_size != 0)
        return pi_set_error(PI_ERR_INVALID, "pi_op_dequantize: n %lld is not a multiple of %lld",
                            (long long)n, (long long)t->block_size);
    pi_dequantize_row(type, x, y, n);
    return PI_OK;
}
