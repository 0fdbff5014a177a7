"""Activation predictors: the C scores against numpy, determinism, validation, and
predictor mode in the forward pass on tiny random models."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.sparsity.predictors import PredictorSet, apply, scores, scores_reference

from tests.fixtures.tiny_gguf import write_tiny_llama

F32 = {"matrix": T.F32, "token_embd": T.F32}


pytestmark = pytest.mark.usefixtures("xdg_cache")  # artifacts of every test in its own user cache


def rand_pred(rng, n_embd, n_ff, rank, dtype=np.float32):
    fc1 = (rng.standard_normal((rank, n_embd)) / np.sqrt(n_embd)).astype(dtype)
    fc2 = (rng.standard_normal((n_ff, rank)) / np.sqrt(rank)).astype(dtype)
    return fc1, fc2


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n_tok", [1, 5])
def test_scores_match_numpy(dtype, n_tok):
    rng = np.random.default_rng(1)
    fc1, fc2 = rand_pred(rng, 96, 200, 48, dtype)
    x = rng.standard_normal((n_tok, 96)).astype(np.float32)
    got = scores(fc1, fc2, x)
    ref = scores_reference(fc1, fc2, x)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_scores_same_bits_any_thread_count():
    rng = np.random.default_rng(2)
    fc1, fc2 = rand_pred(rng, 128, 300, 64)
    x = rng.standard_normal((3, 128)).astype(np.float32)
    a = scores(fc1, fc2, x, n_threads=1)
    for n in (2, 3):
        assert np.array_equal(a.view(np.uint32), scores(fc1, fc2, x, n_threads=n).view(np.uint32))


def _model(tmp_path, **kw):
    return NativeModel(
        load_gguf(
            write_tiny_llama(tmp_path / "m.gguf", n_vocab=64, n_embd=64, n_ff=128, n_layer=2, types=F32, seed=5, **kw),
            verbose=False,
        )
    )


def _logits(m, toks, setup=None, n_threads=1, kv_f16=True):
    ctx = NativeContext(m, n_ctx=32, n_batch=8, n_threads=n_threads, kv_f16=kv_f16)
    if setup:
        setup(ctx)
    out = ctx.eval(toks, logits_all=True).copy()
    last = [ctx.eval([t]).copy() for t in (3, 9, 17)]
    return ctx, out, last


def test_predictor_all_active_equals_dense_and_none_active_drops_ffn(tmp_path):
    m = _model(tmp_path)
    rng = np.random.default_rng(0)
    toks = list(range(1, 8))
    ps = PredictorSet()
    for layer in range(2):
        ps.fc1[layer], ps.fc2[layer] = rand_pred(rng, 64, 128, 32)
        ps.thresholds[layer] = -1e30  # every neuron predicted
    # Against dense with an F32 KV cache: the sparse FFN sums the down product in another
    # order than the dense matmul, and through an F16 cache a few-ulp difference in q can
    # cross an F16 rounding midpoint (seen on AVX2: 2.75e-4 in one decode step's logits).
    _, dense, dl = _logits(m, toks, kv_f16=False)
    _, out, last = _logits(m, toks, lambda c: apply(c, m.gguf, ps), kv_f16=False)
    np.testing.assert_allclose(out, dense, rtol=1e-4, atol=1e-4)
    for a, b in zip(last, dl):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # Against the sparse FFN without a predictor (same kernel, same rows): the same bits.
    dt = down_t_dtype(m.gguf)
    _, exact, el = _logits(
        m, toks, lambda c: [c.set_ffn_sparsity(i, transposed_down(m.gguf, i, dtype=dt), 0.0) for i in range(2)]
    )
    ctx, out, last = _logits(m, toks, lambda c: apply(c, m.gguf, ps))
    assert np.array_equal(out.view(np.uint32), exact.view(np.uint32))
    for a, b in zip(last, el):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    _, dense, _ = _logits(m, toks)
    st = ctx.predictor_stats()
    assert st["predicted"].sum() == 2 * 128 * (7 + 3) and (st["ffn_ns"] >= st["pred_ns"]).all()
    for layer in range(2):
        ps.thresholds[layer] = 1e30  # nothing predicted: the FFN adds nothing
    ctx, out, _ = _logits(m, toks, lambda c: apply(c, m.gguf, ps))
    assert ctx.predictor_stats()["predicted"].sum() == 0
    assert ctx.ffn_stats() == (0, 2 * 128 * 10)
    assert not np.allclose(out, dense, atol=1e-3)


def test_predictor_mode_matches_masked_reference(tmp_path):
    """Decode (gathered rows) and batch (masked dense h) give the same logits, for 1 and 2 threads."""
    m = _model(tmp_path)
    rng = np.random.default_rng(4)
    ps = PredictorSet()
    for layer in range(2):
        ps.fc1[layer], ps.fc2[layer] = rand_pred(rng, 64, 128, 32)
        ps.thresholds[layer] = 0.1
    toks = [5, 9, 2, 33, 7]

    def run(n_threads, batch):
        ctx = NativeContext(m, n_ctx=32, n_batch=8, n_threads=n_threads)
        apply(ctx, m.gguf, ps)
        if batch:
            return ctx.eval(toks, logits_all=True)[-1].copy(), ctx
        for t in toks:
            out = ctx.eval([t]).copy()
        return out, ctx

    a, ca = run(1, True)
    b, cb = run(1, False)
    c, _ = run(2, False)
    assert np.array_equal(b, c)
    np.testing.assert_allclose(a.ravel(), b.ravel(), rtol=1e-5, atol=1e-5)
    dens = ca.predictor_stats()["predicted"].sum() / (2 * 128 * 5)
    assert 0.05 < dens < 0.95


@pytest.mark.parametrize(
    "which,shape1,shape2,msg",
    [
        ("fc1 n_embd", (32, 60), (128, 32), "blk.1.fc1.weight"),
        ("fc2 n_ff", (32, 64), (100, 32), "blk.1.fc2.weight"),
        ("rank", (32, 64), (128, 16), "blk.1.fc2.weight"),
    ],
)
def test_malformed_predictor_tensors_raise(tmp_path, which, shape1, shape2, msg):
    m = _model(tmp_path)
    ctx = NativeContext(m, n_ctx=16, n_batch=4, n_threads=1)
    fc1 = np.zeros(shape1, np.float32)
    fc2 = np.zeros(shape2, np.float32)
    with pytest.raises(ValueError, match=msg):  # native check
        ctx.set_ffn_predictor(1, fc1, fc2, 0.0)
    ps = PredictorSet({1: fc1}, {1: fc2}, {1: 0.0})
    with pytest.raises(ValueError, match=r"layer 1: tensor " + msg.replace(".", r"\.")):
        ps.validate(2, 64, 128)


def test_missing_layer_and_missing_tensor_raise():
    fc1 = np.zeros((8, 64), np.float32)
    fc2 = np.zeros((128, 8), np.float32)
    with pytest.raises(ValueError, match=r"layer 1: tensor blk\.1\.fc1\.weight missing"):
        PredictorSet({0: fc1}, {0: fc2}).validate(2, 64, 128, require_all=True)
    with pytest.raises(ValueError, match=r"layer 0: tensor blk\.0\.fc2\.weight missing"):
        PredictorSet({0: fc1}, {}).validate(2, 64, 128)
    with pytest.raises(ValueError, match=r"layer 5"):
        PredictorSet({5: fc1}, {5: fc2}).validate(2, 64, 128)
