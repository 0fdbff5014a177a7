/* The device thread: runs one hot-FFN graph at a time while the calling thread computes the
 * cold neurons (ggml's CPU backend computes synchronously on the thread that calls it, so
 * without a thread of ours the CPU half could not overlap). Its FFN halves (ffn_half.h). */
#include <stdio.h>

#include "device/ggml/gplaced.h"

typedef struct {
    pi_device_ffn base; /* first: ffn_split.c sees this */
    pi_gplaced *p;
    int l;
} gg_half;

static void *worker_main(void *arg) {
    pi_gplaced *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->job_pending && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        p->job_pending = 0;
        pthread_mutex_unlock(&p->mu);
        const int rc = pi_gg_run_ffn(p, p->job_l, p->job_x, p->job_tok, p->y_dev);
        if (rc) snprintf(p->job_msg, sizeof p->job_msg, "%s", pi_last_error()); /* that message is this thread's */
        pthread_mutex_lock(&p->mu);
        p->job_rc = rc;
        p->job_done = 1;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int pi_gg_worker_start(pi_gplaced *p) {
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
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    p->thread_on = 0;
}

/* the device sums its hot neurons densely (PowerInfer's dense hot part): the threshold applies
 * to the cold neurons on the CPU */
static int half_start(pi_device_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold, int64_t *n_used) {
    gg_half *h = (gg_half *)f;
    pi_gplaced *p = h->p;
    (void)act;
    (void)threshold;
    (void)n_used;
    pthread_mutex_lock(&p->mu);
    p->job_l = h->l;
    p->job_x = x;
    p->job_tok = n_tok;
    p->job_done = 0;
    p->job_pending = 1;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return PI_OK;
}

static int half_finish(pi_device_ffn *f, int64_t n_tok, float *y, int64_t *n_used) {
    gg_half *h = (gg_half *)f;
    pi_gplaced *p = h->p;
    pi_gg_trace_add(p, PI_GG_EV_COLD, h->l, p->ev != NULL ? p->ev_t0 : 0, pi_now_ns()); /* the CPU half's activations */
    pthread_mutex_lock(&p->mu);
    while (!p->job_done) pthread_cond_wait(&p->cv, &p->mu);
    const int rc = p->job_rc;
    pthread_mutex_unlock(&p->mu);
    if (rc) return pi_set_error(rc, "%s", p->job_msg);
    memcpy(y, p->y_dev, (size_t)(n_tok * f->n_embd) * sizeof(float));
    if (n_used != NULL)
        for (int64_t t = 0; t < n_tok; t++) n_used[t] = f->n_hot;
    return PI_OK;
}

static const pi_ffn_half_i gg_half_i = {half_start, half_finish};

int pi_gg_ffn_half(pi_gplaced *p, int l, const int32_t *hot_ids, int64_t n_hot, pi_device_ffn **out) {
    const pi_model_params *hp = &p->c->m->hp;
    gg_half *h = (gg_half *)pi_ffn_half_new(sizeof(gg_half), &gg_half_i, hot_ids, n_hot, hp->n_embd, hp->n_ff);
    if (h == NULL) return pi_set_error(PI_ERR_NOMEM, "blk.%d: out of memory for the FFN half", l);
    h->p = p;
    h->l = l;
    *out = &h->base;
    return PI_OK;
}
