/* The FFN activations of the ISA table: SiLU times up, h = silu(g) * u with silu(x) = x / (1 + exp(-x)), the way llama.cpp's CPU
 * backend evaluates its SwiGLU (ggml_vec_swiglu_f32): exp is its vector expf of the same
 * build as the softmax (isa/softmax.h: sm_expf_w8 for 256-bit, sm_expf_w16 for AVX-512),
 * then one IEEE add, divide and multiply. llama.cpp's scalar tail (libm expf) is not
 * copied: every element takes the lane function, so a neuron's h is the same wherever it is
 * computed (dense rows, a sparse FFN's single neuron, a calibration histogram).
 *
 * The plain C here is the reference; x86_256.h (8 lanes) and avx512.c (16 lanes) have
 * vector loops with the same operations per lane, so every path gives the same bits.
 * Include after the file's target pragma (table.h does; x86_256.h for its loops). */
#ifndef PI_ISA_FFN_ACT_H
#define PI_ISA_FFN_ACT_H

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

/* GELU through the 65536-entry F16 table of ops/act.c (tab): x <= -10 gives 0, x >= 10
 * gives x, else tab[x rounded to F16] (round to nearest even: pi_fp32_to_fp16, F16C's
 * vcvtps2ph for finite x); times u unless u is NULL. The x86 loop gathers 8 at a time. */
static inline float gl_gelu16(const float *tab, float x) {
    return x <= -10.0f ? 0.0f : x >= 10.0f ? x : tab[pi_fp32_to_fp16(x)];
}
static inline void gl_gelu16_mul_from(const float *tab, const float *g, const float *u, float *h, int64_t n,
                                      int64_t i) {
    for (; i < n; i++) {
        const float a = gl_gelu16(tab, g[i]);
        h[i] = u != NULL ? a * u[i] : a;
    }
}
static inline void gelu16_mul_c(const float *tab, const float *g, const float *u, float *h, int64_t n) {
    gl_gelu16_mul_from(tab, g, u, h, n, 0);
}

#endif
