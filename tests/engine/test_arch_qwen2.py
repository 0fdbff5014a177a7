"""Qwen2 (llama.cpp's qwen2: the llama block with q/k/v projection biases and NEOX
RoPE) on tiny random-weight files, against llama.cpp's decode path."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures.llama_reference import reference_logits
from tests.fixtures.tiny_archs import write_tiny_qwen2

TOKENS = [int(t) for t in np.random.default_rng(0).integers(1, 64, 10)]


def _ours(path):
    m = load_gguf(path, verbose=False)
    ctx = NativeContext(NativeModel(m), n_ctx=32, n_batch=32, n_threads=2)
    try:
        return ctx.eval(TOKENS, logits_all=True).copy()
    finally:
        ctx.close()


def test_loads_biases(tmp_path):
    m = load_gguf(write_tiny_qwen2(tmp_path / "q.gguf"), verbose=False)
    assert m.hparams.rope_type == 2 and m.hparams.act_name == "silu"
    ts = m.layer_tensors(1)
    assert [t.name for t in ts[13:16]] == ["blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"]
    assert [t.ne for t in ts[13:16]] == [(64,), (32,), (32,)]
    assert ts[9:13] == [None] * 4 and ts[16:] == [None] * 6


@pytest.mark.llama_cpp
def test_matches_llama_cpp(tmp_path):
    from powerinfer_backend.plugins.reference import load_reference

    path = write_tiny_qwen2(tmp_path / "q.gguf")
    ours = _ours(path)
    ref = load_reference(path, extra_buffer_types=False, n_ctx=32, n_threads=2, n_threads_batch=2, logits_all=True)
    rows = reference_logits(ref, TOKENS, one_by_one=True)
    ref.close()
    # same dot products, norms, RoPE and attention sums; SiLU's exp may differ by an ulp
    assert np.abs(ours - rows).max() <= 1e-4 * np.abs(rows).max()
    assert np.array_equal(ours[0], rows[0])
    # and the biases are used: without them the logits move
    no_bias = _ours(write_tiny_qwen2(tmp_path / "q0.gguf", bias_scale=0.0))
    assert np.abs(no_bias - ours).max() > 0.05
