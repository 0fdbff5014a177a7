/* 256-bit x86 code shared by avx2.c and avx512.c (both run these same loops).
 *
 * Include this header AFTER the including file's `#pragma GCC target(...)` and
 * <immintrin.h>: everything here is static inline and is compiled under that
 * file's target, so each .c file gets its own copy built for its own ISA (the
 * AVX-512 file's copies may use EVEX encodings). GCC defines __AVX2__, __FMA__
 * and __F16C__ from the pragma on, which is what the guard below checks.
 *
 * Quantized dot products: per block of 32 the 4-bit (or 8-bit) weights and the
 * int8 activations are multiplied as u8 x s8 into 8 int32 sums of 4 products
 * (maddubs + madd with ones, or AVX512-VNNI vpdpbusd in avx512.c), converted to
 * float and accumulated with one FMA against the broadcast block scale
 * d_w * d_x; one horizontal sum at the end. The bodies are macros taking that
 * dot helper, so avx512.c can expand them again under a VNNI target attribute.
 *
 * Block scales: a 16-byte load at the start of a block converted with vcvtph2ps
 * gives [d, m or s, junk...] (the junk lanes come from the quants and are never
 * read back), so one multiply yields [d_w*d_x, m_w*s_x]. Nothing reads past the
 * end of a block (or of a row: float tails are scalar or masked).
 *
 * The activation quantizers reproduce the scalar path bit for bit (d = amax/127,
 * id = 127/amax, round half to even: llama.cpp's x86 quantizers, so activation
 * bytes equal llama.cpp's).
 */
#ifndef PI_ISA_X86_256_H
#define PI_ISA_X86_256_H

#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "x86_256.h: include it after #pragma GCC target(\"avx2,fma,f16c\"...) and <immintrin.h>"
#endif

#include "pi_internal.h"

static inline float hsum256(__m256 v) {
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

/* u8 x s8 over 32 bytes, sums of 4 adjacent products -> 8 int32 (maddubs + madd) */
static inline __m256i dot4_256(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* dot4(a, s) - dot4(b, s) with one madd: the int16 pair sums of maddubs are
 * subtracted first (for Q4_0, a = nibbles and b = 8: neither pair sum saturates,
 * |2 * 15 * 128| < 2^15, and neither does their difference) */
static inline __m256i dot4_diff_256(__m256i a, __m256i b, __m256i s) {
    const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(a, s), _mm256_maddubs_epi16(b, s));
    return _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
}

/* dot4_256, as vpdpbusd where the including file's target has AVX512-VNNI (avx512_vnni.c):
 * the same exact int32 lanes (the pair sums of these types never saturate int16) */
static inline __m256i dot4(__m256i u, __m256i s) {
#ifdef __AVX512VNNI__
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return dot4_256(u, s);
#endif
}

/* -(the int32 quad sums) of int16 pair sums: the offset term of Q4_0 / Q5_0 (offset * y)
 * as the accumulator vpdpbusd adds q * y to */
static inline __m256i neg_quad_sums(__m256i p16) {
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* ---- F16 rows ------------------------------------------------------------------ */

/* The float operations of llama.cpp's ggml_vec_dot_f16 in its two x86 builds, run
 * by both x86 files (the scalar path has twins), so F16 rows (the F16 KV cache in
 * attention) give the same bits on every ISA and as llama.cpp on the same CPU
 * (select.c picks the order). Both FMA F16 products (exact in float) into four
 * accumulators and add the last n % STEP products (all of them when n < STEP) in
 * double. */
#define LD(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
/* x's 8 floats at element i: F16 converted, or (X32) floats that hold F16 values exactly
 * (the same floats, one conversion saved where x is shared by many rows) */
#define LDX(X32, x, i) ((X32) ? _mm256_loadu_ps((const float *)(x) + (i)) : LD((const uint16_t *)(x) + (i)))
#define XS(X32, x, i) ((X32) ? ((const float *)(x))[i] : _cvtsh_ss(((const uint16_t *)(x))[i]))

/* AVX-512 build (GGML_F16_STEP 64, EPR 16): four 16-lane accumulators, summed as
 * (A0 + A2) + (A1 + A3) and then by halves. Each 16-lane accumulator is kept as two
 * 256-bit halves, also in the AVX-512 build: as fast as 512-bit there (vcvtph2ps
 * bound) and ~8% faster inside pi_op_matmul, where it avoids 512-bit power-state
 * changes. */

static inline __attribute__((always_inline)) void f16_dot_step64(const int X32, int64_t n, float *s, const void *vw,
                                                                 const void *x) {
    const uint16_t *w = vw;
    __m256 a[8]; /* accumulator k: a[2k] lanes 0-7, a[2k+1] lanes 8-15 */
    for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
    const int64_t np = n & ~(int64_t)63;
    for (int64_t i = 0; i < np; i += 64)
        for (int k = 0; k < 8; k++) a[k] = _mm256_fmadd_ps(LD(w + i + 8 * k), LDX(X32, x, i + 8 * k), a[k]);
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7]));
    double sum = np > 0 ? hsum256(_mm256_add_ps(hi, lo)) : 0.0;
    for (int64_t i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * XS(X32, x, i));
    *s = (float)sum;
}
static inline void vec_dot_f16_step64(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step64(0, n, s, vw, vx);
}
static inline void vec_dot_f16f32_step64(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step64(1, n, s, vw, vx);
}

/* AVX2 build (GGML_F16_STEP 32, EPR 8): four 8-lane accumulators, summed as
 * (A0 + A2) + (A1 + A3), low + high 128 bits, then two hadds (GGML_F32x8_REDUCE). */
static inline __attribute__((always_inline)) void f16_dot_step32(const int X32, int64_t n, float *s, const void *vw,
                                                                 const void *x) {
    const uint16_t *w = vw;
    __m256 a[4];
    for (int k = 0; k < 4; k++) a[k] = _mm256_setzero_ps();
    const int64_t np = n & ~(int64_t)31;
    for (int64_t i = 0; i < np; i += 32)
        for (int k = 0; k < 4; k++) a[k] = _mm256_fmadd_ps(LD(w + i + 8 * k), LDX(X32, x, i + 8 * k), a[k]);
    const __m256 v = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t1 = _mm_hadd_ps(t0, t0);
    double sum = np > 0 ? (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1)) : 0.0;
    for (int64_t i = np; i < n; i++) sum += (double)(_cvtsh_ss(w[i]) * XS(X32, x, i));
    *s = (float)sum;
}
static inline void vec_dot_f16_step32(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step32(0, n, s, vw, vx);
}
static inline void vec_dot_f16f32_step32(int64_t n, float *s, const void *vw, const void *vx) {
    f16_dot_step32(1, n, s, vw, vx);
}
#undef LDX
#undef XS

/* the floats of n F16 values (exact) */
static void f16_floats_x86(const void *vh, float *f, int64_t n) {
    const uint16_t *h = vh;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, LD(h + i));
    for (; i < n; i++) f[i] = _cvtsh_ss(h[i]);
}
#undef LD
#define PI_F16_FLOATS f16_floats_x86

/* ---- quantized rows ------------------------------------------------------------ */
/* One accumulator, blocks in order, and for Q4_1 a fused m_w * s_x accumulation:
 * the float operations of llama.cpp's x86 vec_dot kernels (its AVX-512 builds run
 * the same 256-bit loops), so a row gives the same bits as llama.cpp on the same
 * activation bytes (checked against the installed libggml-cpu in the tests). A
 * second accumulator measured no faster here.
 *
 * Each X_BODY(...) is the body of a pi_vec_dot_fn (n, s, vw, vx) and takes the
 * int8 dot helper(s): dot4 / dot4_diff_256 above, or a VNNI difference (avx512.c). */
#define PI_QLOOP(BLOCK, DOT)                                                                    \
    __m256 acc = _mm256_setzero_ps();                                                           \
    for (int64_t i = 0; i < nb; i++) BLOCK(i, acc, DOT);                                        \
    const float sum = hsum256(acc);

/* Q4_0 x Q8_0: sum((q - 8) * y) = sum(q * y) - sum(8 * y); DOT_DIFF(a, b, y) is
 * dot4(a, y) - dot4(b, y) */
#define PI_Q4_0_BLOCK(k, a, DOT_DIFF)                                                           \
    do {                                                                                        \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[k].qs);                         \
        const __m256i d4 = DOT_DIFF(unpack_nibbles(w[k].qs), eight, y);                         \
        const __m128 d = _mm_mul_ps(load_halfs(&w[k]), load_halfs(&x[k]));                      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(d), a);               \
    } while (0)
#define PI_Q4_0_BODY(DOT_DIFF)                                                                  \
    const pi_block_q4_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    const __m256i eight = _mm256_set1_epi8(8);                                                  \
    PI_QLOOP(PI_Q4_0_BLOCK, DOT_DIFF)                                                           \
    *s = sum;

/* Q4_1 x Q8_1: d_w d_x sum(q * y) + m_w * s_x per block; lane 1 of accm is
 * fma(m_w, s_x, .) over the blocks */
#define PI_Q4_1_BLOCK(k, a, DOT)                                                                \
    do {                                                                                        \
        const __m256i d4 = DOT(unpack_nibbles(w[k].qs), _mm256_loadu_si256((const __m256i *)x[k].qs)); \
        const __m128 hw = load_halfs(&w[k]), hx = load_halfs(&x[k]); /* [d, m], [d, s] */      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(_mm_mul_ps(hw, hx)), a); \
        accm = _mm_fmadd_ps(hw, hx, accm);                                                      \
    } while (0)
#define PI_Q4_1_BODY(DOT)                                                                       \
    const pi_block_q4_1 *w = vw;                                                                \
    const pi_block_q8_1 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    __m128 accm = _mm_setzero_ps();                                                             \
    PI_QLOOP(PI_Q4_1_BLOCK, DOT)                                                                \
    *s = sum + _mm_cvtss_f32(_mm_movehdup_ps(accm));

/* Q8_0 x Q8_0: s8 x s8 as |w| (u8) x (y with the sign of w) */
#define PI_Q8_0_BLOCK(k, a, DOT)                                                                \
    do {                                                                                        \
        const __m256i q = load_reg256(w[k].qs);                                                 \
        const __m256i d4 = DOT(_mm256_abs_epi8(q), _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[k].qs), q)); \
        const __m128 d = _mm_mul_ps(load_halfs(&w[k]), load_halfs(&x[k]));                      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(d), a);               \
    } while (0)
#define PI_Q8_0_BODY(DOT)                                                                       \
    const pi_block_q8_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    PI_QLOOP(PI_Q8_0_BLOCK, DOT)                                                                \
    *s = sum;

/* Q5_0 x Q8_0: the nibbles with bit 4 from qh, then as Q4_0 with offset 16.
 * qh bit j -> byte j: byte j of the broadcast word picks qh byte j / 8, and ORing
 * every bit but j % 8 makes the bytes whose bit is set all-ones (AVX-512: qh as a mask). */
static inline __m256i q5_0_bytes(const pi_block_q5_0 *b) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
#if defined(__AVX512BW__) && defined(__AVX512VL__) /* qh is the byte mask: one masked add */
    const __m256i q = unpack_nibbles(b->qs);
    return _mm256_mask_add_epi8(q, (__mmask32)qh, q, _mm256_set1_epi8(0x10));
#else
    const __m256i pick = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh),
                                             _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                0x0303030303030303LL));
    const __m256i others = _mm256_set1_epi64x((long long)0x7FBFDFEFF7FBFDFEULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(pick, others), _mm256_set1_epi8(-1));
    return _mm256_or_si256(unpack_nibbles(b->qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
#endif
}
#define PI_Q5_0_BLOCK(k, a, DOT_DIFF)                                                           \
    do {                                                                                        \
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[k].qs);                         \
        const __m256i d4 = DOT_DIFF(q5_0_bytes(&w[k]), sixteen, y);                             \
        const __m128 d = _mm_mul_ps(load_halfs(&w[k]), load_halfs(&x[k]));                      \
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(d), a);               \
    } while (0)
#define PI_Q5_0_BODY(DOT_DIFF)                                                                  \
    const pi_block_q5_0 *w = vw;                                                                \
    const pi_block_q8_0 *x = vx;                                                                \
    const int64_t nb = n / PI_QK;                                                               \
    const __m256i sixteen = _mm256_set1_epi8(16);                                               \
    PI_QLOOP(PI_Q5_0_BLOCK, DOT_DIFF)                                                           \
    *s = sum;

/* ---- K-quants x Q8_K -------------------------------------------------------------- */
/* Per super-block the weights are unpacked to unsigned bytes (Q6_K: value + 32),
 * multiplied with the int8 activations by maddubs (int16 pair sums cannot
 * saturate: 2 * 63 * 127 < 2^15) and madd'ed with the chunk's int16 scale into 8
 * exact int32 lanes; one FMA per super-block adds them with d = d_x * d_w. This is
 * the float order of llama.cpp's AVX2 kernels and of scalar.c. */

/* int16 scale vector: the low 16 bytes' pairs get lo, the high ones hi */
static inline __m256i scale_pair16(int lo, int hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16((short)lo)), _mm_set1_epi16((short)hi), 1);
}

/* unpacked Q4_K / Q5_K scales and mins (see pi_k4_scale_min), from 32-bit words */
static inline void k4_scales(const uint8_t *scales, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a, b, c;
    memcpy(&a, scales, 4);
    memcpy(&b, scales + 4, 4);
    memcpy(&c, scales + 8, 4);
    const uint32_t s_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
    const uint32_t s_hi = (c & 0x0F0F0F0Fu) | ((a >> 6) & 0x03030303u) << 4;
    const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 6) & 0x03030303u) << 4;
    memcpy(sc, &s_lo, 4);
    memcpy(sc + 4, &s_hi, 4);
    memcpy(mn, &m_lo, 4);
    memcpy(mn + 4, &m_hi, 4);
}

/* the 8 activation sums of 32-element chunks (int16) from a Q8_K block's bsums */
static inline __m128i k4_chunk_sums(const int16_t *bsums) {
    return _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bsums), _mm_loadu_si128((const __m128i *)(bsums + 8)));
}

/* the 8 mins as int16 */
static inline __m128i k4_mins16(const uint8_t mn[8]) {
    uint64_t m8;
    memcpy(&m8, mn, 8);
    return _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)m8));
}

/* min term lanes (4 int32): mins[2m] * chunk sum 2m + mins[2m+1] * chunk sum 2m+1 */
static inline __m128i k4_min_lanes(const uint8_t mn[8], const int16_t *bsums) {
    return _mm_madd_epi16(k4_mins16(mn), k4_chunk_sums(bsums));
}

/* the four min lanes summed: Q5_K's exact integer min term */
static inline int32_t k4_min_isum(__m128i m4l) {
    m4l = _mm_add_epi32(m4l, _mm_unpackhi_epi64(m4l, m4l));
    return _mm_cvtsi128_si32(m4l) + _mm_extract_epi32(m4l, 1);
}

/* the horizontal sum of the four min lanes of Q4_K */
static inline float k4_min_hsum(__m128 accm) {
    accm = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    accm = _mm_add_ss(accm, _mm_movehdup_ps(accm));
    return _mm_cvtss_f32(accm);
}

/* acc + 32 quants (unsigned bytes) x 32 activations, the int16 pair sums times an int16
 * scale vector: vpdpwssd (AVX512-VNNI, avx512_vnni.c) fuses the madd and the add; the same
 * exact int32 lanes either way (no sum here nears int32's range) */
static inline __m256i k_dot_acc(__m256i acc, __m256i q, __m256i y, __m256i scale) {
    const __m256i p = _mm256_maddubs_epi16(q, y);
#ifdef __AVX512VNNI__
    return _mm256_dpwssd_epi32(acc, p, scale);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale));
#endif
}
static inline __m256i k_chunk_acc(__m256i acc, __m256i q, const int8_t *y, __m256i scale) {
    return k_dot_acc(acc, q, _mm256_loadu_si256((const __m256i *)y), scale);
}

static inline void vec_dot_q4_K(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q4_K *w = vw;
    const pi_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(w[i].scales, sc, mn);
        const float d = x[i].d * pi_fp16_to_fp32(w[i].d), dmin = -x[i].d * pi_fp16_to_fp32(w[i].dmin);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_min_lanes(mn, x[i].bsums)), accm);
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * g));
            sumi = k_chunk_acc(sumi, _mm256_and_si256(bits, m4), x[i].qs + 64 * g, _mm256_set1_epi16(sc[2 * g]));
            sumi = k_chunk_acc(sumi, _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), x[i].qs + 64 * g + 32,
                               _mm256_set1_epi16(sc[2 * g + 1]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum256(acc) + k4_min_hsum(accm);
}

static inline void vec_dot_q5_K(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q5_K *w = vw;
    const pi_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        k4_scales(w[i].scales, sc, mn);
        const float d = x[i].d * pi_fp16_to_fp32(w[i].d), dmin = -x[i].d * pi_fp16_to_fp32(w[i].dmin);
        /* the min term as one exact integer per super-block (see scalar.c) */
        summs = fmaf(dmin, (float)k4_min_isum(k4_min_lanes(mn, x[i].bsums)), summs);
        const __m256i hb = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * g));
            /* bit 2g of each qh byte is the fifth bit of the low-nibble chunk, 2g + 1 of the high one */
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4);
            sumi = k_chunk_acc(sumi, _mm256_or_si256(_mm256_and_si256(bits, m4), h0), x[i].qs + 64 * g,
                               _mm256_set1_epi16(sc[2 * g]));
            sumi = k_chunk_acc(sumi, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h1),
                               x[i].qs + 64 * g + 32, _mm256_set1_epi16(sc[2 * g + 1]));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum256(acc) + summs;
}

/* Q6_K: lanes over the unsigned 6-bit values q, then per lane l the offset
 * 32 * (scale * activation sum) of the two 16-element groups of chunk l subtracted
 * (the lane split of llama.cpp's AVX2 kernel; see scalar.c) */
static inline void vec_dot_q6_K(int64_t n, float *s, const void *vw, const void *vx) {
    const pi_block_q6_K *w = vw;
    const pi_block_q8_K *x = vx;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        const float d = x[i].d * pi_fp16_to_fp32(w[i].d);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h));
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(w[i].ql + 64 * h + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
            const int8_t *sc = w[i].scales + 8 * h;
            for (int c = 0; c < 4; c++) {
                sumi = k_chunk_acc(sumi, q[c], x[i].qs + 128 * h + 32 * c, scale_pair16(sc[2 * c], sc[2 * c + 1]));
            }
        }
        const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x[i].bsums),
                                              _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales)));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    *s = hsum256(acc);
}

/* ---- activation conversion ----------------------------------------------------- */
/* The Q8 quantizers run once per matmul right before the 256-bit dot kernels, so
 * they stay 256-bit in the AVX-512 build too: mixing in 512-bit instructions
 * measured ~1 us more per pi_op_matmul call (the core changes its AVX-512 power
 * state each time). */

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

static inline void from_float_q8_0(const float *x, void *vy, int64_t n) {
    pi_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const float d = quantize_block_q8(x + i * PI_QK, y[i].qs, NULL);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
    }
}

static inline void from_float_q8_1(const float *x, void *vy, int64_t n) {
    pi_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / PI_QK; i++) {
        float sum;
        const float d = quantize_block_q8(x + i * PI_QK, y[i].qs, &sum);
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh(sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}

/* Q8_K, byte for byte as pi_quantize_row_q8_K (ops/convert.c, the scalar path's): vmax is
 * the first element of largest magnitude (NaNs never win: max_ps returns its second
 * operand, the running maximum, when the first is NaN), iscale = -127 / vmax, q the
 * magic-number rounding of iscale * x as an integer capped at 127 and truncated to its low
 * byte, d = 1 / iscale; bsums from sums of biased bytes (sad against zero). */
static inline void from_float_q8_K(const float *x, void *vy, int64_t n) {
    pi_block_q8_K *y = vy;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    for (int64_t b = 0; b < n / PI_QK_K; b++, x += PI_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int k = 0; k < PI_QK_K; k += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), absmask), m);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const __m256 va = _mm256_set1_ps(amax);
        int j = 0;
        for (int k = 0; k < PI_QK_K; k += 8) {
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), absmask), va, _CMP_EQ_OQ));
            if (hit) {
                j = k + __builtin_ctz((unsigned)hit);
                break;
            }
        }
        const float iscale = -127.0f / x[j];
        const __m256 vs = _mm256_set1_ps(iscale), magic = _mm256_set1_ps(12582912.0f);
        const __m256i mant = _mm256_set1_epi32(0x007FFFFF), bias = _mm256_set1_epi32(0x00400000);
        const __m256i cap = _mm256_set1_epi32(127), low = _mm256_set1_epi32(0xFF);
        for (int k = 0; k < PI_QK_K; k += 32) {
            __m256i v[4];
            for (int u = 0; u < 4; u++) {
                const __m256 t = _mm256_add_ps(_mm256_mul_ps(vs, _mm256_loadu_ps(x + k + 8 * u)), magic);
                const __m256i q = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(t), mant), bias);
                v[u] = _mm256_and_si256(_mm256_min_epi32(q, cap), low); /* (int8_t) keeps the low byte */
            }
            const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(v[0], v[1]), _mm256_packus_epi32(v[2], v[3]));
            const __m256i q8 = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(y[b].qs + k), q8);
            /* sums of 8 bytes biased by 128 */
            uint64_t s[4];
            _mm256_storeu_si256((__m256i *)s,
                                _mm256_sad_epu8(_mm256_xor_si256(q8, _mm256_set1_epi8(-128)), _mm256_setzero_si256()));
            y[b].bsums[k / 16] = (int16_t)((int)(s[0] + s[1]) - 16 * 128);
            y[b].bsums[k / 16 + 1] = (int16_t)((int)(s[2] + s[3]) - 16 * 128);
        }
        y[b].d = 1.0f / iscale;
    }
}

static inline void from_float_f32(const float *x, void *y, int64_t n) { memcpy(y, x, (size_t)n * sizeof(float)); }

/* ---- SiLU (isa/ffn_act.h): 8 lanes of sl_silu_w8, the same operation per lane ---------- */

#include "ffn_act.h"

/* exp(x) of sm_expf_w8 where no lane has |n| > 126 (*slow = 0), else *slow = 1 */
static inline __m256 silu_exp8(__m256 x, int *slow) {
    const __m256 shift = _mm256_set1_ps(SM_SHIFT);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(SM_LOG2E), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(SM_LN2_LO),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(SM_LN2_HI), x));
    const __m256 k = _mm256_castsi256_ps(
        _mm256_add_epi32(_mm256_slli_epi32(_mm256_castps_si256(z), 23), _mm256_set1_epi32(0x3f800000)));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 hi = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(SM_C5), b, _mm256_set1_ps(SM_C4)),
                                      u, _mm256_fmadd_ps(_mm256_set1_ps(SM_C3), b, _mm256_set1_ps(SM_C2)));
    const __m256 j = _mm256_fmadd_ps(hi, u, _mm256_mul_ps(_mm256_set1_ps(SM_C1), b));
    const __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    *slow = _mm256_movemask_ps(big);
    return _mm256_fmadd_ps(j, k, k);
}

static void silu_mul_w8_x86(const float *g, const float *u, float *h, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        int slow;
        const __m256 e = silu_exp8(_mm256_sub_ps(_mm256_setzero_ps(), x), &slow);
        if (slow) { /* a lane beyond 2^+-126: this chunk by the lane function (the same bits) */
            sl_silu_mul_from(g, u, h, i + 8, i, sl_silu_w8);
            continue;
        }
        const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(h + i, u != NULL ? _mm256_mul_ps(s, _mm256_loadu_ps(u + i)) : s);
    }
    sl_silu_mul_from(g, u, h, n, i, sl_silu_w8);
}
#define PI_SILU_MUL_W8 silu_mul_w8_x86

/* gl_gelu16 8 lanes at a time: F16C's rounding to F16 is pi_fp32_to_fp16's for finite x */
static void gelu16_mul_x86(const float *tab, const float *g, const float *u, float *h, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256i k = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256 a = _mm256_i32gather_ps(tab, k, 4);
        a = _mm256_blendv_ps(a, x, _mm256_cmp_ps(x, _mm256_set1_ps(10.0f), _CMP_GE_OQ));
        a = _mm256_blendv_ps(a, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-10.0f), _CMP_LE_OQ));
        _mm256_storeu_ps(h + i, u != NULL ? _mm256_mul_ps(a, _mm256_loadu_ps(u + i)) : a);
    }
    gl_gelu16_mul_from(tab, g, u, h, n, i);
}
#define PI_GELU16_MUL gelu16_mul_x86

#endif /* PI_ISA_X86_256_H */
