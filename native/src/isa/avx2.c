/* AVX2 + FMA + F16C kernels.
 *
 * Quantized dot products: per block of 32 the 4-bit (or 8-bit) weights and the
 * int8 activations are multiplied with maddubs (u8 x s8 -> pairs of int16) and
 * madd with ones (-> 8 int32), converted to float and accumulated with one FMA
 * against the broadcast block scale d_w * d_x; one horizontal sum at the end.
 *
 * Block scales: a 16-byte load at the start of a block converted with vcvtph2ps
 * gives [d, m or s, junk...] (the junk lanes come from the quants and are never
 * read back), so one multiply yields [d_w*d_x, m_w*s_x]. Nothing reads past the
 * end of a block (or of a row: float tails are scalar).
 *
 * The activation quantizers reproduce the scalar path bit for bit (d = amax/127,
 * id = 127/amax, round half to even: llama.cpp's x86 quantizers, so activation
 * bytes equal llama.cpp's).
 */
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "pi_internal.h"

static inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* fp16 [h0, h1, ...] at p -> [f0, f1, junk...] (reads 16 bytes, all within the
 * block: the 256-bit form is the one compilers fold into vcvtph2ps ymm, m128) */
static inline __m128 load_halfs(const void *p) {
    return _mm256_castps256_ps128(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles first (elements 0..15), then high */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i shifted = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

/* 32 bytes kept in a register: without the empty asm the compiler folds the load
 * into each of its two users and reads the (often line-splitting) bytes twice */
static inline __m256i load_reg256(const void *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __asm__("" : "+x"(v));
    return v;
}

/* u8 x s8 over 32 bytes -> 8 floats of sums of 4 products */
static inline __m256 dot_us8(__m256i u, __m256i s) {
    const __m256i p16 = _mm256_maddubs_epi16(u, s);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

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
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += w[i] * x[i];
    *s = sum;
}

/* The float operations of llama.cpp's AVX-512 ggml_vec_dot_f16, as avx512.c (which
 * runs the same 256-bit code) and the scalar path, so F16 rows (the F16 KV cache
 * in attention) give the same bits on every ISA: four 16-lane accumulators over
 * 64-element steps, each kept as two 8-lane halves, summed as (A0 + A2) + (A1 + A3)
 * and then by halves; the last n % 64 products (all of them when n < 64) are added
 * in double. (llama.cpp's own AVX2 build uses 32-element steps instead.) */
static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
#define LD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
    __m256 a[8]; /* accumulator k: a[2k] lanes 0-7, a[2k+1] lanes 8-15 */
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(LD(w + i + 8 * k), LD(x + i + 8 * k), a[k]);
#undef LD
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    double sum = np > 0 ? hsum_ps(_mm256_add_ps(hi, lo)) : 0.0;
    for (int64_t i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * _cvtsh_ss(x[i]));
    *s = (float)sum;
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
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; i < n; i++) sum += pi_bf16_to_fp32(w[i]) * pi_bf16_to_fp32(x[i]);
    *s = sum;
}

/* ---- quantized rows ------------------------------------------------------------ */
/* One accumulator, blocks in order, and for Q4_1 a fused m_w * s_x accumulation:
 * the float operations of llama.cpp's x86 vec_dot kernels, so a row gives the same
 * bits as llama.cpp on the same activation bytes (checked against the installed
 * libggml-cpu in the tests). A second accumulator measured no faster here. */

static void vec_dot_q4_0(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q4_0 *w = vw;
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    const __m256i eight = _mm256_set1_epi8(8);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* sum((q - 8) * y) = sum(q * y) - sum(8 * y), both through maddubs */
        const __m256i q = unpack_nibbles(w[i].qs);
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y), _mm256_maddubs_epi16(eight, y));
        const __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        const __m128 d = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));
        acc = _mm256_fmadd_ps(f, _mm256_broadcastss_ps(d), acc);
    }
    *s = hsum_ps(acc);
}

static void vec_dot_q4_1(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q4_1 *w = vw;
    const pi_block_q8_1 *x = vx;
    const int64_t nb = n / PI_QK;
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps(); /* lane 1: fma(m_w, s_x, .) over the blocks */
    for (int64_t i = 0; i < nb; i++) {
        const __m256 f = dot_us8(unpack_nibbles(w[i].qs), _mm256_loadu_si256((const __m256i *)x[i].qs));
        const __m128 hw = load_halfs(&w[i]), hx = load_halfs(&x[i]); /* [d, m], [d, s] */
        acc = _mm256_fmadd_ps(f, _mm256_broadcastss_ps(_mm_mul_ps(hw, hx)), acc);
        accm = _mm_fmadd_ps(hw, hx, accm);
    }
    *s = hsum_ps(acc) + _mm_cvtss_f32(_mm_movehdup_ps(accm));
}

static void vec_dot_q8_0(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q8_0 *w = vw;
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        /* s8 x s8 as |w| (u8) x (y with the sign of w) */
        const __m256i q = load_reg256(w[i].qs);
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256 f = dot_us8(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q));
        const __m128 d = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));
        acc = _mm256_fmadd_ps(f, _mm256_broadcastss_ps(d), acc);
    }
    *s = hsum_ps(acc);
}

/* ---- activation conversion ----------------------------------------------------- */

/* round to nearest, ties to even (as llama.cpp's x86 quantizers) */
static inline __m256 round_even(__m256 v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

/* One block of 32 floats -> 32 int8 at q; returns d, and sum(q) through *sum */
static inline float quantize_block_q8(const float *x, int8_t *q, float *sum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v0, absmask), _mm256_and_ps(v1, absmask)),
                                   _mm256_max_ps(_mm256_and_ps(v2, absmask), _mm256_and_ps(v3, absmask)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4), d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    v0 = round_even(_mm256_mul_ps(v0, id));
    v1 = round_even(_mm256_mul_ps(v1, id));
    v2 = round_even(_mm256_mul_ps(v2, id));
    v3 = round_even(_mm256_mul_ps(v3, id));
    if (sum) *sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3))); /* exact */
    const __m256i i01 = _mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1));
    const __m256i i23 = _mm256_packs_epi32(_mm256_cvtps_epi32(v2), _mm256_cvtps_epi32(v3));
    const __m256i b = _mm256_packs_epi16(i01, i23); /* 4-byte groups in order 0 2 4 6 1 3 5 7 */
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    return d;
}

static void from_float_q8_0(const float *x, void *vy, int64_t n) {
    pi_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const float d = quantize_block_q8(x + i * PI_QK, y[i].qs, NULL);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

static void from_float_q8_1(const float *x, void *vy, int64_t n) {
    pi_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        float sum;
        const float d = quantize_block_q8(x + i * PI_QK, y[i].qs, &sum);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}

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

static void from_float_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

const pi_isa pi_isa_avx2 = {
    .name = "avx2",
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
