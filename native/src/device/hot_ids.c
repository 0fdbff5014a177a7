/* The placement's hot/cold neuron lists, shared by every device (device.h). */
#include "device/device.h"

int pi_ffn_check_hot_ids(const char *fn, const int32_t *hot_ids, int64_t n_hot, int64_t n_ff) {
    for (int64_t r = 0; r < n_hot; r++)
        if (hot_ids[r] < 0 || hot_ids[r] >= n_ff || (r > 0 && hot_ids[r] <= hot_ids[r - 1]))
            return pi_set_error(PI_ERR_INVALID, "%s: hot ids must be strictly increasing in [0, %lld) (id %d at %lld)",
                                fn, (long long)n_ff, hot_ids[r], (long long)r);
    return PI_OK;
}

void pi_ffn_cold_ids(const int32_t *hot_ids, int64_t n_hot, int64_t n_ff, int32_t *cold) {
    for (int64_t j = 0, r = 0, c = 0; j < n_ff; j++) {
        if (r < n_hot && hot_ids[r] == j) r++;
        else cold[c++] = (int32_t)j;
    }
}
