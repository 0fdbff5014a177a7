"""The Python side of the CUDA device (powerinfer_backend/hybrid/devices/cuda.py) against a mock
libpi_cuda.so compiled here with the host C compiler: the same API (pi_cuda.h), on the
CPU, F32 rows only, with the reference semantics (h = act(g.x, u.x), threshold, sum of
the kept hot rows in order). It checks what can be checked without a GPU: argument
passing, the hot/cold split and the merge, the pool accounting seen through stats(),
errors becoming Python exceptions, and the ordering of run/wait/free."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from powerinfer_backend.hybrid.devices import cuda as cuda_device
from powerinfer_backend._native import ffi, lib
from powerinfer_backend import _native

from tests.fixtures import ROOT

CC = shutil.which("cc") or shutil.which("gcc")

MOCK = r"""
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pi_cuda.h"

static char err[512];
static int fail(int code, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); vsnprintf(err, sizeof err, fmt, ap); va_end(ap); return code;
}
const char *pi_cuda_last_error(void) { return err; }
struct pi_cuda_device { int64_t reserved, used, hw, refused, jobs, rows; void *busy; };
struct pi_cuda_ffn { pi_cuda_device *d; int64_t E, n_hot, max_tok, n_tok; int gated, act; float thr;
                     float *g, *u, *dn, *x; };
static int64_t al(int64_t n) { return (n + 255) / 256 * 256; }
int pi_cuda_device_count(int32_t *out) { *out = 1; return 0; }
int pi_cuda_create(int32_t device, int64_t reserve, pi_cuda_device **out) {
    if (reserve < 0) return fail(1, "pi_cuda_create: reserve_bytes must be >= 0");
    if (device != 0) return fail(1, "pi_cuda_create: device %d out of range [0, 1)", device);
    *out = calloc(1, sizeof **out); (*out)->reserved = reserve; return 0;
}
void pi_cuda_free(pi_cuda_device *d) { free(d); }
int pi_cuda_alloc(pi_cuda_device *d, int64_t n, void **out) {
    *out = NULL;
    if (al(n) > d->reserved - d->used) { d->refused++; return fail(2, "pi_cuda_alloc: exceed the device reservation"); }
    d->used += al(n); if (d->used > d->hw) d->hw = d->used; return 0;
}
int pi_cuda_get_stats(const pi_cuda_device *d, pi_cuda_stats *s) {
    memset(s, 0, sizeof *s);
    s->reserved = d->reserved; s->used = d->used; s->high_water = d->hw; s->n_refused = d->refused;
    s->n_jobs = d->jobs; s->rows = d->rows; s->total_bytes = 1LL << 34; s->free_bytes = (1LL << 34) - 100; s->context_bytes = 100;
    strcpy(s->name, "mock"); return 0;
}
int64_t pi_cuda_ffn_bytes(int32_t gt, int32_t dt, int64_t E, int64_t n_hot, int64_t max_tok, int32_t has_gate) {
    if (gt != 0 || dt != 0 || E < 1 || n_hot < 0 || max_tok < 1) return -1;
    if (n_hot == 0) return 0;
    return (has_gate ? 1 : 0) * al(n_hot * E * 4) + 2 * al(n_hot * E * 4) + al(max_tok * E * 4);
}
int pi_cuda_ffn_upload(pi_cuda_device *d, int32_t gt, const void *gate, const void *up, int64_t E, int64_t n_ff,
                       int32_t dt, const void *down, const int32_t *ids, int64_t n_hot, int64_t max_tok,
                       pi_cuda_ffn **out) {
    int64_t need = pi_cuda_ffn_bytes(gt, dt, E, n_hot, max_tok, gate != NULL);
    if (need < 0) return fail(1, "pi_cuda_ffn_upload: unsupported types");
    for (int64_t r = 0; r < n_hot; r++)
        if (ids[r] < 0 || ids[r] >= n_ff || (r && ids[r] <= ids[r - 1]))
            return fail(1, "pi_cuda_ffn_upload: hot ids must be strictly increasing");
    if (need > d->reserved - d->used) { d->refused++; return fail(2, "pi_cuda_ffn_upload: exceed the device reservation"); }
    d->used += need; if (d->used > d->hw) d->hw = d->used;
    pi_cuda_ffn *f = calloc(1, sizeof *f);
    f->d = d; f->E = E; f->n_hot = n_hot; f->max_tok = max_tok; f->gated = gate != NULL;
    f->g = malloc(n_hot * E * 4 + 1); f->u = malloc(n_hot * E * 4 + 1); f->dn = malloc(n_hot * E * 4 + 1);
    f->x = malloc(max_tok * E * 4);
    for (int64_t r = 0; r < n_hot; r++) {
        if (gate) memcpy(f->g + r * E, (const float *)gate + ids[r] * E, E * 4);
        memcpy(f->u + r * E, (const float *)up + ids[r] * E, E * 4);
        memcpy(f->dn + r * E, (const float *)down + ids[r] * E, E * 4);
    }
    *out = f; return 0;
}
void pi_cuda_ffn_free(pi_cuda_ffn *f) { free(f->g); free(f->u); free(f->dn); free(f->x); free(f); }
int64_t pi_cuda_ffn_n_hot(const pi_cuda_ffn *f) { return f->n_hot; }
int pi_cuda_ffn_run_async(pi_cuda_ffn *f, int32_t act, const float *x, int64_t n_tok, float thr) {
    if (n_tok < 1 || n_tok > f->max_tok) return fail(1, "pi_cuda_ffn_run_async: n_tok %lld outside", (long long)n_tok);
    if (f->d->busy) return fail(1, "pi_cuda_ffn_run_async: the device has a job pending");
    memcpy(f->x, x, n_tok * f->E * 4); f->n_tok = n_tok; f->act = act; f->thr = thr; f->d->busy = f; return 0;
}
int pi_cuda_ffn_wait(pi_cuda_ffn *f, float *y, int64_t *n_used) {
    if (f->d->busy != f) return fail(1, "pi_cuda_ffn_wait: no job of this upload is pending");
    f->d->busy = NULL;
    const int64_t E = f->E;
    for (int64_t t = 0; t < f->n_tok; t++) {
        const float *x = f->x + t * E; float *yt = y + t * E; int64_t k = 0;
        for (int64_t c = 0; c < E; c++) yt[c] = 0.0f;
        for (int64_t r = 0; r < f->n_hot; r++) {
            float g = 0, u = 0, h;
            for (int64_t c = 0; c < E; c++) { if (f->gated) g += f->g[r * E + c] * x[c]; u += f->u[r * E + c] * x[c]; }
            switch (f->act) {
            case 0: h = g / (1.0f + expf(-g)) * u; break;
            case 2: h = g > 0 ? g * u : 0; break;
            case 3: h = g > 0 && u > 0 ? g * u : 0; break;
            case 4: h = u > 0 ? u : 0; break;
            default: h = 0.5f * g * (1.0f + tanhf(0.79788456f * g * (1.0f + 0.044715f * g * g))) * u;
            }
            if (h == 0.0f || fabsf(h) < f->thr) continue;
            k++;
            for (int64_t c = 0; c < E; c++) yt[c] += h * f->dn[r * E + c];
        }
        if (n_used) n_used[t] = k;
    }
    f->d->jobs++; f->d->rows += f->n_hot * f->n_tok; return 0;
}
"""

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")
E, FF = 32, 80


@pytest.fixture
def mock(tmp_path, monkeypatch):
    src = tmp_path / "mock.c"
    src.write_text(MOCK)
    so = tmp_path / "libpi_cuda.so"
    subprocess.run([CC, "-std=c11", "-shared", "-fPIC", "-O1", "-I", os.path.join(ROOT, "native", "cuda"), "-o",
                    str(so), str(src), "-lm"], check=True)
    monkeypatch.setenv("POWERINFER_CUDA_LIB", str(so))
    monkeypatch.setattr(cuda_device, "_loaded", None)
    monkeypatch.setattr(cuda_device, "_driver_present", lambda: True)
    return so


def _cpu_all(act, g, u, d, x, thr):
    n = x.shape[0]
    y = np.empty((n, E), np.float32)
    pool = ffi.new("pi_pool **")
    _native.check(lib.pi_pool_create(1, pool), "pi_pool_create")
    try:
        _native.check(lib.pi_op_ffn_sparse(pool[0], act, 0, ffi.from_buffer(g), ffi.from_buffer(u), E, FF, 0,
                                           ffi.from_buffer(d), ffi.from_buffer("float[]", x), n, ffi.NULL, ffi.NULL,
                                           thr, ffi.from_buffer("float[]", y), ffi.NULL), "pi_op_ffn_sparse")
    finally:
        lib.pi_pool_free(pool[0])
    return y


@pytest.mark.parametrize("act,form,thr", [("swiglu", 0, 0.0), ("relu", 2, 0.0), ("drelu", 3, 0.01), ("geglu", 1, 0.0)])
def test_split_and_merge_through_the_glue(mock, act, form, thr):
    rng = np.random.default_rng(0)
    g, u, d = (rng.standard_normal((FF, E)).astype(np.float32) / 4 for _ in range(3))
    x = rng.standard_normal((3, E)).astype(np.float32)
    hot = np.array([1, 5, 6, 40, 79], np.int32)
    need = cuda_device.cuda_ffn_bytes(0, 0, E, len(hot), 4)
    with cuda_device.CudaDevice(need, 2) as dev:
        f = dev.upload_ffn(act, 0, g, u, 0, d, E, FF, hot, 4)
        assert f.n_hot == 5 and dev.stats()["used"] == need and dev.stats()["name"] == "mock"
        assert list(f.cold_ids) == [j for j in range(FF) if j not in set(hot)]
        y, yd = f.run(x, thr, return_device_part=True)
        y1 = f.run(x[:1], thr)
        np.testing.assert_allclose(y, _cpu_all(form, g, u, d, x, thr), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(y1, y[:1])
        assert np.abs(yd).max() > 0 and f.last_n_used.shape == (1,)
        s = dev.stats()
        assert (s["n_jobs"], s["rows"], s["n_threads"]) == (2, 5 * 3 + 5 * 1, 2)
        with pytest.raises(ValueError, match="n_tok 5 outside"):
            f.run(np.zeros((5, E), np.float32))
        y2 = f.run(x, thr)  # a failed start leaves the device usable
        np.testing.assert_array_equal(y2, y)


def test_refusals_and_errors(mock):
    rng = np.random.default_rng(1)
    g, u, d = (rng.standard_normal((FF, E)).astype(np.float32) for _ in range(3))
    hot = np.arange(10, dtype=np.int32)
    need = cuda_device.cuda_ffn_bytes(0, 0, E, 10, 1)
    with cuda_device.CudaDevice(need - 1) as dev:
        with pytest.raises(MemoryError, match="exceed the device reservation"):
            dev.upload_ffn("swiglu", 0, g, u, 0, d, E, FF, hot)
        with pytest.raises(MemoryError):
            dev.alloc(need)
        s = dev.stats()
        assert (s["used"], s["n_refused"]) == (0, 2)
        with pytest.raises(ValueError, match="strictly increasing"):
            dev.upload_ffn("swiglu", 0, g, u, 0, d, E, FF, hot[::-1])
        with pytest.raises(ValueError, match="unknown FFN form"):
            dev.upload_ffn("gelu", 0, g, u, 0, d, E, FF, hot)
        with pytest.raises(ValueError, match="gate must be None"):
            dev.upload_ffn("relu_ungated", 0, g, u, 0, d, E, FF, hot)
    with pytest.raises(ValueError, match="cuda_ffn_bytes|no CUDA FFN"):
        cuda_device.cuda_ffn_bytes(2, 0, E, 10)
    with pytest.raises(ValueError, match="device 3 out of range"):
        cuda_device.CudaDevice(0, 1, device=3)


def test_ungated_needs_every_neuron_on_the_device(mock):
    rng = np.random.default_rng(2)
    u, d = (rng.standard_normal((FF, E)).astype(np.float32) for _ in range(2))
    x = rng.standard_normal((1, E)).astype(np.float32)
    with cuda_device.CudaDevice(1 << 20) as dev:
        f = dev.upload_ffn("relu_ungated", 0, None, u, 0, d, E, FF, np.arange(FF, dtype=np.int32))
        y = f.run(x)
        ref = np.maximum(u.astype(np.float64) @ x[0], 0) @ d.astype(np.float64)
        np.testing.assert_allclose(y[0], ref, rtol=1e-4, atol=1e-4)
        part = dev.upload_ffn("relu_ungated", 0, None, u, 0, d, E, FF, np.arange(5, dtype=np.int32))
        with pytest.raises(NotImplementedError, match="no ungated FFN form"):
            part.run(x)


def test_whole_model_offload_through_the_engine(mock, tmp_path, xdg_cache):
    """Llama(device="cuda") with the mock library: the engine hands each layer's hot rows
    to the device's run_async/wait (pi_context_set_ffn_offload), computes the cold neurons
    and continues the device's partial sum; greedy tokens match the CPU-only run, the
    device counted every hot row of every token, and its bytes stay within the budget."""
    from tests.fixtures.tiny_gguf import write_tiny_llama
    from gguf import GGMLQuantizationType as GT

    from powerinfer_backend import Llama

    path = str(write_tiny_llama(tmp_path / "f32.gguf", n_layer=2, n_ff=128, types={"matrix": GT.F32}))
    kw = dict(n_ctx=64, n_batch=8, n_threads=2, verbose=False)
    budget = 40_000
    with Llama(path, vram_budget=f"{budget}B", device="cuda", **kw) as llm:
        off = llm._backend.offload
        assert off.device_kind == "cuda" and off.plan is not None
        n_hot = sum(L.n_hot for L in off.plan.layers)
        assert 0 < n_hot < 2 * 128
        text = llm.create_completion([1, 5, 9], max_tokens=8, temperature=0.0)["choices"][0]["text"]
        s = off.stats()
        assert s["used"] == s["reserved"] <= budget and s["rows"] == n_hot * (3 + 7)
    with Llama(path, sparse="off", **kw) as ref:
        assert ref.create_completion([1, 5, 9], max_tokens=8, temperature=0.0)["choices"][0]["text"] == text
