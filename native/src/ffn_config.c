/* FFN configuration of a context: sparsity, predictors, threshold target, statistics, capture. */
#include <stdio.h>
#include <stdlib.h>

#include "context.h"

int pi_context_set_ffn_sparsity(pi_context *c, int32_t layer, const pi_tensor *down_t, float threshold) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_sparsity: NULL context");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    if (!(threshold >= 0.0f) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "threshold must be finite and >= 0, got %g", (double)threshold);
    if (c->down_t == NULL) {
        c->down_t = calloc((size_t)hp->n_layer, sizeof *c->down_t);
        c->ffn_threshold = calloc((size_t)hp->n_layer, sizeof *c->ffn_threshold);
        c->ffn_used = calloc((size_t)hp->n_layer * 2, sizeof *c->ffn_used);
        c->ffn_total = c->ffn_used ? c->ffn_used + hp->n_layer : NULL;
        if (c->down_t == NULL || c->ffn_threshold == NULL || c->ffn_used == NULL) {
            free(c->down_t);
            free(c->ffn_threshold);
            free(c->ffn_used);
            c->down_t = NULL;
            c->ffn_threshold = NULL;
            c->ffn_used = c->ffn_total = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the sparse FFN tables");
        }
    }
    if (down_t == NULL || down_t->data == NULL) {
        c->down_t[layer].data = NULL;
        return PI_OK;
    }
    char name[48];
    snprintf(name, sizeof name, "blk.%d.ffn_down_t", layer);
    const int32_t t = down_t->type;
    if (t != PI_TYPE_F32 && t != PI_TYPE_F16 && t != PI_TYPE_Q8_0 && t != PI_TYPE_Q4_0)
        return pi_set_error(PI_ERR_UNSUPPORTED, "%s: type %d, expected F32, F16, Q8_0 or Q4_0", name, t);
    int rc = pi_check_tensor(down_t, name, hp->n_embd, hp->n_ff, 0);
    if (rc) return rc;
    const pi_mat *lm = &c->m->mats[layer * PI_L_COUNT];
    if (lm[PI_L_FFN_GATE].data == NULL && hp->act == PI_ACT_SILU)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: the sparse FFN of an ungated layer needs ReLU or GELU", layer);
    if (lm[PI_L_FFN_GATE].data != NULL && lm[PI_L_FFN_GATE].type != lm[PI_L_FFN_UP].type)
        return pi_set_error(PI_ERR_UNSUPPORTED, "blk.%d: ffn_gate and ffn_up types differ; the sparse FFN needs one",
                            layer);
    if (c->ffn_scratch == NULL) { /* sized for the largest activation row of any up type (= gate type) */
        int64_t need = 0;
        for (int i = 0; i < hp->n_layer; i++) {
            const int64_t s = pi_ffn_sparse_scratch_size(c->m->mats[i * PI_L_COUNT + PI_L_FFN_UP].type, hp->n_embd,
                                                         hp->n_ff, c->cp.n_batch);
            need = s > need ? s : need;
        }
        c->ffn_scratch = malloc((size_t)need);
        c->ffn_y = pi_alloc_f((int64_t)c->cp.n_batch * hp->n_embd);
        c->ffn_used_tok = calloc((size_t)c->cp.n_batch, sizeof *c->ffn_used_tok);
        if (c->ffn_scratch == NULL || c->ffn_y == NULL || c->ffn_used_tok == NULL) {
            free(c->ffn_scratch);
            free(c->ffn_y);
            free(c->ffn_used_tok);
            c->ffn_scratch = NULL;
            c->ffn_y = NULL;
            c->ffn_used_tok = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the sparse FFN scratch");
        }
    }
    c->down_t[layer] = pi_mat_of(down_t);
    c->ffn_threshold[layer] = threshold;
    return PI_OK;
}

int pi_context_set_ffn_down_dense(pi_context *c, int32_t layer, int32_t on) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_down_dense: NULL context");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    const int was = c->ffn_dense_down != NULL && c->ffn_dense_down[layer];
    if (c->dev != NULL && was != (on != 0)) /* a placement uploaded the layer's down columns, or none */
        return pi_set_error(PI_ERR_INVALID, "blk.%d: the dense down is fixed once the context is placed on a device "
                            "(set it before placing)", layer);
    if (c->ffn_dense_down == NULL) {
        if (!on) return PI_OK;
        c->ffn_dense_down = calloc((size_t)hp->n_layer, 1);
        c->ffn_hd = pi_alloc_f((int64_t)c->cp.n_batch * hp->n_ff);
        if (c->ffn_dense_down == NULL || c->ffn_hd == NULL) {
            free(c->ffn_dense_down);
            free(c->ffn_hd);
            c->ffn_dense_down = NULL;
            c->ffn_hd = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the dense-down h rows");
        }
    }
    c->ffn_dense_down[layer] = on != 0;
    return PI_OK;
}

int pi_context_ffn_stats(pi_context *c, int64_t *used, int64_t *total, int32_t reset) {
    if (c == NULL || used == NULL || total == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_ffn_stats: NULL argument");
    const int32_t n = c->m->hp.n_layer;
    for (int32_t l = 0; l < n; l++) {
        used[l] = c->ffn_used ? c->ffn_used[l] : 0;
        total[l] = c->ffn_used ? c->ffn_total[l] : 0;
    }
    if (reset && c->ffn_used) memset(c->ffn_used, 0, (size_t)n * 2 * sizeof *c->ffn_used);
    return PI_OK;
}

static void set_hists(pi_context *c, uint32_t *follow, uint32_t *product, uint32_t *gate) {
    c->ffn_hists = (pi_ffn_hists){follow, product, gate};
    const int any = follow != NULL || product != NULL || gate != NULL;
    c->ffn_observer = any ? pi_ffn_hist_observe : NULL;
    c->ffn_observer_data = any ? &c->ffn_hists : NULL;
}

int pi_context_set_ffn_hist(pi_context *c, uint32_t *hist) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_hist: NULL context");
    set_hists(c, hist, NULL, NULL);
    return PI_OK;
}

int pi_context_set_ffn_hist2(pi_context *c, uint32_t *product, uint32_t *gate) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_hist2: NULL context");
    set_hists(c, NULL, product, gate);
    return PI_OK;
}

int pi_context_set_ffn_threshold_on(pi_context *c, int32_t on) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_threshold_on: NULL context");
    if (on != PI_FFN_ON_PRODUCT && on != PI_FFN_ON_GATE)
        return pi_set_error(PI_ERR_INVALID, "threshold target must be 0 (product h) or 1 (gate activation), got %d", on);
    c->ffn_on_gate = on;
    return PI_OK;
}

int pi_context_set_ffn_predictor(pi_context *c, int32_t layer, const pi_tensor *fc1, const pi_tensor *fc2,
                                 float threshold) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_predictor: NULL context");
    const pi_model_params *hp = &c->m->hp;
    if (layer < 0 || layer >= hp->n_layer)
        return pi_set_error(PI_ERR_INVALID, "layer %d is outside [0, %d)", layer, hp->n_layer);
    if (isnan(threshold) || isinf(threshold))
        return pi_set_error(PI_ERR_INVALID, "blk.%d: predictor threshold must be finite, got %g", layer,
                            (double)threshold);
    if (c->pred_fc1 == NULL) {
        const int64_t B = c->cp.n_batch, F = hp->n_ff;
        c->pred_fc1 = calloc((size_t)hp->n_layer, sizeof *c->pred_fc1);
        c->pred_fc2 = calloc((size_t)hp->n_layer, sizeof *c->pred_fc2);
        c->pred_threshold = calloc((size_t)hp->n_layer, sizeof *c->pred_threshold);
        c->pred_scores = pi_alloc_f(B * F);
        c->pred_active = malloc((size_t)(B * F) * sizeof *c->pred_active);
        c->pred_off = malloc((size_t)(B + 1) * sizeof *c->pred_off);
        c->pred_count = calloc((size_t)hp->n_layer * 3, sizeof *c->pred_count);
        if (!c->pred_fc1 || !c->pred_fc2 || !c->pred_threshold || !c->pred_scores || !c->pred_active ||
            !c->pred_off || !c->pred_count) {
            free(c->pred_fc1); free(c->pred_fc2); free(c->pred_threshold); free(c->pred_scores);
            free(c->pred_active); free(c->pred_off); free(c->pred_count);
            c->pred_fc1 = c->pred_fc2 = NULL;
            c->pred_threshold = NULL;
            c->pred_scores = NULL;
            c->pred_active = NULL;
            c->pred_off = c->pred_count = NULL;
            return pi_set_error(PI_ERR_NOMEM, "out of memory for the predictor tables");
        }
        c->pred_ns = c->pred_count + hp->n_layer;
        c->ffn_ns = c->pred_count + 2 * hp->n_layer;
    }
    if (fc1 == NULL || fc1->data == NULL) {
        c->pred_fc1[layer].data = NULL;
        return PI_OK;
    }
    char n1[48], n2[48];
    snprintf(n1, sizeof n1, "blk.%d.fc1.weight", layer);
    snprintf(n2, sizeof n2, "blk.%d.fc2.weight", layer);
    if (fc2 == NULL || fc2->data == NULL) return pi_set_error(PI_ERR_INVALID, "tensor %s: missing", n2);
    const int64_t rank = fc1->ne[1];
    if (rank < 1 || rank > hp->n_ff * 4)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: rank (ne[1]) %lld out of range [1, %lld]", n1,
                            (long long)rank, (long long)hp->n_ff * 4);
    int rc = pi_check_tensor(fc1, n1, hp->n_embd, rank, 0);
    if (rc) return rc;
    if (fc2->ne[0] != rank)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: rank %lld does not match %s's rank %lld", n2,
                            (long long)fc2->ne[0], n1, (long long)rank);
    if ((rc = pi_check_tensor(fc2, n2, rank, hp->n_ff, 0))) return rc;
    const pi_mat m1 = pi_mat_of(fc1), m2 = pi_mat_of(fc2);
    const int64_t need = pi_predictor_scratch_size(&m1, &m2, c->cp.n_batch);
    if (need > c->pred_scratch_size) {
        void *p = malloc((size_t)need);
        if (p == NULL) return pi_set_error(PI_ERR_NOMEM, "out of memory for the predictor scratch");
        free(c->pred_scratch);
        c->pred_scratch = p;
        c->pred_scratch_size = need;
    }
    c->pred_fc1[layer] = m1;
    c->pred_fc2[layer] = m2;
    c->pred_threshold[layer] = threshold;
    return PI_OK;
}

int pi_context_predictor_stats(pi_context *c, int64_t *predicted, int64_t *pred_ns, int64_t *ffn_ns,
                               int32_t reset) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_predictor_stats: NULL context");
    const int32_t n = c->m->hp.n_layer;
    for (int32_t l = 0; l < n; l++) {
        if (predicted) predicted[l] = c->pred_count ? c->pred_count[l] : 0;
        if (pred_ns) pred_ns[l] = c->pred_count ? c->pred_ns[l] : 0;
        if (ffn_ns) ffn_ns[l] = c->pred_count ? c->ffn_ns[l] : 0;
    }
    if (reset && c->pred_count) memset(c->pred_count, 0, (size_t)n * 3 * sizeof *c->pred_count);
    return PI_OK;
}

int pi_context_set_ffn_capture(pi_context *c, float *buf) {
    if (c == NULL) return pi_set_error(PI_ERR_INVALID, "pi_context_set_ffn_capture: NULL context");
    c->ffn_capture = buf;
    return PI_OK;
}
