/* AVX2 + FMA + F16C kernels.
 *
 * The 256-bit code this file shares with avx512.c (F16 rows, the quantized dot
 * products, the Q8 activation quantizers) is in x86_256.h, which describes it;
 * here are the F32 and BF16 rows and the F16 / BF16 activation converters.
 */
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "pi_internal.h"
#include "x86_256.h" /* after the pragma: compiled for this file's target */
/* Tile shapes, rows x tokens (16 ymm registers): one row by 8 tokens, its accumulators
 * 8 registers; each token's block scales come pre-converted (pi_tile_act), so a second
 * row per tile shares nothing but costs registers */
#define PI_TILE_R 1 /* array bounds */
#define PI_TILE_T 8
#define PI_TILES_WIDE 1, 8 /* K-quants, Q5_0, Q8_0 */
#define PI_TILES_NIBBLE 1, 8 /* Q4_0, Q4_1 */
#include "x86_tiles.h"
#include "x86_gemv.h"
#include "x86_groups.h"
#include "table.h"

/* ---- float rows ---------------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *vx) {
    const float *w = vw, *x = vx;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
    }
    for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += w[i] * x[i];
    *s = sum;
}

/* bf16: a 32-bit word holds two values; the high one is word & 0xffff0000, the low
 * one word << 16. Pairing even with even and odd with odd keeps the dot product. */
static void vec_dot_bf16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(w + i));
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i));
        const __m256i w1 = _mm256_loadu_si256((const __m256i *)(w + i + 16));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + i + 16));
        a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)),
                             _mm256_castsi256_ps(_mm256_slli_epi32(x0, 16)), a0);
        a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w0, hi)),
                             _mm256_castsi256_ps(_mm256_and_si256(x0, hi)), a1);
        a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(w1, 16)),
                             _mm256_castsi256_ps(_mm256_slli_epi32(x1, 16)), a2);
        a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(w1, hi)),
                             _mm256_castsi256_ps(_mm256_and_si256(x1, hi)), a3);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 wf = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(w + i))), 16));
        const __m256 xf = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i))), 16));
        a0 = _mm256_fmadd_ps(wf, xf, a0);
    }
    float sum = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += pi_bf16_to_fp32(w[i]) * pi_bf16_to_fp32(x[i]);
    *s = sum;
}

/* ---- quantized rows (bodies and notes in x86_256.h) ----------------------------- */

static void vec_dot_q4_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q4_0_BODY(dot4_diff_256) }
static void vec_dot_q4_1(int64_t n, float *s, const void *vw, const void *vx) { PI_Q4_1_BODY(dot4_256) }
static void vec_dot_q8_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q8_0_BODY(dot4_256) }
static void vec_dot_q5_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q5_0_BODY(dot4_diff_256) }
/* K-quants: vec_dot_q4_K / q5_K / q6_K in x86_256.h */

/* ---- activation conversion ----------------------------------------------------- */

/* Q8_0 / Q8_1: from_float_q8_0 / from_float_q8_1 in x86_256.h */

static void from_float_f16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* round to nearest even on the bits; NaN -> quiet NaN (as pi_fp32_to_bf16) */
static inline __m256i bf16_round(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(64));
    const __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                             _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(r, qnan, isnan);
}

static void from_float_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256i p = _mm256_packus_epi32(bf16_round(_mm256_loadu_ps(x + i)), bf16_round(_mm256_loadu_ps(x + i + 8)));
        _mm256_storeu_si256((__m256i *)(y + i), _mm256_permute4x64_epi64(p, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    for (; i < n; i++) y[i] = pi_fp32_to_bf16(x[i]);
}

PI_ISA_DEFINE(pi_isa_avx2, "avx2", pi_down_tiles_avx2, pi_down_batch_avx2);
