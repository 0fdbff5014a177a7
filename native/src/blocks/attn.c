/* The attention block of a layer, run by the forward pass on the host or by a device on its copies. */
#include "blocks.h"

/* Store this batch's K rows, and V columns (V is cached transposed), token t in cell
 * cell0[t] + pos[t] (cell0 NULL: sequence 0's slot). */
static void store_kv(const pi_context *c, const pi_attn_site *s, const int32_t *pos, const int32_t *cell0,
                     int64_t n_tok) {
    const int64_t R = c->kv_row, N = c->n_cells;
    const pi_isa *isa = pi_isa_current();
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t cell = (cell0 != NULL ? cell0[t] : 0) + pos[t];
        isa->from_float[c->cp.kv_type](s->k + t * R, s->kc + (size_t)cell * R * c->kv_esz, R);
        for (int64_t e = 0; e < R; e++) {
            const float val = s->v[t * R + e];
            const size_t at = (size_t)(e * N + cell);
            if (c->cp.kv_type == PI_TYPE_F16)
                ((uint16_t *)s->vc)[at] = pi_fp32_to_fp16(val);
            else
                ((float *)s->vc)[at] = val;
        }
    }
}

void pi_norm_rows(const pi_model_params *hp, const float *x, const pi_tensor *w, const pi_tensor *b, int64_t n_rows,
                  float *y) {
    if (hp->layer_norm)
        pi_layernorm_rows(x, w->data, b->data, hp->n_embd, n_rows, hp->rms_eps, y);
    else
        pi_rmsnorm_rows(x, w->data, hp->n_embd, n_rows, hp->rms_eps, y);
}

/* sliding-window (local) layer? see pi_model_params.swa_pattern */
static int is_swa(const pi_model_params *hp, int l) {
    return hp->n_swa > 0 && (hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1);
}

void pi_attn_block(const pi_context *c, const pi_attn_site *s, int l, const int32_t *pos, const int32_t *cell0,
                   int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = s->lt;
    const pi_mat *lm = s->lm;
    const int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->n_embd_head, R = c->kv_row;
    const int64_t H = hp->n_embd_head;
    const int swa = is_swa(hp, l);

    /* optional pieces: Qwen2/OPT biases, Gemma q/k norms, post-norm */
    if (hp->parallel_residual) /* Falcon: the FFN reads the layer input, not x + attention */
        memcpy(s->x_par, s->x, (size_t)(n_tok * E) * sizeof(float));
    pi_norm_rows(hp, s->x, &lt[PI_L_ATTN_NORM], &lt[PI_L_ATTN_NORM_B], n_tok, s->xn);
    pi_prof_lap(c, PI_PROF_NORM);
    const pi_matmul_out qkv[3] = {{&lm[PI_L_ATTN_Q], s->q, Q}, {&lm[PI_L_ATTN_K], s->k, R}, {&lm[PI_L_ATTN_V], s->v, R}};
    pi_matmul_multi(s->pool, qkv, 3, s->xn, n_tok, s->act_scratch);
    pi_bias_opt(&lt[PI_L_ATTN_Q_BIAS], s->q, Q, n_tok);
    pi_bias_opt(&lt[PI_L_ATTN_K_BIAS], s->k, R, n_tok);
    pi_bias_opt(&lt[PI_L_ATTN_V_BIAS], s->v, R, n_tok);
    pi_norm_opt(&lt[PI_L_ATTN_Q_NORM], s->q, H, n_tok * hp->n_head, hp->rms_eps);
    pi_norm_opt(&lt[PI_L_ATTN_K_NORM], s->k, H, n_tok * hp->n_head_kv, hp->rms_eps);
    pi_prof_lap(c, PI_PROF_QKV);
    const float *cs = swa ? s->rope_cs_swa : s->rope_cs;
    if (hp->rope_type != PI_ROPE_NONE) { /* OPT: learned positions were added to the embeddings */
        pi_rope_apply(s->q, n_tok, hp->n_head, hp->n_embd_head, hp->n_rot, cs, hp->rope_type);
        pi_rope_apply(s->k, n_tok, hp->n_head_kv, hp->n_embd_head, hp->n_rot, cs, hp->rope_type);
    }
    pi_prof_lap(c, PI_PROF_ROPE);
    float scale = 1.0f / sqrtf((float)hp->n_embd_head);
    if (hp->attn_scale > 0.0f) { /* Gemma: q scaled before attention, scores unscaled */
        for (int64_t i = 0; i < n_tok * Q; i++) s->q[i] *= hp->attn_scale;
        scale = 1.0f;
    }
    store_kv(c, s, pos, cell0, n_tok);
    int32_t n_kv = pos[n_tok - 1] + 1; /* one sequence: its last position; several: the furthest */
    if (cell0 != NULL)
        for (int64_t t = 0; t < n_tok; t++) n_kv = pos[t] + 1 > n_kv ? pos[t] + 1 : n_kv;
    pi_attention(s->pool, s->q, n_tok, hp->n_head, hp->n_head_kv, hp->n_embd_head, s->kc, s->vc, c->n_cells,
                 c->cp.kv_type, n_kv, pos, cell0, scale, swa ? hp->n_swa : 0, s->attn, s->attn_scratch);
    pi_prof_lap(c, PI_PROF_ATTN);
    const pi_matmul_out o = {&lm[PI_L_ATTN_OUT], s->xn, E};
    pi_matmul_multi(s->pool, &o, 1, s->attn, n_tok, s->act_scratch);
    pi_bias_opt(&lt[PI_L_ATTN_OUT_BIAS], s->xn, E, n_tok);
    pi_norm_opt(&lt[PI_L_ATTN_POST_NORM], s->xn, E, n_tok, hp->rms_eps);
    pi_add_rows(s->x, s->xn, n_tok * E);
    pi_prof_lap(c, PI_PROF_ATTN_OUT);
    /* the FFN's input */
    pi_norm_rows(hp, hp->parallel_residual ? s->x_par : s->x, &lt[PI_L_FFN_NORM], &lt[PI_L_FFN_NORM_B], n_tok, s->xn);
    pi_prof_lap(c, PI_PROF_NORM);
}
