/* Row groups (pi_internal.h, "Row groups"): a weight matrix laid out again so that the
 * products read PI_GROUP_ROWS rows' blocks as one stream, a row per vector lane. The
 * layout llama.cpp's repacked CPU buffers and ik_llama.cpp's interleaved rows use for
 * the same reason: one FMA per block for all the rows, and one sequential stream for the
 * hardware prefetchers instead of one per row. */
#include <stdlib.h>
#include <string.h>

#include "pi_internal.h"

int64_t pi_repack_size(int32_t type, int64_t n_rows, int64_t n_cols) {
    if (type != PI_TYPE_Q4_0 || n_rows < 1 || n_rows % PI_GROUP_ROWS != 0 || n_cols < 1 || n_cols % PI_QK != 0)
        return -1;
    return pi_row_size(type, n_cols) * n_rows;
}

int pi_repack(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, void *out) {
    if (w == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_repack: NULL argument");
    if (pi_repack_size(type, n_rows, n_cols) < 0)
        return pi_set_error(PI_ERR_UNSUPPORTED,
                            "pi_repack: no row-group layout for type %d with %lld rows of %lld (Q4_0, rows a "
                            "multiple of %d)",
                            type, (long long)n_rows, (long long)n_cols, PI_GROUP_ROWS);
    const int64_t nb = n_cols / PI_QK;
    const pi_block_q4_0 *src = w;
    pi_block_q4_0x16 *dst = out;
    for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++)
        for (int64_t i = 0; i < nb; i++) {
            pi_block_q4_0x16 *o = &dst[g * nb + i];
            for (int r = 0; r < PI_GROUP_ROWS; r++) {
                const pi_block_q4_0 *b = &src[(g * PI_GROUP_ROWS + r) * nb + i];
                o->d[r] = b->d;
                for (int c = 0; c < 4; c++) memcpy(o->qs[c][r], b->qs + 4 * c, 4);
            }
        }
    return PI_OK;
}

int pi_op_matmul_grouped(pi_pool *pool, int32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                         const float *x, int64_t n_tok, float *y) {
    if (pool == NULL || w == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_op_matmul_grouped: NULL argument");
    if (pi_repack_size(type, n_rows, n_cols) < 0 || n_tok < 1)
        return pi_set_error(PI_ERR_INVALID, "pi_op_matmul_grouped: no row-group layout for type %d, %lld x %lld",
                            type, (long long)n_rows, (long long)n_cols);
    void *scratch = malloc((size_t)pi_matmul_scratch_size(type, n_cols, n_tok));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_op_matmul_grouped: out of memory");
    const pi_mat m = {w, type, n_cols, n_rows, 1};
    const pi_matmul_out o = {&m, y, n_rows};
    pi_matmul_multi(pool, &o, 1, x, n_tok, scratch);
    free(scratch);
    return PI_OK;
}
