/* The CPU's spin-wait hint, here so that every intrinsic lives under isa/ (threads.c spins). */
#ifndef PI_ISA_RELAX_H
#define PI_ISA_RELAX_H

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void pi_cpu_relax(void) { _mm_pause(); }
#else
static inline void pi_cpu_relax(void) {}
#endif

#endif
