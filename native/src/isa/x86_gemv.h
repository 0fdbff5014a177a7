/* Single-token products (decode's matrix-vector step) of Q4_K and Q6_K, shared by avx2.c and avx512.c
 * (the blocks of 32: x86_gemv32.h, included at the end)
 * (include after x86_256.h, whose helpers they use; compiled under the including file's
 * target).
 *
 * pi_matvec_fn: y[r] = dot(row r, x) for n_rows rows. Each row's result is the float of its
 * row kernel in x86_256.h (vec_dot_*) bit for bit: the same exact int32 lanes per block,
 * the same float products, FMAs and horizontal sums in the same order. What changes is the
 * work around them: the scales are unpacked with a few 64-bit integer operations into one
 * vector and each chunk's int16 scale vector is one byte shuffle of it (the row kernel
 * stores the bytes and broadcasts each from memory), F16 scales by F16C (exact: the floats
 * of pi_fp16_to_fp32 without its branches), and the weights PI_GEMV_PF bytes ahead are
 * prefetched (a chunk's rows are one contiguous stream). One row per step: two or four
 * rows per step measured slower (llvm-mca -mcpu=znver3: 16.6 cycles per Q4_K super-block
 * at one row, 19-20 per row at two or four, the rows' scale vectors and masks spill; decode
 * of Qwen2.5-1.5B 25-35% slower at two), and so did two rows per step of the blocks of 32
 * (Q8_0 / Q5_0 / Q4_1: SmolLM2 and Qwen2.5-0.5B decode 10-20% slower than the row loop).
 * Integer lanes are exact whatever the order of their additions, so only their contents
 * must match the row kernel: lane l of a 32-byte chunk's sum is always bytes 4l..4l+3. */
#ifndef PI_ISA_X86_GEMV_H
#define PI_ISA_X86_GEMV_H

#define PI_GEMV_INLINE static inline __attribute__((always_inline))
#define PI_GEMV_UNROLL _Pragma("GCC unroll 8")
#define PI_GEMV_PF 3072 /* bytes ahead: Qwen2.5-1.5B Q4_K_M decode 5-10% faster than none (1.5, 6 KiB: no better) */

/* the cache lines of n bytes at p (a block; prefetches never fault past the weights' end) */
PI_GEMV_INLINE void pi_gemv_prefetch(const char *p, int64_t n) {
    for (int64_t o = 0; o < n; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
    _mm_prefetch(p + n - 1, _MM_HINT_T0);
}

/* ---- Q4_K ---------------------------------------------------------------------------- */

/* A Q4_K / Q5_K scales[12] -> bytes [sc0..3, mn0..3, sc4..7, mn4..7] (as pi_k4_scale_min):
 * bytes 0-7 keep their low 6 bits; sub-blocks 4-7 take their low nibbles from bytes 8-11
 * (scale: low nibble, min: high nibble) and their top 2 bits from the top bits of 0-7. */
static inline __m128i k4_scale_bytes(const uint8_t *scales) {
    uint64_t ab;
    uint32_t c;
    memcpy(&ab, scales, 8);
    memcpy(&c, scales + 8, 4);
    const uint64_t lo = ab & 0x3F3F3F3F3F3F3F3FULL;
    /* low dword: c's low nibbles, high dword: its high nibbles (c << 28 is c >> 4 there) */
    const uint64_t nib = ((uint64_t)c | (uint64_t)c << 28) & 0x0F0F0F0F0F0F0F0FULL;
    const uint64_t hi = nib | ((ab >> 6) & 0x0303030303030303ULL) << 4;
    return _mm_set_epi64x((long long)hi, (long long)lo);
}

/* byte shuffle picking scale j (j < 4: byte j, else 4 + j) into every int16 (high byte 0) */
#define K4_SC_PICK(j) _mm256_set1_epi16((short)(0x8000 | ((j) < 4 ? (j) : (j) + 4)))
/* the 8 mins as int16 (min k: byte 4 + k, or 8 + k) */
#define K4_MN_PICK _mm_setr_epi8(4, -128, 5, -128, 6, -128, 7, -128, 12, -128, 13, -128, 14, -128, 15, -128)

/* R rows (R <= 4) of Q4_K against one Q8_K activation row */
PI_GEMV_INLINE void q4_K_gemv_rows(const int R, int64_t nb, float *y, const char *w, int64_t wrow,
                                   const pi_block_q8_K *x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
    __m128 accm[4];
    PI_GEMV_UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps(), accm[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m128i csum = k4_chunk_sums(x[i].bsums);
        const __m128 xd = _mm_set1_ps(x[i].d);
        const int8_t *yq = x[i].qs;
        PI_GEMV_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q4_K *b = (const pi_block_q4_K *)(w + r * wrow) + i;
            pi_gemv_prefetch((const char *)b + PI_GEMV_PF, sizeof *b);
            const __m128i sb = k4_scale_bytes(b->scales);
            const __m256i sv = _mm256_broadcastsi128_si256(sb);
            const __m128 dm = _mm_mul_ps(xd, load_halfs(b)); /* [d_x * d_w, d_x * dmin_w, ...] */
            /* the row kernel's fma(-d_x * dmin_w, min lanes, accm): the negation is exact */
            const __m128i ml = _mm_madd_epi16(_mm_shuffle_epi8(sb, K4_MN_PICK), csum);
            accm[r] = _mm_fnmadd_ps(_mm_shuffle_ps(dm, dm, 0x55), _mm_cvtepi32_ps(ml), accm[r]);
            __m256i sumi = _mm256_setzero_si256();
            PI_GEMV_UNROLL for (int g = 0; g < 4; g++) {
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * g));
                sumi = k_chunk_acc(sumi, _mm256_and_si256(bits, m4), yq + 64 * g,
                                   _mm256_shuffle_epi8(sv, K4_SC_PICK(2 * g)));
                sumi = k_chunk_acc(sumi, _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), yq + 64 * g + 32,
                                   _mm256_shuffle_epi8(sv, K4_SC_PICK(2 * g + 1)));
            }
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    PI_GEMV_UNROLL for (int r = 0; r < R; r++) y[r] = hsum256(acc[r]) + k4_min_hsum(accm[r]);
}

/* ---- Q6_K ---------------------------------------------------------------------------- */

/* R rows (R <= 4) of Q6_K against one Q8_K activation row. Chunk c of half h takes scale
 * 8h + 2c on its low 16 bytes and 8h + 2c + 1 on its high ones (scale_pair16): from the
 * int16 scales of half h in both 128-bit lanes, one shuffle picks element 2c in the low
 * lane and 2c + 1 in the high one. */
PI_GEMV_INLINE void q6_K_gemv_rows(const int R, int64_t nb, float *y, const char *w, int64_t wrow,
                                   const pi_block_q8_K *x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    PI_GEMV_UNROLL for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        const __m256i bs = _mm256_loadu_si256((const __m256i *)x[i].bsums);
        const float xd = x[i].d;
        const int8_t *yq = x[i].qs;
        PI_GEMV_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q6_K *b = (const pi_block_q6_K *)(w + r * wrow) + i;
            pi_gemv_prefetch((const char *)b + PI_GEMV_PF, sizeof *b);
            const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
            /* the offset 32 * (scale * activation sum) per lane, as the row kernel */
            __m256i sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(bs, s16), 5));
            PI_GEMV_UNROLL for (int h = 0; h < 2; h++) {
                /* literal immediates: the sanitizer build (-O1) does not unroll h */
                const __m256i sh = h ? _mm256_permute2x128_si256(s16, s16, 0x11) : _mm256_permute2x128_si256(s16, s16, 0x00);
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h));
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
                /* bits 2c, 2c + 1 of qh to bits 4, 5 (16-bit shifts: the bits shifted across
                 * a byte boundary are masked off) */
                __m256i q[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                PI_GEMV_UNROLL for (int c = 0; c < 4; c++) {
                    /* int16 element 2c in the low lane, 2c + 1 in the high lane */
                    const __m256i pick = _mm256_setr_epi8(
                        4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c,
                        4 * c + 1, 4 * c, 4 * c + 1, 4 * c, 4 * c + 1, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3,
                        4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2, 4 * c + 3, 4 * c + 2,
                        4 * c + 3, 4 * c + 2, 4 * c + 3);
                    sumi = k_chunk_acc(sumi, q[c], yq + 128 * h + 32 * c, _mm256_shuffle_epi8(sh, pick));
                }
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(xd * _cvtsh_ss(b->d)), _mm256_cvtepi32_ps(sumi), acc[r]);
        }
    }
    PI_GEMV_UNROLL for (int r = 0; r < R; r++) y[r] = hsum256(acc[r]);
}

/* The drivers: one row per step (see the top) */
#define PI_DEFINE_GEMV(NAME, ROWS)                                                                 \
    static void NAME(int64_t n, int64_t n_rows, float *y, const void *vw, int64_t wrow, const void *vx) { \
        const char *w = vw;                                                                        \
        for (int64_t r = 0; r < n_rows; r++) ROWS(1, n / PI_QK_K, y + r, w + r * wrow, wrow, vx);  \
    }
PI_DEFINE_GEMV(matvec_q4_K, q4_K_gemv_rows)
PI_DEFINE_GEMV(matvec_q6_K, q6_K_gemv_rows)
#include "x86_gemv32.h"
#define PI_ISA_MATVEC                                                                              \
    {[PI_TYPE_Q4_K] = matvec_q4_K, [PI_TYPE_Q6_K] = matvec_q6_K, [PI_TYPE_Q4_0] = matvec_q4_0,    \
     [PI_TYPE_Q4_1] = matvec_q4_1, [PI_TYPE_Q5_0] = matvec_q5_0, [PI_TYPE_Q8_0] = matvec_q8_0}

#endif /* PI_ISA_X86_GEMV_H */
