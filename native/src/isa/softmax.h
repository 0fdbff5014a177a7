/* Softmax with the exp and the sum order of llama.cpp's CPU softmax, one kernel per
 * llama.cpp build (the order tables of table.h): its 256-bit build (AVX2 + FMA) and
 * its AVX-512 one evaluate exp with two variants of the polynomial of Arm's
 * optimized-routines vector expf (x = n ln2 + b, |b| <= ln2/2, 2^n from the exponent
 * bits; at most ~2 ulp from the exact value) over 8 or 16 lanes, add each chunk's
 * lanes in a fixed tree, the chunk sums in double, the tail with libm's expf.
 *
 * Plain C: a lane's operations are scalar ones (each fmaf one rounding, as a vector
 * FMA), so every ISA file including this one gives the same bits; it is included
 * after the file's target pragma, so fmaf is an instruction where the file has FMA
 * (in scalar.c it is a libm call, still fused). Why it matters: the softmax weights
 * are rounded to F16 before the V product, and a 1-ulp exp difference that crosses
 * an F16 rounding point changes a layer's output (Gemma 3 270M: layer 5, position 14
 * of a code prompt; every later position then differs).
 */
#ifndef PI_ISA_SOFTMAX_H
#define PI_ISA_SOFTMAX_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float sm_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t sm_u32(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The constants of that expf, shared with the vector loops of the same exp (isa/ffn_act.h's
 * twins in x86_256.h and avx512.c): the rounding shift, 1/ln2, ln2 in two parts, and the
 * polynomial's coefficients of b^1..b^5 */
#define SM_SHIFT 0x1.8p23f
#define SM_LOG2E 0x1.715476p+0f
#define SM_LN2_HI 0x1.62e4p-1f
#define SM_LN2_LO 0x1.7f7d1cp-20f
#define SM_C1 0x1.ffffecp-1f
#define SM_C2 0x1.fffdb6p-2f
#define SM_C3 0x1.555e66p-3f
#define SM_C4 0x1.573e2ep-5f
#define SM_C5 0x1.0e4020p-7f

/* n = round(x / ln2) by the 1.5 * 2^23 shift (its low mantissa bits hold n), and
 * b = x - n ln2 with ln2 in two parts; returns n, sets *b and the shifted *z */
static inline float sm_reduce(float x, float *b, float *z) {
    const float shift = SM_SHIFT;
    *z = fmaf(x, SM_LOG2E, shift);
    const float n = *z - shift;
    *b = fmaf(-n, SM_LN2_LO, fmaf(-n, SM_LN2_HI, x));
    return n;
}

/* linear + u (c2 + c3 b + u (c4 + c5 b)), u = b^2: exp(b)'s terms of degree 2..5,
 * grouped as the vector code does; linear is c1 b (exp(b) - 1) or 1 + c1 b (exp(b)) */
static inline float sm_poly(float b, float linear) {
    const float u = b * b;
    const float hi = fmaf(fmaf(SM_C5, b, SM_C4), u, fmaf(SM_C3, b, SM_C2));
    return fmaf(hi, u, linear);
}

/* exp of llama.cpp's 256-bit build: k = 2^n built in the exponent field, k + k p(b);
 * |n| > 126 scales in two steps (s1, s2) so that 2^n need not be representable */
static inline float sm_expf_w8(float x) {
    float b, z;
    const float n = sm_reduce(x, &b, &z);
    const uint32_t e = sm_u32(z) << 23;
    const float k = sm_f32(e + 0x3f800000u);
    const float j = sm_poly(b, SM_C1 * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(j, k, k); /* NaN x takes this path too */
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = sm_f32(g + 0x7f000000u);
    if (fabsf(n) > 192.0f) return s1 * s1; /* 0 or inf */
    const float s2 = sm_f32(e - g);
    return fmaf(s2, j, s2) * s1;
}

/* exp of llama.cpp's AVX-512 build: (1 + p(b)) scaled by 2^n in one rounding (scalef) */
static inline float sm_expf_w16(float x) {
    float b, z;
    const float n = sm_reduce(x, &b, &z);
    if (isnan(n)) return n;
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    const float j = sm_poly(b, fmaf(SM_C1, b, 1.0f));
    return ldexpf(j, (int)n);
}

/* the 8 lanes added as llama.cpp's 256-bit softmax does: halves, then pairs 2 apart, then 1 */
static inline float sm_sum8(const float *v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* the 16 lanes in the order of an AVX-512 horizontal add (halves, quarters, pairs) */
static inline float sm_sum16(const float *v) {
    float a[8], b[4];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) b[i] = a[i] + a[i + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* softmax of x[0..n) in place: chunks of w lanes through ex and sum, the tail as
 * llama.cpp's scalar loop; always inlined, so each kernel below is specialised */
static inline __attribute__((always_inline)) void sm_softmax(float *x, int64_t n, int w, float (*ex)(float),
                                                             float (*sum_w)(const float *)) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    int64_t i = 0;
    for (; i + w <= n; i += w) {
        for (int k = 0; k < w; k++) x[i + k] = ex(x[i + k] - mx);
        sum += sum_w(x + i);
    }
    for (; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (i = 0; i < n; i++) x[i] *= inv;
}

static void softmax_w8(float *x, int64_t n) { sm_softmax(x, n, 8, sm_expf_w8, sm_sum8); }
static void softmax_w16(float *x, int64_t n) { sm_softmax(x, n, 16, sm_expf_w16, sm_sum16); }

#endif
