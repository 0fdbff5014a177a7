"""The native forward pass (engine.native.NativeModel / NativeContext) on tiny random
llama models written by tests.fixtures.tiny_gguf.write_tiny_llama, against a float64
numpy reference of the architecture (tests.fixtures.llama_reference), plus the
context's bookkeeping (batching, chunking, truncation), determinism and error handling.
"""

from __future__ import annotations

import dataclasses

import re

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend import _native
from powerinfer_backend._native import ffi, lib
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import GGUFModel, load_gguf

from tests.fixtures.llama_reference import reference_forward, weight
from tests.fixtures.tiny_gguf import write_tiny_llama


# ---- models ----------------------------------------------------------------------

# name -> write_tiny_llama arguments
MODELS = {
    "f32": dict(types={"matrix": T.F32}),
    # untied output, partial rotary (n_rot 8 of head_dim 16), Llama-3 style
    # rope_freqs, linear rope scaling (freq_scale 0.5), GQA 6 heads over 2
    "f32_rich": dict(
        types={"matrix": T.F32},
        n_vocab=50,
        n_embd=96,
        n_head=6,
        n_head_kv=2,
        n_ff=64,
        rope_freq_base=500000.0,
        rms_eps=1e-6,
        tied=False,
        rope_freqs=True,
        shapes={"rope_freqs.weight": (4,)},
        extra_kv={
            "llama.rope.dimension_count": 8,
            "llama.rope.scaling.type": "linear",
            "llama.rope.scaling.factor": 2.0,
        },
    ),
    "q8_0": dict(types={"matrix": T.Q8_0}),
    "q4_0": dict(types={"matrix": T.Q4_0}),
    "q4_1": dict(types={"matrix": T.Q4_1}),
    "f16": dict(types={"matrix": T.F16}),
    "bf16": dict(types={"matrix": T.BF16}),
    # types that differ inside the Q/K/V and gate/up product groups (up stays Q8_0)
    "mixed": dict(
        types={
            "token_embd": T.Q4_1,
            "attn_q": T.F16,
            "attn_k": T.BF16,
            "attn_v": T.Q4_0,
            "ffn_down": T.BF16,
            "ffn_gate": T.Q4_1,
            "output": T.F16,
        },
        tied=False,
    ),
}

TOKENS = [3, 17, 0, 42, 5, 5, 63, 1, 29, 8, 11, 40]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> NativeModel over a GGUF from MODELS, built on first use."""
    cache: dict[str, NativeModel] = {}
    tmp = tmp_path_factory.mktemp("models")

    def get(name: str) -> NativeModel:
        if name not in cache:
            seed = list(MODELS).index(name) + 1  # fixed per model, whatever the test order
            path = write_tiny_llama(tmp / f"{name}.gguf", seed=seed, **MODELS[name])
            cache[name] = NativeModel(load_gguf(path, verbose=False))
        return cache[name]

    return get


def run(model: NativeModel, tokens, *, n_ctx=64, n_batch=64, n_threads=2, kv_f16=False, logits_all=True):
    """Logits (a copy) of ``tokens`` evaluated in a fresh context."""
    ctx = NativeContext(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, kv_f16=kv_f16)
    return np.array(ctx.eval(tokens, logits_all=logits_all))


def scale_of(ref: np.ndarray) -> float:
    return float(np.abs(ref).max())


# ---- forward pass against the reference --------------------------------------------


@pytest.mark.parametrize("name", ["f32", "f32_rich"])
def test_f32_matches_reference(isa, models, name):
    """All-F32 weights and an F32 KV cache: the only differences from float64 are
    float32 roundings (sums of <= 128 terms, 2 layers): observed ~4e-7 of the
    logit scale; the bound is 2e-5 of it."""
    model = models(name)
    hp = model.gguf.hparams
    tokens = [t % hp.n_vocab for t in TOKENS]
    ref, hidden = reference_forward(model.gguf, tokens)
    ctx = NativeContext(model, n_ctx=32, n_batch=32, n_threads=2, kv_f16=False)
    logits = np.array(ctx.eval(tokens, logits_all=True))
    assert logits.shape == (len(tokens), hp.n_vocab) and logits.dtype == np.float32
    np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-5 * scale_of(ref))
    np.testing.assert_allclose(ctx.embeddings(), hidden, rtol=0, atol=2e-5 * scale_of(hidden))
    assert np.array_equal(logits.argmax(axis=1), ref.argmax(axis=1))


def test_f32_rich_model_hparams(models):
    """The f32_rich fixture really exercises partial rotary, rope_freqs, linear
    scaling and an untied output (guards the test above against fixture drift)."""
    m = models("f32_rich").gguf
    hp = m.hparams
    assert (hp.n_rot, hp.n_embd_head, hp.rope_freq_scale, hp.n_head, hp.n_head_kv) == (8, 16, 0.5, 6, 2)
    assert "rope_freqs.weight" in m.tensors and "output.weight" in m.tensors


def test_f16_kv_cache_matches_reference(isa, models):
    """F32 weights with the default F16 KV cache: K, V, q and the softmax weights
    are rounded to F16 (2^-11 relative): observed ~5e-4 of the logit scale against
    exact attention, bound 3e-3 of it. Against the reference that rounds the same
    operands: ~1e-6 (float32 sums) up to ~1.5e-4 of the scale when an operand near
    a rounding boundary goes the other way (float32 vs float64 inputs); bound 3e-4
    of the scale (a V cache off by 0.1% is ~1e-3 of it)."""
    model = models("f32")
    ref, _ = reference_forward(model.gguf, TOKENS)
    sim, _ = reference_forward(model.gguf, TOKENS, f16_cache=True)
    logits = run(model, TOKENS, kv_f16=True)
    np.testing.assert_allclose(logits, ref, rtol=0, atol=3e-3 * scale_of(ref))
    np.testing.assert_allclose(logits, sim, rtol=0, atol=3e-4 * scale_of(ref))


# Bounds for quantized / half-precision weights (logit scale ~3.3 on these models).
#
# exact: max |ours - reference with exact activations|. The engine rounds every
#   matrix input to the weights' activation type. Q8_0/Q8_1 rounding is uniform in
#   +-d/2 with d = amax/127 per block of 32, i.e. a noise of std ~amax/440 ~ 0.6%
#   of the row's RMS (amax ~ 2.5 RMS); each product passes ~0.6% relative noise on,
#   compounded over 2 layers x 5 products in series -> a few % of the logit scale at
#   the worst of 12 x 64 logits: observed 0.06-0.085 over 3 seeds. BF16 rounds to
#   8 bits (+-2^-9, ~5x less: observed ~0.02), F16 to 11 bits (observed ~0.003).
#   Bounds are ~3x the observed, far below the O(1) errors of a broken kernel.
# tight: |ours - reference that rounds activations (and the F16 cache) exactly as
#   the engine does| per logits row, for at least 3/4 of the rows: observed ~5e-7.
#   A few rows may differ more: an element that sits on a rounding boundary can
#   round the other way after float32-vs-float64 differences upstream (one Q8 step
#   there moves a row by up to ~0.03). F16 weights do this so often (11-bit steps)
#   that their tight bound is only a little below `exact`. A systematic deviation
#   (wrong rounding rule, wrong Q8_1 block sum, ...) shows in every row.
# tie: ours' top-1 token has a reference logit within `tie` of the best
#   (a near-tie may go either way; anything else must agree).
QUANT_BOUNDS = {  # name: (exact, tight, tie)
    "q8_0": (0.25, 1e-5, 0.05),
    "q4_0": (0.25, 1e-5, 0.05),
    "q4_1": (0.25, 1e-5, 0.05),
    "bf16": (0.08, 1e-5, 0.02),
    "f16": (0.015, 4e-3, 0.01),
}


@pytest.mark.parametrize("kv_f16", [False, True], ids=["kv32", "kv16"])
@pytest.mark.parametrize("name", list(QUANT_BOUNDS))
def test_quantized_matches_reference(isa, models, name, kv_f16):
    exact_bound, tight_bound, tie = QUANT_BOUNDS[name]
    model = models(name)
    ref, _ = reference_forward(model.gguf, TOKENS)
    sim, _ = reference_forward(model.gguf, TOKENS, quantize_activations=True, f16_cache=kv_f16)
    logits = run(model, TOKENS, kv_f16=kv_f16)
    assert np.abs(logits - ref).max() <= exact_bound
    row_err = np.abs(logits - sim).max(axis=1)
    assert np.mean(row_err <= tight_bound) >= 0.75, row_err
    top = logits.argmax(axis=1)
    rows = np.arange(len(TOKENS))
    assert np.all(ref[rows, top] >= ref.max(axis=1) - tie)


def test_mixed_types_match_reference(models):
    """Per-tensor types that differ inside one product group (Q F16, K BF16, V
    Q4_0; gate Q4_1, up Q8_0), as in mixed-quantization files or tensors that
    load_gguf converted."""
    model = models("mixed")
    ref, _ = reference_forward(model.gguf, TOKENS)
    sim, _ = reference_forward(model.gguf, TOKENS, quantize_activations=True)
    logits = run(model, TOKENS, kv_f16=False)
    assert np.abs(logits - ref).max() <= 0.25
    assert np.mean(np.abs(logits - sim).max(axis=1) <= 4e-3) >= 0.75


# ---- context bookkeeping ------------------------------------------------------------


@pytest.mark.parametrize("name,kv_f16", [("f32", False), ("q4_1", True)])
def test_logits_all_vs_last_only(models, name, kv_f16):
    model = models(name)
    all_rows = run(model, TOKENS, kv_f16=kv_f16, logits_all=True)
    last = run(model, TOKENS, kv_f16=kv_f16, logits_all=False)
    assert all_rows.shape == (len(TOKENS), 64) and last.shape == (1, 64)
    np.testing.assert_allclose(last[0], all_rows[-1], rtol=0, atol=1e-6 * scale_of(all_rows))


@pytest.mark.parametrize("name,kv_f16", [("f32", False), ("f32", True), ("q8_0", True), ("bf16", False)])
def test_batch_equals_token_by_token(models, name, kv_f16):
    """A prompt in one call == the same tokens one call each (each token's row
    is computed the same way whatever the batch; tight tolerance)."""
    model = models(name)
    batch = run(model, TOKENS, kv_f16=kv_f16)
    ctx = NativeContext(model, n_ctx=32, n_batch=32, n_threads=2, kv_f16=kv_f16)
    steps = []
    for i, t in enumerate(TOKENS):
        steps.append(np.array(ctx.eval([t])[0]))
        assert ctx.n_past == i + 1
    np.testing.assert_allclose(np.stack(steps), batch, rtol=0, atol=1e-6 * scale_of(batch))


@pytest.mark.parametrize("n_batch", [1, 5, 11])
def test_chunked_eval_equals_one_batch(models, n_batch):
    """n_batch smaller than the prompt: NativeContext.eval splits it; the logits
    (all rows, or the last) and the cache state are those of one big batch."""
    model = models("q8_0")
    whole = run(model, TOKENS, kv_f16=True)
    chunked = run(model, TOKENS, n_batch=n_batch, kv_f16=True)
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-6 * scale_of(whole))
    ctx = NativeContext(model, n_ctx=32, n_batch=n_batch, n_threads=2)
    last = np.array(ctx.eval(TOKENS))
    assert last.shape == (1, 64) and ctx.n_past == len(TOKENS)
    np.testing.assert_allclose(last[0], whole[-1], rtol=0, atol=1e-6 * scale_of(whole))
    # the cache holds the whole prompt: continuing matches a one-batch context
    ref_ctx = NativeContext(model, n_ctx=32, n_batch=32, n_threads=2)
    ref_ctx.eval(TOKENS)
    np.testing.assert_allclose(
        np.array(ctx.eval([7, 8], logits_all=True)),
        np.array(ref_ctx.eval([7, 8], logits_all=True)),
        rtol=0,
        atol=1e-6 * scale_of(whole),
    )


def test_truncate_then_reeval(models):
    model = models("q4_0")
    ctx = NativeContext(model, n_ctx=32, n_batch=32, n_threads=2)
    ctx.eval(TOKENS)
    assert ctx.n_past == len(TOKENS)
    ctx.truncate(len(TOKENS) + 5)  # past the end: no-op
    assert ctx.n_past == len(TOKENS)
    ctx.truncate(5)
    assert ctx.n_past == 5
    new = [9, 10, 11]
    got = np.array(ctx.eval(new, logits_all=True))
    fresh = run(model, TOKENS[:5] + new, kv_f16=True)[5:]
    np.testing.assert_allclose(got, fresh, rtol=0, atol=1e-6 * scale_of(fresh))
    assert ctx.n_past == 8
    ctx.truncate(0)  # clears the cache
    assert ctx.n_past == 0
    got = np.array(ctx.eval(TOKENS, logits_all=True))
    np.testing.assert_allclose(got, run(model, TOKENS, kv_f16=True), rtol=0, atol=1e-6 * scale_of(got))
    with pytest.raises(ValueError, match="n_keep"):
        ctx.truncate(-1)


def test_embeddings(models):
    model = models("f32_rich")
    hp = model.gguf.hparams
    tokens = [t % hp.n_vocab for t in TOKENS]
    ctx = NativeContext(model, n_ctx=32, n_batch=32, n_threads=2, kv_f16=False)
    logits = np.array(ctx.eval(tokens, logits_all=True))
    emb = ctx.embeddings()
    assert emb.shape == (len(tokens), hp.n_embd) and emb.dtype == np.float32
    # logits are the final hidden states through the output projection
    out_w = weight(model.gguf, "output.weight")
    np.testing.assert_allclose(emb.astype(np.float64) @ out_w.T, logits, rtol=0, atol=1e-5)
    ctx.truncate(0)
    ctx.eval(tokens)
    last = ctx.embeddings()
    assert last.shape == (1, hp.n_embd)
    np.testing.assert_allclose(last[0], emb[-1], rtol=0, atol=1e-6)
    emb[:] = 0  # a copy, not a view of the C buffer
    assert np.any(ctx.embeddings() != 0)


# ---- determinism ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["f32", "q4_1", "bf16"])
def test_deterministic_across_runs_and_threads(models, name):
    """Work is split across threads by output rows (and by (token, head) in
    attention); no single sum is split, so the thread count cannot change any
    bit, and neither can running twice."""
    model = models(name)
    a = run(model, TOKENS, n_threads=2, kv_f16=True)
    b = run(model, TOKENS, n_threads=2, kv_f16=True)
    assert np.array_equal(a, b)
    for n_threads in (1, 3):
        assert np.array_equal(run(model, TOKENS, n_threads=n_threads, kv_f16=True), a), n_threads


# ---- errors ------------------------------------------------------------------------


def test_eval_errors(models):
    model = models("q8_0")
    ctx = NativeContext(model, n_ctx=8, n_batch=8, n_threads=1)
    ctx.eval([1, 2, 3, 4, 5, 6])
    with pytest.raises(ValueError, match="context window"):
        ctx.eval([1, 2, 3])
    assert ctx.n_past == 6  # a refused eval changes nothing
    with pytest.raises(ValueError, match=r"token 64 at index 1 is outside \[0, 64\)"):
        ctx.eval([1, 64])
    with pytest.raises(ValueError, match=r"token -1"):
        ctx.eval([-1])
    assert ctx.n_past == 6
    with pytest.raises(ValueError, match="non-empty"):
        ctx.eval([])
    with pytest.raises(ValueError, match="non-empty"):
        ctx.eval(np.zeros((2, 2), np.int32))
    ctx.eval([7, 8])  # still usable; now full
    assert ctx.n_past == 8
    with pytest.raises(ValueError, match="context window"):
        ctx.eval([1])
    # The C library checks the window itself too (position 8 of an 8-token cache).
    tok, pos = np.array([1], np.int32), np.array([8], np.int32)
    rc = lib.pi_eval(ctx._ptr, ffi.from_buffer("int32_t[]", tok), ffi.from_buffer("int32_t[]", pos), 1, 0)
    assert rc == lib.PI_ERR_CONTEXT_FULL
    with pytest.raises(ValueError, match="context window of 8"):
        _native.check(rc, "eval")


def test_failed_chunked_eval_changes_nothing(models):
    """A bad token in a later chunk must not leave the earlier chunks cached."""
    ctx = NativeContext(models("q8_0"), n_ctx=16, n_batch=4, n_threads=1)
    with pytest.raises(ValueError, match="index 5"):
        ctx.eval([1, 2, 3, 4, 5, 64])
    assert ctx.n_past == 0


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(n_ctx=0), "n_ctx"),
        (dict(n_ctx=-5), "n_ctx"),
        (dict(n_batch=0), "n_batch"),
        (dict(n_threads=0), "n_threads"),
        (dict(n_ctx=2**40), "n_ctx must be an integer"),  # past int32: named, not a cffi OverflowError
        (dict(n_batch=8.0), "n_batch must be an integer"),
    ],
)
def test_context_create_errors(models, kwargs, match):
    args = dict(n_ctx=8, n_batch=8, n_threads=1) | kwargs
    with pytest.raises(ValueError, match=match):
        NativeContext(models("q8_0"), **args)


def _tampered(model: GGUFModel, name: str, **changes) -> GGUFModel:
    """A copy of ``model`` whose tensor ``name`` has fields replaced (bypassing
    load_gguf's own checks, to reach pi_model_create's)."""
    tensors = dict(model.tensors)
    tensors[name] = dataclasses.replace(tensors[name], **changes)
    return dataclasses.replace(model, tensors=tensors)


@pytest.mark.parametrize(
    "name,changes,exc,match",
    [
        ("blk.1.ffn_up.weight", dict(ne=(64, 96)), ValueError, r"blk\.1\.ffn_up\.weight: shape \[64, 96"),
        ("blk.0.attn_k.weight", dict(ne=(64, 64)), ValueError, r"blk\.0\.attn_k\.weight: shape"),
        ("output_norm.weight", dict(ne=(65,)), ValueError, r"output_norm\.weight: shape"),
        ("token_embd.weight", dict(ne=(64, 63)), ValueError, r"token_embd\.weight: shape"),
        ("blk.0.ffn_down.weight", dict(nbytes=100), ValueError, r"blk\.0\.ffn_down\.weight: 100 bytes"),
        ("blk.1.attn_norm.weight", dict(type=int(T.F16)), NotImplementedError, r"blk\.1\.attn_norm\.weight.*F32"),
        ("blk.0.attn_q.weight", dict(type=int(T.Q8_1)), NotImplementedError, r"blk\.0\.attn_q\.weight: unsupported"),
        ("blk.0.attn_v.weight", dict(type=int(T.Q3_K)), NotImplementedError, r"blk\.0\.attn_v\.weight: unsupported"),
        (
            "blk.0.attn_v.weight",
            dict(type=int(T.Q4_K)),
            ValueError,
            r"blk\.0\.attn_v\.weight: row length 64 is not a multiple",
        ),
        ("blk.0.attn_q.weight", dict(type=int(T.Q8_K)), NotImplementedError, r"blk\.0\.attn_q\.weight: unsupported"),
    ],
)
def test_model_create_validates_tensors(models, name, changes, exc, match):
    good = models("q8_0").gguf
    with pytest.raises(exc, match=match):
        NativeModel(_tampered(good, name, **changes))


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(n_rot=7), "n_rot 7"),
        (dict(n_rot=18), "n_rot 18"),
        (dict(n_head_kv=3), "multiple of n_head_kv"),
        (dict(rope_freq_base=0.0), "rope_freq_base"),
        (dict(rope_type=1), "rope type 1"),
        (dict(act=9), "activation 9"),
    ],
)
def test_model_create_validates_hparams(models, changes, match):
    good = models("q8_0").gguf
    with pytest.raises(ValueError, match=match):
        NativeModel(dataclasses.replace(good, hparams=dataclasses.replace(good.hparams, **changes)))


def test_token_ids_are_checked_not_wrapped(models):
    ctx = NativeContext(models("q8_0"), n_ctx=16, n_batch=8, n_threads=1)
    with pytest.raises(ValueError, match="outside"):
        ctx.eval(np.array([2**32 + 5], dtype=np.int64))  # would wrap to 5 as int32
    with pytest.raises(ValueError, match="integers"):
        ctx.eval(np.array([3.7]))
    with pytest.raises(ValueError, match="outside"):
        ctx.eval([2**40])
    assert ctx.n_past == 0


def test_model_outlives_its_contexts(tmp_path):
    """Closing the model first defers the free until its last context closes."""
    m = NativeModel(load_gguf(write_tiny_llama(tmp_path / "m.gguf"), verbose=False))
    ctx = NativeContext(m, n_ctx=8, n_batch=8, n_threads=1)
    before = ctx.eval([1, 2, 3]).copy()
    m.close()
    assert m.ptr is not None  # still in use
    ctx.truncate(0)
    assert np.array_equal(ctx.eval([1, 2, 3]), before)
    ctx.close()
    assert m.ptr is None
    with pytest.raises(ValueError, match="closed"):
        NativeContext(m, n_ctx=8, n_batch=8, n_threads=1)


def test_close_waits_for_an_eval_in_another_thread(models):
    import threading

    ctx = NativeContext(models("q8_0"), n_ctx=512, n_batch=512, n_threads=1)
    done = []
    t = threading.Thread(target=lambda: done.append(ctx.eval(list(range(1, 60)) * 8).shape))
    t.start()
    while not ctx._busy.locked() and t.is_alive():
        pass
    ctx.close()  # must neither free buffers under the running eval nor hang
    t.join(timeout=60)
    assert not t.is_alive() and done == [(1, ctx.n_vocab)] and not ctx.is_open


def test_prompt_chunk_without_outputs(models):
    """logits_all < 0 fills the KV cache and computes no logits; the next token's
    logits equal those of a run that computed them all along."""
    ctx = NativeContext(models("q8_0"), n_ctx=16, n_batch=8, n_threads=1)
    toks = np.arange(1, 6, dtype=np.int32)
    pos = np.arange(0, 5, dtype=np.int32)
    _native.check(
        lib.pi_eval(ctx._ptr, ffi.from_buffer("int32_t[]", toks), ffi.from_buffer("int32_t[]", pos), 5, -1), "eval"
    )
    assert lib.pi_n_outputs(ctx._ptr) == 0 and lib.pi_get_logits(ctx._ptr) == ffi.NULL
    assert ctx.n_past == 5
    got = ctx.eval([6])[0].copy()
    ctx.truncate(0)
    ctx.eval([1, 2, 3, 4, 5])
    assert np.array_equal(got, ctx.eval([6])[0])


def _down_t(model, layer):
    v = model.gguf.tensors[f"blk.{layer}.ffn_down.weight"]
    n_ff, n_embd = v.ne[0], v.ne[1]
    return np.ascontiguousarray(v.to_float32().reshape(n_embd, n_ff).T)


def test_sparse_ffn_threshold_zero_equals_dense(models):
    """Down-only sparse FFN with threshold 0 on an all-F32 model (dense down uses F32
    activations, so both compute the same sums up to order): same logits to float
    tolerance; every neuron counted as used."""
    m = models("f32")
    toks = [1, 5, 9, 3, 7, 2]
    dense = NativeContext(m, n_ctx=16, n_batch=8, n_threads=2, kv_f16=False)
    expected = dense.eval(toks, logits_all=True)
    sparse = NativeContext(m, n_ctx=16, n_batch=8, n_threads=2, kv_f16=False)
    for il in range(m.gguf.hparams.n_layer):
        sparse.set_ffn_sparsity(il, _down_t(m, il), 0.0)
    got = sparse.eval(toks, logits_all=True)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5 * np.abs(expected).max())
    used, total = sparse.ffn_stats()
    assert total == len(toks) * m.gguf.hparams.n_ff * m.gguf.hparams.n_layer and 0.9 * total <= used <= total


def test_sparse_ffn_threshold_skips_neurons_and_is_deterministic(models):
    m = models("f32")
    toks = [1, 5, 9, 3]
    runs = []
    for threads in (1, 2):
        ctx = NativeContext(m, n_ctx=16, n_batch=8, n_threads=threads, kv_f16=False)
        for il in range(m.gguf.hparams.n_layer):
            ctx.set_ffn_sparsity(il, _down_t(m, il), 0.05)
        runs.append(ctx.eval(toks, logits_all=True))
        used, total = ctx.ffn_stats(reset=True)
        assert 0 < used < total
        assert ctx.ffn_stats() == (0, 0)
        ctx.set_ffn_sparsity(0, None)  # back to dense for layer 0
    assert np.array_equal(runs[0], runs[1])


def test_sparse_ffn_validation(models):
    m = models("f32")
    ctx = NativeContext(m, n_ctx=8, n_batch=8, n_threads=1)
    good = _down_t(m, 0)
    with pytest.raises(ValueError, match="layer"):
        ctx.set_ffn_sparsity(99, good)
    with pytest.raises(ValueError, match="ffn_down_t"):
        ctx.set_ffn_sparsity(0, good.T.copy())
    with pytest.raises(ValueError, match="threshold"):
        ctx.set_ffn_sparsity(0, good, -1.0)
    with pytest.raises(NotImplementedError):
        ctx.set_ffn_sparsity(0, good.astype(np.float64))


def test_arrays_the_library_writes_are_checked(models):
    """set_ffn_hist(s) and set_ffn_capture take only writable C-contiguous arrays of their exact
    dtype and shape (the C library writes into them), and say which they need."""
    from powerinfer_backend.engine.native import FFN_HIST_BINS

    model = models("f32")
    ctx = NativeContext(model, n_ctx=16, n_batch=8, n_threads=1)
    hp = model.gguf.hparams
    hist = np.zeros((hp.n_layer, hp.n_ff, FFN_HIST_BINS), np.uint32)
    want = f"ffn hist must be a writable C-contiguous uint32 array of shape {hist.shape}"
    for bad in (hist.astype(np.int32), hist[:, :-1], np.asfortranarray(hist), hist.copy().view(np.uint32)[::1]):
        if bad.flags.c_contiguous and bad.dtype == np.uint32 and bad.shape == hist.shape:
            bad.flags.writeable = False
        with pytest.raises(ValueError, match=re.escape(want)):
            ctx.set_ffn_hist(bad)
        with pytest.raises(ValueError, match=re.escape(want)):
            ctx.set_ffn_hists(hist, bad)
    ctx.set_ffn_hists(hist, None)  # accepted, then stopped
    ctx.set_ffn_hists(None, None)
    cap = np.zeros((hp.n_layer, 8, hp.n_embd), np.float32)
    with pytest.raises(
        ValueError,
        match=re.escape(f"ffn capture buffer must be a writable C-contiguous float32 array of shape {cap.shape}"),
    ):
        ctx.set_ffn_capture(cap.astype(np.float64))
    ctx.set_ffn_capture(cap)
    ctx.set_ffn_capture(None)
