/* The forward pass of a decoder, top to bottom: pi_eval -> forward_layer -> the blocks
 * (blocks/), or the context's device (device/device.h) for the steps placed on it. */
#include <stdlib.h>

#include "blocks/blocks.h"
#include "device/device.h"

static void forward_layer(pi_context *c, int l, const int32_t *pos, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const int64_t E = hp->n_embd;
    pi_dev *dev = c->dev;

    /* attention block and the FFN's input norm: x += attn(norm(x)); xn = ffn_norm(x) */
    if (dev != NULL && dev->iface.submit_attn(dev, c, l, pos, n_tok)) {
        dev->iface.wait(dev, c);
    } else {
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
    if (dev != NULL && dev->iface.submit_ffn(dev, c, l, n_tok)) {
        dev->iface.wait(dev, c);
        pi_ffn_sparse_done(c, l, n_tok);
    } else if (c->down_t != NULL && c->down_t[l].data != NULL) {
        pi_ffn_sparse_layer(c, l, n_tok);
    } else {
        pi_ffn_dense(c, l, n_tok);
    }
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
        float *nl = pi_alloc_f(n_out * hp->n_vocab);
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
            pi_add_rows(c->x + t * E, c->xn, E);
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
    const int rc = c->dev != NULL ? c->dev->iface.error(c->dev) : PI_OK;
    if (rc) return rc; /* the cache past pos[0] is invalid: kv_used stays at pos[0] */
    c->kv_used = pos[n_tokens - 1] + 1;

    c->n_out = (int32_t)n_out;
    if (n_out == 0) return PI_OK;
    const float *xo = c->x + (n_tokens - n_out) * E;
    c->logits = logits_all > 0 ? c->logits_rows : c->logits1;
    if (c->dev != NULL && c->dev->iface.submit_output(c->dev, c, xo, n_out, c->logits)) {
        c->dev->iface.wait(c->dev, c);
    } else {
        pi_norm_rows(hp, xo, &hp->output_norm, &hp->output_norm_b, n_out, c->embd);
        pi_matmul1(c, &c->m->output, c->embd, n_out, c->logits);
    }
    return PI_OK;
}
