/* Tiled products for prefill and batched decode (Q4_0, Q4_1, Q5_0, Q8_0, the K-quants),
 * shared by avx2.c and avx512.c (include after x86_256.h, whose helpers they use;
 * compiled under the including file's target).
 *
 * One kernel call covers n_rows weight rows x n_tok tokens (pi_matmul_tiles_fn) in tiles
 * of R rows x T tokens (R <= PI_TILE_R, T <= 8, set by the including file: AVX-512 has 32
 * ymm registers, AVX2 16). Inside a tile each row's weights are unpacked once per block
 * for all its tokens; the tokens' block scales come as floats, 8 tokens to a vector,
 * from the side arrays pi_matmul_multi laid out once per call (pi_tile_act), so one
 * multiply gives a row's d_w * d_x for all its tokens. Only exact integer work and those
 * products are shared: every output element then takes the float operations of the
 * row's vec_dot kernel in x86_256.h in the same order (same products, same FMAs, same
 * horizontal sums), so a token's result is the same float in a batch as in decode.
 *
 * A row's 8 products d_w * d_x reach the FMAs by an in-lane shuffle of its low or high
 * half (tile_halves): storing them and broadcasting from memory measured 10-20%
 * slower on Q4_1 / Q8_0. The integer sums of the K-quants are kept in
 * source order (PI_REG_BARRIER), else the compiler's reassociated trees spill.
 *
 * Each kernel is an always-inline template over its tile size (R, T constants) that
 * the driver below instantiates for full tiles and every smaller token count. F16
 * scales are converted with F16C (_cvtsh_ss: exact, the same floats as
 * pi_fp16_to_fp32 and without its branches). */
#ifndef PI_ISA_X86_TILES_H
#define PI_ISA_X86_TILES_H

#if !defined(PI_TILE_R) || !defined(PI_TILES_WIDE) || !defined(PI_TILES_NIBBLE)
#error "x86_tiles.h: define PI_TILE_R, PI_TILE_T (most rows, tokens per tile) and the shapes first"
#endif
#ifndef PI_TILES_K /* the K-quants' tile shape, where the including file sets none */
#define PI_TILES_K PI_TILES_WIDE
#endif
#if PI_TILE_T != 8
#error "x86_tiles.h: a tile's tokens are the 8 lanes of one float vector"
#endif

#define PI_TILE_INLINE static inline __attribute__((always_inline))
/* tile loops unrolled completely: each array element of a tile becomes a register */
#define PI_UNROLL _Pragma("GCC unroll 16")
/* v is materialized here: integer sums stay in source order */
#define PI_REG_BARRIER(v) __asm__("" : "+x"(v))

/* The tile driver of a kernel KERNEL(R, T, n, y, ldy, w, wrow, a, t0): y[t * ldy + r] for
 * r < n_rows, t < n_tok; w rows wrow bytes apart; a the activation, t0 a tile's first
 * token. SHAPE is "rows, tokens" of a full tile. Tokens outer: a call's rows (a few KiB)
 * stay in L1 while its tokens stream. The last tokens go in one tile of their count (2
 * or 3 sequences decoding together share each row's unpacking), the last rows one at a
 * time. */
#define PI_DEFINE_TILES(NAME, KERNEL, SHAPE) PI_DEFINE_TILES_(NAME, KERNEL, SHAPE)
#define PI_TILE_CASE(KERNEL, R, T) \
    case T: KERNEL(R, T, n, y, ldy, w, wrow, a, t0); break;
#define PI_DEFINE_TILES_(NAME, KERNEL, TR, TT)                                                     \
    PI_TILE_INLINE void NAME##_rows(const int R, int64_t n, int64_t nt, float *y, int64_t ldy,    \
                                    const char *w, int64_t wrow, const pi_tile_act *a, int64_t t0) { \
        switch (nt) {                                                                              \
            PI_TILE_CASE(KERNEL, R, 1)                                                             \
            PI_TILE_CASE(KERNEL, R, 2)                                                             \
            PI_TILE_CASE(KERNEL, R, 3)                                                             \
            PI_TILE_CASE(KERNEL, R, 4)                                                             \
            PI_TILE_CASE(KERNEL, R, 5)                                                             \
            PI_TILE_CASE(KERNEL, R, 6)                                                             \
            PI_TILE_CASE(KERNEL, R, 7)                                                             \
            PI_TILE_CASE(KERNEL, R, 8)                                                             \
        }                                                                                          \
    }                                                                                              \
    static void NAME(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw, \
                     int64_t wrow, const pi_tile_act *a) {                                         \
        const char *w = vw;                                                                        \
        for (int64_t t = 0; t < n_tok; t += TT) {                                                  \
            const int64_t nt = n_tok - t < TT ? n_tok - t : TT;                                    \
            for (int64_t r = 0; r < n_rows; r += TR) {                                             \
                const int64_t nr = n_rows - r < TR ? n_rows - r : TR;                              \
                float *yo = y + t * ldy + r;                                                       \
                const char *wr = w + r * wrow;                                                     \
                if (nr == TR)                                                                      \
                    NAME##_rows(TR, n, nt, yo, ldy, wr, wrow, a, t);                               \
                else                                                                               \
                    for (int64_t j = 0; j < nr; j++)                                               \
                        NAME##_rows(1, n, nt, yo + j, ldy, wr + j * wrow, wrow, a, t);             \
            }                                                                                      \
        }                                                                                          \
    }

/* The tile's view of the activation, in locals (read through `a`, the fields would be
 * reloaded after every store to the stack) */
#define PI_TILE_ACT(a, t0)                                                                          \
    const char *const ax = (a)->x + (t0) * (a)->xrow;                                              \
    const int64_t axrow = (a)->xrow, ald = (a)->ld;                                                \
    const float *const ad = (a)->d + (t0), *const as = (a)->s != NULL ? (a)->s + (t0) : NULL;       \
    const char *const aaux = (const char *)(a)->aux;                                               \
    (void)as;                                                                                      \
    (void)aaux;
/* block i of the tile's token t */
#define PI_TILE_X(BLOCK, t, i) ((const BLOCK *)(ax + (t) * axrow) + (i))
/* the tile's 8 tokens' entries of a side array (lane t: token t0 + t) */
#define PI_TILE_SIDE(arr, i) _mm256_loadu_ps((arr) + (i) * ald)

/* lane t of v in all 8 lanes, from h[2] = v's low half and high half in both halves:
 * one in-lane shuffle per token (a store and broadcast loads wait on store forwarding).
 * The switch gives each shuffle a literal immediate: where the token loop is unrolled (-O3)
 * it folds away; the sanitizer build (-O1) does not unroll, and takes the branch */
PI_TILE_INLINE void tile_halves(__m256 h[2], __m256 v) {
    h[0] = _mm256_permute2f128_ps(v, v, 0x00);
    h[1] = _mm256_permute2f128_ps(v, v, 0x11);
}
PI_TILE_INLINE __m256 tile_lane(const __m256 h[2], int t) {
    const __m256 v = h[t / 4];
    switch (t % 4) {
    case 0: return _mm256_shuffle_ps(v, v, 0x00);
    case 1: return _mm256_shuffle_ps(v, v, 0x55);
    case 2: return _mm256_shuffle_ps(v, v, 0xAA);
    default: return _mm256_shuffle_ps(v, v, 0xFF);
    }
}
#define PI_TILE_LANE(h, t) tile_lane((h), (t))

/* ---- Q4_K / Q5_K -------------------------------------------------------------------- */

/* As vec_dot_q4_K / vec_dot_q5_K (Q5 = 1: the fifth bits from qh): per super-block
 * sumi (exact int32 lanes) and fma(d_x * d_w, sumi, acc); the min term in Q4_K's four
 * float lanes (accm) or Q5_K's one exact integer per super-block (summs). */
PI_TILE_INLINE void k4_tile(const int Q5, const int R, const int T, int64_t n, float *y, int64_t ldy,
                            const char *wp, int64_t wrow, const pi_tile_act *a, int64_t t0) {
    PI_TILE_ACT(a, t0)
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    __m128 accm[PI_TILE_R][PI_TILE_T];
    float summs[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++)
            acc[r][t] = _mm256_setzero_ps(), accm[r][t] = _mm_setzero_ps(), summs[r][t] = 0.0f;
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        const __m256 dx = PI_TILE_SIDE(ad, i);
        const __m256 ndx = _mm256_xor_ps(dx, _mm256_set1_ps(-0.0f)); /* -d_x: exact */
        const pi_block_q4_K *b[PI_TILE_R];
        __m256i scv[PI_TILE_R][8];
        __m128i mn16[PI_TILE_R];
        __m256 pd[PI_TILE_R][2], pm[PI_TILE_R][2];
        PI_UNROLL for (int r = 0; r < R; r++) {
            b[r] = Q5 ? (const pi_block_q4_K *)((const pi_block_q5_K *)(wp + r * wrow) + i)
                      : (const pi_block_q4_K *)(wp + r * wrow) + i;
            const uint16_t *dd = Q5 ? &((const pi_block_q5_K *)b[r])->d : &b[r]->d;
            uint8_t sc[8], mn[8];
            k4_scales(Q5 ? ((const pi_block_q5_K *)b[r])->scales : b[r]->scales, sc, mn);
            PI_UNROLL for (int j = 0; j < 8; j++) scv[r][j] = _mm256_set1_epi16(sc[j]);
            mn16[r] = k4_mins16(mn);
            tile_halves(pd[r], _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dd[0])), dx));  /* d = d_x * d_w */
            tile_halves(pm[r], _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(dd[1])), ndx)); /* dmin = -d_x * dmin_w */
        }
        __m256i sumi[PI_TILE_R][PI_TILE_T];
        PI_UNROLL for (int r = 0; r < R; r++)
            PI_UNROLL for (int t = 0; t < T; t++) sumi[r][t] = _mm256_setzero_si256();
        PI_UNROLL for (int g = 0; g < 4; g++) {
            __m256i lo[PI_TILE_R], hi[PI_TILE_R];
            PI_UNROLL for (int r = 0; r < R; r++) {
                const uint8_t *qs = Q5 ? ((const pi_block_q5_K *)b[r])->qs : b[r]->qs;
                const __m256i bits = _mm256_loadu_si256((const __m256i *)(qs + 32 * g));
                lo[r] = _mm256_and_si256(bits, m4);
                hi[r] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                if (Q5) {
                    const __m256i one = _mm256_set1_epi8(1);
                    const __m256i hb = _mm256_loadu_si256((const __m256i *)((const pi_block_q5_K *)b[r])->qh);
                    lo[r] = _mm256_or_si256(lo[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4));
                    hi[r] = _mm256_or_si256(hi[r],
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4));
                }
            }
            PI_UNROLL for (int t = 0; t < T; t++) {
                const int8_t *yq = PI_TILE_X(pi_block_q8_K, t, i)->qs + 64 * g;
                const __m256i ylo = _mm256_loadu_si256((const __m256i *)yq);
                const __m256i yhi = _mm256_loadu_si256((const __m256i *)(yq + 32));
                PI_UNROLL for (int r = 0; r < R; r++) {
                    sumi[r][t] = k_dot_acc(sumi[r][t], lo[r], ylo, scv[r][2 * g]);
                    sumi[r][t] = k_dot_acc(sumi[r][t], hi[r], yhi, scv[r][2 * g + 1]);
                    PI_REG_BARRIER(sumi[r][t]);
                }
            }
        }
        PI_UNROLL for (int r = 0; r < R; r++)
            PI_UNROLL for (int t = 0; t < T; t++) {
                const __m128i csum = _mm_loadu_si128((const __m128i *)(aaux + (i * ald + t0 + t) * 16));
                const __m128i ml = _mm_madd_epi16(mn16[r], csum);
                if (Q5)
                    summs[r][t] = fmaf(_mm256_cvtss_f32(PI_TILE_LANE(pm[r], t)), (float)k4_min_isum(ml), summs[r][t]);
                else
                    accm[r][t] = _mm_fmadd_ps(_mm256_castps256_ps128(PI_TILE_LANE(pm[r], t)), _mm_cvtepi32_ps(ml), accm[r][t]);
                acc[r][t] = _mm256_fmadd_ps(PI_TILE_LANE(pd[r], t), _mm256_cvtepi32_ps(sumi[r][t]), acc[r][t]);
            }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++)
            y[t * ldy + r] = hsum256(acc[r][t]) + (Q5 ? summs[r][t] : k4_min_hsum(accm[r][t]));
}

PI_TILE_INLINE void q4_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    k4_tile(0, R, T, n, y, ldy, wp, wrow, a, t0);
}

PI_TILE_INLINE void q5_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    k4_tile(1, R, T, n, y, ldy, wp, wrow, a, t0);
}

/* ---- Q6_K ---------------------------------------------------------------------------- */

PI_TILE_INLINE void q6_K_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    PI_TILE_ACT(a, t0)
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK_K; i++) {
        const __m256 dx = PI_TILE_SIDE(ad, i);
        const pi_block_q6_K *b[PI_TILE_R];
        __m256i scv[PI_TILE_R][8], sc16[PI_TILE_R];
        __m256 pd[PI_TILE_R][2];
        PI_UNROLL for (int r = 0; r < R; r++) {
            b[r] = (const pi_block_q6_K *)(wp + r * wrow) + i;
            PI_UNROLL for (int j = 0; j < 8; j++) scv[r][j] = scale_pair16(b[r]->scales[2 * j], b[r]->scales[2 * j + 1]);
            sc16[r] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b[r]->scales));
            tile_halves(pd[r], _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b[r]->d)), dx));
        }
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
            PI_UNROLL for (int t = 0; t < T; t++) {
                const int8_t *yq = PI_TILE_X(pi_block_q8_K, t, i)->qs + 32 * j;
                PI_UNROLL for (int r = 0; r < R; r++) {
                    sumi[r][t] = k_chunk_acc(sumi[r][t], q[r], yq, scv[r][j]);
                    PI_REG_BARRIER(sumi[r][t]);
                }
            }
        }
        PI_UNROLL for (int r = 0; r < R; r++)
            PI_UNROLL for (int t = 0; t < T; t++) {
                const __m256i bs = _mm256_loadu_si256((const __m256i *)PI_TILE_X(pi_block_q8_K, t, i)->bsums);
                const __m256i s = _mm256_sub_epi32(sumi[r][t], _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16[r]), 5));
                acc[r][t] = _mm256_fmadd_ps(PI_TILE_LANE(pd[r], t), _mm256_cvtepi32_ps(s), acc[r][t]);
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
 * the second term's quad sums, 8 * (y[4k] + ... + y[4k+3]), are the token's alone:
 * pi_tile_act's aux, negated, doubled for Q5_0's 16), then fma(d4, d_w * d_x, acc). Q5 = 1:
 * Q5_0, else Q4_0. Both block types start with d. */
PI_TILE_INLINE void offset_tile(const int Q5, const int R, const int T, int64_t n, float *y, int64_t ldy,
                                const char *wp, int64_t wrow, const pi_tile_act *a, int64_t t0) {
    PI_TILE_ACT(a, t0)
    const int64_t bsize = Q5 ? (int64_t)sizeof(pi_block_q5_0) : (int64_t)sizeof(pi_block_q4_0);
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const __m256 dx = PI_TILE_SIDE(ad, i);
        __m256i q[PI_TILE_R];
        __m256 pd[PI_TILE_R][2];
        PI_UNROLL for (int r = 0; r < R; r++) {
            q[r] = offset_bytes(Q5, wp + r * wrow, i);
            tile_halves(pd[r], _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(*(const uint16_t *)(wp + r * wrow + i * bsize))), dx));
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const __m256i yq = _mm256_loadu_si256((const __m256i *)PI_TILE_X(pi_block_q8_0, t, i)->qs);
            __m256i yo = _mm256_loadu_si256((const __m256i *)(aaux + (i * ald + t0 + t) * 32));
            if (Q5) yo = _mm256_add_epi32(yo, yo);
            PI_UNROLL for (int r = 0; r < R; r++) {
#ifdef __AVX512VNNI__ /* vpdpbusd adds q * y to the negated offset term */
                const __m256i d4 = _mm256_dpbusd_epi32(yo, q[r], yq);
#else
                const __m256i d4 = _mm256_add_epi32(dot4_256(q[r], yq), yo);
#endif
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), PI_TILE_LANE(pd[r], t), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

PI_TILE_INLINE void q4_0_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    offset_tile(0, R, T, n, y, ldy, wp, wrow, a, t0);
}

PI_TILE_INLINE void q5_0_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    offset_tile(1, R, T, n, y, ldy, wp, wrow, a, t0);
}

/* As vec_dot_q4_1: acc gets fma(dot4(q, y), d_w * d_x, acc) per block and the min term
 * fma(m_w, s_x, accm) in order, added last. The min terms of a row's T tokens are the T
 * lanes of one register (lane-wise FMAs: the same float operations as one per token). */
PI_TILE_INLINE void q4_1_tile(const int R, const int T, int64_t n, float *y, int64_t ldy, const char *wp,
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    PI_TILE_ACT(a, t0)
    __m256 acc[PI_TILE_R][PI_TILE_T], accm[PI_TILE_R];
    PI_UNROLL for (int r = 0; r < R; r++) {
        accm[r] = _mm256_setzero_ps();
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    }
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const __m256 dx = PI_TILE_SIDE(ad, i), sx = PI_TILE_SIDE(as, i);
        __m256i q[PI_TILE_R];
        __m256 pd[PI_TILE_R][2];
        PI_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q4_1 *b = (const pi_block_q4_1 *)(wp + r * wrow) + i;
            q[r] = unpack_nibbles(b->qs);
            const __m128 hw = load_halfs(b); /* [d, m, junk...]: one conversion for both */
            tile_halves(pd[r], _mm256_mul_ps(_mm256_broadcastss_ps(hw), dx));
            accm[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehdup_ps(hw)), sx, accm[r]);
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const __m256i yq = _mm256_loadu_si256((const __m256i *)PI_TILE_X(pi_block_q8_1, t, i)->qs);
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i d4 = dot4(q[r], yq);
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), PI_TILE_LANE(pd[r], t), acc[r][t]);
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
                              int64_t wrow, const pi_tile_act *a, int64_t t0) {
    PI_TILE_ACT(a, t0)
    __m256 acc[PI_TILE_R][PI_TILE_T];
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) acc[r][t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / PI_QK; i++) {
        const __m256 dx = PI_TILE_SIDE(ad, i);
        __m256i q[PI_TILE_R], aq[PI_TILE_R];
        __m256 pd[PI_TILE_R][2];
        PI_UNROLL for (int r = 0; r < R; r++) {
            const pi_block_q8_0 *b = (const pi_block_q8_0 *)(wp + r * wrow) + i;
            q[r] = load_reg256(b->qs);
            aq[r] = _mm256_abs_epi8(q[r]);
            tile_halves(pd[r], _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(b->d)), dx));
        }
        PI_UNROLL for (int t = 0; t < T; t++) {
            const __m256i yq = _mm256_loadu_si256((const __m256i *)PI_TILE_X(pi_block_q8_0, t, i)->qs);
            PI_UNROLL for (int r = 0; r < R; r++) {
                const __m256i d4 = dot4(aq[r], _mm256_sign_epi8(yq, q[r]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), PI_TILE_LANE(pd[r], t), acc[r][t]);
            }
        }
    }
    PI_UNROLL for (int r = 0; r < R; r++)
        PI_UNROLL for (int t = 0; t < T; t++) y[t * ldy + r] = hsum256(acc[r][t]);
}

PI_DEFINE_TILES(matmul_tiles_q4_K, q4_K_tile, PI_TILES_K)
PI_DEFINE_TILES(matmul_tiles_q5_K, q5_K_tile, PI_TILES_K)
PI_DEFINE_TILES(matmul_tiles_q6_K, q6_K_tile, PI_TILES_K)
PI_DEFINE_TILES(matmul_tiles_q5_0, q5_0_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q8_0, q8_0_tile, PI_TILES_WIDE)
PI_DEFINE_TILES(matmul_tiles_q4_0, q4_0_tile, PI_TILES_NIBBLE)
PI_DEFINE_TILES(matmul_tiles_q4_1, q4_1_tile, PI_TILES_NIBBLE)

#endif /* PI_ISA_X86_TILES_H */
