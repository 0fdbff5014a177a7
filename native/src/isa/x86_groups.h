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
#ifdef __AVX512VNNI__
#define grp_dot2(s, lo, ylo, hi, yhi) _mm512_dpbusd_epi32(_mm512_dpbusd_epi32((s), (lo), (ylo)), (hi), (yhi))
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
#define grp_dot2(s, lo, ylo, hi, yhi)                                                              \
    _mm256_add_epi32((s), _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16((lo), (ylo)),    \
                                                             _mm256_maddubs_epi16((hi), (yhi))),  \
                                            _mm256_set1_epi16(1)))
#endif

/* Q4_0 groups: lanes [h * GRP_LANES, (h + 1) * GRP_LANES) of the group's rows, tokens
 * t0 .. t0 + T - 1, over nb blocks; y at the first lane's row of token t0 */
PI_TILE_INLINE void q4_0x16_part(const int T, int h, int64_t nb, float *y, int64_t ldy,
                                 const pi_block_q4_0x16 *w, const pi_tile_act *a, int64_t t0) {
    const grp_vi m4 = grp_set1_i(0x0F0F0F0F);
    grp_vf acc[GRP_T];
    PI_UNROLL for (int t = 0; t < T; t++) acc[t] = grp_zero_f();
    for (int64_t i = 0; i < nb; i++) {
        const pi_block_q4_0x16 *b = w + i;
        const grp_vf dw = grp_d(b->d + h * GRP_LANES);
        grp_vi s[GRP_T];
        PI_UNROLL for (int t = 0; t < T; t++) s[t] = grp_set1_i(a->off[i * a->ld + t0 + t]);
        PI_UNROLL for (int c = 0; c < 4; c++) {
            const grp_vi q = grp_load_i(b->qs[c][h * GRP_LANES]);
            const grp_vi lo = grp_and(q, m4), hi = grp_and(grp_srli16(q, 4), m4);
            PI_UNROLL for (int t = 0; t < T; t++) {
                const int8_t *yq = ((const pi_block_q8_0 *)(a->x + (t0 + t) * a->xrow) + i)->qs;
                int32_t ylo, yhi;
                memcpy(&ylo, yq + 4 * c, 4);
                memcpy(&yhi, yq + 16 + 4 * c, 4);
                s[t] = grp_dot2(s[t], lo, grp_set1_i(ylo), hi, grp_set1_i(yhi));
            }
        }
        PI_UNROLL for (int t = 0; t < T; t++)
            acc[t] = grp_fmadd(grp_cvt(s[t]), grp_mul(dw, grp_set1_f(a->d[i * a->ld + t0 + t])), acc[t]);
    }
    PI_UNROLL for (int t = 0; t < T; t++) grp_store(y + t * ldy, acc[t]);
}

#define GRP_CASE(T) \
    case T: q4_0x16_part(T, h, nb, yo + h * GRP_LANES, ldy, wg, a, t); break;
static void matmul_groups_q4_0(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy, const void *vw,
                               const pi_tile_act *a) {
    const int64_t nb = n / PI_QK;
    for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++) {
        const pi_block_q4_0x16 *wg = (const pi_block_q4_0x16 *)vw + g * nb;
        for (int64_t t = 0; t < n_tok; t += GRP_T) {
            const int64_t nt = n_tok - t < GRP_T ? n_tok - t : GRP_T;
            float *yo = y + t * ldy + g * PI_GROUP_ROWS;
            for (int h = 0; h < PI_GROUP_ROWS / GRP_LANES; h++) switch (nt) {
                GRP_CASE(1)
                GRP_CASE(2)
                GRP_CASE(3)
                GRP_CASE(4)
#if GRP_T > 4
                GRP_CASE(5)
                GRP_CASE(6)
                GRP_CASE(7)
                GRP_CASE(8)
#endif
                }
        }
    }
}
#undef GRP_CASE

#endif /* PI_ISA_X86_GROUPS_H */
