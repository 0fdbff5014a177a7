/* Elementwise activations (SiLU, GELU tanh approximation, ReLU); the softmax entry point
 * (the kernel is the ISA table's, isa/softmax.h), and SiLU's (isa/ffn_act.h). */
#include <pthread.h>

#include "pi_internal.h"

#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535588f

float pi_act1(int32_t act, float x) {
    switch (act) {
    case PI_ACT_SILU: { /* the table's, as the FFN's h (isa/ffn_act.h) */
        float h;
        pi_isa_current()->silu_mul(&x, NULL, &h, 1);
        return h;
    }
    case PI_ACT_GELU:
        return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
    default:
        return x > 0.0f ? x : 0.0f;
    }
}

void pi_act_mul(int32_t act, const float *g, const float *u, float *h, int64_t n) {
    if (u == NULL) { /* ungated FFN: h = act(up x); dReLU's relu(up) is then relu */
        for (int64_t i = 0; i < n; i++) h[i] = pi_act1(act == PI_ACT_DRELU ? PI_ACT_RELU : act, g[i]);
        return;
    }
    if (act == PI_ACT_SILU) {
        pi_isa_current()->silu_mul(g, u, h, n);
        return;
    }
    if (act == PI_ACT_DRELU) {
        for (int64_t i = 0; i < n; i++) h[i] = (g[i] > 0.0f ? g[i] : 0.0f) * (u[i] > 0.0f ? u[i] : 0.0f);
        return;
    }
    for (int64_t i = 0; i < n; i++) h[i] = pi_act1(act, g[i]) * u[i];
}

/* GELU at half precision, the way llama.cpp's CPU backend evaluates it in the
 * forward pass: x rounded to F16, and gelu of each of the 65536 F16 values
 * rounded to F16 (a table built once); x <= -10 gives 0 and x >= 10 gives x. The
 * table holds the tanh formula of pi_act1, so only the two F16 roundings differ
 * from it (relative 2^-11 at most). */
static float g_gelu16[1 << 16];
static pthread_once_t g_gelu16_once = PTHREAD_ONCE_INIT;

static void gelu16_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++)
        g_gelu16[i] = pi_fp16_to_fp32(pi_fp32_to_fp16(pi_act1(PI_ACT_GELU, pi_fp16_to_fp32((uint16_t)i))));
}

void pi_gelu16_mul(const float *g, const float *u, float *h, int64_t n) {
    pthread_once(&g_gelu16_once, gelu16_init);
    pi_isa_current()->gelu16_mul(g_gelu16, g, u, h, n); /* isa/ffn_act.h */
}

void pi_ffn_act_mul(int32_t act, const float *g, const float *u, float *h, int64_t n) {
    if (act == PI_ACT_GELU)
        pi_gelu16_mul(g, u, h, n);
    else
        pi_act_mul(act, g, u, h, n);
}

int pi_op_act(int32_t act, const float *x, float *y, int64_t n) {
    if (x == NULL || y == NULL) return pi_set_error(PI_ERR_INVALID, "pi_op_act: NULL argument");
    if (act != PI_ACT_SILU && act != PI_ACT_GELU && act != PI_ACT_RELU)
        return pi_set_error(PI_ERR_INVALID, "pi_op_act: unknown activation %d", act);
    if (act == PI_ACT_SILU)
        pi_isa_current()->silu_mul(x, NULL, y, n); /* the vector loop, as the FFN runs it */
    else
        for (int64_t i = 0; i < n; i++) y[i] = pi_act1(act, x[i]);
    return PI_OK;
}

int pi_op_softmax(float *x, int64_t n) {
    if (x == NULL || n < 1) return pi_set_error(PI_ERR_INVALID, "pi_op_softmax: bad arguments");
    pi_isa_current()->softmax(x, n); /* llama.cpp's exp for this CPU (isa/softmax.h) */
    return PI_OK;
}
