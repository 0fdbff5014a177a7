/* AVX2 + F16C down accumulation of the sparse FFN (pi_isa.down_tiles; ops/sparse_ffn.c
 * has the portable loop), used by the avx2 and avx512 paths.
 *
 * Each tile of a row is dequantized exactly (F16 -> F32 is exact; a Q8_0 or Q4_0 weight
 * q*d is exact in float), then acc = acc + h * w with a separate multiply and add. This
 * file's target has no "fma", and the library is compiled in ISO C mode, where GCC does
 * not contract a*b+c, so the bits equal the portable loop's. */
#pragma GCC target("avx2,f16c")
#include <immintrin.h>

#include "pi_internal.h"

#define TILE PI_DOWN_TILE

/* q: 8 int8 lanes in the low 64 bits -> 8 floats */
static inline __m256 i8x8_to_ps(__m128i q) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)); }

#define ACC4(W0, W1, W2, W3)                                  \
    do {                                                      \
        a0 = _mm256_add_ps(a0, _mm256_mul_ps(hv, (W0)));      \
        a1 = _mm256_add_ps(a1, _mm256_mul_ps(hv, (W1)));      \
        a2 = _mm256_add_ps(a2, _mm256_mul_ps(hv, (W2)));      \
        a3 = _mm256_add_ps(a3, _mm256_mul_ps(hv, (W3)));      \
    } while (0)

void pi_down_tiles_avx2(int32_t type, int64_t n_tiles, float *y, const char *const *rows, const float *h, int nr,
                        const char *const *next, int n_next) {
    const int64_t tb = pi_row_size(type, TILE); /* bytes of a tile of one row */
    for (int64_t b = 0; b < n_tiles; b++) {
        float *yb = y + b * TILE;
        for (int r = 0; r < n_next; r++) pi_prefetch_bytes(next[r] + b * tb, tb);
        __m256 a0 = _mm256_loadu_ps(yb), a1 = _mm256_loadu_ps(yb + 8);
        __m256 a2 = _mm256_loadu_ps(yb + 16), a3 = _mm256_loadu_ps(yb + 24);
        switch (type) {
        case PI_TYPE_F32:
            for (int r = 0; r < nr; r++) {
                const float *p = (const float *)rows[r] + b * TILE;
                const __m256 hv = _mm256_set1_ps(h[r]);
                ACC4(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 16),
                     _mm256_loadu_ps(p + 24));
            }
            break;
        case PI_TYPE_F16:
            for (int r = 0; r < nr; r++) {
                const __m128i *p = (const __m128i *)((const uint16_t *)rows[r] + b * TILE);
                const __m256 hv = _mm256_set1_ps(h[r]);
                ACC4(_mm256_cvtph_ps(_mm_loadu_si128(p)), _mm256_cvtph_ps(_mm_loadu_si128(p + 1)),
                     _mm256_cvtph_ps(_mm_loadu_si128(p + 2)), _mm256_cvtph_ps(_mm_loadu_si128(p + 3)));
            }
            break;
        case PI_TYPE_Q8_0:
            for (int r = 0; r < nr; r++) {
                const pi_block_q8_0 *q = (const pi_block_q8_0 *)rows[r] + b;
                const __m256 d = _mm256_set1_ps(pi_fp16_to_fp32(q->d));
                const __m128i lo = _mm_loadu_si128((const __m128i *)q->qs);
                const __m128i hi = _mm_loadu_si128((const __m128i *)(q->qs + 16));
                const __m256 hv = _mm256_set1_ps(h[r]);
                ACC4(_mm256_mul_ps(i8x8_to_ps(lo), d), _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), d),
                     _mm256_mul_ps(i8x8_to_ps(hi), d), _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), d));
            }
            break;
        default: /* Q4_0: element i in the low nibble of qs[i], element i+16 in the high one */
            for (int r = 0; r < nr; r++) {
                const pi_block_q4_0 *q = (const pi_block_q4_0 *)rows[r] + b;
                const __m256 d = _mm256_set1_ps(pi_fp16_to_fp32(q->d));
                const __m128i raw = _mm_loadu_si128((const __m128i *)q->qs);
                const __m128i m4 = _mm_set1_epi8(0x0F), e8 = _mm_set1_epi8(8);
                const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), e8);
                const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), e8);
                const __m256 hv = _mm256_set1_ps(h[r]);
                ACC4(_mm256_mul_ps(i8x8_to_ps(lo), d), _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(lo, 8)), d),
                     _mm256_mul_ps(i8x8_to_ps(hi), d), _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(hi, 8)), d));
            }
            break;
        }
        _mm256_storeu_ps(yb, a0);
        _mm256_storeu_ps(yb + 8, a1);
        _mm256_storeu_ps(yb + 16, a2);
        _mm256_storeu_ps(yb + 24, a3);
    }
}
