/* The compute buffer's size: ggml-alloc's own sizing (gallocr) of the worst-case graphs. */
#include <stdlib.h>

#include "device/ggml/measure.h"

enum { MAX_STANDINS = PI_L_COUNT + 8 };

typedef struct {
    const pi_ggml_api *g;
    gctx *ctx;      /* stand-ins' metadata (NULL: only the largest size is wanted) */
    gt *made[MAX_STANDINS];
    int n;
    size_t max_bytes;
} standins;

static void visit(void *user, int32_t type, int64_t ne0, int64_t ne1, gt **dst) {
    standins *s = user;
    const size_t n = s->g->row_size(type, ne0) * (size_t)ne1;
    if (n > s->max_bytes) s->max_bytes = n;
    if (s->ctx == NULL || s->n == MAX_STANDINS) return;
    *dst = s->made[s->n++] = s->g->new_tensor_2d(s->ctx, type, ne0, ne1);
}

int pi_gg_flash_supported(const pi_gdev *d, const pi_context *c) {
    const pi_ggml_api *g = d->g;
    /* "0": mul_mat + soft_max_ext even where FA runs; "1": FA where it runs, ggml's CPU backend too */
    const char *env = getenv("POWERINFER_GGML_FLASH_ATTN");
    if (env != NULL && strcmp(env, "0") == 0) return 0;
    /* ggml's CPU flash attention accumulates V in F16: mul_mat + soft_max_ext, llama.cpp's default
     * CPU arithmetic, moves SmolLM2's greedy tokens less (docs/placement.md, "Accuracy") */
    if (d->is_cpu && (env == NULL || strcmp(env, "1") != 0)) return 0;
    const pi_model_params *hp = &c->m->hp;
    _Alignas(64) char meta[8192];
    if (g->tensor_overhead() * 6 > sizeof meta) return 0;
    gctx *ctx = g->init((pi_ggml_init_params){sizeof meta, meta, true});
    if (ctx == NULL) return 0;
    const int64_t H = hp->n_embd_head, B = c->cp.n_batch, N = c->seq_cells;
    gt *q = g->new_tensor_3d(ctx, PI_G_TYPE_F32, H, B, hp->n_head);
    gt *k = g->new_tensor_3d(ctx, c->cp.kv_type, H, N, hp->n_head_kv);
    gt *v = g->new_tensor_3d(ctx, c->cp.kv_type, H, N, hp->n_head_kv);
    gt *mask = g->new_tensor_2d(ctx, PI_G_TYPE_F16, N, B);
    gt *fa = g->flash_attn_ext(ctx, q, k, v, mask, 1.0f, 0.0f, 0.0f);
    const int ok = g->backend_dev_supports_op(d->dev, fa);
    g->free(ctx);
    return ok;
}

int pi_gg_skips_supported(const pi_gdev *d, const pi_context *c, int l) {
    const pi_ggml_api *g = d->g;
    const pi_tensor *lt = &c->m->hp.layers[l * PI_L_COUNT];
    const int64_t E = c->m->hp.n_embd;
    _Alignas(64) char meta[8192];
    if (g->tensor_overhead() * 12 > sizeof meta) return pi_set_error(PI_ERR_NOMEM, "ggml device: metadata too large");
    gctx *ctx = g->init((pi_ggml_init_params){sizeof meta, meta, true});
    if (ctx == NULL) return pi_set_error(PI_ERR_NOMEM, "ggml device: out of memory");
    int rc = PI_OK;
    const int32_t types[2] = {lt[PI_L_FFN_GATE].type, lt[PI_L_FFN_UP].type};
    gt *x = g->new_tensor_3d(ctx, PI_G_TYPE_F32, E, 1, 1), *ids = g->new_tensor_2d(ctx, PI_G_TYPE_I32, 4, 1);
    for (int i = 0; i < 2 && rc == PI_OK; i++) {
        gt *rows = g->new_tensor_3d(ctx, types[i], E, 1, 64);
        if (!g->backend_dev_supports_op(d->dev, g->mul_mat_id(ctx, rows, x, ids)))
            rc = pi_set_error(PI_ERR_UNSUPPORTED, "ggml device %s: no ggml_mul_mat_id over %s rows (blk.%d), which "
                              "skipping unselected hot neurons needs: place with device_skips off", d->name,
                              g->type_name(types[i]), l);
    }
    gt *h = g->new_tensor_3d(ctx, PI_G_TYPE_F32, 1, 5, 1), *map = g->new_tensor_2d(ctx, PI_G_TYPE_I32, 32, 1);
    if (rc == PI_OK && !g->backend_dev_supports_op(d->dev, g->get_rows(ctx, h, map)))
        rc = pi_set_error(PI_ERR_UNSUPPORTED, "ggml device %s: no ggml_get_rows of F32, which skipping unselected "
                          "hot neurons needs: place with device_skips off", d->name);
    g->free(ctx);
    return rc;
}

/* size (or reserve) one graph; the largest so far in *max */
static int size_graph(const pi_ggml_api *g, struct ggml_gallocr *ga, int reserve, struct ggml_cgraph *gf,
                      int64_t *max) {
    size_t n = 0;
    if (reserve) {
        if (!g->gallocr_reserve(ga, gf)) return pi_set_error(PI_ERR_NOMEM, "ggml device: compute buffer reserve failed");
        n = g->gallocr_get_buffer_size(ga, 0);
    } else {
        g->gallocr_reserve_n_size(ga, gf, NULL, NULL, &n);
    }
    if ((int64_t)n > *max) *max = (int64_t)n;
    return PI_OK;
}

/* size (or reserve) layer l's FFN graph over H for n_tok rows (pi_gg_ffn's n_sel) */
static int size_ffn(const pi_ggml_api *g, struct ggml_gallocr *ga, int reserve, const pi_context *c, const pi_gg_hot *H,
                    int64_t n_tok, int64_t n_sel, char *graph_meta, int64_t *max) {
    gctx *gc = pi_gg_meta(g, graph_meta);
    pi_gg_io io;
    int rc = pi_gg_ffn(g, gc, c, H, n_tok, 0, n_sel, &io);
    if (rc == PI_OK) rc = size_graph(g, ga, reserve, io.gf, max);
    g->free(gc);
    return rc;
}

/* the stand-ins made so far, all at the block's start (their data is never read) */
static int place_standins(const pi_ggml_api *g, standins *s, void *block, size_t block_bytes) {
    gbuf_t buf = g->backend_cpu_buffer_from_ptr(block, block_bytes);
    if (buf == NULL) return pi_set_error(PI_ERR_NOMEM, "ggml device: no host buffer for the sizing stand-ins");
    for (int i = 0; i < s->n; i++) g->backend_tensor_alloc(buf, s->made[i], block);
    g->backend_buffer_free(buf); /* frees the descriptor only: the block stays ours */
    return PI_OK;
}

/* the model's largest tensor of the worst case, in host bytes */
static size_t largest(const pi_ggml_api *g, const pi_context *c) {
    standins s = {.g = g};
    const pi_gg_visit v = {visit, &s};
    pi_gg_layer L;
    pi_gg_hot H;
    pi_gg_output O;
    for (int l = 0; l < c->m->hp.n_layer; l++) {
        pi_gg_layer_tensors(c, l, 1, c->m->hp.n_ff, 1, &v, &L, &H);
        pi_gg_layer_tensors(c, l, 0, c->m->hp.n_ff - 1, 1, &v, &L, &H); /* the most gathered down columns */
    }
    pi_gg_kv_tensors(c, &v, &L);
    pi_gg_output_tensors(c, &v, &O);
    return s.max_bytes;
}

static int measure_with(const pi_gdev *d, const pi_context *c, int flash, struct ggml_gallocr *ga, int reserve,
                        void *block, size_t block_bytes, char *meta, char *graph_meta, int64_t *out) {
    const pi_ggml_api *g = d->g;
    const pi_model_params *hp = &c->m->hp;
    const size_t meta_bytes = g->tensor_overhead() * MAX_STANDINS;
    int rc = PI_OK;
    for (int l = 0; l <= hp->n_layer && rc == PI_OK; l++) { /* l == n_layer: the output block */
        standins s = {.g = g, .ctx = g->init((pi_ggml_init_params){meta_bytes, meta, true})};
        gctx *gc = pi_gg_meta(g, graph_meta);
        const pi_gg_visit v = {visit, &s};
        pi_gg_layer L, Lg;
        pi_gg_hot H, Hg = {0};
        pi_gg_output O;
        pi_gg_io io;
        const int gated = l < hp->n_layer && hp->layers[l * PI_L_COUNT + PI_L_FFN_GATE].data != NULL;
        if (l < hp->n_layer) {
            pi_gg_layer_tensors(c, l, 1, gated ? hp->n_ff : 0, 1, &v, &L, &H);
            pi_gg_kv_tensors(c, &v, &L);
            /* the FFN as stored, and the most neurons gathered (h padded to the down's blocks) */
            if (gated && hp->n_ff > 1) pi_gg_layer_tensors(c, l, 0, hp->n_ff - 1, 1, &v, &Lg, &Hg);
        } else {
            pi_gg_output_tensors(c, &v, &O);
        }
        rc = place_standins(g, &s, block, block_bytes);
        if (rc == PI_OK && l < hp->n_layer) {
            /* a step's graphs are per sequence (device.h): at most n_batch rows over one slot's cells */
            rc = pi_gg_attn(g, gc, c, l, &L, c->cp.n_batch, 0, c->seq_cells, flash, &io);
            if (rc == PI_OK) rc = size_graph(g, ga, reserve, io.gf, out);
            g->free(gc); /* graph_meta is the next graph's */
            gc = NULL;
            const int64_t B = c->cp.n_batch;
            if (rc == PI_OK && gated) rc = size_ffn(g, ga, reserve, c, &H, B, -1, graph_meta, out);
            if (rc == PI_OK && Hg.n_hot > 0) rc = size_ffn(g, ga, reserve, c, &Hg, B, -1, graph_meta, out);
            if (rc == PI_OK && Hg.n_hot > 0 && pi_has_predictor(c, l)) {
                /* a split layer whose device half skips what the predictor leaves out (ggml_placed.c) */
                rc = size_ffn(g, ga, reserve, c, &Hg, B, 0, graph_meta, out);
                if (rc == PI_OK) rc = size_ffn(g, ga, reserve, c, &Hg, 1, Hg.n_hot, graph_meta, out);
            }
        } else if (rc == PI_OK) {
            rc = pi_gg_output_graph(g, gc, c, &O, c->cp.n_batch, &io);
            if (rc == PI_OK) rc = size_graph(g, ga, reserve, io.gf, out);
        }
        g->free(gc);
        g->free(s.ctx);
    }
    return rc;
}

int pi_gg_measure(const pi_gdev *d, const pi_context *c, int flash, struct ggml_gallocr *reserve, int64_t *out) {
    const pi_ggml_api *g = d->g;
    *out = 0;
    const size_t block_bytes = pi_align_up((int64_t)largest(g, c), 64);
    void *block = aligned_alloc(64, block_bytes); /* address space only: never written or read */
    char *meta = malloc(g->tensor_overhead() * MAX_STANDINS);
    char *graph_meta = malloc(pi_gg_meta_bytes(g));
    struct ggml_gallocr *ga = reserve != NULL ? reserve : g->gallocr_new(d->buft);
    int rc;
    if (block == NULL || meta == NULL || graph_meta == NULL || ga == NULL)
        rc = pi_set_error(PI_ERR_NOMEM, "ggml device: out of memory sizing the compute buffer");
    else
        rc = measure_with(d, c, flash, ga, reserve != NULL, block, block_bytes, meta, graph_meta, out);
    if (reserve == NULL && ga != NULL) g->gallocr_free(ga);
    free(graph_meta);
    free(meta);
    free(block);
    return rc;
}
