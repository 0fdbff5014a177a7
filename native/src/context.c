/* Context lifetime: buffers, KV cache, accessors of the last eval (pi_eval is in forward.c). */
#include <stdlib.h>

#include "context.h"
#include "device/device.h"

void pi_context_free(pi_context *c) {
    if (c == NULL) return;
    if (c->dev != NULL) c->dev->iface.free(c->dev);
    pi_pool_free(c->pool);
    free(c->k_cache);
    free(c->seq_used);
    free(c->tok_pos);
    free(c->tok_cell0);
    free(c->grp_off);
    free(c->v_cache);
    float *bufs[] = {c->x, c->xn, c->q, c->k, c->v, c->attn, c->g, c->u, c->attn_scratch, c->logits1, c->logits_rows,
                     c->embd, c->rope_cs, c->rope_cs_swa, c->x_par};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    free(c->act_scratch);
    free(c->down_t);
    free(c->ffn_threshold);
    free(c->ffn_dense_down);
    free(c->ffn_hd);
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
    free(c->prof);
    free(c);
}

int pi_context_create(pi_model *m, const pi_context_params *cp, pi_context **out) {
    if (m == NULL || cp == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_create: NULL argument");
    *out = NULL;
    if (cp->n_ctx < 1 || cp->n_ctx > (1 << 24))
        return pi_set_error(PI_ERR_INVALID, "n_ctx must be in [1, 16777216], got %d", cp->n_ctx);
    if (cp->n_batch < 1 || cp->n_batch > (1 << 20))
        return pi_set_error(PI_ERR_INVALID, "n_batch must be in [1, 1048576], got %d", cp->n_batch);
    const int32_t n_seq = cp->n_seq_max == 0 ? 1 : cp->n_seq_max;
    if (n_seq < 1 || n_seq > PI_SEQ_MAX || n_seq > cp->n_ctx)
        return pi_set_error(PI_ERR_INVALID, "n_seq_max must be in [1, min(%d, n_ctx %d)], got %d", PI_SEQ_MAX,
                            cp->n_ctx, cp->n_seq_max);
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
    c->n_seq = n_seq;
    c->n_ctx_seq = cp->n_ctx / n_seq;
    /* each slot padded on its own, so a sequence's padded V blocks stay inside its slot and
     * sum as they would in a context of n_ctx_seq cells (one sequence: today's layout) */
    c->seq_cells = pi_align_up(c->n_ctx_seq, PI_KV_PAD);
    c->n_cells = n_seq * c->seq_cells;
    c->seq_used = calloc((size_t)n_seq, sizeof *c->seq_used);
    c->tok_pos = malloc((size_t)B * sizeof *c->tok_pos);
    c->tok_cell0 = malloc((size_t)B * sizeof *c->tok_cell0);
    c->grp_off = malloc((size_t)(B + 1) * sizeof *c->grp_off);
    const size_t kv_bytes = (size_t)hp->n_layer * (size_t)c->n_cells * (size_t)c->kv_row * c->kv_esz;
    c->k_cache = calloc(1, kv_bytes);
    c->v_cache = calloc(1, kv_bytes); /* zeroed: V dot products read whole padded blocks */
    c->x = pi_alloc_f(B * E);
    c->xn = pi_alloc_f(B * E);
    c->q = pi_alloc_f(B * Q);
    c->k = pi_alloc_f(B * c->kv_row);
    c->v = pi_alloc_f(B * c->kv_row);
    c->attn = pi_alloc_f(B * Q);
    c->g = pi_alloc_f(B * hp->n_ff);
    c->u = pi_alloc_f(B * hp->n_ff);
    c->embd = pi_alloc_f(B * E);
    c->act_scratch = malloc((size_t)(m->max_act_row * B + m->max_act_fixed));
    c->attn_scratch = pi_alloc_f(pi_attention_scratch_floats(c->n_cells, hp->n_embd_head) * cp->n_threads);
    c->logits1 = pi_alloc_f(hp->n_vocab);
    c->rope_cs = pi_alloc_f(B * hp->n_rot);
    c->rope_cs_swa = hp->n_swa > 0 ? pi_alloc_f(B * hp->n_rot) : NULL;
    c->x_par = hp->parallel_residual ? pi_alloc_f(B * E) : NULL;
    if (!c->k_cache || !c->v_cache || !c->seq_used || !c->tok_pos || !c->tok_cell0 || !c->grp_off || !c->x || !c->xn || !c->q ||
        !c->k || !c->v || !c->attn || !c->g || !c->u || !c->embd || !c->act_scratch || !c->attn_scratch ||
        !c->logits1 || !c->rope_cs ||
        (hp->n_swa > 0 && c->rope_cs_swa == NULL) || (hp->parallel_residual && c->x_par == NULL)) {
        pi_context_free(c);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for a context of n_ctx %d (KV cache %zu bytes)",
                            cp->n_ctx, 2 * kv_bytes);
    }
    *out = c;
    return PI_OK;
}

const float *pi_get_logits(pi_context *c) { return c != NULL && c->n_out > 0 ? c->logits : NULL; }
const float *pi_get_logits_buffer(pi_context *c) { return c != NULL ? c->logits1 : NULL; }
const float *pi_get_embeddings(pi_context *c) { return c != NULL && c->n_out > 0 ? c->embd : NULL; }
int32_t pi_n_outputs(const pi_context *c) { return c != NULL ? c->n_out : 0; }
int32_t pi_kv_used(const pi_context *c) { return c != NULL ? c->seq_used[0] : 0; }
int32_t pi_n_seq_max(const pi_context *c) { return c != NULL ? c->n_seq : 0; }
int32_t pi_n_ctx_seq(const pi_context *c) { return c != NULL ? c->n_ctx_seq : 0; }
int32_t pi_seq_used(const pi_context *c, int32_t seq) {
    return c != NULL && seq >= 0 && seq < c->n_seq ? c->seq_used[seq] : -1;
}

int pi_seq_truncate(pi_context *c, int32_t seq, int32_t n_keep) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_seq_truncate: NULL context");
    if (seq < 0 || seq >= c->n_seq)
        return pi_set_error(PI_ERR_INVALID, "seq %d is outside [0, %d) (n_seq_max)", seq, c->n_seq);
    if (n_keep < 0) return pi_set_error(PI_ERR_INVALID, "n_keep must be >= 0, got %d", n_keep);
    if (n_keep < c->seq_used[seq]) c->seq_used[seq] = n_keep;
    return PI_OK;
}

int pi_kv_truncate(pi_context *c, int32_t n_keep) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_kv_truncate: NULL context");
    if (n_keep < 0) return pi_set_error(PI_ERR_INVALID, "pi_kv_truncate: n_keep must be >= 0, got %d", n_keep);
    return pi_seq_truncate(c, 0, n_keep);
}

int64_t pi_context_matmul_calls(pi_context *c, int32_t reset) {
    if (c == NULL) return 0;
    const int64_t n = c->matmul_calls;
    if (reset) c->matmul_calls = 0;
    return n;
}
