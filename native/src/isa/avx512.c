/* AVX-512 (F/BW/VL/DQ) kernels, with AVX512-VNNI variants of the quantized dot
 * products chosen at run time where the CPU has it.
 *
 * Quantized dot products take two blocks per 512-bit register: the 32 weight
 * bytes of block k go to the low 256 bits and those of block k+1 to the high 256
 * bits, and the int32 lane sums are scaled by [d_k x8, d_k+1 x8]. An odd last block
 * uses the 256-bit shape. Block scales come from a 64-bit load converted with
 * vcvtph2ps: [d, m or s, junk, junk] (the junk lanes come from the quants and are
 * never read back).
 *
 * Float rows: 4 x 16 lanes per iteration, masked loads for the tail.
 * The activation quantizers reproduce the scalar path bit for bit.
 */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>

#include "pi_internal.h"

#define VNNI_TARGET __attribute__((target("avx512vnni")))

static inline int has_vnni(void) {
    /* __builtin_cpu_init already ran: pi_isa_supported() calls it before any
     * kernel table is chosen */
    return __builtin_cpu_supports("avx512vnni");
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hsum512(__m512 v) {
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

static inline __mmask16 tail_mask16(int64_t r) { return (__mmask16)((1u << r) - 1u); }       /* r < 16 */
static inline __mmask32 tail_mask32(int64_t r) { return (__mmask32)((1ull << r) - 1ull); } /* r < 32 */

/* fp16 [h0, h1, ...] at p -> [f0, f1, junk...] (reads 16 bytes, all within the
 * block: the 256-bit form is the one compilers fold into vcvtph2ps ymm, m128) */
static inline __m128 load_halfs(const void *p) {
    return _mm256_castps256_ps128(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
}

/* 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high */
static inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* nibbles of two blocks -> [lo a, hi a, lo b, hi b] (128-bit lanes) */
static inline __m512i unpack_nibbles2(const uint8_t *qa, const uint8_t *qb) {
    const __m256i a = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qa));
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qb));
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
    return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
}

static inline __m512i load2x32(const int8_t *a, const int8_t *b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

/* [a, b, ...] -> [a x8, b x8] */
static inline __m512 scales2(__m128 u01) {
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                 _mm512_castps128_ps512(u01));
}

/* lane 0 of p0 and lane 0 of p1 -> [p0 x8, p1 x8] */
static inline __m512 scales2x(__m128 p0, __m128 p1) {
    return _mm512_permutex2var_ps(_mm512_castps128_ps512(p0),
                                  _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16),
                                  _mm512_castps128_ps512(p1));
}

/* u8 x s8, sums of 4 adjacent products -> int32 */
static inline __m256i dot4_256(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
static inline __m512i dot4_bw(__m512i u, __m512i s) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
}
VNNI_TARGET static inline __m512i dot4_vnni(__m512i u, __m512i s) {
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

/* ---- float rows ---------------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *vx) {
    const float *w = vw, *x = vx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(x + i), a0);
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + i), _mm512_maskz_loadu_ps(m, x + i), a1);
    }
    *s = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

static void vec_dot_f16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
#define LD(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_fmadd_ps(LD(w + i), LD(x + i), a0);
        a1 = _mm512_fmadd_ps(LD(w + i + 16), LD(x + i + 16), a1);
        a2 = _mm512_fmadd_ps(LD(w + i + 32), LD(x + i + 32), a2);
        a3 = _mm512_fmadd_ps(LD(w + i + 48), LD(x + i + 48), a3);
    }
    for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(LD(w + i), LD(x + i), a0);
#undef LD
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        a1 = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, w + i)),
                             _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + i)), a1);
    }
    *s = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* bf16: each 32-bit word holds two values, the high one is word & 0xffff0000 and
 * the low one word << 16; pairing like with like keeps the dot product. */
static void vec_dot_bf16(int64_t n, float *s, const void *vw, const void *vx) {
    const uint16_t *w = vw, *x = vx;
    const __m512i hi = _mm512_set1_epi32((int)0xFFFF0000u);
#define LO(v) _mm512_castsi512_ps(_mm512_slli_epi32(v, 16))
#define HI(v) _mm512_castsi512_ps(_mm512_and_si512(v, hi))
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i w0 = _mm512_loadu_si512(w + i), x0 = _mm512_loadu_si512(x + i);
        const __m512i w1 = _mm512_loadu_si512(w + i + 32), x1 = _mm512_loadu_si512(x + i + 32);
        a0 = _mm512_fmadd_ps(LO(w0), LO(x0), a0);
        a1 = _mm512_fmadd_ps(HI(w0), HI(x0), a1);
        a2 = _mm512_fmadd_ps(LO(w1), LO(x1), a2);
        a3 = _mm512_fmadd_ps(HI(w1), HI(x1), a3);
    }
    if (i + 32 <= n) {
        const __m512i w0 = _mm512_loadu_si512(w + i), x0 = _mm512_loadu_si512(x + i);
        a0 = _mm512_fmadd_ps(LO(w0), LO(x0), a0);
        a1 = _mm512_fmadd_ps(HI(w0), HI(x0), a1);
        i += 32;
    }
    if (i < n) {
        const __mmask32 m = tail_mask32(n - i);
        const __m512i w0 = _mm512_maskz_loadu_epi16(m, w + i), x0 = _mm512_maskz_loadu_epi16(m, x + i);
        a2 = _mm512_fmadd_ps(LO(w0), LO(x0), a2);
        a3 = _mm512_fmadd_ps(HI(w0), HI(x0), a3);
    }
#undef LO
#undef HI
    *s = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

/* ---- quantized rows ------------------------------------------------------------ */
/* Each kernel body is a macro expanded twice: with maddubs+madd (AVX512BW) and
 * with vpdpbusd (VNNI, compiled under its own target attribute). */

/* Q4_0 x Q8_0: sum((q - 8) * y) = sum(q * y) - sum(8 * y) */
#define Q4_0_BODY(DOT4)                                                                         \
    const pi_block_q4_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    const __m512i eight = _mm512_set1_epi8(8);                                                  \
    __m512 acc = _mm512_setzero_ps();                                                           \
    int64_t i = 0;                                                                              \
    for (; i + 2 <= nb; i += 2) {                                                               \
        const __m512i q = unpack_nibbles2(w[i].qs, w[i + 1].qs);                                \
        const __m512i y = load2x32(x[i].qs, x[i + 1].qs);                                       \
        const __m512i d4 = _mm512_sub_epi32(DOT4(q, y), DOT4(eight, y));                        \
        const __m128 p0 = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                   \
        const __m128 p1 = _mm_mul_ps(load_halfs(&w[i + 1]), load_halfs(&x[i + 1]));           \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d4), scales2x(p0, p1), acc);   \
    }                                                                                           \
    float sum = hsum512(acc);                                                                   \
    if (i < nb) {                                                                               \
        const __m256i q = unpack_nibbles(w[i].qs);                                              \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);                         \
        const __m256i d4 = _mm256_sub_epi32(dot4_256(q, y), dot4_256(_mm256_set1_epi8(8), y));  \
        const __m128 p = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                    \
        sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(p)));        \
    }                                                                                           \
    *s = sum;

/* Q4_1 x Q8_1: sum(d_w d_x q y) + m_w * s_x per block */
#define Q4_1_BODY(DOT4)                                                                         \
    const pi_block_q4_1 *w = vw;                                                                \
    const pi_block_q8_1 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    __m512 acc = _mm512_setzero_ps();                                                           \
    __m128 accm = _mm_setzero_ps(); /* lanes 2, 3 collect m_w * s_x */                          \
    int64_t i = 0;                                                                              \
    for (; i + 2 <= nb; i += 2) {                                                               \
        const __m512i q = unpack_nibbles2(w[i].qs, w[i + 1].qs);                                \
        const __m512i y = load2x32(x[i].qs, x[i + 1].qs);                                       \
        const __m128 p0 = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                   \
        const __m128 p1 = _mm_mul_ps(load_halfs(&w[i + 1]), load_halfs(&x[i + 1]));           \
        const __m128 u = _mm_unpacklo_ps(p0, p1); /* [d0, d1, m0, m1] */                        \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT4(q, y)), scales2(u), acc);                 \
        accm = _mm_add_ps(accm, u);                                                             \
    }                                                                                           \
    accm = _mm_add_ps(accm, _mm_movehdup_ps(accm));                                             \
    float sum = hsum512(acc) + _mm_cvtss_f32(_mm_movehl_ps(accm, accm));                        \
    if (i < nb) {                                                                               \
        const __m256i q = unpack_nibbles(w[i].qs);                                              \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);                         \
        const __m128 p = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                    \
        sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(dot4_256(q, y)), _mm256_broadcastss_ps(p))); \
        ;                                               \
    }                                                                                           \
    *s = sum;

/* Q8_0 x Q8_0: s8 x s8 as |w| (u8) x (y negated where w < 0) */
#define Q8_0_BODY(DOT4)                                                                         \
    const pi_block_q8_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    __m512 acc = _mm512_setzero_ps();                                                           \
    int64_t i = 0;                                                                              \
    for (; i + 2 <= nb; i += 2) {                                                               \
        const __m512i q = load2x32(w[i].qs, w[i + 1].qs);                                       \
        const __m512i y = load2x32(x[i].qs, x[i + 1].qs);                                       \
        const __m512i sy = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(q), _mm512_setzero_si512(), y); \
        const __m128 p0 = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                   \
        const __m128 p1 = _mm_mul_ps(load_halfs(&w[i + 1]), load_halfs(&x[i + 1]));           \
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(DOT4(_mm512_abs_epi8(q), sy)),                 \
                              scales2x(p0, p1), acc);                           \
    }                                                                                           \
    float sum = hsum512(acc);                                                                   \
    if (i < nb) {                                                                               \
        const __m256i q = _mm256_loadu_si256((const __m256i *)w[i].qs);                         \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);                         \
        const __m256i d4 = dot4_256(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q));                \
        const __m128 p = _mm_mul_ps(load_halfs(&w[i]), load_halfs(&x[i]));                    \
        sum += hsum256(_mm256_mul_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(p)));        \
    }                                                                                           \
    *s = sum;

#define DEFINE_QDOT(name, BODY)                                                                 \
    static void name##_bw(int64_t n, float *s, const void *vw, const void *vx) { BODY(dot4_bw) } \
    VNNI_TARGET static void name##_vnni(int64_t n, float *s, const void *vw, const void *vx) {   \
        BODY(dot4_vnni)                                                                         \
    }                                                                                           \
    static void name(int64_t n, float *s, const void *vw, const void *vx) {                     \
        if (has_vnni())                                                                         \
            name##_vnni(n, s, vw, vx);                                                          \
        else                                                                                    \
            name##_bw(n, s, vw, vx);                                                            \
    }

DEFINE_QDOT(vec_dot_q4_0, Q4_0_BODY)
DEFINE_QDOT(vec_dot_q4_1, Q4_1_BODY)
DEFINE_QDOT(vec_dot_q8_0, Q8_0_BODY)

/* ---- activation conversion ----------------------------------------------------- */

#define TRUNC (_MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)

/* round half away from zero: trunc(v) + trunc(2 * (v - trunc(v))), all exact */
static inline __m512 round_half_away(__m512 v) {
    const __m512 t = _mm512_roundscale_ps(v, TRUNC);
    const __m512 f = _mm512_sub_ps(v, t);
    return _mm512_add_ps(t, _mm512_roundscale_ps(_mm512_add_ps(f, f), TRUNC));
}

/* One block of 32 floats -> 32 int8 at q; returns d, and sum(q) through *sum */
static inline float quantize_block_q8(const float *x, int8_t *q, float *sum) {
    __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    v0 = round_half_away(_mm512_mul_ps(v0, id));
    v1 = round_half_away(_mm512_mul_ps(v1, id));
    if (sum) *sum = hsum512(_mm512_add_ps(v0, v1)); /* exact: small integers */
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v0)));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v1)));
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
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i),
                            _mm512_cvtps_ph(_mm512_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        _mm256_mask_storeu_epi16(y + i, m,
                                 _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + i),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

/* round to nearest even on the bits; NaN -> quiet NaN (as pi_fp32_to_bf16) */
static inline __m256i bf16_round(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(64));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(r, nan, qnan));
}

static void from_float_bf16(const float *x, void *vy, int64_t n) {
    uint16_t *y = vy;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), bf16_round(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 m = tail_mask16(n - i);
        _mm256_mask_storeu_epi16(y + i, m, bf16_round(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

static void from_float_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

const pi_isa pi_isa_avx512 = {
    .name = "avx512",
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
