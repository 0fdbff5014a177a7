/* The model and context structs, shared by the model and context lifetime, the forward
 * pass and its blocks, the FFN settings and the device half of a placed model. */
#ifndef PI_CONTEXT_H
#define PI_CONTEXT_H

#include <stdlib.h>

#include "pi_internal.h"

typedef struct pi_dev pi_dev; /* device/device.h */

/* per-op timer: totals per enum pi_prof_op, and when the previous op ended */
typedef struct {
    int64_t ns[PI_PROF_COUNT], calls[PI_PROF_COUNT], lap;
} pi_prof;

struct pi_model {
    pi_model_params hp;   /* copy; tensor views point into caller memory */
    pi_tensor *layers;    /* own copy of the n_layer * PI_L_COUNT descriptors */
    pi_mat tok_embd, output;
    pi_mat *mats;         /* n_layer * PI_L_COUNT, matrix view of each slot (row groups where repacked) */
    pi_mat *row_mats;     /* the same in the tensors' own rows: what row gathers read (sparse FFN) */
    void **repacked;      /* n_layer * PI_L_COUNT + 1 (the output last): buffers pi_model_repack owns */
    int64_t max_act_row;  /* largest activation row in bytes, over all matrices */
    int64_t max_act_fixed; /* and the largest per-call part of a product's scratch (pi_matmul_scratch_fixed) */
};

struct pi_context {
    pi_model *m;
    pi_context_params cp;
    pi_pool *pool;
    int32_t n_seq;                        /* sequences (slots): cp.n_seq_max, at least 1 */
    int32_t n_ctx_seq;                    /* positions per sequence: n_ctx / n_seq */
    int32_t *seq_used;                    /* per sequence: cached positions [0, seq_used[s]) */
    int64_t seq_cells;                    /* cells per slot: n_ctx_seq rounded up to PI_KV_PAD */
    int64_t kv_row;                       /* n_head_kv * n_embd_head */
    size_t kv_esz;
    int64_t n_cells;                      /* n_seq * seq_cells; sequence s owns [s * seq_cells, (s+1) * seq_cells) */
    char *k_cache, *v_cache;              /* per layer: [n_cells][kv_row] and [kv_row][n_cells] */
    int32_t *tok_pos, *tok_cell0;         /* n_batch: pi_eval_seqs' per-token position and first cell of its slot */
    int32_t n_grp;                        /* the step's rows by sequence: group g is rows [grp_off[g], grp_off[g+1]) */
    int64_t *grp_off;                     /* n_batch + 1 (device/device.h: a device runs each group alone) */
    int64_t matmul_calls;                 /* weight-matrix passes (pi_context_matmul_calls) */
    float *x, *xn, *q, *k, *v, *attn, *g, *u; /* n_batch rows each */
    float *x_par;                         /* parallel residual: the layer input the FFN reads */
    void *act_scratch;                    /* quantized matmul inputs */
    float *attn_scratch;
    float *logits1;                       /* last-token logits: never moves, so views of it stay valid */
    float *logits_rows;                   /* logits_all rows, grown on demand */
    int64_t rows_cap;                     /* rows allocated in logits_rows */
    float *logits;                        /* the buffer the last pi_eval wrote */
    float *embd;
    float *rope_cs;                       /* cos/sin per position of this batch: n_batch rows of n_rot */
    float *rope_cs_swa;                   /* the same for the local (sliding-window) layers' RoPE */
    pi_mat *down_t;                       /* per layer: transposed down for the sparse FFN (data NULL = dense) */
    float *ffn_threshold;                 /* per layer */
    uint8_t *ffn_dense_down;              /* per layer: 1 = the kept h go through the GGUF ffn_down (dense) */
    float *ffn_hd;                        /* n_batch rows of n_ff: that h, allocated on first use */
    void *ffn_scratch;                    /* sparse FFN scratch and output rows, allocated on first use */
    float *ffn_y;
    int64_t *ffn_used_tok;                /* n_batch */
    int64_t *ffn_used, *ffn_total;        /* per layer, with the sparse FFN tables */
    pi_ffn_observer ffn_observer;         /* called by every dense FFN layer (pi_context_set_ffn_hist), or NULL */
    void *ffn_observer_data;
    pi_ffn_hists ffn_hists;               /* the observer data of pi_context_set_ffn_hist(2) */
    int32_t ffn_on_gate;                  /* enum pi_ffn_threshold_on */
    pi_mat *pred_fc1, *pred_fc2;          /* per layer: activation predictor (fc1 data NULL = none) */
    float *pred_threshold;                /* per layer */
    void *pred_scratch;                   /* matmul scratch + hidden rows, pred_scratch_size bytes */
    int64_t pred_scratch_size;
    float *pred_scores;                   /* n_batch rows of n_ff */
    int32_t *pred_active;                 /* n_batch * n_ff ids */
    int64_t *pred_off;                    /* n_batch + 1 */
    int64_t *pred_count, *pred_ns, *ffn_ns; /* per layer counters */
    float *ffn_capture;                   /* pi_context_set_ffn_capture, or NULL */
    int32_t n_out;
    pi_dev *dev;                          /* the device of a placement (device/device.h), or NULL */
    pi_prof *prof;                        /* per-op timer (pi_context_set_profile), or NULL: off */
};

/* Per-op timer marks (profile.c): pi_prof_start where timing begins, pi_prof_lap(c, op) after
 * each op, charging op with the time since the previous mark. Off: one predictable branch. */
void pi_prof_now(pi_prof *p, int op);
static inline void pi_prof_start(const pi_context *c) {
    if (__builtin_expect(c->prof != NULL, 0)) pi_prof_now(c->prof, -1);
}
static inline void pi_prof_lap(const pi_context *c, int op) {
    if (__builtin_expect(c->prof != NULL, 0)) pi_prof_now(c->prof, op);
}

/* tensor t is present with shape [ne0, ne1] (is_norm: [ne0] F32) and bytes enough (model.c) */
int pi_check_tensor(const pi_tensor *t, const char *name, int64_t ne0, int64_t ne1, int is_norm);
static inline pi_mat pi_mat_of(const pi_tensor *t) { return (pi_mat){t->data, t->type, t->ne[0], t->ne[1]}; }
static inline float *pi_alloc_f(int64_t n) { return malloc((size_t)n * sizeof(float)); }
/* 1: layer l has an activation predictor (pi_context_set_ffn_predictor) */
static inline int pi_has_predictor(const pi_context *c, int l) {
    return c->pred_fc1 != NULL && c->pred_fc1[l].data != NULL;
}

#endif
