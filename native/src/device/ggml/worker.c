/* The device thread: runs one hot-FFN graph at a time while the calling thread computes the
 * cold neurons (ggml's CPU backend computes synchronously on the thread that calls it, so
 * without a thread of ours the CPU half could not overlap); blocks/ffn.c computes the cold rows
 * between post and wait.
 * Handoffs spin briefly before sleeping, as the pool's workers (threads.c): a condition
 * variable's wakeup alone lets the woken thread take the caller's core, serializing the halves. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <sched.h>
#include <stdio.h>

#include "device/ggml/gplaced.h"

#define PI_GG_SPIN_NS 500000LL     /* the device thread after a job */
#define PI_GG_WAIT_SPIN_NS 500000LL /* the caller waiting for the device: sleeping there would let the device
                                      * thread's wakeup pull it onto the device thread's core */

/* the job posted (seq) goes to whoever claims it first: the device thread, or the caller once its CPU
 * half is done (the device thread was not scheduled in time on a loaded host: no waiting for it) */
static int claim(pi_gplaced *p) {
    int posted = JOB_POSTED;
    return atomic_compare_exchange_strong(&p->job_state, &posted, JOB_TAKEN);
}

static void run_job(pi_gplaced *p, uint_fast64_t seq) {
    const int rc = pi_gg_run_ffn(p, p->job_l, p->job_x, p->y_dev);
    if (rc) snprintf(p->job_msg, sizeof p->job_msg, "%s", pi_last_error()); /* the message of this thread */
    p->job_rc = rc;
    atomic_store(&p->done_seq, seq);
}

/* spin until *seq differs from seen (or stop) for up to limit_ns; returns the last value read */
static uint_fast64_t spin_until_not(pi_gplaced *p, atomic_uint_fast64_t *seq, uint_fast64_t seen, int64_t limit_ns) {
    const int64_t t0 = pi_now_ns();
    unsigned n = 0;
    uint_fast64_t v;
    if (p->spin_ns == 0) return atomic_load(seq);
    while ((v = atomic_load(seq)) == seen && !atomic_load(&p->stop))
        if ((++n & 255u) == 0 && pi_now_ns() - t0 >= limit_ns) break;
    return v;
}

/* sleep on cv until *seq differs from seen (flag: who sleeps, for the other side's wakeup) */
static void sleep_until_not(pi_gplaced *p, atomic_int *flag, atomic_uint_fast64_t *seq, uint_fast64_t seen) {
    pthread_mutex_lock(&p->mu);
    atomic_store(flag, 1);
    while (atomic_load(seq) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
    atomic_store(flag, 0);
    pthread_mutex_unlock(&p->mu);
}

static void wake(pi_gplaced *p, atomic_int *flag) {
    if (!atomic_load(flag)) return; /* seq_cst with the sleeper's flag-then-check: no lost wakeup */
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *worker_main(void *arg) {
    pi_gplaced *p = arg;
    uint_fast64_t seen = 0;
    for (;;) {
        if (spin_until_not(p, &p->job_seq, seen, p->spin_ns) == seen) sleep_until_not(p, &p->sleeping, &p->job_seq, seen);
        if (atomic_load(&p->stop)) break;
        seen = atomic_load(&p->job_seq);
        if (!claim(p)) continue; /* the caller ran it */
        run_job(p, seen);
        wake(p, &p->waiting);
    }
    return NULL;
}

int pi_gg_worker_start(pi_gplaced *p) {
    cpu_set_t set;
    const int n_cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    /* spinning only while the caller's threads and the device's fit the CPUs */
    p->spin_ns = p->c->cp.n_threads + (p->d->is_cpu ? p->d->n_threads : 1) <= n_cpus ? PI_GG_SPIN_NS : 0;
    atomic_init(&p->job_seq, 0);
    atomic_init(&p->done_seq, 0);
    atomic_init(&p->sleeping, 0);
    atomic_init(&p->waiting, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->job_state, JOB_NONE);
    if (pthread_mutex_init(&p->mu, NULL) != 0 || pthread_cond_init(&p->cv, NULL) != 0)
        return pi_set_error(PI_ERR_NOMEM, "ggml device: cannot create the device thread's lock");
    if (pthread_create(&p->thread, NULL, worker_main, p) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        return pi_set_error(PI_ERR_NOMEM, "ggml device: cannot start the device thread");
    }
    p->thread_on = 1;
    return PI_OK;
}

void pi_gg_worker_stop(pi_gplaced *p) {
    if (!p->thread_on) return;
    atomic_store(&p->stop, 1);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    p->thread_on = 0;
}

void pi_gg_ffn_post(pi_gplaced *p, int l, const float *x) {
    p->job_l = l;
    p->job_x = x;
    atomic_store(&p->job_state, JOB_POSTED);
    const uint_fast64_t seq = atomic_fetch_add(&p->job_seq, 1) + 1; /* publishes the job's fields */
    if (p->H[l].n_hot == p->c->m->hp.n_ff && claim(p)) { /* no cold neurons to overlap: no handoff */
        run_job(p, seq);
        return;
    }
    wake(p, &p->sleeping);
}

int pi_gg_ffn_wait(pi_gplaced *p, int64_t n_tok, float *y) {
    const uint_fast64_t job = atomic_load(&p->job_seq);
    if (claim(p)) run_job(p, job); /* not started yet: the caller computes it now */
    if (spin_until_not(p, &p->done_seq, job - 1, PI_GG_WAIT_SPIN_NS) != job) sleep_until_not(p, &p->waiting, &p->done_seq, job - 1);
    if (p->job_rc) return pi_set_error(p->job_rc, "%s", p->job_msg);
    if (y != NULL) memcpy(y, p->y_dev, (size_t)(n_tok * p->c->m->hp.n_embd) * sizeof(float));
    return PI_OK;
}
