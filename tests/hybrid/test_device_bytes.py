"""What the plan counts is what the device holds, on SmolLM2 Q4_1 and ggml's CPU backend as the
device: the KV cache of placed layers in the context's KV type (F16 or F32), and no down columns
for a split layer whose whole down the host sums over the GGUF ffn_down (the device gives only its
hot neurons' gate and up products; docs/placement.md, "Byte accounting")."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import open_device, resolve_device
from powerinfer_backend.hybrid.offload import offload, split_arithmetic
from powerinfer_backend.hybrid.placement import predict as pr
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


def test_split_layer_with_host_down_holds_no_down_columns(smol, xdg_cache):
    """A split layer whose whole down the host sums (a dense layer with at most 632 of 1536
    neurons on the device: 904 cold Q8_0 down_t rows of 612 B read more than ffn_down's
    552960 B) is counted as its hot gate and up rows alone, and ggml allocates no down columns
    for it: placed again with every down on the device, the same layers take exactly their
    down columns more. The prediction reads no down on the device for it, ffn_down on the host."""
    _, g, m = smol
    hp = g.hparams
    ctx, off = _place(smol, 12 * MiB)
    try:
        plan, sizes = off.plan, P.ModelSizes.from_gguf(g)  # the fresh context's: every layer dense
        assert plan.inputs["host_down_from"] == list(sizes.host_down_from) == [904] * hp.n_layer
        row = P.row_bytes(sizes.layers[0]["ffn_gate"].type, hp.n_embd)  # a Q4_1 gate/up row: 360 B
        assert sizes.layers[0]["ffn_up"].type == sizes.layers[0]["ffn_gate"].type
        split = [L for L in plan.layers if 0 < L.n_hot < hp.n_ff]
        host = [L.layer for L in split if L.n_hot <= 632]
        assert host and ctx.ffn_down_dense_layers() == host
        for L in split:
            assert L.n_hot > 632 or L.hot_bytes == 2 * P.align_up(L.n_hot * row, P.CPU_ALIGN)
        cols = sum(P.align_up(-(-L.n_hot // 32) * 34 * hp.n_embd, P.CPU_ALIGN) for L in split if L.layer in host)
        pred = pr.predict_ours(sizes, plan, None, device_gbps=10, host_gbps=10, mode="dense")
        down = sizes.layers[0]["ffn_down"].nbytes
        for L in split:
            if L.layer in host:
                t = pred.layers[L.layer]
                assert t.device_ffn_bytes == 2 * row * L.n_hot
                assert t.host_ffn_bytes == 2 * row * (hp.n_ff - L.n_hot) + down
        with pytest.raises(ValueError, match=rf"blk\.{host[0]}: the dense down is fixed once the context is placed"):
            ctx.set_ffn_down_dense(host[0], False)
        weights = ctx.ggml_buffers()["weights"]
    finally:
        ctx.close()
        off.close()
    # the same layers with every down on the device: no host down set before placing
    with open_device(resolve_device("ggml-cpu"), 1) as dev:
        ctx = NativeContext(m, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
        try:
            split_arithmetic(ctx)  # every layer's down_t at threshold 0, no dense down
            ctx.set_ggml_device(dev, plan.layers, plan.output_on_device, 1 << 30)
            assert ctx.ggml_buffers()["weights"] == weights + cols
            assert np.isfinite(ctx.eval([1, 504])).all()
        finally:
            ctx.close()
