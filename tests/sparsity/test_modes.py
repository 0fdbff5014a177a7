"""The transposed down a sparse mode runs over (powerinfer_backend.sparsity.modes.configure):
its automatic type, stats()["down_t_type"], and what holds with a Q8_0 down_t.

A quantized ffn_down gets a Q8_0 down_t (engine.down_cache.down_t_dtype), so the sparse
model is no longer the dense F16-down_t model bit for bit. What holds instead, on a tiny
ReLU llama with Q8_0 weights (threshold 0: only exact zeros skipped):

* the same bits for 1 and 2 threads and on a rerun;
* the same bits as the sparse FFN over the same Q8_0 rows set by hand (the kernel tests,
  tests/_native/test_kernels_sparse_ffn.py, pin those rows' sum to a float32 loop over the
  dequantized Q8_0 values on the active set);
* logits within a measured tolerance of the dense model over the file's own Q8_0 ffn_down.
"""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend import Llama
from powerinfer_backend.engine.down_cache import transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid.offload import split_arithmetic
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.sparsity import modes

from tests.fixtures.tiny_gguf import write_tiny_llama

TOKS = [1, 5, 9, 3, 7, 2, 11, 13]


@pytest.fixture
def relu_q8(tmp_path, xdg_cache):
    return write_tiny_llama(
        tmp_path / "relu.gguf",
        n_vocab=64,
        n_embd=64,
        n_ff=128,
        n_layer=2,
        seed=3,
        extra_kv={"powerinfer.ffn_act": "relu"},
        n_ctx_train=512,
    )


def _logits(llm) -> np.ndarray:
    be = llm._backend
    be.truncate(0)
    rows = [be.eval(TOKS, logits_all=True).copy()]
    rows += [be.eval([t], logits_all=True).copy() for t in (4, 8, 12)]
    return np.concatenate(rows)


def test_q8_0_down_t_bits_tolerance_and_stats(relu_q8):
    runs = {}
    for threads in (1, 2):
        with Llama(relu_q8, n_ctx=32, n_threads=threads, verbose=False) as llm:
            st = llm.stats()
            runs[threads] = _logits(llm)
            if threads == 2:
                assert np.array_equal(_logits(llm).view(np.uint32), runs[2].view(np.uint32))  # rerun
    assert st["mode"] == "threshold" and st["down_t_type"] == "Q8_0"
    assert np.array_equal(runs[1].view(np.uint32), runs[2].view(np.uint32))
    with Llama(relu_q8, n_ctx=32, n_threads=2, verbose=False, sparse="off") as llm:
        assert llm.stats()["down_t_type"] is None
        dense = _logits(llm)
    # the same bits as the operator over the same Q8_0 rows, set by hand on a context; and the
    # F32 down_t (the exact weight values) for scale
    g = load_gguf(relu_q8, verbose=False)
    m = NativeModel(g)
    m.repack({0, 1})  # as Llama: the other Q8_0 products in row groups, the sparse layers' gate / up rows kept
    by_hand = {}
    for dt in ("q8_0", "f32"):
        ctx = NativeContext(m, n_ctx=32, n_batch=512, n_threads=2)
        for layer in range(2):
            ctx.set_ffn_sparsity(layer, transposed_down(g, layer, dtype=dt), 0.0)
        assert set(ctx.ffn_down_t_types().values()) == {dt.upper()}
        rows = [ctx.eval(TOKS, logits_all=True).copy()] + [ctx.eval([t], logits_all=True).copy() for t in (4, 8, 12)]
        by_hand[dt] = np.concatenate(rows)
        ctx.close()
    m.close()
    assert np.array_equal(by_hand["q8_0"].view(np.uint32), runs[2].view(np.uint32))
    # Against the dense model (Q8_0 ffn_down, h quantized to Q8_0 before its dot), measured
    # 2026-12-02 on this model: max |d logit| 0.053 for the Q8_0 down_t, 0.040 for the F32 one
    # (exact weights: the dense path's own rounding of h), 0.038 for F16; max |logit| 3.35.
    err, err_exact = np.abs(runs[2] - dense).max(), np.abs(by_hand["f32"] - dense).max()
    assert err <= 0.02 * np.abs(dense).max() and err <= 1.5 * err_exact, (err, err_exact)
    assert not np.array_equal(runs[2], by_hand["f32"])  # a different rounding, not the exact values


def test_split_keeps_the_cpu_only_down_t(relu_q8, tmp_path):
    """A device split runs its cold neurons over the CPU-only engine's down_t (Q8_0 for a
    quantized file), keeping a sparse mode's down_t and thresholds; a dense layer with
    neurons on the device gets that down_t at threshold 0, and its down over the GGUF
    ffn_down where the cold rows' down_t would read more; a layer with none stays dense."""
    from types import SimpleNamespace

    g = load_gguf(relu_q8, verbose=False)
    m = NativeModel(g)
    ctx = NativeContext(m, n_ctx=32, n_batch=8, n_threads=1)
    state = modes.configure(ctx, g, relu_q8, "auto")
    ctx.set_ffn_sparsity(1, transposed_down(g, 1, dtype="q8_0"), 0.25)
    split_arithmetic(ctx)
    assert ctx.ffn_down_t_types() == {0: "Q8_0", 1: "Q8_0"} and ctx.ffn_down_dense_layers() == []
    assert (ctx.ffn_threshold(0), ctx.ffn_threshold(1)) == (0.0, 0.25)
    assert modes.stats(ctx, state)["down_t_type"] == "Q8_0"
    ctx.close()
    m.close()
    # a Q4_1 SwiGLU file (20 B per 32 weights): n_cold of 128 Q8_0 rows (68 B) read more than
    # ffn_down (64 rows of 80 B = 5120 B) above 75 cold neurons
    path = write_tiny_llama(tmp_path / "q41.gguf", n_vocab=64, n_embd=64, n_ff=128, n_layer=3, types={"matrix": 3})
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    ctx = NativeContext(m, n_ctx=32, n_batch=8, n_threads=1)
    split_arithmetic(ctx, [SimpleNamespace(layer=i, n_hot=n) for i, n in enumerate((0, 52, 53))])
    assert ctx.ffn_down_t_types() == {1: "Q8_0", 2: "Q8_0"} and not ctx.has_ffn_sparsity(0)
    assert ctx.ffn_down_dense_layers() == [1] and ctx.ffn_threshold(1) == ctx.ffn_threshold(2) == 0.0
    ctx.close()
    m.close()


def test_dense_down_gate_form(tmp_path, xdg_cache):
    """The gate form with its down product over the GGUF ffn_down (h of skipped neurons 0):
    at threshold 0 it is the dense model bit for bit (the gathered gate/up dots have the
    dense rows' bits); at a threshold, the same bits for 1 and 2 threads, the neurons of
    the down_t form skipped, logits close to it; a split keeps it."""
    from powerinfer_backend.engine.down_cache import dense_down_cheaper

    path = write_tiny_llama(tmp_path / "sw.gguf", n_vocab=64, n_embd=64, n_ff=128, n_layer=2, seed=3, n_ctx_train=512)
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)

    def run(thr, dense_down, threads=2):
        ctx = NativeContext(m, n_ctx=32, n_batch=8, n_threads=threads)
        if thr is not None:
            ctx.set_ffn_threshold_on("gate")
            for layer in range(2):
                ctx.set_ffn_sparsity(layer, transposed_down(g, layer, dtype="q8_0"), thr)
                ctx.set_ffn_down_dense(layer, dense_down)
        rows = [ctx.eval(TOKS[:4]).copy()] + [ctx.eval([t]).copy() for t in (4, 8, 12)]
        out = (np.concatenate(rows), ctx.ffn_stats(), ctx.ffn_down_dense_layers())
        if thr is not None and dense_down:
            split_arithmetic(ctx)  # a sparse mode's choice is kept
            assert ctx.ffn_down_dense_layers() == [0, 1]
        ctx.close()
        return out

    dense, _, _ = run(None, False)
    at0, (used0, total0), layers = run(0.0, True)
    assert layers == [0, 1] and used0 == total0 and np.array_equal(at0.view(np.uint32), dense.view(np.uint32))
    two, (used, total), _ = run(0.1, True)
    one, _, _ = run(0.1, True, threads=1)
    rows_form, (used_t, _), _ = run(0.1, False)
    assert np.array_equal(two.view(np.uint32), one.view(np.uint32))
    assert 0.7 * total < used < total and abs(used - used_t) <= 0.01 * total  # the layers' inputs differ slightly
    # measured: max |d logit| 0.062 against the down_t form, max |logit| 2.77 (the dense down
    # quantizes h to Q8_0, the down_t form sums float h times Q8_0 rows)
    assert np.abs(two - rows_form).max() <= 0.05 * np.abs(dense).max()
    # the product form over the dense down at threshold 0: the dense model's bits
    ctx = NativeContext(m2 := NativeModel(g), n_ctx=32, n_batch=8, n_threads=2)
    for layer in range(2):
        ctx.set_ffn_sparsity(layer, transposed_down(g, layer, dtype="q8_0"), 0.0)
        ctx.set_ffn_down_dense(layer, True)
    prod0 = np.concatenate([ctx.eval(TOKS[:4]).copy()] + [ctx.eval([t]).copy() for t in (4, 8, 12)])
    ctx.close()
    m2.close()
    assert np.array_equal(prod0.view(np.uint32), dense.view(np.uint32))  # threshold 0: the dense model's bits
    m.close()
    # the byte rule: Q8_0 ffn_down columns (68 B per neuron at n_embd 64) against Q8_0 down_t rows (68 B)
    assert not dense_down_cheaper(g, 0, "q8_0", 0.99) and dense_down_cheaper(g, 0, "q8_0", 1.0 + 1e-6) is True
    assert dense_down_cheaper(g, 0, "f16", 0.55)  # 0.55 x 128 B > 68 B
