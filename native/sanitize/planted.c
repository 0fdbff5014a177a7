/* The planted bugs of planted.h; only the sanitizer build compiles this file. */
#include "planted.h"

#include <limits.h>
#include <stdlib.h>

int pi_test_oob_write(int n) {
    volatile size_t size = 16;  /* unknown to the compiler: AddressSanitizer, not UBSan's object-size check, sees it */
    volatile char *p = malloc(size);  /* volatile: the store must not be optimised away */
    if (!p) return -1;
    p[16 + n] = 1;
    int v = p[0];
    free((void *)p);
    return v;
}

int pi_test_signed_overflow(int n) {
    volatile int x = INT_MAX;
    return x + n;
}
