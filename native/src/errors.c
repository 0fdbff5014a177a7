/* Thread-local error message behind pi_last_error(). */
#include <stdarg.h>
#include <stdio.h>

#include "pi_internal.h"

static _Thread_local char g_err[512];

int pi_set_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return code;
}

const char *pi_last_error(void) { return g_err; }
