/* AVX-512 (F/BW/VL/DQ) kernels; avx512_vnni.c compiles this file again with AVX512-VNNI
 * (PI_ISA_AVX512_VNNI), where vpdpbusd / vpdpwssd replace maddubs + madd in the quantized
 * products (select.c picks that table where the CPU has VNNI).
 *
 * Quantized dot products use 256-bit registers, one block per step (see the note
 * above them). Block scales come from
 * a 16-byte load at the block start converted with vcvtph2ps: [d, m or s, junk...]
 * (the junk lanes come from the quants and are never read back).
 *
 * F32 and BF16 rows: 4 x 16 lanes per iteration, masked loads for the tail, and
 * first one masked step that aligns the weight stream to 64 bytes (GGUF rows are
 * only 32-byte aligned, and line-splitting 64-byte loads cost ~20% when streaming).
 * F16 rows (in llama.cpp's order) and the F16 / Q8 activation converters stay
 * 256-bit: 512-bit bought nothing there and cost time inside pi_op_matmul. That
 * 256-bit code is shared with avx2.c through x86_256.h, compiled here under this
 * file's target; the activation quantizers reproduce the scalar path bit for bit.
 */
#ifdef PI_ISA_AVX512_VNNI
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512vnni")
#else
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#endif
#include <immintrin.h>

#include "pi_internal.h"
#include "x86_256.h" /* after the pragma: compiled for this file's target */
#define PI_TILE_R 2 /* tile rows x tokens (32 ymm registers) */
#define PI_TILE_T 8
/* measured on a 2-core Zen 4 EPYC (prefill of Qwen2.5-Coder 0.5B / 1.5B, SmolLM2 as Q4_0):
 * 2 rows per tile for the blocks of 32, 1 for the K-quants (8% faster than 2 there) */
#define PI_TILES_K 1, 8      /* Q4_K, Q5_K, Q6_K */
#define PI_TILES_WIDE 2, 8   /* Q5_0, Q8_0 */
#define PI_TILES_NIBBLE 2, 8 /* Q4_0, Q4_1 */
#include "x86_tiles.h"
#include "x86_gemv.h"
#include "x86_groups.h"

/* 16 lanes of sl_silu_w16 (isa/ffn_act.h), the same operations per lane: ldexpf(j, n) is
 * scalef(j, n) for the |n| <= 192 kept (both one rounding), 0 or inf beyond */
static void silu_mul_w16_avx512(const float *g, const float *u, float *h, int64_t n) {
    const __m512 shift = _mm512_set1_ps(SM_SHIFT), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(g + i), nx = _mm512_sub_ps(_mm512_setzero_ps(), x);
        const __m512 z = _mm512_fmadd_ps(nx, _mm512_set1_ps(SM_LOG2E), shift);
        const __m512 m = _mm512_sub_ps(z, shift);
        const __m512 b = _mm512_fnmadd_ps(m, _mm512_set1_ps(SM_LN2_LO),
                                          _mm512_fnmadd_ps(m, _mm512_set1_ps(SM_LN2_HI), nx));
        const __m512 q = _mm512_mul_ps(b, b);
        const __m512 hi =
            _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(SM_C5), b, _mm512_set1_ps(SM_C4)), q,
                            _mm512_fmadd_ps(_mm512_set1_ps(SM_C3), b, _mm512_set1_ps(SM_C2)));
        const __m512 j = _mm512_fmadd_ps(hi, q, _mm512_fmadd_ps(_mm512_set1_ps(SM_C1), b, one));
        __m512 e = _mm512_scalef_ps(j, m);
        const __mmask16 big = _mm512_cmp_ps_mask(_mm512_abs_ps(m), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
        if (big) {
            const __mmask16 neg = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_LE_OQ);
            e = _mm512_mask_blend_ps(big, e, _mm512_mask_blend_ps(neg, _mm512_set1_ps(INFINITY), _mm512_setzero_ps()));
        }
        const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
        _mm512_storeu_ps(h + i, u != NULL ? _mm512_mul_ps(s, _mm512_loadu_ps(u + i)) : s);
    }
    sl_silu_mul_from(g, u, h, n, i, sl_silu_w16);
}
#define PI_SILU_MUL_W16 silu_mul_w16_avx512

#include "table.h"

static inline float hsum512(__m512 v) {
    return hsum256(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}

static inline __mmask16 tail_mask16(int64_t r) { return (__mmask16)((1u << r) - 1u); }       /* r < 16 */
static inline __mmask32 tail_mask32(int64_t r) { return (__mmask32)((1ull << r) - 1ull); } /* r < 32 */

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
 * replaces maddubs + madd (the same exact int32 lanes: no pair sum of these types
 * reaches int16 saturation). The bodies (PI_*_BODY, with the notes on their float
 * order) are in x86_256.h, expanded with this file's dot helpers. */
#ifdef __AVX512VNNI__
/* dot4(a, s) - dot4(b, s): vpdpbusd has no int16 step to subtract in */
static inline __m256i dot4_diff_vnni(__m256i a, __m256i b, __m256i s) { return _mm256_sub_epi32(dot4(a, s), dot4(b, s)); }
#define DOT4_DIFF dot4_diff_vnni
#else
#define DOT4_DIFF dot4_diff_256
#endif

static void vec_dot_q4_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q4_0_BODY(DOT4_DIFF) }
static void vec_dot_q4_1(int64_t n, float *s, const void *vw, const void *vx) { PI_Q4_1_BODY(dot4) }
static void vec_dot_q8_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q8_0_BODY(dot4) }
static void vec_dot_q5_0(int64_t n, float *s, const void *vw, const void *vx) { PI_Q5_0_BODY(DOT4_DIFF) }
/* K-quants: vec_dot_q4_K / q5_K / q6_K in x86_256.h */

/* ---- activation conversion ----------------------------------------------------- */

/* Q8_0 / Q8_1: from_float_q8_0 / from_float_q8_1 in x86_256.h (256-bit, see there) */

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

#ifdef PI_ISA_AVX512_VNNI
PI_ISA_DEFINE(pi_isa_avx512_vnni, "avx512vnni", pi_down_tiles_avx2, pi_down_batch_avx2);
#else
PI_ISA_DEFINE(pi_isa_avx512, "avx512", pi_down_tiles_avx2, pi_down_batch_avx2);
#endif
