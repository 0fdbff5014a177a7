/* A placed model on a ggml device: the plan's copies in three ggml buffers (weights, kv,
 * compute; layout.h), each step as a graph on the device's backend (steps.c), the hot FFN on
 * the device thread (worker.c) while the CPU computes the cold neurons, behind the device
 * interface (device/device.h). Steps the forward pass waits on at once (attention, output) run
 * on the calling thread: the same backend, without a handoff. */
#include <stdlib.h>

#include "blocks/blocks.h"
#include "device/ggml/gplaced.h"
#include "device/ggml/measure.h"

static const pi_device_i gg_i;

pi_gplaced *pi_gg_of(const pi_context *c, const char *fn) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "%s: NULL context", fn), NULL;
    if (c->dev == NULL || c->dev->iface.kind != PI_DEV_GGML)
        return pi_set_error(PI_ERR_INVALID, "%s: the context is not placed on a ggml device", fn), NULL;
    return c->dev->impl;
}

/* layer l's q/k/v are views of one fused attn_qkv (Falcon): no attention graph for it yet */
static int fused_qkv(const pi_context *c, int l) {
    return c->m->row_mats[l * PI_L_COUNT + PI_L_ATTN_Q].data != c->m->hp.layers[l * PI_L_COUNT + PI_L_ATTN_Q].data;
}

static int fused_qkv_error(int l) {
    return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: a fused attn_qkv (Falcon) cannot go on a ggml device yet", l);
}

/* what cannot be placed (checked before counting bytes) */
static int check_layer(const pi_context *c, const pi_layer_placement *L, int l) {
    const pi_model_params *hp = &c->m->hp;
    const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
    if (L->n_hot < 0 || L->n_hot > hp->n_ff || (L->n_hot > 0 && L->hot_ids == NULL))
        return pi_set_error(PI_ERR_INVALID, "blk.%d: n_hot %lld outside [0, %lld]", l, (long long)L->n_hot,
                            (long long)hp->n_ff);
    if (L->attn_on_device && fused_qkv(c, l)) return fused_qkv_error(l);
    if (L->n_hot == 0) return PI_OK;
    int rc = pi_ffn_check_hot_ids("pi_context_set_ggml_device", L->hot_ids, L->n_hot, hp->n_ff);
    if (rc) return rc;
    if (lt[PI_L_FFN_GATE].data == NULL || lt[PI_L_FFN_UP_BIAS].data != NULL)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: the device split needs a gated FFN without up bias "
                            "(Falcon/OPT are ungated)", l);
    if (c->down_t == NULL || c->down_t[l].data == NULL)
        return pi_set_error(PI_ERR_INVALID, "blk.%d: hot neurons need the layer's down_t (pi_context_set_ffn_sparsity) "
                            "first: the CPU half runs the cold neurons sparsely", l);
    return PI_OK;
}

/* 1: layer l is split and its device half computes only what its predictor selects (its graphs
 * are in the compute buffer: the predictor was set before measuring, measure.c) */
static int skips(const pi_context *c, const pi_layer_placement *L, int l) {
    return L->device_skips && L->n_hot > 0 && L->n_hot < c->m->hp.n_ff && pi_has_predictor(c, l);
}

int pi_context_ggml_compute_bytes(const pi_context *c, pi_gdev *d, int64_t *out) {
    if (c == NULL || d == NULL || out == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_context_ggml_compute_bytes: NULL argument");
    for (int l = 0; l < c->m->hp.n_layer; l++) /* the worst case holds every layer's attention graph */
        if (fused_qkv(c, l)) return fused_qkv_error(l);
    return pi_gg_measure(d, c, pi_gg_flash_supported(d, c), NULL, out);
}

typedef struct {
    const pi_gdev *d;
    gctx *ctx; /* NULL: only sum the bytes */
    int64_t bytes;
} plan_sum;

static void plan_visit(void *user, int32_t type, int64_t ne0, int64_t ne1, gt **dst) {
    plan_sum *s = user;
    s->bytes += pi_gdev_tensor_slot(s->d, type, ne0, ne1);
    if (s->ctx != NULL) *dst = s->d->g->new_tensor_2d(s->ctx, type, ne0, ne1);
}

/* the weights and kv bytes of a plan; with contexts, their tensors made there into p's tables */
static void plan_tensors(const pi_context *c, const pi_layer_placement *layers, int32_t output_on, plan_sum *w,
                         plan_sum *kv, pi_gplaced *p) {
    const pi_gg_visit vw = {plan_visit, w}, vkv = {plan_visit, kv};
    for (int l = 0; l < c->m->hp.n_layer; l++) {
        pi_gg_layer L;
        pi_gg_hot H;
        pi_gg_layer *Lp = p ? &p->L[l] : &L;
        pi_gg_layer_tensors(c, l, layers[l].attn_on_device, layers[l].n_hot, !pi_gg_host_down(c, l), &vw, Lp,
                            p ? &p->H[l] : &H);
        if (layers[l].attn_on_device) pi_gg_kv_tensors(c, &vkv, Lp);
    }
    pi_gg_output O;
    if (output_on) pi_gg_output_tensors(c, &vw, p ? &p->O : &O);
}

static void gg_free(pi_gplaced *p) {
    if (p == NULL) return;
    pi_gg_worker_stop(p);
    const pi_ggml_api *g = p->g;
    for (int l = 0; p->cold != NULL && l < p->c->m->hp.n_layer; l++) free(p->cold[l]);
    for (int l = 0; p->hot != NULL && l < p->c->m->hp.n_layer; l++) free(p->hot[l]);
    if (p->ga != NULL) g->gallocr_free(p->ga);
    if (p->wbuf != NULL) g->backend_buffer_free(p->wbuf);
    if (p->kvbuf != NULL) g->backend_buffer_free(p->kvbuf);
    if (p->wctx != NULL) g->free(p->wctx);
    if (p->kvctx != NULL) g->free(p->kvctx);
    free(p->L);
    free(p->H);
    free(p->cold);
    free(p->hot);
    free(p->cold_ids);
    free(p->cold_off);
    free(p->skips);
    free(p->sel_pos);
    free(p->sel_off);
    free(p->sel_in);
    free(p->mask);
    free(p->kv_idx);
    free(p->y_dev);
    free(p->graph_meta);
    free(p->ev);
    free(p);
}

static pi_gplaced *gg_new(pi_context *c, pi_gdev *d, int64_t max_cold, int64_t max_hot, int any_skips) {
    const size_t nl = (size_t)c->m->hp.n_layer, B = (size_t)c->cp.n_batch;
    const size_t H = (size_t)max_hot, max_down = (size_t)pi_align_up(max_hot, PI_QK); /* pi_gg_down_cols */
    pi_gplaced *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    p->base = (pi_dev){gg_i, p};
    p->c = c;
    p->d = d;
    p->g = d->g;
    if (!(p->L = calloc(nl, sizeof *p->L)) || !(p->H = calloc(nl, sizeof *p->H)) ||
        !(p->cold = calloc(nl, sizeof *p->cold)) || !(p->hot = calloc(nl, sizeof *p->hot)) ||
        !(p->cold_ids = malloc((B * (size_t)max_cold + 1) * sizeof *p->cold_ids)) ||
        !(p->cold_off = malloc((B + 1) * sizeof *p->cold_off)) ||
        !(p->mask = malloc(B * (size_t)c->n_cells * sizeof *p->mask)) || !(p->kv_idx = malloc(B * sizeof *p->kv_idx)) ||
        !(p->y_dev = malloc(B * (size_t)(2 * max_hot > c->m->hp.n_embd ? 2 * max_hot : c->m->hp.n_embd) *
                            sizeof *p->y_dev)) ||
        !(p->graph_meta = malloc(pi_gg_meta_bytes(p->g))) || !(p->skips = calloc(nl, 1)) ||
        (any_skips && (!(p->sel_pos = malloc((B * H + 1) * sizeof *p->sel_pos)) ||
                       !(p->sel_off = malloc((B + 1) * sizeof *p->sel_off)) ||
                       !(p->sel_in = malloc((H + B * max_down) * sizeof *p->sel_in))))) {
        gg_free(p);
        return NULL;
    }
    return p;
}

/* one ggml context for n tensors' metadata, and the buffer ggml allocates for them */
static int alloc_buffer(pi_gplaced *p, gctx **ctx, gbuf_t *buf, int64_t expect, int usage, const char *what) {
    const pi_ggml_api *g = p->g;
    if (expect == 0) return PI_OK;
    *buf = g->backend_alloc_ctx_tensors_from_buft(*ctx, p->d->buft);
    if (*buf == NULL)
        return pi_set_error(PI_ERR_NOMEM, "ggml device %s: allocating the %s buffer of %lld bytes failed", p->d->name,
                            what, (long long)expect);
    g->backend_buffer_set_usage(*buf, usage);
    if ((int64_t)g->backend_buffer_get_size(*buf) != expect)
        return pi_set_error(PI_ERR_INVALID, "ggml device %s: the %s buffer has %zu bytes, the plan counted %lld",
                            p->d->name, what, g->backend_buffer_get_size(*buf), (long long)expect);
    return PI_OK;
}

static gctx *meta_ctx(const pi_ggml_api *g, int64_t n_tensors) {
    return g->init((pi_ggml_init_params){g->tensor_overhead() * (size_t)(n_tensors + 1), NULL, true});
}

/* layer l's cold ids (the CPU half's neurons) and hot ids (where a dense down takes the device's h) */
static int cold_list(pi_gplaced *p, int l, const int32_t *hot_ids, int64_t n_hot) {
    const int64_t F = p->c->m->hp.n_ff;
    if ((p->cold[l] = malloc((size_t)(F - n_hot + 1) * sizeof *p->cold[l])) == NULL ||
        (p->hot[l] = malloc((size_t)n_hot * sizeof *p->hot[l])) == NULL)
        return pi_set_error(PI_ERR_NOMEM, "blk.%d: out of memory for the cold neuron list", l);
    pi_ffn_cold_ids(hot_ids, n_hot, F, p->cold[l]);
    memcpy(p->hot[l], hot_ids, (size_t)n_hot * sizeof *hot_ids);
    return PI_OK;
}

/* allocate and fill p's buffers for the plan (sizes checked by the caller) */
static int place(pi_gplaced *p, const pi_layer_placement *layers, int32_t output_on, int64_t wbytes, int64_t kvbytes,
                 int64_t compute) {
    pi_context *c = p->c;
    const pi_ggml_api *g = p->g;
    const int nl = c->m->hp.n_layer;
    p->wctx = meta_ctx(g, (int64_t)nl * (PI_L_COUNT + 3) + 3);
    p->kvctx = meta_ctx(g, 2 * (int64_t)nl);
    if (p->wctx == NULL || p->kvctx == NULL) return pi_set_error(PI_ERR_NOMEM, "ggml device: out of memory");
    plan_sum w = {p->d, p->wctx, 0}, kv = {p->d, p->kvctx, 0};
    plan_tensors(c, layers, output_on, &w, &kv, p);
    int rc = alloc_buffer(p, &p->wctx, &p->wbuf, wbytes, PI_G_BUFFER_USAGE_WEIGHTS, "weights");
    if (rc == PI_OK) rc = alloc_buffer(p, &p->kvctx, &p->kvbuf, kvbytes, 0, "kv");
    if (rc == PI_OK && p->kvbuf != NULL) g->backend_buffer_clear(p->kvbuf, 0); /* masked cells must be finite */
    for (int l = 0; l < nl && rc == PI_OK; l++) {
        rc = pi_gg_upload_layer(p, l, layers[l].hot_ids);
        if (rc == PI_OK && layers[l].n_hot > 0) rc = cold_list(p, l, layers[l].hot_ids, layers[l].n_hot);
    }
    p->out_on = output_on != 0;
    if (rc == PI_OK && output_on) pi_gg_upload_output(p);
    if (rc == PI_OK && compute > 0) {
        int64_t got = 0;
        p->ga = g->gallocr_new(p->d->buft);
        rc = p->ga != NULL ? pi_gg_measure(p->d, c, p->flash, p->ga, &got)
                           : pi_set_error(PI_ERR_NOMEM, "ggml device: out of memory");
        if (rc == PI_OK && got != compute)
            rc = pi_set_error(PI_ERR_INVALID, "ggml device %s: the compute buffer has %lld bytes, the plan counted %lld",
                              p->d->name, (long long)got, (long long)compute);
    }
    if (rc == PI_OK) rc = pi_gg_worker_start(p);
    return rc;
}

int pi_context_set_ggml_device(pi_context *c, pi_gdev *d, const pi_layer_placement *layers, int32_t output_on_device,
                               int64_t budget_bytes) {
    if (c == NULL || d == NULL || layers == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_context_set_ggml_device: NULL argument");
    if (c->dev != NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ggml_device: the context already has a device");
    const pi_model_params *hp = &c->m->hp;
    int any = output_on_device != 0, any_skips = 0, rc = PI_OK;
    int64_t max_cold = 0, max_hot = 0;
    for (int l = 0; l < hp->n_layer && rc == PI_OK; l++) {
        rc = check_layer(c, &layers[l], l);
        if (rc == PI_OK && skips(c, &layers[l], l)) rc = pi_gg_skips_supported(d, c, l);
        any_skips |= skips(c, &layers[l], l);
        any |= layers[l].attn_on_device || layers[l].n_hot > 0;
        if (layers[l].n_hot > 0 && hp->n_ff - layers[l].n_hot > max_cold) max_cold = hp->n_ff - layers[l].n_hot;
        if (layers[l].n_hot > max_hot) max_hot = layers[l].n_hot;
    }
    if (rc) return rc;
    plan_sum w = {d, NULL, 0}, kv = {d, NULL, 0};
    plan_tensors(c, layers, output_on_device, &w, &kv, NULL);
    int64_t compute = 0;
    if (any && (rc = pi_context_ggml_compute_bytes(c, d, &compute))) return rc;
    const int64_t need = w.bytes + kv.bytes + compute;
    pi_gdev_info info;
    pi_gdev_get_info(d, &info);
    if (need > budget_bytes)
        return pi_set_error(PI_ERR_NOMEM, "the plan needs %lld device bytes (weights %lld + kv %lld + compute %lld), "
                            "the budget is %lld", (long long)need, (long long)w.bytes, (long long)kv.bytes,
                            (long long)compute, (long long)budget_bytes);
    if (need > info.free_bytes)
        return pi_set_error(PI_ERR_NOMEM, "the plan needs %lld device bytes, ggml device %s has %lld free",
                            (long long)need, d->name, (long long)info.free_bytes);
    pi_gplaced *p = gg_new(c, d, max_cold, max_hot, any_skips);
    if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_context_set_ggml_device: out of memory");
    for (int l = 0; l < hp->n_layer; l++) p->skips[l] = (uint8_t)skips(c, &layers[l], l);
    p->flash = pi_gg_flash_supported(d, c);
    rc = place(p, layers, output_on_device, w.bytes, kv.bytes, compute);
    if (rc) {
        gg_free(p);
        return rc;
    }
    c->dev = &p->base;
    return PI_OK;
}

int pi_context_ggml_buffers(const pi_context *c, pi_gdev_buffers *out) {
    pi_gplaced *p = pi_gg_of(c, "pi_context_ggml_buffers");
    if (p == NULL) return PI_ERR_INVALID;
    if (out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_ggml_buffers: NULL argument");
    const pi_ggml_api *g = p->g;
    out->weights = p->wbuf ? (int64_t)g->backend_buffer_get_size(p->wbuf) : 0;
    out->kv = p->kvbuf ? (int64_t)g->backend_buffer_get_size(p->kvbuf) : 0;
    out->compute = p->ga ? (int64_t)g->gallocr_get_buffer_size(p->ga, 0) : 0;
    return PI_OK;
}

/* ---- the device interface ---- */

static void note(pi_gplaced *p, int rc) {
    if (rc && !p->error) p->error = rc; /* pi_eval reports it; the message is set on this thread */
}

static int gg_attn(pi_dev *dv, pi_context *c, int l, const int32_t *pos, const int32_t *cell0, int64_t n_tok) {
    pi_gplaced *p = dv->impl;
    (void)c;
    (void)n_tok; /* the rows of c's groups */
    if (p->L[l].k == NULL) return 0;
    note(p, pi_gg_run_attn(p, l, pos, cell0));
    return 1;
}

static int gg_ffn_skips(pi_dev *dv, int l) {
    const pi_gplaced *p = dv->impl;
    return p->skips[l];
}

/* the selected neurons of each row that are layer l's hot ones, as their device rows (sel_pos) */
static void select_hot(pi_gplaced *p, int l, int64_t n_tok, const pi_dev_active *act) {
    const int32_t *hot = p->hot[l];
    const int64_t n_hot = p->H[l].n_hot;
    int64_t m = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        p->sel_off[t] = m;
        int64_t r = 0; /* both lists increase: one merge */
        for (int64_t i = act->off[t]; i < act->off[t + 1] && r < n_hot; i++) {
            while (r < n_hot && hot[r] < act->ids[i]) r++;
            if (r < n_hot && hot[r] == act->ids[i]) p->sel_pos[m++] = (int32_t)r;
        }
    }
    p->sel_off[n_tok] = m;
}

static int gg_ffn_start(pi_dev *dv, pi_context *c, int l, int64_t n_tok, const pi_dev_active *act, pi_dev_cold *cold) {
    pi_gplaced *p = dv->impl;
    if (p->cold[l] == NULL) return 0;
    *cold = (pi_dev_cold){p->cold[l], c->m->hp.n_ff - p->H[l].n_hot, p->cold_ids, p->cold_off};
    p->ev_t0 = pi_now_ns(); /* the CPU half starts as the device's is posted */
    p->job_skips = act != NULL && p->skips[l];
    if (p->job_skips) select_hot(p, l, n_tok, act);
    pi_gg_ffn_post(p, l, c->xn);
    return 1;
}

/* 1: row t ran alone in its graph (one sequence's one row: steps.c, a row that skips then has its
 * selected neurons' values only, in order) */
static int row_alone(const pi_context *c, int64_t t) {
    int32_t i = 0;
    while (c->grp_off[i + 1] <= t) i++;
    return c->grp_off[i + 1] - c->grp_off[i] == 1;
}

static int gg_ffn_finish(pi_dev *dv, pi_context *c, int l, int64_t n_tok, float *y, int64_t *n_used) {
    pi_gplaced *p = dv->impl;
    pi_gg_trace_add(p, PI_GG_EV_COLD, l, p->ev_t0, pi_now_ns()); /* the CPU half's activations */
    const int64_t F = c->m->hp.n_ff, n_hot = p->H[l].n_hot;
    const int h_only = pi_gg_h_only(p, l);
    const int rc = pi_gg_ffn_wait(p, n_tok, h_only ? NULL : y);
    note(p, rc);
    if (rc == PI_OK && h_only) /* the hot neurons' h (the host's activation, as the cold half's) into */
        for (int64_t t = 0; t < n_tok; t++) { /* the dense down's input, where the cold half left them 0 */
            int64_t k = n_hot;
            const int32_t *pos = p->job_skips ? pi_gg_sel(p, t, &k) : NULL;
            const int compact = pos != NULL && row_alone(c, t);
            float *h = p->y_dev + t * n_hot; /* in place over the gate products */
            pi_ffn_act_mul(c->m->hp.act, h, p->y_dev + (c->cp.n_batch + t) * n_hot, h, compact ? k : n_hot);
            for (int64_t j = 0; j < k; j++) {
                const int64_t r = pos == NULL ? j : pos[j];
                c->ffn_hd[t * F + p->hot[l][r]] = h[compact ? j : r];
            }
        }
    if (rc == PI_OK && n_used != NULL) /* the hot neurons the device computed */
        for (int64_t t = 0; t < n_tok; t++) n_used[t] += p->job_skips ? p->sel_off[t + 1] - p->sel_off[t] : n_hot;
    return rc;
}

static int gg_output(pi_dev *dv, pi_context *c, const float *x, int64_t n_out, float *logits) {
    pi_gplaced *p = dv->impl;
    if (!p->out_on) return 0;
    (void)n_out; /* the rows of c's groups */
    note(p, pi_gg_run_output(p, x, logits, c->embd));
    return 1;
}

static int gg_error(pi_dev *dv) {
    pi_gplaced *p = dv->impl;
    const int rc = p->error;
    p->error = 0;
    return rc;
}

static void gg_dev_free(pi_dev *dv) { gg_free(dv->impl); }

static const pi_device_i gg_i = {
    .kind = PI_DEV_GGML,
    .name = "ggml",
    .attn = gg_attn,
    .ffn_skips = gg_ffn_skips,
    .ffn_start = gg_ffn_start,
    .ffn_finish = gg_ffn_finish,
    .output = gg_output,
    .error = gg_error,
    .free = gg_dev_free,
};
