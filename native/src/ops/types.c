/* Block sizes and activation types of the supported tensor types. */
#include "pi_internal.h"

static const pi_type_traits k_traits[PI_TYPE_SLOTS] = {
    [PI_TYPE_F32] = {"f32", 1, 4, PI_TYPE_F32},
    [PI_TYPE_F16] = {"f16", 1, 2, PI_TYPE_F16},
    [PI_TYPE_Q4_0] = {"q4_0", PI_QK, sizeof(pi_block_q4_0), PI_TYPE_Q8_0},
    [PI_TYPE_Q4_1] = {"q4_1", PI_QK, sizeof(pi_block_q4_1), PI_TYPE_Q8_1},
    [PI_TYPE_Q8_0] = {"q8_0", PI_QK, sizeof(pi_block_q8_0), PI_TYPE_Q8_0},
    [PI_TYPE_Q8_1] = {"q8_1", PI_QK, sizeof(pi_block_q8_1), PI_TYPE_Q8_1},
    [PI_TYPE_Q5_0] = {"q5_0", PI_QK, sizeof(pi_block_q5_0), PI_TYPE_Q8_0},
    [PI_TYPE_Q4_K] = {"q4_K", PI_QK_K, sizeof(pi_block_q4_K), PI_TYPE_Q8_K},
    [PI_TYPE_Q5_K] = {"q5_K", PI_QK_K, sizeof(pi_block_q5_K), PI_TYPE_Q8_K},
    [PI_TYPE_Q6_K] = {"q6_K", PI_QK_K, sizeof(pi_block_q6_K), PI_TYPE_Q8_K},
    [PI_TYPE_Q8_K] = {"q8_K", PI_QK_K, sizeof(pi_block_q8_K), PI_TYPE_Q8_K},
    [PI_TYPE_BF16] = {"bf16", 1, 2, PI_TYPE_BF16},
};

const pi_type_traits *pi_type_get(int32_t type) {
    if (type < 0 || type >= PI_TYPE_SLOTS || k_traits[type].name == NULL) return NULL;
    return &k_traits[type];
}

int pi_type_is_weight(int32_t type) {
    return pi_type_get(type) != NULL && type != PI_TYPE_Q8_1 && type != PI_TYPE_Q8_K;
}

int64_t pi_row_size(int32_t type, int64_t n) {
    const pi_type_traits *t = pi_type_get(type);
    if (t == NULL || n < 0 || n % t->block_size != 0) return -1;
    return n / t->block_size * t->type_size;
}
