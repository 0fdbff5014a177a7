/* The forward pass of a decoder, top to bottom: pi_eval / pi_eval_seqs -> forward_rows ->
 * forward_layer -> the blocks (blocks/), or the context's device (device/device.h) for the
 * steps placed on it. */
#include <stdlib.h>

#include "blocks/blocks.h"
#include "device/device.h"

static void forward_layer(pi_context *c, int l, const int32_t *pos, const int32_t *cell0, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const int64_t E = hp->n_embd;
    pi_dev *dev = c->dev;

    /* attention block and the FFN's input norm: x += attn(norm(x)); xn = ffn_norm(x) */
    if (dev != NULL && dev->iface.attn(dev, c, l, pos, cell0, n_tok)) {
        pi_prof_lap(c, PI_PROF_DEVICE);
    } else {
        const size_t kv_off = (size_t)l * c->n_cells * c->kv_row * c->kv_esz;
        const pi_attn_site host = {c->pool, lt, lm, c->k_cache + kv_off, c->v_cache + kv_off, c->x, c->xn, c->q,
                                   c->k, c->v, c->attn, c->act_scratch, c->attn_scratch, c->rope_cs, c->rope_cs_swa,
                                   c->x_par};
        pi_attn_block(c, &host, l, pos, cell0, n_tok);
    }

    /* feed-forward block: down(act(gate x) * up x), or down(act(up x + b)) + b without a gate (Falcon, OPT);
     * split with the device when placed */
    if (c->ffn_capture)
        memcpy(c->ffn_capture + (size_t)l * c->cp.n_batch * E, c->xn, (size_t)(n_tok * E) * sizeof(float));
    if (dev != NULL && pi_ffn_split_layer(c, l, n_tok)) {
        pi_prof_lap(c, PI_PROF_DEVICE);
    } else if (c->down_t != NULL && c->down_t[l].data != NULL) {
        pi_ffn_sparse_layer(c, l, n_tok);
        pi_prof_lap(c, PI_PROF_FFN_SPARSE);
    } else {
        pi_ffn_dense(c, l, n_tok);
    }
}

/* token ids in [0, n_vocab) (name: the calling function, for the message) */
static int check_tokens(const pi_context *c, const char *name, const int32_t *tokens, int32_t n_tokens) {
    for (int32_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= c->m->hp.n_vocab)
            return pi_set_error(PI_ERR_INVALID, "%s: token %d at index %d is outside [0, %d)", name, tokens[i], i,
                                c->m->hp.n_vocab);
    return PI_OK;
}

/* OPT's learned positions end with its table: last = the highest position asked for */
static int check_learned_pos(const pi_context *c, const char *name, int32_t last) {
    const pi_model_params *hp = &c->m->hp;
    if (hp->pos_embd.data != NULL && last + (int64_t)hp->pos_offset >= hp->pos_embd.ne[1])
        return pi_set_error(PI_ERR_CONTEXT_FULL, "%s: position %d is past the model's %lld learned positions", name,
                            last, (long long)(hp->pos_embd.ne[1] - hp->pos_offset));
    return PI_OK;
}

/* logits_rows holds at least n rows */
static int reserve_rows(pi_context *c, int64_t n) {
    if (n <= c->rows_cap) return PI_OK;
    float *nl = pi_alloc_f(n * c->m->hp.n_vocab);
    if (nl == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for %lld rows of logits", (long long)n);
    free(c->logits_rows);
    c->logits_rows = nl;
    c->rows_cap = n;
    return PI_OK;
}

/* c's row groups for a device step over n_rows rows: runs of equal key[t] (NULL: one group),
 * or each row alone (key ignored) */
static void set_groups(pi_context *c, const int32_t *key, int64_t n_rows, int each_row) {
    c->n_grp = 0;
    c->grp_off[0] = 0;
    for (int64_t t = 1; t <= n_rows; t++)
        if (t == n_rows || each_row || (key != NULL && key[t] != key[t - 1])) c->grp_off[++c->n_grp] = t;
}

/* Embeddings, then every layer, over n_tokens rows at positions pos (token t in the slot
 * starting at cell0[t]; NULL: sequence 0). Returns the device's error, if any. */
static int forward_rows(pi_context *c, const int32_t *tokens, const int32_t *pos, const int32_t *cell0,
                        int32_t n_tokens) {
    const pi_model_params *hp = &c->m->hp;
    const int64_t E = hp->n_embd;
    const pi_mat *te = &c->m->tok_embd;
    const int64_t te_row = pi_row_size(te->type, E);
    pi_prof_start(c);
    set_groups(c, cell0, n_tokens, 0); /* a device's steps run per sequence */
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

    pi_prof_lap(c, PI_PROF_EMBED);
    if (hp->rope_type != PI_ROPE_NONE)
        pi_rope_cache(n_tokens, hp->n_rot, pos, hp->rope_freq_base, hp->rope_freq_scale, hp->rope_freqs.data,
                      c->rope_cs); /* once per batch, shared by every layer's q and k */
    if (hp->n_swa > 0) /* the local layers' RoPE base (Gemma 3: 10000 against 1e6 globally) */
        pi_rope_cache(n_tokens, hp->n_rot, pos, hp->rope_freq_base_swa, hp->rope_freq_scale_swa, hp->rope_freqs.data,
                      c->rope_cs_swa);
    pi_prof_lap(c, PI_PROF_ROPE_CACHE);
    const int64_t passes0 = pi_weight_passes;
    for (int l = 0; l < hp->n_layer; l++) forward_layer(c, l, pos, cell0, n_tokens);
    c->matmul_calls += pi_weight_passes - passes0;
    return c->dev != NULL ? c->dev->iface.error(c->dev) : PI_OK;
}

/* logits (n_out rows) of the n_out final hidden rows xo */
static void output_rows(pi_context *c, const float *xo, int64_t n_out) {
    const pi_model_params *hp = &c->m->hp;
    c->n_out = (int32_t)n_out;
    if (c->dev != NULL && c->dev->iface.output(c->dev, c, xo, n_out, c->logits)) {
        pi_prof_lap(c, PI_PROF_DEVICE);
    } else {
        const int64_t passes0 = pi_weight_passes;
        pi_norm_rows(hp, xo, &hp->output_norm, &hp->output_norm_b, n_out, c->embd);
        pi_matmul1(c, &c->m->output, c->embd, n_out, c->logits);
        c->matmul_calls += pi_weight_passes - passes0;
        pi_prof_lap(c, PI_PROF_OUTPUT);
    }
}

int pi_eval(pi_context *c, const int32_t *tokens, const int32_t *pos, int32_t n_tokens, int32_t logits_all) {
    if (c == NULL || tokens == NULL || pos == NULL) return pi_set_error(PI_ERR_INVALID, "pi_eval: NULL argument");
    if (n_tokens < 1) return pi_set_error(PI_ERR_INVALID, "pi_eval: n_tokens must be >= 1, got %d", n_tokens);
    if (n_tokens > c->cp.n_batch)
        return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval: %d tokens exceed n_batch %d", n_tokens, c->cp.n_batch);
    int32_t *used = &c->seq_used[0];
    if (pos[0] < 0 || pos[0] > *used)
        return pi_set_error(PI_ERR_INVALID, "pi_eval: pos[0] = %d, must be in [0, %d] (cached positions)", pos[0],
                            *used);
    for (int32_t i = 0; i < n_tokens; i++)
        if (pos[i] != pos[0] + i)
            return pi_set_error(PI_ERR_INVALID, "pi_eval: positions must be consecutive (pos[%d] = %d)", i, pos[i]);
    int rc = check_tokens(c, "pi_eval", tokens, n_tokens);
    if (rc) return rc;
    if (pos[n_tokens - 1] >= c->n_ctx_seq)
        return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval: position %d exceeds the context window of %d",
                            pos[n_tokens - 1], c->n_ctx_seq);
    if ((rc = check_learned_pos(c, "pi_eval", pos[n_tokens - 1]))) return rc;
    /* logits_all < 0: a prompt chunk whose outputs nobody reads - skip the output layer */
    const int64_t n_out = logits_all > 0 ? n_tokens : logits_all == 0 ? 1 : 0;
    if (logits_all > 0 && (rc = reserve_rows(c, n_out))) return rc;
    *used = pos[0]; /* positions past pos[0] are overwritten now */
    if ((rc = forward_rows(c, tokens, pos, NULL, n_tokens)))
        return rc; /* the cache past pos[0] is invalid: the count stays at pos[0] */
    *used = pos[n_tokens - 1] + 1;

    c->n_out = (int32_t)n_out;
    if (n_out == 0) return PI_OK;
    c->logits = logits_all > 0 ? c->logits_rows : c->logits1;
    set_groups(c, NULL, n_out, 0);
    output_rows(c, c->x + (n_tokens - n_out) * c->m->hp.n_embd, n_out);
    return PI_OK;
}

int pi_eval_seqs(pi_context *c, const int32_t *tokens, const int32_t *seq, const int32_t *n_item_tokens,
                 int32_t n_items, int32_t logits_all) {
    if (c == NULL || tokens == NULL || seq == NULL || n_item_tokens == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_eval_seqs: NULL argument");
    if (n_items < 1 || n_items > c->n_seq)
        return pi_set_error(PI_ERR_INVALID, "pi_eval_seqs: n_items must be in [1, %d] (n_seq_max), got %d", c->n_seq,
                            n_items);
    int64_t n_tokens = 0;
    for (int32_t i = 0; i < n_items; i++) {
        const int32_t s = seq[i], n = n_item_tokens[i];
        if (s < 0 || s >= c->n_seq)
            return pi_set_error(PI_ERR_INVALID, "pi_eval_seqs: item %d: seq %d is outside [0, %d) (n_seq_max)", i, s,
                                c->n_seq);
        for (int32_t j = 0; j < i; j++)
            if (seq[j] == s)
                return pi_set_error(PI_ERR_INVALID, "pi_eval_seqs: seq %d appears in items %d and %d (once per call)",
                                    s, j, i);
        if (n < 1) return pi_set_error(PI_ERR_INVALID, "pi_eval_seqs: item %d: %d tokens, must be >= 1", i, n);
        if ((int64_t)c->seq_used[s] + n > c->n_ctx_seq)
            return pi_set_error(PI_ERR_CONTEXT_FULL,
                                "pi_eval_seqs: seq %d would hold %lld tokens, more than n_ctx_seq %d", s,
                                (long long)c->seq_used[s] + n, c->n_ctx_seq);
        n_tokens += n;
        if (n_tokens > c->cp.n_batch)
            return pi_set_error(PI_ERR_CONTEXT_FULL, "pi_eval_seqs: more than n_batch %d tokens", c->cp.n_batch);
    }
    int rc = check_tokens(c, "pi_eval_seqs", tokens, (int32_t)n_tokens);
    if (rc) return rc;
    for (int32_t i = 0, t = 0; i < n_items; i++)
        for (int32_t k = 0; k < n_item_tokens[i]; k++, t++) {
            c->tok_pos[t] = c->seq_used[seq[i]] + k;
            c->tok_cell0[t] = (int32_t)(seq[i] * c->seq_cells);
            if (k == n_item_tokens[i] - 1 && (rc = check_learned_pos(c, "pi_eval_seqs", c->tok_pos[t]))) return rc;
        }
    if ((rc = reserve_rows(c, logits_all > 0 ? n_tokens : n_items))) return rc;
    if ((rc = forward_rows(c, tokens, c->tok_pos, c->n_seq > 1 ? c->tok_cell0 : NULL, (int32_t)n_tokens)))
        return rc; /* nothing counted: each sequence keeps its cached positions */
    /* each item's last row, gathered for one output product (xn is free after the last layer) */
    const int64_t E = c->m->hp.n_embd;
    for (int32_t i = 0, end = 0; i < n_items; i++) {
        end += n_item_tokens[i];
        c->seq_used[seq[i]] += n_item_tokens[i];
        if (logits_all <= 0) memcpy(c->xn + i * E, c->x + (int64_t)(end - 1) * E, (size_t)E * sizeof(float));
    }
    c->logits = c->logits_rows;
    if (logits_all <= 0) set_groups(c, NULL, n_items, 1); /* one row per item; else the items' rows as forward_rows */
    output_rows(c, logits_all > 0 ? c->x : c->xn, logits_all > 0 ? n_tokens : n_items);
    return PI_OK;
}
