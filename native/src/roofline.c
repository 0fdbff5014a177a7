/* Roofline microbenchmarks for `powerinfer-backend bench --roofline`: the read bandwidth
 * and the int8 multiply-add peak of a pool's threads, run through the pool exactly as the
 * engine runs a matmul (chunks claimed from a shared counter, the caller as worker 0). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "isa/roofline.h"
#include "pi_internal.h"

#define RL_ALIGN 4096 /* chunk boundaries on pages: no two chunks share a cache line */

typedef struct {
    char *buf;
    int64_t bytes;
    int init; /* 1: write the chunk (first touch, on the thread that will read it), 0: read it */
    int avx2;
    int64_t iters;
    _Atomic uint64_t sink;
    _Atomic int nth; /* chunks the pool split the job into */
} rl_job;

static void chunk_range(int64_t bytes, int ith, int nth, int64_t *lo, int64_t *hi) {
    const int64_t pages = bytes / RL_ALIGN;
    *lo = pages * ith / nth * RL_ALIGN;
    *hi = pages * (ith + 1) / nth * RL_ALIGN;
}

static void read_task(void *arg, int ith, int nth) {
    rl_job *j = arg;
    int64_t lo, hi;
    chunk_range(j->bytes, ith, nth, &lo, &hi);
    if (j->init) {
        memset(j->buf + lo, 0x5a + ith, (size_t)(hi - lo));
        return;
    }
    const uint64_t s = j->avx2 ? pi_rl_read_avx2(j->buf + lo, hi - lo) : pi_rl_read_scalar(j->buf + lo, hi - lo);
    atomic_fetch_xor_explicit(&j->sink, s, memory_order_relaxed);
}

static void int8_task(void *arg, int ith, int nth) {
    rl_job *j = arg;
    (void)ith;
    const uint64_t s = j->avx2 ? pi_rl_int8_avx2(j->iters) : pi_rl_int8_scalar(j->iters);
    atomic_fetch_xor_explicit(&j->sink, s, memory_order_relaxed);
    atomic_store_explicit(&j->nth, nth, memory_order_relaxed);
}

static int has_avx2(void) { return (pi_isa_supported() & PI_ISA_AVX2) != 0; }

int pi_bench_read_bw(pi_pool *pool, int64_t bytes, int32_t repeats, double *out) {
    if (pool == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_bench_read_bw: NULL argument");
    if (bytes < (1 << 20)) return pi_set_error(PI_ERR_INVALID, "pi_bench_read_bw: bytes %lld < 1 MiB", (long long)bytes);
    if (repeats < 1) return pi_set_error(PI_ERR_INVALID, "pi_bench_read_bw: repeats %d < 1", (int)repeats);
    bytes = bytes / RL_ALIGN * RL_ALIGN;
    rl_job j = {.bytes = bytes, .init = 1, .avx2 = has_avx2()};
    j.buf = aligned_alloc(RL_ALIGN, (size_t)bytes);
    if (j.buf == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_bench_read_bw: cannot allocate %lld bytes", (long long)bytes);
    pi_pool_run(pool, read_task, &j); /* every page backed before the timed passes */
    j.init = 0;
    int64_t best = INT64_MAX;
    for (int r = 0; r < repeats; r++) {
        const int64_t t0 = pi_now_ns();
        pi_pool_run(pool, read_task, &j);
        const int64_t dt = pi_now_ns() - t0;
        if (dt < best) best = dt;
    }
    free(j.buf);
    *out = (double)bytes / ((double)(best > 0 ? best : 1) * 1e-9);
    return PI_OK;
}

int pi_bench_int8_peak(pi_pool *pool, int64_t iters, int32_t repeats, double *out) {
    if (pool == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_bench_int8_peak: NULL argument");
    if (iters < 1) return pi_set_error(PI_ERR_INVALID, "pi_bench_int8_peak: iters %lld < 1", (long long)iters);
    if (repeats < 1) return pi_set_error(PI_ERR_INVALID, "pi_bench_int8_peak: repeats %d < 1", (int)repeats);
    rl_job j = {.iters = iters, .avx2 = has_avx2()};
    double best = 0.0;
    for (int r = 0; r < repeats; r++) {
        const int64_t t0 = pi_now_ns();
        pi_pool_run(pool, int8_task, &j);
        const int64_t dt = pi_now_ns() - t0;
        const double ops = 2.0 * PI_RL_MACS_PER_ROUND * (double)iters * atomic_load(&j.nth);
        const double rate = ops / ((double)(dt > 0 ? dt : 1) * 1e-9);
        if (rate > best) best = rate;
    }
    *out = best;
    return PI_OK;
}

const char *pi_bench_isa(void) { return has_avx2() ? "avx2" : "scalar"; }
