/*
 * pi_cuda.h - the CUDA device of the hybrid executor (issue 6; docs/placement.md).
 *
 * Built as its own shared object, libpi_cuda.so, only when POWERINFER_CUDA=1 at build
 * time; the Python side (powerinfer_backend/cuda_device.py) dlopens it when a user asks
 * for the "cuda" device, so the main library and every CPU path never need a CUDA
 * driver. It mirrors the cpu-device entry points of powerinfer.h (section "Devices"):
 * a memory pool reserved once (cudaMalloc) that refuses more, the upload of one
 * layer's hot FFN rows as compact rows with a row -> neuron map, and an asynchronous
 * run of those rows on the device's stream while the host computes the cold neurons.
 *
 * Conventions as powerinfer.h: status codes are enum pi_status (PI_OK 0, PI_ERR_INVALID
 * 1, PI_ERR_NOMEM 2, PI_ERR_UNSUPPORTED 3), type ids are ggml's (enum pi_type), and a
 * failure leaves a message for pi_cuda_last_error() (thread-local; CUDA failures name
 * the call and cudaGetErrorString). cffi reads this file in ABI mode (preprocessor
 * lines and comments dropped), so keep it to plain typedefs and prototypes.
 */
#ifndef PI_CUDA_H
#define PI_CUDA_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pi_cuda_device pi_cuda_device;
typedef struct pi_cuda_ffn pi_cuda_ffn;

typedef struct pi_cuda_stats {
    int64_t reserved;        /* bytes reserved at creation (one cudaMalloc) */
    int64_t used;            /* bytes handed out, each piece rounded up to 256 */
    int64_t high_water;      /* most bytes ever handed out (<= reserved) */
    int64_t n_refused;       /* allocations refused (past the reservation) */
    int64_t n_jobs;          /* device halves run to completion */
    int64_t rows;            /* hot rows processed, summed over tokens */
    int64_t total_bytes;     /* device memory (cudaMemGetInfo total) */
    int64_t context_bytes;   /* total - free right after the context was created: the CUDA
                              * context, and anything other processes hold on the device */
    int64_t workspace_bytes; /* free after the context - free after our streams, events and
                              * kernel modules were loaded (before the reservation) */
    int64_t free_bytes;      /* free memory after context + workspace, before the reservation:
                              * what placement may plan with */
    int32_t device;          /* CUDA device ordinal */
    int32_t cc_major, cc_minor; /* compute capability */
    int32_t runtime_version, driver_version; /* e.g. 13000 */
    char name[96];           /* device name, NUL-terminated */
} pi_cuda_stats;

/* Number of CUDA devices. PI_ERR_UNSUPPORTED (message from the runtime, e.g. "CUDA
 * driver version is insufficient" or "no CUDA-capable device is detected") when there
 * is no driver or no device. */
int pi_cuda_device_count(int32_t *out);

/* Create the device on ordinal `device`: the context, a non-blocking stream, an event,
 * the kernels loaded, then reserve_bytes (>= 0; 0 = measure only) with one cudaMalloc.
 * Memory is measured with cudaMemGetInfo after the context and again after the
 * workspace (see pi_cuda_stats). PI_ERR_NOMEM when the reservation fails. */
int pi_cuda_create(int32_t device, int64_t reserve_bytes, pi_cuda_device **out);
/* Frees the reservation, stream and event (the primary context stays, as the runtime
 * keeps it for the process). Waits for a job still running. */
void pi_cuda_free(pi_cuda_device *dev);
/* Hand out nbytes (rounded up to 256) of the reservation; PI_ERR_NOMEM past it (counted
 * in n_refused). *out is a device pointer. */
int pi_cuda_alloc(pi_cuda_device *dev, int64_t nbytes, void **out);
int pi_cuda_get_stats(const pi_cuda_device *dev, pi_cuda_stats *out);

/* FFN forms: enum pi_ffn_act of powerinfer.h (0 SwiGLU silu(g)*u, 1 GeGLU gelu_tanh(g)*u,
 * 2 ReLU-gated relu(g)*u, 3 dReLU relu(g)*relu(u)) plus 4: ungated ReLU h = relu(up.x)
 * (no gate matrix; OPT-style fc1 -> relu -> fc2, with fc1 passed as `up`). */
enum { PI_CUDA_FFN_RELU_UNGATED = 4 };

/* Device bytes pi_cuda_ffn_upload takes, each piece rounded up to 256: gate (when
 * has_gate), up and down_t rows and the int32 map (n_hot rows each); x and y (max_tok
 * rows of n_embd floats); the converted x (Q8 quants + scales, or F16); h, kept ids and
 * kept values (max_tok x n_hot each, 4 bytes); kept counts (max_tok int32); the down
 * partial sums (PI_CUDA_DOWN_SPLIT x max_tok x n_embd floats when max_tok <=
 * PI_CUDA_DOWN_SPLIT_MAX_TOK). 0 when n_hot == 0; -1 for bad types or sizes. */
enum { PI_CUDA_DOWN_SPLIT = 8, PI_CUDA_DOWN_SPLIT_MAX_TOK = 8 };
int64_t pi_cuda_ffn_bytes(int32_t gate_up_type, int32_t down_t_type, int64_t n_embd, int64_t n_hot,
                          int64_t max_tok, int32_t has_gate);

/* Copy one layer's hot rows to the device as compact rows: row r = neuron hot_ids[r]
 * (strictly increasing, < n_ff). gate (NULL = ungated), up: host, n_ff rows of n_embd
 * elements of gate_up_type (F32, F16, Q4_0, Q4_1, Q8_0); down_t: host, n_ff rows of
 * n_embd of down_t_type (F32, F16, Q8_0, Q4_0). All or nothing: PI_ERR_NOMEM with
 * nothing allocated when pi_cuda_ffn_bytes exceeds what is left of the reservation.
 * Synchronous (the host buffers may be freed on return). */
int pi_cuda_ffn_upload(pi_cuda_device *dev, int32_t gate_up_type, const void *gate, const void *up,
                       int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t,
                       const int32_t *hot_ids, int64_t n_hot, int64_t max_tok, pi_cuda_ffn **out);
/* Host-side resources only: the device memory returns with the device (bump pool). */
void pi_cuda_ffn_free(pi_cuda_ffn *f);
int64_t pi_cuda_ffn_n_hot(const pi_cuda_ffn *f);

/* Start the device half of n_tok <= max_tok tokens: x (host, n_tok rows of n_embd
 * floats; copied before return) goes to the device and the hot rows run on the
 * device's stream; returns without waiting. For each hot row r and token t:
 * h = act(gate_r.x, up_r.x) with x converted as the CPU converts it (Q8_0 for
 * Q4_0/Q8_0, Q8_1 for Q4_1, F16 for F16); h is kept unless h == 0 or |h| < threshold
 * (NaN kept), as pi_op_ffn_sparse; the ReLU forms skip the up row when gate.x <= 0.
 * Then y_dev[t] = sum of h_r * down_t[r] over the kept rows in increasing r, in
 * PI_CUDA_DOWN_SPLIT fixed contiguous pieces added in piece order (one piece when
 * max_tok > PI_CUDA_DOWN_SPLIT_MAX_TOK), without FMA and without atomics, so reruns
 * give identical bits. One job at a time per device: PI_ERR_INVALID while one is
 * pending. */
int pi_cuda_ffn_run_async(pi_cuda_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold);
/* Wait for the job pi_cuda_ffn_run_async started on f; y_device (host, n_tok rows of
 * n_embd floats) receives the device partial, n_used (optional, n_tok int64) the kept
 * rows per token. A CUDA failure of the job is reported here. */
int pi_cuda_ffn_wait(pi_cuda_ffn *f, float *y_device, int64_t *n_used);

const char *pi_cuda_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* PI_CUDA_H */
