/* The kernel table every ISA file exports, once per F16 order (pi_internal.h; select.c
 * picks one): each file defines the same static kernel names, so one initializer serves
 * all three and a kernel added to one table cannot be forgotten in another. */
#ifndef PI_ISA_TABLE_H
#define PI_ISA_TABLE_H

#include "softmax.h" /* softmax_w8 / softmax_w16: after the including file's target pragma */
#include "ffn_act.h" /* silu_mul_w8_c / _w16_c, gelu16_mul_c, unless the file has vector loops: */
#ifndef PI_SILU_MUL_W8
#define PI_SILU_MUL_W8 silu_mul_w8_c
#endif
#ifndef PI_SILU_MUL_W16
#define PI_SILU_MUL_W16 silu_mul_w16_c
#endif
#ifndef PI_GELU16_MUL
#define PI_GELU16_MUL gelu16_mul_c
#endif

/* single-token kernels: x86_gemv.h defines them (and this list); elsewhere none */
#ifndef PI_ISA_MATVEC
#define PI_ISA_MATVEC {0}
#endif

#define PI_ISA_TABLE_(NAME, F16_DOT, F16F32_DOT, SOFTMAX, SILU, TILES, BATCH)                                         \
    {                                                                                               \
        .name = NAME,                                                                               \
        .vec_dot =                                                                                  \
            {                                                                                       \
                [PI_TYPE_F32] = vec_dot_f32,                                                        \
                [PI_TYPE_F16] = F16_DOT,                                                            \
                [PI_TYPE_BF16] = vec_dot_bf16,                                                      \
                [PI_TYPE_Q4_0] = vec_dot_q4_0,                                                      \
                [PI_TYPE_Q4_1] = vec_dot_q4_1,                                                      \
                [PI_TYPE_Q8_0] = vec_dot_q8_0,                                                      \
                [PI_TYPE_Q5_0] = vec_dot_q5_0,                                                      \
                [PI_TYPE_Q4_K] = vec_dot_q4_K,                                                      \
                [PI_TYPE_Q5_K] = vec_dot_q5_K,                                                      \
                [PI_TYPE_Q6_K] = vec_dot_q6_K,                                                      \
            },                                                                                      \
        .from_float =                                                                               \
            {                                                                                       \
                [PI_TYPE_F32] = from_float_f32,                                                     \
                [PI_TYPE_F16] = from_float_f16,                                                     \
                [PI_TYPE_BF16] = from_float_bf16,                                                   \
                [PI_TYPE_Q8_0] = from_float_q8_0,                                                   \
                [PI_TYPE_Q8_1] = from_float_q8_1,                                                   \
                [PI_TYPE_Q8_K] = from_float_q8_K,                                                   \
            },                                                                                      \
        .dot_f16_f32 = F16F32_DOT,                                                                  \
        .f16_floats = PI_F16_FLOATS,                                                                \
        .matvec = PI_ISA_MATVEC,                                                                    \
        .matmul_tiles =                                                                             \
            {                                                                                       \
                [PI_TYPE_Q4_0] = matmul_tiles_q4_0,                                                 \
                [PI_TYPE_Q4_1] = matmul_tiles_q4_1,                                                 \
                [PI_TYPE_Q8_0] = matmul_tiles_q8_0,                                                 \
                [PI_TYPE_Q5_0] = matmul_tiles_q5_0,                                                 \
                [PI_TYPE_Q4_K] = matmul_tiles_q4_K,                                                 \
                [PI_TYPE_Q5_K] = matmul_tiles_q5_K,                                                 \
                [PI_TYPE_Q6_K] = matmul_tiles_q6_K,                                                 \
            },                                                                                      \
        .matmul_groups = {[PI_TYPE_Q4_0] = matmul_groups_q4_0, [PI_TYPE_Q5_0] = matmul_groups_q5_0,  \
                          [PI_TYPE_Q8_0] = matmul_groups_q8_0, [PI_TYPE_Q4_K] = matmul_groups_q4_K,   \
                          [PI_TYPE_Q5_K] = matmul_groups_q5_K, [PI_TYPE_Q6_K] = matmul_groups_q6_K},   \
        .softmax = SOFTMAX,                                                                         \
        .silu_mul = SILU,                                                                           \
        .gelu16_mul = PI_GELU16_MUL,                                                                \
        .down_tiles = TILES,                                                                        \
        .down_batch = BATCH,                                                                        \
    }

/* const pi_isa VAR[PI_F16_ORDERS]: the tables of one ISA, TILES and BATCH its sparse down kernels */
#define PI_ISA_DEFINE(VAR, NAME, TILES, BATCH)                                                      \
    const pi_isa VAR[PI_F16_ORDERS] = {                                                             \
        [PI_F16_ORDER_AVX2] = PI_ISA_TABLE_(NAME, vec_dot_f16_step32, vec_dot_f16f32_step32, softmax_w8,  \
                                            PI_SILU_MUL_W8, TILES, BATCH),                          \
        [PI_F16_ORDER_AVX512] = PI_ISA_TABLE_(NAME, vec_dot_f16_step64, vec_dot_f16f32_step64,       \
                                              softmax_w16, PI_SILU_MUL_W16, TILES, BATCH),          \
    }

#endif
