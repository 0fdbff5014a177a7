"""Parallel sequences with a ggml device placement (issue 24 item 4): ``NativeContext(n_seq_max=4)``
placed on ``device="ggml-cpu"`` (attention blocks and their KV slots, hot rows split with the CPU:
the lowest ids on some layers, scattered ids on others, none on a third; the output block) decodes
each of 4 sequences - prompts prefilled in the same pass as other sequences' decode tokens, a slot
left and reused - bit for bit as that sequence alone in a one-sequence context of n_ctx_seq with
the same placement, device and threads: the same greedy tokens and the same logits. On SmolLM2, on
a tiny Gemma 3 (F32 weights, a sliding window of 3 shorter than the prompts, q/k norms), and on
tests/hybrid/test_split_sparse.py's tiny llama with its CPU half under predictors or gate
thresholds (a sequence's cold neurons chosen from its own rows), and under predictors with the
device skipping the hot neurons they leave out (``device_skips``: a decode row alone gathers its
selected rows, a prefill zeroes the others)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.engine.test_seqs import N_BATCH, N_CTX_SEQ, PROMPTS, Stream, _run
from tests.fixtures.tiny_archs import write_tiny_gemma3

from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import open_device, resolve_device
from powerinfer_backend.hybrid.offload import split_arithmetic
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.sparsity import modes as sparsity

STEPS = 4


def _layers(n_layer: int, n_ff: int) -> list:
    rng = np.random.default_rng(24)
    out = []
    for i in range(n_layer):
        hot = [np.arange(n_ff // 6), np.sort(rng.choice(n_ff, n_ff // 4, replace=False)), np.arange(0)][i % 3]
        out.append(P.LayerPlan(i, i % 2 == 0, 0, 0, np.asarray(hot, np.int32), 0, 0.0))
    return out


@pytest.fixture(scope="module", params=["smollm2", "gemma3-tiny", "predictor-tiny", "skips-tiny", "gate-tiny"])
def placed(request, model_path, tmp_path_factory):
    """(the prompts, a function making a context of n sequences under the placement on ggml-cpu)."""
    with pytest.MonkeyPatch.context() as mp:  # down_t caches in a private folder
        folder = tmp_path_factory.mktemp("xdg")
        mp.setenv("XDG_CACHE_HOME", str(folder))
        if request.param == "smollm2":
            path, prompts = model_path, PROMPTS
        elif request.param == "gemma3-tiny":
            path = write_tiny_gemma3(folder / "gemma3.gguf")
            prompts = [np.random.default_rng(3).integers(0, 64, n).tolist() for n in (5, 12, 3, 9)]
        else:
            from tests.hybrid.test_split_sparse import gate_thresholds, write_model

            path = write_model(folder / "tiny.gguf", predictors=request.param != "gate-tiny")
            prompts = [np.random.default_rng(3).integers(0, 256, n).tolist() for n in (5, 12, 3, 9)]
        g = load_gguf(path, verbose=False)
        m = NativeModel(g)
        layers = _layers(g.hparams.n_layer, g.hparams.n_ff)
        with open_device(resolve_device("ggml-cpu"), 1) as dev:

            def make(n_seq: int) -> NativeContext:
                ctx = NativeContext(m, n_ctx=n_seq * N_CTX_SEQ, n_batch=N_BATCH, n_threads=1, n_seq_max=n_seq)
                if request.param in ("predictor-tiny", "skips-tiny"):
                    sparsity.configure(ctx, g, path, "predictor")
                elif request.param == "gate-tiny":
                    gate_thresholds(ctx, g)
                split_arithmetic(ctx, layers)
                ctx.set_ggml_device(dev, layers, True, 1 << 40, device_skips=request.param == "skips-tiny")
                return ctx

            yield prompts, make
        m.close()


def _alone(make, prompt, steps: int):
    ctx = make(1)
    logits = [ctx.eval(prompt)[0].copy()]
    tokens = []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits[-1])))
        logits.append(ctx.eval([tokens[-1]])[0].copy())
    ctx.close()
    return tokens, logits


def test_four_sequences_on_a_device_decode_as_alone(placed):
    prompts, make = placed
    ctx = make(4)
    placed_bytes = ctx.ggml_buffers()
    assert placed_bytes["kv"] > 0 and ctx.n_ctx_seq == N_CTX_SEQ
    # a and b prefill together; c's prompt joins a and b's decode; b leaves, d reuses its slot
    a, b, c, d = (
        Stream(0, prompts[0], STEPS),
        Stream(1, prompts[1], 2),
        Stream(2, prompts[2], STEPS),
        Stream(1, prompts[3], STEPS),
    )
    done = _run(ctx, {0: [a, b], 1: [c], 3: [d]})
    assert ctx.ggml_buffers() == placed_bytes  # the compute reserve (one slot's worst case) held
    ctx.close()
    assert {id(s) for s in done} == {id(a), id(b), id(c), id(d)}
    for s in (a, b, c, d):
        tokens, logits = _alone(make, s.prompt, s.steps)
        assert s.tokens == tokens
        for i, (got, want) in enumerate(zip(s.logits, logits)):
            assert np.array_equal(got, want), f"seq {s.seq} step {i}: max |diff| {np.abs(got - want).max()}"


def test_two_contexts_sharing_a_device_from_two_threads(tmp_path, monkeypatch):
    """Two contexts placed on one ggml device, evaluated from two threads at once: each gets
    its logits alone (the device's steps run one at a time under its lock, pi_gdev.step_mu;
    without it the two contexts' graphs ran at once on the shared backend: NaN or other logits)."""
    import threading

    from tests.hybrid.test_split_sparse import write_model

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    g = load_gguf(write_model(tmp_path / "tiny.gguf", predictors=False), verbose=False)
    m = NativeModel(g)
    layers = _layers(g.hparams.n_layer, g.hparams.n_ff)
    toks = [5, 9, 22, 7, 100, 3, 17, 8]
    with open_device(resolve_device("ggml-cpu"), 1) as dev:
        cs = []
        for _ in range(2):
            ctx = NativeContext(m, n_ctx=64, n_batch=16, n_threads=1)
            split_arithmetic(ctx, layers)
            ctx.set_ggml_device(dev, layers, True, 1 << 40)
            cs.append(ctx)
        ref = cs[0].eval(toks).copy()
        bad: list = []

        def work(ctx):
            for _ in range(20):
                ctx.truncate(0)
                if not np.array_equal(ctx.eval(toks), ref):
                    bad.append(1)

        ts = [threading.Thread(target=work, args=(c,)) for c in cs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for c in cs:
            c.close()
    m.close()
    assert bad == []
