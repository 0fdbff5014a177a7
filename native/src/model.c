/* Model and context lifetime, and the forward pass of a llama-family decoder:
 * read top to bottom in forward_layer() and pi_eval(). */
#include <stdio.h>
#include <stdlib.h>

#include "context.h"

static const char *const k_slot_names[PI_L_COUNT] = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "post_ffw_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
    "attn_norm.bias", "ffn_norm.bias", "attn_qkv.weight", "attn_output.bias", "ffn_up.bias", "ffn_down.bias"};

/* ---- validation ---------------------------------------------------------- */

static int check_tensor(const pi_tensor *t, const char *name, int64_t ne0, int64_t ne1, int is_norm) {
    if (t->data == NULL) return pi_set_error(PI_ERR_INVALID, "tensor %s: missing (data is NULL)", name);
    const pi_type_traits *tr = pi_type_get(t->type);
    if (tr == NULL || !pi_type_is_weight(t->type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "tensor %s: unsupported type %d", name, t->type);
    if (is_norm && t->type != PI_TYPE_F32)
        return pi_set_error(PI_ERR_UNSUPPORTED, "tensor %s: norm weights must be F32, got %s", name, tr->name);
    const int64_t n1 = is_norm ? 1 : ne1;
    if (t->ne[0] != ne0 || t->ne[1] != n1 || t->ne[2] != 1 || t->ne[3] != 1)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3], (long long)ne0, (long long)n1);
    const int64_t row = pi_row_size(t->type, ne0);
    if (row < 0)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: row length %lld is not a multiple of the %s block size",
                            name, (long long)ne0, tr->name);
    if (t->nbytes < (uint64_t)(row * n1))
        return pi_set_error(PI_ERR_INVALID, "tensor %s: %llu bytes, needs %lld", name,
                            (unsigned long long)t->nbytes, (long long)(row * n1));
    return PI_OK;
}

static int check_params(const pi_model_params *p) {
    if (p->n_vocab < 1 || p->n_embd < 1 || p->n_layer < 1 || p->n_ff < 1 || p->n_head < 1 ||
        p->n_head_kv < 1 || p->n_embd_head < 2 || p->n_vocab > (1 << 24) || p->n_embd > (1 << 20) ||
        p->n_ff > (1 << 22) || p->n_layer > 4096 || p->n_head > 4096 || p->n_embd_head > 4096)
        return pi_set_error(PI_ERR_INVALID,
                            "hyper-parameters out of range (n_vocab %d, n_embd %d, n_layer %d, n_ff %d, "
                            "n_head %d, n_head_kv %d, n_embd_head %d)",
                            p->n_vocab, p->n_embd, p->n_layer, p->n_ff, p->n_head, p->n_head_kv, p->n_embd_head);
    if (p->n_head % p->n_head_kv != 0)
        return pi_set_error(PI_ERR_INVALID, "n_head %d is not a multiple of n_head_kv %d", p->n_head, p->n_head_kv);
    if (p->n_rot < 2 || p->n_rot > p->n_embd_head || p->n_rot % 2 != 0 || p->n_rot > 1024)
        return pi_set_error(PI_ERR_INVALID, "n_rot %d must be even and in [2, n_embd_head=%d]", p->n_rot,
                            p->n_embd_head);
    if (!(p->rope_freq_base > 0.0f) || !(p->rope_freq_scale > 0.0f) || !(p->rms_eps >= 0.0f))
        return pi_set_error(PI_ERR_INVALID, "rope_freq_base, rope_freq_scale must be > 0 and rms_eps >= 0");
    if (p->rope_type != PI_ROPE_NORM && p->rope_type != PI_ROPE_NEOX && p->rope_type != PI_ROPE_NONE)
        return pi_set_error(PI_ERR_INVALID, "unknown rope type %d", p->rope_type);
    if (p->act < PI_ACT_SILU || p->act > PI_ACT_DRELU)
        return pi_set_error(PI_ERR_INVALID, "unknown activation %d", p->act);
    if (!(p->embd_scale >= 0.0f && p->embd_scale < INFINITY) || !(p->attn_scale >= 0.0f && p->attn_scale < INFINITY))
        return pi_set_error(PI_ERR_INVALID, "embd_scale and attn_scale must be finite and >= 0");
    if ((p->layer_norm != 0 && p->layer_norm != 1) || (p->parallel_residual != 0 && p->parallel_residual != 1))
        return pi_set_error(PI_ERR_INVALID, "layer_norm %d and parallel_residual %d must be 0 or 1", p->layer_norm,
                            p->parallel_residual);
    if (p->n_swa < 0 || p->swa_pattern < 0)
        return pi_set_error(PI_ERR_INVALID, "n_swa %d and swa_pattern %d must be >= 0", p->n_swa, p->swa_pattern);
    if (p->n_swa > 0 && (!(p->rope_freq_base_swa > 0.0f) || !(p->rope_freq_scale_swa > 0.0f)))
        return pi_set_error(PI_ERR_INVALID, "rope_freq_base_swa and rope_freq_scale_swa must be > 0 with n_swa > 0");
    if (p->layers == NULL) return pi_set_error(PI_ERR_INVALID, "layers is NULL");
    int rc;
    const int64_t E = p->n_embd, F = p->n_ff, Q = (int64_t)p->n_head * p->n_embd_head,
                  KV = (int64_t)p->n_head_kv * p->n_embd_head;
    if ((rc = check_tensor(&p->tok_embd, "token_embd.weight", E, p->n_vocab, 0))) return rc;
    if ((rc = check_tensor(&p->output_norm, "output_norm.weight", E, 1, 1))) return rc;
    if (p->output.data != NULL && (rc = check_tensor(&p->output, "output.weight", E, p->n_vocab, 0))) return rc;
    if (p->rope_freqs.data != NULL && (rc = check_tensor(&p->rope_freqs, "rope_freqs.weight", p->n_rot / 2, 1, 1)))
        return rc;
    if (p->output_norm_b.data != NULL && (rc = check_tensor(&p->output_norm_b, "output_norm.bias", E, 1, 1)))
        return rc;
    if (p->pos_embd.data != NULL) {
        if (p->pos_offset < 0 || p->pos_offset >= p->pos_embd.ne[1])
            return pi_set_error(PI_ERR_INVALID, "pos_offset %d is outside position_embd.weight's %lld rows",
                                p->pos_offset, (long long)p->pos_embd.ne[1]);
        if ((rc = check_tensor(&p->pos_embd, "position_embd.weight", E, p->pos_embd.ne[1], 0))) return rc;
    }
    const int64_t H = p->n_embd_head;
    const int64_t shapes[PI_L_COUNT][2] = {{E, 1}, {E, Q}, {E, KV}, {E, KV}, {Q, E}, {E, 1}, {E, F}, {E, F}, {F, E},
                                           {H, 1}, {H, 1}, {E, 1}, {E, 1}, {Q, 1}, {KV, 1}, {KV, 1},
                                           {E, 1}, {E, 1}, {E, Q + 2 * KV}, {E, 1}, {F, 1}, {E, 1}};
    for (int l = 0; l < p->n_layer; l++) {
        const pi_tensor *lt = &p->layers[l * PI_L_COUNT];
        const int fused = lt[PI_L_ATTN_QKV].data != NULL; /* Falcon: q, k, v rows of one tensor */
        for (int s = 0; s < PI_L_COUNT; s++) {
            const pi_tensor *t = &lt[s];
            const int optional = s > PI_L_FFN_DOWN || s == PI_L_FFN_GATE ||
                                 (fused && (s == PI_L_ATTN_Q || s == PI_L_ATTN_K || s == PI_L_ATTN_V));
            if (optional && t->data == NULL) continue; /* absent */
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, k_slot_names[s]);
            if (fused && (s == PI_L_ATTN_Q || s == PI_L_ATTN_K || s == PI_L_ATTN_V))
                return pi_set_error(PI_ERR_INVALID, "tensor %s: not expected with blk.%d.attn_qkv.weight", name, l);
            const int vec = s == PI_L_ATTN_NORM || s == PI_L_FFN_NORM || (s > PI_L_FFN_DOWN && s != PI_L_ATTN_QKV);
            if ((rc = check_tensor(t, name, shapes[s][0], shapes[s][1], vec))) return rc;
        }
    }
    return PI_OK;
}

static pi_mat mat_of(const pi_tensor *t) { return (pi_mat){t->data, t->type, t->ne[0], t->ne[1]}; }

int pi_model_create(const pi_model_params *params, pi_model **out) {
    if (params == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_model_create: NULL argument");
    *out = NULL;
    int rc = check_params(params);
    if (rc) return rc;
    pi_model *m = calloc(1, sizeof *m);
    const size_t n = (size_t)params->n_layer * PI_L_COUNT;
    if (m == NULL || (m->layers = malloc(n * sizeof *m->layers)) == NULL ||
        (m->mats = malloc(n * sizeof *m->mats)) == NULL) {
        pi_model_free(m);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for the model");
    }
    m->hp = *params;
    memcpy(m->layers, params->layers, n * sizeof *m->layers);
    m->hp.layers = m->layers;
    m->tok_embd = mat_of(&params->tok_embd);
    m->output = mat_of(params->output.data != NULL ? &params->output : &params->tok_embd);
    m->max_act_row = pi_matmul_scratch_size(m->output.type, m->output.n_cols, 1);
    for (size_t i = 0; i < n; i++) {
        m->mats[i] = mat_of(&m->layers[i]);
        const int64_t s = pi_matmul_scratch_size(m->mats[i].type, m->mats[i].n_cols, 1);
        if (s > m->max_act_row) m->max_act_row = s;
    }
    for (int l = 0; l < params->n_layer; l++) { /* a fused qkv tensor: q, k, v are row ranges of it */
        pi_mat *lm = &m->mats[l * PI_L_COUNT];
        const pi_mat f = lm[PI_L_ATTN_QKV];
        if (f.data == NULL) continue;
        const int64_t row = pi_row_size(f.type, f.n_cols), Q = (int64_t)params->n_head * params->n_embd_head,
                      KV = (int64_t)params->n_head_kv * params->n_embd_head;
        lm[PI_L_ATTN_Q] = (pi_mat){f.data, f.type, f.n_cols, Q};
        lm[PI_L_ATTN_K] = (pi_mat){(const char *)f.data + Q * row, f.type, f.n_cols, KV};
        lm[PI_L_ATTN_V] = (pi_mat){(const char *)f.data + (Q + KV) * row, f.type, f.n_cols, KV};
    }
    *out = m;
    return PI_OK;
}

void pi_model_free(pi_model *m) {
    if (m == NULL) return;
    free(m->layers);
    free(m->mats);
    free(m);
}

/* ---- context ------------------------------------------------------------- */

void pi_context_free(pi_context *c) {
    if (c == NULL) return;
    pi_placed_free(c->placed);
    pi_pool_free(c->pool);
    free(c->k_cache);
    free(c->v_cache);
    float *bufs[] = {c->x, c->xn, c->q, c->k, c->v, c->attn, c->g, c->u, c->attn_scratch, c->logits1, c->logits_rows,
                     c->embd, c->rope_cs, c->rope_cs_swa, c->x_par};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->act_scratch);
    free(c->down_t);
    free(c->ffn_threshold);
    free(c->ffn_scratch);
    free(c->ffn_y);
    free(c->ffn_used_tok);
    free(c->ffn_used);
    free(c->pred_fc1);
    free(c->pred_fc2);
    free(c->pred_threshold);
    free(c->pred_scratch);
    free(c->pred_scores);
    free(c->pred_active);
    free(c->pred_off);
    free(c->pred_count);
    free(c);
}

static float *alloc_f(int64_t n) { return malloc((size_t)n * sizeof(float)); }

int pi_context_create(pi_model *m, const pi_context_params *cp, pi_context **out) {
    if (m == NULL || cp == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_create: NULL argument");
    *out = NULL;
    if (cp->n_ctx < 1 || cp->n_ctx > (1 << 24))
        return pi_set_error(PI_ERR_INVALID, "n_ctx must be in [1, 16777216], got %d", cp->n_ctx);
    if (cp->n_batch < 1 || cp->n_batch > (1 << 20))
        return pi_set_error(PI_ERR_INVALID, "n_batch must be in [1, 1048576], got %d", cp->n_batch);
    if (cp->kv_type != PI_TYPE_F16 && cp->kv_type != PI_TYPE_F32)
        return pi_set_error(PI_ERR_UNSUPPORTED, "kv_type must be F16 (1) or F32 (0), got %d", cp->kv_type);
    const pi_model_params *hp = &m->hp;
    pi_context *c = calloc(1, sizeof *c);
    if (c == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for the context");
    c->m = m;
    c->cp = *cp;
    int rc = pi_pool_create(cp->n_threads, &c->pool);
    if (rc) {
        free(c);
        return rc;
    }
    const int64_t B = cp->n_batch, E = hp->n_embd, Q = (int64_t)hp->n_head * hp->n_embd_head;
    c->kv_row = (int64_t)hp->n_head_kv * hp->n_embd_head;
    c->kv_esz = cp->kv_type == PI_TYPE_F16 ? 2 : 4;
    c->n_cells = ((int64_t)cp->n_ctx + PI_KV_PAD - 1) / PI_KV_PAD * PI_KV_PAD;
    const size_t kv_bytes = (size_t)hp->n_layer * (size_t)c->n_cells * (size_t)c->kv_row * c->kv_esz;
    c->k_cache = calloc(1, kv_bytes);
    c->v_cache = calloc(1, kv_bytes); /* zeroed: V dot products read whole padded blocks */
    c->x = alloc_f(B * E);
    c->xn = alloc_f(B * E);
    c->q = alloc_f(B * Q);
    c->k = alloc_f(B * c->kv_row);
    c->v = alloc_f(B * c->kv_row);
    c->attn = alloc_f(B * Q);
    c->g = alloc_f(B * hp->n_ff);
    c->u = alloc_f(B * hp->n_ff);
    c->embd = alloc_f(B * E);
    c->act_scratch = malloc((size_t)(m->max_act_row * B));
    c->attn_scratch = alloc_f(pi_attention_scratch_floats(c->n_cells, hp->n_embd_head) * cp->n_threads);
    c->logits1 = alloc_f(hp->n_vocab);
    c->rope_cs = alloc_f(B * hp->n_rot);
    c->rope_cs_swa = hp->n_swa > 0 ? alloc_f(B * hp->n_rot) : NULL;
    c->x_par = hp->parallel_residual ? alloc_f(B * E) : NULL;
    if (!c->k_cache || !c->v_cache || !c->x || !c->xn || !c->q || !c->k || !c->v || !c->attn || !c->g ||
        !c->u || !c->embd || !c->act_scratch || !c->attn_scratch || !c->logits1 || !c->rope_cs ||
        (hp->n_swa > 0 && c->rope_cs_swa == NULL) || (hp->parallel_residual && c->x_par == NULL)) {
        pi_context_free(c);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for a context of n_ctx %d (KV cache %zu bytes)",
                            cp->n_ctx, 2 * kv_bytes);
    }
    *out = c;
    return PI_OK;
}

/* ---- forward pass -------------------------------------------------------- */

static void matmul1(pi_context *c, const pi_mat *w, const float *x, int64_t n_tok, float *y) {
    const pi_matmul_out o = {w, y, w->n_rows};
    pi_matmul_multi(c->pool, &o, 1, x, n_tok, c->act_scratch);
}

typedef struct {
    int32_t act;
    float *g;
    const float *u;
    int64_t n;
} act_job;

static void act_task(void *varg, int ith, int nth) {
    const act_job *j = varg;
    int64_t lo, hi;
    pi_split(j->n, ith, nth, &lo, &hi);
    if (j->act == PI_ACT_GELU) /* half-precision GELU, as llama.cpp's forward pass */
        pi_gelu16_mul(j->g + lo, j->u ? j->u + lo : NULL, j->g + lo, hi - lo);
    else
        pi_act_mul(j->act, j->g + lo, j->u ? j->u + lo : NULL, j->g + lo, hi - lo);
}

/* g = act(g) * u over n_tok rows (ungated: g = act(g)); split across the pool for prompt batches */
static void act_mul(pi_context *c, int64_t n_tok, int gated) {
    act_job j = {c->m->hp.act, c->g, gated ? c->u : NULL, n_tok * c->m->hp.n_ff};
    if (n_tok == 1)
        act_task(&j, 0, 1);
    else
        pi_pool_run(c->pool, act_task, &j);
}

/* rows = RMSNorm(rows) * w in place, when the optional norm w is present */
static void norm_opt(const pi_tensor *w, float *rows, int64_t n, int64_t n_rows, float eps) {
    if (w->data != NULL) pi_rmsnorm_rows(rows, w->data, n, n_rows, eps, rows);
}

static void add_rows(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

/* Store this batch's K rows, and V columns (V is cached transposed). */
static void store_kv(const pi_context *c, const pi_attn_site *s, const int32_t *pos, int64_t n_tok) {
    const int64_t R = c->kv_row, N = c->n_cells;
    const pi_isa *isa = pi_isa_current();
    for (int64_t t = 0; t < n_tok; t++) {
        isa->from_float[c->cp.kv_type](s->k + t * R, s->kc + (size_t)pos[t] * R * c->kv_esz, R);
        for (int64_t e = 0; e < R; e++) {
            const float val = s->v[t * R + e];
            const size_t at = (size_t)(e * N + pos[t]);
            if (c->cp.kv_type == PI_TYPE_F16)
                ((uint16_t *)s->vc)[at] = pi_fp32_to_fp16(val);
            else
                ((float *)s->vc)[at] = val;
        }
    }
}


/* x[t] += b for n_tok rows of n floats, when the optional bias b is present */
static void bias_opt(const pi_tensor *b, float *x, int64_t n, int64_t n_tok) {
    if (b->data != NULL)
        for (int64_t t = 0; t < n_tok; t++) add_rows(x + t * n, b->data, n);
}

/* The FFN's input products of layer l for the normed rows c->xn: c->g = gate x and
 * c->u = up x (+ bias); an ungated layer (Falcon, OPT) has only c->g = up x + bias.
 * Returns 1 when gated. */
static int ffn_gate_up(pi_context *c, int l, int64_t n_tok) {
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const int64_t F = c->m->hp.n_ff;
    const int gated = lm[PI_L_FFN_GATE].data != NULL;
    float *up = gated ? c->u : c->g;
    const pi_matmul_out gu[2] = {{&lm[PI_L_FFN_UP], up, F}, {&lm[PI_L_FFN_GATE], c->g, F}};
    pi_matmul_multi(c->pool, gu, gated ? 2 : 1, c->xn, n_tok, c->act_scratch);
    bias_opt(&c->m->hp.layers[l * PI_L_COUNT + PI_L_FFN_UP_BIAS], up, F, n_tok);
    return gated;
}

/* The sparse FFN of layer l (see pi_context_set_ffn_sparsity). A batch thresholding
 * the product computes gate and up with the dense batched matmul (each weight row is
 * read once for the batch instead of once per token; the same bits per row) and
 * skips rows of down_t per token; decode, and the gate form, gather rows per token. */
int32_t pi_ffn_form(const pi_model *m, int l) {
    static const int32_t form[] = {[PI_ACT_SILU] = PI_FFN_SWIGLU, [PI_ACT_GELU] = PI_FFN_GEGLU,
                                   [PI_ACT_RELU] = PI_FFN_RELU, [PI_ACT_DRELU] = PI_FFN_DRELU};
    if (m->mats[l * PI_L_COUNT + PI_L_FFN_GATE].data == NULL) /* ungated (Falcon, OPT) */
        return m->hp.act == PI_ACT_GELU ? PI_FFN_GELU_UP : PI_FFN_RELU_UP;
    return form[m->hp.act];
}

static void ffn_sparse(pi_context *c, int l, int64_t n_tok) {
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const pi_tensor *lt = &c->m->hp.layers[l * PI_L_COUNT];
    const int64_t F = c->m->hp.n_ff;
    const int gated = lm[PI_L_FFN_GATE].data != NULL; /* else an ungated form (Falcon, OPT) */
    const int pred = c->pred_fc1 != NULL && c->pred_fc1[l].data != NULL;
    const int64_t t0 = pred ? pi_now_ns() : 0;
    const int32_t *active = NULL;
    const int64_t *active_off = NULL;
    if (pred) { /* scores -> per-token active lists (increasing ids) */
        pi_predictor_scores(c->pool, &c->pred_fc1[l], &c->pred_fc2[l], c->xn, n_tok, c->pred_scores, c->pred_scratch);
        c->pred_count[l] += pi_predictor_select(c->pred_scores, n_tok, F, c->pred_threshold[l], c->pred_active,
                                                c->pred_off);
        active = c->pred_active;
        active_off = c->pred_off;
        c->pred_ns[l] += pi_now_ns() - t0;
    }
    float *h = NULL;
    if (n_tok > 1 && !c->ffn_on_gate) {
        act_mul(c, n_tok, ffn_gate_up(c, l, n_tok));
        h = c->g;
        if (pred) { /* batched: the same bits as gathered rows; unpredicted neurons are zeroed */
            for (int64_t i = 0; i < n_tok * F; i++)
                if (!(c->pred_scores[i] >= c->pred_threshold[l])) h[i] = 0.0f;
            active = NULL;
            active_off = NULL;
        }
    }
    const pi_ffn_sparse_args a = {pi_ffn_form(c->m, l), gated ? &lm[PI_L_FFN_GATE] : NULL,
                                  &lm[PI_L_FFN_UP], &c->down_t[l], c->xn, n_tok, active, active_off,
                                  c->ffn_threshold[l], c->ffn_y, c->ffn_used_tok, c->ffn_on_gate, h,
                                  lt[PI_L_FFN_UP_BIAS].data};
    pi_ffn_sparse(c->pool, &a, c->ffn_scratch);
    if (pred) c->ffn_ns[l] += pi_now_ns() - t0;
    for (int64_t t = 0; t < n_tok; t++) c->ffn_used[l] += c->ffn_used_tok[t];
    c->ffn_total[l] += n_tok * c->m->hp.n_ff;
    pi_ffn_residual(c, l, n_tok);
}

void pi_ffn_residual(pi_context *c, int l, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    bias_opt(&hp->layers[l * PI_L_COUNT + PI_L_FFN_DOWN_BIAS], c->ffn_y, hp->n_embd, n_tok); /* OPT, Falcon files */
    norm_opt(&hp->layers[l * PI_L_COUNT + PI_L_FFN_POST_NORM], c->ffn_y, hp->n_embd, n_tok, hp->rms_eps); /* Gemma */
    add_rows(c->x, c->ffn_y, n_tok * hp->n_embd);
}

/* x[t] += b for n_tok rows of n floats (projection biases) */
static void add_bias(float *x, const float *b, int64_t n, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++) add_rows(x + t * n, b, n);
}


/* y = the norm of n_rows rows x with weight w: RMSNorm, or LayerNorm plus the optional
 * bias b (Falcon, OPT) */
static void norm_rows(const pi_model_params *hp, const float *x, const pi_tensor *w, const pi_tensor *b,
                      int64_t n_rows, float *y) {
    if (hp->layer_norm)
        pi_layernorm_rows(x, w->data, b->data, hp->n_embd, n_rows, hp->rms_eps, y);
    else
        pi_rmsnorm_rows(x, w->data, hp->n_embd, n_rows, hp->rms_eps, y);
}

/* sliding-window (local) layer? see pi_model_params.swa_pattern */
static int is_swa(const pi_model_params *hp, int l) {
    return hp->n_swa > 0 && (hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1);
}

void pi_attn_block(const pi_context *c, const pi_attn_site *s, int l, const int32_t *pos, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = s->lt;
    const pi_mat *lm = s->lm;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->n_embd_head, R = c->kv_row;
    const int64_t H = hp->n_embd_head;
    const int swa = is_swa(hp, l);

    /* optional pieces: Qwen2/OPT biases, Gemma q/k norms, post-norm */
    if (hp->parallel_residual) /* Falcon: the FFN reads the layer input, not x + attention */
        memcpy(s->x_par, s->x, (size_t)(n_tok * E) * sizeof(float));
    norm_rows(hp, s->x, &lt[PI_L_ATTN_NORM], &lt[PI_L_ATTN_NORM_B], n_tok, s->xn);
    const pi_matmul_out qkv[3] = {{&lm[PI_L_ATTN_Q], s->q, Q}, {&lm[PI_L_ATTN_K], s->k, R}, {&lm[PI_L_ATTN_V], s->v, R}};
    pi_matmul_multi(s->pool, qkv, 3, s->xn, n_tok, s->act_scratch);
    if (lt[PI_L_ATTN_Q_BIAS].data != NULL) add_bias(s->q, lt[PI_L_ATTN_Q_BIAS].data, Q, n_tok);
    if (lt[PI_L_ATTN_K_BIAS].data != NULL) add_bias(s->k, lt[PI_L_ATTN_K_BIAS].data, R, n_tok);
    if (lt[PI_L_ATTN_V_BIAS].data != NULL) add_bias(s->v, lt[PI_L_ATTN_V_BIAS].data, R, n_tok);
    norm_opt(&lt[PI_L_ATTN_Q_NORM], s->q, H, n_tok * hp->n_head, hp->rms_eps);
    norm_opt(&lt[PI_L_ATTN_K_NORM], s->k, H, n_tok * hp->n_head_kv, hp->rms_eps);
    const float *cs = swa ? s->rope_cs_swa : s->rope_cs;
    if (hp->rope_type != PI_ROPE_NONE) { /* OPT: learned positions were added to the embeddings */
        pi_rope_apply(s->q, n_tok, hp->n_head, hp->n_embd_head, hp->n_rot, cs, hp->rope_type);
        pi_rope_apply(s->k, n_tok, hp->n_head_kv, hp->n_embd_head, hp->n_rot, cs, hp->rope_type);
    }
    float scale = 1.0f / sqrtf((float)hp->n_embd_head);
    if (hp->attn_scale > 0.0f) { /* Gemma: q scaled before attention, scores unscaled */
        for (int64_t i = 0; i < n_tok * Q; i++) s->q[i] *= hp->attn_scale;
        scale = 1.0f;
    }
    store_kv(c, s, pos, n_tok);
    pi_attention(s->pool, s->q, n_tok, hp->n_head, hp->n_head_kv, hp->n_embd_head, s->kc, s->vc, c->n_cells,
                 c->cp.kv_type, pos[n_tok - 1] + 1, pos, scale, swa ? hp->n_swa : 0, s->attn, s->attn_scratch);
    const pi_matmul_out o = {&lm[PI_L_ATTN_OUT], s->xn, E};
    pi_matmul_multi(s->pool, &o, 1, s->attn, n_tok, s->act_scratch);
    bias_opt(&lt[PI_L_ATTN_OUT_BIAS], s->xn, E, n_tok);
    norm_opt(&lt[PI_L_ATTN_POST_NORM], s->xn, E, n_tok, hp->rms_eps);
    add_rows(s->x, s->xn, n_tok * E);
    /* the FFN's input */
    norm_rows(hp, hp->parallel_residual ? s->x_par : s->x, &lt[PI_L_FFN_NORM], &lt[PI_L_FFN_NORM_B], n_tok, s->xn);
}

static void forward_layer(pi_context *c, int l, const int32_t *pos, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const int64_t E = hp->n_embd;

    /* attention block and the FFN's input norm: x += attn(norm(x)); xn = ffn_norm(x) */
    if (!pi_placed_attn(c, l, pos, n_tok)) {
        const size_t kv_off = (size_t)l * c->n_cells * c->kv_row * c->kv_esz;
        const pi_attn_site host = {c->pool, lt, lm, c->k_cache + kv_off, c->v_cache + kv_off, c->x, c->xn, c->q,
                                   c->k, c->v, c->attn, c->act_scratch, c->attn_scratch, c->rope_cs, c->rope_cs_swa,
                                   c->x_par};
        pi_attn_block(c, &host, l, pos, n_tok);
    }

    /* feed-forward block: down(act(gate x) * up x), or down(act(up x + b)) + b without a gate (Falcon, OPT);
     * split with the device when placed */
    if (c->ffn_capture)
        memcpy(c->ffn_capture + (size_t)l * c->cp.n_batch * E, c->xn, (size_t)(n_tok * E) * sizeof(float));
    if (pi_placed_ffn(c, l, n_tok)) return;
    if (c->down_t != NULL && c->down_t[l].data != NULL) {
        ffn_sparse(c, l, n_tok);
        return;
    }
    const int gated = ffn_gate_up(c, l, n_tok);
    uint32_t *hist = c->ffn_hist ? c->ffn_hist + (size_t)l * hp->n_ff * PI_FFN_HIST_BINS : NULL;
    if (hist && c->ffn_on_gate) pi_ffn_hist_add(c->pool, hist, c->g, n_tok, hp->n_ff, hp->act);
    act_mul(c, n_tok, gated);
    if (hist && !c->ffn_on_gate) pi_ffn_hist_add(c->pool, hist, c->g, n_tok, hp->n_ff, -1);
    matmul1(c, &lm[PI_L_FFN_DOWN], c->g, n_tok, c->xn);
    bias_opt(&lt[PI_L_FFN_DOWN_BIAS], c->xn, E, n_tok);
    norm_opt(&lt[PI_L_FFN_POST_NORM], c->xn, E, n_tok, hp->rms_eps);
    add_rows(c->x, c->xn, n_tok * E);
}

int pi_eval(pi_context *c, const int32_t *tokens, const int32_t *pos, int32_t n_tokens, int32_t logits_all) {
    if (c == NULL || tokens == NULL || pos == NULL) return pi_set_error(PI_ERR_INVALID, "pi_eval: NULL argument");
    const pi_model_params *hp = &c->m->hp;
    if (n_tokens < 1) return pi_set_error(PI_ERR_INVALID, "pi_eval: n_tokens must be >= 1, got %d", n_tokens);
    if (n_tokens > c->cp.n_batch)
        return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval: %d tokens exceed n_batch %d", n_tokens, c->cp.n_batch);
    if (pos[0] < 0 || pos[0] > c->kv_used)
        return pi_set_error(PI_ERR_INVALID, "pi_eval: pos[0] = %d, must be in [0, %d] (cached positions)", pos[0],
                            c->kv_used);
    for (int32_t i = 0; i < n_tokens; i++) {
        if (pos[i] != pos[0] + i)
            return pi_set_error(PI_ERR_INVALID, "pi_eval: positions must be consecutive (pos[%d] = %d)", i, pos[i]);
        if (tokens[i] < 0 || tokens[i] >= hp->n_vocab)
            return pi_set_error(PI_ERR_INVALID, "pi_eval: token %d at index %d is outside [0, %d)", tokens[i], i,
                                hp->n_vocab);
    }
    if (pos[n_tokens - 1] >= c->cp.n_ctx)
        return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval: position %d exceeds the context window of %d",
                            pos[n_tokens - 1], c->cp.n_ctx);
    if (hp->pos_embd.data != NULL && pos[n_tokens - 1] + (int64_t)hp->pos_offset >= hp->pos_embd.ne[1])
        return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval: position %d is past the model's %lld learned positions",
                            pos[n_tokens - 1], (long long)(hp->pos_embd.ne[1] - hp->pos_offset));
    /* logits_all < 0: a prompt chunk whose outputs nobody reads - skip the output layer */
    const int64_t n_out = logits_all > 0 ? n_tokens : logits_all == 0 ? 1 : 0;
    if (logits_all > 0 && n_out > c->rows_cap) {
        float *nl = alloc_f(n_out * hp->n_vocab);
        if (nl == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for %lld rows of logits", (long long)n_out);
        free(c->logits_rows);
        c->logits_rows = nl;
        c->rows_cap = n_out;
    }
    const int64_t E = hp->n_embd;
    const pi_mat *te = &c->m->tok_embd;
    const int64_t te_row = pi_row_size(te->type, E);
    for (int32_t t = 0; t < n_tokens; t++)
        pi_dequantize_row(te->type, (const char *)te->data + tokens[t] * te_row, c->x + t * E, E);
    if (hp->embd_scale > 0.0f)
        for (int64_t i = 0; i < n_tokens * E; i++) c->x[i] *= hp->embd_scale;
    if (hp->pos_embd.data != NULL) { /* learned absolute positions (OPT) */
        const int64_t pe_row = pi_row_size(hp->pos_embd.type, E);
        for (int32_t t = 0; t < n_tokens; t++) {
            pi_dequantize_row(hp->pos_embd.type, (const char *)hp->pos_embd.data + (pos[t] + hp->pos_offset) * pe_row,
                              c->xn, E);
            add_rows(c->x + t * E, c->xn, E);
        }
    }

    if (hp->rope_type != PI_ROPE_NONE)
        pi_rope_cache(n_tokens, hp->n_rot, pos, hp->rope_freq_base, hp->rope_freq_scale, hp->rope_freqs.data,
                      c->rope_cs); /* once per batch, shared by every layer's q and k */
    if (hp->n_swa > 0) /* the local layers' RoPE base (Gemma 3: 10000 against 1e6 globally) */
        pi_rope_cache(n_tokens, hp->n_rot, pos, hp->rope_freq_base_swa, hp->rope_freq_scale_swa, hp->rope_freqs.data,
                      c->rope_cs_swa);
    c->kv_used = pos[0]; /* positions past pos[0] are overwritten now */
    for (int l = 0; l < hp->n_layer; l++) forward_layer(c, l, pos, n_tokens);
    int rc = pi_placed_error(c);
    if (rc) return rc; /* the cache past pos[0] is invalid: kv_used stays at pos[0] */
    c->kv_used = pos[n_tokens - 1] + 1;

    c->n_out = (int32_t)n_out;
    if (n_out == 0) return PI_OK;
    const float *xo = c->x + (n_tokens - n_out) * E;
    c->logits = logits_all > 0 ? c->logits_rows : c->logits1;
    if (!pi_placed_output(c, xo, n_out, c->logits)) {
        norm_rows(hp, xo, &hp->output_norm, &hp->output_norm_b, n_out, c->embd);
        matmul1(c, &c->m->output, c->embd, n_out, c->logits);
    }
    return PI_OK;
}

const float *pi_get_logits(pi_context *c) { return c != NULL && c->n_out > 0 ? c->logits : NULL; }
const float *pi_get_logits_buffer(pi_context *c) { return c != NULL ? c->logits1 : NULL; }
const float *pi_get_embeddings(pi_context *c) { return c != NULL && c->n_out > 0 ? c->embd : NULL; }
int32_t pi_n_outputs(const pi_context *c) { return c != NULL ? c->n_out : 0; }
int32_t pi_kv_used(const pi_context *c) { return c != NULL ? c->kv_used : 0; }

int pi_kv_truncate(pi_context *c, int32_t n_keep) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_kv_truncate: NULL context");
    if (n_keep < 0) return pi_set_error(PI_ERR_INVALID, "pi_kv_truncate: n_keep must be >= 0, got %d", n_keep);
    if (n_keep < c->kv_used) c->kv_used = n_keep;
    return PI_OK;
}

int pi_context_set_ffn_sparsity(pi_context *c, int32_t layer, const pi_tensor *down_t, float threshold) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_sparsity: NULL context");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "threshold must be finite and >= 0, got %g", (double)threshold);
    if (c->down_t == NULL) {
        c->down_t = calloc((size_t)hp->n_layer, sizeof *c->down_t);
        c->ffn_threshold = calloc((size_t)hp->n_layer, sizeof *c->ffn_threshold);
        c->ffn_used = calloc((size_t)hp->n_layer * 2, sizeof *c->ffn_used);
        c->ffn_total = c->ffn_used ? c->ffn_used + hp->n_layer : NULL;
        if (c->down_t == NULL || c->ffn_threshold == NULL || c->ffn_used == NULL) {
            free(c->down_t);
            free(c->ffn_threshold);
            free(c->ffn_used);
            c->down_t = NULL;
            c->ffn_threshold = NULL;
            c->ffn_used = c->ffn_total = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the sparse FFN tables");
        }
    }
    if (down_t == NULL || down_t->data == NULL) {
        c->down_t[layer].data = NULL;
        return PI_OK;
    }
    char name[48];
    snprintf(name, sizeof name, "blk.%d.ffn_down_t", layer);
    const int32_t t = down_t->type;
    if (t != PI_TYPE_F32 && t != PI_TYPE_F16 && t != PI_TYPE_Q8_0 && t != PI_TYPE_Q4_0)
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: type %d, expected F32, F16, Q8_0 or Q4_0", name, t);
    int rc = check_tensor(down_t, name, hp->n_embd, hp->n_ff, 0);
    if (rc) return rc;
    const pi_mat *lm = &c->m->mats[layer * PI_L_COUNT];
    if (lm[PI_L_FFN_GATE].data == NULL && hp->act == PI_ACT_SILU)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: the sparse FFN of an ungated layer needs ReLU or GELU", layer);
    if (lm[PI_L_FFN_GATE].data != NULL && lm[PI_L_FFN_GATE].type != lm[PI_L_FFN_UP].type)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: ffn_gate and ffn_up types differ; the sparse FFN needs one",
                            layer);
    if (c->ffn_scratch == NULL) { /* sized for the largest activation row of any up type (= gate type) */
        int64_t need = 0;
        for (int i = 0; i < hp->n_layer; i++) {
            const int64_t s = pi_ffn_sparse_scratch_size(c->m->mats[i * PI_L_COUNT + PI_L_FFN_UP].type, hp->n_embd,
                                                         hp->n_ff, c->cp.n_batch);
            need = s > need ? s : need;
        }
        c->ffn_scratch = malloc((size_t)need);
        c->ffn_y = alloc_f((int64_t)c->cp.n_batch * hp->n_embd);
        c->ffn_used_tok = calloc((size_t)c->cp.n_batch, sizeof *c->ffn_used_tok);
        if (c->ffn_scratch == NULL || c->ffn_y == NULL || c->ffn_used_tok == NULL) {
            free(c->ffn_scratch);
            free(c->ffn_y);
            free(c->ffn_used_tok);
            c->ffn_scratch = NULL;
            c->ffn_y = NULL;
            c->ffn_used_tok = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the sparse FFN scratch");
        }
    }
    c->down_t[layer] = mat_of(down_t);
    c->ffn_threshold[layer] = threshold;
    return PI_OK;
}

int pi_context_ffn_stats(pi_context *c, int64_t *used, int64_t *total, int32_t reset) {
    if (c == NULL || used == NULL || total == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_ffn_stats: NULL argument");
    const int32_t n = c->m->hp.n_layer;
    for (int32_t l = 0; l < n; l++) {
        used[l] = c->ffn_used ? c->ffn_used[l] : 0;
        total[l] = c->ffn_used ? c->ffn_total[l] : 0;
    }
    if (reset && c->ffn_used) memset(c->ffn_used, 0, (size_t)n * 2 * sizeof *c->ffn_used);
    return PI_OK;
}

int pi_context_set_ffn_hist(pi_context *c, uint32_t *hist) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_hist: NULL context");
    c->ffn_hist = hist;
    return PI_OK;
}

int pi_context_set_ffn_threshold_on(pi_context *c, int32_t on) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_threshold_on: NULL context");
    if (on != PI_FFN_ON_PRODUCT && on != PI_FFN_ON_GATE)
        return pi_set_error(PI_ERR_INVALID, "threshold target must be 0 (product h) or 1 (gate activation), got %d", on);
    c->ffn_on_gate = on;
    return PI_OK;
}

int pi_context_set_ffn_predictor(pi_context *c, int32_t layer, const pi_tensor *fc1, const pi_tensor *fc2,
                                 float threshold) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_predictor: NULL context");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    if (isnan(threshold) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "blk.%d: predictor threshold must be finite, got %g", layer,
                            (double)threshold);
    if (c->pred_fc1 == NULL) {
        const int64_t B = c->cp.n_batch, F = hp->n_ff;
        c->pred_fc1 = calloc((size_t)hp->n_layer, sizeof *c->pred_fc1);
        c->pred_fc2 = calloc((size_t)hp->n_layer, sizeof *c->pred_fc2);
        c->pred_threshold = calloc((size_t)hp->n_layer, sizeof *c->pred_threshold);
        c->pred_scores = alloc_f(B * F);
        c->pred_active = malloc((size_t)(B * F) * sizeof *c->pred_active);
        c->pred_off = malloc((size_t)(B + 1) * sizeof *c->pred_off);
        c->pred_count = calloc((size_t)hp->n_layer * 3, sizeof *c->pred_count);
        if (!c->pred_fc1 || !c->pred_fc2 || !c->pred_threshold || !c->pred_scores || !c->pred_active ||
            !c->pred_off || !c->pred_count) {
            free(c->pred_fc1); free(c->pred_fc2); free(c->pred_threshold); free(c->pred_scores);
            free(c->pred_active); free(c->pred_off); free(c->pred_count);
            c->pred_fc1 = c->pred_fc2 = NULL;
            c->pred_threshold = NULL;
            c->pred_scores = NULL;
            c->pred_active = NULL;
            c->pred_off = c->pred_count = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the predictor tables");
        }
        c->pred_ns = c->pred_count + hp->n_layer;
        c->ffn_ns = c->pred_count + 2 * hp->n_layer;
    }
    if (fc1 == NULL || fc1->data == NULL) {
        c->pred_fc1[layer].data = NULL;
        return PI_OK;
    }
    char n1[48], n2[48];
    snprintf(n1, sizeof n1, "blk.%d.fc1.weight", layer);
    snprintf(n2, sizeof n2, "blk.%d.fc2.weight", layer);
    if (fc2 == NULL || fc2->data == NULL) return pi_set_error(PI_ERR_INVALID, "tensor %s: missing", n2);
    const int64_t rank = fc1->ne[1];
    if (rank < 1 || rank > hp->n_ff * 4)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: rank (ne[1]) %lld out of range [1, %lld]", n1,
                            (long long)rank, (long long)hp->n_ff * 4);
    int rc = check_tensor(fc1, n1, hp->n_embd, rank, 0);
    if (rc) return rc;
    if (fc2->ne[0] != rank)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: rank %lld does not match %s's rank %lld", n2,
                            (long long)fc2->ne[0], n1, (long long)rank);
    if ((rc = check_tensor(fc2, n2, rank, hp->n_ff, 0))) return rc;
    const pi_mat m1 = mat_of(fc1), m2 = mat_of(fc2);
    const int64_t need = pi_predictor_scratch_size(&m1, &m2, c->cp.n_batch);
    if (need > c->pred_scratch_size) {
        void *p = malloc((size_t)need);
        if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for the predictor scratch");
        free(c->pred_scratch);
        c->pred_scratch = p;
        c->pred_scratch_size = need;
    }
    c->pred_fc1[layer] = m1;
    c->pred_fc2[layer] = m2;
    c->pred_threshold[layer] = threshold;
    return PI_OK;
}

int pi_context_predictor_stats(pi_context *c, int64_t *predicted, int64_t *pred_ns, int64_t *ffn_ns,
                               int32_t reset) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_predictor_stats: NULL context");
    const int32_t n = c->m->hp.n_layer;
    for (int32_t l = 0; l < n; l++) {
        if (predicted) predicted[l] = c->pred_count ? c->pred_count[l] : 0;
        if (pred_ns) pred_ns[l] = c->pred_count ? c->pred_ns[l] : 0;
        if (ffn_ns) ffn_ns[l] = c->pred_count ? c->ffn_ns[l] : 0;
    }
    if (reset && c->pred_count) memset(c->pred_count, 0, (size_t)n * 3 * sizeof *c->pred_count);
    return PI_OK;
}

int pi_context_set_ffn_capture(pi_context *c, float *buf) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_capture: NULL context");
    c->ffn_capture = buf;
    return PI_OK;
}
