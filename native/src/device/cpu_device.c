/* Devices for the hybrid executor (issue 6; docs/placement.md).
 *
 * "cpu-device" is a test device: a memory pool reserved once up front (allocations past
 * the reservation are refused) and its own thread with its own worker pool, so the
 * split between the device half of a plan (hot FFN rows) and the CPU half (cold
 * neurons), their concurrency, the byte accounting and the merge can be exercised
 * without a GPU. Its FFN halves implement device/ffn_half.h's interface. */
#include <pthread.h>
#include <stdlib.h>

#include "device/cpu_device.h"
#include "device/ffn_half.h"

struct pi_device {
    unsigned char *mem; /* the reservation */
    int64_t reserved, used, high_water, n_refused, n_jobs, rows, n_attn, n_output;
    int32_t n_threads;
    pi_pool *pool; /* the device's workers; its thread is worker 0 */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, go, done, quit; /* claimed; job ready; job finished; thread exits */
    pi_device_fn job_fn;
    void *job_arg;
};

/* The cpu-device's half of a layer's FFN (ffn_half.h) */
typedef struct {
    pi_device_ffn base;
    pi_device *dev;
    int32_t gate_up_type, down_t_type;
    int64_t max_tok;
    void *gate, *up, *down_t; /* device memory: n_hot compact rows each */
    int32_t *map;             /* device memory: row r is neuron map[r] (strictly increasing) */
    void *scratch;            /* device memory: pi_ffn_sparse scratch for max_tok tokens */
    float *x, *y;             /* device memory: max_tok rows of n_embd */
    /* the job in flight (start .. finish) */
    int32_t job_act;
    int64_t job_tok;
    float job_threshold;
    int64_t *job_used;        /* optional per-token counts of kept hot rows */
} cpu_half;

static void *device_main(void *arg) {
    pi_device *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->go && !d->quit) pthread_cond_wait(&d->cv, &d->mu);
        if (d->quit) break;
        d->go = 0;
        pthread_mutex_unlock(&d->mu);
        d->job_fn(d->pool, d->job_arg);
        pthread_mutex_lock(&d->mu);
        d->done = 1;
        d->n_jobs++;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int pi_device_claim(pi_device *d) {
    pthread_mutex_lock(&d->mu);
    const int busy = d->busy;
    d->busy = 1;
    d->done = 0;
    pthread_mutex_unlock(&d->mu);
    /* checked before the caller touches the device's buffers */
    return busy ? pi_set_error(PI_ERR_INVALID, "the device is busy (one job at a time)") : PI_OK;
}

void pi_device_go(pi_device *d, pi_device_fn fn, void *arg) {
    pthread_mutex_lock(&d->mu);
    d->job_fn = fn;
    d->job_arg = arg;
    d->go = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void pi_device_wait(pi_device *d) {
    pthread_mutex_lock(&d->mu);
    while (!d->done) pthread_cond_wait(&d->cv, &d->mu);
    d->busy = 0;
    pthread_mutex_unlock(&d->mu);
}

void pi_device_count(pi_device *d, int64_t rows, int64_t n_attn, int64_t n_output) {
    pthread_mutex_lock(&d->mu);
    d->rows += rows;
    d->n_attn += n_attn;
    d->n_output += n_output;
    pthread_mutex_unlock(&d->mu);
}

int32_t pi_device_n_threads(const pi_device *d) { return d->n_threads; }

int64_t pi_device_free_bytes(const pi_device *d) { return d->reserved - d->used; }

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
    d->reserved = pi_align_up(reserve_bytes, PI_DEVICE_ALIGN);
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
    const int64_t need = pi_align_up(nbytes, PI_DEVICE_ALIGN);
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
    out->n_attn = d->n_attn;
    out->n_output = d->n_output;
    out->n_threads = d->n_threads;
    pthread_mutex_unlock((pthread_mutex_t *)&d->mu);
    return PI_OK;
}

int64_t pi_device_ffn_bytes(int32_t gate_up_type, int32_t down_t_type, int64_t n_embd, int64_t n_hot,
                            int64_t max_tok) {
    const int64_t rg = pi_row_size(gate_up_type, n_embd), rd = pi_row_size(down_t_type, n_embd);
    if (rg < 0 || rd < 0 || n_hot < 0 || max_tok < 1) return -1;
    if (n_hot == 0) return 0;
    const int64_t scratch = pi_ffn_sparse_scratch_size(gate_up_type, n_embd, n_hot, max_tok);
    return pi_device_rows_bytes(rg, rd, n_hot) + pi_align_up(scratch, PI_DEVICE_ALIGN) +
           2 * pi_align_up(max_tok * n_embd * 4, PI_DEVICE_ALIGN);
}

int64_t pi_device_rows_bytes(int64_t gate_row, int64_t down_t_row, int64_t n_hot) {
    if (n_hot == 0) return 0;
    return 2 * pi_align_up(n_hot * gate_row, PI_DEVICE_ALIGN) + pi_align_up(n_hot * down_t_row, PI_DEVICE_ALIGN) +
           pi_align_up(n_hot * 4, PI_DEVICE_ALIGN);
}

static int down_t_type_ok(int32_t t) {
    return t == PI_TYPE_F32 || t == PI_TYPE_F16 || t == PI_TYPE_Q8_0 || t == PI_TYPE_Q4_0;
}

/* The device half: every compact row is a candidate (active == NULL), each row computed as
 * the CPU computes a gathered neuron (the same dot products), summed in row order. */
static void ffn_job(pi_pool *pool, void *arg) {
    cpu_half *f = arg;
    const int64_t E = f->base.n_embd, n_hot = f->base.n_hot;
    const pi_mat g = {f->gate, f->gate_up_type, E, n_hot}, u = {f->up, f->gate_up_type, E, n_hot};
    const pi_mat dt = {f->down_t, f->down_t_type, E, n_hot};
    const pi_ffn_sparse_args a = {.act = f->job_act, .gate = &g, .up = &u, .down_t = &dt, .x = f->x,
                                  .n_tok = f->job_tok, .threshold = f->job_threshold, .y = f->y,
                                  .n_used = f->job_used};
    pi_ffn_sparse(pool, &a, f->scratch);
    pi_device_count(f->dev, n_hot * f->job_tok, 0, 0);
}

static int cpu_start(pi_device_ffn *base, int32_t act, const float *x, int64_t n_tok, float threshold,
                     int64_t *n_used) {
    cpu_half *f = (cpu_half *)base;
    int rc = pi_device_claim(f->dev);
    if (rc) return rc;
    memcpy(f->x, x, (size_t)(n_tok * base->n_embd) * sizeof(float)); /* x to the device */
    f->job_act = act;
    f->job_tok = n_tok;
    f->job_threshold = threshold;
    f->job_used = n_used;
    pi_device_go(f->dev, ffn_job, f);
    return PI_OK;
}

static int cpu_finish(pi_device_ffn *base, int64_t n_tok, float *y, int64_t *n_used) {
    cpu_half *f = (cpu_half *)base;
    (void)n_used; /* the job wrote the counts */
    pi_device_wait(f->dev);
    memcpy(y, f->y, (size_t)(n_tok * base->n_embd) * sizeof(float)); /* device to host: the CPU continues this sum */
    return PI_OK;
}

static const pi_ffn_half_i cpu_half_i = {cpu_start, cpu_finish};

int pi_device_ffn_create(pi_device *d, const pi_mat *gate, const pi_mat *up, const pi_mat *down_t,
                         const int32_t *hot_ids, int64_t n_hot, int64_t max_tok, float *x, float *y, void *scratch,
                         pi_device_ffn **out) {
    static const char *fn = "pi_device_ffn_upload";
    const int64_t n_embd = gate->n_cols, n_ff = gate->n_rows;
    *out = NULL;
    if (n_embd < 1 || n_ff < 1 || n_ff > INT32_MAX || n_hot < 0 || n_hot > n_ff || max_tok < 1)
        return pi_set_error(PI_ERR_INVALID, "%s: bad sizes (n_embd %lld, n_ff %lld, n_hot %lld, max_tok %lld)", fn,
                            (long long)n_embd, (long long)n_ff, (long long)n_hot, (long long)max_tok);
    const int64_t rg = pi_row_size(gate->type, n_embd), rd = pi_row_size(down_t->type, n_embd);
    if (rg < 0 || rd < 0 || gate->type == PI_TYPE_Q8_1 || up->type != gate->type || !down_t_type_ok(down_t->type))
        return pi_set_error(PI_ERR_INVALID, "%s: unsupported types (gate/up %d, down_t %d) or n_embd %lld", fn,
                            gate->type, down_t->type, (long long)n_embd);
    int rc = pi_ffn_check_hot_ids(fn, hot_ids, n_hot, n_ff);
    if (rc) return rc;
    /* all or nothing: the pool is a bump allocator, so a refusal would leave earlier parts
     * allocated; check the total first */
    const int64_t need = x != NULL ? pi_device_rows_bytes(rg, rd, n_hot)
                                   : pi_device_ffn_bytes(gate->type, down_t->type, n_embd, n_hot, max_tok);
    if (need > d->reserved - d->used) {
        d->n_refused++;
        return pi_set_error(PI_ERR_NOMEM, "%s: %lld bytes for %lld hot rows exceed the device reservation: "
                            "%lld of %lld bytes in use", fn, (long long)need, (long long)n_hot,
                            (long long)d->used, (long long)d->reserved);
    }
    cpu_half *f = (cpu_half *)pi_ffn_half_new(sizeof *f, &cpu_half_i, hot_ids, n_hot, n_embd, n_ff);
    if (f == NULL) return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    f->dev = d;
    f->gate_up_type = gate->type;
    f->down_t_type = down_t->type;
    f->max_tok = max_tok;
    if (n_hot > 0) {
        pi_device_alloc(d, n_hot * rg, &f->gate);
        pi_device_alloc(d, n_hot * rg, &f->up);
        pi_device_alloc(d, n_hot * rd, &f->down_t);
        pi_device_alloc(d, n_hot * 4, (void **)&f->map);
        if (x != NULL) { /* a placed model: the device's shared activation scratch */
            f->x = x;
            f->y = y;
            f->scratch = scratch;
        } else {
            pi_device_alloc(d, pi_ffn_sparse_scratch_size(gate->type, n_embd, n_hot, max_tok), &f->scratch);
            pi_device_alloc(d, max_tok * n_embd * 4, (void **)&f->x);
            pi_device_alloc(d, max_tok * n_embd * 4, (void **)&f->y);
        }
        for (int64_t r = 0; r < n_hot; r++) { /* the "host to device" copies */
            const int64_t j = hot_ids[r];
            memcpy((char *)f->gate + r * rg, (const char *)gate->data + j * rg, (size_t)rg);
            memcpy((char *)f->up + r * rg, (const char *)up->data + j * rg, (size_t)rg);
            memcpy((char *)f->down_t + r * rd, (const char *)down_t->data + j * rd, (size_t)rd);
            f->map[r] = (int32_t)j;
        }
    }
    *out = &f->base;
    return PI_OK;
}

int pi_device_ffn_upload(pi_device *d, int32_t gate_up_type, const void *gate, const void *up, int64_t n_embd,
                         int64_t n_ff, int32_t down_t_type, const void *down_t, const int32_t *hot_ids,
                         int64_t n_hot, int64_t max_tok, pi_device_ffn **out) {
    if (d == NULL || gate == NULL || up == NULL || down_t == NULL || out == NULL || (n_hot > 0 && hot_ids == NULL))
        return pi_set_error(PI_ERR_INVALID, "pi_device_ffn_upload: NULL argument");
    const pi_mat g = {gate, gate_up_type, n_embd, n_ff}, u = {up, gate_up_type, n_embd, n_ff};
    const pi_mat dt = {down_t, down_t_type, n_embd, n_ff};
    return pi_device_ffn_create(d, &g, &u, &dt, hot_ids, n_hot, max_tok, NULL, NULL, NULL, out);
}

/* f: a cpu-device half (pi_device_ffn_upload, the only halves the API hands out) */
int pi_op_ffn_hybrid(pi_pool *pool, const pi_device_ffn *f, int32_t act, const void *gate, const void *up,
                     const void *down_t, const float *x, int64_t n_tok, float threshold, float *y, float *y_device) {
    static const char *fn = "pi_op_ffn_hybrid";
    if (pool == NULL || f == NULL || gate == NULL || up == NULL || down_t == NULL || x == NULL || y == NULL)
        return pi_set_error(PI_ERR_INVALID, "%s: NULL argument", fn);
    const cpu_half *h = (const cpu_half *)f;
    if (n_tok < 1 || n_tok > h->max_tok)
        return pi_set_error(PI_ERR_INVALID, "%s: n_tok %lld outside [1, %lld] (max_tok of the upload)", fn,
                            (long long)n_tok, (long long)h->max_tok);
    if (act < PI_FFN_SWIGLU || act > PI_FFN_DRELU)
        return pi_set_error(PI_ERR_INVALID, "%s: unknown activation form %d", fn, act);
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "%s: threshold must be finite and >= 0", fn);
    const int64_t E = f->n_embd;
    const pi_mat g = {gate, h->gate_up_type, E, f->n_ff}, u = {up, h->gate_up_type, E, f->n_ff};
    const pi_mat dt = {down_t, h->down_t_type, E, f->n_ff};
    const pi_ffn_sparse_args a = {.act = act, .gate = &g, .up = &u, .down_t = &dt, .x = x, .n_tok = n_tok,
                                  .threshold = threshold, .y = y};
    void *scratch = malloc((size_t)pi_ffn_sparse_scratch_size(h->gate_up_type, E, f->n_ff, n_tok));
    if (scratch == NULL) return pi_set_error(PI_ERR_NOMEM, "%s: out of memory", fn);
    const int rc = pi_ffn_split(pool, (pi_device_ffn *)f, &a, scratch, NULL, NULL, NULL, y_device);
    free(scratch);
    return rc;
}
