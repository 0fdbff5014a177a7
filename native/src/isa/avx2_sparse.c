/* AVX2 + F16C down accumulation of the sparse FFN (pi_isa.down_tiles; ops/sparse_ffn.c
 * has the portable loop) and its batched form (pi_isa.down_batch; ops/sparse_down_batch.c),
 * used by the avx2 and avx512 paths.
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

/* ---- the batched form (pi_down_batch_fn) ------------------------------------------ */

#define AI static inline __attribute__((always_inline))
#define STRIP 16 /* columns of a register tile: 2 vectors */

/* 16 columns (half 0: 0-15 of each row's 32-block, 1: 16-31) of nk rows, exactly, into buf
 * (16 floats a row, with the ops of the per-token kernel); returns whether every d is finite */
static int dequant_strip(int32_t type, const char *w, int64_t wrow, int half, int64_t nk, float *buf) {
    int finite = 1;
    for (int64_t r = 0; r < nk; r++) {
        const char *row = w + r * wrow;
        uint16_t d16;
        memcpy(&d16, row, sizeof d16); /* both block types begin with d */
        finite &= (d16 & 0x7C00) != 0x7C00;
        const __m256 d = _mm256_set1_ps(pi_fp16_to_fp32(d16));
        __m128i q;
        if (type == PI_TYPE_Q8_0) {
            q = _mm_loadu_si128((const __m128i *)(((const pi_block_q8_0 *)row)->qs + STRIP * half));
        } else { /* Q4_0: columns 0-15 in the low nibbles, 16-31 in the high ones */
            const __m128i raw = _mm_loadu_si128((const __m128i *)((const pi_block_q4_0 *)row)->qs);
            q = _mm_and_si128(half ? _mm_srli_epi16(raw, 4) : raw, _mm_set1_epi8(0x0F));
            q = _mm_sub_epi8(q, _mm_set1_epi8(8));
        }
        _mm256_store_ps(buf + r * STRIP, _mm256_mul_ps(i8x8_to_ps(q), d));
        _mm256_store_ps(buf + r * STRIP + 8, _mm256_mul_ps(i8x8_to_ps(_mm_srli_si128(q, 8)), d));
    }
    return finite;
}

/* NT (<= 4) tokens x 16 columns over nk rows of buf; the 2 * NT sums stay in registers. MASK
 * (a row with a non-finite weight): a zero h adds +0, not 0 * w (NaN for an infinite w) */
AI void strip(int NT, int MASK, int64_t nk, float *y, int64_t ldy, const float *buf, const float *h, int64_t ldh) {
    __m256 a[4][2];
    for (int i = 0; i < NT; i++) {
        a[i][0] = _mm256_loadu_ps(y + i * ldy);
        a[i][1] = _mm256_loadu_ps(y + i * ldy + 8);
    }
    for (int64_t r = 0; r < nk; r++) {
        const __m256 w0 = _mm256_load_ps(buf + r * STRIP), w1 = _mm256_load_ps(buf + r * STRIP + 8);
        for (int i = 0; i < NT; i++) {
            const __m256 hv = _mm256_broadcast_ss(h + i * ldh + r);
            __m256 p0 = _mm256_mul_ps(hv, w0), p1 = _mm256_mul_ps(hv, w1);
            if (MASK) {
                const __m256 m = _mm256_cmp_ps(hv, _mm256_setzero_ps(), _CMP_NEQ_UQ); /* NaN kept */
                p0 = _mm256_and_ps(p0, m);
                p1 = _mm256_and_ps(p1, m);
            }
            a[i][0] = _mm256_add_ps(a[i][0], p0);
            a[i][1] = _mm256_add_ps(a[i][1], p1);
        }
    }
    for (int i = 0; i < NT; i++) {
        _mm256_storeu_ps(y + i * ldy, a[i][0]);
        _mm256_storeu_ps(y + i * ldy + 8, a[i][1]);
    }
}

AI void tokens(int MASK, int64_t n_tok, int64_t nk, float *y, int64_t ldy, const float *buf, const float *h,
               int64_t ldh) {
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4) strip(4, MASK, nk, y + t * ldy, ldy, buf, h + t * ldh, ldh);
    y += t * ldy;
    h += t * ldh;
    switch (n_tok - t) {
    case 3:
        strip(3, MASK, nk, y, ldy, buf, h, ldh);
        break;
    case 2:
        strip(2, MASK, nk, y, ldy, buf, h, ldh);
        break;
    case 1:
        strip(1, MASK, nk, y, ldy, buf, h, ldh);
        break;
    default:
        break;
    }
}

void pi_down_batch_avx2(int32_t type, int64_t n_cols, int64_t n_tok, int64_t nk, float *y, int64_t ldy,
                        const char *w, int64_t wrow, const float *h, int64_t ldh) {
    _Alignas(32) float buf[PI_DOWN_BATCH_K * STRIP]; /* a strip of the nk rows, dequantized once */
    const int64_t bb = pi_row_size(type, TILE);     /* bytes of a block */
    for (int64_t c = 0; c < n_cols; c += STRIP) {
        const int half = (int)((c / STRIP) & 1);
        if (dequant_strip(type, w + (c / TILE) * bb, wrow, half, nk, buf))
            tokens(0, n_tok, nk, y + c, ldy, buf, h, ldh);
        else
            tokens(1, n_tok, nk, y + c, ldy, buf, h, ldh);
    }
}
