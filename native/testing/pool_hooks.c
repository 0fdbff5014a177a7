/* Test hooks of a context's thread pool (pi_test_pool_*; testing.h): stall one worker inside a
 * chunk, and read the per-worker chunk counters. */
#include "context.h"
#include "testing.h"

int pi_test_pool_stall(pi_context *c, int32_t worker, int32_t ms) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_test_pool_stall: context is NULL");
    return pi_pool_test_stall(c->pool, worker, ms);
}

int32_t pi_test_pool_counts(pi_context *c, int64_t *total, int64_t *stalled_job, int32_t cap) {
    if (c == NULL || cap < 0) return pi_set_error(PI_ERR_INVALID, "pi_test_pool_counts: NULL context or cap < 0");
    return pi_pool_test_counts(c->pool, total, stalled_job, cap);
}
