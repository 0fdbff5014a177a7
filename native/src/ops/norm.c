/* RMSNorm (Zhang & Sennrich 2019) and LayerNorm (Falcon, OPT), with the sums in
 * double as ggml does. */
#include "pi_internal.h"

void pi_rmsnorm_rows(const float *x, const float *w, int64_t n, int64_t n_rows, float eps, float *y) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)(xr[i] * xr[i]);
        const float scale = 1.0f / sqrtf((float)(sum / n) + eps);
        if (w != NULL)
            for (int64_t i = 0; i < n; i++) yr[i] = (xr[i] * scale) * w[i];
        else
            for (int64_t i = 0; i < n; i++) yr[i] = xr[i] * scale;
    }
}

int pi_op_rmsnorm(const float *x, const float *w, int64_t n, int64_t n_rows, float eps, float *y) {
    if (x == NULL || y == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_rmsnorm: NULL argument");
    if (n < 1 || n_rows < 0) return pi_set_error(PI_ERR_INVALID, "pi_op_rmsnorm: bad sizes");
    pi_rmsnorm_rows(x, w, n, n_rows, eps, y);
    return PI_OK;
}

/* ggml_norm then ggml_mul by w and ggml_add of b: the same roundings, in that order */
void pi_layernorm_rows(const float *x, const float *w, const float *b, int64_t n, int64_t n_rows, float eps,
                       float *y) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) sum += (double)xr[i];
        const float mean = (float)(sum / n);
        double sum2 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float v = xr[i] - mean;
            yr[i] = v;
            sum2 += (double)(v * v);
        }
        const float scale = 1.0f / sqrtf((float)(sum2 / n) + eps);
        for (int64_t i = 0; i < n; i++) yr[i] *= scale;
        if (w != NULL)
            for (int64_t i = 0; i < n; i++) yr[i] *= w[i];
        if (b != NULL)
            for (int64_t i = 0; i < n; i++) yr[i] += b[i];
    }
}

int pi_op_layernorm(const float *x, const float *w, const float *b, int64_t n, int64_t n_rows, float eps, float *y) {
    if (x == NULL || y == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_layernorm: NULL argument");
    if (n < 1 || n_rows < 0 || !(eps >= 0.0f)) return pi_set_error(PI_ERR_INVALID, "pi_op_layernorm: bad sizes or eps");
    pi_layernorm_rows(x, w, b, n, n_rows, eps, y);
    return PI_OK;
}
