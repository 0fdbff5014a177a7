/* The device tensors of a plan, in the order documented in layout.h. */
#include "device/ggml/layout.h"

static int64_t rows_of(const pi_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

int32_t pi_gg_down_cols(const pi_context *c, int l, int64_t n_hot, int64_t *ne0) {
    const int32_t t = c->m->hp.layers[l * PI_L_COUNT + PI_L_FFN_DOWN].type;
    if (t == PI_TYPE_F32 || t == PI_TYPE_F16 || t == PI_TYPE_BF16) {
        *ne0 = n_hot;
        return PI_TYPE_F16;
    }
    *ne0 = (n_hot + PI_QK - 1) / PI_QK * PI_QK;
    return PI_TYPE_Q8_0;
}

void pi_gg_layer_tensors(const pi_context *c, int l, int attn_on, int64_t n_hot, int with_down, const pi_gg_visit *v,
                         pi_gg_layer *L, pi_gg_hot *H) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
    memset(L, 0, sizeof *L);
    memset(H, 0, sizeof *H);
    for (int s = 0; s < PI_L_COUNT && attn_on; s++)
        if (!pi_gg_is_ffn_rows(s) && lt[s].data != NULL) v->fn(v->user, lt[s].type, lt[s].ne[0], rows_of(&lt[s]), &L->w[s]);
    if (n_hot > 0) {
        H->n_hot = n_hot;
        v->fn(v->user, lt[PI_L_FFN_GATE].type, hp->n_embd, n_hot, &H->gate);
        v->fn(v->user, lt[PI_L_FFN_UP].type, hp->n_embd, n_hot, &H->up);
        if (!with_down) return; /* the host sums this layer's down: no down columns here */
        /* a whole FFN keeps ffn_down as stored (no column gather: quant blocks stay whole) */
        H->n_down = n_hot;
        H->down_type = n_hot == hp->n_ff ? lt[PI_L_FFN_DOWN].type : pi_gg_down_cols(c, l, n_hot, &H->n_down);
        v->fn(v->user, H->down_type, H->n_down, hp->n_embd, &H->down);
    }
}

void pi_gg_kv_tensors(const pi_context *c, const pi_gg_visit *v, pi_gg_layer *L) {
    v->fn(v->user, c->cp.kv_type, c->kv_row, c->n_cells, &L->k);
    v->fn(v->user, c->cp.kv_type, c->kv_row, c->n_cells, &L->v);
}

const pi_tensor *pi_gg_output_matrix(const pi_context *c) {
    return c->m->hp.output.data != NULL ? &c->m->hp.output : &c->m->hp.tok_embd;
}

void pi_gg_output_tensors(const pi_context *c, const pi_gg_visit *v, pi_gg_output *O) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *o = pi_gg_output_matrix(c);
    memset(O, 0, sizeof *O);
    v->fn(v->user, PI_TYPE_F32, hp->n_embd, 1, &O->norm);
    if (hp->output_norm_b.data != NULL) v->fn(v->user, PI_TYPE_F32, hp->n_embd, 1, &O->norm_b);
    v->fn(v->user, o->type, o->ne[0], rows_of(o), &O->out);
}
