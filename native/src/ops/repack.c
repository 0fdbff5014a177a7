/* Row groups (pi_internal.h, "Row groups"): a weight matrix laid out again so that the
 * products read PI_GROUP_ROWS rows' blocks as one stream, a row per vector lane. The
 * layout llama.cpp's repacked CPU buffers and ik_llama.cpp's interleaved rows use for
 * the same reason: one FMA per block for all the rows, and one sequential stream for the
 * hardware prefetchers instead of one per row. */
#include <stdlib.h>
#include <string.h>

#include "kquants.h"
#include "pi_internal.h"

int64_t pi_repack_size(int32_t type, int64_t n_rows, int64_t n_cols) {
    const int layout = type == PI_TYPE_Q4_0 || type == PI_TYPE_Q5_0 || type == PI_TYPE_Q8_0 || type == PI_TYPE_Q4_K ||
                       type == PI_TYPE_Q5_K || type == PI_TYPE_Q6_K;
    if (!layout || n_rows < 1 || n_rows % PI_GROUP_ROWS != 0 || n_cols < 1) return -1;
    const int64_t row = pi_row_size(type, n_cols);
    return row < 0 ? -1 : row * n_rows;
}

/* block i of the 16 rows src[r * nb + i] (r < 16) into one group block */
static void group_q4_0(pi_block_q4_0x16 *o, const pi_block_q4_0 *src, int64_t nb) {
    for (int r = 0; r < PI_GROUP_ROWS; r++) {
        const pi_block_q4_0 *b = &src[r * nb];
        o->d[r] = b->d;
        for (int c = 0; c < 4; c++) memcpy(o->qs[c][r], b->qs + 4 * c, 4);
    }
}

static void group_q5_0(pi_block_q5_0x16 *o, const pi_block_q5_0 *src, int64_t nb) {
    memset(o->hb, 0, sizeof o->hb);
    for (int r = 0; r < PI_GROUP_ROWS; r++) {
        const pi_block_q5_0 *b = &src[r * nb];
        uint32_t qh;
        memcpy(&qh, b->qh, 4);
        o->d[r] = b->d;
        for (int c = 0; c < 4; c++) {
            memcpy(o->qs[c][r], b->qs + 4 * c, 4);
            for (int j = 0; j < 4; j++) {
                o->hb[c][0] |= (uint64_t)((qh >> (4 * c + j)) & 1u) << (4 * r + j);
                o->hb[c][1] |= (uint64_t)((qh >> (16 + 4 * c + j)) & 1u) << (4 * r + j);
            }
        }
    }
}

static void group_q8_0(pi_block_q8_0x16 *o, const pi_block_q8_0 *src, int64_t nb) {
    for (int r = 0; r < PI_GROUP_ROWS; r++) {
        const pi_block_q8_0 *b = &src[r * nb];
        o->d[r] = b->d;
        for (int c = 0; c < 8; c++) memcpy(o->qs[c][r], b->qs + 4 * c, 4);
    }
}

/* Q4_K (q5 = 0) / Q5_K (q5 = 1): the source blocks share d, dmin, scales; Q5_K adds qh */
static void group_k(void *out, const void *src, int64_t nb, int q5) {
    pi_block_q4_Kx16 *o = out;
    pi_block_q5_Kx16 *o5 = out;
    uint8_t(*qs)[PI_GROUP_ROWS][4] = q5 ? o5->qs : o->qs;
    for (int r = 0; r < PI_GROUP_ROWS; r++) {
        const pi_block_q5_K *b5 = q5 ? (const pi_block_q5_K *)src + r * nb : NULL;
        const pi_block_q4_K *b = q5 ? (const void *)b5 : (const pi_block_q4_K *)src + r * nb; /* the shared fields */
        o->d[r] = b->d;
        o->dmin[r] = b->dmin;
        for (int k = 0; k < 3; k++) memcpy(&o->scales[k][r], b->scales + 4 * k, 4);
        for (int c = 0; q5 && c < 8; c++) memcpy(o5->qh[c][r], b5->qh + 4 * c, 4);
        for (int c = 0; c < 32; c++) memcpy(qs[c][r], (q5 ? b5->qs : b->qs) + 4 * c, 4);
    }
}

/* Q6_K: the 6-bit values of each row (decoded, + 32) spread over the sub-blocks' vectors */
static void group_q6_K(pi_block_q6_Kx16 *o, const pi_block_q6_K *src, int64_t nb) {
    for (int r = 0; r < PI_GROUP_ROWS; r++) {
        const pi_block_q6_K *b = &src[r * nb];
        int8_t q[PI_QK_K];
        pi_decode_q6_K(b, q);
        o->d[r] = b->d;
        for (int j = 0; j < 16; j++) {
            o->scales[j][r] = b->scales[j];
            for (int k = 0; k < 4; k++) { /* quad c's element k: u[4c] */
                const int8_t *u = q + 16 * j + k;
                const int u0 = u[0] + 32, u1 = u[4] + 32, u2 = u[8] + 32, u3 = u[12] + 32;
                o->sub[j].ql[0][r][k] = (uint8_t)((u0 & 0x0F) | (u1 & 0x0F) << 4);
                o->sub[j].ql[1][r][k] = (uint8_t)((u2 & 0x0F) | (u3 & 0x0F) << 4);
                o->sub[j].qh[r][k] = (uint8_t)(u0 >> 4 | (u1 >> 4) << 2 | (u2 >> 4) << 4 | (u3 >> 4) << 6);
            }
        }
    }
}

int pi_repack(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, void *out) {
    if (w == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_repack: NULL argument");
    if (pi_repack_size(type, n_rows, n_cols) < 0)
        return pi_set_error(PI_ERR_UNSUPPORTED,
                            "pi_repack: no row-group layout for type %d with %lld rows of %lld (Q4_0, Q5_0, Q8_0, Q4_K, "
                            "Q5_K or Q6_K, rows a multiple of %d)",
                            type, (long long)n_rows, (long long)n_cols, PI_GROUP_ROWS);
    const int64_t nb = n_cols / pi_type_get(type)->block_size;
    for (int64_t g = 0; g < n_rows / PI_GROUP_ROWS; g++)
        for (int64_t i = 0; i < nb; i++) {
            const int64_t first = g * PI_GROUP_ROWS * nb + i; /* block i of the group's first row */
            switch (type) {
            case PI_TYPE_Q4_0:
                group_q4_0((pi_block_q4_0x16 *)out + g * nb + i, (const pi_block_q4_0 *)w + first, nb);
                break;
            case PI_TYPE_Q5_0:
                group_q5_0((pi_block_q5_0x16 *)out + g * nb + i, (const pi_block_q5_0 *)w + first, nb);
                break;
            case PI_TYPE_Q8_0:
                group_q8_0((pi_block_q8_0x16 *)out + g * nb + i, (const pi_block_q8_0 *)w + first, nb);
                break;
            case PI_TYPE_Q5_K:
                group_k((pi_block_q5_Kx16 *)out + g * nb + i, (const pi_block_q5_K *)w + first, nb, 1);
                break;
            case PI_TYPE_Q6_K:
                group_q6_K((pi_block_q6_Kx16 *)out + g * nb + i, (const pi_block_q6_K *)w + first, nb);
                break;
            default:
                group_k((pi_block_q4_Kx16 *)out + g * nb + i, (const pi_block_q4_K *)w + first, nb, 0);
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
