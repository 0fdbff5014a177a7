/* An FFN half on an external device (pi_context_set_ffn_offload): its start / wait
 * callbacks hold the hot rows and the device memory; nothing of it lives here. */
#include "device/ffn_half.h"

typedef struct {
    pi_device_ffn base;
    void *handle;
    pi_ffn_offload_start_fn start;
    pi_ffn_offload_wait_fn wait;
} ext_half;

static int ext_start(pi_device_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold,
                     int64_t *n_used) {
    const ext_half *e = (const ext_half *)f;
    (void)n_used; /* the device reports its counts in wait */
    return e->start(e->handle, act, x, n_tok, threshold) == 0
               ? PI_OK
               : pi_set_error(PI_ERR_INVALID, "the offload device refused to start an FFN half");
}

static int ext_finish(pi_device_ffn *f, int64_t n_tok, float *y, int64_t *n_used) {
    const ext_half *e = (const ext_half *)f;
    (void)n_tok;
    return e->wait(e->handle, y, n_used) == 0 /* the device writes its partial sum straight into y */
               ? PI_OK
               : pi_set_error(PI_ERR_INVALID, "the offload device failed to finish an FFN half");
}

static const pi_ffn_half_i ext_half_i = {ext_start, ext_finish};

int pi_ffn_offload_half(void *handle, pi_ffn_offload_start_fn start, pi_ffn_offload_wait_fn wait, int64_t n_embd,
                        int64_t n_ff, const int32_t *hot_ids, int64_t n_hot, pi_device_ffn **out) {
    *out = NULL;
    int rc = pi_ffn_check_hot_ids("pi_context_set_ffn_offload", hot_ids, n_hot, n_ff);
    if (rc) return rc;
    ext_half *e = (ext_half *)pi_ffn_half_new(sizeof *e, &ext_half_i, hot_ids, n_hot, n_embd, n_ff);
    if (e == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_context_set_ffn_offload: out of memory");
    e->handle = handle;
    e->start = start;
    e->wait = wait;
    *out = &e->base;
    return PI_OK;
}
