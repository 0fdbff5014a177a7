/* Model lifetime: validation of the hyper-parameters and tensors, and the matrix views of the weights. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "context.h"

static const char *const k_slot_names[PI_L_COUNT] = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "attn_q_norm.weight", "attn_k_norm.weight",
    "post_attention_norm.weight", "post_ffw_norm.weight", "attn_q.bias", "attn_k.bias", "attn_v.bias",
    "attn_norm.bias", "ffn_norm.bias", "attn_qkv.weight", "attn_output.bias", "ffn_up.bias", "ffn_down.bias"};

/* ---- validation ---------------------------------------------------------- */

int pi_check_tensor(const pi_tensor *t, const char *name, int64_t ne0, int64_t ne1, int is_norm) {
    if (t->data == NULL) return pi_set_error(PI_ERR_INVALID, "tensor %s: missing (data is NULL)", name);
    const pi_type_traits *tr = pi_type_get(t->type);
    if (tr == NULL || !pi_type_is_weight(t->type))
        return pi_set_error(PI_ERR_UNSUPPORTED, "tensor %s: unsupported type %d", name, t->type);
    if (is_norm && t->type != PI_TYPE_F32)
        return pi_set_error(PI_ERR_UNSUPPORTED, "tensor %s: norm weights must be F32, got %s", name, tr->name);
    const int64_t n1 = is_norm ? 1 : ne1;
    if (t->ne[0] != ne0 || t->ne[1] != n1 || t->ne[2] != 1 || t->ne[3] != 1)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                            name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                            (long long)t->ne[3], (long long)ne0, (long long)n1);
    const int64_t row = pi_row_size(t->type, ne0);
    if (row < 0)
        return pi_set_error(PI_ERR_INVALID, "tensor %s: row length %lld is not a multiple of the %s block size",
                            name, (long long)ne0, tr->name);
    if (t->nbytes < (uint64_t)(row * n1))
        return pi_set_error(PI_ERR_INVALID, "tensor %s: %llu bytes, needs %lld", name,
                            (unsigned long long)t->nbytes, (long long)(row * n1));
    return PI_OK;
}

static int check_params(const pi_model_params *p) {
    if (p->n_vocab < 1 || p->n_embd < 1 || p->n_layer < 1 || p->n_ff < 1 || p->n_head < 1 ||
        p->n_head_kv < 1 || p->n_embd_head < 2 || p->n_vocab > (1 << 24) || p->n_embd > (1 << 20) ||
        p->n_ff > (1 << 22) || p->n_layer > 4096 || p->n_head > 4096 || p->n_embd_head > 4096)
        return pi_set_error(PI_ERR_INVALID,
                            "hyper-parameters out of range (n_vocab %d, n_embd %d, n_layer %d, n_ff %d, "
                            "n_head %d, n_head_kv %d, n_embd_head %d)",
                            p->n_vocab, p->n_embd, p->n_layer, p->n_ff, p->n_head, p->n_head_kv, p->n_embd_head);
    if (p->n_head % p->n_head_kv != 0)
        return pi_set_error(PI_ERR_INVALID, "n_head %d is not a multiple of n_head_kv %d", p->n_head, p->n_head_kv);
    if (p->n_rot < 2 || p->n_rot > p->n_embd_head || p->n_rot % 2 != 0 || p->n_rot > 1024)
        return pi_set_error(PI_ERR_INVALID, "n_rot %d must be even and in [2, n_embd_head=%d]", p->n_rot,
                            p->n_embd_head);
    if (!(p->rope_freq_base > 0.0f) || !(p->rope_freq_scale > 0.0f) || !(p->rms_eps >= 0.0f))
        return pi_set_error(PI_ERR_INVALID, "rope_freq_base, rope_freq_scale must be > 0 and rms_eps >= 0");
    if (p->rope_type != PI_ROPE_NORM && p->rope_type != PI_ROPE_NEOX && p->rope_type != PI_ROPE_NONE)
        return pi_set_error(PI_ERR_INVALID, "unknown rope type %d", p->rope_type);
    if (p->act < PI_ACT_SILU || p->act > PI_ACT_DRELU)
        return pi_set_error(PI_ERR_INVALID, "unknown activation %d", p->act);
    if (!(p->embd_scale >= 0.0f && p->embd_scale < INFINITY) || !(p->attn_scale >= 0.0f && p->attn_scale < INFINITY))
        return pi_set_error(PI_ERR_INVALID, "embd_scale and attn_scale must be finite and >= 0");
    if ((p->layer_norm != 0 && p->layer_norm != 1) || (p->parallel_residual != 0 && p->parallel_residual != 1))
        return pi_set_error(PI_ERR_INVALID, "layer_norm %d and parallel_residual %d must be 0 or 1", p->layer_norm,
                            p->parallel_residual);
    if (p->n_swa < 0 || p->swa_pattern < 0)
        return pi_set_error(PI_ERR_INVALID, "n_swa %d and swa_pattern %d must be >= 0", p->n_swa, p->swa_pattern);
    if (p->n_swa > 0 && (!(p->rope_freq_base_swa > 0.0f) || !(p->rope_freq_scale_swa > 0.0f)))
        return pi_set_error(PI_ERR_INVALID, "rope_freq_base_swa and rope_freq_scale_swa must be > 0 with n_swa > 0");
    if (p->layers == NULL) return pi_set_error(PI_ERR_INVALID, "layers is NULL");
    int rc;
    const int64_t E = p->n_embd, F = p->n_ff, Q = (int64_t)p->n_head * p->n_embd_head,
                  KV = (int64_t)p->n_head_kv * p->n_embd_head;
    if ((rc = pi_check_tensor(&p->tok_embd, "token_embd.weight", E, p->n_vocab, 0))) return rc;
    if ((rc = pi_check_tensor(&p->output_norm, "output_norm.weight", E, 1, 1))) return rc;
    if (p->output.data != NULL && (rc = pi_check_tensor(&p->output, "output.weight", E, p->n_vocab, 0))) return rc;
    if (p->rope_freqs.data != NULL && (rc = pi_check_tensor(&p->rope_freqs, "rope_freqs.weight", p->n_rot / 2, 1, 1)))
        return rc;
    if (p->output_norm_b.data != NULL && (rc = pi_check_tensor(&p->output_norm_b, "output_norm.bias", E, 1, 1)))
        return rc;
    if (p->pos_embd.data != NULL) {
        if (p->pos_offset < 0 || p->pos_offset >= p->pos_embd.ne[1])
            return pi_set_error(PI_ERR_INVALID, "pos_offset %d is outside position_embd.weight's %lld rows",
                                p->pos_offset, (long long)p->pos_embd.ne[1]);
        if ((rc = pi_check_tensor(&p->pos_embd, "position_embd.weight", E, p->pos_embd.ne[1], 0))) return rc;
    }
    const int64_t H = p->n_embd_head;
    const int64_t shapes[PI_L_COUNT][2] = {{E, 1}, {E, Q}, {E, KV}, {E, KV}, {Q, E}, {E, 1}, {E, F}, {E, F}, {F, E},
                                           {H, 1}, {H, 1}, {E, 1}, {E, 1}, {Q, 1}, {KV, 1}, {KV, 1},
                                           {E, 1}, {E, 1}, {E, Q + 2 * KV}, {E, 1}, {F, 1}, {E, 1}};
    for (int l = 0; l < p->n_layer; l++) {
        const pi_tensor *lt = &p->layers[l * PI_L_COUNT];
        const int fused = lt[PI_L_ATTN_QKV].data != NULL; /* Falcon: q, k, v rows of one tensor */
        for (int s = 0; s < PI_L_COUNT; s++) {
            const pi_tensor *t = &lt[s];
            const int optional = s > PI_L_FFN_DOWN || s == PI_L_FFN_GATE ||
                                 (fused && (s == PI_L_ATTN_Q || s == PI_L_ATTN_K || s == PI_L_ATTN_V));
            if (optional && t->data == NULL) continue; /* absent */
            char name[64];
            snprintf(name, sizeof name, "blk.%d.%s", l, k_slot_names[s]);
            if (fused && (s == PI_L_ATTN_Q || s == PI_L_ATTN_K || s == PI_L_ATTN_V))
                return pi_set_error(PI_ERR_INVALID, "tensor %s: not expected with blk.%d.attn_qkv.weight", name, l);
            const int vec = s == PI_L_ATTN_NORM || s == PI_L_FFN_NORM || (s > PI_L_FFN_DOWN && s != PI_L_ATTN_QKV);
            if ((rc = pi_check_tensor(t, name, shapes[s][0], shapes[s][1], vec))) return rc;
        }
    }
    return PI_OK;
}

int pi_model_create(const pi_model_params *params, pi_model **out) {
    if (params == NULL || out == NULL) return pi_set_error(PI_ERR_INVALID, "pi_model_create: NULL argument");
    *out = NULL;
    int rc = check_params(params);
    if (rc) return rc;
    pi_model *m = calloc(1, sizeof *m);
    const size_t n = (size_t)params->n_layer * PI_L_COUNT;
    if (m == NULL || (m->layers = malloc(n * sizeof *m->layers)) == NULL ||
        (m->mats = malloc(n * sizeof *m->mats)) == NULL || (m->row_mats = malloc(n * sizeof *m->row_mats)) == NULL ||
        (m->repacked = calloc(n + 1, sizeof *m->repacked)) == NULL) {
        pi_model_free(m);
        return pi_set_error(PI_ERR_NOMEM, "out of memory for the model");
    }
    m->hp = *params;
    memcpy(m->layers, params->layers, n * sizeof *m->layers);
    m->hp.layers = m->layers;
    m->tok_embd = pi_mat_of(&params->tok_embd);
    m->output = pi_mat_of(params->output.data != NULL ? &params->output : &params->tok_embd);
    m->max_act_fixed = pi_matmul_scratch_fixed(m->output.type, m->output.n_cols);
    m->max_act_row = pi_matmul_scratch_size(m->output.type, m->output.n_cols, 1) - m->max_act_fixed;
    for (size_t i = 0; i < n; i++) {
        m->mats[i] = pi_mat_of(&m->layers[i]);
        const int64_t f = pi_matmul_scratch_fixed(m->mats[i].type, m->mats[i].n_cols);
        const int64_t s = pi_matmul_scratch_size(m->mats[i].type, m->mats[i].n_cols, 1) - f;
        if (s > m->max_act_row) m->max_act_row = s;
        if (f > m->max_act_fixed) m->max_act_fixed = f;
    }
    for (int l = 0; l < params->n_layer; l++) { /* a fused qkv tensor: q, k, v are row ranges of it */
        pi_mat *lm = &m->mats[l * PI_L_COUNT];
        const pi_mat f = lm[PI_L_ATTN_QKV];
        if (f.data == NULL) continue;
        const int64_t row = pi_row_size(f.type, f.n_cols), Q = (int64_t)params->n_head * params->n_embd_head,
                      KV = (int64_t)params->n_head_kv * params->n_embd_head;
        lm[PI_L_ATTN_Q] = (pi_mat){f.data, f.type, f.n_cols, Q};
        lm[PI_L_ATTN_K] = (pi_mat){(const char *)f.data + Q * row, f.type, f.n_cols, KV};
        lm[PI_L_ATTN_V] = (pi_mat){(const char *)f.data + (Q + KV) * row, f.type, f.n_cols, KV};
    }
    memcpy(m->row_mats, m->mats, n * sizeof *m->mats);
    *out = m;
    return PI_OK;
}

/* ---- row groups ---------------------------------------------------------- */

/* drop this process's pages of [p, p + n) inside [lo, hi) (whole pages only) */
static void release_pages(const void *p, int64_t n, const void *lo, const void *hi) {
    const uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)n;
    if (lo == NULL || a < (uintptr_t)lo || e > (uintptr_t)hi) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a0 = (a + page - 1) / page * page, e0 = e / page * page;
    if (e0 > a0) madvise((void *)a0, e0 - a0, MADV_DONTNEED);
}

/* mat (in *slot, with *buf its owned buffer) repacked when its type and rows allow */
static int repack_mat(pi_mat *mat, void **buf, const void *lo, const void *hi, int64_t *bytes) {
    const int64_t size = pi_repack_size(mat->type, mat->n_rows, mat->n_cols);
    if (mat->grouped || mat->data == NULL || size < 0) return PI_OK;
    void *b = aligned_alloc(64, (size_t)pi_align_up(size, 64));
    if (b == NULL) return pi_set_error(PI_ERR_NOMEM, "pi_model_repack: out of memory for %lld bytes", (long long)size);
    pi_repack(mat->type, mat->data, mat->n_rows, mat->n_cols, b);
    release_pages(mat->data, size, lo, hi);
    *buf = b;
    *mat = (pi_mat){b, mat->type, mat->n_cols, mat->n_rows, 1};
    *bytes += size;
    return PI_OK;
}

int pi_model_repack(pi_model *m, const uint32_t *layer_slots, int32_t output, const void *release_lo,
                    const void *release_hi, int64_t *bytes) {
    if (m == NULL) return pi_set_error(PI_ERR_INVALID, "pi_model_repack: NULL model");
    if ((release_lo == NULL) != (release_hi == NULL) || (uintptr_t)release_hi < (uintptr_t)release_lo)
        return pi_set_error(PI_ERR_INVALID, "pi_model_repack: release range must be both NULL or lo <= hi");
    int64_t done = 0;
    int rc = PI_OK;
    for (int l = 0; layer_slots != NULL && l < m->hp.n_layer && rc == PI_OK; l++) {
        const int fused = m->layers[l * PI_L_COUNT + PI_L_ATTN_QKV].data != NULL; /* q, k, v: views of one tensor */
        for (int s = 0; s < PI_L_COUNT && rc == PI_OK; s++)
            if ((layer_slots[l] >> s) & 1u && !(fused && (s == PI_L_ATTN_Q || s == PI_L_ATTN_K || s == PI_L_ATTN_V)))
                rc = repack_mat(&m->mats[l * PI_L_COUNT + s], &m->repacked[l * PI_L_COUNT + s], release_lo,
                                release_hi, &done);
    }
    /* a tied output is token_embd: its lookup reads the file's rows (m->tok_embd), which fault
     * back in one by one, as the tokens come */
    if (output && rc == PI_OK)
        rc = repack_mat(&m->output, &m->repacked[(size_t)m->hp.n_layer * PI_L_COUNT], release_lo, release_hi, &done);
    if (bytes != NULL) *bytes = done;
    return rc;
}

void pi_model_free(pi_model *m) {
    if (m == NULL) return;
    if (m->repacked != NULL)
        for (size_t i = 0; i <= (size_t)m->hp.n_layer * PI_L_COUNT; i++) free(m->repacked[i]);
    free(m->repacked);
    free(m->layers);
    free(m->mats);
    free(m->row_mats);
    free(m);
}
