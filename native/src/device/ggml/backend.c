/* ggml's devices: the list ggml found, and opening one as a pi_gdev (backend stream,
 * buffer type, thread count), with its per-tensor byte counts. */
#include <stdio.h>
#include <stdlib.h>

#include "device/ggml/backend.h"

int pi_ggml_load_backends(const char *dir) {
    const pi_ggml_api *g = pi_ggml();
    if (g == NULL) return PI_ERR_INVALID;
    if (dir == NULL) return pi_set_error(PI_ERR_INVALID, "pi_ggml_load_backends: NULL dir");
    g->backend_load_all_from_path(dir); /* backends already registered (CPU) are not added twice */
    return PI_OK;
}

int32_t pi_ggml_dev_count(void) {
    const pi_ggml_api *g = pi_ggml();
    return g != NULL ? (int32_t)g->backend_dev_count() : -1;
}

static void fill_info(const pi_ggml_api *g, gdev_t dev, pi_gdev_info *out) {
    memset(out, 0, sizeof *out);
    const char *name = g->backend_dev_name(dev), *desc = g->backend_dev_description(dev);
    snprintf(out->name, sizeof out->name, "%s", name ? name : "");
    snprintf(out->description, sizeof out->description, "%s", desc ? desc : "");
    out->type = g->backend_dev_type(dev);
    size_t free_b = 0, total_b = 0;
    g->backend_dev_memory(dev, &free_b, &total_b);
    out->free_bytes = (int64_t)free_b;
    out->total_bytes = (int64_t)total_b;
}

int pi_ggml_dev_info(int32_t i, pi_gdev_info *out) {
    const pi_ggml_api *g = pi_ggml();
    if (g == NULL) return PI_ERR_INVALID;
    if (out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_ggml_dev_info: NULL argument");
    const size_t n = g->backend_dev_count();
    if (i < 0 || (size_t)i >= n) return pi_set_error(PI_ERR_INVALID, "ggml device %d is outside [0, %zu)", i, n);
    fill_info(g, g->backend_dev_get((size_t)i), out);
    return PI_OK;
}

/* "CPU, CUDA0" into buf: the names a caller may ask for */
static void device_names(const pi_ggml_api *g, char *buf, size_t n) {
    buf[0] = '\0';
    size_t at = 0;
    for (size_t i = 0; i < g->backend_dev_count() && at < n; i++)
        at += (size_t)snprintf(buf + at, n - at, "%s%s", i ? ", " : "", g->backend_dev_name(g->backend_dev_get(i)));
}

typedef void (*set_threads_fn)(gbackend_t, int);

int pi_gdev_open(const char *name, int32_t n_threads, pi_gdev **out) {
    const pi_ggml_api *g = pi_ggml();
    if (g == NULL) return PI_ERR_INVALID;
    if (name == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_gdev_open: NULL argument");
    *out = NULL;
    if (n_threads < 1 || n_threads > 512)
        return pi_set_error(PI_ERR_INVALID, "pi_gdev_open: n_threads must be in [1, 512], got %d", n_threads);
    gdev_t dev = g->backend_dev_by_name(name);
    if (dev == NULL) {
        char names[512];
        device_names(g, names, sizeof names);
        return pi_set_error(PI_ERR_INVALID, "no ggml device named \"%s\"; ggml has: %s", name, names);
    }
    pi_gdev *d = calloc(1, sizeof *d);
    if (d == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_gdev_open: out of memory");
    if (pthread_mutex_init(&d->step_mu, NULL) != 0) {
        free(d);
        return pi_set_error(PI_ERR_NOMEM, "pi_gdev_open: cannot create the device's lock");
    }
    d->g = g;
    d->dev = dev;
    d->n_threads = n_threads;
    d->is_cpu = g->backend_dev_type(dev) == 0;
    snprintf(d->name, sizeof d->name, "%s", g->backend_dev_name(dev));
    d->buft = g->backend_dev_buffer_type(dev);
    d->backend = g->backend_dev_init(dev, NULL);
    if (d->buft == NULL || d->backend == NULL) {
        pi_gdev_free(d);
        return pi_set_error(PI_ERR_UNSUPPORTED, "ggml device %s: cannot start its backend", name);
    }
    /* the CPU backend's thread count, through its registry (ggml_backend_set_n_threads) */
    set_threads_fn set = (set_threads_fn)g->backend_reg_get_proc_address(g->backend_dev_backend_reg(dev),
                                                                         "ggml_backend_set_n_threads");
    if (set != NULL) set(d->backend, n_threads);
    else if (d->is_cpu) {
        pi_gdev_free(d);
        return pi_set_error(PI_ERR_UNSUPPORTED, "ggml device %s: its backend has no ggml_backend_set_n_threads", name);
    }
    *out = d;
    return PI_OK;
}

void pi_gdev_free(pi_gdev *d) {
    if (d == NULL) return;
    if (d->backend != NULL) d->g->backend_free(d->backend);
    pthread_mutex_destroy(&d->step_mu);
    free(d);
}

int pi_gdev_get_info(const pi_gdev *d, pi_gdev_info *out) {
    if (d == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_gdev_get_info: NULL argument");
    fill_info(d->g, d->dev, out);
    return PI_OK;
}

int pi_gdev_check_type(const pi_ggml_api *g, int32_t type, int64_t ne0, int64_t ne1) {
    const char *tn = type >= 0 ? g->type_name(type) : NULL; /* "NONE" past ggml's last type */
    const int64_t blck = tn != NULL && strcmp(tn, "NONE") != 0 ? g->blck_size(type) : 0;
    if (blck <= 0) return pi_set_error(PI_ERR_INVALID, "ggml type %d is not a type of this ggml", type);
    if (ne0 < 1 || ne1 < 1 || ne0 % blck != 0)
        return pi_set_error(PI_ERR_INVALID, "a %s tensor of [%lld, %lld]: ne0 must be a positive multiple of %lld", tn,
                            (long long)ne0, (long long)ne1, (long long)blck);
    return PI_OK;
}

int64_t pi_gdev_tensor_bytes(const pi_gdev *d, int32_t ggml_type, int64_t ne0, int64_t ne1) {
    if (d == NULL) return pi_set_error(PI_ERR_INVALID, "pi_gdev_tensor_bytes: NULL device"), -1;
    const pi_ggml_api *g = d->g;
    if (pi_gdev_check_type(g, ggml_type, ne0, ne1)) return -1;
    _Alignas(64) char meta[2048]; /* one tensor's metadata */
    if (g->tensor_overhead() > sizeof meta)
        return pi_set_error(PI_ERR_UNSUPPORTED, "ggml tensor metadata exceeds %zu bytes", sizeof meta), -1;
    gctx *ctx = g->init((pi_ggml_init_params){sizeof meta, meta, true});
    if (ctx == NULL) return pi_set_error(PI_ERR_NOMEM, "ggml_init failed"), -1;
    const gt *t = g->new_tensor_2d(ctx, ggml_type, ne0, ne1);
    const int64_t n = (int64_t)g->backend_buft_get_alloc_size(d->buft, t);
    g->free(ctx);
    return n;
}

int64_t pi_gdev_alignment(const pi_gdev *d) {
    if (d == NULL) return pi_set_error(PI_ERR_INVALID, "pi_gdev_alignment: NULL device"), -1;
    return (int64_t)d->g->backend_buft_get_alignment(d->buft);
}

int64_t pi_gdev_tensor_slot(const pi_gdev *d, int32_t type, int64_t ne0, int64_t ne1) {
    const int64_t n = pi_gdev_tensor_bytes(d, type, ne0, ne1);
    return n < 0 ? -1 : pi_align_up(n, pi_gdev_alignment(d));
}
