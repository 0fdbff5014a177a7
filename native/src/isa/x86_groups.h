/* Products over row groups (pi_matmul_groups_fn; the layout and the float order are in
 * pi_internal.h, "Row groups"), shared by avx2.c and avx512.c (include after x86_tiles.h,
 * whose PI_TILE_INLINE / PI_UNROLL they use; compiled under the including file's target).
 *
 * A vector holds one block of 16 rows (AVX-512) or of 8, half a group (AVX2), a row per
 * 32-bit lane: each activation quad is broadcast to every lane and multiplied into the
 * rows' quads (vpdpbusd, or maddubs + madd), so a block's integer sums of all the rows
 * finish in one register, and one FMA per block accumulates them for all the rows. The
 * tokens of a tile share each unpacked weight vector; a group's weights stay in L1
 * while its token tiles pass. */
#ifndef PI_ISA_X86_GROUPS_H
#define PI_ISA_X86_GROUPS_H

#ifdef __AVX512F__
#define GRP_LANES 16 /* rows per vector */
#define GRP_T 8      /* tokens per tile */
typedef __m512i grp_vi;
typedef __m512 grp_vf;
#define grp_set1_i _mm512_set1_epi32
#define grp_set1_f _mm512_set1_ps
#define grp_zero_f _mm512_setzero_ps
#define grp_load_i(p) _mm512_loadu_si512((const void *)(p))
#define grp_and _mm512_and_si512
#define grp_srli16 _mm512_srli_epi16
#define grp_fmadd _mm512_fmadd_ps
#define grp_mul _mm512_mul_ps
#define grp_cvt _mm512_cvtepi32_ps
#define grp_store _mm512_storeu_ps
#define grp_d(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p))) /* 16 F16 -> floats (exact) */
#define grp_or _mm512_or_si512
#define grp_srli32 _mm512_srli_epi32
#define grp_slli32 _mm512_slli_epi32
#define grp_add32 _mm512_add_epi32
#define grp_add16 _mm512_add_epi16
#define grp_madd16 _mm512_madd_epi16
#define grp_maddubs _mm512_maddubs_epi16
#define grp_mullo32 _mm512_mullo_epi32
#define grp_zero_i _mm512_setzero_si512
#define grp_fnmadd _mm512_fnmadd_ps
#ifdef __AVX512VNNI__
#define grp_dpbusd _mm512_dpbusd_epi32 /* defined only with VNNI: the paths below test it */
#define grp_dot2(s, lo, ylo, hi, yhi) grp_dpbusd(grp_dpbusd((s), (lo), (ylo)), (hi), (yhi))
#else /* maddubs pairs <= 2 * 15 * 128, two of them fit int16 */
#define grp_dot2(s, lo, ylo, hi, yhi)                                                              \
    _mm512_add_epi32((s), _mm512_madd_epi16(_mm512_add_epi16(_mm512_maddubs_epi16((lo), (ylo)),    \
                                                             _mm512_maddubs_epi16((hi), (yhi))),  \
                                            _mm512_set1_epi16(1)))
#endif
#else
#define GRP_LANES 8
#define GRP_T 4
typedef __m256i grp_vi;
typedef __m256 grp_vf;
#define grp_set1_i _mm256_set1_epi32
#define grp_set1_f _mm256_set1_ps
#define grp_zero_f _mm256_setzero_ps
#define grp_load_i(p) _mm256_loadu_si256((const __m256i *)(p))
#define grp_and _mm256_and_si256
#define grp_srli16 _mm256_srli_epi16
#define grp_fmadd _mm256_fmadd_ps
#define grp_mul _mm256_mul_ps
#define grp_cvt _mm256_cvtepi32_ps
#define grp_store _mm256_storeu_ps
#define grp_d(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define grp_or _mm256_or_si256
#define grp_srli32 _mm256_srli_epi32
#define grp_slli32 _mm256_slli_epi32
#define grp_add32 _mm256_add_epi32
#define grp_add16 _mm256_add_epi16
#define grp_madd16 _mm256_madd_epi16
#define grp_maddubs _mm256_maddubs_epi16
#define grp_mullo32 _mm256_mullo_epi32
#define grp_zero_i _mm256_setzero_si256
#define grp_fnmadd _mm256_fnmadd_ps
#define grp_dot2(s, lo, ylo, hi, yhi)                                                              \
    _mm256_add_epi32((s), _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16((lo), (ylo)),    \
                                                             _mm256_maddubs_epi16((hi), (yhi))),  \
                                            _mm256_set1_epi16(1)))
#endif

/* The fifth bits of Q5_0's quant bytes in the lanes of part h: bit 4 of byte j of the
 * part's vector where bit j of its share of the chunk's mask is set */
#ifdef __AVX512F__
PI_TILE_INLINE grp_vi grp_bit4(grp_vi q, uint64_t m, int h) {
    (void)h; /* one part: all 16 rows, the whole mask */
    return _mm512_mask_add_epi8(q, (__mmask64)m, q, _mm512_set1_epi8(16));
}
#else
PI_TILE_INLINE grp_vi grp_bit4(grp_vi q, uint64_t m, int h) {
    /* byte j of the 32 takes mask byte j / 8 (in-lane shuffle of the 4 bytes in each lane), then its bit j % 8 */
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int32_t)(uint32_t)(m >> (32 * h))),
                                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                           2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ull);
    return _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(16)));
}
#endif

/* Blocks of 32 (K = 4: Q4_0, 5: Q5_0, 8: Q8_0) in groups: lanes [h * GRP_LANES, (h + 1) *
 * GRP_LANES) of the group's rows, tokens t0 .. t0 + T - 1, over nb blocks; y at the first
 * lane's row of token t0. Each isum starts at the token's offset term (-8 / -16 times the
 * block's activation sum; Q8_0 with vpdpbusd: -128 times it, the quants read as q + 128). */
PI_TILE_INLINE void b32x16_part(const int K, const int T, int h, int64_t nb, float *y, int64_t ldy, const void *vw,
                                const pi_tile_act *a, int64_t t0) {
    const char *w = vw;
    const int64_t bsize = K == 8   ? (int64_t)sizeof(pi_block_q8_0x16)
                          : K == 5 ? (int64_t)sizeof(pi_block_q5_0x16)
                                   : (int64_t)sizeof(pi_block_q4_0x16);
#ifdef grp_dpbusd
    const int shift = K == 8 ? 7 : K == 5 ? 4 : 3;
#else
    const int shift = K == 8 ? -1 : K == 5 ? 4 : 3; /* Q8_0: |q| x (y with q's sign), no offset */
#endif
    const grp_vi m4 = grp_set1_i(0x0F0F0F0F);
    grp_vf acc[GRP_T];
    PI_UNROLL for (int t = 0; t < T; t++) acc[t] = grp_zero_f();
    for (int64_t i = 0; i < nb; i++) {
        const char *b = w + i * bsize;
        const grp_vf dw = grp_d((const uint16_t *)b + h * GRP_LANES);
        grp_vi s[GRP_T];
        PI_UNROLL for (int t = 0; t < T; t++)
            s[t] = shift < 0 ? grp_zero_i() : grp_set1_i(-(a->ysum[i * a->ld + t0 + t] * (1 << shift)));
        if (K == 8) {
            PI_UNROLL for (int c = 0; c < 8; c++) {
                const grp_vi q = grp_load_i(((const pi_block_q8_0x16 *)b)->qs[c][h * GRP_LANES]);
#ifdef grp_dpbusd
                const grp_vi u = _mm512_xor_si512(q, _mm512_set1_epi8((char)0x80));
#elif defined(__AVX512F__)
                const __mmask64 neg = _mm512_movepi8_mask(q);
                const grp_vi u = _mm512_abs_epi8(q);
#else
                const grp_vi u = _mm256_abs_epi8(q);
#endif
                PI_UNROLL for (int t = 0; t < T; t++) {
                    int32_t yv;
                    memcpy(&yv, ((const pi_block_q8_0 *)(a->x + (t0 + t) * a->xrow) + i)->qs + 4 * c, 4);
                    const grp_vi yb = grp_set1_i(yv);
#ifdef grp_dpbusd
                    s[t] = grp_dpbusd(s[t], u, yb);
#elif defined(__AVX512F__)
                    const grp_vi ys = _mm512_mask_sub_epi8(yb, neg, _mm512_setzero_si512(), yb);
                    s[t] = grp_add32(s[t], grp_madd16(grp_maddubs(u, ys), _mm512_set1_epi16(1)));
#else
                    s[t] = grp_add32(s[t], grp_madd16(grp_maddubs(u, _mm256_sign_epi8(yb, q)), _mm256_set1_epi16(1)));
#endif
                }
            }
        } else {
            const uint8_t(*qs)[PI_GROUP_ROWS][4] = K == 5 ? ((const pi_block_q5_0x16 *)b)->qs
                                                          : ((const pi_block_q4_0x16 *)b)->qs;
            PI_UNROLL for (int c = 0; c < 4; c++) {
                const grp_vi q = grp_load_i(qs[c][h * GRP_LANES]);
                grp_vi lo = grp_and(q, m4), hi = grp_and(grp_srli16(q, 4), m4);
                if (K == 5) {
                    lo = grp_bit4(lo, ((const pi_block_q5_0x16 *)b)->hb[c][0], h);
                    hi = grp_bit4(hi, ((const pi_block_q5_0x16 *)b)->hb[c][1], h);
                }
                PI_UNROLL for (int t = 0; t < T; t++) {
                    const int8_t *yq = ((const pi_block_q8_0 *)(a->x + (t0 + t) * a->xrow) + i)->qs;
                    int32_t ylo, yhi;
                    memcpy(&ylo, yq + 4 * c, 4);
                    memcpy(&yhi, yq + 16 + 4 * c, 4);
                    s[t] = grp_dot2(s[t], lo, grp_set1_i(ylo), hi, grp_set1_i(yhi));
                }
            }
        }
        PI_UNROLL for (int t = 0; t < T; t++)
            acc[t] = grp_fmadd(grp_cvt(s[t]), grp_mul(dw, grp_set1_f(a->d[i * a->ld + t0 + t])), acc[t]);
    }
    PI_UNROLL for (int t = 0; t < T; t++) grp_store(y + t * ldy, acc[t]);
}
/* Q4_K / Q5_K (Q5 = 1) groups, as b32x16_part. Sub-block by sub-block (the quant chunks
 * reloaded from L1 for the high nibbles: the tokens' sums then fit the registers). The
 * scales and mins of each lane's row come out of its three scale words with 32-bit shifts
 * and masks, four 6-bit values to a word (pi_k4_scale_min's bits); Q5_K's fifth bits from
 * bit j of its qh chunk's bytes. */
PI_TILE_INLINE void k4x16_part(const int Q5, const int T, int h, int64_t nb, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a, int64_t t0) {
    const int64_t bsize = Q5 ? (int64_t)sizeof(pi_block_q5_Kx16) : (int64_t)sizeof(pi_block_q4_Kx16);
    const grp_vi m4 = grp_set1_i(0x0F0F0F0F), m6 = grp_set1_i(0x3F3F3F3F), m30 = grp_set1_i(0x30303030);
    const grp_vi mff = grp_set1_i(0xFF), m16 = grp_set1_i(0x00FF0000), b4 = grp_set1_i(0x10101010);
    grp_vf acc[GRP_T];
    PI_UNROLL for (int t = 0; t < T; t++) acc[t] = grp_zero_f();
    for (int64_t i = 0; i < nb; i++) {
        /* both layouts begin with d, dmin, scales (pi_block_q4_Kx16's fields) */
        const pi_block_q4_Kx16 *b = (const void *)((const char *)vw + i * bsize);
        const pi_block_q5_Kx16 *b5 = (const void *)b;
        const uint8_t(*qs)[PI_GROUP_ROWS][4] = Q5 ? b5->qs : b->qs;
        const grp_vi w0 = grp_load_i(b->scales[0] + h * GRP_LANES), w1 = grp_load_i(b->scales[1] + h * GRP_LANES),
                     w2 = grp_load_i(b->scales[2] + h * GRP_LANES);
        /* bytes k of sc[0] / sc[1]: scales k / 4 + k; of mn: mins 0..3 */
        const grp_vi sc[2] = {grp_and(w0, m6), grp_or(grp_and(w2, m4), grp_and(grp_srli32(w0, 2), m30))};
        const grp_vi mlo = grp_and(w1, m6), mhi = grp_or(grp_and(grp_srli32(w2, 4), m4), grp_and(grp_srli32(w1, 2), m30));
        /* mins as int16 pairs (m_2k, m_2k+1) per lane, against the activation's sums 2k, 2k + 1 */
        const grp_vi mp[4] = {grp_or(grp_and(mlo, mff), grp_and(grp_slli32(mlo, 8), m16)),
                              grp_or(grp_and(grp_srli32(mlo, 16), mff), grp_and(grp_srli32(mlo, 8), m16)),
                              grp_or(grp_and(mhi, mff), grp_and(grp_slli32(mhi, 8), m16)),
                              grp_or(grp_and(grp_srli32(mhi, 16), mff), grp_and(grp_srli32(mhi, 8), m16))};
        const grp_vf dx_w = grp_d(b->d + h * GRP_LANES), dmin_w = grp_d(b->dmin + h * GRP_LANES);
        grp_vi isum[GRP_T];
        PI_UNROLL for (int t = 0; t < T; t++) {
            const int32_t *bs = (const int32_t *)((const int16_t *)a->aux + (i * a->ld + t0 + t) * 8);
            grp_vi imin = grp_madd16(mp[0], grp_set1_i(bs[0]));
            PI_UNROLL for (int k = 1; k < 4; k++) imin = grp_add32(imin, grp_madd16(mp[k], grp_set1_i(bs[k])));
            const grp_vf dx = grp_set1_f(a->d[i * a->ld + t0 + t]);
            acc[t] = grp_fnmadd(grp_cvt(imin), grp_mul(dmin_w, dx), acc[t]);
            isum[t] = grp_zero_i();
        }
        PI_UNROLL for (int j = 0; j < 8; j++) {
            const grp_vi scj = grp_and(grp_srli32(sc[j / 4], 8 * (j % 4)), mff);
#ifndef grp_dpbusd
            const grp_vi scj16 = grp_or(scj, grp_slli32(scj, 16));
#endif
            grp_vi s[GRP_T];
            PI_UNROLL for (int t = 0; t < T; t++) s[t] = grp_zero_i();
            PI_UNROLL for (int c = 0; c < 8; c++) {
                const grp_vi wv = grp_load_i(qs[8 * (j / 2) + c][h * GRP_LANES]);
                grp_vi q = j % 2 ? grp_and(grp_srli16(wv, 4), m4) : grp_and(wv, m4);
                if (Q5) { /* bit j of each byte to bit 4 (bits from the neighbouring bytes masked off) */
                    const grp_vi qh = grp_load_i(b5->qh[c][h * GRP_LANES]);
                    q = grp_or(q, grp_and(j < 4 ? grp_slli32(qh, 4 - j) : grp_srli32(qh, j - 4), b4));
                }
                PI_UNROLL for (int t = 0; t < T; t++) {
                    int32_t yv;
                    memcpy(&yv, ((const pi_block_q8_K *)(a->x + (t0 + t) * a->xrow) + i)->qs + 32 * j + 4 * c, 4);
#ifdef grp_dpbusd
                    s[t] = grp_dpbusd(s[t], q, grp_set1_i(yv));
#else /* int16 pairs: at most 8 chunks of 2 x 15 x 128 (Q4_K), 4 of 2 x 31 x 128 (Q5_K) */
                    s[t] = grp_add16(s[t], grp_maddubs(q, grp_set1_i(yv)));
                    if (Q5 && c == 3) {
                        isum[t] = grp_add32(isum[t], grp_madd16(s[t], scj16));
                        s[t] = grp_zero_i();
                    }
#endif
                }
            }
            PI_UNROLL for (int t = 0; t < T; t++)
#ifdef grp_dpbusd
                isum[t] = grp_add32(isum[t], grp_mullo32(s[t], scj));
#else
                isum[t] = grp_add32(isum[t], grp_madd16(s[t], scj16));
#endif
        }
        PI_UNROLL for (int t = 0; t < T; t++)
            acc[t] = grp_fmadd(grp_cvt(isum[t]), grp_mul(dx_w, grp_set1_f(a->d[i * a->ld + t0 + t])), acc[t]);
    }
    PI_UNROLL for (int t = 0; t < T; t++) grp_store(y + t * ldy, acc[t]);
}

/* Q6_K groups (pi_block_q6_Kx16), as b32x16_part; KIND unused. Sub-block by sub-block in
 * the layout's order: its three quant vectors give the 6-bit values of four quads (low
 * nibble | high bits moved to bits 4-5), each dotted with the tokens' broadcast quads from an
 * isum that starts at -32 times the sub-block's activation sum (vpdpbusd; maddubs pairs of
 * two quads, 2 x 2 x 63 x 128 < 2^15, then madd with the scale), then scaled by the rows'
 * int8 scales. */
#ifdef __AVX512F__
#define grp_scales8(p) _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p)))
#else
#define grp_scales8(p) _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p)))
#endif
PI_TILE_INLINE void k6x16_part(const int KIND, const int T, int h, int64_t nb, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a, int64_t t0) {
    (void)KIND;
    const grp_vi m4 = grp_set1_i(0x0F0F0F0F), m30 = grp_set1_i(0x30303030);
    grp_vf acc[GRP_T];
    PI_UNROLL for (int t = 0; t < T; t++) acc[t] = grp_zero_f();
    for (int64_t i = 0; i < nb; i++) {
        const pi_block_q6_Kx16 *b = (const pi_block_q6_Kx16 *)vw + i;
        const pi_block_q8_K *x[GRP_T];
        grp_vi isum[GRP_T];
        PI_UNROLL for (int t = 0; t < T; t++) {
            x[t] = (const pi_block_q8_K *)(a->x + (t0 + t) * a->xrow) + i;
            isum[t] = grp_zero_i();
        }
        for (int j = 0; j < 16; j++) {
            const grp_vi sc = grp_scales8(b->scales[j] + h * GRP_LANES);
            const grp_vi l0 = grp_load_i(b->sub[j].ql[0][h * GRP_LANES]), l1 = grp_load_i(b->sub[j].ql[1][h * GRP_LANES]);
            const grp_vi qh = grp_load_i(b->sub[j].qh[h * GRP_LANES]);
            const grp_vi u[4] = {grp_or(grp_and(l0, m4), grp_and(grp_slli32(qh, 4), m30)),
                                 grp_or(grp_and(grp_srli16(l0, 4), m4), grp_and(grp_slli32(qh, 2), m30)),
                                 grp_or(grp_and(l1, m4), grp_and(qh, m30)),
                                 grp_or(grp_and(grp_srli16(l1, 4), m4), grp_and(grp_srli32(qh, 2), m30))};
#ifndef grp_dpbusd
            const grp_vi sc16 = grp_or(grp_and(sc, grp_set1_i(0xFFFF)), grp_slli32(sc, 16));
#endif
            PI_UNROLL for (int t = 0; t < T; t++) {
                int32_t yv[4];
                memcpy(yv, x[t]->qs + 16 * j, 16);
#ifdef grp_dpbusd
                grp_vi s = grp_set1_i(-32 * x[t]->bsums[j]);
                PI_UNROLL for (int c = 0; c < 4; c++) s = grp_dpbusd(s, u[c], grp_set1_i(yv[c]));
                isum[t] = grp_add32(isum[t], grp_mullo32(s, sc));
#else
                const grp_vi p01 = grp_add16(grp_maddubs(u[0], grp_set1_i(yv[0])), grp_maddubs(u[1], grp_set1_i(yv[1])));
                const grp_vi p23 = grp_add16(grp_maddubs(u[2], grp_set1_i(yv[2])), grp_maddubs(u[3], grp_set1_i(yv[3])));
                isum[t] = grp_add32(isum[t], grp_add32(grp_madd16(p01, sc16), grp_madd16(p23, sc16)));
                isum[t] = grp_add32(isum[t], grp_mullo32(sc, grp_set1_i(-32 * x[t]->bsums[j])));
#endif
            }
        }
        const grp_vf dw = grp_d(b->d + h * GRP_LANES);
        PI_UNROLL for (int t = 0; t < T; t++)
            acc[t] = grp_fmadd(grp_cvt(isum[t]), grp_mul(dw, grp_set1_f(a->d[i * a->ld + t0 + t])), acc[t]);
    }
    PI_UNROLL for (int t = 0; t < T; t++) grp_store(y + t * ldy, acc[t]);
}

/* The driver of a group kernel PART of kind KIND over BLOCK groups: each group's token
 * tiles in turn (its weights stay in L1), each tile's halves (AVX2: 8 of the 16 rows) */
#define GRP_CASE(PART, KIND, T) \
    case T: PART(KIND, T, h, nb, yo + h * GRP_LANES, ldy, wg, a, t); break;
#define GRP_DEFINE(NAME, PART, KIND, BLOCK, QK)                                                    \
    static void NAME(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw, \
                     const pi_tile_act *a) {                                                       \
        const int64_t nb = n / (QK);                                                               \
        for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++) {                                     \
            const BLOCK *wg = (const BLOCK *)vw + g * nb;                                          \
            for (int64_t t = 0; t < n_tok; t += GRP_T) {                                           \
                const int64_t nt = n_tok - t < GRP_T ? n_tok - t : GRP_T;                          \
                float *yo = y + t * ldy + g * PI_GROUP_ROWS;                                       \
                for (int h = 0; h < PI_GROUP_ROWS / GRP_LANES; h++) switch (nt) {                  \
                    GRP_CASE(PART, KIND, 1)                                                        \
                    GRP_CASE(PART, KIND, 2)                                                        \
                    GRP_CASE(PART, KIND, 3)                                                        \
                    GRP_CASE(PART, KIND, 4)                                                        \
                    GRP_CASES_8(PART, KIND)                                                        \
                    }                                                                              \
            }                                                                                      \
        }                                                                                          \
    }
#if GRP_T > 4
#define GRP_CASES_8(PART, KIND) \
    GRP_CASE(PART, KIND, 5) GRP_CASE(PART, KIND, 6) GRP_CASE(PART, KIND, 7) GRP_CASE(PART, KIND, 8)
#else
#define GRP_CASES_8(PART, KIND)
#endif
GRP_DEFINE(matmul_groups_q4_0, b32x16_part, 4, pi_block_q4_0x16, PI_QK)
GRP_DEFINE(matmul_groups_q5_0, b32x16_part, 5, pi_block_q5_0x16, PI_QK)
GRP_DEFINE(matmul_groups_q8_0, b32x16_part, 8, pi_block_q8_0x16, PI_QK)
GRP_DEFINE(matmul_groups_q4_K, k4x16_part, 0, pi_block_q4_Kx16, PI_QK_K)
GRP_DEFINE(matmul_groups_q5_K, k4x16_part, 1, pi_block_q5_Kx16, PI_QK_K)
GRP_DEFINE(matmul_groups_q6_K, k6x16_part, 0, pi_block_q6_Kx16, PI_QK_K)

#endif /* PI_ISA_X86_GROUPS_H */
