"""A context placed on a ggml device (native/src/device/ggml/), verified with ggml's CPU backend as
the device ("CPU"): the contract's byte rule equals the buffers ggml allocates, per buffer; a budget
one byte short is refused before anything is allocated; logits stay close to the CPU-only engine
(not bit-identical: the device sums in its own order) and reruns are identical; the device really
computes (zeroing a placed tensor changes the logits); the architectures' attention variants."""

from __future__ import annotations

import types

import numpy as np
import pytest

from powerinfer_backend.engine import ggml, testing
from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.loader.arch import LAYER_SLOTS
from tests.fixtures.tiny_archs import write_tiny_falcon, write_tiny_gemma3, write_tiny_opt, write_tiny_qwen2
from tests.fixtures.tiny_gguf import write_tiny_llama

TOKS = [1, 5, 9, 3, 7, 2, 8, 4, 6, 11, 13, 12]
N_CTX, N_BATCH = 64, 4
F16, Q8_0 = 1, 8


def layer(attn: bool, hot=()) -> types.SimpleNamespace:
    """One layer of a plan as set_ggml_device reads it (a LayerPlan's two fields)."""
    return types.SimpleNamespace(attn_on_device=attn, hot_ids=np.asarray(list(hot), np.int32))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    g = load_gguf(write_tiny_llama(tmp_path_factory.mktemp("gg") / "m.gguf", n_layer=3, n_ff=128), verbose=False)
    m = NativeModel(g)
    yield g, m
    m.close()


@pytest.fixture(scope="module")
def cpu_dev():
    with ggml.GgmlDevice("CPU", 1) as d:
        yield d


def _ctx(m, sparse: bool = True) -> NativeContext:
    ctx = NativeContext(m, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
    for i in range(m.gguf.hparams.n_layer) if sparse else ():
        ctx.set_ffn_sparsity(i, transposed_down(m.gguf, i, dtype=down_t_dtype(m.gguf, split=True)), 0.0)
    return ctx


def _run(ctx, toks=TOKS) -> np.ndarray:
    """Logits of a 4-token prompt batch, then one token at a time (the decode path)."""
    out = [ctx.eval(toks[:N_BATCH], logits_all=True).copy()] + [ctx.eval([t]).copy() for t in toks[N_BATCH:]]
    return np.concatenate(out)


def plan_buffers(dev, g, layers, output_on: bool, n_cells: int) -> dict[str, int]:
    """The contract's rule for the weights and kv buffers, from the device's per-tensor bytes."""

    def slot(qtype, ne0, ne1=1):
        a = dev.alignment
        return -(-dev.tensor_bytes(qtype, ne0, ne1) // a) * a

    hp = g.hparams
    w = kv = 0
    rows = ("ffn_gate", "ffn_up", "ffn_down")
    for i, L in enumerate(layers):
        ts = dict(zip(LAYER_SLOTS, g.layer_tensors(i)))
        if L.attn_on_device:
            w += sum(
                slot(t.type, t.ne[0], int(np.prod(t.ne[1:]))) for s, t in ts.items() if t is not None and s not in rows
            )
            kv += 2 * slot(F16, hp.n_head_kv * hp.n_embd_head, n_cells)
        n_hot = len(L.hot_ids)
        if n_hot:
            w += slot(ts["ffn_gate"].type, hp.n_embd, n_hot) + slot(ts["ffn_up"].type, hp.n_embd, n_hot)
            # down columns: Q8_0 in whole blocks of 32 neurons for a quantized ffn_down, else F16
            quantized = ts["ffn_down"].type not in (0, F16, 30)
            w += slot(Q8_0, -(-n_hot // 32) * 32, hp.n_embd) if quantized else slot(F16, n_hot, hp.n_embd)
    if output_on:
        gl = g.global_tensors()
        out = gl["output"] if gl["output"] is not None else gl["tok_embd"]
        w += slot(0, hp.n_embd) + (slot(0, hp.n_embd) if gl["output_norm_b"] is not None else 0)
        w += slot(out.type, out.ne[0], out.ne[1])
    return {"weights": w, "kv": kv}


PLANS = {
    "nothing": ([layer(False)] * 3, False),
    "output only": ([layer(False)] * 3, True),
    "some": ([layer(True), layer(False, range(0, 128, 3)), layer(False)], False),
    "all": ([layer(True, range(64))] * 3, True),
}


@pytest.fixture(scope="module")
def reference(tiny):
    ctx = _ctx(tiny[1])
    ref = _run(ctx)
    ctx.close()
    return ref


@pytest.mark.parametrize("name", list(PLANS))
def test_buffers_follow_the_rule_and_logits_stay_close(tiny, cpu_dev, reference, name):
    g, m = tiny
    layers, out_on = PLANS[name]
    placed = out_on or any(L.attn_on_device or len(L.hot_ids) for L in layers)
    runs = []
    for _ in range(2):
        ctx = _ctx(m)
        compute = ctx.ggml_compute_bytes(cpu_dev)
        assert compute > 0
        ctx.set_ggml_device(cpu_dev, layers, out_on, 1 << 40)
        bufs = ctx.ggml_buffers()
        want = plan_buffers(cpu_dev, g, layers, out_on, n_cells=64) | {"compute": compute if placed else 0}
        assert bufs == want, name
        runs.append(_run(ctx))
        assert ctx.ggml_buffers() == bufs  # no buffer grew while running
        ctx.close()
    assert np.array_equal(runs[0], runs[1])  # a fixed merge order: reruns are identical
    diff = float(np.abs(runs[0] - reference).max())
    print(f"{name}: max |logit diff| vs CPU-only {diff:.3g} (logits up to {np.abs(reference).max():.3g})")
    assert diff < 0.05 * float(np.abs(reference).max())
    assert np.array_equal(runs[0].argmax(1), reference.argmax(1))


def test_budget_one_byte_short_is_refused_before_allocating(tiny, cpu_dev):
    g, m = tiny
    layers, out_on = PLANS["all"]
    ctx = _ctx(m)
    need = sum(plan_buffers(cpu_dev, g, layers, out_on, 64).values()) + ctx.ggml_compute_bytes(cpu_dev)
    with pytest.raises(MemoryError, match=f"needs {need} device bytes .*the budget is {need - 1}"):
        ctx.set_ggml_device(cpu_dev, layers, out_on, need - 1)
    with pytest.raises(ValueError, match="not placed on a ggml device"):
        ctx.ggml_buffers()  # nothing was placed
    ctx.set_ggml_device(cpu_dev, layers, out_on, need)  # the exact budget fits
    assert sum(ctx.ggml_buffers().values()) == need
    ctx.close()


@pytest.mark.skipif(not testing.AVAILABLE, reason=testing.MISSING)
@pytest.mark.parametrize("slot,row0,n_rows", [("attn_q", 0, None), ("ffn_gate", 32, 32)])
def test_zeroing_a_device_tensor_changes_the_next_logits(tiny, cpu_dev, slot, row0, n_rows):
    _, m = tiny
    ctx = _ctx(m)
    ctx.set_ggml_device(cpu_dev, [layer(True, range(64))] * 3, False, 1 << 40)
    before = ctx.eval(TOKS[:4], logits_all=True).copy()
    ctx.truncate(0)
    assert np.array_equal(ctx.eval(TOKS[:4], logits_all=True), before)  # unchanged device: same logits
    ctx.truncate(0)
    testing.zero_rows(ctx, 1, slot, row0, n_rows)
    after = ctx.eval(TOKS[:4], logits_all=True)
    assert np.abs(after - before).max() > 1e-3, slot
    ctx.close()


def test_hot_layers_need_down_t_and_bad_ids_are_refused(tiny, cpu_dev):
    _, m = tiny
    ctx = _ctx(m, sparse=False)
    with pytest.raises(ValueError, match="blk.0: hot neurons need the layer's down_t"):
        ctx.set_ggml_device(cpu_dev, [layer(False, [1, 2])] + [layer(False)] * 2, False, 1 << 40)
    ctx.close()
    ctx = _ctx(m)
    with pytest.raises(ValueError, match="strictly increasing"):
        ctx.set_ggml_device(cpu_dev, [layer(False, [2, 1])] + [layer(False)] * 2, False, 1 << 40)
    ctx.close()


def _arch_case(g, layers_fn, cpu_dev, toks, sparse=True):
    m = NativeModel(g)
    try:
        ref = _ctx(m, sparse)
        want = _run(ref, toks)
        ref.close()
        ctx = _ctx(m, sparse)
        ctx.set_ggml_device(cpu_dev, layers_fn(g.hparams), True, 1 << 40)
        got = _run(ctx, toks)
        ctx.close()
    finally:
        m.close()
    return got, want


@pytest.mark.parametrize("arch", ["gemma3", "qwen2", "llama-rope-freqs", "opt"])
def test_architectures_attention_on_the_device(tmp_path, cpu_dev, arch):
    """Gemma 3 (q/k norms, post norms, attn_scale, sliding window with its own RoPE base, GeGLU hot
    neurons), Qwen2 (q/k/v biases, NEOX), Llama 3 rope_freqs, OPT (LayerNorm with biases, no RoPE,
    attention only: its FFN is ungated)."""
    toks = [int(t) for t in np.random.default_rng(1).integers(1, 64, 12)]
    path = tmp_path / f"{arch}.gguf"
    if arch == "gemma3":
        g = load_gguf(write_tiny_gemma3(path), verbose=False)
    elif arch == "qwen2":
        g = load_gguf(write_tiny_qwen2(path), verbose=False)
    elif arch == "opt":
        g = load_gguf(write_tiny_opt(path), verbose=False)
    else:
        g = load_gguf(write_tiny_llama(path, n_layer=2, rope_freqs=True), verbose=False)
    ungated = arch == "opt"
    got, want = _arch_case(
        g,
        lambda hp: [layer(True, () if ungated else range(0, hp.n_ff, 2))] * hp.n_layer,
        cpu_dev,
        toks,
        sparse=not ungated,
    )
    diff = float(np.abs(got - want).max())
    print(f"{arch}: max |logit diff| {diff:.3g} (logits up to {np.abs(want).max():.3g})")
    assert diff < 0.05 * float(np.abs(want).max())
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


def test_unsupported_placements_are_refused_with_the_reason(tmp_path, cpu_dev):
    """Falcon's fused attn_qkv cannot go on the device; OPT's ungated FFN cannot be split."""
    for write, kind, layers_of, match in [
        (write_tiny_falcon, NotImplementedError, lambda n: [layer(True)] * n, "fused attn_qkv"),
        (write_tiny_opt, NotImplementedError, lambda n: [layer(False, [1, 5])] * n, "needs a gated FFN"),
    ]:
        g = load_gguf(write(tmp_path / f"{write.__name__}.gguf"), verbose=False)
        m = NativeModel(g)
        ctx = _ctx(m, sparse=write is write_tiny_opt)
        with pytest.raises(kind, match=match):
            ctx.set_ggml_device(cpu_dev, layers_of(g.hparams.n_layer), False, 1 << 40)
        if write is write_tiny_falcon:  # sizing the compute buffer (planning runs it first) refuses too
            with pytest.raises(NotImplementedError, match="blk.0: a fused attn_qkv"):
                ctx.ggml_compute_bytes(cpu_dev)
        ctx.close()
        m.close()


def test_closing_the_device_first_defers_its_free(tiny):
    _, m = tiny
    dev = ggml.GgmlDevice("CPU", 1)
    ctx = _ctx(m)
    ctx.set_ggml_device(dev, [layer(True, range(8))] * 3, True, 1 << 40)
    dev.close()  # the context still computes on it
    assert dev.ptr is not None
    assert ctx.eval(TOKS[:4]).shape == (1, m.gguf.hparams.n_vocab)
    ctx.close()
    assert dev.ptr is None
