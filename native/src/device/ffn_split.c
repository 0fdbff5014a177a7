/* The split FFN over any device half (ffn_half.h): the cold lists, the CPU half, the merge. */
#include <stdlib.h>

#include "device/ffn_half.h"

int pi_ffn_check_hot_ids(const char *fn, const int32_t *hot_ids, int64_t n_hot, int64_t n_ff) {
    for (int64_t r = 0; r < n_hot; r++)
        if (hot_ids[r] < 0 || hot_ids[r] >= n_ff || (r > 0 && hot_ids[r] <= hot_ids[r - 1]))
            return pi_set_error(PI_ERR_INVALID, "%s: hot ids must be strictly increasing in [0, %lld) (id %d at %lld)",
                                fn, (long long)n_ff, hot_ids[r], (long long)r);
    return PI_OK;
}

pi_device_ffn *pi_ffn_half_new(size_t size, const pi_ffn_half_i *iface, const int32_t *hot_ids, int64_t n_hot,
                               int64_t n_embd, int64_t n_ff) {
    pi_device_ffn *f = calloc(1, size);
    if (f == NULL || (f->cold = malloc((size_t)(n_ff - n_hot + 1) * sizeof *f->cold)) == NULL) {
        free(f);
        return NULL;
    }
    f->iface = iface;
    f->n_embd = n_embd;
    f->n_ff = n_ff;
    f->n_hot = n_hot;
    for (int64_t j = 0, r = 0, c = 0; j < n_ff; j++) {
        if (r < n_hot && hot_ids[r] == j) r++;
        else f->cold[c++] = (int32_t)j;
    }
    return f;
}

void pi_device_ffn_free(pi_device_ffn *f) {
    if (f == NULL) return;
    free(f->cold); /* a device's memory returns with the device */
    free(f);
}

/* the CPU half: base's computation over the cold neurons only (base->active ignored) */
static int ffn_cold(pi_pool *pool, const pi_device_ffn *f, const pi_ffn_sparse_args *base, void *scratch,
                    int32_t *ids_buf, int64_t *off_buf) {
    const int64_t n_tok = base->n_tok, n_cold = f->n_ff - f->n_hot;
    if (n_cold == 0) {
        if (base->phase != 2 && base->n_used) memset(base->n_used, 0, (size_t)n_tok * sizeof *base->n_used);
        return PI_OK;
    }
    int32_t *ids = ids_buf ? ids_buf : malloc((size_t)(n_cold * n_tok) * sizeof *ids);
    int64_t *off = off_buf ? off_buf : malloc((size_t)(n_tok + 1) * sizeof *off);
    int rc = PI_OK;
    if (ids == NULL || off == NULL) {
        rc = pi_set_error(PI_ERR_NOMEM, "pi_ffn_cold: out of memory");
    } else { /* every token's candidates: the cold ids */
        for (int64_t t = 0; t <= n_tok; t++) {
            off[t] = t * n_cold;
            if (t < n_tok && base->phase != 2) memcpy(ids + t * n_cold, f->cold, (size_t)n_cold * sizeof *ids);
        }
        pi_ffn_sparse_args a = *base;
        a.active = ids;
        a.active_off = off;
        pi_ffn_sparse(pool, &a, scratch);
    }
    if (ids_buf == NULL) free(ids);
    if (off_buf == NULL) free(off);
    return rc;
}

int pi_ffn_split_start(pi_device_ffn *f, const pi_ffn_sparse_args *base, int64_t *n_used_device) {
    if (f->n_hot == 0) return PI_OK;
    return f->iface->start(f, base->act, base->x, base->n_tok, base->threshold, n_used_device);
}

/* wait for the device half; y = its partial sum (copied back); counts added to n_used */
static int half_finish(pi_device_ffn *f, int64_t n_tok, float *y, float *y_device, int64_t *n_used,
                       int64_t *n_used_device) {
    const int64_t n = n_tok * f->n_embd;
    if (f->n_hot == 0) {
        memset(y, 0, (size_t)n * sizeof(float));
        if (y_device != NULL) memset(y_device, 0, (size_t)n * sizeof(float));
        return PI_OK;
    }
    const int rc = f->iface->finish(f, n_tok, y, n_used_device);
    if (y_device != NULL) memcpy(y_device, y, (size_t)n * sizeof(float));
    if (n_used != NULL && n_used_device != NULL)
        for (int64_t t = 0; t < n_tok; t++) n_used[t] += n_used_device[t];
    return rc;
}

int pi_ffn_split_finish(pi_pool *pool, pi_device_ffn *f, const pi_ffn_sparse_args *base, void *scratch,
                        int32_t *ids_buf, int64_t *off_buf, int64_t *n_used_device, float *y_device) {
    pi_ffn_sparse_args a = *base;
    a.phase = 1; /* the cold rows' h on the CPU while the device computes the hot rows */
    const int rc = ffn_cold(pool, f, &a, scratch, ids_buf, off_buf);
    const int rc2 = half_finish(f, a.n_tok, a.y, y_device, a.n_used, n_used_device); /* always waits */
    if (rc || rc2) return rc ? rc : rc2;
    a.phase = 2; /* y = the device's partial sum, continued by the cold rows in id order */
    return ffn_cold(pool, f, &a, scratch, ids_buf, off_buf);
}
