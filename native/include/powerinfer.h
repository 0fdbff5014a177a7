/*
 * powerinfer.h - the whole C API of the powerinfer_backend native library.
 *
 * cffi reads this file (preprocessor lines are dropped before cdef), so keep it
 * to plain typedefs, enums and prototypes.
 *
 * Conventions
 *  - Every function that can fail returns an int status (PI_OK == 0) and leaves a
 *    message for pi_last_error() (thread-local). Nothing reachable from the API
 *    aborts, asserts or reads out of bounds on bad arguments.
 *  - Tensor shapes follow GGUF/ggml: ne[0] is the contiguous row length, ne[1] the
 *    number of rows. A weight of ne = {n_in, n_out} maps n_in -> n_out.
 *  - Type ids are ggml's (GGMLQuantizationType in the gguf package).
 */
#ifndef POWERINFER_H
#define POWERINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pi_status {
    PI_OK = 0,
    PI_ERR_INVALID = 1,     /* bad argument (shape, type, range, NULL) */
    PI_ERR_NOMEM = 2,       /* allocation failed */
    PI_ERR_UNSUPPORTED = 3, /* valid but not implemented (type, ISA) */
    PI_ERR_CONTEXT_FULL = 4 /* positions past n_ctx, or batch past n_batch */
};

/* ggml tensor type ids; these are the ones the kernels accept */
enum pi_type {
    PI_TYPE_F32 = 0,
    PI_TYPE_F16 = 1,
    PI_TYPE_Q4_0 = 2,
    PI_TYPE_Q4_1 = 3,
    PI_TYPE_Q5_0 = 6,
    PI_TYPE_Q8_0 = 8,
    PI_TYPE_Q8_1 = 9, /* activations only */
    PI_TYPE_Q4_K = 12,
    PI_TYPE_Q5_K = 13,
    PI_TYPE_Q6_K = 14,
    PI_TYPE_Q8_K = 15, /* activations only (of the K-quants) */
    PI_TYPE_BF16 = 30
};

/* NONE: no rotary embedding (OPT: learned absolute positions, pi_model_params.pos_embd) */
enum pi_rope_type { PI_ROPE_NONE = -1, PI_ROPE_NORM = 0, PI_ROPE_NEOX = 2 };

/* FFN activation h = f(gate x, up x): SiLU, GELU (tanh) and ReLU gate the up
 * product; DRELU is relu(gate x) * relu(up x) (dReLU). A layer without ffn_gate
 * (Falcon, OPT) is ungated: h = act(up x + up bias). */
enum pi_act { PI_ACT_SILU = 0, PI_ACT_GELU = 1, PI_ACT_RELU = 2, PI_ACT_DRELU = 3 };

/* A tensor handed to the library: a view of caller-owned (usually memory-mapped)
 * bytes. The library never writes to or frees `data`; it must outlive the model. */
typedef struct pi_tensor {
    const void *data; /* NULL = absent (optional tensors only) */
    int32_t type;     /* enum pi_type */
    int32_t n_dims;
    int64_t ne[4];    /* elements per dimension, ne[0] contiguous; unused dims = 1 */
    uint64_t nbytes;  /* bytes available at data (checked against type and ne) */
} pi_tensor;

/* Per-layer tensor slots, in the order of pi_model_params.layers */
enum pi_layer_slot {
    PI_L_ATTN_NORM = 0, /* F32 [n_embd] */
    PI_L_ATTN_Q = 1,    /* [n_embd, n_head*n_embd_head] */
    PI_L_ATTN_K = 2,    /* [n_embd, n_head_kv*n_embd_head] */
    PI_L_ATTN_V = 3,    /* [n_embd, n_head_kv*n_embd_head] */
    PI_L_ATTN_OUT = 4,  /* [n_head*n_embd_head, n_embd] */
    PI_L_FFN_NORM = 5,  /* F32 [n_embd] */
    PI_L_FFN_GATE = 6,  /* [n_embd, n_ff]; absent = ungated FFN (Falcon, OPT) */
    PI_L_FFN_UP = 7,    /* [n_embd, n_ff] */
    PI_L_FFN_DOWN = 8,  /* [n_ff, n_embd] */
    /* optional slots (data NULL = absent) */
    PI_L_ATTN_Q_NORM = 9,     /* F32 [n_embd_head]: RMSNorm of each query head (Gemma 3) */
    PI_L_ATTN_K_NORM = 10,    /* F32 [n_embd_head]: RMSNorm of each key head */
    PI_L_ATTN_POST_NORM = 11, /* F32 [n_embd]: RMSNorm of the attention output before the residual add */
    PI_L_FFN_POST_NORM = 12,  /* F32 [n_embd]: RMSNorm of the FFN output before the residual add */
    PI_L_ATTN_Q_BIAS = 13,    /* F32 [n_head*n_embd_head] (Qwen2) */
    PI_L_ATTN_K_BIAS = 14,    /* F32 [n_head_kv*n_embd_head] */
    PI_L_ATTN_V_BIAS = 15,    /* F32 [n_head_kv*n_embd_head] */
    PI_L_ATTN_NORM_B = 16,    /* F32 [n_embd]: LayerNorm bias (with pi_model_params.layer_norm) */
    PI_L_FFN_NORM_B = 17,     /* F32 [n_embd] */
    PI_L_ATTN_QKV = 18,       /* [n_embd, (n_head + 2*n_head_kv)*n_embd_head]: q, k and v rows fused, in
                               * that order (Falcon); attn_q/k/v are then absent */
    PI_L_ATTN_OUT_BIAS = 19,  /* F32 [n_embd] (OPT) */
    PI_L_FFN_UP_BIAS = 20,    /* F32 [n_ff] (OPT) */
    PI_L_FFN_DOWN_BIAS = 21,  /* F32 [n_embd] (OPT) */
    PI_L_COUNT = 22
};

typedef struct pi_model_params {
    int32_t n_vocab;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_ff;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t n_embd_head; /* head dimension */
    int32_t n_rot;       /* rotated dimensions per head (<= n_embd_head, even) */
    int32_t n_ctx_train;
    float rms_eps;
    float rope_freq_base;
    float rope_freq_scale; /* position multiplier (1 / linear scaling factor) */
    int32_t rope_type;     /* enum pi_rope_type */
    int32_t act;           /* enum pi_act, the FFN gate activation */
    pi_tensor tok_embd;    /* [n_embd, n_vocab] */
    pi_tensor output_norm; /* F32 [n_embd] */
    pi_tensor output;      /* [n_embd, n_vocab]; data NULL = use tok_embd */
    pi_tensor rope_freqs;  /* optional F32 [n_rot/2] frequency divisors (Llama 3.x) */
    const pi_tensor *layers; /* n_layer * PI_L_COUNT, slot order above */
    /* Architecture variations; all zero = the llama forward pass. */
    float embd_scale;      /* token embeddings multiplied by this (Gemma: sqrt(n_embd)); 0 = 1 */
    float attn_scale;      /* 0: scores scaled by 1/sqrt(n_embd_head); else q is multiplied by
                            * attn_scale before attention and the scores are not scaled (Gemma) */
    int32_t n_swa;         /* sliding window of the local layers: a query at position p sees
                            * keys at positions > p - n_swa; 0 = no local layers */
    int32_t swa_pattern;   /* with n_swa > 0: layer l is local when swa_pattern == 0 or
                            * l % swa_pattern < swa_pattern - 1 (Gemma 3: 6, five local then one global) */
    float rope_freq_base_swa;  /* RoPE of the local layers (Gemma 3: 10000) */
    float rope_freq_scale_swa;
    int32_t layer_norm;        /* 1: every norm is a LayerNorm (mean removed, then the optional bias
                                * slots added; Falcon, OPT) with eps rms_eps; 0: RMSNorm */
    int32_t parallel_residual; /* 1: x + attn(norm(x)) + ffn(ffn_norm(x)), both blocks reading the layer
                                * input (Falcon); 0: sequential */
    pi_tensor output_norm_b;   /* optional F32 [n_embd]: the final LayerNorm's bias */
    pi_tensor pos_embd;        /* optional [n_embd, n_pos]: learned absolute positions, row pos + pos_offset
                                * added to the token embedding (OPT); positions past n_pos are refused */
    int32_t pos_offset;        /* OPT: 2 (its position table starts two rows in) */
} pi_model_params;

typedef struct pi_model pi_model;
typedef struct pi_context pi_context;

typedef struct pi_context_params {
    int32_t n_ctx;     /* KV cache length in tokens, all sequences together */
    int32_t n_batch;   /* most tokens one pi_eval / pi_eval_seqs call may take */
    int32_t n_threads; /* compute threads, the calling thread included */
    int32_t kv_type;   /* PI_TYPE_F16 or PI_TYPE_F32 */
    int32_t n_seq_max; /* sequences (slots) the cache holds, in [1, PI_SEQ_MAX] (0 = 1); each gets
                        * n_ctx / n_seq_max cells (llama-server's convention) */
} pi_context_params;
enum { PI_SEQ_MAX = 256 };

/* Model: validates every tensor's type, shape and byte count; copies nothing
 * from the tensor data. */
int pi_model_create(const pi_model_params *params, pi_model **out);
void pi_model_free(pi_model *model);

/* Row groups: the model's own copy, in a layout of PI_GROUP_ROWS (16) interleaved rows,
 * of the matrices its dense products read (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K with a multiple of
 * 16 rows; llama.cpp's
 * repacked CPU buffers do the same), each product then reading one sequential stream
 * and finishing a block of 16 rows per vector. The float order changes with it (one
 * rounding per block and row: acc = fmaf(isum, d_w * d_x, acc)), the same on every ISA
 * path, in decode and in batches. layer_slots[l]: bit s set = repack slot s (enum
 * pi_layer_slot) of layer l (NULL: none); output: the output matrix too (tied: a copy of
 * token_embd, whose lookup keeps reading the file's rows). The sparse FFN, the predictors and a device
 * keep reading the tensors' own rows. Where [release_lo, release_hi) is given (a
 * read-only file mapping the tensors lie in; NULL, NULL: none), the pages of each
 * repacked tensor inside it are released after the copy (madvise DONTNEED: they reload
 * from the file if read again), so the process holds one copy. Repacking a model twice
 * changes nothing more. *bytes (may be NULL): bytes repacked by this call. */
int pi_model_repack(pi_model *model, const uint32_t *layer_slots, int32_t output, const void *release_lo,
                    const void *release_hi, int64_t *bytes);

int pi_context_create(pi_model *model, const pi_context_params *params, pi_context **out);
void pi_context_free(pi_context *ctx);

/* Evaluate n_tokens tokens at positions pos[] (pos[i] = pos[0] + i, and pos[0]
 * must not exceed the number of cached positions). Writes logits for every token
 * when logits_all > 0, for the last token only when logits_all == 0, and none
 * (only the KV cache is filled: a prompt chunk before the last) when logits_all < 0. */
int pi_eval(pi_context *ctx, const int32_t *tokens, const int32_t *pos, int32_t n_tokens,
            int32_t logits_all);
/* Logits of the last pi_eval: pi_n_outputs(ctx) rows of n_vocab floats. The
 * last-token buffer (logits_all == 0) never moves until pi_context_free (its content
 * changes with each pi_eval); the logits_all buffer may be reallocated by a later
 * pi_eval with more rows. */
const float *pi_get_logits(pi_context *ctx);
int32_t pi_n_outputs(const pi_context *ctx);
/* The fixed last-token logits buffer (n_vocab floats) that every pi_eval with
 * logits_all == 0 writes: callers may keep one view of it for the context's life. */
const float *pi_get_logits_buffer(pi_context *ctx);
/* Hidden state after the final norm, same rows as the logits: n_embd floats each. */
const float *pi_get_embeddings(pi_context *ctx);

/* Sparse FFN in the forward pass ("down-only" form; docs/sparsity.md): for layer
 * `layer`, gate and up stay dense, and the down projection runs over down_t (the
 * layer's ffn_down transposed: n_ff rows of n_embd elements, type F32, F16, Q8_0 or
 * Q4_0, see pi_op_transpose_to) skipping neurons whose |h| < threshold. down_t NULL
 * makes the layer dense again. down_t's bytes must outlive the context; the layer's
 * gate and up must share one type. An ungated layer (no ffn_gate: Falcon, OPT) runs
 * the PI_FFN_RELU_UP or PI_FFN_GELU_UP form (ReLU / GELU activation; SiLU is
 * PI_ERR_UNSUPPORTED). */
int pi_context_set_ffn_sparsity(pi_context *ctx, int32_t layer, const pi_tensor *down_t, float threshold);
/* Per layer (used and total each point to n_layer entries): neurons used in the
 * sparse down projection and neurons the layer has (n_ff per token), summed over
 * tokens since the context was created or the last reset (reset != 0 zeroes the
 * counters after reading them). Dense layers count nothing. */
int pi_context_ffn_stats(pi_context *ctx, int64_t *used, int64_t *total, int32_t reset);
/* Activation statistics for calibration: while hist is set, every dense FFN layer
 * adds each token's |h| (h = act(gate x) * up x, before the down projection) to
 * hist[(layer * n_ff + neuron) * PI_FFN_HIST_BINS + bin]. Bin 0: |h| < 2^MIN_EXP
 * (zeros included); bin k in [1, BINS-2]: with m = k-1, |h| in
 * [2^e * (1 + q/4), 2^e * (1 + (q+1)/4)), e = MIN_EXP + m/4, q = m%4 (four bins per
 * octave, cut on the float's exponent and top two mantissa bits); bin BINS-1:
 * everything larger. Counts are added, never cleared here; layers made
 * sparse with pi_context_set_ffn_sparsity record nothing. The caller owns hist
 * (n_layer * n_ff * PI_FFN_HIST_BINS uint32) and keeps it alive while set; NULL stops. */
enum { PI_FFN_HIST_BINS = 128, PI_FFN_HIST_MIN_EXP = -20 };
int pi_context_set_ffn_hist(pi_context *ctx, uint32_t *hist);
/* Both forms' histograms in one pass (calibration tries both): |h| into `product`
 * and |act(gate x)| (ungated: |act(up x + b)|) into `gate`, whatever the threshold
 * target; either may be NULL. Same layout and rules as pi_context_set_ffn_hist, which
 * this replaces (and which replaces this); both NULL stops. */
int pi_context_set_ffn_hist2(pi_context *ctx, uint32_t *product, uint32_t *gate);
/* What the sparse FFN thresholds compare against, for every layer of the context:
 * PI_FFN_ON_PRODUCT (default) |h| = |act(gate x) * up x| (down-only form, TEAL);
 * PI_FFN_ON_GATE |act(gate x)| (CATS): a neuron below it skips its up row as well
 * as its down row. Also selects what pi_context_set_ffn_hist records. */
enum pi_ffn_threshold_on { PI_FFN_ON_PRODUCT = 0, PI_FFN_ON_GATE = 1 };
int pi_context_set_ffn_threshold_on(pi_context *ctx, int32_t on);
/* on != 0: sparse layer `layer` (pi_context_set_ffn_sparsity) still skips the gate/up
 * work of its skipped neurons, but its down product is the dense one over the GGUF
 * ffn_down with those neurons' h set to 0 (instead of the kept rows of down_t): fewer
 * bytes when density x (down_t row) exceeds the ffn_down column (e.g. the gate form
 * at 60% density with a Q4_0 file and a Q8_0 down_t). A layer split with a device
 * (pi_context_set_ggml_device) computes its own way and ignores it. Default 0. */
int pi_context_set_ffn_down_dense(pi_context *ctx, int32_t layer, int32_t on);

/* Activation predictor of layer `layer` (docs/predictors.md): a bias-free low-rank
 * MLP, score = fc2 . relu(fc1 . x) with x the normed FFN input; fc1 has ne
 * [n_embd, rank] (rank rows of n_embd), fc2 ne [rank, n_ff]; any dense-matmul weight
 * type. Only neurons with score >= threshold are computed (gate, up and down rows);
 * the layer's product/gate threshold (pi_context_set_ffn_sparsity, which must be set
 * for the layer to be sparse at all) still applies to them. fc1 NULL removes the
 * predictor. Errors name the tensor, e.g. "blk.3.fc2.weight: shape ...". The bytes
 * must outlive the context. */
int pi_context_set_ffn_predictor(pi_context *ctx, int32_t layer, const pi_tensor *fc1, const pi_tensor *fc2,
                                 float threshold);
/* Per layer (each array n_layer entries, any may be NULL): neurons predicted active
 * (summed over tokens), nanoseconds spent in the predictor and in the whole sparse FFN
 * (predictor included) since creation or the last reset. */
int pi_context_predictor_stats(pi_context *ctx, int64_t *predicted, int64_t *pred_ns, int64_t *ffn_ns,
                               int32_t reset);

/* Predictor training data: while buf is set, every pi_eval copies each layer's normed
 * FFN input rows (the x the FFN and a predictor see) to buf[(layer * n_batch + t) *
 * n_embd ...] for its n_tokens tokens. The caller owns buf (n_layer * n_batch * n_embd
 * floats); NULL stops. */
int pi_context_set_ffn_capture(pi_context *ctx, float *buf);

/* Number of cached positions of sequence 0; positions [0, pi_kv_used) are valid. */
int32_t pi_kv_used(const pi_context *ctx);
/* Forget sequence 0's cached positions >= n_keep (n_keep = 0 clears it). */
int pi_kv_truncate(pi_context *ctx, int32_t n_keep);

/* Several sequences in one forward pass (docs/architecture.md, "Sequences"): item i
 * appends n_item_tokens[i] tokens to sequence seq[i] (a prompt chunk or one decode
 * token) at its positions pi_seq_used(seq[i]), ...; tokens holds the items' tokens one
 * item after the other. Every weight matrix is read once for all of them; each token
 * attends only to its own sequence's cells. Logits of each item's last token: row i of
 * pi_get_logits (pi_n_outputs == n_items); with logits_all > 0 of every token, in the
 * order of tokens (pi_n_outputs == their total). Each sequence at most once per call; the
 * total at most n_batch (PI_ERR_CONTEXT_FULL), a sequence's tokens at most
 * pi_n_ctx_seq (PI_ERR_CONTEXT_FULL). pi_eval is this call for sequence 0 alone. */
int pi_eval_seqs(pi_context *ctx, const int32_t *tokens, const int32_t *seq, const int32_t *n_item_tokens,
                 int32_t n_items, int32_t logits_all);
int32_t pi_n_seq_max(const pi_context *ctx);
/* cells (positions) of each sequence: n_ctx / n_seq_max */
int32_t pi_n_ctx_seq(const pi_context *ctx);
/* cached positions of sequence seq (-1 for a seq outside [0, n_seq_max)) */
int32_t pi_seq_used(const pi_context *ctx, int32_t seq);
/* Forget sequence seq's cached positions >= n_keep (0 clears the sequence: its slot is free) */
int pi_seq_truncate(pi_context *ctx, int32_t seq, int32_t n_keep);
/* Weight-matrix passes of the host forward pass since creation or the last reset (reset
 * != 0 zeroes the count after reading it): each weight matrix a batched product reads
 * counts 1 however many tokens it serves (the sparse FFN's gathered gate/up/down rows
 * count as one pass each). Passes run by a ggml device are not counted. */
int64_t pi_context_matmul_calls(pi_context *ctx, int32_t reset);

/* Per-op timer (off by default; off costs one predictable branch per op). While on, the host
 * forward pass adds the wall time of each op kind since the previous op ended (CLOCK_MONOTONIC)
 * and counts its calls, over every layer and token until reset. pi_context_set_profile(on != 0)
 * starts it with zeroed counters (PI_ERR_NOMEM), 0 stops it and frees them. pi_context_profile
 * copies min(cap, PI_PROF_COUNT) entries of ns and calls, indexed by enum pi_prof_op, and zeroes
 * them with reset != 0; it returns PI_PROF_COUNT, or -1 while the timer is off. A device's
 * placed steps are timed as PI_PROF_DEVICE (submit to wait). */
enum pi_prof_op {
    PI_PROF_EMBED = 0,      /* token (and position) embedding rows */
    PI_PROF_ROPE_CACHE = 1, /* the batch's RoPE cos/sin table */
    PI_PROF_NORM = 2,       /* attention and FFN input norms */
    PI_PROF_QKV = 3,        /* q/k/v products, their biases and q/k norms */
    PI_PROF_ROPE = 4,       /* RoPE of q and k */
    PI_PROF_ATTN = 5,       /* KV store and attention over the cache */
    PI_PROF_ATTN_OUT = 6,   /* output projection, bias, post-norm, residual */
    PI_PROF_FFN_GATE_UP = 7,
    PI_PROF_FFN_ACT = 8,    /* activation times up (and a calibration observer) */
    PI_PROF_FFN_DOWN = 9,   /* down projection, bias, post-norm, residual */
    PI_PROF_FFN_SPARSE = 10, /* a whole sparse / predictor FFN layer */
    PI_PROF_OUTPUT = 11,    /* output norm and head */
    PI_PROF_DEVICE = 12,    /* a step placed on a device */
    PI_PROF_COUNT = 13
};
int pi_context_set_profile(pi_context *ctx, int32_t on);
int32_t pi_context_profile(pi_context *ctx, int64_t *ns, int64_t *calls, int32_t cap, int32_t reset);

/* Thread-local message of the last failure on this thread. */
const char *pi_last_error(void);

/* Instruction-set paths. pi_isa_supported() is a bit mask (1 scalar, 2 avx2,
 * 4 avx512, 8 avx512vnni: the same kernels with vpdpbusd / vpdpwssd, the same results) of what this
 * CPU runs. pi_isa_set("auto"|"scalar"|"avx2"|"avx512"|"avx512vnni") chooses the path
 * for all later calls ("auto": the widest); the environment variable POWERINFER_ISA sets
 * the initial choice. */
enum pi_isa_bit { PI_ISA_SCALAR = 1, PI_ISA_AVX2 = 2, PI_ISA_AVX512 = 4, PI_ISA_AVX512VNNI = 8 };
uint32_t pi_isa_supported(void);
int pi_isa_set(const char *name);
const char *pi_isa_name(void);

/* F16 dot order, for every ISA path: "avx512" (llama.cpp's AVX-512 build of
 * ggml_vec_dot_f16, 64-element steps) or "avx2" (its AVX2 build, 32-element steps).
 * "auto" (the default) takes the one llama.cpp runs on this CPU: avx512 where the CPU
 * has AVX512F, else avx2. The environment variable POWERINFER_F16_ORDER sets the
 * initial choice. It also selects the softmax: that build's exp and lane order. */
int pi_f16_order_set(const char *name);
const char *pi_f16_order_name(void);

/* ---- Kernel entry points (used by tests and benchmarks) ---------------------- */

typedef struct pi_pool pi_pool;
/* Persistent worker pool: n_threads - 1 workers plus the calling thread. Each job is
 * split into more chunks than threads, claimed from a shared counter; workers spin a
 * few microseconds after a job (not at all while their core is contended), then sleep
 * on a condition variable (docs/architecture.md, "Thread pool"). */
int pi_pool_create(int32_t n_threads, pi_pool **out);
void pi_pool_free(pi_pool *pool);

/* Roofline microbenchmarks (`powerinfer-backend bench --roofline`), run through a pool as the engine
 * runs a matmul (chunks from a shared counter, the caller as worker 0).
 * pi_bench_read_bw: read bandwidth. A buffer of `bytes` (>= 1 MiB, rounded down to pages) is allocated,
 * written once by the pool (every page backed), read `repeats` times (every byte loaded once per pass,
 * 256-bit loads with AVX2) and freed; *out = bytes/s of the fastest pass. PI_ERR_NOMEM if it cannot be
 * allocated.
 * pi_bench_int8_peak: int8 multiply-add throughput. Every chunk runs `iters` rounds of 8 independent
 * vpmaddubsw + vpmaddwd + vpaddd chains in registers (the AVX2 quantized dot products' sequence; a
 * scalar loop without AVX2), 256 multiply-adds a round; *out = operations/s (2 per multiply-add) of the
 * best of `repeats` runs.
 * pi_bench_isa: the path both take on this CPU, "avx2" or "scalar". */
int pi_bench_read_bw(pi_pool *pool, int64_t bytes, int32_t repeats, double *out);
int pi_bench_int8_peak(pi_pool *pool, int64_t iters, int32_t repeats, double *out);
const char *pi_bench_isa(void);

/* y[t][r] = dot(w row r, x[t]) for r < n_rows, t < n_tok. w has type `type`,
 * n_rows rows of n_cols elements; x is converted to the weight type's activation
 * type first (Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1, Q8_K for Q4_K/Q5_K/Q6_K,
 * F16 for F16, BF16 for BF16). */
int pi_op_matmul(pi_pool *pool, int32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                 const float *x, int64_t n_tok, float *y);
/* Row groups (see pi_model_repack). pi_repack_size: bytes of matrix (type, n_rows, n_cols)
 * in row groups, -1 where there is no such layout (those types, n_rows a multiple of 16).
 * pi_repack: writes that layout of w to out. pi_op_matmul_grouped: as pi_op_matmul over a
 * matrix in row groups (its float order: pi_model_repack). */
int64_t pi_repack_size(int32_t type, int64_t n_rows, int64_t n_cols);
int pi_repack(int32_t type, const void *w, int64_t n_rows, int64_t n_cols, void *out);
int pi_op_matmul_grouped(pi_pool *pool, int32_t type, const void *w, int64_t n_rows, int64_t n_cols,
                         const float *x, int64_t n_tok, float *y);
/* 1 if pi_op_matmul runs a tiled kernel (several rows x tokens per step, the same bits
 * as the row dot) for `type` with more than one token on the current ISA path, else 0. */
int pi_matmul_has_tiles(int32_t type);
/* 1 if pi_op_matmul runs a single-token kernel (several rows per step, the same bits as
 * the row dot) for `type` with one token on the current ISA path, else 0. */
int pi_matmul_has_matvec(int32_t type);
/* Convert n floats (a multiple of the block size) to `type`: the activation
 * quantization used by pi_op_matmul, and the KV cache store. */
int pi_op_quantize(int32_t type, const float *x, int64_t n, void *y);
/* Dequantize n elements (a multiple of the block size) of weight type `type` to
 * floats: the embedding lookup's conversion. */
int pi_op_dequantize(int32_t type, const void *x, int64_t n, float *y);
/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for n_rows rows of n floats; w may be NULL */
int pi_op_rmsnorm(const float *x, const float *w, int64_t n, int64_t n_rows, float eps, float *y);
/* LayerNorm: y[r] = (x[r] - mean) / sqrt(var + eps) * w + b, for n_rows rows of n floats (mean and
 * variance summed in double, as ggml_norm); w and b may be NULL. */
int pi_op_layernorm(const float *x, const float *w, const float *b, int64_t n, int64_t n_rows, float eps, float *y);
/* In-place rotary embedding of x: n_tok rows of n_head heads of head_dim floats. */
int pi_op_rope(float *x, int64_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
               const int32_t *pos, float freq_base, float freq_scale, const float *freq_factors,
               int32_t rope_type);
/* y = act(x), elementwise */
int pi_op_act(int32_t act, const float *x, float *y, int64_t n);
/* In-place softmax over n floats, as llama.cpp's build of the F16 order (pi_f16_order_set) */
int pi_op_softmax(float *x, int64_t n);
/* Causal grouped-query attention of n_tok queries against a KV cache.
 * q: n_tok rows of n_head*head_dim floats. k: one row of n_head_kv*head_dim
 * elements of kv_type per cached position. v is stored transposed (as llama.cpp
 * does without flash attention): n_head_kv*head_dim rows of v_ld elements, column
 * j = position j. Query t attends to positions 0..pos[t] (< n_kv <= v_ld).
 * V columns from pos[t]+1 up to the next multiple of 64 (within v_ld) are read
 * with weight 0, so they must hold finite values (llama.cpp likewise sums over a
 * padded KV view). Scores use scale 1/sqrt(head_dim); with an F16 cache, q and the softmax
 * weights are rounded to F16 before the dot products, as in llama.cpp.
 * out: n_tok rows of n_head*head_dim floats. */
int pi_op_attention(pi_pool *pool, const float *q, int64_t n_tok, int32_t n_head,
                    int32_t n_head_kv, int32_t head_dim, const void *k, const void *v,
                    int64_t v_ld, int32_t kv_type, int64_t n_kv, const int32_t *pos, float *out);

/* ---- Activation predictor scores (native/src/ops/predictor.c) -------------- */
/* scores (n_tok rows of n_ff) = fc2 . relu(fc1 . x) for n_tok rows x of n_embd; fc1:
 * rank rows of n_embd, fc2: n_ff rows of rank, each any weight type of the dense
 * matmul (x converted to the type's activation type, as pi_op_matmul). Deterministic:
 * the same bits for any pool size. */
int pi_op_predictor_scores(pi_pool *pool, int32_t fc1_type, const void *fc1, int32_t fc2_type, const void *fc2,
                           int64_t n_embd, int64_t rank, int64_t n_ff, const float *x, int64_t n_tok,
                           float *scores);

/* ---- Sparse FFN (neuron-aware; native/src/ops/sparse_ffn.c) ----------------- */

/* Gated FFN forms: h = a(gate.x) * b(up.x) */
enum pi_ffn_act {
    PI_FFN_SWIGLU = 0, /* silu(g) * u */
    PI_FFN_GEGLU = 1,  /* gelu_tanh(g) * u */
    PI_FFN_RELU = 2,   /* relu(g) * u (ReLU-gated; "ReLUfied" models) */
    PI_FFN_DRELU = 3,  /* relu(g) * relu(u) (dReLU, TurboSparse) */
    PI_FFN_RELU_UP = 4, /* ungated: relu(u + b) (OPT, ReluFalcon); see pi_op_ffn_sparse_ungated */
    PI_FFN_GELU_UP = 5  /* ungated: gelu_tanh(u + b) (Falcon) */
};

/* Sparse FFN of n_tok tokens over the active neurons only.
 *  x: n_tok rows of n_embd floats (the normed FFN input).
 *  gate, up: n_ff rows of n_embd elements of gate_up_type (the GGUF [n_embd, n_ff]
 *    layout; F32/F16/BF16/Q4_0/Q4_1/Q8_0). x is converted once per token to the
 *    type's activation type, exactly as pi_op_matmul does, so gate_j.x and up_j.x
 *    have the bits of the dense product's row j.
 *  down_t: the down projection transposed, n_ff rows of n_embd elements of
 *    down_t_type (F32, F16, Q8_0 or Q4_0); see pi_op_transpose_to.
 *  active, active_off: per token t the neuron ids active[active_off[t] ..
 *    active_off[t+1]) (active_off has n_tok + 1 entries, active_off[0] = 0,
 *    non-decreasing), each list strictly increasing and < n_ff. active = NULL means
 *    all n_ff neurons for every token (active_off is then ignored).
 *  For active j: h_j = act(gate_j.x, up_j.x). Neuron j enters the down sum unless
 *    |h_j| < threshold or h_j == 0 (a NaN h_j is kept). For the ReLU forms the up
 *    row is not read when gate_j.x <= 0 (h_j = 0). threshold >= 0, finite.
 *  y: n_tok rows of n_embd floats, y[t] = sum over kept j of h_j * down_t[j].
 *  n_used: optional (NULL), n_tok counts of the neurons kept in the down sum.
 * Determinism: every output element is the float sum over the kept neurons in
 * increasing id order, y = (((0 + h_a*w_a) + h_b*w_b) + ...), each product and sum
 * rounded to float (no FMA), on every ISA path and for any pool size: threads
 * split the output columns, never the sum, so reruns and any thread count give
 * identical bits (and the same bits as that float32 loop written in numpy). */
int pi_op_ffn_sparse(pi_pool *pool, int32_t act, int32_t gate_up_type, const void *gate,
                     const void *up, int64_t n_embd, int64_t n_ff, int32_t down_t_type,
                     const void *down_t, const float *x, int64_t n_tok, const int32_t *active,
                     const int64_t *active_off, float threshold, float *y, int64_t *n_used);

/* The ungated forms (no gate): act PI_FFN_RELU_UP (OPT, ReluFalcon) h_j = relu(up_j.x +
 * up_bias[j]), or PI_FFN_GELU_UP (Falcon) h_j = gelu_tanh(up_j.x + up_bias[j]); up_bias
 * NULL = no bias. y[t] = sum over kept j of h_j * down_t[j]. Arguments, active sets,
 * threshold, n_used and determinism as pi_op_ffn_sparse. */
int pi_op_ffn_sparse_ungated(pi_pool *pool, int32_t act, int32_t up_type, const void *up, const float *up_bias,
                             int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t,
                             const float *x, int64_t n_tok, const int32_t *active, const int64_t *active_off,
                             float threshold, float *y, int64_t *n_used);

/* dst = transpose(src) in type_out: src is n_rows rows of n_cols elements of
 * src_type (any weight type), dst n_cols rows of n_rows elements of type_out
 * (F32, F16, Q8_0 or Q4_0; the quantized types need n_rows % 32 == 0). Values are
 * dequantized to float, then rounded (F16: to nearest even) or quantized (Q8_0 as
 * the activation quantizer, Q4_0 as the GGUF reference). For a GGUF ffn_down
 * ([n_ff, n_embd]: n_embd rows of n_ff) pass n_rows = n_embd, n_cols = n_ff. */
int pi_op_transpose_to(int32_t type_out, const void *src, int32_t src_type, int64_t n_rows,
                       int64_t n_cols, void *dst);

/* ---- A placement plan's layer (powerinfer_backend.hybrid.placement.LayerPlan) ----
 * what pi_context_set_ggml_device places of one layer. */
typedef struct pi_layer_placement {
    int32_t attn_on_device; /* the layer's non-FFN tensors (norms, q/k/v/o, biases) and KV cache */
    int32_t device_skips;   /* 1: where the layer is split and has a predictor when placed, the device
                             * computes only the hot neurons the predictor selects (0: every hot one) */
    int64_t n_hot;          /* FFN neurons the device computes (gathered rows) */
    const int32_t *hot_ids; /* n_hot strictly increasing ids < n_ff */
} pi_layer_placement;

/* ---- ggml backend devices (native/src/device/ggml/; docs/placement.md) ----
 * ggml is reached only through dlopen/dlsym of the llama_cpp package's own shared objects
 * (lib_dir/libggml-base.so.0, libggml.so.0, libggml-cpu.so.0, opened with RTLD_NOLOAD first: the
 * copies `import llama_cpp` mapped). Every function below but pi_ggml_bind needs a bound ggml
 * (PI_ERR_INVALID before). */
typedef struct pi_gdev pi_gdev; /* an open ggml backend device */
typedef struct pi_gdev_info {
    char name[128];
    char description[256];
    int32_t type; /* 0 CPU, 1 GPU, 2 IGPU, 3 ACCEL (ggml's enum order) */
    int64_t free_bytes, total_bytes;
} pi_gdev_info;
typedef struct pi_gdev_buffers { int64_t weights, kv, compute; } pi_gdev_buffers; /* bytes per ggml buffer */
/* bind ggml: lib_dir = llama_cpp's lib folder; version_out (n bytes) receives ggml_version() (also on a
 * version error); PI_ERR_UNSUPPORTED (the message names both versions, or the file / symbol missing and
 * where it was looked for) when outside [min_version, max_version). Binding the same folder again is a
 * no-op; a different folder afterwards is PI_ERR_INVALID. */
int pi_ggml_bind(const char *lib_dir, const char *min_version, const char *max_version, char *version_out, size_t n);
int pi_ggml_load_backends(const char *dir); /* ggml_backend_load_all_from_path: GPU backends of a GPU build */
int32_t pi_ggml_dev_count(void);            /* -1 when ggml is not bound */
int pi_ggml_dev_info(int32_t i, pi_gdev_info *out);
/* open device by ggml name ("CPU", "CUDA0", ...); n_threads: the CPU backend's threads (ignored by GPUs);
 * the CPU device uses the plain CPU buffer type (no AMX/repack extra buffer types). An unknown name is
 * PI_ERR_INVALID listing the devices ggml has. */
int pi_gdev_open(const char *name, int32_t n_threads, pi_gdev **out);
void pi_gdev_free(pi_gdev *d);
int pi_gdev_get_info(const pi_gdev *d, pi_gdev_info *out);
/* bytes this device's buffer type allocates for one tensor [ne0, ne1] of ggml type ggml_type
 * (ggml_backend_buft_get_alloc_size; -1 for a bad type or shape), and its alignment */
int64_t pi_gdev_tensor_bytes(const pi_gdev *d, int32_t ggml_type, int64_t ne0, int64_t ne1);
int64_t pi_gdev_alignment(const pi_gdev *d);

/* compute buffer bytes a context reserves on d for its worst case (n_batch tokens over one slot's cells, attention +
 * an FFN with n_hot = n_ff + the output block; a layer with a predictor also the graphs that skip unselected
 * hot neurons): a constant of (model, n_ctx, n_batch, device, which layers have predictors) */
int pi_context_ggml_compute_bytes(const pi_context *c, pi_gdev *d, int64_t *out);
/* place the plan on d (copies now; the context owns the placement, d must outlive the context); refuses with
 * PI_ERR_NOMEM before allocating anything when weights+kv+compute exceed budget_bytes or the device's free
 * memory (both byte counts in the message). From then on pi_eval runs the placed attention blocks and the
 * output block as ggml graphs on d, and each layer with hot neurons splits its FFN: d computes the hot
 * neurons on a device thread while the calling thread computes the cold ones (thresholds as set
 * by pi_context_set_ffn_sparsity, which hot layers need first; a predictor's selection), merged in a fixed
 * order (the device's partial sum, continued by the cold neurons in id order): reruns give identical bits.
 * The device computes every hot neuron (thresholds apply to the cold ones; pi_context_ffn_stats counts
 * every hot neuron as used), except in a split layer marked device_skips that has its predictor when
 * placed: there the predictor scores every neuron before the device starts and the device computes only
 * the selected hot ones (a token alone gathers their gate and up rows with ggml_mul_mat_id; a batch
 * computes every row and zeroes the unselected h), as the CPU engine with that predictor does. Layers
 * with hot neurons must be gated; a fused attn_qkv (Falcon) cannot be placed. With n_seq_max > 1
 * the device's KV holds every slot (n_cells rows) and each device step runs one graph per sequence of the
 * batch, so a sequence gets the bits it gets alone in a context of n_ctx_seq with the same placement. */
int pi_context_set_ggml_device(pi_context *c, pi_gdev *d, const pi_layer_placement *layers,
                               int32_t output_on_device, int64_t budget_bytes);
int pi_context_ggml_buffers(const pi_context *c, pi_gdev_buffers *out); /* the sizes ggml allocated */

#ifdef __cplusplus
}
#endif
#endif /* POWERINFER_H */
