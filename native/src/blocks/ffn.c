/* The FFN forms of a layer: dense, sparse (down_t rows), split with a device (its hot rows
 * started, the cold rows here, then its partial sum continued), and the residual after them. */
#include "blocks.h"
#include "device/device.h"

typedef struct {
    int32_t act;
    const float *g, *u; /* u NULL: ungated */
    float *h;
    int64_t n;
} act_job;

static void act_task(void *varg, int ith, int nth) {
    const act_job *j = varg;
    int64_t lo, hi;
    pi_split(j->n, ith, nth, &lo, &hi);
    pi_ffn_act_mul(j->act, j->g + lo, j->u ? j->u + lo : NULL, j->h + lo, hi - lo);
}

/* h = act(g) * u over n_tok rows (ungated: h = act(g)), into c->u so that c->g keeps the
 * pre-activation for the observer; split across the pool for prompt batches. Returns h. */
static float *act_mul(pi_context *c, int64_t n_tok, int gated) {
    act_job j = {c->m->hp.act, c->g, gated ? c->u : NULL, c->u, n_tok * c->m->hp.n_ff};
    if (n_tok == 1)
        act_task(&j, 0, 1);
    else
        pi_pool_run(c->pool, act_task, &j);
    return c->u;
}

/* The FFN's input products of layer l for the normed rows c->xn: c->g = gate x and
 * c->u = up x (+ bias); an ungated layer (Falcon, OPT) has only c->g = up x + bias.
 * mats: the model's mats (the dense FFN, the product form) or row_mats (a predictor's
 * batch, whose gathered rows must give the same bits). Returns 1 when gated. */
static int ffn_gate_up(pi_context *c, const pi_mat *mats, int l, int64_t n_tok) {
    const pi_mat *lm = &mats[l * PI_L_COUNT];
    const int64_t F = c->m->hp.n_ff;
    const int gated = lm[PI_L_FFN_GATE].data != NULL;
    float *up = gated ? c->u : c->g;
    const pi_matmul_out gu[2] = {{&lm[PI_L_FFN_UP], up, F}, {&lm[PI_L_FFN_GATE], c->g, F}};
    pi_matmul_multi(c->pool, gu, gated ? 2 : 1, c->xn, n_tok, c->act_scratch);
    pi_bias_opt(&c->m->hp.layers[l * PI_L_COUNT + PI_L_FFN_UP_BIAS], up, F, n_tok);
    return gated;
}

/* the pi_ffn_act form of layer l's FFN (an ungated form without a gate) */
static int32_t ffn_form(const pi_model *m, int l) {
    static const int32_t form[] = {[PI_ACT_SILU] = PI_FFN_SWIGLU, [PI_ACT_GELU] = PI_FFN_GEGLU,
                                   [PI_ACT_RELU] = PI_FFN_RELU, [PI_ACT_DRELU] = PI_FFN_DRELU};
    if (m->mats[l * PI_L_COUNT + PI_L_FFN_GATE].data == NULL) /* ungated (Falcon, OPT) */
        return m->hp.act == PI_ACT_GELU ? PI_FFN_GELU_UP : PI_FFN_RELU_UP;
    return form[m->hp.act];
}

/* x += post_ffn_norm(y + down bias) over n_tok rows: the end of every FFN form */
static void ffn_out(pi_context *c, int l, float *y, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    pi_bias_opt(&hp->layers[l * PI_L_COUNT + PI_L_FFN_DOWN_BIAS], y, hp->n_embd, n_tok); /* OPT, Falcon files */
    pi_norm_opt(&hp->layers[l * PI_L_COUNT + PI_L_FFN_POST_NORM], y, hp->n_embd, n_tok, hp->rms_eps); /* Gemma */
    pi_add_rows(c->x, y, n_tok * hp->n_embd);
}

void pi_ffn_dense(pi_context *c, int l, int64_t n_tok) {
    const pi_model_params *hp = &c->m->hp;
    const int gated = ffn_gate_up(c, c->m->mats, l, n_tok);
    pi_prof_lap(c, PI_PROF_FFN_GATE_UP);
    const float *h = act_mul(c, n_tok, gated);
    if (c->ffn_observer != NULL) { /* the one observation point (calibration histograms) */
        const pi_ffn_obs o = {c->pool, l, hp->act, c->ffn_on_gate, n_tok, hp->n_ff, c->g, h};
        c->ffn_observer(c->ffn_observer_data, &o);
    }
    pi_prof_lap(c, PI_PROF_FFN_ACT);
    pi_matmul1(c, &c->m->mats[l * PI_L_COUNT + PI_L_FFN_DOWN], h, n_tok, c->xn);
    ffn_out(c, l, c->xn, n_tok);
    pi_prof_lap(c, PI_PROF_FFN_DOWN);
}

/* The sparse FFN of layer l (see pi_context_set_ffn_sparsity). A batch thresholding
 * the product computes gate and up with the dense matmul (each weight row is read once
 * for the batch instead of once per token; row groups where the model has them) and
 * skips rows of down_t per token (decode as well for SwiGLU/GeGLU); the gate form, and a
 * predictor's or a ReLU form's decode, gather rows per token. */
pi_ffn_sparse_args pi_ffn_sparse_base(const pi_context *c, int l, int64_t n_tok) {
    const pi_mat *lm = &c->m->row_mats[l * PI_L_COUNT];
    const int gated = lm[PI_L_FFN_GATE].data != NULL; /* else an ungated form (Falcon, OPT) */
    return (pi_ffn_sparse_args){.act = ffn_form(c->m, l), .gate = gated ? &lm[PI_L_FFN_GATE] : NULL,
                                .up = &lm[PI_L_FFN_UP], .down_t = &c->down_t[l], .x = c->xn, .n_tok = n_tok,
                                .threshold = c->ffn_threshold[l], .y = c->ffn_y, .n_used = c->ffn_used_tok};
}

/* layer l's predictor: scores of the rows c->xn into c->pred_scores (unless scored: kept from
 * before), then per token the neurons among `among` (NULL: all n_ff) it selects into ids / off
 * (increasing ids); the count of every neuron it selects (predictor_stats) is added once, with
 * the scores */
static void predict(pi_context *c, int l, int64_t n_tok, int scored, const int32_t *among, int64_t n_among,
                    int32_t *ids, int64_t *off) {
    const int64_t t0 = pi_now_ns(), F = c->m->hp.n_ff;
    if (!scored)
        pi_predictor_scores(c->pool, &c->pred_fc1[l], &c->pred_fc2[l], c->xn, n_tok, c->pred_scores, c->pred_scratch);
    const int64_t n = pi_predictor_select(c->pred_scores, n_tok, F, c->pred_threshold[l], among, n_among, ids, off);
    if (!scored) c->pred_count[l] += n;
    c->pred_ns[l] += pi_now_ns() - t0;
}

void pi_ffn_sparse_layer(pi_context *c, int l, int64_t n_tok) {
    const int64_t F = c->m->hp.n_ff;
    const int pred = pi_has_predictor(c, l);
    const int64_t t0 = pred ? pi_now_ns() : 0;
    const int32_t *active = NULL;
    const int64_t *active_off = NULL;
    if (pred) { /* scores -> per-token active lists (increasing ids) */
        predict(c, l, n_tok, 0, NULL, 0, c->pred_active, c->pred_off);
        active = c->pred_active;
        active_off = c->pred_off;
    }
    float *h = NULL;
    /* the gated product form reads every gate and up row: the dense matmuls (the decode
     * kernels for one token) give each row's bits faster than gathered row dots, and h the
     * same activation as a batch. Gathered instead: a predictor's decode, and the ReLU forms'
     * decode (no up row where the gate is <= 0) */
    const int32_t form = ffn_form(c->m, l);
    const int every_row = form == PI_FFN_SWIGLU || form == PI_FFN_GEGLU;
    if (!c->ffn_on_gate && (n_tok > 1 || (every_row && !pred))) {
        /* a predictor's batch must give its gathered decode's bits (the file's rows); the
         * product form reads every row alike in decode and batches: the dense layout */
        h = act_mul(c, n_tok, ffn_gate_up(c, pred ? c->m->row_mats : c->m->mats, l, n_tok));
        pi_prof_lap(c, PI_PROF_FFN_GATE_UP);
        if (pred) { /* batched: the same bits as gathered rows; unpredicted neurons are zeroed */
            for (int64_t i = 0; i < n_tok * F; i++)
                if (!(c->pred_scores[i] >= c->pred_threshold[l])) h[i] = 0.0f;
            active = NULL;
            active_off = NULL;
        }
    }
    pi_ffn_sparse_args a = pi_ffn_sparse_base(c, l, n_tok);
    a.active = active;
    a.active_off = active_off;
    a.on_gate = c->ffn_on_gate;
    a.h = h;
    a.up_bias = c->m->hp.layers[l * PI_L_COUNT + PI_L_FFN_UP_BIAS].data; /* ungated forms */
    const int dense_down = c->ffn_dense_down != NULL && c->ffn_dense_down[l];
    if (dense_down) { /* h (skipped neurons 0) through the GGUF ffn_down: fewer bytes at a high density */
        a.phase = 1;
        a.h_dense = c->ffn_hd;
    }
    pi_ffn_sparse(c->pool, &a, c->ffn_scratch);
    /* down_t (unless pi_matmul1 counts the dense down), and gate/up gathered here */
    pi_weight_passes += (dense_down ? 0 : 1) + (h != NULL ? 0 : a.gate != NULL ? 2 : 1);
    if (dense_down) pi_matmul1(c, &c->m->mats[l * PI_L_COUNT + PI_L_FFN_DOWN], c->ffn_hd, n_tok, c->ffn_y);
    if (pred) c->ffn_ns[l] += pi_now_ns() - t0;
    pi_ffn_sparse_done(c, l, n_tok);
}

void pi_ffn_sparse_done(pi_context *c, int l, int64_t n_tok) {
    for (int64_t t = 0; t < n_tok; t++) c->ffn_used[l] += c->ffn_used_tok[t];
    c->ffn_total[l] += n_tok * c->m->hp.n_ff;
    ffn_out(c, l, c->ffn_y, n_tok);
}

/* layer l's cold candidates per token into cold->ids_buf / off_buf: every cold id, or with a
 * predictor the cold ids it selects (scored here while the device runs the hot rows, unless
 * scored before the device started) */
static void cold_lists(pi_context *c, int l, int64_t n_tok, const pi_dev_cold *cold, int scored) {
    const int64_t n = cold->n;
    if (!pi_has_predictor(c, l)) {
        for (int64_t t = 0; t <= n_tok; t++) {
            cold->off_buf[t] = t * n;
            if (t < n_tok) memcpy(cold->ids_buf + t * n, cold->ids, (size_t)n * sizeof *cold->ids);
        }
        return;
    }
    predict(c, l, n_tok, scored, cold->ids, n, cold->ids_buf, cold->off_buf);
}

/* the CPU half of a split: the sparse FFN over layer l's cold candidates (cold_lists; base->active
 * ignored); phase 1 their h (and the per-token counts), phase 2 y continued by their sum in id order */
static void ffn_cold(pi_context *c, const pi_ffn_sparse_args *base, const pi_dev_cold *cold, int32_t phase) {
    const int64_t n_tok = base->n_tok;
    if (cold->n == 0) {
        if (phase == 1 && base->n_used) memset(base->n_used, 0, (size_t)n_tok * sizeof *base->n_used);
        if (phase == 1 && base->h_dense) memset(base->h_dense, 0, (size_t)(n_tok * c->m->hp.n_ff) * sizeof(float));
        return;
    }
    pi_ffn_sparse_args a = *base;
    a.phase = phase;
    a.active = cold->ids_buf;
    a.active_off = cold->off_buf;
    pi_ffn_sparse(c->pool, &a, c->ffn_scratch);
}

int pi_ffn_split_layer(pi_context *c, int l, int64_t n_tok) {
    pi_dev *d = c->dev;
    if (d == NULL) return 0;
    const int pred = pi_has_predictor(c, l);
    const int64_t t0 = pred ? pi_now_ns() : 0;
    /* a device half that skips what the predictor leaves out needs its choice first (the scores
     * then serve the cold half too); else the scores overlap the device's hot rows */
    const int scored = pred && d->iface.ffn_skips(d, l);
    if (scored) predict(c, l, n_tok, 0, NULL, 0, c->pred_active, c->pred_off);
    const pi_dev_active act = {c->pred_active, c->pred_off};
    pi_dev_cold cold;
    if (!d->iface.ffn_start(d, c, l, n_tok, scored ? &act : NULL, &cold)) return 0; /* not when scored */
    if (cold.n > 0)
        cold_lists(c, l, n_tok, &cold, scored);
    else if (pred) /* every neuron on the device: no scores needed, all of them computed */
        c->pred_count[l] += n_tok * c->m->hp.n_ff;
    pi_ffn_sparse_args a = pi_ffn_sparse_base(c, l, n_tok);
    a.on_gate = c->ffn_on_gate; /* the gate form skips a cold neuron's up and down rows */
    /* the down over the GGUF ffn_down (skipped h 0, the hot rows' h from the device) where that
     * reads fewer bytes than the cold down_t rows: the CPU-only dense FFN's bytes and arithmetic */
    const int dense_down = c->ffn_dense_down != NULL && c->ffn_dense_down[l];
    a.h_dense = dense_down ? c->ffn_hd : NULL;
    ffn_cold(c, &a, &cold, 1); /* the cold rows' h while the device computes the hot rows */
    /* y = the device's partial sum, continued by the cold rows (a failure fails the eval: error()) */
    if (d->iface.ffn_finish(d, c, l, n_tok, a.y, a.n_used) == PI_OK) {
        if (!dense_down) {
            ffn_cold(c, &a, &cold, 2);
        } else { /* the device put the hot neurons' h among the cold ones: every neuron's down as dense */
            pi_matmul1(c, &c->m->mats[l * PI_L_COUNT + PI_L_FFN_DOWN], c->ffn_hd, n_tok, a.y);
        }
    }
    if (pred) c->ffn_ns[l] += pi_now_ns() - t0;
    pi_ffn_sparse_done(c, l, n_tok);
    return 1;
}
