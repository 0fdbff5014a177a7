/* Persistent worker pool. The calling thread is worker 0; the others spin for a
 * short while after each job (decode issues hundreds of small jobs per token),
 * then sleep on a condition variable so an idle pool costs no CPU. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "isa/relax.h"
#include "pi_internal.h"

#define PI_SPIN_NS 2000000LL /* how long a worker spins before sleeping: 2 ms */

typedef struct {
    pi_pool *pool;
    int ith;
} worker_arg;

struct pi_pool {
    int n;
    pthread_t *threads;
    worker_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint_fast64_t gen; /* bumped once per job */
    atomic_int n_done;
    atomic_int stop;
    int64_t spin_ns; /* 0 when there are more threads than CPUs: spinning would steal their time */
    pi_task_fn fn;
    void *arg;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint_fast64_t wait_for_job(pi_pool *p, uint_fast64_t seen) {
    const int64_t t0 = now_ns();
    unsigned spins = 0;
    for (;;) {
        uint_fast64_t g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load(&p->stop)) return g;
        pi_cpu_relax();
        if ((++spins & 1023u) == 0 && now_ns() - t0 >= p->spin_ns) break;
    }
    pthread_mutex_lock(&p->mu);
    uint_fast64_t g;
    while ((g = atomic_load(&p->gen)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    pi_pool *p = wa->pool;
    uint_fast64_t seen = 0;
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load(&p->stop)) break;
        p->fn(p->arg, wa->ith, p->n);
        atomic_fetch_add_explicit(&p->n_done, 1, memory_order_release);
    }
    return NULL;
}

int pi_pool_create(int32_t n_threads, pi_pool **out) {
    if (out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_pool_create: out is NULL");
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return pi_set_error(PI_ERR_INVALID, "n_threads must be in [1, 1024], got %d", n_threads);
    pi_pool *p = calloc(1, sizeof *p);
    if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for the thread pool");
    p->n = n_threads;
    cpu_set_t cpus;
    const int n_cpus = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    p->spin_ns = n_threads <= n_cpus ? PI_SPIN_NS : 0;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->stop, 0);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    p->args = calloc((size_t)n_threads, sizeof *p->args);
    if (p->threads == NULL || p->args == NULL) {
        p->n = 1;
        pi_pool_free(p);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for the thread pool");
    }
    for (int i = 1; i < n_threads; i++) {
        p->args[i] = (worker_arg){p, i};
        if (pthread_create(&p->threads[i], NULL, worker_main, &p->args[i]) != 0) {
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
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->threads);
    free(p->args);
    free(p);
}

int pi_pool_size(const pi_pool *p) { return p->n; }

void pi_pool_run(pi_pool *p, pi_task_fn fn, void *arg) {
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->n_done, 0, memory_order_relaxed);
    pthread_mutex_lock(&p->mu); /* pairs with the sleepers' check of gen */
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    /* wait for the workers; yield now and then in case one of them is not running */
    for (unsigned spins = 1; atomic_load_explicit(&p->n_done, memory_order_acquire) < p->n - 1; spins++) {
        pi_cpu_relax();
        if ((spins & 255u) == 0 && p->spin_ns == 0) sched_yield();
    }
}
