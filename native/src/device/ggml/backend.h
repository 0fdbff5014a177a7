/* An open ggml backend device (pi_gdev, backend.c): its ggml device, backend stream and
 * buffer type, shared by the placement on it (ggml_placed.c). */
#ifndef PI_GGML_BACKEND_H
#define PI_GGML_BACKEND_H

#include <pthread.h>

#include "device/ggml/api.h"
#include "pi_internal.h"

struct pi_gdev {
    const pi_ggml_api *g;
    gdev_t dev;
    gbackend_t backend;
    gbuft_t buft;    /* the device's own buffer type (CPU: the plain one, no repacking) */
    int32_t n_threads;
    int32_t is_cpu;
    char name[128];
    /* one step at a time on the device, whichever placement (context) and thread runs it: the
     * backend (its stream; ggml-cpu's work buffer) is the device's (steps.c) */
    pthread_mutex_t step_mu;
};

/* PI_OK when a [ne0, ne1] tensor of ggml type `type` can exist (known type, ne0 a whole
 * number of blocks); else an error naming them */
int pi_gdev_check_type(const pi_ggml_api *g, int32_t type, int64_t ne0, int64_t ne1);
/* align_up(ggml_backend_buft_get_alloc_size of [ne0, ne1] type, alignment): the bytes one
 * tensor takes in a buffer of d's type; -1 (error set) for a bad type or shape */
int64_t pi_gdev_tensor_slot(const pi_gdev *d, int32_t type, int64_t ne0, int64_t ne1);

#endif
