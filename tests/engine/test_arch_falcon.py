"""Falcon (llama.cpp's falcon; PowerInfer's ReluFalcon) on tiny random-weight files:
LayerNorm with bias, fused q/k/v with one key/value head, parallel residual,
ungated MLP (GELU, or ReLU from metadata), NEOX RoPE. References: a float64 numpy
forward pass (tests/fixtures/tiny_archs.py) and llama.cpp's decode path; the ReLU model
also sparse (threshold 0) against dense."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend import Llama
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures.llama_reference import reference_logits
from tests.fixtures.tiny_archs import falcon_reference, write_tiny_falcon

TOKENS = [int(t) for t in np.random.default_rng(0).integers(1, 64, 10)]


def _eval(model, tokens=TOKENS, *, sparse=False, kv_f16=True, decode=False):
    """Logits of every token (one eval, or one eval per token with ``decode``); with
    ``sparse`` every layer runs the sparse FFN at threshold 0. -> (logits, ffn_stats)"""
    ctx = NativeContext(NativeModel(model), n_ctx=32, n_batch=32, n_threads=2, kv_f16=kv_f16)
    try:
        if sparse:
            for layer in range(model.hparams.n_layer):
                down_t = model.layer_tensors(layer)[8].to_float32().T  # (n_ff, n_embd)
                ctx.set_ffn_sparsity(layer, np.ascontiguousarray(down_t), 0.0)
        if decode:
            out = np.concatenate([ctx.eval([t], logits_all=True).copy() for t in tokens])
        else:
            out = ctx.eval(tokens, logits_all=True).copy()
        return out, ctx.ffn_stats()
    finally:
        ctx.close()


def test_hparams_and_slots(tmp_path):
    m7 = load_gguf(write_tiny_falcon(tmp_path / "f7.gguf"), verbose=False)
    hp = m7.hparams
    assert (hp.layer_norm, hp.parallel_residual, hp.rope_type, hp.act_name) == (1, 1, 2, "gelu")
    assert (hp.n_head, hp.n_head_kv, hp.n_embd_head, hp.n_rot, hp.rms_eps) == (4, 1, 16, 16, pytest.approx(1e-5))
    ts = m7.layer_tensors(1)
    # 7B: the one attn_norm (and its bias) feeds both blocks; q/k/v are one fused tensor
    assert ts[0].name == ts[5].name == "blk.1.attn_norm.weight"
    assert ts[16].name == ts[17].name == "blk.1.attn_norm.bias"
    assert ts[18].name == "blk.1.attn_qkv.weight" and ts[18].ne == (64, (4 + 2) * 16)
    assert ts[1] is ts[2] is ts[3] is ts[6] is None  # no separate q/k/v, no gate
    assert m7.global_tensors()["output_norm_b"].name == "output_norm.bias"
    m40 = load_gguf(write_tiny_falcon(tmp_path / "f40.gguf", two_norms=True, n_head_kv=2), verbose=False)
    ts = m40.layer_tensors(0)
    # 40B, as llama.cpp: attn_norm_2 (HF ln_attn) before attention, attn_norm (HF ln_mlp) before the MLP
    assert [ts[0].name, ts[16].name] == ["blk.0.attn_norm_2.weight", "blk.0.attn_norm_2.bias"]
    assert [ts[5].name, ts[17].name] == ["blk.0.attn_norm.weight", "blk.0.attn_norm.bias"]


def test_relu_recognised_from_metadata(tmp_path):
    """powerinfer.ffn_act, or PowerInfer's powerinfer.sparse_threshold key (its falcon
    files are ReluFalcon), make the MLP ReLU; without either it is Falcon's GELU."""
    act = {
        kw: load_gguf(write_tiny_falcon(tmp_path / f"f{i}.gguf", **dict(kw)), verbose=False).hparams.act_name
        for i, kw in enumerate(
            [(), (("ffn_act", "relu"),), (("sparse_threshold", 0.0),), (("ffn_act", "gelu"), ("sparse_threshold", 0.0))]
        )
    }
    assert list(act.values()) == ["gelu", "relu", "relu", "gelu"]


@pytest.mark.parametrize("two_norms", [False, True], ids=["7b", "40b"])
@pytest.mark.parametrize("ffn_act", ["gelu", "relu"])
def test_matches_numpy_reference(tmp_path, two_norms, ffn_act):
    m = load_gguf(
        write_tiny_falcon(tmp_path / "f.gguf", two_norms=two_norms, ffn_act=ffn_act, n_head_kv=2 if two_norms else 1),
        verbose=False,
    )
    ours, _ = _eval(m, kv_f16=False)
    ref = falcon_reference(m, TOKENS)
    err = np.abs(ours - ref).max()
    assert err <= 5e-5 * np.abs(ref).max(), err


@pytest.mark.llama_cpp
@pytest.mark.parametrize(
    "two_norms, n_head_kv, mtype",
    [(False, 1, T.Q8_0), (True, 2, T.Q8_0), (False, 1, T.F16)],
    ids=["7b-q8_0", "40b-q8_0", "7b-f16"],
)
def test_bit_identical_to_llama_cpp(tmp_path, two_norms, n_head_kv, mtype):
    from powerinfer_backend.plugins.reference import load_reference

    path = write_tiny_falcon(tmp_path / "f8.gguf", two_norms=two_norms, n_head_kv=n_head_kv, matrix_type=mtype)
    ours, _ = _eval(load_gguf(path, verbose=False), decode=True)
    ref = load_reference(path, extra_buffer_types=False, n_ctx=32, n_threads=2, n_threads_batch=2, logits_all=True)
    rows = reference_logits(ref, TOKENS, one_by_one=True)  # the decode path (one token per eval)
    ref.close()
    assert np.array_equal(ours, rows), np.abs(ours - rows).max()


@pytest.mark.parametrize("decode", [False, True], ids=["prompt", "decode"])
def test_relu_sparse_threshold0_equals_dense(tmp_path, decode):
    """ReluFalcon (a PowerInfer file: ffn_down_t, sparse_threshold key): the sparse FFN
    at threshold 0 skips the exact zeros of relu(up x) and gives the dense logits to
    float32 summation-order tolerance (F32 weights: a quantized dense down product
    would also quantize h)."""
    m = load_gguf(write_tiny_falcon(tmp_path / "f.gguf", sparse_threshold=0.0, transposed_down=True), verbose=False)
    dense, (u0, t0) = _eval(m, decode=decode)
    sparse, (used, total) = _eval(m, sparse=True, decode=decode)
    assert (u0, t0) == (0, 0) and total == len(TOKENS) * m.hparams.n_layer * m.hparams.n_ff
    assert 0.3 < 1 - used / total < 0.7  # random weights: about half of up x is negative
    np.testing.assert_allclose(sparse, dense, rtol=0, atol=2e-6 * np.abs(dense).max())
    ref = falcon_reference(m, TOKENS)
    assert np.abs(sparse - ref).max() <= 5e-4 * np.abs(ref).max()


def test_llama_sparse_auto(tmp_path):
    """Llama(sparse="auto") runs a ReLU Falcon sparse at threshold 0 (no sidecar) and a
    GELU Falcon dense (its thresholds need a calibration sidecar)."""
    relu = write_tiny_falcon(tmp_path / "relu.gguf", ffn_act="relu")
    with Llama(relu, n_ctx=32, n_threads=2, verbose=False, sparse="off", logits_all=True) as d:
        dense = d._backend.eval(TOKENS, logits_all=True).copy()
    with Llama(relu, n_ctx=32, n_threads=2, verbose=False, logits_all=True) as s:
        got = s._backend.eval(TOKENS, logits_all=True).copy()
        st = s.stats()
        text = s("a", max_tokens=3, temperature=0.0)["choices"][0]["text"]
    assert st["mode"] == "threshold" and 0.3 < st["ffn_sparsity"] < 0.7
    assert isinstance(text, str)
    np.testing.assert_allclose(got, dense, rtol=0, atol=2e-6 * np.abs(dense).max())
    gelu = write_tiny_falcon(tmp_path / "gelu.gguf")
    with Llama(gelu, n_ctx=32, n_threads=2, verbose=False) as g:
        g.eval(TOKENS[:3])
        assert g.stats()["mode"] == "dense"
    with pytest.raises(ValueError, match="calibrate"):
        Llama(gelu, n_ctx=32, verbose=False, sparse="threshold")


def test_gelu_threshold_sparse(tmp_path):
    """Falcon's own GELU MLP runs sparse with |h| thresholds (the calibrated mode): at
    threshold 0 (nothing skipped but exact zeros) it follows dense to the GELU
    rounding (the sparse form evaluates GELU in float, dense at half precision, as
    llama.cpp); a threshold skips neurons and moves the logits a little."""
    m = load_gguf(write_tiny_falcon(tmp_path / "g.gguf"), verbose=False)
    dense, _ = _eval(m, decode=True)
    sparse0, (used0, total) = _eval(m, sparse=True, decode=True)
    assert used0 == total
    np.testing.assert_allclose(sparse0, dense, rtol=0, atol=3e-3 * np.abs(dense).max())
    ctx = NativeContext(NativeModel(m), n_ctx=32, n_batch=32, n_threads=2)
    for layer in range(m.hparams.n_layer):
        ctx.set_ffn_sparsity(layer, np.ascontiguousarray(m.layer_tensors(layer)[8].to_float32().T), 0.05)
    thr = np.concatenate([ctx.eval([t], logits_all=True).copy() for t in TOKENS])
    used, total = ctx.ffn_stats()
    ctx.close()
    assert 0.02 < 1 - used / total < 0.5
    assert 0 < np.abs(thr - dense).max() < 0.1 * np.abs(dense).max()


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({"drop": ("blk.1.attn_qkv.weight",)}, "missing tensor 'blk.1.attn_qkv.weight'"),
        ({"shapes": {"blk.0.attn_qkv.weight": (64, 64)}}, "tensor 'blk.0.attn_qkv.weight' has shape [64, 64]"),
        ({"drop": ("output_norm.bias",)}, "missing tensor 'output_norm.bias'"),
        ({"two_norms": True, "drop": ("blk.1.attn_norm_2.bias",)}, "missing tensor 'blk.1.attn_norm_2.bias'"),
        ({"shapes": {"blk.0.attn_norm.bias": (63,)}}, "tensor 'blk.0.attn_norm.bias' has shape [63]"),
    ],
)
def test_bad_tensors_named(tmp_path, kw, fragment):
    path = write_tiny_falcon(tmp_path / "bad.gguf", **kw)
    with pytest.raises(ValueError) as e:
        load_gguf(path, verbose=False)
    assert fragment in str(e.value) and path in str(e.value)


def test_relu_predictor_active_lists(tmp_path):
    """The predictor path gathers the ungated form's rows per token from active lists:
    a predictor that selects every neuron gives the threshold-0 result bit for bit
    (decode), and one that selects none leaves only the attention."""
    m = load_gguf(write_tiny_falcon(tmp_path / "f.gguf", ffn_act="relu"), verbose=False)
    hp = m.hparams
    rng = np.random.default_rng(5)
    fc1 = rng.standard_normal((8, hp.n_embd)).astype(np.float32)
    fc2 = rng.standard_normal((hp.n_ff, 8)).astype(np.float32)
    base, _ = _eval(m, sparse=True, decode=True)
    out = {}
    for name, thr in (("all", -1e30), ("none", 1e30)):
        ctx = NativeContext(NativeModel(m), n_ctx=32, n_batch=32, n_threads=2)
        for layer in range(hp.n_layer):
            down_t = np.ascontiguousarray(m.layer_tensors(layer)[8].to_float32().T)
            ctx.set_ffn_sparsity(layer, down_t, 0.0)
            ctx.set_ffn_predictor(layer, fc1, fc2, thr)
        out[name] = np.concatenate([ctx.eval([t], logits_all=True).copy() for t in TOKENS])
        out[name + "_used"] = ctx.ffn_stats()[0]
        ctx.close()
    assert np.array_equal(out["all"], base)
    assert out["none_used"] == 0 and np.abs(out["none"] - base).max() > 1e-3


def test_placement_plan_sizes_an_ungated_ffn(tmp_path):
    """The placement plan sizes an ungated model: a hot neuron is its up row and down
    column only (no gate row)."""
    from powerinfer_backend.hybrid import placement as P

    m = load_gguf(write_tiny_falcon(tmp_path / "f.gguf", ffn_act="relu"), verbose=False)
    sizes = P.ModelSizes.from_gguf(m)
    g, u, d = P.neuron_bytes(sizes, 0)
    assert g == 0 and u > 0 and d == 2 * m.hparams.n_embd  # no gate row; the down column in F16
    assert P.hot_bytes(sizes, 0, 1) == P.align_up(u, P.CPU_ALIGN) + P.align_up(d, P.CPU_ALIGN)
    freq = np.random.default_rng(0).random((m.hparams.n_layer, m.hparams.n_ff))
    plan = P.plan_placement(sizes, freq, P.full_device_bytes(sizes, 64, 2) // 2, n_ctx=64, n_batch=2)
    assert 0 < plan.device_bytes <= P.full_device_bytes(sizes, 64, 2) // 2
    m.close()


def test_gelu_calibrate_then_auto(tmp_path):
    """calibrate (statistics of |gelu(up x)|, held-out budget search) writes a sidecar
    for a GELU Falcon, and sparse="auto" then runs its thresholds."""
    from powerinfer_backend.sparsity.calibrate import calibrate

    path = write_tiny_falcon(tmp_path / "g.gguf")
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40 + "to be or not to be. " * 40)
    prof = calibrate(
        path,
        str(text),
        tokens=256,
        heldout_tokens=64,
        n_ctx=64,
        sens_tokens=32,
        levels=(0.3, 0.6),
        n_threads=2,
        progress=False,
        log=lambda s: None,
        max_ppl_increase=0.05,
        speed_check=False,
    )
    assert prof.ffn_act == "gelu" and np.all(prof.thresholds > 0)
    with Llama(path, n_ctx=64, n_threads=2, verbose=False) as llm:
        llm.eval(TOKENS)
        st = llm.stats()
    assert st["mode"] == "threshold" and st["sidecar"] is not None and st["ffn_sparsity"] > 0.1


def test_drelu_needs_a_gate(tmp_path):
    with pytest.raises(ValueError, match="'drelu' needs a gated FFN"):
        load_gguf(write_tiny_falcon(tmp_path / "d.gguf", ffn_act="drelu"), verbose=False)
