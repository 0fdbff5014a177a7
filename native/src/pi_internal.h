/* Internal declarations shared by the native sources (not part of the API). */
#ifndef PI_INTERNAL_H
#define PI_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "powerinfer.h"

#define PI_QK 32 /* elements per block of every quantized type */

/* GGUF block layouts (ggml_fp16_t stored as uint16_t) */
typedef struct { uint16_t d; uint8_t qs[PI_QK / 2]; } pi_block_q4_0;            /* 18 bytes */
typedef struct { uint16_t d; uint16_t m; uint8_t qs[PI_QK / 2]; } pi_block_q4_1; /* 20 bytes */
typedef struct { uint16_t d; int8_t qs[PI_QK]; } pi_block_q8_0;                  /* 34 bytes */
typedef struct { uint16_t d; uint16_t s; int8_t qs[PI_QK]; } pi_block_q8_1;      /* 36 bytes: s = d * sum(qs) */
typedef struct { uint16_t d; uint8_t qh[4]; uint8_t qs[PI_QK / 2]; } pi_block_q5_0; /* 22 bytes: bit 4 of element j in qh bit j */

/* K-quants: super-blocks of 256 in sub-blocks of 32 (Q4_K, Q5_K: 6-bit scale and
 * min per sub-block, packed in 12 bytes) or of 16 (Q6_K: int8 scale). Element
 * order inside a super-block: for Q4_K / Q5_K, chunk g of 64 elements takes the low
 * nibbles of qs[32g..32g+31] then their high nibbles; see pi_dequantize_row. */
#define PI_QK_K 256
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; } pi_block_q4_K;            /* 144 bytes */
typedef struct { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; } pi_block_q5_K; /* 176 */
typedef struct { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; } pi_block_q6_K;    /* 210 */
/* the K-quants' activation block: float scale, and sums of each 16 quants */
typedef struct { float d; int8_t qs[PI_QK_K]; int16_t bsums[PI_QK_K / 16]; } pi_block_q8_K;           /* 292 */

/* 6-bit scale and min of sub-block j (0..7) from a Q4_K / Q5_K scales[12]: bytes
 * 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; sub-blocks 4-7 keep their
 * low 4 bits in bytes 8-11 (scale low nibble, min high nibble) and their top 2 bits
 * in the spare top bits of bytes 0-3 (scales) and 4-7 (mins). */
static inline void pi_k4_scale_min(const uint8_t *q, int j, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---- errors (errors.c) ---- */
int pi_set_error(int code, const char *fmt, ...);

/* ---- type traits (ops/types.c) ---- */
typedef struct {
    const char *name;
    int64_t block_size; /* elements per block */
    int64_t type_size;  /* bytes per block */
    int32_t vec_dot_type; /* activation type its dot product takes */
} pi_type_traits;

const pi_type_traits *pi_type_get(int32_t type); /* NULL for unsupported types */
/* 1 for types a weight may have (not the activation-only Q8_1 / Q8_K) */
int pi_type_is_weight(int32_t type);
/* bytes of a row of n elements; -1 when n is not a multiple of the block size */
int64_t pi_row_size(int32_t type, int64_t n);

/* ---- half precision conversions (portable, bit exact with ggml) ---- */
static inline float pi_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    float exp_scale;
    uint32_t u = 0x7800000u; /* 2^-112 */
    memcpy(&exp_scale, &u, 4);
    uint32_t nv = (two_w >> 4) + exp_offset;
    float normalized;
    memcpy(&normalized, &nv, 4);
    normalized *= exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    uint32_t dv = (two_w >> 17) | magic_mask;
    float denormalized;
    memcpy(&denormalized, &dv, 4);
    denormalized -= magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    uint32_t bits;
    float r = two_w < denormalized_cutoff ? denormalized : normalized;
    memcpy(&bits, &r, 4);
    bits |= sign;
    memcpy(&r, &bits, 4);
    return r;
}

static inline uint16_t pi_fp32_to_fp16(float f) {
    float scale_to_inf, scale_to_zero;
    uint32_t a = 0x77800000u, b = 0x08800000u;
    memcpy(&scale_to_inf, &a, 4);
    memcpy(&scale_to_zero, &b, 4);
    float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
    uint32_t w;
    memcpy(&w, &f, 4);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    uint32_t bv = (bias >> 1) + 0x07800000u;
    float bf;
    memcpy(&bf, &bv, 4);
    base = bf + base;
    uint32_t bits;
    memcpy(&bits, &base, 4);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float pi_bf16_to_fp32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t pi_fp32_to_bf16(float f) { /* round to nearest even, as ggml */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

/* ---- instruction-set kernels (isa/) ---- */

/* *s = dot(w, x) over n elements: w is a row of the weight type, x a row of that
 * type's vec_dot_type (see pi_type_traits). n is a multiple of the block size. */
typedef void (*pi_vec_dot_fn)(int64_t n, float *s, const void *w, const void *x);
/* Convert n floats to an activation row (Q8_0, Q8_1, F16, BF16 or F32). */
typedef void (*pi_from_float_fn)(const float *x, void *y, int64_t n);

/* The sparse FFN's down accumulation over n_tiles whole tiles of PI_DOWN_TILE columns:
 * tile b of y += h[r] * tile b of rows[r] for r = 0 .. nr-1 in order, with a separate
 * multiply and add (the portable loop's bits). rows: down_t rows (F32, F16, Q8_0 or
 * Q4_0); next: the n_next rows of the following call, prefetched as these are read. */
typedef void (*pi_down_tiles_fn)(int32_t type, int64_t n_tiles, float *y, const char *const *rows, const float *h,
                                 int nr, const char *const *next, int n_next);
#define PI_DOWN_TILE 32 /* one Q8_0 / Q4_0 block */

/* The batched down accumulation over nk (<= PI_DOWN_BATCH_K) rows of a Q8_0 or Q4_0 down_t
 * (ops/sparse_down_batch.c): for t < n_tok, c < n_cols (a multiple of 32), r = 0 .. nk-1 in order,
 *   y[t * ldy + c] = y[t * ldy + c] + h[t * ldh + r] * w_r[c]
 * with a separate multiply and add, except that a zero h adds +0 (even to an infinite w); w_r:
 * the row at w + r * wrow (whole blocks from column 0). y must not hold -0: then an added +0
 * leaves it unchanged, and y has the bits of adding only the rows of nonzero h (pi_down_tiles_fn). */
typedef void (*pi_down_batch_fn)(int32_t type, int64_t n_cols, int64_t n_tok, int64_t nk, float *y, int64_t ldy,
                                 const char *w, int64_t wrow, const float *h, int64_t ldh);
#define PI_DOWN_BATCH_K 256

#define PI_TYPE_SLOTS 31 /* indexable by enum pi_type */

/* The activation of a batched product: n_tok rows of the weight type's vec_dot_type
 * (x, xrow bytes apart) and, beside them, what the tiled kernels would otherwise redo
 * for every weight row (pi_matmul_multi fills it once per call). Entry [i * ld + t] is
 * block i of token t, so the 8 tokens of a tile are adjacent (ld >= n_tok + 7: eight
 * floats load from any token; entries past n_tok are zero). */
typedef struct {
    const char *x;
    int64_t xrow;
    int64_t ld;
    const float *d;     /* each block's d as float (Q8_0, Q8_1, Q8_K) */
    const float *s;     /* Q8_1: each block's s as float */
    const void *aux; /* Q8_0: 8 int32 per entry, -8 * (y[4k] + ... + y[4k+3]) (Q4_0's offset term,
                        negated: the accumulator of vpdpbusd; only when a Q4_0 / Q5_0 weight
                        shares the call); Q8_K: 8 int16 per entry, the 32-element chunk sums
                        bsums[2j] + bsums[2j + 1] */
    const int32_t *ysum; /* Q8_0 with a row-group weight (pi_matmul_groups_fn): y[0] + ... + y[31] per
                            entry (the offset terms: x -8 Q4_0, x -16 Q5_0, x -128 Q8_0 as unsigned) */
} pi_tile_act;

/* The batched product of a weight type (prefill): y[t * ldy + r] = dot(w row r, x row t)
 * for r < n_rows, t < n_tok, weight rows wrow bytes apart; every y value has
 * the bits of vec_dot on that row and token, so batch and decode agree. Rows are any
 * range (callers split them). */
typedef void (*pi_matmul_tiles_fn)(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy,
                                   const void *w, int64_t wrow, const pi_tile_act *a);

/* The single-token product (decode): y[r] = dot(w row r, x) for r < n_rows, weight rows
 * wrow bytes apart, x one row of the weight type's vec_dot_type; every y value has the bits
 * of vec_dot on that row. Rows are any range (callers split them). */
typedef void (*pi_matvec_fn)(int64_t n, int64_t n_rows, float *y, const void *w, int64_t wrow, const void *x);

/* Row groups: weights laid out again at load (ops/repack.c) so that one vector holds the
 * same block of PI_GROUP_ROWS rows, a row per 32-bit lane. Products then sum each row's
 * block to one exact integer and accumulate it with one scalar fused multiply-add per
 * block, 16 rows to a vector: per row and token, acc = fmaf((float)isum_i, d_w,i * d_x,i, acc)
 * over the blocks i in order, y = acc. Every ISA path (scalar included) does exactly
 * this, for one token or many, so decode and batches give the same bits.
 * Q4_0: per block of the group, the 16 rows' F16 d, then for each 4-byte chunk c of the
 * 16 quant bytes, that chunk of rows 0..15 (byte j of a chunk: element 4c + j in its low
 * nibble, 4c + j + 16 in its high one); isum = sum(q * y) - 8 * sum(y). */
#define PI_GROUP_ROWS 16
typedef struct { uint16_t d[PI_GROUP_ROWS]; uint8_t qs[4][PI_GROUP_ROWS][4]; } pi_block_q4_0x16; /* 288 bytes */
/* Q5_0: as Q4_0, with each quant's fifth bit as a bit mask per chunk, one bit per quant byte
 * of the chunk's 64-byte vector (bit 4r + j: row r, byte j): hb[c][0] for the low nibbles'
 * elements, hb[c][1] for the high ones'; isum = sum(q * y) - 16 * sum(y). */
typedef struct {
    uint16_t d[PI_GROUP_ROWS];
    uint64_t hb[4][2];
    uint8_t qs[4][PI_GROUP_ROWS][4];
} pi_block_q5_0x16; /* 352 bytes */
/* Q8_0: the 16 rows' d, then each 4-byte chunk c of the 32 quants for rows 0..15 (as in the file, signed) */
typedef struct { uint16_t d[PI_GROUP_ROWS]; int8_t qs[8][PI_GROUP_ROWS][4]; } pi_block_q8_0x16; /* 544 bytes */
/* Q4_K: per super-block of the group's rows, their d, their dmin, word k (scales bytes
 * 4k..4k+3) of each row's 12 scale bytes, then each 4-byte chunk c of the 128 quant bytes
 * for rows 0..15 (chunk c: elements 64(c / 8) + 4(c % 8) + 0..3 of sub-block 2(c / 8) in
 * the low nibbles, 32 further of sub-block 2(c / 8) + 1 in the high ones). Per row
 * isum = sum_j sc_j * (q . y over sub-block j), imin = sum_j m_j * (y's sub-block sum j),
 * both exact; acc = fmaf(-imin, dmin_w * d_x, acc), then acc = fmaf(isum, d_w * d_x, acc). */
typedef struct {
    uint16_t d[PI_GROUP_ROWS], dmin[PI_GROUP_ROWS];
    uint32_t scales[3][PI_GROUP_ROWS];
    uint8_t qs[32][PI_GROUP_ROWS][4];
} pi_block_q4_Kx16; /* 2304 bytes: 16 x 144 */
/* Q5_K: as Q4_K, with the rows' qh chunks (bit j of byte l of a row's qh: the fifth bit of
 * element l of sub-block j) before the quant chunks; chunk c of qh serves elements 4c..4c+3
 * of every sub-block. */
typedef struct {
    uint16_t d[PI_GROUP_ROWS], dmin[PI_GROUP_ROWS];
    uint32_t scales[3][PI_GROUP_ROWS];
    uint8_t qh[8][PI_GROUP_ROWS][4];
    uint8_t qs[32][PI_GROUP_ROWS][4];
} pi_block_q5_Kx16; /* 2816 bytes: 16 x 176 */
/* Q6_K: per super-block of the group's rows, their d, then each row's 16 scales by sub-block
 * (scales[j][r]), then per sub-block j of 16 elements, in reading order: two 64-byte vectors
 * of low nibbles (ql[h][r][k]: low nibble = bits 0-3 of element 16j + 8h + k of row r, high
 * nibble = of element 16j + 8h + 4 + k) and one of high bits (qh[r][k]: bits 2c, 2c + 1 = bits
 * 4-5 of element 16j + 4c + k); the 6-bit values u = q + 32 as stored. Per row
 * isum = sum_j sc_j * (sum of u * y over sub-block j - 32 * y's sub-block sum j), exact;
 * acc = fmaf(isum, d_w * d_x, acc). */
typedef struct {
    uint16_t d[PI_GROUP_ROWS];
    int8_t scales[16][PI_GROUP_ROWS];
    struct {
        uint8_t ql[2][PI_GROUP_ROWS][4];
        uint8_t qh[PI_GROUP_ROWS][4];
    } sub[16];
} pi_block_q6_Kx16; /* 3360 bytes: 16 x 210 */
/* a group block is exactly the type's 16 blocks (row sizes, offsets and the repack rely on it) */
_Static_assert(sizeof(pi_block_q4_0x16) == PI_GROUP_ROWS * sizeof(pi_block_q4_0), "Q4_0 group");
_Static_assert(sizeof(pi_block_q5_0x16) == PI_GROUP_ROWS * sizeof(pi_block_q5_0), "Q5_0 group");
_Static_assert(sizeof(pi_block_q8_0x16) == PI_GROUP_ROWS * sizeof(pi_block_q8_0), "Q8_0 group");
_Static_assert(sizeof(pi_block_q4_Kx16) == PI_GROUP_ROWS * sizeof(pi_block_q4_K), "Q4_K group");
_Static_assert(sizeof(pi_block_q5_Kx16) == PI_GROUP_ROWS * sizeof(pi_block_q5_K), "Q5_K group");
_Static_assert(sizeof(pi_block_q6_Kx16) == PI_GROUP_ROWS * sizeof(pi_block_q6_K), "Q6_K group");

/* The product over row groups: y[t * ldy + r] for r < n_rows (a multiple of PI_GROUP_ROWS),
 * t < n_tok (one or more), w the first group; a as for the tiles, with `off` (and `d`)
 * filled for every call, one token included. */
typedef void (*pi_matmul_groups_fn)(int64_t n, int64_t n_rows, int64_t n_tok, float *y, int64_t ldy,
                                    const void *w, const pi_tile_act *a);

typedef struct pi_isa {
    const char *name;
    pi_vec_dot_fn vec_dot[PI_TYPE_SLOTS];      /* indexed by weight type */
    pi_vec_dot_fn dot_f16_f32; /* an F16 row . floats that hold F16 values exactly: vec_dot[F16]'s bits */
    void (*f16_floats)(const void *h, float *f, int64_t n); /* the floats of n F16 values (exact) */
    pi_matvec_fn matvec[PI_TYPE_SLOTS];        /* by weight type; NULL: vec_dot per row */
    pi_from_float_fn from_float[PI_TYPE_SLOTS]; /* indexed by activation type */
    pi_matmul_tiles_fn matmul_tiles[PI_TYPE_SLOTS]; /* by weight type; NULL: vec_dot per row */
    pi_matmul_groups_fn matmul_groups[PI_TYPE_SLOTS]; /* by the base weight type of a row-group layout */
    void (*softmax)(float *x, int64_t n);      /* in place, llama.cpp's exp and sum order (isa/softmax.h) */
    void (*silu_mul)(const float *g, const float *u, float *h, int64_t n); /* silu(g) * u, u NULL: silu(g) (isa/ffn_act.h) */
    void (*gelu16_mul)(const float *tab, const float *g, const float *u, float *h, int64_t n); /* GELU by F16 table */
    pi_down_tiles_fn down_tiles;                /* NULL: the portable loop (ops/sparse_ffn.c) */
    pi_down_batch_fn down_batch;                /* NULL: the per-token down accumulation */
} pi_isa;

/* F16 dot order: the float operations of llama.cpp's ggml_vec_dot_f16 on the CPU
 * llama.cpp would run here (its GGML_F16_STEP / GGML_F16_EPR: 32 / 8 with AVX2,
 * 64 / 16 with AVX512F). Every ISA path has one table per order (isa/select.c picks
 * one); the tables differ only in vec_dot[PI_TYPE_F16], softmax and silu_mul (the exp and
 * lane order of llama.cpp's softmax and SwiGLU in the same build). */
enum { PI_F16_ORDER_AVX2, PI_F16_ORDER_AVX512, PI_F16_ORDERS };

extern const pi_isa pi_isa_scalar[PI_F16_ORDERS];
extern const pi_isa pi_isa_avx2[PI_F16_ORDERS];   /* AVX2 + FMA + F16C */
extern const pi_isa pi_isa_avx512[PI_F16_ORDERS];      /* AVX-512 F/BW/VL/DQ */
extern const pi_isa pi_isa_avx512_vnni[PI_F16_ORDERS]; /* the same with AVX512-VNNI (avx512_vnni.c) */
void pi_down_tiles_avx2(int32_t type, int64_t n_tiles, float *y, const char *const *rows, const float *h, int nr,
                        const char *const *next, int n_next); /* isa/avx2_sparse.c, for both x86 tables */
void pi_down_batch_avx2(int32_t type, int64_t n_cols, int64_t n_tok, int64_t nk, float *y, int64_t ldy,
                        const char *w, int64_t wrow, const float *h, int64_t ldh);

const pi_isa *pi_isa_current(void);

/* Q8_K activation quantizer of the scalar path (ops/convert.c; the x86 paths' twin gives its bytes) */
void pi_quantize_row_q8_K(const float *x, void *y, int64_t n);

/* ---- thread pool (threads.c) ---- */
typedef void (*pi_task_fn)(void *arg, int ith, int nth);
/* Run fn(arg, ith, nth) for every chunk ith in [0, nth) on the pool (nth: more chunks than
 * threads, taken in any order by any thread); returns when all are done. A chunk's output
 * must depend only on ith and nth, never on the thread running it. */
void pi_pool_run(pi_pool *pool, pi_task_fn fn, void *arg);
int pi_pool_size(const pi_pool *pool);
/* The running thread's index in its pool, in [0, pi_pool_size): per-thread scratch only */
int pi_pool_worker(void);
int pi_pool_test_stall(pi_pool *pool, int32_t worker, int32_t ms);
int32_t pi_pool_test_counts(const pi_pool *pool, int64_t *total, int64_t *stalled_job, int32_t cap);

/* Software prefetch of n bytes (gathered rows start on arbitrary pages, where the
 * hardware stream prefetchers have no history yet). */
static inline void pi_prefetch_bytes(const char *p, int64_t n) {
    for (int64_t o = 0; o < n; o += 64) __builtin_prefetch(p + o, 0, 3);
}

/* n rounded up to a multiple of a (a > 0): scratch and device buffer sizes */
static inline int64_t pi_align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

/* split [0, n) into nth contiguous parts of sizes differing by at most one (none empty
 * while n >= nth); part ith is [*lo, *hi) */
static inline void pi_split(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    *lo = n * ith / nth;
    *hi = n * (ith + 1) / nth;
}

/* ---- ops used by the forward pass (ops/) ---- */

/* A weight matrix: n_rows rows of n_cols elements of `type`; grouped: in row groups
 * (PI_GROUP_ROWS rows interleaved, see pi_block_q4_0x16), read by pi_matmul_multi only. */
typedef struct {
    const void *data;
    int32_t type;
    int64_t n_cols;
    int64_t n_rows;
    int32_t grouped;
} pi_mat;

/* One product of a pi_matmul_multi job: y[t * ldy + r] = dot(w row r, x[t]). */
typedef struct {
    const pi_mat *w;
    float *y;
    int64_t ldy;
} pi_matmul_out;

/* Bytes pi_matmul_multi needs in `scratch` for n_tok rows of n_cols inputs */
int64_t pi_matmul_scratch_size(int32_t type, int64_t n_cols, int64_t n_tok);
/* The part of pi_matmul_scratch_size that does not grow with n_tok: sizes for any n_tok
 * are n_tok * (size(1) - fixed) + fixed */
int64_t pi_matmul_scratch_fixed(int32_t type, int64_t n_cols);
/* Several products sharing one input (e.g. Q/K/V, gate/up) in one pool job: the
 * input is converted once to the weights' activation type (all weights must share
 * n_cols and activation type), then the rows of all outputs are split across threads. */
void pi_matmul_multi(pi_pool *pool, const pi_matmul_out *outs, int n_outs, const float *x,
                     int64_t n_tok, void *scratch);
/* Weight matrices read by this thread's batched products (pi_matmul_multi adds n_outs per
 * call; the sparse FFN adds its own): pi_eval's delta is pi_context_matmul_calls. */
extern _Thread_local int64_t pi_weight_passes;

/* Dequantize one row of n elements of `type` to floats (embedding lookup). */
void pi_dequantize_row(int32_t type, const void *src, float *dst, int64_t n);

void pi_rmsnorm_rows(const float *x, const float *w, int64_t n, int64_t n_rows, float eps, float *y);
/* LayerNorm rows (see pi_op_layernorm); w, b may be NULL; y may be x */
void pi_layernorm_rows(const float *x, const float *w, const float *b, int64_t n, int64_t n_rows, float eps,
                       float *y);
/* cos/sin of every rotated pair for n_tok positions: n_tok rows of n_rot floats */
void pi_rope_cache(int64_t n_tok, int32_t n_rot, const int32_t *pos, float freq_base, float freq_scale,
                   const float *freq_factors, float *cs);
/* rotate n_tok rows of n_head heads in place with a pi_rope_cache table */
void pi_rope_apply(float *x, int64_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot, const float *cs,
                   int32_t rope_type);
/* h[i] = act(g[i]) * u[i]; u NULL: h[i] = act(g[i]) (ungated FFN) */
void pi_act_mul(int32_t act, const float *g, const float *u, float *h, int64_t n);
/* What an FFN observer sees of a dense FFN layer, once per layer and batch, between the
 * activation and the down product (the context's ffn_observer; calibration). */
typedef struct {
    pi_pool *pool;
    int32_t layer;
    int32_t act;      /* the model's activation (enum pi_act) */
    int32_t on_gate;  /* the thresholds' target (enum pi_ffn_threshold_on) */
    int64_t n_tok, n_ff;
    const float *pre; /* n_tok rows of n_ff: gate x (ungated: up x + b), before the activation */
    const float *h;   /* the rows the down product reads: act(pre) * up x (ungated: act(pre)) */
} pi_ffn_obs;
typedef void (*pi_ffn_observer)(void *user, const pi_ffn_obs *o);
/* The histogram arrays pi_context_set_ffn_hist(2) registers: `follow` records the
 * threshold target's quantity; `product` and `gate` record theirs always */
typedef struct {
    uint32_t *follow, *product, *gate;
} pi_ffn_hists;
/* ops/ffn_hist.c: pi_context_set_ffn_hist's observer; user is a pi_ffn_hists */
void pi_ffn_hist_observe(void *user, const pi_ffn_obs *o);
float pi_act1(int32_t act, float x);
/* h[i] = gelu(g[i]) * u[i] with GELU evaluated at half precision (as llama.cpp's
 * forward pass; see act.c); u NULL: h[i] = gelu(g[i]) */
void pi_gelu16_mul(const float *g, const float *u, float *h, int64_t n);
/* The FFN's h = act(g) * u (u NULL: ungated) wherever it is computed (dense, sparse rows, a
 * device split's hot rows), so every path rounds it alike: GELU by pi_gelu16_mul (llama.cpp's
 * CPU forward pass), the others by pi_act_mul */
void pi_ffn_act_mul(int32_t act, const float *g, const float *u, float *h, int64_t n);

/* The KV cache has a multiple of PI_KV_PAD cells, so V dot products can run over whole
 * blocks (unused cells are zero or stale but finite, and get zero weight). */
#define PI_KV_PAD 64

/* Attention (see pi_op_attention) with caller-provided scratch of
 * pool size * pi_attention_scratch_floats(n_kv, head_dim) floats (n_kv > every pos[t]).
 * Scores are multiplied by `scale`; n_swa > 0 limits query t to keys at positions
 * > pos[t] - n_swa (sliding window), 0 = all earlier positions. cell0 (NULL = all 0):
 * per query, the cache cell of its sequence's position 0 (a slot of pi_eval_seqs). */
int64_t pi_attention_scratch_floats(int64_t n_kv, int32_t head_dim);
void pi_attention(pi_pool *pool, const float *q, int64_t n_tok, int32_t n_head, int32_t n_head_kv,
                  int32_t head_dim, const void *k, const void *v, int64_t v_ld, int32_t kv_type,
                  int64_t n_kv, const int32_t *pos, const int32_t *cell0, float scale, int32_t n_swa, float *out,
                  float *scratch);

/* ---- sparse FFN (ops/sparse_ffn.c; see pi_op_ffn_sparse) ---- */
typedef struct {
    int32_t act;          /* enum pi_ffn_act */
    const pi_mat *gate;   /* n_ff rows of n_embd; unused (may be NULL) for the ungated forms */
    const pi_mat *up;     /* same type and shape as gate */
    const pi_mat *down_t; /* n_ff rows of n_embd: F32, F16, Q8_0 or Q4_0 */
    const float *x;       /* n_tok rows of n_embd */
    int64_t n_tok;
    const int32_t *active;     /* NULL = all neurons */
    const int64_t *active_off; /* n_tok + 1 offsets into active */
    float threshold;
    float *y;        /* n_tok rows of n_embd */
    int64_t *n_used; /* optional, n_tok counts */
    int32_t on_gate; /* threshold |act(gate x)| before reading up (CATS) instead of |h| */
    float *h;        /* optional: h already computed (n_tok rows of n_ff, all neurons, active == NULL,
                        on_gate == 0); gate/up are not read and the rows are overwritten */
    const float *up_bias; /* ungated forms only: n_ff floats added to up.x (NULL = none) */
    int32_t phase;   /* 0: everything; 1: h and the kept rows only (held in scratch); 2: the down
                        accumulation of a phase-1 call's kept rows onto y as it is (not zeroed) */
    float *h_dense;  /* optional: also the kept h as n_tok rows of n_ff, 0 for every other neuron
                        (for a dense down product over the GGUF ffn_down instead of down_t rows) */
} pi_ffn_sparse_args;

/* Bytes of scratch pi_ffn_sparse needs (upper bound, independent of the active sets) */
int64_t pi_ffn_sparse_scratch_size(int32_t gate_up_type, int64_t n_embd, int64_t n_ff, int64_t n_tok);
/* The operator on validated arguments (ids sorted, unique, in range); no allocation. */
void pi_ffn_sparse(pi_pool *pool, const pi_ffn_sparse_args *a, void *scratch);
/* The batched down accumulation (ops/sparse_down_batch.c): when it applies to a (phase 0, n_tok >= 2,
 * Q8_0 / Q4_0 down_t, the ISA has a kernel) and pays at this density, writes y and n_used from h
 * (the values at off[t] .. off[t+1], overwritten by n_tok dense rows of n_ff, skipped neurons +0)
 * and returns 1; otherwise returns 0 and touches nothing. */
int pi_sparse_down_batch(pi_pool *pool, const pi_ffn_sparse_args *a, const pi_isa *isa, float *h,
                         const int64_t *off, float thr);

/* ---- activation predictors (ops/predictor.c; see pi_op_predictor_scores) ---- */
int64_t pi_now_ns(void); /* CLOCK_MONOTONIC */
/* Bytes of scratch pi_predictor_scores needs */
int64_t pi_predictor_scratch_size(const pi_mat *fc1, const pi_mat *fc2, int64_t n_tok);
/* scores (n_tok rows of fc2->n_rows) = fc2 . relu(fc1 . x); validated arguments */
void pi_predictor_scores(pi_pool *pool, const pi_mat *fc1, const pi_mat *fc2, const float *x, int64_t n_tok,
                         float *scores, void *scratch);
/* per token, the ids among `among` (n_among increasing ids; NULL: every id < n_ff) with
 * score >= threshold, increasing, CSR into active / active_off; returns how many of all n_ff
 * neurons pass over the tokens (the predicted count, also where the lists cover a subset) */
int64_t pi_predictor_select(const float *scores, int64_t n_tok, int64_t n_ff, float threshold, const int32_t *among,
                            int64_t n_among, int32_t *active, int64_t *active_off);

#endif /* PI_INTERNAL_H */
