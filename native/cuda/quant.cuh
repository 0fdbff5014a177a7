/* GGUF block layouts and the per-type device arithmetic of the hot-row kernels:
 * a warp's dot product of one stored row with the converted x, and one element of a
 * down_t row. The layouts are those of native/src/pi_internal.h (packed, F16 scales
 * stored as uint16). Rows are compact on the device, so a row starts at r * row_bytes:
 * blocks are only 2-byte aligned (18 / 34 bytes), hence 16-bit loads. */
#ifndef PI_CUDA_QUANT_CUH
#define PI_CUDA_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

#define QK 32

struct blk_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };           /* 18 bytes */
struct blk_q4_1 { uint16_t d; uint16_t m; uint8_t qs[QK / 2]; }; /* 20 bytes */
struct blk_q8_0 { uint16_t d; int8_t qs[QK]; };                  /* 34 bytes */
static_assert(sizeof(blk_q4_0) == 18 && sizeof(blk_q4_1) == 20 && sizeof(blk_q8_0) == 34, "GGUF block sizes");

__device__ __forceinline__ float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* 4 bytes at a 2-byte aligned address, as one little-endian word */
__device__ __forceinline__ uint32_t load_u32_a2(const uint8_t *p) {
    const uint16_t *q = (const uint16_t *)p;
    return (uint32_t)q[0] | ((uint32_t)q[1] << 16);
}

/* byte-wise a*b summed with c; __dp4a where the hardware has it (sm_61+) */
__device__ __forceinline__ int dp4a(int a, int b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
    return __dp4a(a, b, c);
#else
    const int8_t *x = (const int8_t *)&a, *y = (const int8_t *)&b;
    return c + x[0] * y[0] + x[1] * y[1] + x[2] * y[2] + x[3] * y[3];
#endif
}

/* The same total in every lane; a fixed butterfly, so the sum's order never varies */
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* dot(row, x of token t) for one warp: lane l takes blocks l, l + 32, ... (quantized)
 * or elements l, l + 32, ... (F16/F32); every lane returns the total. The integer sum
 * of a block is exact; scales multiply as the CPU's (d_w * d_x), so this differs from
 * the CPU's dot only in the order the float block terms are added. */
__device__ __forceinline__ float row_dot(int32_t type, const char *row, const pi_cuda_xq &xq, int64_t t,
                                         int64_t n_embd, int lane) {
    float acc = 0.0f;
    const int64_t nb = n_embd / QK;
    switch (type) {
    case T_Q4_0:
    case T_Q4_1: {
        const int is41 = type == T_Q4_1;
        const int64_t bs = is41 ? 20 : 18;
        const int8_t *xq_t = xq.qs + t * n_embd;
        for (int64_t b = lane; b < nb; b += 32) {
            const uint8_t *blk = (const uint8_t *)row + b * bs;
            const uint8_t *qs = blk + (is41 ? 4 : 2);
            const int *xv = (const int *)(xq_t + b * QK); /* 32-byte aligned: n_embd % 32 == 0 */
            int sumi = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) { /* elements 4k..4k+3 (low nibbles) and 16+4k.. (high) */
                const uint32_t v = load_u32_a2(qs + 4 * k);
                int lo = (int)(v & 0x0F0F0F0Fu), hi = (int)((v >> 4) & 0x0F0F0F0Fu);
                if (!is41) {
                    lo = __vsubss4(lo, 0x08080808);
                    hi = __vsubss4(hi, 0x08080808);
                }
                sumi = dp4a(lo, xv[k], sumi);
                sumi = dp4a(hi, xv[4 + k], sumi);
            }
            const float dw = h2f(((const uint16_t *)blk)[0]);
            const float dx = xq.d[t * nb + b];
            acc += (float)sumi * (dw * dx);
            if (is41) acc += h2f(((const uint16_t *)blk)[1]) * xq.s[t * nb + b];
        }
        break;
    }
    case T_Q8_0: {
        const int8_t *xq_t = xq.qs + t * n_embd;
        for (int64_t b = lane; b < nb; b += 32) {
            const uint8_t *blk = (const uint8_t *)row + b * 34;
            const int *xv = (const int *)(xq_t + b * QK);
            int sumi = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) sumi = dp4a((int)load_u32_a2(blk + 2 + 4 * k), xv[k], sumi);
            acc += (float)sumi * (h2f(((const uint16_t *)blk)[0]) * xq.d[t * nb + b]);
        }
        break;
    }
    case T_F16: {
        const uint16_t *w = (const uint16_t *)row, *x = xq.xh + t * n_embd;
        for (int64_t i = lane; i < n_embd; i += 32) acc += h2f(w[i]) * h2f(x[i]);
        break;
    }
    default: { /* T_F32 */
        const float *w = (const float *)row, *x = xq.xf + t * n_embd;
        for (int64_t i = lane; i < n_embd; i += 32) acc += w[i] * x[i];
        break;
    }
    }
    return warp_sum(acc);
}

/* Element c of a down_t row, exact in float (as the CPU's dequant_tile) */
__device__ __forceinline__ float down_elem(int32_t type, const char *row, int64_t c) {
    switch (type) {
    case T_F32:
        return ((const float *)row)[c];
    case T_F16:
        return h2f(((const uint16_t *)row)[c]);
    case T_Q8_0: {
        const blk_q8_0 *b = (const blk_q8_0 *)row + c / QK;
        return (float)b->qs[c % QK] * h2f(b->d);
    }
    default: { /* T_Q4_0: element i < 16 in the low nibble of qs[i], i >= 16 in the high nibble of qs[i - 16] */
        const blk_q4_0 *b = (const blk_q4_0 *)row + c / QK;
        const int i = (int)(c % QK);
        const int q = i < QK / 2 ? (b->qs[i] & 0x0F) : (b->qs[i - QK / 2] >> 4);
        return (float)(q - 8) * h2f(b->d);
    }
    }
}

#endif
