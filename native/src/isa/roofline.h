/* Inner loops of the roofline microbenchmarks (roofline.c): one function per ISA for
 * each. They compute nothing useful; the returned word only keeps the loads and the
 * multiply-adds from being optimised away. */
#ifndef PI_ISA_ROOFLINE_H
#define PI_ISA_ROOFLINE_H

#include <stdint.h>

/* XOR of every 8-byte word of p[0, n): n a multiple of 256, p 32-byte aligned */
uint64_t pi_rl_read_avx2(const char *p, int64_t n);
uint64_t pi_rl_read_scalar(const char *p, int64_t n);

/* `iters` rounds of PI_RL_CHAINS independent int8 multiply-add chains in registers;
 * each round is PI_RL_MACS_PER_ROUND int8 multiply-adds */
#define PI_RL_CHAINS 8
#define PI_RL_MACS_PER_ROUND (PI_RL_CHAINS * 32)
uint64_t pi_rl_int8_avx2(int64_t iters);
uint64_t pi_rl_int8_scalar(int64_t iters);

#endif
