"""OPT as PowerInfer's llama.cpp fork defines it (llama.cpp proper has no OPT) on tiny
random-weight files: learned positions (row p + 2), LayerNorm with bias, biased
q/k/v/output, ungated ReLU FFN with biases, no RoPE, tied output; the fork's files
store ffn_down transposed (blk.N.ffn_down_t.weight/.bias). Reference: an independent
float64 numpy forward pass of HF's OPTForCausalLM (tests/fixtures/tiny_archs.py)."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend import Llama
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

from tests.fixtures.tiny_archs import opt_reference, write_tiny_opt

TOKENS = [int(t) for t in np.random.default_rng(0).integers(1, 64, 10)]


def _ctx(model, n_ctx=32):
    return NativeContext(NativeModel(model), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, kv_f16=False)


def _sparse(ctx, model):
    for layer in range(model.hparams.n_layer):
        ctx.set_ffn_sparsity(layer, np.ascontiguousarray(model.layer_tensors(layer)[8].to_float32().T), 0.0)


def test_hparams_and_slots(tmp_path):
    m = load_gguf(write_tiny_opt(tmp_path / "o.gguf"), verbose=False)
    hp = m.hparams
    assert (hp.rope_type, hp.pos_offset, hp.layer_norm, hp.parallel_residual) == (-1, 2, 1, 0)
    assert hp.act_name == "relu" and hp.n_ctx_train == 34 and hp.rms_eps == pytest.approx(1e-5)
    assert m.tied_output and m.global_tensors()["pos_embd"].ne == (64, 34)
    ts = m.layer_tensors(1)
    assert ts[6] is None  # ungated
    assert ts[8].name == "blk.1.ffn_down.weight" and ts[8].converted_from is not None  # rebuilt from ffn_down_t
    assert [ts[s].name for s in (13, 14, 15, 19, 20, 21)] == [
        "blk.1.attn_q.bias",
        "blk.1.attn_k.bias",
        "blk.1.attn_v.bias",
        "blk.1.attn_output.bias",
        "blk.1.ffn_up.bias",
        "blk.1.ffn_down_t.bias",
    ]
    m2 = load_gguf(write_tiny_opt(tmp_path / "o2.gguf", transposed_down=False), verbose=False)
    assert m2.layer_tensors(0)[21].name == "blk.0.ffn_down.bias"


@pytest.mark.parametrize("transposed_down", [True, False], ids=["ffn_down_t", "ffn_down"])
def test_matches_numpy_reference(tmp_path, transposed_down):
    m = load_gguf(write_tiny_opt(tmp_path / "o.gguf", transposed_down=transposed_down), verbose=False)
    ctx = _ctx(m)
    prompt = ctx.eval(TOKENS, logits_all=True).copy()
    ctx.truncate(0)
    decode = np.concatenate([ctx.eval([t], logits_all=True).copy() for t in TOKENS])
    ctx.close()
    ref = opt_reference(m, TOKENS)
    scale = np.abs(ref).max()
    assert np.abs(prompt - ref).max() <= 5e-5 * scale
    assert np.abs(decode - ref).max() <= 5e-5 * scale
    # positions matter (the +2 offset is checked: rows 0 and 1 of the table differ from 2 and 3)
    assert np.abs(opt_reference(m, TOKENS, start=1)[:1] - ref[:1]).max() > 100 * np.abs(prompt - ref).max()


def test_positions_past_the_table_refused(tmp_path):
    """n_ctx_train 34 rows = 32 usable positions (the first two rows are HF's offset)."""
    m = load_gguf(write_tiny_opt(tmp_path / "o.gguf"), verbose=False)
    ctx = _ctx(m, n_ctx=40)
    ctx.eval(list(range(1, 33)))
    with pytest.raises(ValueError, match="past the model's 32 learned positions"):
        ctx.eval([5])
    ctx.close()


@pytest.mark.parametrize("decode", [False, True], ids=["prompt", "decode"])
def test_sparse_threshold0_equals_dense(tmp_path, decode):
    m = load_gguf(write_tiny_opt(tmp_path / "o.gguf"), verbose=False)
    out = {}
    for sparse in (False, True):
        ctx = _ctx(m)
        if sparse:
            _sparse(ctx, m)
        out[sparse] = (
            np.concatenate([ctx.eval([t], logits_all=True).copy() for t in TOKENS])
            if decode
            else ctx.eval(TOKENS, logits_all=True).copy()
        )
        used, total = ctx.ffn_stats()
        ctx.close()
    assert 0.2 < 1 - used / total < 0.8
    dense = out[False]
    np.testing.assert_allclose(out[True], dense, rtol=0, atol=2e-6 * np.abs(dense).max())


def test_powerinfer_file_through_llama(tmp_path):
    """A PWRI-magic OPT file: vocabulary from a llama-labelled metadata copy (llama.cpp
    has no OPT), sparse="auto" runs every layer sparse at threshold 0."""
    path = write_tiny_opt(tmp_path / "o.powerinfer.gguf", magic=b"PWRI")
    with Llama(path, n_ctx=32, n_threads=2, verbose=False, logits_all=True) as llm:
        got = llm._backend.eval(TOKENS, logits_all=True).copy()
        st = llm.stats()
        out = llm("a b", max_tokens=4, temperature=0.0)
    assert st["mode"] == "threshold" and 0.2 < st["ffn_sparsity"] < 0.8
    assert out["usage"]["completion_tokens"] >= 1
    ref = opt_reference(load_gguf(path, verbose=False), TOKENS)
    assert np.abs(got - ref).max() <= 5e-4 * np.abs(ref).max()


@pytest.mark.parametrize(
    "kw, fragment",
    [
        ({"drop": ("position_embd.weight",)}, "missing tensor 'position_embd.weight'"),
        ({"drop": ("blk.1.ffn_up.bias",)}, "missing tensor 'blk.1.ffn_up.bias'"),
        ({"drop": ("blk.0.ffn_down_t.bias",)}, "missing tensor 'blk.0.ffn_down_t.bias' (or 'blk.0.ffn_down.bias')"),
        ({"shapes": {"blk.0.attn_q.bias": (32,)}}, "tensor 'blk.0.attn_q.bias' has shape [32]"),
        ({"shapes": {"position_embd.weight": (30, 64)}}, "tensor 'position_embd.weight' has shape [64, 30]"),
    ],
)
def test_bad_tensors_named(tmp_path, kw, fragment):
    path = write_tiny_opt(tmp_path / "bad.gguf", **kw)
    with pytest.raises(ValueError) as e:
        load_gguf(path, verbose=False)
    assert fragment in str(e.value) and path in str(e.value)


def test_n_ctx_is_capped_at_the_learned_positions(tmp_path, recwarn):
    """A table of n_ctx_train rows holds n_ctx_train - 2 positions: n_ctx 0 resolves to
    that, a larger n_ctx is capped with one warning, and generation stops with "length"
    instead of failing past the table."""
    import warnings

    from powerinfer_backend import Llama

    path = write_tiny_opt(tmp_path / "o.gguf")  # n_ctx_train 34: 32 positions
    with Llama(str(path), n_ctx=0, verbose=False) as llm:
        assert llm.n_ctx() == 32
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        llm = Llama(str(path), verbose=False)  # default n_ctx 512
    assert [str(x.message) for x in w if "learned positions" in str(x.message)] == [
        "n_ctx 512 exceeds the model's 32 learned positions (position_embd.weight); using n_ctx 32"
    ]
    assert w[0].filename == __file__
    out = llm.create_completion([1, 2, 3] * 8, max_tokens=20, temperature=0.0)
    assert out["choices"][0]["finish_reason"] == "length" and out["usage"]["total_tokens"] <= 32
    llm.close()
