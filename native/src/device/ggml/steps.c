/* The device steps: per row group (one sequence's rows: device.h) build the step's graph, place
 * it in the compute buffer, copy the activations in, compute on the device's backend, copy the
 * results out, under the device's lock (pi_gdev.step_mu: contexts sharing it may run on several
 * threads, and the backend is one per device). */
#include "device/ggml/gplaced.h"

void pi_gg_trace_add(pi_gplaced *p, int kind, int l, int64_t t0, int64_t t1) {
    if (p->ev == NULL) return;
    const int32_t i = __atomic_fetch_add(&p->ev_n, 1, __ATOMIC_RELAXED);
    if (i < p->ev_cap) p->ev[i] = (pi_gg_event){kind, l, t0, t1};
}

/* allocate io's graph in the compute buffer (growing it only past the reserved worst case, which
 * pi_context_ggml_buffers would show) */
static int alloc(pi_gplaced *p, const pi_gg_io *io) {
    if (!p->g->gallocr_alloc_graph(p->ga, io->gf))
        return pi_set_error(PI_ERR_NOMEM, "ggml device %s: cannot allocate a step's graph", p->d->name);
    return PI_OK;
}

static int compute(pi_gplaced *p, const pi_gg_io *io) {
    const int st = p->g->backend_graph_compute(p->d->backend, io->gf);
    return st == PI_G_STATUS_SUCCESS ? PI_OK
                                     : pi_set_error(PI_ERR_INVALID, "ggml device %s: graph compute failed (status %d)",
                                                    p->d->name, st);
}

/* one sequence's rows [a, a + n) of layer l's attention step: its own graph over its slot */
static int attn_group(pi_gplaced *p, int l, const int32_t *pos, int64_t cell0, int64_t a, int64_t n) {
    const pi_ggml_api *g = p->g;
    pi_context *c = p->c;
    const pi_model_params *hp = &c->m->hp;
    const int64_t E = hp->n_embd, last = pos[n - 1] + 1;
    /* cells [0, n_kv) of the slot: every cached position and these rows, padded (cells past them are
     * masked), as many as the sequence alone in a context of n_ctx_seq */
    const int64_t n_kv = pi_align_up(last, PI_KV_PAD) < c->seq_cells ? pi_align_up(last, PI_KV_PAD) : c->seq_cells;
    pthread_mutex_lock(&p->d->step_mu); /* the device's backend is shared by its placements */
    gctx *ctx = pi_gg_meta(g, p->graph_meta);
    pi_gg_io io;
    int rc = pi_gg_attn(g, ctx, c, l, &p->L[l], n, cell0, n_kv, p->flash, &io);
    if (rc == PI_OK) rc = alloc(p, &io);
    if (rc == PI_OK) {
        for (int64_t t = 0; t < n; t++) p->kv_idx[t] = cell0 + pos[t];
        pi_gg_fill_mask(c, l, pos, n, n_kv, p->mask);
        g->backend_tensor_set(io.x, c->x + a * E, 0, (size_t)(n * E) * sizeof(float));
        g->backend_tensor_set(io.kv_idx, p->kv_idx, 0, (size_t)n * sizeof(int64_t));
        g->backend_tensor_set(io.mask, p->mask, 0, (size_t)(n * n_kv) * sizeof(float));
        if (io.pos != NULL) g->backend_tensor_set(io.pos, pos, 0, (size_t)n * sizeof(int32_t));
        if (io.freqs != NULL)
            g->backend_tensor_set(io.freqs, hp->rope_freqs.data, 0, (size_t)(hp->n_rot / 2) * sizeof(float));
        rc = compute(p, &io);
    }
    if (rc == PI_OK) { /* device to host */
        g->backend_tensor_get(io.out0, c->x + a * E, 0, (size_t)(n * E) * sizeof(float));
        g->backend_tensor_get(io.out1, c->xn + a * E, 0, (size_t)(n * E) * sizeof(float));
    }
    g->free(ctx);
    pthread_mutex_unlock(&p->d->step_mu);
    return rc;
}

int pi_gg_run_attn(pi_gplaced *p, int l, const int32_t *pos, const int32_t *cell0) {
    const pi_context *c = p->c;
    const int64_t t0 = pi_now_ns();
    int rc = PI_OK;
    for (int32_t i = 0; i < c->n_grp && rc == PI_OK; i++) {
        const int64_t a = c->grp_off[i];
        rc = attn_group(p, l, pos + a, cell0 != NULL ? cell0[a] : 0, a, c->grp_off[i + 1] - a);
    }
    pi_gg_trace_add(p, PI_GG_EV_ATTN, l, t0, pi_now_ns());
    return rc;
}

/* pi_gg_ffn's n_sel for rows [a, a + n) of the job: -1 every hot neuron; a row alone its selected
 * ones (at least one row is read: an empty selection maps every column to the zero row); 0 a batch */
static int64_t n_sel_of(const pi_gplaced *p, int64_t a, int64_t n) {
    int64_t k;
    if (!p->job_skips) return -1;
    if (n > 1) return 0;
    pi_gg_sel(p, a, &k);
    return k > 0 ? k : 1;
}

/* the inputs ids and map (pi_gg_ffn) of rows [a, a + n) of layer l with n_sel */
static void set_sel_inputs(pi_gplaced *p, int l, int64_t a, int64_t n, int64_t n_sel, const pi_gg_io *io) {
    const pi_ggml_api *g = p->g;
    const pi_gg_hot *H = &p->H[l];
    int32_t *ids = p->sel_in, *map = p->sel_in + H->n_hot;
    for (int64_t t = 0; t < n; t++) {
        int64_t k;
        const int32_t *pos = pi_gg_sel(p, a + t, &k);
        if (io->map != NULL) { /* each down column: its neuron's h when selected, else the zero row */
            int32_t *m = map + t * H->n_down;
            const int32_t zero = (int32_t)(n_sel > 0 ? n_sel : H->n_hot);
            for (int64_t i = 0; i < H->n_down; i++) m[i] = zero;
            for (int64_t j = 0; j < k; j++) m[pos[j]] = n_sel > 0 ? (int32_t)j : pos[j];
        }
        if (n_sel > 0) {
            memcpy(ids, pos, (size_t)k * sizeof *ids);
            if (k == 0) ids[0] = 0; /* read, never mapped */
        }
    }
    if (io->ids != NULL) g->backend_tensor_set(io->ids, ids, 0, (size_t)n_sel * sizeof *ids);
    if (io->map != NULL) g->backend_tensor_set(io->map, map, 0, (size_t)(n * H->n_down) * sizeof *map);
}

/* rows [a, a + n) of layer l's hot FFN: y = their partial sum, or with pi_gg_h_only their gate
 * products at y + a * n_hot and up products at y + n_batch * n_hot + a * n_hot (a row alone that
 * skips: its selected neurons' first, in sel_pos order) */
static int ffn_group(pi_gplaced *p, int l, const float *x, int64_t a, int64_t n, float *y) {
    const pi_ggml_api *g = p->g;
    const int64_t E = p->c->m->hp.n_embd, h_only = pi_gg_h_only(p, l), Y = h_only ? p->H[l].n_hot : E;
    const int64_t n_sel = n_sel_of(p, a, n), n_out = h_only && n_sel > 0 ? n_sel : Y;
    pthread_mutex_lock(&p->d->step_mu); /* the device's backend is shared by its placements */
    gctx *ctx = pi_gg_meta(g, p->graph_meta);
    pi_gg_io io;
    int rc = pi_gg_ffn(g, ctx, p->c, &p->H[l], n, (int)h_only, n_sel, &io);
    if (rc == PI_OK) rc = alloc(p, &io);
    if (rc == PI_OK) {
        g->backend_tensor_set(io.x, x + a * E, 0, (size_t)(n * E) * sizeof(float));
        if (n_sel >= 0) set_sel_inputs(p, l, a, n, n_sel, &io);
        rc = compute(p, &io);
    }
    if (rc == PI_OK) g->backend_tensor_get(io.out0, y + a * Y, 0, (size_t)(n * n_out) * sizeof(float));
    if (rc == PI_OK && h_only)
        g->backend_tensor_get(io.out1, y + (p->c->cp.n_batch + a) * Y, 0, (size_t)(n * n_out) * sizeof(float));
    g->free(ctx);
    pthread_mutex_unlock(&p->d->step_mu);
    return rc;
}

int pi_gg_run_ffn(pi_gplaced *p, int l, const float *x, float *y) {
    const pi_context *c = p->c;
    const int64_t t0 = pi_now_ns();
    int rc = PI_OK;
    for (int32_t i = 0; i < c->n_grp && rc == PI_OK; i++)
        rc = ffn_group(p, l, x, c->grp_off[i], c->grp_off[i + 1] - c->grp_off[i], y);
    pi_gg_trace_add(p, PI_GG_EV_FFN, l, t0, pi_now_ns());
    return rc;
}

/* output rows [a, a + n): embd and logits */
static int output_group(pi_gplaced *p, const float *x, int64_t a, int64_t n, float *logits, float *embd) {
    const pi_ggml_api *g = p->g;
    const pi_model_params *hp = &p->c->m->hp;
    pthread_mutex_lock(&p->d->step_mu); /* the device's backend is shared by its placements */
    gctx *ctx = pi_gg_meta(g, p->graph_meta);
    pi_gg_io io;
    int rc = pi_gg_output_graph(g, ctx, p->c, &p->O, n, &io);
    if (rc == PI_OK) rc = alloc(p, &io);
    if (rc == PI_OK) {
        g->backend_tensor_set(io.x, x + a * hp->n_embd, 0, (size_t)(n * hp->n_embd) * sizeof(float));
        rc = compute(p, &io);
    }
    if (rc == PI_OK) {
        g->backend_tensor_get(io.out0, embd + a * hp->n_embd, 0, (size_t)(n * hp->n_embd) * sizeof(float));
        g->backend_tensor_get(io.out1, logits + a * hp->n_vocab, 0, (size_t)(n * hp->n_vocab) * sizeof(float));
    }
    g->free(ctx);
    pthread_mutex_unlock(&p->d->step_mu);
    return rc;
}

int pi_gg_run_output(pi_gplaced *p, const float *x, float *logits, float *embd) {
    const pi_context *c = p->c;
    const int64_t t0 = pi_now_ns();
    int rc = PI_OK;
    for (int32_t i = 0; i < c->n_grp && rc == PI_OK; i++)
        rc = output_group(p, x, c->grp_off[i], c->grp_off[i + 1] - c->grp_off[i], logits, embd);
    pi_gg_trace_add(p, PI_GG_EV_OUTPUT, c->m->hp.n_layer, t0, pi_now_ns());
    return rc;
}
