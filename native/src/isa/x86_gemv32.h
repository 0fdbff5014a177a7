/* Single-token products (decode's matrix-vector step) of the blocks of 32: Q4_0, Q5_0 and
 * Q8_0 weights with a Q8_0 activation row, Q4_1 with a Q8_1 one; included by x86_gemv.h
 * (after x86_256.h, whose helpers they use; compiled under the including file's target).
 *
 * Each row's result is the float of its row kernel in x86_256.h (PI_Q4_0_BODY,
 * PI_Q4_1_BODY, PI_Q5_0_BODY, PI_Q8_0_BODY) bit for bit: the same exact int32 lanes per
 * block, the same float product d_w * d_x, the same FMA into one accumulator in block
 * order (Q4_1: and the same m_w * s_x accumulator) and the same horizontal sum. What
 * changes is the work around them. The activation's part of a block is the same for every
 * row, so it is done once per call into a table on the stack: its F16 scales as floats
 * and, for Q5_0, the int16 pair sums of 16 * y that the row kernel subtracts (one maddubs
 * per block and row less; Q4_0 multiplies the signed q - 8 instead, G32_OFFSET). The
 * weights PI_GEMV_PF bytes ahead are prefetched, one line per block (a chunk's rows are
 * one contiguous stream).
 * One row per step: two rows per step measured slower for these types (x86_gemv.h). */
#ifndef PI_ISA_X86_GEMV32_H
#define PI_ISA_X86_GEMV32_H

/* activation blocks of the stack table (16384 columns: 24 KiB); longer rows convert
 * each block's activation part in the row loop instead (the same values) */
#define PI_GEMV32_MAXB 512

/* the weight kinds: a template parameter of the row loop below */
enum { G32_Q4_0, G32_Q5_0, G32_Q8_0, G32_Q4_1 };
/* a kind whose offset term (16 * y) comes from the table; Q4_0's q - 8 is a signed byte
 * instead (|q - 8| times y with q - 8's sign: the same exact int32 lanes, and no table to
 * read beside the weights: 3-5% faster decode on 7B-shaped Q4_0, 4096-11008 columns) */
#define G32_OFFSET(K) ((K) == G32_Q5_0)

/* bytes of a block of kind K, and of its activation block (Q8_1 for Q4_1, else Q8_0) */
#define G32_WB(K)                                                                                                      \
    ((K) == G32_Q4_0   ? sizeof(pi_block_q4_0)                                                                         \
     : (K) == G32_Q5_0 ? sizeof(pi_block_q5_0)                                                                         \
     : (K) == G32_Q8_0 ? sizeof(pi_block_q8_0)                                                                         \
                       : sizeof(pi_block_q4_1))
#define G32_XB(K) ((K) == G32_Q4_1 ? sizeof(pi_block_q8_1) : sizeof(pi_block_q8_0))

/* an activation block's qs (after d, and s for Q8_1) */
PI_GEMV_INLINE __m256i gemv32_y(const int K, const char *xb) {
    return _mm256_loadu_si256(K == G32_Q4_1 ? (const __m256i *)((const pi_block_q8_1 *)xb)->qs
                                            : (const __m256i *)((const pi_block_q8_0 *)xb)->qs);
}

/* the activation's part of a block: the row kernel's load_halfs(x) ([d_x, s_x, ...]), and
 * for the offset types maddubs(offset, y) */
PI_GEMV_INLINE void gemv32_act(const int K, const char *xb, __m128 *xh, __m256i *yo) {
    *xh = load_halfs(xb);
    if (G32_OFFSET(K))
        *yo = _mm256_maddubs_epi16(_mm256_set1_epi8(16), gemv32_y(K, xb));
#ifdef __AVX512VNNI__ /* as int32 quad sums, negated: vpdpbusd adds q * y to them */
    if (G32_OFFSET(K)) *yo = neg_quad_sums(*yo);
#endif
}

/* one row of kind K against the activation row x; its block parts from the table (xh, yo),
 * or, with xh NULL, from x itself */
PI_GEMV_INLINE float gemv32_row(const int K, int64_t nb, const char *w, const char *x, const __m128 *xh,
                                const __m256i *yo) {
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps(); /* Q4_1: lane 1 is fma(m_w, s_x, .) over the blocks */
    for (int64_t i = 0; i < nb; i++) {
        const char *b = w + i * G32_WB(K), *xb = x + i * G32_XB(K);
        _mm_prefetch(b + PI_GEMV_PF, _MM_HINT_T0);
        const __m256i y = gemv32_y(K, xb);
        __m128 hx;
        __m256i po = _mm256_setzero_si256();
        if (xh != NULL) {
            hx = xh[i];
            if (G32_OFFSET(K)) po = yo[i];
        } else {
            gemv32_act(K, xb, &hx, &po);
        }
        __m256i d4;
        if (K == G32_Q8_0 || K == G32_Q4_0) { /* s8 x s8 as |w| x (y with the sign of w); Q4_0's w = q - 8 */
            const __m256i q = K == G32_Q8_0 ? _mm256_loadu_si256((const __m256i *)((const pi_block_q8_0 *)b)->qs)
                                            : _mm256_sub_epi8(unpack_nibbles(((const pi_block_q4_0 *)b)->qs),
                                                              _mm256_set1_epi8(8));
            d4 = dot4(_mm256_abs_epi8(q), _mm256_sign_epi8(y, q));
        } else if (K == G32_Q4_1) {
            d4 = dot4(unpack_nibbles(((const pi_block_q4_1 *)b)->qs), y);
        } else { /* dot4_diff_256(q, offset, y): q * y less offset * y */
            const __m256i q = q5_0_bytes((const pi_block_q5_0 *)b);
#ifdef __AVX512VNNI__
            d4 = _mm256_dpbusd_epi32(po, q, y);
#else /* on the int16 pair sums, then their quad sums */
            d4 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, y), po), _mm256_set1_epi16(1));
#endif
        }
        /* d_w * d_x broadcast, as the row kernel's lane 0 of load_halfs(w) * load_halfs(x) */
        const __m128 hw = K == G32_Q4_1 ? load_halfs(b) : _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)b));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), _mm256_broadcastss_ps(_mm_mul_ss(hw, hx)), acc);
        if (K == G32_Q4_1) accm = _mm_fmadd_ps(hw, hx, accm);
    }
    const float sum = hsum256(acc);
    return K == G32_Q4_1 ? sum + _mm_cvtss_f32(_mm_movehdup_ps(accm)) : sum;
}

PI_GEMV_INLINE void gemv32(const int K, int64_t n, int64_t n_rows, float *y, const void *vw, int64_t wrow,
                           const void *vx) {
    const int64_t nb = n / PI_QK;
    const char *w = vw, *x = vx;
    if (nb > PI_GEMV32_MAXB) {
        for (int64_t r = 0; r < n_rows; r++) y[r] = gemv32_row(K, nb, w + r * wrow, x, NULL, NULL);
        return;
    }
    __m128 xh[PI_GEMV32_MAXB];
    __m256i yo[G32_OFFSET(K) ? PI_GEMV32_MAXB : 1];
    for (int64_t i = 0; i < nb; i++) gemv32_act(K, x + i * G32_XB(K), xh + i, yo + (G32_OFFSET(K) ? i : 0));
    for (int64_t r = 0; r < n_rows; r++) y[r] = gemv32_row(K, nb, w + r * wrow, x, xh, yo);
}

#define PI_DEFINE_GEMV32(NAME, K)                                                                   \
    static void NAME(int64_t n, int64_t n_rows, float *y, const void *vw, int64_t wrow, const void *vx) { \
        gemv32(K, n, n_rows, y, vw, wrow, vx);                                                      \
    }
PI_DEFINE_GEMV32(matvec_q4_0, G32_Q4_0)
PI_DEFINE_GEMV32(matvec_q4_1, G32_Q4_1)
PI_DEFINE_GEMV32(matvec_q5_0, G32_Q5_0)
PI_DEFINE_GEMV32(matvec_q8_0, G32_Q8_0)

#endif /* PI_ISA_X86_GEMV32_H */
