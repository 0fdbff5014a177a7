/* avx512.c again, compiled with AVX512-VNNI: its quantized products (vec_dot, the tiles
 * of x86_tiles.h, the single-token kernels of x86_gemv.h / x86_gemv32.h) take vpdpbusd
 * where the other build takes maddubs + madd, and vpdpwssd for the K-quants' madd + add.
 * The same exact int32 lanes, so the same floats: the table pi_isa_avx512_vnni differs
 * from pi_isa_avx512 in speed alone. */
#define PI_ISA_AVX512_VNNI 1
#include "avx512.c"
