"""SmolLM2 (the embedded model) placed on ggml's CPU backend as the device: every attention block,
the output block and half of each layer's neurons on the device, teacher-forced logits close to the
CPU-only engine; and the split's concurrency: the device thread's hot-FFN graphs overlap the CPU's
cold-neuron work (timestamps from both; device_threads=1, CPU threads=1)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from powerinfer_backend.engine import ggml, testing
from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

PROMPT = [1, 504, 3458, 314, 253, 1345, 30, 2]


@pytest.fixture(scope="module")
def smol(model_path):
    g = load_gguf(model_path, verbose=False)
    m = NativeModel(g)
    down_t = [transposed_down(g, i, dtype=down_t_dtype(g, split=True)) for i in range(g.hparams.n_layer)]
    yield g, m, down_t
    m.close()


def _ctx(smol, placed: bool, dev=None):
    g, m, down_t = smol
    hp = g.hparams
    ctx = NativeContext(m, n_ctx=128, n_batch=8, n_threads=1)
    for i in range(hp.n_layer):
        ctx.set_ffn_sparsity(i, down_t[i], 0.0)
    if placed:
        half = types.SimpleNamespace(attn_on_device=True, hot_ids=np.arange(0, hp.n_ff, 2, dtype=np.int32))
        ctx.set_ggml_device(dev, [half] * hp.n_layer, True, 1 << 40)
    return ctx


def test_smollm2_teacher_forced_logits_close(smol):
    cpu = _ctx(smol, False)
    first = cpu.eval(PROMPT, logits_all=True).copy()
    cont = [int(first[-1].argmax())]
    rows = [first]
    for _ in range(15):  # the CPU engine's greedy continuation, fed to both
        rows.append(cpu.eval([cont[-1]]).copy())
        cont.append(int(rows[-1][-1].argmax()))
    cpu.close()
    want = np.concatenate(rows)
    with ggml.GgmlDevice("CPU", 1) as dev:
        ctx = _ctx(smol, True, dev)
        got = np.concatenate([ctx.eval(PROMPT, logits_all=True).copy()] + [ctx.eval([t]).copy() for t in cont[:-1]])
        assert ctx.ggml_buffers()["compute"] == ctx.ggml_compute_bytes(dev)  # the reserve held: nothing grew
        ctx.close()
    top2 = np.sort(want, axis=1)[:, -2:]
    sure = top2[:, 1] - top2[:, 0] >= 1.0
    diff = np.abs(got - want).max(axis=1)
    print(f"SmolLM2 on ggml-cpu: max |logit diff| per position {np.round(diff, 3).tolist()}")
    assert np.array_equal(got.argmax(1)[sure], want.argmax(1)[sure])
    assert diff.max() < 0.1 * np.abs(want).max()


@pytest.mark.skipif(not testing.AVAILABLE, reason=testing.MISSING)
def test_device_thread_overlaps_the_cold_neurons(smol):
    """In a decode step, layer by layer: the device's hot-FFN interval and the CPU half's interval
    (computing the cold neurons' activations) intersect. The host is shared, so the best of a few
    decode steps is asserted."""
    hp = smol[0].hparams
    with ggml.GgmlDevice("CPU", 1) as dev:
        ctx = _ctx(smol, True, dev)
        ctx.eval(PROMPT)
        fractions = []
        for step in range(40):
            testing.trace(ctx, 4096)
            ctx.eval([253 + step])
            ev = testing.trace_read(ctx)
            dev_iv = {il: (a, b) for k, il, a, b in ev if k == "ffn"}
            cold = {il: (a, b) for k, il, a, b in ev if k == "cold"}
            assert sorted(dev_iv) == sorted(cold) == list(range(hp.n_layer))
            assert all(k in testing.TRACE_KINDS for k, *_ in ev) and sum(k == "attn" for k, *_ in ev) == hp.n_layer
            both = [il for il in dev_iv if max(dev_iv[il][0], cold[il][0]) < min(dev_iv[il][1], cold[il][1])]
            fractions.append(len(both) / hp.n_layer)
            if fractions[-1] > 0.5:
                break
        testing.trace(ctx, 0)
        ctx.close()
    print(f"layers overlapped per decode step: {fractions}")
    assert max(fractions) > 0.5, fractions
