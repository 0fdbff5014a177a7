/* Devices for the hybrid executor (issue 6; docs/placement.md).
 *
 * "cpu-device" is a test device: a memory pool reserved once up front (allocations past
 * the reservation are refused) and its own thread with its own worker pool, so the
 * split between the device half of a plan (hot FFN rows) and the CPU half (cold
 * neurons), their concurrency, the byte accounting and the merge can be exercised
 * without a GPU. A CUDA device would implement the same entry points in its own
 * shared object. */
#include <pthread.h>
#include <stdlib.h>

#include "pi_internal.h"

#define PI_DEVICE_ALIGN 256

struct pi_device {
    unsigned char *mem; /* the reservation */
    int64_t reserved, used, high_water, n_refused, n_jobs, rows;
    int32_t n_threads;
    pi_pool *pool; /* the device's workers; its thread is worker 0 */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int has_job, done, quit;
    const pi_device_ffn *job_ffn;
    int64_t job_tok;
    float job_threshold;
    int32_t job_act;
};

struct pi_device_ffn {
    pi_device *dev;
    int32_t gate_up_type, down_t_type;
    int64_t n_embd, n_ff, n_hot, max_tok;
    void *gate, *up, *down_t; /* device memory: n_hot compact rows each */
    int32_t *map;             /* device memory: row r is neuron map[r] (strictly increasing) */
    void *scratch;            /* device memory: pi_ffn_sparse scratch for max_tok tokens */
    int32_t *rows;            /* device memory: 0 .. n_hot-1 for each of max_tok tokens (the active list) */
    int64_t *rows_off;        /* device memory: max_tok + 1 offsets, t * n_hot */
    float *x, *y;             /* device memory: max_tok rows of n_embd */
    int32_t *cold;            /* host: the other n_ff - n_hot ids, increasing */
};

static int64_t align_up(int64_t n) { return (n + PI_DEVICE_ALIGN - 1) / PI_DEVICE_ALIGN * PI_DEVICE_ALIGN; }

static void *device_main(void *arg) {
    pi_device *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->has_job && !d->quit) pthread_cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        const pi_device_ffn *f = d->job_ffn;
        const int64_t n_tok = d->job_tok;
        pthread_mutex_unlock(&d->mu);
        const pi_mat g = {f->gate, f->gate_up_type, f->n_embd, f->n_hot};
        const pi_mat u = {f->up, f->gate_up_type, f->n_embd, f->n_hot};
        const pi_mat dt = {f->down_t, f->down_t_type, f->n_embd, f->n_hot};
        /* an explicit active list (all compact rows), so each row takes the same path as the
         * CPU's gathered cold neurons and as a CPU-only run of the same split */
        const pi_ffn_sparse_args a = {.act = d->job_act, .gate = &g, .up = &u, .down_t = &dt, .x = f->x,
                                      .n_tok = n_tok, .active = f->rows, .active_off = f->rows_off,
                                      .threshold = d->job_threshold, .y = f->y};
        pi_ffn_sparse(d->pool, &a, f->scratch);
        pthread_mutex_lock(&d->mu);
        d->has_job = 0;
        d->done = 1;
        d->n_jobs++;
        d->rows += f->n_hot * n_tok;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int pi_device_create(const char *kind, int64_t reserve_bytes, int32_t n_threads, pi_device **out) {
    if (kind == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_device_create: NULL argument");
    *out = NULL;
    if (strcmp(kind, "cpu-device") != 0)
        return pi_set_error(strcmp(kind, "cuda") == 0 ? PI_ERR_UNSUPPORTED : PI_ERR_INVALID,
                            "pi_device_create: device '%s' %s", kind,
                            strcmp(kind, "cuda") == 0 ? "is not built into this library" : "is unknown (cpu-device)");
    if (reserve_bytes < 0) return pi_set_error(PI_ERR_INVALID, "pi_device_create: reserve_bytes must be >= 0");
    if (n_threads < 1 || n_threads > 512)
        return pi_set_error(PI_ERR_INVALID, "pi_device_create: n_threads must be in [1, 512], got %d", n_threads);
    pi_device *d = calloc(1, sizeof *d);
    if (d == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_device_create: out of memory");
    d->reserved = align_up(reserve_bytes);
    if (d->reserved > 0) {
        d->mem = aligned_alloc(PI_DEVICE_ALIGN, (size_t)d->reserved);
        if (d->mem == NULL) {
            free(d);
            return pi_set_error(PI_ERR_NOMEM, "pi_device_create: cannot reserve %lld bytes", (long long)reserve_bytes);
        }
        memset(d->mem, 0, (size_t)d->reserved); /* commit the pages now, not mid-run */
    }
    d->reserved = reserve_bytes; /* the pool hands out at most what was asked for */
    d->n_threads = n_threads;
    int rc = pi_pool_create(n_threads, &d->pool);
    if (rc) {
        free(d->mem);
        free(d);
        return rc;
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (pthread_create(&d->thread, NULL, device_main, d) != 0) {
        pi_pool_free(d->pool);
        pthread_mutex_destroy(&d->mu);
        pthread_cond_destroy(&d->cv);
        free(d->mem);
        free(d);
        return pi_set_error(PI_ERR_NOMEM, "pi_device_create: cannot start the device thread");
    }
    *out = d;
    return PI_OK;
}

void pi_device_free(pi_device *d) {
    if (d == NULL) return;
    pthread_mutex_lock(&d->mu);
    d->quit = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pi_pool_free(d->pool);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d->mem);
    free(d);
}

int pi_device_alloc(pi_device *d, int64_t nbytes, void **out) {
    if (d == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_device_alloc: NULL argument");
    *out = NULL;
    if (nbytes < 0) return pi_set_error(PI_ERR_INVALID, "pi_device_alloc: nbytes must be >= 0");
    const int64_t need = align_up(nbytes);
    if (need > d->reserved - d->used) {
        d->n_refused++;
        return pi_set_error(PI_ERR_NOMEM,
                            "pi_device_alloc: %lld bytes (%lld aligned) exceed the device reservation: %lld of %lld "
                            "bytes in use",
                            (long long)nbytes, (long long)need, (long long)d->used, (long long)d->reserved);
    }
    *out = d->mem + d->used;
    d->used += need;
    if (d->used > d->high_water) d->high_water = d->used;
    return PI_OK;
}

int pi_device_get_stats(const pi_device *d, pi_device_stats *out) {
    if (d == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_device_get_stats: NULL argument");
    pthread_mutex_lock((pthread_mutex_t *)&d->mu);
    out->reserved = d->reserved;
    out->used = d->used;
    out->high_water = d->high_water;
    out->n_refused = d->n_refused;
    out->n_jobs = d->n_jobs;
    out->rows = d->rows;
    out->n_threads = d->n_threads;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
    return PI_OK;
}

int64_t pi_device_ffn_bytes(int32_t gate_up_type, int32_t down_t_type, int64_t n_embd, int64_t n_hot,
                            int64_t max_tok) {
    const int64_t rg = pi_row_size(gate_up_type, n_embd), rd = pi_row_size(down_t_type, n_embd);
    if (rg < 0 || rd < 0 || n_hot < 0 || max_tok < 1) return -1;
    if (n_hot == 0) return 0;
    return 2 * align_up(n_hot * rg) + align_up(n_hot * rd) + align_up(n_hot * 4) +
           align_up(pi_ffn_sparse_scratch_size(gate_up_type, n_embd, n_hot, max_tok)) +
           2 * align_up(max_tok * n_embd * 4) + align_up(max_tok * n_hot * 4) + align_up((max_tok + 1) * 8);
}

int pi_device_ffn_upload(pi_device *d, int32_t gate_up_type, const void *gate, const void *up, int64_t n_embd,
                         int64_t n_ff, int32_t down_t_type, const void *down_t, const int32_t *hot_ids,
                         int64_t n_hot, int64_t max_tok, pi_device_ffn **out) {
    static const char *fn = "pi_device_ffn_upload";
    if (d == NULL || gate == NULL || up == NULL || down_t == NULL || out == NULL || (n_hot > 0 && hot_ids == NULL))
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    *out = NULL;
    if (n_embd < 1 || n_ff < 1 || n_ff > INT32_MAX || n_hot < 0 || n_hot > n_ff || max_tok < 1)
        return pi_set_error(PI_ERR_INVALID, "%s: bad sizes (n_embd %lld, n_ff %lld, n_hot %lld, max_tok %lld)", fn,
                            (long long)n_embd, (long long)n_ff, (long long)n_hot, (long long)max_tok);
    const int64_t rg = pi_row_size(gate_up_type, n_embd), rd = pi_row_size(down_t_type, n_embd);
    if (rg < 0 || rd < 0 || gate_up_type == PI_TYPE_Q8_1 ||
        !(down_t_type == PI_TYPE_F32 || down_t_type == PI_TYPE_F16 || down_t_type == PI_TYPE_Q8_0 ||
          down_t_type == PI_TYPE_Q4_0))
        return pi_set_error(PI_ERR_INVALID, "%s: unsupported types (gate/up %d, down_t %d) or n_embd %lld", fn,
                            gate_up_type, down_t_type, (long long)n_embd);
    for (int64_t r = 0; r < n_hot; r++)
        if (hot_ids[r] < 0 || hot_ids[r] >= n_ff || (r > 0 && hot_ids[r] <= hot_ids[r - 1]))
            return pi_set_error(PI_ERR_INVALID, "%s: hot ids must be strictly increasing in [0, %lld) (id %d at %lld)",
                                fn, (long long)n_ff, hot_ids[r], (long long)r);
    pi_device_ffn *f = calloc(1, sizeof *f);
    if (f == NULL) return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    f->cold = malloc((size_t)(n_ff - n_hot + 1) * sizeof *f->cold);
    if (f->cold == NULL) {
        free(f);
        return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    }
    f->dev = d;
    f->gate_up_type = gate_up_type;
    f->down_t_type = down_t_type;
    f->n_embd = n_embd;
    f->n_ff = n_ff;
    f->n_hot = n_hot;
    f->max_tok = max_tok;
    for (int64_t j = 0, r = 0, c = 0; j < n_ff; j++) {
        if (r < n_hot && hot_ids[r] == j) r++;
        else f->cold[c++] = (int32_t)j;
    }
    if (n_hot > 0) {
        /* all or nothing: the pool is a bump allocator, so a refusal leaves earlier parts allocated;
         * check the total first */
        const int64_t need = pi_device_ffn_bytes(gate_up_type, down_t_type, n_embd, n_hot, max_tok);
        if (need > d->reserved - d->used) {
            d->n_refused++;
            free(f->cold);
            free(f);
            return pi_set_error(PI_ERR_NOMEM, "%s: %lld bytes for %lld hot rows exceed the device reservation: "
                                "%lld of %lld bytes in use", fn, (long long)need, (long long)n_hot,
                                (long long)d->used, (long long)d->reserved);
        }
        pi_device_alloc(d, n_hot * rg, &f->gate);
        pi_device_alloc(d, n_hot * rg, &f->up);
        pi_device_alloc(d, n_hot * rd, &f->down_t);
        pi_device_alloc(d, n_hot * 4, (void **)&f->map);
        pi_device_alloc(d, pi_ffn_sparse_scratch_size(gate_up_type, n_embd, n_hot, max_tok), &f->scratch);
        pi_device_alloc(d, max_tok * n_embd * 4, (void **)&f->x);
        pi_device_alloc(d, max_tok * n_embd * 4, (void **)&f->y);
        pi_device_alloc(d, max_tok * n_hot * 4, (void **)&f->rows);
        pi_device_alloc(d, (max_tok + 1) * 8, (void **)&f->rows_off);
        for (int64_t t = 0; t <= max_tok; t++) {
            f->rows_off[t] = t * n_hot;
            if (t < max_tok)
                for (int64_t r = 0; r < n_hot; r++) f->rows[t * n_hot + r] = (int32_t)r;
        }
        for (int64_t r = 0; r < n_hot; r++) { /* the "host to device" copies */
            const int64_t j = hot_ids[r];
            memcpy((char *)f->gate + r * rg, (const char *)gate + j * rg, (size_t)rg);
            memcpy((char *)f->up + r * rg, (const char *)up + j * rg, (size_t)rg);
            memcpy((char *)f->down_t + r * rd, (const char *)down_t + j * rd, (size_t)rd);
            f->map[r] = (int32_t)j;
        }
    }
    *out = f;
    return PI_OK;
}

void pi_device_ffn_free(pi_device_ffn *f) {
    if (f == NULL) return;
    free(f->cold); /* device memory returns with the device (bump pool) */
    free(f);
}

int64_t pi_device_ffn_n_hot(const pi_device_ffn *f) { return f ? f->n_hot : -1; }

int pi_op_ffn_hybrid(pi_pool *pool, const pi_device_ffn *f, int32_t act, const void *gate, const void *up,
                     const void *down_t, const float *x, int64_t n_tok, float threshold, float *y, float *y_device) {
    static const char *fn = "pi_op_ffn_hybrid";
    if (pool == NULL || f == NULL || gate == NULL || up == NULL || down_t == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    if (n_tok < 1 || n_tok > f->max_tok)
        return pi_set_error(PI_ERR_INVALID, "%s: n_tok %lld outside [1, %lld] (max_tok of the upload)", fn,
                            (long long)n_tok, (long long)f->max_tok);
    if (act < PI_FFN_SWIGLU || act > PI_FFN_DRELU)
        return pi_set_error(PI_ERR_INVALID, "%s: unknown activation form %d", fn, act);
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "%s: threshold must be finite and >= 0", fn);
    pi_device *d = f->dev;
    const int64_t E = f->n_embd, n_cold = f->n_ff - f->n_hot;
    if (f->n_hot > 0) { /* x to the device, start the device half */
        pthread_mutex_lock(&d->mu);
        if (d->has_job) { /* checked before touching the device's buffers */
            pthread_mutex_unlock(&d->mu);
            return pi_set_error(PI_ERR_INVALID, "%s: the device is busy (one hybrid op at a time)", fn);
        }
        memcpy(f->x, x, (size_t)(n_tok * E) * sizeof(float));
        d->job_ffn = f;
        d->job_tok = n_tok;
        d->job_threshold = threshold;
        d->job_act = act;
        d->done = 0;
        d->has_job = 1;
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
    int rc = PI_OK; /* the CPU half, concurrently: cold neurons */
    if (n_cold > 0) {
        int32_t *act_ids = malloc((size_t)(n_cold * n_tok) * sizeof *act_ids);
        int64_t *off = malloc((size_t)(n_tok + 1) * sizeof *off);
        if (act_ids == NULL || off == NULL) {
            rc = pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
        } else {
            for (int64_t t = 0; t < n_tok; t++) {
                memcpy(act_ids + t * n_cold, f->cold, (size_t)n_cold * sizeof *act_ids);
                off[t] = t * n_cold;
            }
            off[n_tok] = n_tok * n_cold;
            rc = pi_op_ffn_sparse(pool, act, f->gate_up_type, gate, up, E, f->n_ff, f->down_t_type, down_t, x,
                                  n_tok, act_ids, off, threshold, y, NULL);
        }
        free(act_ids);
        free(off);
    } else {
        memset(y, 0, (size_t)(n_tok * E) * sizeof(float));
    }
    if (f->n_hot > 0) { /* wait for the device, then merge: y = device partial + CPU partial */
        pthread_mutex_lock(&d->mu);
        while (!d->done) pthread_cond_wait(&d->cv, &d->mu);
        pthread_mutex_unlock(&d->mu);
        if (rc == PI_OK) {
            for (int64_t i = 0; i < n_tok * E; i++) y[i] = f->y[i] + y[i];
            if (y_device != NULL) memcpy(y_device, f->y, (size_t)(n_tok * E) * sizeof(float));
        }
    } else if (y_device != NULL) {
        memset(y_device, 0, (size_t)(n_tok * E) * sizeof(float));
    }
    return rc;
}
