/* The cpu-device's internal entry points: jobs on its thread, its byte accounting, and
 * its FFN halves (for a placed model, device/placed.c). */
#ifndef PI_CPU_DEVICE_H
#define PI_CPU_DEVICE_H

#include "pi_internal.h"

#define PI_DEVICE_ALIGN 256 /* every device allocation, and so every buffer a plan accounts */

typedef void (*pi_device_fn)(pi_pool *pool, void *arg); /* runs on the device's thread and workers */
int pi_device_claim(pi_device *d);                       /* PI_ERR_INVALID when a job is in flight */
void pi_device_go(pi_device *d, pi_device_fn fn, void *arg); /* start fn after a claim */
void pi_device_wait(pi_device *d);                       /* until it finishes; releases the claim */
void pi_device_count(pi_device *d, int64_t rows, int64_t n_attn, int64_t n_output);
int32_t pi_device_n_threads(const pi_device *d);
int64_t pi_device_free_bytes(const pi_device *d);
/* device bytes of n_hot compact rows: gate, up, down_t and the int32 map, each aligned */
int64_t pi_device_rows_bytes(int64_t gate_row, int64_t down_t_row, int64_t n_hot);
/* copy hot rows to the device as a half (ffn_half.h); x, y, scratch: shared device
 * buffers (NULL: allocate its own) */
int pi_device_ffn_create(pi_device *d, const pi_mat *gate, const pi_mat *up, const pi_mat *down_t,
                         const int32_t *hot_ids, int64_t n_hot, int64_t max_tok, float *x, float *y, void *scratch,
                         pi_device_ffn **out);

#endif
