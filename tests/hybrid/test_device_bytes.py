"""What the plan counts is what the device holds, on SmolLM2 Q4_1 and ggml's CPU backend as the
device: the KV cache of placed layers in the context's KV type (F16 or F32; docs/placement.md,
"Byte accounting")."""

from __future__ import annotations

import pytest

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid.offload import offload
from powerinfer_backend.loader import load_gguf

N_CTX, N_BATCH = 256, 8  # n_ctx a multiple of 64: n_cells = n_ctx
MiB = 1 << 20


@pytest.fixture(scope="module")
def smol(model_path):
    g = load_gguf(model_path, verbose=False)
    m = NativeModel(g)
    yield model_path, g, m
    m.close()


def _place(smol, budget: int, **ctx_kw):
    path, _, m = smol
    ctx = NativeContext(m, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1, **ctx_kw)
    return ctx, offload(ctx, path, vram_budget=f"{budget}B", device="ggml-cpu", placement="neurons")


@pytest.mark.parametrize("kv_f16", [True, False], ids=["kv16", "kv32"])
def test_kv_counted_in_the_contexts_type(smol, xdg_cache, kv_f16):
    """Planned KV bytes = placed layers x n_ctx x (n_embd_k_gqa + n_embd_v_gqa) x the element's
    bytes, ggml allocates exactly the plan, and the device's high-water mark stays within the
    budget, from a budget placing some attention blocks to one placing everything."""
    _, g, _ = smol
    hp = g.hparams
    esz = 2 if kv_f16 else 4
    n_embd_kv = hp.n_head_kv * hp.n_embd_head  # K and V alike in SmolLM2
    for budget in (12 * MiB, 40 * MiB, 1 << 30):
        ctx, off = _place(smol, budget, kv_f16=kv_f16)
        try:
            plan = off.plan
            n_on = sum(L.attn_on_device for L in plan.layers)
            assert n_on > 0 and (budget < 1 << 30 or n_on == hp.n_layer)
            assert all(L.kv_bytes == (2 * N_CTX * n_embd_kv * esz if L.attn_on_device else 0) for L in plan.layers)
            assert plan.buffer_bytes()["kv"] == n_on * N_CTX * (n_embd_kv + n_embd_kv) * esz
            ctx.eval([1, 504, 3458, 282])
            d = off.stats()
            assert d["buffers"] == plan.buffer_bytes() and d["used"] == d["reserved"] == plan.device_bytes
            assert d["high_water"] <= budget
        finally:
            ctx.close()
            off.close()
