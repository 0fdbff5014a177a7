/* Persistent worker pool with chunked jobs (docs/architecture.md, "Thread pool").
 *
 * A job is split into more chunks than threads (POWERINFER_POOL_CHUNKS per thread,
 * default 4). It is published as one 64-bit word, generation << 32 | n_chunks << 16
 * | next chunk; the calling thread and the workers claim chunks from it by CAS until
 * none remain. So a worker that is asleep or descheduled delays only the chunk it
 * holds, never a fixed share of the job, and the caller never waits for a worker
 * that has not started. The generation in the same word as the counter means a late
 * worker can never claim a chunk of a job other than the one it read.
 *
 * Tasks see fn(arg, chunk, n_chunks): outputs depend on the chunk, never on the
 * thread that ran it (pi_pool_worker() is for per-thread scratch only), so results
 * are bit-identical for any thread count and chunking.
 *
 * Waiting: a worker spins a few microseconds after a chunk (decode issues hundreds of
 * small jobs per token a few microseconds apart), then sleeps on a condition
 * variable. It does not spin at all for 100 ms after it was last found preempted
 * (an involuntary context switch, or a gap inside its spin): spinning then only takes
 * time from the process that wants the core. POWERINFER_POOL_SPIN_US=N fixes the
 * spin instead (0 = never spin), for measurement. */
#define _GNU_SOURCE /* sched_getaffinity, RUSAGE_THREAD */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "isa/relax.h"
#include "pi_internal.h"

#define PI_SPIN_NS_DEFAULT 50000LL /* 50 us: covers the gap between a token's jobs */
#define PI_CHUNKS_PER_THREAD 4
#define PI_CALM_NS 100000000LL /* 100 ms without spinning after a preemption */
#define PI_GAP_NS 20000LL     /* a gap this long inside a spin: the thread was switched out */
#define PI_MAX_CHUNKS 0xffff /* n_chunks and next share 16 bits each of the job word */

typedef struct {
    _Alignas(64) pi_pool *pool; /* one cache line per worker: counters written by their owner only */
    int ith;
    int64_t calm_at; /* no spinning before this time (ns): the core was recently contended */
    long nivcsw;     /* involuntary context switches at the last check */
    atomic_llong chunks; /* chunks run since the pool was made (pi_test_pool_counts) */
    long long pre;   /* chunks at the start of a job with a stall armed */
} worker;

struct pi_pool {
    int n, chunks_per_thread;
    int adaptive;    /* no spinning for PI_CALM_NS after a preemption (else spin_ns always) */
    int64_t spin_ns;
    pthread_t *threads;
    worker *w;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    pi_task_fn fn;
    void *arg;
    _Alignas(64) atomic_uint_fast64_t job; /* gen << 32 | n_chunks << 16 | next */
    _Alignas(64) atomic_int n_done;        /* chunks of the current job finished */
    atomic_int n_sleeping;                 /* workers in (or entering) cv_job waits */
    atomic_int caller_sleeping;            /* the caller is in (or entering) its cv_done wait */
    atomic_int stop;
    /* test-only stall (pi_test_pool_stall): worker stall_worker sleeps stall_ms in its next chunk */
    atomic_int stall_worker, stall_ms;
    atomic_uint stall_gen; /* generation of the job the stall fired in, + 1 (0: none yet) */
    long long *stall_counts;
};

static _Thread_local int tls_worker; /* 0 on every thread that is not a pool worker */

int pi_pool_worker(void) { return tls_worker; }

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint32_t job_gen(uint_fast64_t v) { return (uint32_t)(v >> 32); }

/* Whether this thread was switched out involuntarily since its last check: another
 * runnable task wanted its core. */
static int was_preempted(worker *w) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) return 0;
    const int r = ru.ru_nivcsw != w->nivcsw;
    w->nivcsw = ru.ru_nivcsw;
    return r;
}

/* How long to spin in the wait starting at `now`. Adaptive: none for PI_CALM_NS after the
 * thread was last found preempted (checked at every wait, a cheap syscall), so that on a
 * contended core each wait sleeps at once; the full spin on a quiet one. */
static int64_t spin_budget(const pi_pool *p, worker *w, int64_t now) {
    if (!p->adaptive) return p->spin_ns;
    if (was_preempted(w)) w->calm_at = now + PI_CALM_NS;
    return now < w->calm_at ? 0 : p->spin_ns;
}

static void stall_hook(pi_pool *p, worker *w, uint32_t gen) {
    int me = w->ith;
    if (atomic_compare_exchange_strong(&p->stall_worker, &me, -1)) {
        const int ms = atomic_load(&p->stall_ms);
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        atomic_store(&p->stall_gen, gen + 1u);
    }
}

/* Claim and run chunks of job `gen` until none remain (or a newer job is up). */
static void run_chunks(pi_pool *p, worker *w, uint32_t gen) {
    uint_fast64_t v = atomic_load_explicit(&p->job, memory_order_acquire);
    for (;;) {
        if (job_gen(v) != gen) return;
        const int total = (int)((v >> 16) & 0xffff), next = (int)(v & 0xffff);
        if (next >= total) return;
        if (!atomic_compare_exchange_weak_explicit(&p->job, &v, v + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        if (atomic_load_explicit(&p->stall_worker, memory_order_relaxed) >= 0) stall_hook(p, w, gen);
        p->fn(p->arg, next, total);
        atomic_store_explicit(&w->chunks, atomic_load_explicit(&w->chunks, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        if (atomic_fetch_add(&p->n_done, 1) + 1 == total && atomic_load(&p->caller_sleeping)) {
            pthread_mutex_lock(&p->mu); /* the caller checks n_done under mu before it waits */
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
        v = atomic_load_explicit(&p->job, memory_order_acquire);
    }
}

static uint32_t wait_for_job(pi_pool *p, worker *w, uint32_t seen) {
    const int64_t t0 = now_ns(), budget = spin_budget(p, w, t0);
    if (budget > 0) {
        int64_t last = t0;
        for (unsigned spins = 1;; spins++) {
            const uint32_t g = job_gen(atomic_load_explicit(&p->job, memory_order_acquire));
            if (g != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return g;
            pi_cpu_relax();
            if ((spins & 63u) == 0) {
                const int64_t t = now_ns();
                const int gap = p->adaptive && t - last >= PI_GAP_NS; /* switched out mid-spin */
                if (gap) w->calm_at = t + PI_CALM_NS;
                if (t - t0 >= budget || gap) break;
                last = t;
            }
        }
    }
    atomic_fetch_add(&p->n_sleeping, 1); /* before the check below: pairs with pi_pool_run's publish */
    pthread_mutex_lock(&p->mu);
    uint32_t g;
    while ((g = job_gen(atomic_load(&p->job))) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cv_job, &p->mu);
    pthread_mutex_unlock(&p->mu);
    atomic_fetch_sub(&p->n_sleeping, 1);
    return g;
}

static void *worker_main(void *varg) {
    worker *w = varg;
    pi_pool *p = w->pool;
    tls_worker = w->ith;
    uint32_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, w, seen);
        if (atomic_load(&p->stop)) break;
        run_chunks(p, w, seen);
    }
    return NULL;
}

/* Spin setting from POWERINFER_POOL_SPIN_US: unset/"auto" = adaptive, else a fixed spin in us. */
static void read_spin_env(pi_pool *p) {
    const char *e = getenv("POWERINFER_POOL_SPIN_US");
    p->adaptive = 1;
    p->spin_ns = PI_SPIN_NS_DEFAULT;
    if (e != NULL && *e && strcmp(e, "auto") != 0) {
        char *end;
        const long us = strtol(e, &end, 10);
        if (*end == '\0' && us >= 0 && us <= 1000000) {
            p->adaptive = 0;
            p->spin_ns = us * 1000LL;
        }
    }
    const char *c = getenv("POWERINFER_POOL_CHUNKS");
    p->chunks_per_thread = PI_CHUNKS_PER_THREAD;
    if (c != NULL && *c) {
        char *end;
        const long k = strtol(c, &end, 10);
        if (*end == '\0' && k >= 1 && k <= 64) p->chunks_per_thread = (int)k;
    }
}

int pi_pool_create(int32_t n_threads, pi_pool **out) {
    if (out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_pool_create: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return pi_set_error(PI_ERR_INVALID, "n_threads must be in [1, 1024], got %d", n_threads);
    pi_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for the thread pool");
    p->n = n_threads;
    read_spin_env(p);
    cpu_set_t cpus;
    const int n_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    if (n_threads > n_cpus) p->spin_ns = 0; /* more threads than CPUs: a spinner always takes a sibling's time */
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    atomic_init(&p->job, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->n_sleeping, 0);
    atomic_init(&p->caller_sleeping, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->stall_worker, -1);
    atomic_init(&p->stall_ms, 0);
    atomic_init(&p->stall_gen, 0);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->w = aligned_alloc(64, pi_align_up((int64_t)n_threads * (int64_t)sizeof *p->w, 64));
    p->stall_counts = calloc((size_t)n_threads, sizeof *p->stall_counts);
    if (p->threads == NULL || p->w == NULL || p->stall_counts == NULL) {
        p->n = 1;
        pi_pool_free(p);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for the thread pool");
    }
    memset(p->w, 0, (size_t)n_threads * sizeof *p->w);
    for (int i = 0; i < n_threads; i++) {
        p->w[i].pool = p;
        p->w[i].ith = i;
        atomic_init(&p->w[i].chunks, 0);
    }
    for (int i = 1; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->w[i]) != 0) {
            p->n = i; /* join only those started */
            pi_pool_free(p);
            return pi_set_error(PI_ERR_NOMEM, "could not start worker thread %d", i);
        }
    }
    *out = p;
    return PI_OK;
}

void pi_pool_free(pi_pool *p) {
    if (p == NULL) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv_job);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_job);
    pthread_cond_destroy(&p->cv_done);
    free(p->threads);
    free(p->w);
    free(p->stall_counts);
    free(p);
}

int pi_pool_size(const pi_pool *p) { return p->n; }

void pi_pool_run(pi_pool *p, pi_task_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    int total = p->n * p->chunks_per_thread;
    if (total > PI_MAX_CHUNKS) total = PI_MAX_CHUNKS;
    const int armed = atomic_load_explicit(&p->stall_worker, memory_order_relaxed) >= 0;
    if (armed)
        for (int i = 0; i < p->n; i++) p->w[i].pre = atomic_load_explicit(&p->w[i].chunks, memory_order_relaxed);
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    const uint32_t gen = job_gen(atomic_load_explicit(&p->job, memory_order_relaxed)) + 1u;
    atomic_store(&p->job, (uint_fast64_t)gen << 32 | (uint_fast64_t)total << 16);
    if (atomic_load(&p->n_sleeping) > 0) { /* seq_cst store then load: a sleeper either sees gen or is counted */
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_job);
        pthread_mutex_unlock(&p->mu);
    }
    run_chunks(p, &p->w[0], gen);
    /* chunks still running on workers: spin a little, then sleep until the last one signals */
    if (atomic_load_explicit(&p->n_done, memory_order_acquire) < total) {
        const int64_t t0 = now_ns(), budget = spin_budget(p, &p->w[0], t0);
        for (unsigned spins = 1; atomic_load_explicit(&p->n_done, memory_order_acquire) < total; spins++) {
            pi_cpu_relax();
            if ((spins & 63u) == 0 && now_ns() - t0 >= budget) {
                atomic_store(&p->caller_sleeping, 1);
                pthread_mutex_lock(&p->mu);
                while (atomic_load(&p->n_done) < total) pthread_cond_wait(&p->cv_done, &p->mu);
                pthread_mutex_unlock(&p->mu);
                atomic_store(&p->caller_sleeping, 0);
                break;
            }
        }
    }
    if (armed && atomic_load(&p->stall_gen) == gen + 1u)
        for (int i = 0; i < p->n; i++)
            p->stall_counts[i] = atomic_load_explicit(&p->w[i].chunks, memory_order_relaxed) - p->w[i].pre;
}

/* ---- for the test hooks (pi_test_pool_*; native/testing/) ---- */

int pi_pool_test_stall(pi_pool *p, int32_t worker_id, int32_t ms) {
    if (worker_id < 0 || worker_id >= p->n || ms < 0 || ms > 10000)
        return pi_set_error(PI_ERR_INVALID, "pi_test_pool_stall: worker %d outside [0, %d) or ms %d outside [0, 10000]",
                            worker_id, p->n, ms);
    atomic_store(&p->stall_ms, ms);
    atomic_store(&p->stall_gen, 0);
    atomic_store(&p->stall_worker, worker_id);
    return PI_OK;
}

int32_t pi_pool_test_counts(const pi_pool *p, int64_t *total, int64_t *stalled_job, int32_t cap) {
    for (int i = 0; i < p->n && i < cap; i++) {
        if (total) total[i] = atomic_load(&p->w[i].chunks);
        if (stalled_job) stalled_job[i] = atomic_load(&p->stall_gen) ? p->stall_counts[i] : -1;
    }
    return p->n;
}
