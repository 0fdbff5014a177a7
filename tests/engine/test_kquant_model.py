"""A whole model in Q5_0 / Q4_K_M / Q5_K_M, run natively (no conversion at load), in the
file's rows and in row groups, and compared with llama.cpp on the same file.

The file: a synthetic llama-shaped F16 GGUF (dimensions multiples of 256, as the
K-quants need) quantized by llama.cpp's own quantizer
(``llama_cpp.llama_model_quantize``), so the type mix is the real one (Q4_K_M puts
Q6_K on the output and half of ffn_down / attn_v).
"""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures.llama_reference import reference_logits
from tests.fixtures.tiny_gguf import write_tiny_llama

llama_cpp = pytest.importorskip("llama_cpp")

FTYPES = {  # llama_ftype name -> the weight types llama.cpp writes for it here
    "MOSTLY_Q5_0": {"Q5_0", "Q6_K"},
    "MOSTLY_Q4_K_M": {"Q4_K", "Q6_K"},
    "MOSTLY_Q5_K_M": {"Q5_K", "Q6_K"},
}


@pytest.fixture(scope="module")
def f16_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("kq") / "f16.gguf"
    return write_tiny_llama(
        path, n_vocab=256, n_embd=256, n_layer=2, n_ff=512, n_head=4, n_head_kv=2, types={"matrix": T.F16}, tied=False
    )


def quantize(src: str, ftype: str) -> str:
    dst = src.replace("f16.gguf", f"{ftype}.gguf")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{ftype}")
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), p) == 0
    return dst


@pytest.mark.llama_cpp
@pytest.mark.parametrize("ftype", sorted(FTYPES))
def test_quantized_model_matches_llama_cpp(f16_model, ftype):
    from powerinfer_backend.plugins.reference import load_reference

    path = quantize(f16_model, ftype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no tensor converted at load
        m = load_gguf(path, verbose=False)
    types = Counter(t.type_name for t in m.tensors.values() if t.type_name != "F32")
    assert set(types) == FTYPES[ftype], types
    assert all(t.converted_from is None for t in m.tensors.values())

    tokens = [int(t) for t in np.random.default_rng(1).integers(1, 256, 24)]
    ctx = NativeContext(NativeModel(m), n_ctx=64, n_batch=64, n_threads=2)
    ours = ctx.eval(tokens, logits_all=True).copy()
    ctx.truncate(0)  # our decode path (row dots) gives each row the bits of the batch (tiled kernels)
    steps = np.stack([ctx.eval([t])[0].copy() for t in tokens])
    assert np.array_equal(steps, ours), np.abs(steps - ours).max(axis=1)
    ref_llm = load_reference(path, extra_buffer_types=False, n_ctx=64, n_threads=2, n_threads_batch=2, logits_all=True)
    ref = reference_logits(ref_llm, tokens, one_by_one=True)  # llama.cpp's decode path: its vec_dot kernels, as ours
    # The same quantized dot products bit for bit; only SiLU's exp differs (docs/parity.md),
    # which now and then flips one Q8 activation rounding and moves a row a little
    scale = np.abs(ref).max()
    row_err = np.abs(ours - ref).max(axis=1)
    assert (row_err <= 1e-4 * scale).mean() >= 0.9, row_err
    assert row_err.max() <= 0.03 * scale, row_err
    assert (ours.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.95
    # llama.cpp's own batch evaluation takes other K-quant kernels for prompt batches
    # and drifts from its decode path; ours stays within that drift of it
    ref_llm.reset()
    ref_llm.eval(tokens)
    batch = np.array(ref_llm.scores[: len(tokens)], dtype=np.float32)
    drift = np.abs(ref - batch).max()
    assert drift <= 0.03 * scale and np.abs(ours - batch).max() <= 0.03 * scale + drift
    # in row groups (Llama's default: Q5_0 / Q4_K / Q5_K / Q6_K here): the batch
    # again has the bits of decode, and the logits stay within the same reach of llama.cpp's
    model = NativeModel(m)
    assert model.repack() > 0
    grouped = NativeContext(model, n_ctx=64, n_batch=64, n_threads=2)
    g_batch = grouped.eval(tokens, logits_all=True).copy()
    grouped.truncate(0)
    g_steps = np.stack([grouped.eval([t])[0].copy() for t in tokens])
    assert np.array_equal(g_steps, g_batch), np.abs(g_steps - g_batch).max(axis=1)
    assert np.abs(g_batch - ref).max() <= 0.03 * scale + drift
    assert (g_batch.argmax(axis=1) == ref.argmax(axis=1)).mean() >= 0.9
    grouped.close()
    model.close()
