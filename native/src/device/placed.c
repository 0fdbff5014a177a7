/* A placed model: the device half of a placement plan (issue 6; docs/placement.md),
 * behind the device interface (device/device.h) the forward pass calls.
 *
 * pi_context_set_device copies what the plan puts on the device - per layer the
 * attention tensors and KV cache, the hot FFN rows, the output block - into the
 * device's pool, with one activation scratch area for n_batch tokens, byte for byte
 * what powerinfer_backend.placement accounts. pi_eval then submits each step to the
 * interface, which runs it here when the plan put it on the device. x goes to the
 * device and the results come back as copies, as they would over PCIe.
 * pi_context_set_ffn_offload uses the same table with external FFN halves only. */
#include <stdlib.h>

#include "blocks/blocks.h"
#include "device/cpu_device.h"
#include "device/device.h"
#include "device/ffn_half.h"

enum { JOB_NONE, JOB_DEVICE, JOB_FFN }; /* the step in flight: a cpu-device job, or a split FFN */

typedef struct pi_placed {
    pi_dev base;        /* what the context holds; base.impl is this */
    pi_device *dev;     /* NULL when only external FFN halves are set (pi_context_set_ffn_offload) */
    pi_context *c;
    int error;          /* the first failure of an FFN half in this eval */
    /* activation scratch on the device, allocated in this order: g .. act is one span
     * (attention scratch, or the sparse FFN's scratch) */
    float *x, *xn, *y, *q, *attn, *k, *v, *g, *u, *scores;
    void *act;
    pi_tensor *lt;      /* n_layer * PI_L_COUNT device copies (data NULL: absent or on the CPU) */
    pi_mat *lm;
    char **kc, **vc;    /* per layer device KV cache, NULL on the CPU */
    pi_device_ffn **ffn; /* per layer hot rows, NULL without */
    int64_t *used_dev;  /* n_batch per-token counts of kept hot rows */
    int32_t *cold_ids;  /* n_batch x max cold neurons: the CPU half's candidate lists */
    int64_t *cold_off;
    int out_on;
    pi_tensor out_norm;
    pi_mat output;
    float *logits;
    /* the step in flight */
    int job;            /* JOB_* */
    int job_rc;         /* its submit failed: nothing to wait for */
    int job_l;
    const int32_t *job_pos;
    int64_t job_tok;
    const float *job_x;
    float *job_logits;
    pi_ffn_sparse_args job_ffn;
} pi_placed;

static const pi_device_i placed_i;
static void placed_free(pi_placed *p);

static int64_t tensor_bytes(const pi_tensor *t) {
    return pi_row_size(t->type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3];
}

static int is_ffn_rows(int slot) { return slot == PI_L_FFN_GATE || slot == PI_L_FFN_UP || slot == PI_L_FFN_DOWN; }

/* scratch buffers in allocation order: x, xn, y (n_embd), q, attn (n_head * head),
 * k, v (n_head_kv * head), g, u (n_ff), scores (n_head x n_cells), act (quantized
 * matmul input: max(n_embd, n_embd_q) elements at <= 4 bytes) - F32, n_batch rows each */
static void scratch_sizes(const pi_context *c, int64_t out[11]) {
    const pi_model_params *hp = &c->m->hp;
    const int64_t B = c->cp.n_batch, E = hp->n_embd, Q = (int64_t)hp->n_head * hp->n_embd_head, R = c->kv_row;
    const int64_t sizes[11] = {B * E * 4, B * E * 4, B * E * 4, B * Q * 4, B * Q * 4, B * R * 4, B * R * 4,
                               B * hp->n_ff * 4, B * hp->n_ff * 4, B * hp->n_head * c->n_cells * 4,
                               B * (E > Q ? E : Q) * 4};
    memcpy(out, sizes, sizeof sizes);
}

static int64_t attn_bytes(const pi_context *c, int l) {
    const pi_tensor *lt = &c->m->hp.layers[l * PI_L_COUNT];
    int64_t n = 2 * pi_align_up(c->n_cells * c->kv_row * (int64_t)c->kv_esz, PI_DEVICE_ALIGN);
    for (int s = 0; s < PI_L_COUNT; s++)
        if (!is_ffn_rows(s) && lt[s].data != NULL) n += pi_align_up(tensor_bytes(&lt[s]), PI_DEVICE_ALIGN);
    return n;
}

static int64_t hot_bytes(const pi_context *c, int l, int64_t n_hot) {
    const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
    const int32_t dt = c->down_t != NULL && c->down_t[l].data != NULL ? c->down_t[l].type : PI_TYPE_F16;
    return pi_device_rows_bytes(pi_row_size(lm[PI_L_FFN_UP].type, lm[PI_L_FFN_UP].n_cols), /* gate's type */
                                pi_row_size(dt, c->m->hp.n_embd), n_hot);
}

/* What this engine cannot place yet, whatever the device (checked before counting bytes) */
/* Why layer l's FFN cannot be split with a device half (PI_OK when it can); with
 * need_down_t, also that its transposed down must be set first. */
static int check_split_layer(const pi_context *c, int l, int need_down_t) {
    if (need_down_t && (c->down_t == NULL || c->down_t[l].data == NULL))
        return pi_set_error(PI_ERR_INVALID, "blk.%d: hot neurons need the layer's down_t "
                            "(pi_context_set_ffn_sparsity) first", l);
    if (c->pred_fc1 != NULL && c->pred_fc1[l].data != NULL)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: a predictor layer cannot be split with a device yet", l);
    if (c->ffn_on_gate)
        return pi_set_error(PI_ERR_UNSUPPORTED, "the hybrid FFN thresholds the product |h|, not the gate");
    if (c->m->mats[l * PI_L_COUNT + PI_L_FFN_GATE].data == NULL)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: the device split needs a gated FFN (Falcon/OPT "
                            "are ungated)", l);
    return PI_OK;
}

static int check_supported(const pi_context *c, const pi_layer_placement *layers, int32_t output_on_device) {
    const pi_model_params *hp = &c->m->hp;
    int dense_on = output_on_device;
    for (int l = 0; l < hp->n_layer; l++) {
        dense_on |= layers[l].attn_on_device;
        const int rc = layers[l].n_hot > 0 ? check_split_layer(c, l, 0) : PI_OK;
        if (rc) return rc;
    }
    if (dense_on && (hp->layer_norm || hp->parallel_residual || hp->pos_embd.data != NULL))
        return pi_set_error(PI_ERR_UNSUPPORTED, "dense blocks on the device: LayerNorm, parallel-residual and "
                            "learned-position models (Falcon, OPT) are not supported yet");
    return PI_OK;
}

int pi_context_plan_bytes(const pi_context *c, const pi_layer_placement *layers, int32_t output_on_device,
                          int64_t *total_bytes, int64_t *scratch_bytes) {
    if (c == NULL || layers == NULL || total_bytes == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_context_plan_bytes: NULL argument");
    const pi_model_params *hp = &c->m->hp;
    int rc = check_supported(c, layers, output_on_device);
    if (rc) return rc;
    int64_t total = 0, any = output_on_device != 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const pi_layer_placement *L = &layers[l];
        if (L->n_hot < 0 || L->n_hot > hp->n_ff || (L->n_hot > 0 && L->hot_ids == NULL))
            return pi_set_error(PI_ERR_INVALID, "blk.%d: n_hot %lld outside [0, %lld]", l, (long long)L->n_hot,
                                (long long)hp->n_ff);
        if (L->attn_on_device) total += attn_bytes(c, l);
        total += hot_bytes(c, l, L->n_hot);
        any |= L->attn_on_device || L->n_hot > 0;
    }
    if (output_on_device) {
        const pi_tensor *o = c->m->hp.output.data != NULL ? &c->m->hp.output : &c->m->hp.tok_embd;
        total += pi_align_up(tensor_bytes(&hp->output_norm), PI_DEVICE_ALIGN) +
                 pi_align_up(tensor_bytes(o), PI_DEVICE_ALIGN) +
                 pi_align_up((int64_t)c->cp.n_batch * hp->n_vocab * 4, PI_DEVICE_ALIGN);
    }
    int64_t sizes[11], scratch = 0;
    scratch_sizes(c, sizes);
    for (int i = 0; i < 11 && any; i++) scratch += pi_align_up(sizes[i], PI_DEVICE_ALIGN);
    if (scratch_bytes) *scratch_bytes = scratch;
    *total_bytes = total + scratch;
    return PI_OK;
}

/* the tables of a placed context; cold lists for up to max_cold cold neurons per token */
static pi_placed *placed_new(pi_context *c, int64_t max_cold) {
    const size_t nl = (size_t)c->m->hp.n_layer;
    pi_placed *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    p->base = (pi_dev){placed_i, p};
    p->c = c;
    if (!(p->lt = calloc(nl * PI_L_COUNT, sizeof *p->lt)) || !(p->lm = calloc(nl * PI_L_COUNT, sizeof *p->lm)) ||
        !(p->kc = calloc(nl, sizeof *p->kc)) || !(p->vc = calloc(nl, sizeof *p->vc)) ||
        !(p->ffn = calloc(nl, sizeof *p->ffn)) || !(p->used_dev = calloc((size_t)c->cp.n_batch, sizeof *p->used_dev)) ||
        !(p->cold_ids = malloc((size_t)(c->cp.n_batch * max_cold + 1) * sizeof *p->cold_ids)) ||
        !(p->cold_off = malloc((size_t)(c->cp.n_batch + 1) * sizeof *p->cold_off))) {
        placed_free(p);
        return NULL;
    }
    return p;
}

static void *dev_alloc(pi_device *d, int64_t n) {
    void *p = NULL;
    pi_device_alloc(d, n, &p); /* cannot fail: the total was checked first */
    return p;
}

static int check_plan(const pi_context *c, const pi_device *dev, const pi_layer_placement *layers) {
    const pi_model_params *hp = &c->m->hp;
    for (int l = 0; l < hp->n_layer; l++) {
        const int rc = layers[l].n_hot > 0 ? check_split_layer(c, l, 1) : PI_OK;
        if (rc) return rc;
    }
    int64_t sizes[11];
    scratch_sizes(c, sizes);
    int64_t span = 0;
    for (int i = 7; i < 11; i++) span += pi_align_up(sizes[i], PI_DEVICE_ALIGN);
    const int64_t attn_need = pi_attention_scratch_floats(c->n_cells, hp->n_embd_head) * 4 * pi_device_n_threads(dev);
    if (attn_need > span)
        return pi_set_error(PI_ERR_INVALID, "device scratch: attention needs %lld bytes for %d device threads, the "
                            "plan's scratch has %lld; use fewer device threads", (long long)attn_need,
                            pi_device_n_threads(dev), (long long)span);
    const int64_t rope = (int64_t)c->cp.n_batch * hp->n_rot * (hp->n_swa > 0 ? 2 : 1) * 4;
    if (rope > sizes[2])
        return pi_set_error(PI_ERR_UNSUPPORTED, "device scratch: RoPE tables (%lld bytes) exceed the y buffer",
                            (long long)rope);
    for (int l = 0; l < hp->n_layer; l++) {
        const int64_t need = pi_ffn_sparse_scratch_size(c->m->mats[l * PI_L_COUNT + PI_L_FFN_GATE].type, hp->n_embd,
                                                        layers[l].n_hot, c->cp.n_batch);
        if (layers[l].n_hot > 0 && need > span)
            return pi_set_error(PI_ERR_INVALID, "blk.%d: device FFN scratch %lld bytes exceeds %lld", l,
                                (long long)need, (long long)span);
    }
    return PI_OK;
}

int pi_context_set_device(pi_context *c, pi_device *dev, const pi_layer_placement *layers, int32_t output_on_device) {
    if (c == NULL || dev == NULL || layers == NULL)
        return pi_set_error(PI_ERR_INVALID, "pi_context_set_device: NULL argument");
    if (c->dev != NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_device: the context already has a device");
    const pi_model_params *hp = &c->m->hp;
    int64_t scratch = 0, need = 0;
    int rc = pi_context_plan_bytes(c, layers, output_on_device, &need, &scratch);
    if (rc) return rc;
    rc = check_plan(c, dev, layers);
    if (rc) return rc;
    if (need > pi_device_free_bytes(dev))
        return pi_set_error(PI_ERR_NOMEM, "the plan needs %lld device bytes, the device has %lld free",
                            (long long)need, (long long)pi_device_free_bytes(dev));
    int64_t max_cold = 0;
    for (int l = 0; l < hp->n_layer; l++)
        if (layers[l].n_hot > 0 && hp->n_ff - layers[l].n_hot > max_cold) max_cold = hp->n_ff - layers[l].n_hot;
    pi_placed *p = placed_new(c, max_cold);
    if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_context_set_device: out of memory");
    p->dev = dev;
    p->c = c;
    if (scratch > 0) {
        int64_t sizes[11];
        scratch_sizes(c, sizes);
        float **bufs[10] = {&p->x, &p->xn, &p->y, &p->q, &p->attn, &p->k, &p->v, &p->g, &p->u, &p->scores};
        for (int i = 0; i < 10; i++) *bufs[i] = dev_alloc(dev, sizes[i]);
        p->act = dev_alloc(dev, sizes[10]);
    }
    const int64_t kv_bytes = c->n_cells * c->kv_row * (int64_t)c->kv_esz;
    for (int l = 0; l < hp->n_layer && rc == PI_OK; l++) {
        const pi_tensor *lt = &hp->layers[l * PI_L_COUNT];
        const pi_mat *lm = &c->m->mats[l * PI_L_COUNT];
        if (layers[l].attn_on_device) {
            for (int s = 0; s < PI_L_COUNT; s++) {
                if (is_ffn_rows(s) || lt[s].data == NULL) continue;
                const int64_t n = tensor_bytes(&lt[s]);
                void *d = dev_alloc(dev, n);
                memcpy(d, lt[s].data, (size_t)n); /* host to device */
                p->lt[l * PI_L_COUNT + s] = lt[s];
                p->lt[l * PI_L_COUNT + s].data = d;
                p->lm[l * PI_L_COUNT + s] = (pi_mat){d, lm[s].type, lm[s].n_cols, lm[s].n_rows};
            }
            p->kc[l] = dev_alloc(dev, kv_bytes); /* the pool is zeroed at creation, as the host cache */
            p->vc[l] = dev_alloc(dev, kv_bytes);
        }
        if (layers[l].n_hot > 0)
            rc = pi_device_ffn_create(dev, &lm[PI_L_FFN_GATE], &lm[PI_L_FFN_UP], &c->down_t[l], layers[l].hot_ids,
                                      layers[l].n_hot, c->cp.n_batch, p->x, p->y, p->g, &p->ffn[l]);
    }
    if (rc == PI_OK && output_on_device) {
        const pi_tensor *o = hp->output.data != NULL ? &hp->output : &hp->tok_embd;
        p->out_on = 1;
        p->out_norm = hp->output_norm;
        p->out_norm.data = dev_alloc(dev, tensor_bytes(&hp->output_norm));
        memcpy((void *)p->out_norm.data, hp->output_norm.data, (size_t)tensor_bytes(&hp->output_norm));
        void *d = dev_alloc(dev, tensor_bytes(o));
        memcpy(d, o->data, (size_t)tensor_bytes(o));
        p->output = (pi_mat){d, c->m->output.type, c->m->output.n_cols, c->m->output.n_rows};
        p->logits = dev_alloc(dev, (int64_t)c->cp.n_batch * hp->n_vocab * 4);
    }
    if (rc) { /* device memory stays with the device (bump pool); the context stays unplaced */
        placed_free(p);
        return rc;
    }
    c->dev = &p->base;
    return PI_OK;
}

static void placed_free(pi_placed *p) {
    if (p == NULL) return;
    if (p->ffn != NULL)
        for (int l = 0; l < p->c->m->hp.n_layer; l++) pi_device_ffn_free(p->ffn[l]);
    free(p->lt);
    free(p->lm);
    free(p->kc);
    free(p->vc);
    free(p->ffn);
    free(p->used_dev);
    free(p->cold_ids);
    free(p->cold_off);
    free(p);
}

/* On the device's thread: x (and this batch's RoPE tables) in, attention, x and xn out. */
static void attn_job(pi_pool *pool, void *arg) {
    pi_placed *p = arg;
    const pi_context *c = p->c;
    const pi_model_params *hp = &c->m->hp;
    const int l = p->job_l;
    const int64_t n = p->job_tok, E = hp->n_embd, nr = n * hp->n_rot;
    memcpy(p->x, c->x, (size_t)(n * E) * sizeof(float));
    memcpy(p->y, c->rope_cs, (size_t)nr * sizeof(float));
    if (hp->n_swa > 0) memcpy(p->y + nr, c->rope_cs_swa, (size_t)nr * sizeof(float));
    const pi_attn_site s = {pool, &p->lt[l * PI_L_COUNT], &p->lm[l * PI_L_COUNT], p->kc[l], p->vc[l], p->x, p->xn,
                            p->q, p->k, p->v, p->attn, p->act, p->g, p->y, p->y + nr, NULL};
    pi_attn_block(c, &s, l, p->job_pos, n);
    memcpy(c->x, p->x, (size_t)(n * E) * sizeof(float)); /* device to host */
    memcpy(c->xn, p->xn, (size_t)(n * E) * sizeof(float));
    pi_device_count(p->dev, 0, 1, 0);
}

static void output_job(pi_pool *pool, void *arg) {
    pi_placed *p = arg;
    const pi_context *c = p->c;
    const pi_model_params *hp = &c->m->hp;
    const int64_t n = p->job_tok, E = hp->n_embd;
    memcpy(p->x, p->job_x, (size_t)(n * E) * sizeof(float));
    pi_rmsnorm_rows(p->x, p->out_norm.data, E, n, hp->rms_eps, p->xn);
    const pi_matmul_out o = {&p->output, p->logits, hp->n_vocab};
    pi_matmul_multi(pool, &o, 1, p->xn, n, p->act);
    memcpy(c->embd, p->xn, (size_t)(n * E) * sizeof(float));
    memcpy(p->job_logits, p->logits, (size_t)(n * hp->n_vocab) * sizeof(float));
    pi_device_count(p->dev, 0, 0, 1);
}

/* ---- the device interface ---- */

/* start fn on the cpu-device; the context is the device's only client, so the claim
 * never fails (if it did, the step would be skipped, as before the interface) */
static void submit_job(pi_placed *p, pi_device_fn fn) {
    p->job = JOB_DEVICE;
    p->job_rc = pi_device_claim(p->dev);
    if (p->job_rc == PI_OK) pi_device_go(p->dev, fn, p);
}

static int placed_submit_attn(pi_dev *d, pi_context *c, int l, const int32_t *pos, int64_t n_tok) {
    pi_placed *p = d->impl;
    (void)c;
    if (p->kc[l] == NULL) return 0;
    p->job_l = l;
    p->job_pos = pos;
    p->job_tok = n_tok;
    submit_job(p, attn_job);
    return 1;
}

static int placed_submit_ffn(pi_dev *d, pi_context *c, int l, int64_t n_tok) {
    pi_placed *p = d->impl;
    if (p->ffn[l] == NULL) return 0;
    p->job = JOB_FFN;
    p->job_l = l;
    p->job_ffn = pi_ffn_sparse_base(c, l, n_tok);
    p->job_rc = pi_ffn_split_start(p->ffn[l], &p->job_ffn, p->used_dev);
    return 1;
}

static int placed_submit_output(pi_dev *d, pi_context *c, const float *x, int64_t n_out, float *logits) {
    pi_placed *p = d->impl;
    (void)c;
    if (!p->out_on) return 0;
    p->job_x = x;
    p->job_tok = n_out;
    p->job_logits = logits;
    submit_job(p, output_job);
    return 1;
}

static void placed_wait(pi_dev *d, pi_context *c) {
    pi_placed *p = d->impl;
    if (p->job == JOB_FFN) { /* the CPU half, the device's wait, the merge */
        const int rc = p->job_rc ? p->job_rc
                                 : pi_ffn_split_finish(c->pool, p->ffn[p->job_l], &p->job_ffn, c->ffn_scratch,
                                                       p->cold_ids, p->cold_off, p->used_dev, NULL);
        if (rc && !p->error) p->error = rc; /* pi_eval reports it; the message is already set */
    } else if (p->job == JOB_DEVICE && p->job_rc == PI_OK) {
        pi_device_wait(p->dev);
    }
    p->job = JOB_NONE;
}

static int placed_error(pi_dev *d) {
    pi_placed *p = d->impl;
    const int rc = p->error;
    p->error = 0;
    return rc;
}

static void placed_dev_free(pi_dev *d) { placed_free(d->impl); }

static const pi_device_i placed_i = {
    .name = "placed",
    .submit_attn = placed_submit_attn,
    .submit_ffn = placed_submit_ffn,
    .submit_output = placed_submit_output,
    .wait = placed_wait,
    .error = placed_error,
    .free = placed_dev_free,
};

int pi_context_set_ffn_offload(pi_context *c, int32_t layer, void *handle, pi_ffn_offload_start_fn start,
                               pi_ffn_offload_wait_fn wait, const int32_t *hot_ids, int64_t n_hot) {
    if (c == NULL || handle == NULL || start == NULL || wait == NULL || (n_hot > 0 && hot_ids == NULL))
        return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_offload: NULL argument");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    if (n_hot < 1 || n_hot > hp->n_ff)
        return pi_set_error(PI_ERR_INVALID, "blk.%d: n_hot %lld outside [1, %lld]", layer, (long long)n_hot,
                            (long long)hp->n_ff);
    const int rc = check_split_layer(c, layer, 1);
    if (rc) return rc;
    pi_placed *p = c->dev != NULL ? c->dev->impl : NULL;
    if (p != NULL && (p->dev != NULL || p->ffn[layer] != NULL))
        return pi_set_error(PI_ERR_INVALID, "blk.%d: the context already has a device half for this layer", layer);
    if (p == NULL) {
        if ((p = placed_new(c, hp->n_ff)) == NULL)
            return pi_set_error(PI_ERR_NOMEM, "pi_context_set_ffn_offload: out of memory");
        c->dev = &p->base;
    }
    return pi_ffn_offload_half(handle, start, wait, hp->n_embd, hp->n_ff, hot_ids, n_hot, &p->ffn[layer]);
}
