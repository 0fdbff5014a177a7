/* Decoding of the Q5_0 and K-quant blocks into plain integers, shared by the
 * dequantizer (ops/convert.c) and the portable dot products (isa/scalar.c), so
 * both read the bit layouts in one place. The SIMD kernels unpack the same
 * layouts in registers (isa/x86_256.h). */
#ifndef PI_KQUANTS_H
#define PI_KQUANTS_H

#include "pi_internal.h"

/* Q5_0: q[j] = 5-bit value - 16, in [-16, 15] */
static inline void pi_decode_q5_0(const pi_block_q5_0 *b, int8_t q[PI_QK]) {
    const uint32_t qh = (uint32_t)b->qh[0] | (uint32_t)b->qh[1] << 8 | (uint32_t)b->qh[2] << 16 |
                        (uint32_t)b->qh[3] << 24;
    for (int j = 0; j < PI_QK / 2; j++) {
        q[j] = (int8_t)(((b->qs[j] & 0x0F) | ((qh >> j) & 1) << 4) - 16);
        q[j + PI_QK / 2] = (int8_t)(((b->qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

/* Q4_K / Q5_K: the 8 sub-block scales and mins */
static inline void pi_decode_k4_scales(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8]) {
    for (int j = 0; j < 8; j++) pi_k4_scale_min(scales, j, &sc[j], &mn[j]);
}

/* Q4_K: q[e] in [0, 15] for the 256 elements in order */
static inline void pi_decode_q4_K(const pi_block_q4_K *b, uint8_t q[PI_QK_K]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = b->qs[32 * g + l] & 0x0F;
            q[64 * g + 32 + l] = b->qs[32 * g + l] >> 4;
        }
}

/* Q5_K: q[e] in [0, 31]; the fifth bit of element 64g + l is bit 2g of qh[l], of
 * element 64g + 32 + l bit 2g + 1 */
static inline void pi_decode_q5_K(const pi_block_q5_K *b, uint8_t q[PI_QK_K]) {
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) {
            q[64 * g + l] = (uint8_t)((b->qs[32 * g + l] & 0x0F) | ((b->qh[l] >> (2 * g)) & 1) << 4);
            q[64 * g + 32 + l] = (uint8_t)((b->qs[32 * g + l] >> 4) | ((b->qh[l] >> (2 * g + 1)) & 1) << 4);
        }
}

/* Q6_K: q[e] = 6-bit value - 32, in [-32, 31]. Each half of 128 elements takes 64
 * bytes of ql (low 4 bits: bytes 0-31 low nibbles -> elements 0-31, bytes 32-63
 * low nibbles -> 32-63, then the high nibbles -> 64-95 and 96-127) and 32 bytes of
 * qh (2 bits each, bit pairs 0, 2, 4, 6 for the four 32-element quarters).
 * Element e of a super-block has scale scales[e / 16]. */
static inline void pi_decode_q6_K(const pi_block_q6_K *b, int8_t q[PI_QK_K]) {
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b->ql + 64 * n, *qh = b->qh + 32 * n;
        int8_t *o = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            o[l] = (int8_t)(((ql[l] & 0x0F) | (qh[l] & 3) << 4) - 32);
            o[l + 32] = (int8_t)(((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32);
            o[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

#endif /* PI_KQUANTS_H */
