/* Internal declarations shared by the CUDA device sources (not part of the API). */
#ifndef PI_CUDA_COMMON_CUH
#define PI_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "pi_cuda.h"

/* the status codes of powerinfer.h (enum pi_status); repeated so this library builds
 * from native/cuda/ alone */
enum { PI_OK = 0, PI_ERR_INVALID = 1, PI_ERR_NOMEM = 2, PI_ERR_UNSUPPORTED = 3 };
/* ggml type ids this device handles */
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q8_0 = 8 };
/* enum pi_ffn_act, plus PI_CUDA_FFN_RELU_UNGATED */
enum { F_SWIGLU = 0, F_GEGLU = 1, F_RELU = 2, F_DRELU = 3, F_RELU_UNGATED = 4 };

#define PI_CUDA_ALIGN 256
#define PI_API extern "C" __attribute__((visibility("default")))

/* printf-style message for pi_cuda_last_error(); returns code */
int pi_cuda_set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A failed CUDA call becomes PI_ERR_NOMEM (allocation failures) or PI_ERR_UNSUPPORTED
 * (anything else: no driver, launch failure, sticky errors) with the call's text. */
int pi_cuda_fail(cudaError_t err, const char *fn, const char *call);
#define PI_CU(fn, call)                                               \
    do {                                                              \
        cudaError_t e_ = (call);                                      \
        if (e_ != cudaSuccess) return pi_cuda_fail(e_, (fn), #call);  \
    } while (0)

static inline int64_t pi_cuda_align(int64_t n) { return (n + PI_CUDA_ALIGN - 1) / PI_CUDA_ALIGN * PI_CUDA_ALIGN; }

/* bytes of a row of n elements of a gate/up or down_t type; -1 when unsupported or n is
 * not a multiple of the block size */
int64_t pi_cuda_row_size(int32_t type, int64_t n);

struct pi_cuda_device {
    int32_t device;
    char *mem; /* the reservation (device memory) */
    int64_t reserved, used, high_water, n_refused, n_jobs, rows;
    int64_t total_bytes, context_bytes, workspace_bytes, free_bytes;
    int32_t cc_major, cc_minor, runtime_version, driver_version;
    char name[96];
    cudaStream_t stream;
    cudaEvent_t done;
    pi_cuda_ffn *busy; /* the upload whose job is pending, or NULL */
};

/* The converted x of n_tok tokens, the gate/up dot products' activation operand:
 * Q8 quants (n_tok x n_embd int8) with per-block scales d (F16-rounded, as floats) and
 * for Q8_1 s = d * sum(q) (F16-rounded); or F16 x; or the F32 x itself. */
struct pi_cuda_xq {
    const int8_t *qs;
    const float *d, *s;
    const uint16_t *xh;
    const float *xf;
};

/* ---- kernel launchers (ffn_kernels.cu); all enqueue on `stream` ---- */
/* forces the kernels' module to load now, so its memory is measured as workspace */
cudaError_t pi_cuda_kernels_load(void);
cudaError_t pi_cuda_launch_convert_x(cudaStream_t stream, int32_t gate_up_type, const float *x, int64_t n_tok,
                                     int64_t n_embd, int8_t *qs, float *d, float *s, uint16_t *xh);
cudaError_t pi_cuda_launch_h(cudaStream_t stream, int32_t act, int32_t type, const char *gate, const char *up,
                             int64_t row_bytes, int64_t n_hot, int64_t n_embd, int64_t n_tok, pi_cuda_xq xq,
                             float threshold, float *h);
cudaError_t pi_cuda_launch_compact(cudaStream_t stream, const float *h, int64_t n_hot, int64_t n_tok, int32_t *kid,
                                   float *kh, int32_t *count);
cudaError_t pi_cuda_launch_down(cudaStream_t stream, int32_t down_type, const char *down_t, int64_t row_bytes,
                                int64_t n_hot, int64_t n_embd, int64_t n_tok, const int32_t *kid, const float *kh,
                                const int32_t *count, int32_t n_split, float *part, float *y);

#endif
