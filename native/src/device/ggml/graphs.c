/* The device steps as ggml graphs, mirroring blocks/attn.c and blocks/ffn.c in math. */
#include <math.h>

#include "device/ggml/graphs.h"

int pi_gg_is_swa(const pi_model_params *hp, int l) {
    return hp->n_swa > 0 && (hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1);
}

size_t pi_gg_meta_bytes(const pi_ggml_api *g) {
    return g->tensor_overhead() * PI_GG_GRAPH_NODES + g->graph_overhead_custom(PI_GG_GRAPH_NODES, false);
}

gctx *pi_gg_meta(const pi_ggml_api *g, void *buf) {
    return g->init((pi_ggml_init_params){pi_gg_meta_bytes(g), buf, true});
}

static gt *input(const pi_ggml_api *g, gctx *ctx, int type, int64_t ne0, int64_t ne1) {
    gt *t = g->new_tensor_2d(ctx, type, ne0, ne1);
    g->set_input(t);
    return t;
}

/* every graph: a fresh io, its graph, and its F32 input x of n_tok rows of n_embd */
static void begin(const pi_ggml_api *g, gctx *ctx, int64_t n_embd, int64_t n_tok, pi_gg_io *io) {
    memset(io, 0, sizeof *io);
    io->gf = g->new_graph_custom(ctx, PI_GG_GRAPH_NODES, false);
    io->x = input(g, ctx, PI_G_TYPE_F32, n_embd, n_tok);
}

/* the model's norm of rows x: RMSNorm, or LayerNorm (+ bias) with pi_model_params.layer_norm; then * w */
static gt *norm(const pi_ggml_api *g, gctx *ctx, const pi_model_params *hp, gt *x, gt *w, gt *b) {
    gt *y = hp->layer_norm ? g->norm(ctx, x, hp->rms_eps) : g->rms_norm(ctx, x, hp->rms_eps);
    y = g->mul(ctx, y, w);
    return b != NULL ? g->add(ctx, y, b) : y;
}

static gt *add_opt(const pi_ggml_api *g, gctx *ctx, gt *x, gt *b) { return b != NULL ? g->add(ctx, x, b) : x; }

/* RMSNorm of each head (Gemma's q/k norms), x [head, n_heads, n_tok] */
static gt *head_norm(const pi_ggml_api *g, gctx *ctx, float eps, gt *x, gt *w) {
    return w != NULL ? g->mul(ctx, g->rms_norm(ctx, x, eps), w) : x;
}

/* the attention of q [H, n_head, n_tok] over the n_kv cells from cell0 of the layer's cache -> [H * n_head, n_tok] */
static gt *attend(const pi_ggml_api *g, gctx *ctx, const pi_context *c, const pi_gg_layer *L, gt *q, gt *mask,
                  int64_t n_tok, int64_t cell0, int64_t n_kv, float scale, int flash) {
    const pi_model_params *hp = &c->m->hp;
    const int64_t H = hp->n_embd_head, esz = (int64_t)c->kv_esz, row = c->kv_row * esz;
    /* [H, n_kv, n_head_kv] views of the caches (one row per cell) */
    gt *k = g->view_3d(ctx, L->k, H, n_kv, hp->n_head_kv, (size_t)row, (size_t)(H * esz), (size_t)(cell0 * row));
    gt *v = g->view_3d(ctx, L->v, H, n_kv, hp->n_head_kv, (size_t)row, (size_t)(H * esz), (size_t)(cell0 * row));
    q = g->permute(ctx, q, 0, 2, 1, 3); /* [H, n_tok, n_head] */
    gt *o;
    if (flash) {
        o = g->flash_attn_ext(ctx, q, k, v, g->cast(ctx, mask, PI_G_TYPE_F16), scale, 0.0f, 0.0f); /* [H, n_head, n_tok] */
    } else {
        gt *kq = g->mul_mat(ctx, k, q); /* [n_kv, n_tok, n_head] */
        kq = g->soft_max_ext(ctx, kq, mask, scale, 0.0f);
        gt *vt = g->cont(ctx, g->permute(ctx, v, 1, 0, 2, 3)); /* [n_kv, H, n_head_kv] */
        o = g->mul_mat(ctx, vt, kq);                          /* [H, n_tok, n_head] */
        o = g->cont(ctx, g->permute(ctx, o, 0, 2, 1, 3));      /* [H, n_head, n_tok] */
    }
    return g->reshape_2d(ctx, o, H * hp->n_head, n_tok);
}

int pi_gg_attn(const pi_ggml_api *g, gctx *ctx, const pi_context *c, int l, const pi_gg_layer *L, int64_t n_tok,
               int64_t cell0, int64_t n_kv, int flash, pi_gg_io *io) {
    const pi_model_params *hp = &c->m->hp;
    const int64_t E = hp->n_embd, H = hp->n_embd_head, R = c->kv_row;
    gt *const *w = L->w;
    begin(g, ctx, E, n_tok, io);
    io->kv_idx = input(g, ctx, PI_G_TYPE_I64, n_tok, 1);
    io->mask = input(g, ctx, PI_G_TYPE_F32, n_kv, n_tok);
    gt *cur = norm(g, ctx, hp, io->x, w[PI_L_ATTN_NORM], w[PI_L_ATTN_NORM_B]);
    gt *q = add_opt(g, ctx, g->mul_mat(ctx, w[PI_L_ATTN_Q], cur), w[PI_L_ATTN_Q_BIAS]);
    gt *k = add_opt(g, ctx, g->mul_mat(ctx, w[PI_L_ATTN_K], cur), w[PI_L_ATTN_K_BIAS]);
    gt *v = add_opt(g, ctx, g->mul_mat(ctx, w[PI_L_ATTN_V], cur), w[PI_L_ATTN_V_BIAS]);
    q = head_norm(g, ctx, hp->rms_eps, g->reshape_3d(ctx, q, H, hp->n_head, n_tok), w[PI_L_ATTN_Q_NORM]);
    k = head_norm(g, ctx, hp->rms_eps, g->reshape_3d(ctx, k, H, hp->n_head_kv, n_tok), w[PI_L_ATTN_K_NORM]);
    if (hp->rope_type != PI_ROPE_NONE) {
        const int swa = pi_gg_is_swa(hp, l);
        const float base = swa ? hp->rope_freq_base_swa : hp->rope_freq_base;
        const float fscale = swa ? hp->rope_freq_scale_swa : hp->rope_freq_scale;
        io->pos = input(g, ctx, PI_G_TYPE_I32, n_tok, 1);
        if (hp->rope_freqs.data != NULL) io->freqs = input(g, ctx, PI_G_TYPE_F32, hp->n_rot / 2, 1);
        /* no YaRN: ext_factor 0, attn_factor 1 (beta_fast / beta_slow unused then) */
        q = g->rope_ext(ctx, q, io->pos, io->freqs, hp->n_rot, hp->rope_type, hp->n_ctx_train, base, fscale, 0.0f,
                        1.0f, 32.0f, 1.0f);
        k = g->rope_ext(ctx, k, io->pos, io->freqs, hp->n_rot, hp->rope_type, hp->n_ctx_train, base, fscale, 0.0f,
                        1.0f, 32.0f, 1.0f);
    }
    float scale = 1.0f / sqrtf((float)H);
    if (hp->attn_scale > 0.0f) { /* Gemma: q scaled before attention, scores unscaled */
        q = g->scale(ctx, q, hp->attn_scale);
        scale = 1.0f;
    }
    /* this batch's K and V rows into cells pos[t], before the attention reads the cache */
    g->build_forward_expand(io->gf, g->set_rows(ctx, L->k, g->reshape_2d(ctx, k, R, n_tok), io->kv_idx));
    g->build_forward_expand(io->gf, g->set_rows(ctx, L->v, v, io->kv_idx));
    gt *a = attend(g, ctx, c, L, q, io->mask, n_tok, cell0, n_kv, scale, flash);
    gt *o = add_opt(g, ctx, g->mul_mat(ctx, w[PI_L_ATTN_OUT], a), w[PI_L_ATTN_OUT_BIAS]);
    if (w[PI_L_ATTN_POST_NORM] != NULL) o = g->mul(ctx, g->rms_norm(ctx, o, hp->rms_eps), w[PI_L_ATTN_POST_NORM]);
    gt *x = g->add(ctx, io->x, o);
    /* the FFN's input: norm of x + attention, or of the layer input with a parallel residual */
    gt *xn = norm(g, ctx, hp, hp->parallel_residual ? io->x : x, w[PI_L_FFN_NORM], w[PI_L_FFN_NORM_B]);
    g->set_output(x);
    g->set_output(xn);
    g->build_forward_expand(io->gf, x);
    g->build_forward_expand(io->gf, xn);
    io->out0 = x;
    io->out1 = xn;
    return PI_OK;
}

int pi_gg_ffn(const pi_ggml_api *g, gctx *ctx, const pi_context *c, const pi_gg_hot *Hn, int64_t n_tok, int h_only,
              int64_t n_sel, pi_gg_io *io) {
    const pi_model_params *hp = &c->m->hp;
    const int64_t E = hp->n_embd;
    begin(g, ctx, E, n_tok, io);
    gt *gx, *ux; /* [n_hot or n_sel, n_tok] */
    if (n_sel > 0) { /* each hot row a one-row "expert": only the selected rows are read */
        io->ids = input(g, ctx, PI_G_TYPE_I32, n_sel, n_tok);
        gt *x3 = g->reshape_3d(ctx, io->x, E, 1, n_tok);
        gx = g->mul_mat_id(ctx, g->reshape_3d(ctx, Hn->gate, E, 1, Hn->n_hot), x3, io->ids);
        ux = g->mul_mat_id(ctx, g->reshape_3d(ctx, Hn->up, E, 1, Hn->n_hot), x3, io->ids);
        gx = g->reshape_2d(ctx, gx, n_sel, n_tok);
        ux = g->reshape_2d(ctx, ux, n_sel, n_tok);
    } else {
        gx = g->mul_mat(ctx, Hn->gate, io->x);
        ux = g->mul_mat(ctx, Hn->up, io->x);
    }
    if (h_only) { /* the host takes the products (its activation, then its dense down) */
        io->out0 = gx;
        io->out1 = ux;
        g->set_output(gx);
        g->set_output(ux);
        g->build_forward_expand(io->gf, gx);
        g->build_forward_expand(io->gf, ux);
        return PI_OK;
    }
    gt *h;
    switch (hp->act) {
    case PI_ACT_SILU: h = g->mul(ctx, g->silu(ctx, gx), ux); break;
    case PI_ACT_GELU: h = g->mul(ctx, g->gelu(ctx, gx), ux); break;
    case PI_ACT_RELU: h = g->mul(ctx, g->relu(ctx, gx), ux); break;
    case PI_ACT_DRELU: h = g->mul(ctx, g->relu(ctx, gx), g->relu(ctx, ux)); break;
    default: return pi_set_error(PI_ERR_UNSUPPORTED, "ggml device: FFN activation %d", hp->act);
    }
    if (n_sel >= 0) { /* each down column's h through the map: its neuron's when selected, else the zero row */
        const int64_t k = n_sel > 0 ? n_sel : Hn->n_hot;
        io->map = input(g, ctx, PI_G_TYPE_I32, Hn->n_down, n_tok);
        gt *hz = g->pad(ctx, g->reshape_3d(ctx, h, 1, k, n_tok), 0, 1, 0, 0); /* [1, k + 1, n_tok], row k = 0 */
        h = g->reshape_2d(ctx, g->get_rows(ctx, hz, io->map), Hn->n_down, n_tok);
    } else if (Hn->n_down > Hn->n_hot) {
        h = g->pad(ctx, h, (int)(Hn->n_down - Hn->n_hot), 0, 0, 0); /* zeros */
    }
    io->out0 = g->mul_mat(ctx, Hn->down, h); /* [n_embd, n_tok] */
    g->set_output(io->out0);
    g->build_forward_expand(io->gf, io->out0);
    return PI_OK;
}

int pi_gg_output_graph(const pi_ggml_api *g, gctx *ctx, const pi_context *c, const pi_gg_output *O, int64_t n_out,
                       pi_gg_io *io) {
    const pi_model_params *hp = &c->m->hp;
    begin(g, ctx, hp->n_embd, n_out, io);
    io->out0 = norm(g, ctx, hp, io->x, O->norm, O->norm_b);
    io->out1 = g->mul_mat(ctx, O->out, io->out0); /* [n_vocab, n_out] */
    g->set_output(io->out0);
    g->set_output(io->out1);
    g->build_forward_expand(io->gf, io->out0);
    g->build_forward_expand(io->gf, io->out1);
    return PI_OK;
}

void pi_gg_fill_mask(const pi_context *c, int l, const int32_t *pos, int64_t n_tok, int64_t n_kv, float *mask) {
    const pi_model_params *hp = &c->m->hp;
    const int swa = pi_gg_is_swa(hp, l);
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t lo = swa ? (int64_t)pos[t] - hp->n_swa + 1 : 0; /* the window: keys > pos - n_swa */
        for (int64_t j = 0; j < n_kv; j++) mask[t * n_kv + j] = j <= pos[t] && j >= lo ? 0.0f : -INFINITY;
    }
}
