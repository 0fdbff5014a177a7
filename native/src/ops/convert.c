/* Conversions between floats and stored types: the embedding lookup (dequantize
 * one row) and the activation / KV-cache quantization entry point. */
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
    default:
        break; /* types are validated when the model is created */
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
