/* One layer's hot FFN rows on the CUDA device: the upload (compact rows + row -> neuron
 * map, all or nothing against the pool) and the asynchronous run of the device half.
 *
 * A run is enqueued on the device's stream: x host -> device (from a pinned staging
 * buffer, so the copy is truly asynchronous and the caller's x may be reused at once),
 * the kernels of ffn_kernels.cu, then y and the kept counts device -> pinned host, and
 * an event. pi_cuda_ffn_wait synchronizes on that event; between the two calls the host
 * is free to compute the cold neurons. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

struct pi_cuda_ffn {
    pi_cuda_device *dev;
    int32_t gate_up_type, down_t_type, has_gate, n_split;
    int64_t n_embd, n_ff, n_hot, max_tok, row_bytes, down_row_bytes;
    /* device memory, from the pool */
    char *gate, *up, *down_t;
    int32_t *map;
    float *x, *y, *part;
    int8_t *xq_qs;
    float *xq_d, *xq_s;
    uint16_t *xh;
    float *h, *kh;
    int32_t *kid, *count;
    /* pinned host staging */
    float *hx, *hy;
    int32_t *hcount;
    int64_t job_tok; /* tokens of the pending job */
};

static int gate_up_ok(int32_t t) { return t == T_F32 || t == T_F16 || t == T_Q4_0 || t == T_Q4_1 || t == T_Q8_0; }
static int down_ok(int32_t t) { return t == T_F32 || t == T_F16 || t == T_Q8_0 || t == T_Q4_0; }
static int32_t split_for(int64_t max_tok) { return max_tok <= PI_CUDA_DOWN_SPLIT_MAX_TOK ? PI_CUDA_DOWN_SPLIT : 1; }

/* bytes of the converted x of max_tok tokens: Q8 quants + F16-rounded d and s as floats, F16, or none */
static void xq_sizes(int32_t type, int64_t n_embd, int64_t max_tok, int64_t *qs, int64_t *ds, int64_t *xh) {
    *qs = *ds = *xh = 0;
    if (type == T_F16) *xh = max_tok * n_embd * 2;
    else if (type != T_F32) {
        *qs = max_tok * n_embd;
        *ds = max_tok * (n_embd / 32) * 4;
    }
}

PI_API int64_t pi_cuda_ffn_bytes(int32_t gate_up_type, int32_t down_t_type, int64_t n_embd, int64_t n_hot,
                                 int64_t max_tok, int32_t has_gate) {
    if (!gate_up_ok(gate_up_type) || !down_ok(down_t_type)) return -1;
    const int64_t rg = pi_cuda_row_size(gate_up_type, n_embd), rd = pi_cuda_row_size(down_t_type, n_embd);
    if (rg < 0 || rd < 0 || n_hot < 0 || n_hot > INT32_MAX || max_tok < 1 || max_tok > 65535) return -1;
    if (n_hot == 0) return 0;
    int64_t qs, ds, xh;
    xq_sizes(gate_up_type, n_embd, max_tok, &qs, &ds, &xh);
    const int32_t ns = split_for(max_tok);
    const int64_t xy = pi_cuda_align(max_tok * n_embd * 4);
    return (has_gate ? pi_cuda_align(n_hot * rg) : 0) + pi_cuda_align(n_hot * rg) + pi_cuda_align(n_hot * rd) +
           pi_cuda_align(n_hot * 4)                                                      /* map */
           + 2 * xy                                                                      /* x, y */
           + pi_cuda_align(qs) + 2 * pi_cuda_align(ds) + pi_cuda_align(xh)               /* converted x */
           + 3 * pi_cuda_align(max_tok * n_hot * 4)                                      /* h, kid, kh */
           + pi_cuda_align(max_tok * 4)                                                  /* count */
           + (ns > 1 ? pi_cuda_align((int64_t)ns * max_tok * n_embd * 4) : 0);           /* down pieces */
}

static void free_host(pi_cuda_ffn *f) {
    if (f->hx) cudaFreeHost(f->hx);
    if (f->hy) cudaFreeHost(f->hy);
    if (f->hcount) cudaFreeHost(f->hcount);
    free(f);
}

/* gathers rows ids[0..n) of `src` (row bytes rb) into one host buffer and copies it to dst */
static int put_rows(const char *fn, char *dst, const void *src, int64_t rb, const int32_t *ids, int64_t n) {
    char *tmp = (char *)malloc((size_t)(n * rb));
    if (tmp == NULL) return pi_cuda_set_error(PI_ERR_NOMEM, "%s: out of host memory (%lld bytes)", fn, (long long)(n * rb));
    for (int64_t r = 0; r < n; r++) memcpy(tmp + r * rb, (const char *)src + (int64_t)ids[r] * rb, (size_t)rb);
    const cudaError_t e = cudaMemcpy(dst, tmp, (size_t)(n * rb), cudaMemcpyHostToDevice);
    free(tmp);
    if (e != cudaSuccess) return pi_cuda_fail(e, fn, "cudaMemcpy(rows)");
    return PI_OK;
}

PI_API int pi_cuda_ffn_upload(pi_cuda_device *d, int32_t gate_up_type, const void *gate, const void *up,
                              int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t,
                              const int32_t *hot_ids, int64_t n_hot, int64_t max_tok, pi_cuda_ffn **out) {
    static const char *fn = "pi_cuda_ffn_upload";
    if (d == NULL || up == NULL || down_t == NULL || out == NULL || (n_hot > 0 && hot_ids == NULL))
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    *out = NULL;
    if (n_embd < 1 || n_ff < 1 || n_ff > INT32_MAX || n_hot < 0 || n_hot > n_ff || max_tok < 1 || max_tok > 65535)
        return pi_cuda_set_error(PI_ERR_INVALID,
                                 "%s: bad sizes (n_embd %lld, n_ff %lld, n_hot %lld, max_tok %lld; max_tok <= 65535)",
                                 fn, (long long)n_embd, (long long)n_ff, (long long)n_hot, (long long)max_tok);
    const int64_t rg = pi_cuda_row_size(gate_up_type, n_embd), rd = pi_cuda_row_size(down_t_type, n_embd);
    if (!gate_up_ok(gate_up_type) || !down_ok(down_t_type) || rg < 0 || rd < 0)
        return pi_cuda_set_error(PI_ERR_INVALID,
                                 "%s: unsupported types (gate/up %d: f32, f16, q4_0, q4_1, q8_0; down_t %d: f32, f16, "
                                 "q8_0, q4_0) or n_embd %lld not a multiple of their block size",
                                 fn, gate_up_type, down_t_type, (long long)n_embd);
    for (int64_t r = 0; r < n_hot; r++)
        if (hot_ids[r] < 0 || hot_ids[r] >= n_ff || (r > 0 && hot_ids[r] <= hot_ids[r - 1]))
            return pi_cuda_set_error(PI_ERR_INVALID,
                                     "%s: hot ids must be strictly increasing in [0, %lld) (id %d at %lld)", fn,
                                     (long long)n_ff, hot_ids[r], (long long)r);
    if (d->busy != NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: the device has a job pending", fn);
    pi_cuda_ffn *f = (pi_cuda_ffn *)calloc(1, sizeof *f);
    if (f == NULL) return pi_cuda_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    f->dev = d;
    f->gate_up_type = gate_up_type;
    f->down_t_type = down_t_type;
    f->has_gate = gate != NULL;
    f->n_split = split_for(max_tok);
    f->n_embd = n_embd;
    f->n_ff = n_ff;
    f->n_hot = n_hot;
    f->max_tok = max_tok;
    f->row_bytes = rg;
    f->down_row_bytes = rd;
    if (n_hot == 0) { /* nothing on the device; a run returns zeros */
        *out = f;
        return PI_OK;
    }
    /* all or nothing: the pool is a bump allocator, so check the total before taking any piece */
    const int64_t need = pi_cuda_ffn_bytes(gate_up_type, down_t_type, n_embd, n_hot, max_tok, f->has_gate);
    if (need > d->reserved - d->used) {
        d->n_refused++;
        free(f);
        return pi_cuda_set_error(PI_ERR_NOMEM,
                                 "%s: %lld bytes for %lld hot rows exceed the device reservation: %lld of %lld "
                                 "bytes in use",
                                 fn, (long long)need, (long long)n_hot, (long long)d->used, (long long)d->reserved);
    }
    PI_CU(fn, cudaSetDevice(d->device));
    {
        const cudaError_t e1 = cudaHostAlloc((void **)&f->hx, (size_t)(max_tok * n_embd * 4), cudaHostAllocDefault);
        const cudaError_t e2 = e1 == cudaSuccess
                                   ? cudaHostAlloc((void **)&f->hy, (size_t)(max_tok * n_embd * 4), cudaHostAllocDefault)
                                   : e1;
        const cudaError_t e3 = e2 == cudaSuccess
                                   ? cudaHostAlloc((void **)&f->hcount, (size_t)(max_tok * 4), cudaHostAllocDefault)
                                   : e2;
        if (e3 != cudaSuccess) {
            free_host(f);
            return pi_cuda_fail(e3, fn, "cudaHostAlloc(staging)");
        }
    }
    int64_t qs, ds, xh;
    xq_sizes(gate_up_type, n_embd, max_tok, &qs, &ds, &xh);
    const int64_t used0 = d->used;
    /* cannot fail after the total check above; a piece of 0 bytes is a valid (unused) pointer */
    if (f->has_gate) pi_cuda_alloc(d, n_hot * rg, (void **)&f->gate);
    pi_cuda_alloc(d, n_hot * rg, (void **)&f->up);
    pi_cuda_alloc(d, n_hot * rd, (void **)&f->down_t);
    pi_cuda_alloc(d, n_hot * 4, (void **)&f->map);
    pi_cuda_alloc(d, max_tok * n_embd * 4, (void **)&f->x);
    pi_cuda_alloc(d, max_tok * n_embd * 4, (void **)&f->y);
    if (qs) pi_cuda_alloc(d, qs, (void **)&f->xq_qs);
    if (ds) pi_cuda_alloc(d, ds, (void **)&f->xq_d);
    if (ds) pi_cuda_alloc(d, ds, (void **)&f->xq_s);
    if (xh) pi_cuda_alloc(d, xh, (void **)&f->xh);
    pi_cuda_alloc(d, max_tok * n_hot * 4, (void **)&f->h);
    pi_cuda_alloc(d, max_tok * n_hot * 4, (void **)&f->kid);
    pi_cuda_alloc(d, max_tok * n_hot * 4, (void **)&f->kh);
    pi_cuda_alloc(d, max_tok * 4, (void **)&f->count);
    if (f->n_split > 1) pi_cuda_alloc(d, (int64_t)f->n_split * max_tok * n_embd * 4, (void **)&f->part);
    int rc = d->used - used0 == need ? PI_OK
                                     : pi_cuda_set_error(PI_ERR_INVALID, "%s: internal: %lld bytes taken, %lld counted",
                                                         fn, (long long)(d->used - used0), (long long)need);
    if (rc == PI_OK && f->has_gate) rc = put_rows(fn, f->gate, gate, rg, hot_ids, n_hot);
    if (rc == PI_OK) rc = put_rows(fn, f->up, up, rg, hot_ids, n_hot);
    if (rc == PI_OK) rc = put_rows(fn, f->down_t, down_t, rd, hot_ids, n_hot);
    if (rc == PI_OK) {
        const cudaError_t e = cudaMemcpy(f->map, hot_ids, (size_t)(n_hot * 4), cudaMemcpyHostToDevice);
        if (e != cudaSuccess) rc = pi_cuda_fail(e, fn, "cudaMemcpy(map)");
    }
    if (rc != PI_OK) { /* the pieces stay taken (bump pool) but are accounted; the upload object is not returned */
        free_host(f);
        return rc;
    }
    *out = f;
    return PI_OK;
}

PI_API void pi_cuda_ffn_free(pi_cuda_ffn *f) {
    if (f == NULL) return;
    if (f->dev->busy == f) { /* its job still writes the staging buffers */
        cudaEventSynchronize(f->dev->done);
        f->dev->busy = NULL;
    }
    free_host(f);
}

PI_API int64_t pi_cuda_ffn_n_hot(const pi_cuda_ffn *f) { return f ? f->n_hot : -1; }

static int enqueue(pi_cuda_ffn *f, int32_t act, int64_t n_tok, float threshold) {
    static const char *fn = "pi_cuda_ffn_run_async";
    pi_cuda_device *d = f->dev;
    const int64_t E = f->n_embd;
    PI_CU(fn, cudaSetDevice(d->device));
    PI_CU(fn, cudaMemcpyAsync(f->x, f->hx, (size_t)(n_tok * E * 4), cudaMemcpyHostToDevice, d->stream));
    PI_CU(fn, pi_cuda_launch_convert_x(d->stream, f->gate_up_type, f->x, n_tok, E, f->xq_qs, f->xq_d, f->xq_s, f->xh));
    const pi_cuda_xq xq = {f->xq_qs, f->xq_d, f->xq_s, f->xh, f->x};
    PI_CU(fn, pi_cuda_launch_h(d->stream, act, f->gate_up_type, f->gate, f->up, f->row_bytes, f->n_hot, E, n_tok, xq,
                               threshold, f->h));
    PI_CU(fn, pi_cuda_launch_compact(d->stream, f->h, f->n_hot, n_tok, f->kid, f->kh, f->count));
    PI_CU(fn, pi_cuda_launch_down(d->stream, f->down_t_type, f->down_t, f->down_row_bytes, f->n_hot, E, n_tok, f->kid,
                                  f->kh, f->count, f->n_split, f->part, f->y));
    PI_CU(fn, cudaMemcpyAsync(f->hy, f->y, (size_t)(n_tok * E * 4), cudaMemcpyDeviceToHost, d->stream));
    PI_CU(fn, cudaMemcpyAsync(f->hcount, f->count, (size_t)(n_tok * 4), cudaMemcpyDeviceToHost, d->stream));
    PI_CU(fn, cudaEventRecord(d->done, d->stream));
    return PI_OK;
}

PI_API int pi_cuda_ffn_run_async(pi_cuda_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold) {
    static const char *fn = "pi_cuda_ffn_run_async";
    if (f == NULL || x == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    if (n_tok < 1 || n_tok > f->max_tok)
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: n_tok %lld outside [1, %lld] (max_tok of the upload)", fn,
                                 (long long)n_tok, (long long)f->max_tok);
    if (act < F_SWIGLU || act > F_RELU_UNGATED)
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: unknown activation form %d", fn, act);
    if ((act == F_RELU_UNGATED) == (f->has_gate != 0))
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: form %d %s a gate matrix, the upload has %s", fn, act,
                                 act == F_RELU_UNGATED ? "takes no" : "needs", f->has_gate ? "one" : "none");
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_cuda_set_error(PI_ERR_INVALID, "%s: threshold must be finite and >= 0", fn);
    pi_cuda_device *d = f->dev;
    if (d->busy != NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: the device has a job pending (one at a time)", fn);
    f->job_tok = n_tok;
    if (f->n_hot == 0) { /* nothing to run: wait returns zeros */
        d->busy = f;
        return PI_OK;
    }
    memcpy(f->hx, x, (size_t)(n_tok * f->n_embd * 4));
    const int rc = enqueue(f, act, n_tok, threshold);
    if (rc != PI_OK) {
        cudaStreamSynchronize(d->stream); /* whatever was enqueued finishes before the buffers are reused */
        return rc;
    }
    d->busy = f;
    return PI_OK;
}

PI_API int pi_cuda_ffn_wait(pi_cuda_ffn *f, float *y_device, int64_t *n_used) {
    static const char *fn = "pi_cuda_ffn_wait";
    if (f == NULL || y_device == NULL) return pi_cuda_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    pi_cuda_device *d = f->dev;
    if (d->busy != f) return pi_cuda_set_error(PI_ERR_INVALID, "%s: no job of this upload is pending", fn);
    d->busy = NULL;
    const int64_t n_tok = f->job_tok, E = f->n_embd;
    if (f->n_hot == 0) {
        memset(y_device, 0, (size_t)(n_tok * E * 4));
        if (n_used) memset(n_used, 0, (size_t)(n_tok * 8));
        d->n_jobs++;
        return PI_OK;
    }
    PI_CU(fn, cudaEventSynchronize(d->done)); /* also reports a kernel's failure (e.g. an illegal address) */
    memcpy(y_device, f->hy, (size_t)(n_tok * E * 4));
    if (n_used)
        for (int64_t t = 0; t < n_tok; t++) n_used[t] = f->hcount[t];
    d->n_jobs++;
    d->rows += f->n_hot * n_tok;
    return PI_OK;
}
