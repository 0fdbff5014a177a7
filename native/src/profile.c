/* The per-op timer of a context (powerinfer.h, pi_context_set_profile). */
#include <string.h>

#include "context.h"

void pi_prof_now(pi_prof *p, int op) {
    const int64_t t = pi_now_ns();
    if (op >= 0) {
        p->ns[op] += t - p->lap;
        p->calls[op]++;
    }
    p->lap = t;
}

int pi_context_set_profile(pi_context *c, int32_t on) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_profile: NULL context");
    free(c->prof);
    c->prof = NULL;
    if (on) {
        c->prof = calloc(1, sizeof *c->prof);
        if (c->prof == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_context_set_profile: out of memory");
    }
    return PI_OK;
}

int32_t pi_context_profile(pi_context *c, int64_t *ns, int64_t *calls, int32_t cap, int32_t reset) {
    if (c == NULL || c->prof == NULL) return -1;
    const int32_t n = cap < PI_PROF_COUNT ? cap : PI_PROF_COUNT;
    for (int32_t i = 0; i < n; i++) {
        if (ns != NULL) ns[i] = c->prof->ns[i];
        if (calls != NULL) calls[i] = c->prof->calls[i];
    }
    if (reset) {
        memset(c->prof->ns, 0, sizeof c->prof->ns);
        memset(c->prof->calls, 0, sizeof c->prof->calls);
    }
    return PI_PROF_COUNT;
}
