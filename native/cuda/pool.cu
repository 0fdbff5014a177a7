/* The CUDA device: errors, start-up memory measurement, and the memory pool.
 *
 * The pool is one cudaMalloc of the whole reservation at creation, handed out in
 * 256-byte aligned pieces by a bump pointer and never grown: what placement planned is
 * exactly what is held, and an allocation past it is refused (PI_ERR_NOMEM, counted in
 * n_refused) instead of failing later inside a run. Same accounting as the cpu-device
 * (native/src/device/cpu_device.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

static thread_local char g_err[512];

int pi_cuda_set_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return code;
}

int pi_cuda_fail(cudaError_t err, const char *fn, const char *call) {
    cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */
    const int code = err == cudaErrorMemoryAllocation ? PI_ERR_NOMEM : PI_ERR_UNSUPPORTED;
    return pi_cuda_set_error(code, "%s: %s failed: %s (%s)", fn, call, cudaGetErrorString(err), cudaGetErrorName(err));
}

PI_API const char *pi_cuda_last_error(void) { return g_err; }

int64_t pi_cuda_row_size(int32_t type, int64_t n) {
    if (n < 1) return -1;
    switch (type) {
    case T_F32:
        return n * 4;
    case T_F16:
        return n * 2;
    case T_Q4_0:
    case T_Q4_1:
    case T_Q8_0:
        if (n % 32 != 0) return -1;
        return n / 32 * (type == T_Q4_0 ? 18 : type == T_Q4_1 ? 20 : 34);
    default:
        return -1;
    }
}

PI_API int pi_cuda_device_count(int32_t *out) {
    static const char *fn = "pi_cuda_device_count";
    if (out == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    *out = 0;
    int n = 0;
    PI_CU(fn, cudaGetDeviceCount(&n));
    *out = n;
    return PI_OK;
}

static void destroy(pi_cuda_device *d) {
    if (d->mem) cudaFree(d->mem);
    if (d->done) cudaEventDestroy(d->done);
    if (d->stream) cudaStreamDestroy(d->stream);
    free(d);
}

/* the steps of pi_cuda_create after the struct exists; on failure the caller destroys d */
static int start(pi_cuda_device *d, int64_t reserve_bytes) {
    static const char *fn = "pi_cuda_create";
    PI_CU(fn, cudaSetDevice(d->device));
    PI_CU(fn, cudaFree(0)); /* creates (or retains) the primary context now, before measuring */
    size_t free0 = 0, free1 = 0, total = 0;
    PI_CU(fn, cudaMemGetInfo(&free0, &total));
    PI_CU(fn, cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    PI_CU(fn, cudaEventCreateWithFlags(&d->done, cudaEventDisableTiming));
    PI_CU(fn, pi_cuda_kernels_load()); /* lazy module loading would otherwise take memory at the first run */
    PI_CU(fn, cudaDeviceSynchronize());
    PI_CU(fn, cudaMemGetInfo(&free1, &total));
    d->total_bytes = (int64_t)total;
    d->context_bytes = (int64_t)(total - free0);
    d->workspace_bytes = free0 > free1 ? (int64_t)(free0 - free1) : 0;
    d->free_bytes = (int64_t)free1;
    cudaDeviceProp p;
    PI_CU(fn, cudaGetDeviceProperties(&p, d->device));
    d->cc_major = p.major;
    d->cc_minor = p.minor;
    memcpy(d->name, p.name, sizeof d->name - 1); /* truncated; calloc left the final NUL */
    PI_CU(fn, cudaRuntimeGetVersion(&d->runtime_version));
    PI_CU(fn, cudaDriverGetVersion(&d->driver_version));
    if (reserve_bytes > 0) {
        const cudaError_t e = cudaMalloc((void **)&d->mem, (size_t)pi_cuda_align(reserve_bytes));
        if (e != cudaSuccess) {
            d->mem = NULL;
            cudaGetLastError();
            return pi_cuda_set_error(PI_ERR_NOMEM, "%s: cannot reserve %lld bytes on device %d (%lld free): %s", fn,
                                     (long long)reserve_bytes, d->device, (long long)free1, cudaGetErrorString(e));
        }
    }
    d->reserved = reserve_bytes; /* the pool hands out at most what was asked for */
    return PI_OK;
}

PI_API int pi_cuda_create(int32_t device, int64_t reserve_bytes, pi_cuda_device **out) {
    static const char *fn = "pi_cuda_create";
    if (out == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    *out = NULL;
    if (reserve_bytes < 0) return pi_cuda_set_error(PI_ERR_INVALID, "%s: reserve_bytes must be >= 0", fn);
    int n = 0;
    PI_CU(fn, cudaGetDeviceCount(&n));
    if (device < 0 || device >= n)
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: device %d out of range [0, %d)", fn, device, n);
    pi_cuda_device *d = (pi_cuda_device *)calloc(1, sizeof *d);
    if (d == NULL) return pi_cuda_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    d->device = device;
    const int rc = start(d, reserve_bytes);
    if (rc != PI_OK) {
        destroy(d);
        return rc;
    }
    *out = d;
    return PI_OK;
}

PI_API void pi_cuda_free(pi_cuda_device *d) {
    if (d == NULL) return;
    cudaSetDevice(d->device);
    if (d->stream) cudaStreamSynchronize(d->stream); /* a pending job still reads the pool */
    destroy(d);
}

PI_API int pi_cuda_alloc(pi_cuda_device *d, int64_t nbytes, void **out) {
    if (d == NULL || out == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "pi_cuda_alloc: NULL argument");
    *out = NULL;
    if (nbytes < 0) return pi_cuda_set_error(PI_ERR_INVALID, "pi_cuda_alloc: nbytes must be >= 0");
    const int64_t need = pi_cuda_align(nbytes);
    if (need > d->reserved - d->used) {
        d->n_refused++;
        return pi_cuda_set_error(PI_ERR_NOMEM,
                                 "pi_cuda_alloc: %lld bytes (%lld aligned) exceed the device reservation: %lld of "
                                 "%lld bytes in use",
                                 (long long)nbytes, (long long)need, (long long)d->used, (long long)d->reserved);
    }
    *out = d->mem + d->used;
    d->used += need;
    if (d->used > d->high_water) d->high_water = d->used;
    return PI_OK;
}

PI_API int pi_cuda_get_stats(const pi_cuda_device *d, pi_cuda_stats *out) {
    if (d == NULL || out == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "pi_cuda_get_stats: NULL argument");
    memset(out, 0, sizeof *out);
    out->reserved = d->reserved;
    out->used = d->used;
    out->high_water = d->high_water;
    out->n_refused = d->n_refused;
    out->n_jobs = d->n_jobs;
    out->rows = d->rows;
    out->total_bytes = d->total_bytes;
    out->context_bytes = d->context_bytes;
    out->workspace_bytes = d->workspace_bytes;
    out->free_bytes = d->free_bytes;
    out->device = d->device;
    out->cc_major = d->cc_major;
    out->cc_minor = d->cc_minor;
    out->runtime_version = d->runtime_version;
    out->driver_version = d->driver_version;
    memcpy(out->name, d->name, sizeof out->name);
    return PI_OK;
}
