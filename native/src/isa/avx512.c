/* AVX-512 (F/BW/VL/DQ) kernels, with AVX512-VNNI variants of the quantized dot
 * products chosen at run time where the CPU has it.
 *
 * Quantized dot products use 256-bit registers, one block per step (see the note
 * above them); with VNNI, vpdpbusd replaces maddubs + madd. Block scales come from
 * a 16-byte load at the block start converted with vcvtph2ps: [d, m or s, junk...]
 * (the junk lanes come from the quants and are never read back).
 *
 * F32 and BF16 rows: 4 x 16 lanes per iteration, masked loads for the tail, and
 * first one masked step that aligns the weight stream to 64 bytes (GGUF rows are
 * only 32-byte aligned, and line-splitting 64-byte loads cost ~20% when streaming).
 * F16 rows (in llama.cpp's order, see there) and the F16 / Q8 activation
 * converters stay 256-bit: 512-bit bought nothing there and cost time inside
 * pi_op_matmul.
 * The activation quantizers reproduce the scalar path bit for bit.
 */
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "pi_internal.h"

#define VNNI_TARGET __attribute__((target("avx512vnni")))
#define NOINLINE __attribute__((noinline))

/* VNNI kernels where the CPU has them, unless POWERINFER_VNNI=0 (used by the tests
 * to cover the AVX512BW expansion on VNNI hosts), decided once per process. */
static _Atomic int g_vnni = -1;

NOINLINE static int detect_vnni(void) {
    __builtin_cpu_init();
    const char *e = getenv("POWERINFER_VNNI");
    const int v = __builtin_cpu_supports("avx512vnni") && !(e != NULL && e[0] == '0');
    atomic_store_explicit(&g_vnni, v, memory_order_relaxed);
    return v;
}

static inline int has_vnni(void) {
    const int v = atomic_load_explicit(&g_vnni, memory_order_relaxed);
    return v >= 0 ? v : detect_vnni();
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

/* 32 bytes kept in a register: without the empty asm the compiler folds the load
 * into each of its two users and reads the (often line-splitting) bytes twice */
static inline __m256i load_reg256(const void *p) {
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    __asm__("" : "+x"(v));
    return v;
}

/* u8 x s8, sums of 4 adjacent products -> int32 (AVX2 / AVX512BW shape) */
static inline __m256i dot4_256(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* ---- float rows ---------------------------------------------------------------- */

static void vec_dot_f32(int64_t n, float *s, const void *vw, const void *vx) {
    const float *w = vw, *x = vx;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    /* align the weight stream to 64 bytes: a masked first step of up to 15 floats */
    const uintptr_t mis = (uintptr_t)w & 63;
    if (mis != 0 && (mis & 3) == 0 && n >= 64) {
        const __mmask16 m = tail_mask16((int64_t)(64 - mis) / 4);
        a3 = _mm512_maskz_mul_ps(m, _mm512_maskz_loadu_ps(m, w), _mm512_maskz_loadu_ps(m, x));
        i = (int64_t)(64 - mis) / 4;
    }
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

/* The float operations of llama.cpp's AVX-512 ggml_vec_dot_f16, so attention over an
 * F16 cache can round exactly as llama.cpp does: four 16-lane accumulators over
 * 64-element steps, summed as (A0 + A2) + (A1 + A3) and then by halves; the last
 * n % 64 products (all of them when n < 64) are added in double. Each 16-lane
 * accumulator is kept as two 256-bit halves: as fast as 512-bit here (vcvtph2ps
 * bound) and ~8% faster inside pi_op_matmul, where it avoids 512-bit power-state
 * changes. */
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
    double sum = np > 0 ? hsum256(_mm256_add_ps(hi, lo)) : 0.0;
    for (int64_t i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * _cvtsh_ss(x[i]));
    *s = (float)sum;
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
    /* align the weight stream to 64 bytes: up to 31 values first */
    const uintptr_t mis = (uintptr_t)w & 63;
    if (mis != 0 && (mis & 1) == 0 && n >= 128) {
        const __mmask32 m = tail_mask32((int64_t)(64 - mis) / 2);
        const __m512i w0 = _mm512_maskz_loadu_epi16(m, w), x0 = _mm512_maskz_loadu_epi16(m, x);
        a2 = _mm512_mul_ps(LO(w0), LO(x0));
        a3 = _mm512_mul_ps(HI(w0), HI(x0));
        i = (int64_t)(64 - mis) / 2;
    }
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
/* 256-bit registers, one block per step. Measured on a
 * Sapphire/Granite Rapids class host, taking two blocks per 512-bit register was
 * slower for all three types (the per-block scale work does not shrink and 512-bit
 * uops only issue on two ports), so the AVX-512 gain here is VNNI: vpdpbusd
 * replaces maddubs + madd. Each body is a macro expanded for both dot helpers;
 * the VNNI expansion is compiled under its own target attribute and chosen at run
 * time. */

VNNI_TARGET static inline __m256i dot4_vnni(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

/* One accumulator, blocks in order, and for Q4_1 a fused m_w * s_x accumulation:
 * the float operations of llama.cpp's x86 vec_dot kernels (its AVX-512 builds run
 * the same 256-bit loops), so a row gives the same bits as llama.cpp on the same
 * activation bytes. A second accumulator measured no faster here. */
#define QLOOP(BLOCK, DOT)                                                                       \
    __m256 acc = _mm256_setzero_ps();                                                           \
    for (int64_t i = 0; i < nb; i++) BLOCK(i, acc, DOT);                                        \
    const float sum = hsum256(acc);

/* Q4_0 x Q8_0: sum((q - 8) * y) = sum(q * y) - sum(8 * y) */
#define Q4_0_BLOCK(k, a, DOT)                                                                   \
    do {                                                                                        \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[k].qs);                         \
        const __m256i d4 = _mm256_sub_epi32(DOT(unpack_nibbles(w[k].qs), y), DOT(eight, y));    \
        const __m128 d = _mm_mul_ps(load_halfs(&w[k]), load_halfs(&x[k]));                      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(d), a);               \
    } while (0)
#define Q4_0_BODY(DOT)                                                                          \
    const pi_block_q4_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    const __m256i eight = _mm256_set1_epi8(8);                                                  \
    QLOOP(Q4_0_BLOCK, DOT)                                                                      \
    *s = sum;

/* Q4_1 x Q8_1: d_w d_x sum(q * y) + m_w * s_x per block; lane 1 of accm is
 * fma(m_w, s_x, .) over the blocks */
#define Q4_1_BLOCK(k, a, DOT)                                                                   \
    do {                                                                                        \
        const __m256i d4 = DOT(unpack_nibbles(w[k].qs), _mm256_loadu_si256((const __m256i *)x[k].qs)); \
        const __m128 hw = load_halfs(&w[k]), hx = load_halfs(&x[k]); /* [d, m], [d, s] */      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(_mm_mul_ps(hw, hx)), a); \
        accm = _mm_fmadd_ps(hw, hx, accm);                                                      \
    } while (0)
#define Q4_1_BODY(DOT)                                                                          \
    const pi_block_q4_1 *w = vw;                                                                \
    const pi_block_q8_1 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    __m128 accm = _mm_setzero_ps();                                                             \
    QLOOP(Q4_1_BLOCK, DOT)                                                                      \
    *s = sum + _mm_cvtss_f32(_mm_movehdup_ps(accm));

/* Q8_0 x Q8_0: s8 x s8 as |w| (u8) x (y with the sign of w) */
#define Q8_0_BLOCK(k, a, DOT)                                                                   \
    do {                                                                                        \
        const __m256i q = load_reg256(w[k].qs);                                                 \
        const __m256i d4 = DOT(_mm256_abs_epi8(q), _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[k].qs), q)); \
        const __m128 d = _mm_mul_ps(load_halfs(&w[k]), load_halfs(&x[k]));                      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(d), a);               \
    } while (0)
#define Q8_0_BODY(DOT)                                                                          \
    const pi_block_q8_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    QLOOP(Q8_0_BLOCK, DOT)                                                                      \
    *s = sum;

/* noinline keeps the dispatcher a load, a branch and a tail jump */
#define DEFINE_QDOT(name, BODY)                                                                 \
    NOINLINE static void name##_bw(int64_t n, float *s, const void *vw, const void *vx) {        \
        BODY(dot4_256)                                                                          \
    }                                                                                           \
    NOINLINE VNNI_TARGET static void name##_vnni(int64_t n, float *s, const void *vw, const void *vx) { \
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

/* The Q8 quantizers run once per matmul right before the 256-bit dot kernels, so
 * they stay 256-bit too: mixing in 512-bit instructions measured ~1 us more per
 * pi_op_matmul call (the core changes its AVX-512 power state each time). */

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
    if (sum) *sum = hsum256(_mm256_add_ps(_mm256_add_ps(v0, v1), _mm256_add_ps(v2, v3))); /* exact */
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
    if (i < n) {
        const __mmask8 m = (__mmask8)((1u << (n - i)) - 1u);
        _mm_mask_storeu_epi16(y + i, m, _mm256_cvtps_ph(_mm256_maskz_loadu_ps(m, x + i), _MM_FROUND_TO_NEAREST_INT));
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
