/* SiLU times up, h = silu(g) * u with silu(x) = x / (1 + exp(-x)), the way llama.cpp's CPU
 * backend evaluates its SwiGLU (ggml_vec_swiglu_f32): exp is its vector expf of the same
 * build as the softmax (isa/softmax.h: sm_expf_w8 for 256-bit, sm_expf_w16 for AVX-512),
 * then one IEEE add, divide and multiply. llama.cpp's scalar tail (libm expf) is not
 * copied: every element takes the lane function, so a neuron's h is the same wherever it is
 * computed (dense rows, a sparse FFN's single neuron, a calibration histogram).
 *
 * The plain C here is the reference; x86_256.h (8 lanes) and avx512.c (16 lanes) have
 * vector loops with the same operations per lane, so every path gives the same bits.
 * Include after the file's target pragma (table.h does; x86_256.h for its loops). */
#ifndef PI_ISA_SILU_H
#define PI_ISA_SILU_H

#include "softmax.h"

static inline float sl_silu_w8(float x) { return x / (1.0f + sm_expf_w8(0.0f - x)); }
static inline float sl_silu_w16(float x) { return x / (1.0f + sm_expf_w16(0.0f - x)); }

/* elements i.. of h = silu(g) * u (u NULL: silu(g)) by the lane function */
static inline __attribute__((always_inline)) void sl_silu_mul_from(const float *g, const float *u, float *h, int64_t n,
                                                                   int64_t i, float (*silu)(float)) {
    for (; i < n; i++) {
        const float s = silu(g[i]);
        h[i] = u != NULL ? s * u[i] : s;
    }
}

/* the plain loops; a file with vector loops names them in PI_SILU_MUL_W8 / _W16 (table.h) */
static inline void silu_mul_w8_c(const float *g, const float *u, float *h, int64_t n) {
    sl_silu_mul_from(g, u, h, n, 0, sl_silu_w8);
}
static inline void silu_mul_w16_c(const float *g, const float *u, float *h, int64_t n) {
    sl_silu_mul_from(g, u, h, n, 0, sl_silu_w16);
}

#endif
