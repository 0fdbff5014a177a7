/* Tiled products for prefill and batched decode (Q4_0, Q4_1, Q5_0, Q8_0, the K-quants),
 * shared by avx2.c and avx512.c (include after x86_256.h, whose helpers they use;
 * compiled under the including file's target).
 *
 * One kernel call covers n_rows weight rows x n_tok tokens (pi_matmul_tiles_fn) in tiles
 * of PI_TILE_R rows x PI_TILE_T tokens (set by the including file: AVX-512 has 32 ymm
 * registers, AVX2 16). Inside a tile each row's weights are unpacked once per block for
 * all its tokens and each token's activation sums once for all its rows; only the exact
 * integer work is shared. Every output element then takes the float operations of the
 * row's vec_dot kernel in x86_256.h in the same order (same products, same FMAs, same
 * horizontal sums), so a token's result is the same float in a batch as in decode.
 *
 * Each kernel is an always-inline template over its tile size (R, T constants) that
 * the driver below instantiates for full tiles and the edges. F16 scales are converted
 * with F16C (_cvtsh_ss: exact, the same floats as pi_fp16_to_fp32 and without its
 * branches). */
#ifndef PI_ISA_X86_TILES_H
#define PI_ISA_X86_TILES_H

#if !defined(PI_TILE_R) || !defined(PI_TILES_WIDE) || !defined(PI_TILES_NIBBLE)
#error "x86_tiles.h: define PI_TILE_R, PI_TILE_T (most rows, tokens per tile) and the shapes first"
#endif

#define PI_TILE_INLINE static inline __attribute__((always_inline))
/* tile loops unrolled completely: each array element of a tile becomes a register */
#define PI_UNROLL _Pragma("GCC unroll 16")

/* The tile driver of a kernel KERNEL(R, T, n, y, ldy, w, wrow, x, xrow): y[t * ldy + r]
 * for r < n_rows, t < n_tok; w rows wrow bytes apart, token rows xrow bytes apart. SHAPE
 * is "rows, tokens" of a full tile (at most PI_TILE_R x PI_TILE_T, the array bounds).
 * Tokens outer: a call's rows (a few KiB) stay in L1 while its tokens stream. The last
 * tokens go in tiles of T/2, T/4 and 1 (2 or 3 sequences decoding together still share
 * each row's unpacking), the last rows one at a time. */
#define PI_DEFINE_TILES(NAME, KERNEL, SHAPE) PI_DEFINE_TILES_(NAME, KERNEL, SHAPE)
#define PI_DEFINE_TILES_(NAME, KERNEL, TR, TT)                                                     \
    PI_TILE_INLINE void NAME##_rows(const int R, int64_t n, int64_t nt, float *y, int64_t ldy,    \
                                    const char *w, int64_t wrow, const char *x, int64_t xrow) {   \
        if (nt == TT) {                                                                            \
            KERNEL(R, TT, n, y, ldy, w, wrow, x, xrow);                                            \
            return;                                                                                \
        }                                                                                          \
        int64_t k = 0;                                                                             \
        for (; k + TT / 2 <= nt; k += TT / 2)                                                      \
            KERNEL(R, TT / 2, n, y + k * ldy, ldy, w, wrow, x + k * xrow, xrow);                   \
        if (TT / 4 > 1)                                                                            \
            for (; k + TT / 4 <= nt; k += TT / 4)                                                  \
                KERNEL(R, TT / 4 > 1 ? TT / 4 : 1, n, y + k * ldy, ldy, w, wrow, x + k * xrow, xrow); \
        for (; k < nt; k++) KERNEL(R, 1, n, y + k * ldy, ldy, w, wrow, x + k * xrow, xrow);        \
    }                                                                                              \
    static void NAME(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw, \
                     int64_t wrow, const void *vx, int64_t xrow) {                                 \
        const char *w = vw, *x = vx;                                                               \
        for (int64_t t = 0; t < n_tok; t += TT) {                                                  \
            const int64_t nt = n_tok - t < TT ? n_tok - t : TT;                                    \
            for (int64_t r = 0; r < n_rows; r += TR) {                                             \
                const int64_t nr = n_rows - r < TR ? n_rows - r : TR;                              \
                float *yo = y + t * ldy + r;                                                       \
                const char *wr = w + r * wrow, *xt = x + t * xrow;                                 \
                if (nr == TR)                                                                      \
                    NAME##_rows(TR, n, nt, yo, ldy, wr, wrow, xt, xrow);                           \
                else                                                                               \
                    for (int64_t j = 0; j < nr; j++)                                               \
                        NAME##_rows(1, n, nt, yo + j, ldy, wr + j * wrow, wrow, xt, xrow);         \
            }                                                                                      \
        }                                                                                          \
    }

/* ---- Q4_K / Q5_K -------------------------------------------------------------------- */

/* One super-block of Q4_K or Q5_K (Q5 = 1: the fifth bits from qh) for a tile: sumi and
 * the min term's int32 lanes mins for every (r, t). BLOCK is the row's block type. */
#define PI_K4_TILE_SUPERBLOCK(BLOCK, Q5)                                                           \
    const BLOCK *b[PI_TILE_R];                                                                             \
    const pi_block_q8_K *a[PI_TILE_T];                                                                     \
    __m256i scv[PI_TILE_R][8];                                                                             \
    __m128i mn16[PI_TILE_R], csum[PI_TILE_T];                                                                      \
    PI_UNROLL for (int r = 0; r < R; r++) {                                                                  \
        b[r] = (const BLOCK *)(wp + r * wrow) + i;                                                 \
        uint8_t sc[8], mn[8];                                                                      \
        k4_scales(b[r]->scales, sc, mn);                                                           \
        PI_UNROLL for (int j = 0; j < 8; j++) scv[r][j] = _mm256_set1_epi16(sc[j]);                          \
        mn16[r] = k4_mins16(mn);                                                                   \
    }                                                                                              \
    PI_UNROLL for (int t = 0; t < T; t++) {                                                                  \
        a[t] = (const pi_block_q8_K *)(xp + t * xrow) + i;                                         \
        csum[t] = k4_chunk_sums(a[t]->bsums);                                                      \
    }                                                                                              \
    __m256i sumi[PI_TILE_R][PI_TILE_T];                                                                            \
    PI_UNROLL for (int r = 0; r < R; r++)                                                                    \
        PI_UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();                           \
    PI_UNROLL for (int g = 0; g < 4; g++) {                                                                  \
        __m256i lo[PI_TILE_R], hi[PI_TILE_R];                                                                      \
        PI_UNROLL for (int r = 0; r < R; r++) {                                                              \
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(b[r]->qs + 32 * g));         \
            lo[r] = _mm256_and_si256(bits, m4);                                                    \
            hi[r] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);                              \
            if (Q5) {                                                                              \
                const __m256i one = _mm256_set1_epi8(1);                                           \
                const __m256i hb = _mm256_loadu_si256((const __m256i *)((const pi_block_q5_K *)b[r])->qh); \
                lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4)); \
                hi[r] = _mm256_or_si256(hi[r],                                                     \
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4)); \
            }                                                                                      \
        }                                                                                          \
        PI_UNROLL for (int t = 0; t < T; t++) {                                                              \
            const __m256i ylo = _mm256_loadu_si256((const __m256i *)(a[t]->qs + 64 * g));          \
            const __m256i yhi = _mm256_loadu_si256((const __m256i *)(a[t]->qs + 64 * g + 32));     \
            PI_UNROLL for (int r = 0; r < R; r++) {                                                          \
                const __m256i p = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], ylo), scv[r][2 * g]), \
                                                   _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], yhi), scv[r][2 * g + 1])); \
                sumi[r][t] = _mm256_add_epi32(sumi[r][t], p);                                      \
            }                                                                                      \
        }                                                                                          \
    }

PI_TILE_INLINE void q4_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    __m128 accm[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(), accm[r][t] = _mm_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        PI_K4_TILE_SUPERBLOCK(pi_block_q4_K, 0)
        PI_UNROLL for (int r = 0; r < R; r++) {
            const float dw = _cvtsh_ss(b[r]->d), dmw = _cvtsh_ss(b[r]->dmin);
            PI_UNROLL for (int t = 0; t < T; t++) {
                const __m128i ml = _mm_madd_epi16(mn16[r], csum[t]);
                accm[r][t] = _mm_fmadd_ps(_mm_set1_ps(-a[t]->d * dmw), _mm_cvtepi32_ps(ml), accm[r][t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(a[t]->d * dw), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]) + k4_min_hsum(accm[r][t]);
}

PI_TILE_INLINE void q5_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    float summs[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps(), summs[r][t] = 0.0f;
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        PI_K4_TILE_SUPERBLOCK(pi_block_q5_K, 1)
        PI_UNROLL for (int r = 0; r < R; r++) {
            const float dw = _cvtsh_ss(b[r]->d), dmw = _cvtsh_ss(b[r]->dmin);
            PI_UNROLL for (int t = 0; t < T; t++) {
                summs[r][t] = fmaf(-a[t]->d * dmw, (float)k4_min_isum(_mm_madd_epi16(mn16[r], csum[t])), summs[r][t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(a[t]->d * dw), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]) + summs[r][t];
}
#undef PI_K4_TILE_SUPERBLOCK

/* ---- Q6_K ---------------------------------------------------------------------------- */

PI_TILE_INLINE void q6_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        const pi_block_q6_K *b[PI_TILE_R];
        const pi_block_q8_K *a[PI_TILE_T];
        __m256i scv[PI_TILE_R][8], sc16[PI_TILE_R];
        PI_UNROLL for (int r = 0; r < R; r++) {
            b[r] = (const pi_block_q6_K *)(wp + r * wrow) + i;
            PI_UNROLL for (int j = 0; j < 8; j++) scv[r][j] = scale_pair16(b[r]->scales[2 * j], b[r]->scales[2 * j + 1]);
            sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b[r]->scales));
        }
        PI_UNROLL for (int t = 0; t < T; t++) a[t] = (const pi_block_q8_K *)(xp + t * xrow) + i;
        __m256i sumi[PI_TILE_R][PI_TILE_T];
        PI_UNROLL for (int r = 0; r < R; r++)
            PI_UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        /* chunk j = 4h + c of half h: ql bytes 64h + 32(c & 1), nibble c >> 1; qh bits 2c */
        PI_UNROLL for (int j = 0; j < 8; j++) {
            const int h = j / 4, c = j % 4;
            __m256i q[PI_TILE_R];
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(b[r]->ql + 64 * h + 32 * (c & 1)));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(b[r]->qh + 32 * h));
                q[r] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4 * (c >> 1)), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), m2), 4));
            }
            PI_UNROLL for (int t = 0; t < T; t++)
                PI_UNROLL for (int r = 0; r < R; r++)
                    sumi[r][t] = _mm256_add_epi32(sumi[r][t], k_chunk(q[r], a[t]->qs + 32 * j, scv[r][j]));
        }
        PI_UNROLL for (int r = 0; r < R; r++) {
            const float dw = _cvtsh_ss(b[r]->d);
            PI_UNROLL for (int t = 0; t < T; t++) {
                const __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)a[t]->bsums), sc16[r]);
                const __m256i s = _mm256_sub_epi32(sumi[r][t], _mm256_slli_epi32(off, 5));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(a[t]->d * dw), _mm256_cvtepi32_ps(s), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

/* ---- Q4_0 / Q5_0 / Q4_1 / Q8_0 (blocks of 32, one FMA per block) ------------------ */

/* The 32 weight bytes of block i of a row: Q4_0 nibbles, Q5_0 with bit 4 from qh */
PI_TILE_INLINE __m256i offset_bytes(const int Q5, const char *row, int64_t i) {
    return Q5 ? q5_0_bytes((const pi_block_q5_0 *)row + i) : unpack_nibbles(((const pi_block_q4_0 *)row + i)->qs);
}

/* As vec_dot_q4_0 / vec_dot_q5_0: per block d4 = dot4(q, y) - dot4(off, y) (exact int32;
 * the second term is the token's alone, computed once per tile), then
 * fma(d4, d_w * d_x, acc). Q5 = 1: Q5_0 (offset 16), else Q4_0 (offset 8). Both block
 * types start with d. */
PI_TILE_INLINE void offset_tile(const int Q5, const int R, const int T, int64_t n, float *y, int64_t ldy,
                                const char *wp, int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i off = _mm256_set1_epi8(Q5 ? 16 : 8), ones = _mm256_set1_epi16(1);
    const int64_t bsize = Q5 ? (int64_t)sizeof(pi_block_q5_0) : (int64_t)sizeof(pi_block_q4_0);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK; i++) {
        __m256i q[PI_TILE_R];
        __m256 dw[PI_TILE_R];
        PI_UNROLL for (int r = 0; r < R; r++) {
            q[r] = offset_bytes(Q5, wp + r * wrow, i);
            dw[r] = _mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(wp + r * wrow + i * bsize)));
            __asm__("" : "+x"(dw[r])); /* one vmulps per (r, t) below, not a scalar multiply and a broadcast */
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const pi_block_q8_0 *a = (const pi_block_q8_0 *)(xp + t * xrow) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)a->qs);
            const __m256i yo = _mm256_maddubs_epi16(off, yq);
            const __m256 dx = _mm256_set1_ps(_cvtsh_ss(a->d));
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i d4 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q[r], yq), yo), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

PI_TILE_INLINE void q4_0_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    offset_tile(0, R, T, n, y, ldy, wp, wrow, xp, xrow);
}

PI_TILE_INLINE void q5_0_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    offset_tile(1, R, T, n, y, ldy, wp, wrow, xp, xrow);
}

#if PI_TILE_T > 8
#error "x86_tiles.h: q4_1_tile keeps a tile's tokens in the 8 lanes of one register"
#endif

/* As vec_dot_q4_1: acc gets fma(dot4(q, y), d_w * d_x, acc) per block and the min term
 * fma(m_w, s_x, accm) in order, added last. The min terms of a row's T tokens are the T
 * lanes of one register (lane-wise FMAs: the same float operations as one per token). */
PI_TILE_INLINE void q4_1_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PI_TILE_R][PI_TILE_T], accm[PI_TILE_R];
    PI_UNROLL for (int r = 0; r < R; r++) {
        accm[r] = _mm256_setzero_ps();
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const pi_block_q8_1 *a[PI_TILE_T];
        PI_UNROLL for (int t = 0; t < T; t++) a[t] = (const pi_block_q8_1 *)(xp + t * xrow) + i;
#define S_(t) (short)((t) < T ? a[(t) < T ? (t) : 0]->s : 0)
        const __m256 sx = _mm256_cvtph_ps(_mm_setr_epi16(S_(0), S_(1), S_(2), S_(3), S_(4), S_(5), S_(6), S_(7)));
#undef S_
        __m256i q[PI_TILE_R];
        __m256 dw[PI_TILE_R];
        PI_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q4_1 *b = (const pi_block_q4_1 *)(wp + r * wrow) + i;
            q[r] = unpack_nibbles(b->qs);
            dw[r] = _mm256_set1_ps(_cvtsh_ss(b->d));
            __asm__("" : "+x"(dw[r]));
            accm[r] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(b->m)), sx, accm[r]);
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const __m256i yq = _mm256_loadu_si256((const __m256i *)a[t]->qs);
            const __m256 dx = _mm256_set1_ps(_cvtsh_ss(a[t]->d));
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i d4 = _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], yq), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++) {
        float m[8];
        _mm256_storeu_ps(m, accm[r]);
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]) + m[t];
    }
}

/* As vec_dot_q8_0: s8 x s8 as |w| (u8) x (y with the sign of w), the same saturating
 * int16 steps, then fma(d4, d_w * d_x, acc) per block */
PI_TILE_INLINE void q8_0_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const char *xp, int64_t xrow) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK; i++) {
        __m256i q[PI_TILE_R], aq[PI_TILE_R];
        __m256 dw[PI_TILE_R];
        PI_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q8_0 *b = (const pi_block_q8_0 *)(wp + r * wrow) + i;
            q[r] = load_reg256(b->qs);
            aq[r] = _mm256_abs_epi8(q[r]);
            dw[r] = _mm256_set1_ps(_cvtsh_ss(b->d));
            __asm__("" : "+x"(dw[r]));
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const pi_block_q8_0 *a = (const pi_block_q8_0 *)(xp + t * xrow) + i;
            const __m256i yq = _mm256_loadu_si256((const __m256i *)a->qs);
            const __m256 dx = _mm256_set1_ps(_cvtsh_ss(a->d));
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i d4 = _mm256_madd_epi16(_mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(yq, q[r])), ones);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

PI_DEFINE_TILES(matmul_tiles_q4_K, q4_K_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q5_K, q5_K_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q6_K, q6_K_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q5_0, q5_0_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q8_0, q8_0_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q4_0, q4_0_tile, PI_TILES_NIBBLE)
PI_DEFINE_TILES(matmul_tiles_q4_1, q4_1_tile, PI_TILES_NIBBLE)

#endif /* PI_ISA_X86_TILES_H */
