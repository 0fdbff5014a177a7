/* Single-token products (decode's matrix-vector step) of the blocks of 32 with a Q8_0
 * activation row, Q5_0 and Q8_0 weights; included by x86_gemv.h (after x86_256.h, whose
 * helpers they use; compiled under the including file's target).
 *
 * Each row's result is the float of its row kernel in x86_256.h (PI_Q5_0_BODY /
 * PI_Q8_0_BODY) bit for bit: the same exact int32 lanes per block, the same float product
 * d_w * d_x, the same FMA into one accumulator in block order and the same horizontal sum.
 * What changes is the work around them. The activation's part of a block is the same for
 * every row, so it is done once per call into a table on the stack: its F16 scale as a
 * float and, for Q5_0, the int16 pair sums of 16 * y that the row kernel subtracts (one
 * maddubs per block and row less). The weights PI_GEMV_PF bytes ahead are prefetched,
 * one line per block (a chunk's rows are one contiguous stream). One row per step: two
 * rows per step measured slower for these types (x86_gemv.h). */
#ifndef PI_ISA_X86_GEMV32_H
#define PI_ISA_X86_GEMV32_H

/* activation blocks of the stack table (16384 columns: 18 KiB); longer rows convert
 * each block's activation part in the row loop instead (the same values) */
#define PI_GEMV32_MAXB 512

/* d_w * d_x broadcast, as the row kernel's lane 0 of load_halfs(w) * load_halfs(x): the
 * block's first 8 bytes converted (d and junk lanes; all within the block) */
PI_GEMV_INLINE __m256 gemv32_d(const void *b, float xd) {
    const __m128 h = _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)b));
    return _mm256_broadcastss_ps(_mm_mul_ss(h, _mm_set_ss(xd)));
}

/* ---- Q5_0 ---------------------------------------------------------------------------- */

/* one Q5_0 row against the Q8_0 row x; xd / y16 (the activation's block scales and
 * maddubs(16, y)) from the table, or, with xd NULL, from x itself */
PI_GEMV_INLINE float q5_0_gemv_row(int64_t nb, const pi_block_q5_0 *w, const pi_block_q8_0 *x, const float *xd,
                                   const __m256i *y16) {
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        _mm_prefetch((const char *)(w + i) + PI_GEMV_PF, _MM_HINT_T0);
        const __m256i y = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i p16 = xd ? y16[i] : _mm256_maddubs_epi16(sixteen, y);
        const float dx = xd ? xd[i] : _cvtsh_ss(x[i].d);
        /* dot4_diff_256(q, 16, y): the int16 pair sums of q * y less those of 16 * y */
        const __m256i d4 = _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q5_0_bytes(w + i), y), p16), ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), gemv32_d(w + i, dx), acc);
    }
    return hsum256(acc);
}

static void matvec_q5_0(int64_t n, int64_t n_rows, float *y, const void *vw, int64_t wrow, const void *vx) {
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    const char *w = vw;
    if (nb > PI_GEMV32_MAXB) {
        for (int64_t r = 0; r < n_rows; r++)
            y[r] = q5_0_gemv_row(nb, (const pi_block_q5_0 *)(w + r * wrow), x, NULL, NULL);
        return;
    }
    float xd[PI_GEMV32_MAXB];
    __m256i y16[PI_GEMV32_MAXB];
    for (int64_t i = 0; i < nb; i++) {
        xd[i] = _cvtsh_ss(x[i].d);
        y16[i] = _mm256_maddubs_epi16(_mm256_set1_epi8(16), _mm256_loadu_si256((const __m256i *)x[i].qs));
    }
    for (int64_t r = 0; r < n_rows; r++) y[r] = q5_0_gemv_row(nb, (const pi_block_q5_0 *)(w + r * wrow), x, xd, y16);
}

/* ---- Q8_0 ---------------------------------------------------------------------------- */

/* one Q8_0 row against the Q8_0 row x (s8 x s8 as |w| x (y with the sign of w), as the
 * row kernel); xd from the table, or, NULL, from x. (Two rows per step, two FMA chains,
 * measured slower again: 11 against 14-16 GB/s on the 0.5B's output matrix.) */
PI_GEMV_INLINE float q8_0_gemv_row(int64_t nb, const pi_block_q8_0 *w, const pi_block_q8_0 *x, const float *xd) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++) {
        _mm_prefetch((const char *)(w + i) + PI_GEMV_PF, _MM_HINT_T0);
        const __m256i q = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i s = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)x[i].qs), q);
        const __m256i d4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(q), s), ones);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d4), gemv32_d(w + i, xd ? xd[i] : _cvtsh_ss(x[i].d)), acc);
    }
    return hsum256(acc);
}

static void matvec_q8_0(int64_t n, int64_t n_rows, float *y, const void *vw, int64_t wrow, const void *vx) {
    const pi_block_q8_0 *x = vx;
    const int64_t nb = n / PI_QK;
    const char *w = vw;
    if (nb > PI_GEMV32_MAXB) {
        for (int64_t r = 0; r < n_rows; r++) y[r] = q8_0_gemv_row(nb, (const pi_block_q8_0 *)(w + r * wrow), x, NULL);
        return;
    }
    float xd[PI_GEMV32_MAXB];
    for (int64_t i = 0; i < nb; i++) xd[i] = _cvtsh_ss(x[i].d);
    for (int64_t r = 0; r < n_rows; r++) y[r] = q8_0_gemv_row(nb, (const pi_block_q8_0 *)(w + r * wrow), x, xd);
}

#endif /* PI_ISA_X86_GEMV32_H */
