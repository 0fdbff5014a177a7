/* Kernels of the device half of the split FFN, in launch order:
 *  1. convert_x: x to the gate/up activation type, as the CPU converts it (Q8_0 / Q8_1
 *     quants with round-half-even and F16 scales, or F16), so the device's dot products
 *     see the CPU's operand.
 *  2. h: one warp per (hot row, token): g = gate_r.x, u = up_r.x, h = act(g, u), and the
 *     threshold (h = 0 when dropped). The ReLU forms skip the up row when g <= 0.
 *  3. compact: one block per token lists the kept rows (h != 0) in increasing row
 *     order (ballot + prefix count, tile after tile), so the down sum only reads the
 *     rows that fire (~10% at 90% sparsity).
 *  4. down: one thread per output column; it adds h_k * down_t[k] over its piece of
 *     the kept list in list order, with separate multiply and add (no FMA). A token's
 *     list is cut into n_split fixed contiguous pieces (more blocks for one token at
 *     decode); 5. reduce adds the pieces in piece order. No float atomics anywhere, so
 *     the result depends only on the inputs, never on scheduling. */
#include <math.h>

#include "quant.cuh"

#define H_WARPS 8       /* hot rows per block of the h kernel */
#define COMPACT_THREADS 512
#define DOWN_COLS 128   /* output columns per block of the down kernel */

__global__ void convert_x_kernel(int32_t type, const float *x, int64_t n_tok, int64_t n_embd, int8_t *qs, float *d,
                                 float *s, uint16_t *xh) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (type == T_F16) { /* one element per thread */
        if (i < n_tok * n_embd) xh[i] = __half_as_ushort(__float2half_rn(x[i]));
        return;
    }
    const int64_t nb = n_embd / QK; /* one block of 32 per thread */
    if (i >= n_tok * nb) return;
    const float *xb = x + i * QK; /* blocks of consecutive tokens are contiguous: n_embd % 32 == 0 */
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
    const float dd = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        const int v = __float2int_rn(__fmul_rn(xb[j], id)); /* nearest, ties to even: the CPU's x86 rule */
        qs[i * QK + j] = (int8_t)v;
        sum += v;
    }
    d[i] = __half2float(__float2half_rn(dd));
    if (type == T_Q4_1) s[i] = __half2float(__float2half_rn(__fmul_rn((float)sum, dd)));
}

__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }
__device__ __forceinline__ float gelu_tanh(float g) {
    return 0.5f * g * (1.0f + tanhf(0.79788456080286535588f * g * (1.0f + 0.044715f * g * g)));
}

__global__ void h_kernel(int32_t act, int32_t type, const char *gate, const char *up, int64_t rb, int64_t n_hot,
                         int64_t n_embd, pi_cuda_xq xq, float thr, float *h) {
    const int lane = threadIdx.x & 31;
    const int64_t r = (int64_t)blockIdx.x * H_WARPS + threadIdx.x / 32;
    const int64_t t = blockIdx.y;
    if (r >= n_hot) return; /* whole warps only: r is the same in all lanes */
    float v;
    if (act == F_RELU_UNGATED) {
        const float u = row_dot(type, up + r * rb, xq, t, n_embd, lane);
        v = u > 0.0f ? u : 0.0f;
    } else {
        /* g is bitwise the same in every lane (warp_sum), so the branches below are warp-uniform */
        const float g = row_dot(type, gate + r * rb, xq, t, n_embd, lane);
        switch (act) {
        case F_SWIGLU:
            v = silu(g) * row_dot(type, up + r * rb, xq, t, n_embd, lane);
            break;
        case F_GEGLU:
            v = gelu_tanh(g) * row_dot(type, up + r * rb, xq, t, n_embd, lane);
            break;
        case F_RELU:
            v = g > 0.0f ? g * row_dot(type, up + r * rb, xq, t, n_embd, lane) : 0.0f;
            break;
        default: { /* F_DRELU */
            v = 0.0f;
            if (g > 0.0f) {
                const float u = row_dot(type, up + r * rb, xq, t, n_embd, lane);
                v = u > 0.0f ? g * u : 0.0f;
            }
            break;
        }
        }
    }
    if (v == 0.0f || fabsf(v) < thr) v = 0.0f; /* pi_op_ffn_sparse's rule: NaN is kept */
    if (lane == 0) h[t * n_hot + r] = v;
}

__global__ void compact_kernel(const float *h, int64_t n_hot, int32_t *kid, float *kh, int32_t *count) {
    __shared__ int warp_cnt[COMPACT_THREADS / 32];
    const int64_t t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const float *ht = h + t * n_hot;
    int32_t *kid_t = kid + t * n_hot;
    float *kh_t = kh + t * n_hot;
    int64_t base = 0;
    for (int64_t i0 = 0; i0 < n_hot; i0 += COMPACT_THREADS) {
        const int64_t i = i0 + threadIdx.x;
        const float v = i < n_hot ? ht[i] : 0.0f;
        const bool keep = v != 0.0f; /* NaN != 0: kept */
        const unsigned mask = __ballot_sync(0xffffffffu, keep);
        if (lane == 0) warp_cnt[warp] = __popc(mask);
        __syncthreads();
        int64_t off = base, total = 0;
        for (int w = 0; w < COMPACT_THREADS / 32; w++) {
            if (w < warp) off += warp_cnt[w];
            total += warp_cnt[w];
        }
        if (keep) {
            const int64_t k = off + __popc(mask & ((1u << lane) - 1u));
            kid_t[k] = (int32_t)i;
            kh_t[k] = v;
        }
        base += total;
        __syncthreads(); /* warp_cnt is rewritten by the next tile */
    }
    if (threadIdx.x == 0) count[t] = (int32_t)base;
}

__global__ void down_kernel(int32_t type, const char *down_t, int64_t rb, int64_t n_hot, int64_t n_embd,
                            const int32_t *kid, const float *kh, const int32_t *count, int32_t n_split, float *part,
                            float *y) {
    const int64_t c = (int64_t)blockIdx.x * DOWN_COLS + threadIdx.x;
    const int64_t s = blockIdx.y, t = blockIdx.z;
    if (c >= n_embd) return;
    const int64_t m = count[t];
    const int64_t k0 = m * s / n_split, k1 = m * (s + 1) / n_split;
    const int32_t *kid_t = kid + t * n_hot;
    const float *kh_t = kh + t * n_hot;
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t k = k0; k < k1; k++) /* rounded multiply, then rounded add: never contracted to an FMA */
        acc = __fadd_rn(acc, __fmul_rn(kh_t[k], down_elem(type, down_t + (int64_t)kid_t[k] * rb, c)));
    if (n_split == 1) y[t * n_embd + c] = acc;
    else part[(t * n_split + s) * n_embd + c] = acc;
}

__global__ void reduce_kernel(const float *part, int64_t n_embd, int32_t n_split, float *y) {
    const int64_t c = (int64_t)blockIdx.x * DOWN_COLS + threadIdx.x;
    const int64_t t = blockIdx.y;
    if (c >= n_embd) return;
    float acc = 0.0f;
    for (int32_t s = 0; s < n_split; s++) acc = __fadd_rn(acc, part[(t * n_split + s) * n_embd + c]);
    y[t * n_embd + c] = acc;
}

static unsigned blocks_for(int64_t n, int64_t per) { return (unsigned)((n + per - 1) / per); }

cudaError_t pi_cuda_kernels_load(void) {
    cudaFuncAttributes a;
    const void *fns[] = {(const void *)convert_x_kernel, (const void *)h_kernel, (const void *)compact_kernel,
                         (const void *)down_kernel, (const void *)reduce_kernel};
    for (const void *f : fns) {
        const cudaError_t e = cudaFuncGetAttributes(&a, f);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

cudaError_t pi_cuda_launch_convert_x(cudaStream_t stream, int32_t type, const float *x, int64_t n_tok, int64_t n_embd,
                                     int8_t *qs, float *d, float *s, uint16_t *xh) {
    if (type == T_F32) return cudaSuccess; /* the dot reads x itself */
    const int64_t n = type == T_F16 ? n_tok * n_embd : n_tok * (n_embd / QK);
    convert_x_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(type, x, n_tok, n_embd, qs, d, s, xh);
    return cudaGetLastError();
}

cudaError_t pi_cuda_launch_h(cudaStream_t stream, int32_t act, int32_t type, const char *gate, const char *up,
                             int64_t row_bytes, int64_t n_hot, int64_t n_embd, int64_t n_tok, pi_cuda_xq xq,
                             float threshold, float *h) {
    const dim3 grid(blocks_for(n_hot, H_WARPS), (unsigned)n_tok);
    h_kernel<<<grid, H_WARPS * 32, 0, stream>>>(act, type, gate, up, row_bytes, n_hot, n_embd, xq, threshold, h);
    return cudaGetLastError();
}

cudaError_t pi_cuda_launch_compact(cudaStream_t stream, const float *h, int64_t n_hot, int64_t n_tok, int32_t *kid,
                                   float *kh, int32_t *count) {
    compact_kernel<<<(unsigned)n_tok, COMPACT_THREADS, 0, stream>>>(h, n_hot, kid, kh, count);
    return cudaGetLastError();
}

cudaError_t pi_cuda_launch_down(cudaStream_t stream, int32_t down_type, const char *down_t, int64_t row_bytes,
                                int64_t n_hot, int64_t n_embd, int64_t n_tok, const int32_t *kid, const float *kh,
                                const int32_t *count, int32_t n_split, float *part, float *y) {
    const dim3 grid(blocks_for(n_embd, DOWN_COLS), (unsigned)n_split, (unsigned)n_tok);
    down_kernel<<<grid, DOWN_COLS, 0, stream>>>(down_type, down_t, row_bytes, n_hot, n_embd, kid, kh, count, n_split,
                                                part, y);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || n_split == 1) return e;
    reduce_kernel<<<dim3(blocks_for(n_embd, DOWN_COLS), (unsigned)n_tok), DOWN_COLS, 0, stream>>>(part, n_embd,
                                                                                                  n_split, y);
    return cudaGetLastError();
}
