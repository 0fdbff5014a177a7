/* Portable scalar kernels (plain C, no intrinsics).
 *
 * This is the reference path. The SIMD files agree with it bit for bit: the
 * activation quantizers produce the same bytes, and the F16 and quantized dot
 * products perform the same float operations in the same order (the order of
 * llama.cpp's x86 kernels, see avx2.c / avx512.c), so a model's logits do not
 * depend on the instruction set. F32 and BF16 rows only agree within float
 * rounding: they use 8 independent partial sums here (better rounding than one
 * running sum, and the compiler can keep them in vector registers without
 * reassociation).
 *
 * Quantized rows work per block of 32 as the 256-bit SIMD kernels do: 8 "lanes"
 * each hold the exact integer sum of 4 consecutive quant products (elements
 * 4l..4l+3 of the block in register order), converted to float and accumulated
 * with one fused multiply-add against d_w * d_x (a float product of the two F16
 * scales) into 8 float accumulators; Q4_1 adds fma(m_w, s_x, .) into a separate
 * accumulator, where s_x = d_x * sum(q_x) was stored by the Q8_1 quantizer. The
 * accumulators are summed as the SIMD horizontal sum does (see hsum8). fmaf is a
 * libm call here (this file is compiled without -mfma; glibc picks the hardware
 * instruction at run time where the CPU has it).
 */
#include "kquants.h"
#include "pi_internal.h"
#include "table.h"

#define NACC 8

static float sum_partials(const float acc[NACC]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* The SIMD horizontal sum of 8 lanes: (a0 + a4) and so on, then by halves */
static float hsum8(const float a[8]) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
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

/* The twins of x86_256.h's F16 kernels, one per llama.cpp build of ggml_vec_dot_f16
 * (select.c picks the order). Element i + j goes to accumulator j of a STEP-element
 * step; the product of two F16 values is exact in float, so acc + w * x rounds once,
 * exactly as the SIMD fused multiply-add; the last n % STEP products (all of them
 * when n < STEP) are added in double. */

/* x's element i: F16 converted, or (x32) a float that holds an F16 value exactly */
static inline float f16_x(int x32, const void *x, int64_t i) {
    return x32 ? ((const float *)x)[i] : pi_fp16_to_fp32(((const uint16_t *)x)[i]);
}

/* acc[j] += w[i + j] * x[i + j] over the whole STEP-element steps; returns where they end */
static int64_t f16_steps(int x32, int64_t n, int step, const uint16_t *w, const void *x, float *acc) {
    const int64_t np = n / step * step;
    for (int64_t i = 0; i < np; i += step)
        for (int j = 0; j < step; j++) acc[j] += pi_fp16_to_fp32(w[i + j]) * f16_x(x32, x, i + j);
    return np;
}

/* sum + the products from np on, in double, as the result */
static float f16_tail(int x32, int64_t np, int64_t n, const uint16_t *w, const void *x, double sum) {
    for (int64_t i = np; i < n; i++) sum += (double)(pi_fp16_to_fp32(w[i]) * f16_x(x32, x, i));
    return (float)sum;
}

/* AVX-512 build (GGML_F16_STEP 64, EPR 16): 64 accumulators summed lane-wise as
 * (A0 + A2) + (A1 + A3) over the four 16-wide groups A0..A3, then as hsum8 over the
 * low and high 8 lanes added. */
static void f16_dot_step64(int x32, int64_t n, float *s, const void *vw, const void *x) {
    const uint16_t *w = vw;
    float acc[64] = {0};
    const int64_t np = f16_steps(x32, n, 64, w, x, acc);
    double sum = 0.0;
    if (np > 0) {
        float v[8];
        for (int l = 0; l < 8; l++) {
            const float lo = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
            const float hi = (acc[8 + l] + acc[40 + l]) + (acc[24 + l] + acc[56 + l]);
            v[l] = hi + lo;
        }
        sum = hsum8(v);
    }
    *s = f16_tail(x32, np, n, w, x, sum);
}
static void vec_dot_f16_step64(int64_t n, float *s, const void *vw, const void *vx) { f16_dot_step64(0, n, s, vw, vx); }

static void f16_floats(const void *vh, float *f, int64_t n) {
    const uint16_t *h = vh;
    for (int64_t i = 0; i < n; i++) f[i] = pi_fp16_to_fp32(h[i]);
}
#define PI_F16_FLOATS f16_floats
static void vec_dot_f16f32_step64(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step64(1, n, s, vw, vx);
}

/* AVX2 build (GGML_F16_STEP 32, EPR 8): 32 accumulators summed lane-wise as
 * (A0 + A2) + (A1 + A3) over the four 8-wide groups, then lanes l + (l + 4), then
 * two pairwise adds (the two _mm_hadd_ps of GGML_F32x8_REDUCE). */
static void f16_dot_step32(int x32, int64_t n, float *s, const void *vw, const void *x) {
    const uint16_t *w = vw;
    float acc[32] = {0};
    const int64_t np = f16_steps(x32, n, 32, w, x, acc);
    double sum = 0.0;
    if (np > 0) {
        float t[4];
        for (int l = 0; l < 4; l++) {
            const float lo = (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]);
            const float hi = (acc[4 + l] + acc[20 + l]) + (acc[12 + l] + acc[28 + l]);
            t[l] = lo + hi;
        }
        sum = (double)((t[0] + t[1]) + (t[2] + t[3]));
    }
    *s = f16_tail(x32, np, n, w, x, sum);
}
static void vec_dot_f16_step32(int64_t n, float *s, const void *vw, const void *vx) { f16_dot_step32(0, n, s, vw, vx); }
static void vec_dot_f16f32_step32(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step32(1, n, s, vw, vx);
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

/* acc[l] = fma(lane sum l, d, acc[l]) for the 8 lanes of a block */
static inline void fma_lanes(float acc[8], const int32_t lane[8], float d) {
    for (int l = 0; l < 8; l++) acc[l] = fmaf((float)lane[l], d, acc[l]);
}

/* The Q8_0 / Q8_1 products for 1..TOK tokens against one weight row (and the Q5_0 and
 * K-quant ones below): the row's blocks are decoded once for all the tokens (the tiled
 * prefill kernel), and each token's result s[t * lds] takes exactly the float operations
 * of a one-token call (the row dot), so a token gives the same bits in a batch as in
 * decode. Token t's activation row is at x + t * xrow. */
#define TOK 4

/* The 8 lane sums of a block: lane l = elements 4l..4l+3 of q times those of qx (exact) */
static inline void block_lanes(const int8_t q[PI_QK], const int8_t *qx, int32_t lane[8]) {
    for (int l = 0; l < 8; l++) {
        int32_t v = 0;
        for (int k = 4 * l; k < 4 * l + 4; k++) v += (int32_t)q[k] * qx[k];
        lane[l] = v;
    }
}

/* 4-bit block: element j < 16 is the low nibble of qs[j], element j >= 16 the high
 * nibble of qs[j - 16], each minus `offset` (8 for Q4_0, 0 for Q4_1) */
static inline void decode_nibbles(const uint8_t *qs, int32_t offset, int8_t q[PI_QK]) {
    for (int k = 0; k < PI_QK / 2; k++) {
        q[k] = (int8_t)((qs[k] & 0x0F) - offset);
        q[k + PI_QK / 2] = (int8_t)((qs[k] >> 4) - offset);
    }
}

/* block i of a row of weights with Q8_0 activations -> its 32 values; returns its d */
typedef float (*decode_block_fn)(const void *row, int64_t i, int8_t q[PI_QK]);

static inline float decode_q4_0(const void *row, int64_t i, int8_t q[PI_QK]) { /* w = d * (nibble - 8) */
    const pi_block_q4_0 *b = (const pi_block_q4_0 *)row + i;
    decode_nibbles(b->qs, 8, q);
    return pi_fp16_to_fp32(b->d);
}

static inline float decode_q5_0(const void *row, int64_t i, int8_t q[PI_QK]) { /* w = d * (5-bit value - 16) */
    const pi_block_q5_0 *b = (const pi_block_q5_0 *)row + i;
    pi_decode_q5_0(b, q);
    return pi_fp16_to_fp32(b->d);
}

static inline float decode_q8_0(const void *row, int64_t i, int8_t q[PI_QK]) {
    const pi_block_q8_0 *b = (const pi_block_q8_0 *)row + i;
    memcpy(q, b->qs, PI_QK);
    return pi_fp16_to_fp32(b->d);
}

/* weights x Q8_0 activations: per block fma(lane, d_w * d_x, acc[lane]) (inlined for
 * each decoder, a constant at every call) */
static inline void dots_x_q8_0(int64_t n, int nt, float *s, int64_t lds, const void *vw, decode_block_fn decode,
                               const char *x, int64_t xrow) {
    float acc[TOK][8] = {{0}};
    for (int64_t i = 0; i < n / PI_QK; i++) {
        int8_t q[PI_QK];
        const float dw = decode(vw, i, q);
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_0 *a = (const pi_block_q8_0 *)(x + t * xrow) + i;
            int32_t lane[8];
            block_lanes(q, a->qs, lane);
            fma_lanes(acc[t], lane, dw * pi_fp16_to_fp32(a->d));
        }
    }
    for (int t = 0; t < nt; t++) s[t * lds] = hsum8(acc[t]);
}

static void dots_q4_0(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    dots_x_q8_0(n, nt, s, lds, vw, decode_q4_0, x, xrow);
}

static void dots_q5_0(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    dots_x_q8_0(n, nt, s, lds, vw, decode_q5_0, x, xrow);
}

static void dots_q8_0(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    dots_x_q8_0(n, nt, s, lds, vw, decode_q8_0, x, xrow);
}

/* Q4_1 weights x Q8_1 activations: w = d * nibble + m; the min term fma(m_w, s_x, accm)
 * per block, added last */
static void dots_q4_1(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    const pi_block_q4_1 *w = vw;
    float acc[TOK][8] = {{0}}, accm[TOK] = {0};
    for (int64_t i = 0; i < n / PI_QK; i++) {
        int8_t q[PI_QK];
        decode_nibbles(w[i].qs, 0, q);
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_1 *a = (const pi_block_q8_1 *)(x + t * xrow) + i;
            int32_t lane[8];
            block_lanes(q, a->qs, lane);
            fma_lanes(acc[t], lane, pi_fp16_to_fp32(w[i].d) * pi_fp16_to_fp32(a->d));
            accm[t] = fmaf(pi_fp16_to_fp32(w[i].m), pi_fp16_to_fp32(a->s), accm[t]);
        }
    }
    for (int t = 0; t < nt; t++) s[t * lds] = hsum8(acc[t]) + accm[t];
}

/* K-quants x Q8_K. The 8 lanes of a super-block: lane l sums, over the eight
 * 32-element chunks, the products of elements 4l..4l+3 of the chunk times their
 * integer scale (sc16[e / 16] for element e) - exact int32, as the SIMD kernels'
 * maddubs + madd(scale) - then one FMA per lane with d = d_x * d_w. */
static inline void k_lanes(const uint8_t *qwu, const int8_t *qx, const int32_t sc16[16],
                           int32_t lane[8]) {
    for (int l = 0; l < 8; l++) {
        int32_t v = 0;
        for (int c = 0; c < 8; c++)
            for (int e = 32 * c + 4 * l; e < 32 * c + 4 * l + 4; e++)
                v += sc16[e / 16] * qwu[e] * qx[e];
        lane[l] = v;
    }
}

/* The min term of Q4_K / Q5_K: 4 lanes, lane m = mins[2m] * (sum of chunk 2m's
 * quants) + mins[2m+1] * (chunk 2m+1's), accumulated with fma(dmin, ., .) where
 * dmin = -d_x * dmin_w; the lanes are summed as (m0 + m2) + (m1 + m3) */
static inline void k_min_lanes(const uint8_t mn[8], const int16_t bsums[16], float dmin, float accm[4]) {
    for (int m = 0; m < 4; m++) {
        const int32_t p = mn[2 * m] * (bsums[4 * m] + bsums[4 * m + 1]) +
                          mn[2 * m + 1] * (bsums[4 * m + 2] + bsums[4 * m + 3]);
        accm[m] = fmaf(dmin, (float)p, accm[m]);
    }
}

static void dots_q4_K(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    const pi_block_q4_K *w = vw;
    float acc[TOK][8] = {{0}}, accm[TOK][4] = {{0}};
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        uint8_t q[PI_QK_K], sc[8], mn[8];
        int32_t sc16[16];
        pi_decode_q4_K(&w[i], q);
        pi_decode_k4_scales(w[i].scales, sc, mn);
        for (int j = 0; j < 16; j++) sc16[j] = sc[j / 2];
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_K *a = (const pi_block_q8_K *)(x + t * xrow) + i;
            int32_t lane[8];
            k_lanes(q, a->qs, sc16, lane);
            fma_lanes(acc[t], lane, a->d * pi_fp16_to_fp32(w[i].d));
            k_min_lanes(mn, a->bsums, -a->d * pi_fp16_to_fp32(w[i].dmin), accm[t]);
        }
    }
    for (int t = 0; t < nt; t++) s[t * lds] = hsum8(acc[t]) + ((accm[t][0] + accm[t][2]) + (accm[t][1] + accm[t][3]));
}

/* Q5_K: as Q4_K, but the min term is one exact integer per super-block, added
 * with fma(dmin, isum, summs) (llama.cpp's AVX2 kernel as its x86 build compiles it) */
static void dots_q5_K(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    const pi_block_q5_K *w = vw;
    float acc[TOK][8] = {{0}}, summs[TOK] = {0};
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        uint8_t q[PI_QK_K], sc[8], mn[8];
        int32_t sc16[16];
        pi_decode_q5_K(&w[i], q);
        pi_decode_k4_scales(w[i].scales, sc, mn);
        for (int j = 0; j < 16; j++) sc16[j] = sc[j / 2];
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_K *a = (const pi_block_q8_K *)(x + t * xrow) + i;
            int32_t lane[8];
            k_lanes(q, a->qs, sc16, lane);
            fma_lanes(acc[t], lane, a->d * pi_fp16_to_fp32(w[i].d));
            int32_t isum = 0;
            for (int j = 0; j < 8; j++) isum += mn[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
            summs[t] = fmaf(-a->d * pi_fp16_to_fp32(w[i].dmin), (float)isum, summs[t]);
        }
    }
    for (int t = 0; t < nt; t++) s[t * lds] = hsum8(acc[t]) + summs[t];
}

/* Q6_K: lanes over the unsigned 6-bit values u = q + 32, and the offset taken out
 * per lane from the activation sums: lane l loses 32 * (scale * sum) of the two
 * 16-element groups of chunk l (llama.cpp's AVX2 split, so the lanes round alike) */
static void dots_q6_K(int64_t n, int nt, float *s, int64_t lds, const void *vw, const char *x, int64_t xrow) {
    const pi_block_q6_K *w = vw;
    float acc[TOK][8] = {{0}};
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        int8_t q[PI_QK_K];
        uint8_t u[PI_QK_K];
        int32_t sc16[16];
        pi_decode_q6_K(&w[i], q);
        for (int e = 0; e < PI_QK_K; e++) u[e] = (uint8_t)(q[e] + 32);
        for (int j = 0; j < 16; j++) sc16[j] = w[i].scales[j];
        for (int t = 0; t < nt; t++) {
            const pi_block_q8_K *a = (const pi_block_q8_K *)(x + t * xrow) + i;
            int32_t lane[8];
            k_lanes(u, a->qs, sc16, lane);
            for (int l = 0; l < 8; l++)
                lane[l] -= 32 * (sc16[2 * l] * a->bsums[2 * l] + sc16[2 * l + 1] * a->bsums[2 * l + 1]);
            fma_lanes(acc[t], lane, a->d * pi_fp16_to_fp32(w[i].d));
        }
    }
    for (int t = 0; t < nt; t++) s[t * lds] = hsum8(acc[t]);
}

/* the row dot (decode) and the tiled product (prefill: TOK tokens per pass over a row) */
#define DEFINE_DOTS(T)                                                                              \
    static void vec_dot_##T(int64_t n, float *s, const void *vw, const void *vx) {                 \
        dots_##T(n, 1, s, 0, vw, vx, 0);                                                            \
    }                                                                                               \
    static void matmul_tiles_##T(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy,  \
                                 const void *vw, int64_t wrow, const pi_tile_act *a) {              \
        for (int64_t t = 0; t < n_tok; t += TOK)                                                    \
            for (int64_t r = 0; r < n_rows; r++)                                                    \
                dots_##T(n, n_tok - t < TOK ? (int)(n_tok - t) : TOK, y + t * ldy + r, ldy,          \
                         (const char *)vw + r * wrow, a->x + t * a->xrow, a->xrow);                 \
    }
DEFINE_DOTS(q4_0)
DEFINE_DOTS(q4_1)
DEFINE_DOTS(q8_0)
DEFINE_DOTS(q5_0)
DEFINE_DOTS(q4_K)
DEFINE_DOTS(q5_K)
DEFINE_DOTS(q6_K)

/* Row r's exact integer sum over block b of a blocks-of-32 group (Q4_0, Q5_0, Q8_0), xb
 * the activation's Q8_0 block */
static int32_t group32_isum(int32_t type, const void *b, int r, const void *xb) {
    const int8_t *y = ((const pi_block_q8_0 *)xb)->qs;
    int32_t isum = 0, ysum = 0;
    for (int e = 0; e < PI_QK; e++) ysum += y[e];
    if (type == PI_TYPE_Q8_0) {
        const pi_block_q8_0x16 *q = b;
        for (int e = 0; e < PI_QK; e++) isum += q->qs[e / 4][r][e % 4] * y[e];
        return isum;
    }
    const uint8_t(*qs)[PI_GROUP_ROWS][4] = type == PI_TYPE_Q5_0 ? ((const pi_block_q5_0x16 *)b)->qs
                                                                : ((const pi_block_q4_0x16 *)b)->qs;
    for (int c = 0; c < 4; c++)
        for (int j = 0; j < 4; j++) {
            int lo = qs[c][r][j] & 0x0F, hi = qs[c][r][j] >> 4;
            if (type == PI_TYPE_Q5_0) {
                const pi_block_q5_0x16 *q = b;
                lo |= (int)((q->hb[c][0] >> (4 * r + j)) & 1u) << 4;
                hi |= (int)((q->hb[c][1] >> (4 * r + j)) & 1u) << 4;
            }
            isum += lo * y[4 * c + j] + hi * y[16 + 4 * c + j];
        }
    return isum - (type == PI_TYPE_Q5_0 ? 16 : 8) * ysum;
}

/* Row r's exact integer sum over block b of a Q6_K group, xb the activation's Q8_K block:
 * the sub-blocks' sums of q * y scaled in integers */
static int32_t group_q6_K_isum(int32_t type, const void *vb, int r, const void *xb) {
    (void)type;
    const pi_block_q6_Kx16 *b = vb;
    const int8_t *y = ((const pi_block_q8_K *)xb)->qs;
    int32_t isum = 0;
    for (int j = 0; j < 16; j++) {
        int32_t s = 0;
        for (int e = 0; e < 16; e++) {
            const int c = e / 4, k = e % 4;
            const int u = ((b->sub[j].ql[c / 2][r][k] >> (4 * (c % 2))) & 0x0F) | ((b->sub[j].qh[r][k] >> (2 * c)) & 3) << 4;
            s += (u - 32) * y[16 * j + e];
        }
        isum += b->scales[j][r] * s;
    }
    return isum;
}

/* Row-group types with one exact integer per row and block (blocks of 32, Q6_K; a group
 * block begins with its rows' F16 d): per row one fmaf per block (pi_internal.h, "Row groups") */
static void groups_one_fma(int32_t type, int32_t (*isum_of)(int32_t, const void *, int, const void *), int64_t n,
                           int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw, const pi_tile_act *a) {
    const pi_type_traits *tt = pi_type_get(type);
    const int64_t nb = n / tt->block_size;
    const int64_t bsize = PI_GROUP_ROWS * tt->type_size; /* a group block: 16 of the type's */
    const int64_t xsize = pi_type_get(tt->vec_dot_type)->type_size;
    for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++)
        for (int64_t t = 0; t < n_tok; t++) {
            const char *x = a->x + t * a->xrow;
            for (int r = 0; r < PI_GROUP_ROWS; r++) {
                float acc = 0.0f;
                for (int64_t i = 0; i < nb; i++) {
                    const char *b = (const char *)vw + (g * nb + i) * bsize;
                    const int32_t isum = isum_of(type, b, r, x + i * xsize);
                    acc = fmaf((float)isum, pi_fp16_to_fp32(((const uint16_t *)b)[r]) * a->d[i * a->ld + t], acc);
                }
                y[t * ldy + g * PI_GROUP_ROWS + r] = acc;
            }
        }
}

#define DEFINE_GROUPS32(T, TYPE)                                                                    \
    static void matmul_groups_##T(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy,  \
                                  const void *vw, const pi_tile_act *a) {                           \
        groups_one_fma(TYPE, group32_isum, n, n_rows, n_tok, y, ldy, vw, a);                        \
    }
DEFINE_GROUPS32(q4_0, PI_TYPE_Q4_0)
DEFINE_GROUPS32(q5_0, PI_TYPE_Q5_0)
DEFINE_GROUPS32(q8_0, PI_TYPE_Q8_0)

/* Q4_K / Q5_K (Q5 = 1) in row groups (pi_block_q4_Kx16 / pi_block_q5_Kx16): sub-block
 * sums scaled in integers, the min term from the activation's sub-block sums, two fmaf per
 * super-block */
static void groups_k4(const int Q5, int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy,
                      const void *vw, const pi_tile_act *a) {
    const int64_t nb = n / PI_QK_K;
    const int64_t bsize = PI_GROUP_ROWS * pi_type_get(Q5 ? PI_TYPE_Q5_K : PI_TYPE_Q4_K)->type_size;
    for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++)
        for (int64_t t = 0; t < n_tok; t++) {
            const pi_block_q8_K *x = (const pi_block_q8_K *)(a->x + t * a->xrow);
            for (int r = 0; r < PI_GROUP_ROWS; r++) {
                float acc = 0.0f;
                for (int64_t i = 0; i < nb; i++) {
                    /* both layouts begin with d, dmin, scales (pi_block_q4_Kx16's fields) */
                    const pi_block_q4_Kx16 *b = (const void *)((const char *)vw + (g * nb + i) * bsize);
                    const pi_block_q5_Kx16 *b5 = (const void *)b;
                    const uint8_t(*qs)[PI_GROUP_ROWS][4] = Q5 ? b5->qs : b->qs;
                    const int16_t *bsum = (const int16_t *)a->aux + (i * a->ld + t) * 8;
                    uint8_t raw[12];
                    for (int k = 0; k < 3; k++) memcpy(raw + 4 * k, &b->scales[k][r], 4);
                    int32_t isum = 0, imin = 0;
                    for (int j = 0; j < 8; j++) {
                        uint8_t sc, m;
                        pi_k4_scale_min(raw, j, &sc, &m);
                        int32_t s = 0;
                        for (int e = 0; e < 32; e++) {
                            const int byte = qs[8 * (j / 2) + e / 4][r][e % 4];
                            int q = j % 2 ? byte >> 4 : byte & 0x0F;
                            if (Q5) q |= ((b5->qh[e / 4][r][e % 4] >> j) & 1) << 4;
                            s += q * x[i].qs[32 * j + e];
                        }
                        isum += sc * s;
                        imin += m * bsum[j];
                    }
                    const float dx = a->d[i * a->ld + t];
                    acc = fmaf(-(float)imin, pi_fp16_to_fp32(b->dmin[r]) * dx, acc);
                    acc = fmaf((float)isum, pi_fp16_to_fp32(b->d[r]) * dx, acc);
                }
                y[t * ldy + g * PI_GROUP_ROWS + r] = acc;
            }
        }
}

static void matmul_groups_q4_K(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a) {
    groups_k4(0, n, n_rows, n_tok, y, ldy, vw, a);
}

static void matmul_groups_q5_K(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a) {
    groups_k4(1, n, n_rows, n_tok, y, ldy, vw, a);
}

static void matmul_groups_q6_K(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a) {
    groups_one_fma(PI_TYPE_Q6_K, group_q6_K_isum, n, n_rows, n_tok, y, ldy, vw, a);
}

/* ---- activation conversion ----------------------------------------------------- */

/* round to nearest, ties to even, for |v| <= 128 without a libm call (adding and
 * removing 1.5 * 2^23 leaves the float's integer part rounded in the default mode).
 * Non-finite input (NaN or inf in x) gives 0 rather than an undefined conversion. */
static inline float round_even(float v) {
    if (!(v >= -128.0f && v <= 128.0f)) return 0.0f;
    volatile float t = v + 12582912.0f; /* volatile: keep the compiler from folding the pair */
    return t - 12582912.0f;
}

/* One block of 32: d = amax / 127, q = round_even(x * (127 / amax)), as llama.cpp's
 * x86 quantizers (its portable reference uses 1/d and rounds half away; the x86 form
 * is the one the reference engine runs here); returns sum(q). */
static int32_t quantize_block_q8(const float *x, int8_t *q, float *d_out) {
    float amax = 0.0f;
    for (int j = 0; j < PI_QK; j++) {
        const float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < PI_QK; j++) {
        const int32_t v = (int32_t)round_even(x[j] * id);
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

static void from_float_q8_K(const float *x, void *y, int64_t n) { pi_quantize_row_q8_K(x, y, n); }

PI_ISA_DEFINE(pi_isa_scalar, "scalar", NULL, NULL);
