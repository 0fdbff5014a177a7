/* Run-time choice of the instruction-set path (POWERINFER_ISA or pi_isa_set) and of
 * the F16 dot order (POWERINFER_F16_ORDER or pi_f16_order_set). The current table is
 * pi_isa_<path>[order]. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pi_internal.h"

/* first use may race between threads (both racers store the same choice) */
static _Atomic(const pi_isa *) g_isa = NULL; /* the path's table array */
static _Atomic int g_order = -1;

uint32_t pi_isa_supported(void) {
    uint32_t m = PI_ISA_SCALAR;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
        m |= PI_ISA_AVX2;
    if ((m & PI_ISA_AVX2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        m |= PI_ISA_AVX512;
    if ((m & PI_ISA_AVX512) && __builtin_cpu_supports("avx512vnni")) m |= PI_ISA_AVX512VNNI;
#endif
    return m;
}

static const pi_isa *best(void) {
    const uint32_t m = pi_isa_supported();
    if (m & PI_ISA_AVX512VNNI) return pi_isa_avx512_vnni;
    if (m & PI_ISA_AVX512) return pi_isa_avx512;
    if (m & PI_ISA_AVX2) return pi_isa_avx2;
    return pi_isa_scalar;
}

/* The order llama.cpp runs on this CPU: its GGML_F16_STEP follows __AVX512F__ alone,
 * which a native build has where the CPU has AVX512F, and so does the GGML_BACKEND_DL
 * variant its loader picks (that one also wants CD/VL/DQ/BW, which every AVX512F CPU
 * but Knights Landing/Mill has). */
static int best_order(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return PI_F16_ORDER_AVX512;
#endif
    return PI_F16_ORDER_AVX2;
}

int pi_isa_set(const char *name) {
    const uint32_t m = pi_isa_supported();
    if (name == NULL || strcmp(name, "auto") == 0 || name[0] == '\0') {
        g_isa = best();
    } else if (strcmp(name, "scalar") == 0) {
        g_isa = pi_isa_scalar;
    } else if (strcmp(name, "avx2") == 0) {
        if (!(m & PI_ISA_AVX2)) return pi_set_error(PI_ERR_UNSUPPORTED, "this CPU does not support avx2+fma+f16c");
        g_isa = pi_isa_avx2;
    } else if (strcmp(name, "avx512") == 0) {
        if (!(m & PI_ISA_AVX512)) return pi_set_error(PI_ERR_UNSUPPORTED, "this CPU does not support avx512f/bw/vl/dq");
        g_isa = pi_isa_avx512;
    } else if (strcmp(name, "avx512vnni") == 0) {
        if (!(m & PI_ISA_AVX512VNNI))
            return pi_set_error(PI_ERR_UNSUPPORTED, "this CPU does not support avx512f/bw/vl/dq+vnni");
        g_isa = pi_isa_avx512_vnni;
    } else {
        return pi_set_error(PI_ERR_INVALID, "unknown ISA '%s' (expected auto, scalar, avx2, avx512 or avx512vnni)",
                            name);
    }
    return PI_OK;
}

int pi_f16_order_set(const char *name) {
    if (name == NULL || strcmp(name, "auto") == 0 || name[0] == '\0') {
        g_order = best_order();
    } else if (strcmp(name, "avx2") == 0) {
        g_order = PI_F16_ORDER_AVX2;
    } else if (strcmp(name, "avx512") == 0) {
        g_order = PI_F16_ORDER_AVX512;
    } else {
        return pi_set_error(PI_ERR_INVALID, "unknown F16 order '%s' (expected auto, avx2 or avx512)", name);
    }
    return PI_OK;
}

static int order_current(void) {
    int o = atomic_load(&g_order);
    if (o < 0) {
        /* Python validates POWERINFER_F16_ORDER at import and raises; C callers fall back to auto */
        if (pi_f16_order_set(getenv("POWERINFER_F16_ORDER")) != PI_OK) atomic_store(&g_order, best_order());
        o = atomic_load(&g_order);
    }
    return o;
}

const pi_isa *pi_isa_current(void) {
    const pi_isa *isa = atomic_load(&g_isa);
    if (isa == NULL) {
        /* Python validates POWERINFER_ISA at import and raises; C callers fall back to auto */
        if (pi_isa_set(getenv("POWERINFER_ISA")) != PI_OK) atomic_store(&g_isa, best());
        isa = atomic_load(&g_isa);
    }
    return isa + order_current();
}

const char *pi_isa_name(void) { return pi_isa_current()->name; }

const char *pi_f16_order_name(void) { return order_current() == PI_F16_ORDER_AVX512 ? "avx512" : "avx2"; }
