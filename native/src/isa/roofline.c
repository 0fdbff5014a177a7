/* The roofline microbenchmarks' inner loops (declared in roofline.h): an AVX2 path, built
 * for its target with a function attribute, and a portable one for CPUs without AVX2. */
#include <string.h>

#include "roofline.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

__attribute__((target("avx2"))) uint64_t pi_rl_read_avx2(const char *p, int64_t n) {
    /* eight independent 256-bit loads per 256 bytes: enough in flight to saturate the
     * memory system, one cheap XOR each to consume them */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t i = 0; i < n; i += 256) {
        const __m256i *q = (const __m256i *)(p + i);
        a0 = _mm256_xor_si256(a0, _mm256_load_si256(q + 0));
        a1 = _mm256_xor_si256(a1, _mm256_load_si256(q + 1));
        a2 = _mm256_xor_si256(a2, _mm256_load_si256(q + 2));
        a3 = _mm256_xor_si256(a3, _mm256_load_si256(q + 3));
        a4 = _mm256_xor_si256(a4, _mm256_load_si256(q + 4));
        a5 = _mm256_xor_si256(a5, _mm256_load_si256(q + 5));
        a6 = _mm256_xor_si256(a6, _mm256_load_si256(q + 6));
        a7 = _mm256_xor_si256(a7, _mm256_load_si256(q + 7));
    }
    __m256i a = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)),
                                 _mm256_xor_si256(_mm256_xor_si256(a4, a5), _mm256_xor_si256(a6, a7)));
    uint64_t w[4];
    _mm256_storeu_si256((__m256i *)w, a);
    return w[0] ^ w[1] ^ w[2] ^ w[3];
}

#endif

uint64_t pi_rl_read_scalar(const char *p, int64_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (int64_t i = 0; i < n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, sizeof w);
        a0 ^= w[0], a1 ^= w[1], a2 ^= w[2], a3 ^= w[3];
    }
    return a0 ^ a1 ^ a2 ^ a3;
}

#if defined(__x86_64__) || defined(__i386__)
/* The sequence of the AVX2 quantized dot products (u8 x s8 pairs summed to s16, pairs of
 * those to s32 against ones, accumulated): PI_RL_CHAINS chains so that latency never limits
 * the multiply ports. The empty asm makes `a` opaque each round, so the compiler cannot hoist
 * the (otherwise loop-invariant) products out of the loop. */
__attribute__((target("avx2"))) uint64_t pi_rl_int8_avx2(int64_t iters) {
    __m256i a = _mm256_set1_epi8(3);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i b[PI_RL_CHAINS], acc[PI_RL_CHAINS];
    for (int k = 0; k < PI_RL_CHAINS; k++) {
        b[k] = _mm256_set1_epi8((char)(2 * k - 7)); /* nonzero: a zero operand would fold away */
        acc[k] = _mm256_setzero_si256();
    }
    for (int64_t i = 0; i < iters; i++) {
        __asm__("" : "+x"(a));
        for (int k = 0; k < PI_RL_CHAINS; k++)
            acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b[k]), ones));
    }
    __m256i s = acc[0];
    for (int k = 1; k < PI_RL_CHAINS; k++) s = _mm256_add_epi32(s, acc[k]);
    uint64_t w[4];
    _mm256_storeu_si256((__m256i *)w, s);
    return w[0] ^ w[1] ^ w[2] ^ w[3];
}

#else
uint64_t pi_rl_read_avx2(const char *p, int64_t n) { return pi_rl_read_scalar(p, n); }
uint64_t pi_rl_int8_avx2(int64_t iters) { return pi_rl_int8_scalar(iters); }
#endif

uint64_t pi_rl_int8_scalar(int64_t iters) {
    int32_t acc[PI_RL_CHAINS] = {0};
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < PI_RL_CHAINS; k++)
            for (int j = 0; j < 32; j++) {
                int32_t a = 3;
                __asm__("" : "+r"(a)); /* opaque: no folding of the products into one */
                acc[k] += a * (int8_t)(k - j);
            }
    uint64_t s = 0;
    for (int k = 0; k < PI_RL_CHAINS; k++) s ^= (uint32_t)acc[k];
    return s;
}
