"""A whole model under a placement plan on the cpu-device (issue 6): exact device bytes,
the device really doing its half (counters), results equal to the CPU-only run, and the
vram_budget / n_gpu_layers / device rules through ``Llama``."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures.tiny_gguf import write_tiny_llama

from powerinfer_backend import Llama
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import place_model
from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.loader import load_gguf

TOKS = [1, 5, 9, 3, 7, 2, 8, 4, 6]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("offload") / "m.gguf", n_layer=3, n_ff=128)
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    yield path, g, m
    m.close()


def _plan(g, frac, n_ctx=64, n_batch=4, layers=False, seed=0):
    sizes = P.ModelSizes.from_gguf(g)
    budget = int(P.full_device_bytes(sizes, n_ctx, n_batch) * frac)
    if layers:
        return P.plan_layer_split(sizes, budget, n_ctx=n_ctx, n_batch=n_batch)
    freq = np.random.default_rng(seed).random((g.hparams.n_layer, g.hparams.n_ff))
    return P.plan_placement(sizes, freq, budget, n_ctx=n_ctx, n_batch=n_batch)


def _exact_sparse(ctx, g):
    """The CPU-only run with the split's FFN arithmetic: down_t, threshold 0, every layer."""
    for i in range(g.hparams.n_layer):
        ctx.set_ffn_sparsity(i, transposed_down(g, i, dtype=down_t_dtype(g)), 0.0)


def _logits(m, plan=None, *, n_threads=2, device_threads=1, n_batch=4):
    ctx = NativeContext(m, n_ctx=64, n_batch=n_batch, n_threads=n_threads)
    dev = place_model(ctx, plan, n_threads=device_threads) if plan is not None else _exact_sparse(ctx, m.gguf)
    out = [ctx.eval(TOKS[:4], logits_all=True).copy()] + [ctx.eval([t]).copy() for t in TOKS[4:]]
    stats = dev.stats() if dev is not None else None
    ctx.close()
    return np.concatenate([o.reshape(-1, o.shape[-1]) for o in out]), stats


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("layers", [False, True])
def test_device_bytes_exact_and_work_counted(tiny, frac, layers):
    _, g, m = tiny
    plan = _plan(g, frac, layers=layers)
    ctx = NativeContext(m, n_ctx=64, n_batch=4, n_threads=2)
    total, scratch = ctx.plan_bytes(plan)
    assert (total, scratch) == (plan.device_bytes, plan.scratch_bytes)  # C and Python count the same bytes
    if plan.device_bytes == 0:
        ctx.close()
        return
    dev = place_model(ctx, plan)
    s = dev.stats()
    assert s["reserved"] == s["used"] == s["high_water"] == plan.device_bytes <= plan.budget_bytes
    with pytest.raises(MemoryError, match="exceed the device reservation"):
        dev.alloc(1)  # the pool refuses more than the plan
    assert dev.stats()["n_refused"] == 1
    ctx.eval(TOKS[:4])
    for t in TOKS[4:6]:
        ctx.eval([t])
    s = dev.stats()
    n_tok, n_evals = 6, 3
    assert s["rows"] == n_tok * sum(L.n_hot for L in plan.layers)  # every hot row, every token
    assert s["n_attn"] == n_evals * sum(L.attn_on_device for L in plan.layers)
    assert s["n_output"] == (n_evals if plan.output_on_device else 0)
    assert s["high_water"] == plan.device_bytes
    ctx.close()


def test_full_device_is_bitwise_the_cpu_run(tiny):
    """Everything on the device: attention, output and all neurons computed there with the
    same kernels and order as the CPU-only run of the same arithmetic - the same bits."""
    _, g, m = tiny
    plan = _plan(g, 1.0)
    assert plan.output_on_device and all(L.attn_on_device and L.n_hot == 128 for L in plan.layers)
    ref, _ = _logits(m)
    got, _ = _logits(m, plan)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.8])
def test_split_equals_cpu_bitwise_with_uniform_frequencies(tiny, frac):
    """Uniform frequencies: each layer's hot neurons are its lowest ids, and the CPU
    continues the device's sum with the rest, so the split sums in id order exactly as
    the CPU-only run does."""
    _, g, m = tiny
    sizes = P.ModelSizes.from_gguf(g)
    plan = P.plan_placement(sizes, None, int(P.full_device_bytes(sizes, 64, 4) * frac), n_ctx=64, n_batch=4)
    assert any(0 < L.n_hot < 128 for L in plan.layers)
    ref, _ = _logits(m)
    got, _ = _logits(m, plan)
    assert np.array_equal(got, ref)


@pytest.mark.parametrize("frac", [0.3, 0.5, 0.8])
def test_split_by_frequency_matches_cpu_and_is_deterministic(tiny, frac):
    _, g, m = tiny
    plan = _plan(g, frac)
    ref, _ = _logits(m)
    a, _ = _logits(m, plan, n_threads=1, device_threads=1)
    b, _ = _logits(m, plan, n_threads=2, device_threads=2)
    assert np.array_equal(a, b)  # any thread counts on either side: the same bits
    np.testing.assert_allclose(a, ref, rtol=1e-5, atol=1e-5)  # hot ids first, then cold: another order
    assert np.array_equal(a.argmax(-1), ref.argmax(-1))


def test_plan_must_match_the_context(tiny):
    _, g, m = tiny
    plan = _plan(g, 0.5, n_ctx=128)
    ctx = NativeContext(m, n_ctx=64, n_batch=4, n_threads=1)
    with pytest.raises(ValueError, match="n_ctx 128"):
        place_model(ctx, plan)
    plan = _plan(g, 0.5)
    ctx.set_ffn_threshold_on("gate")
    with pytest.raises(NotImplementedError, match="product"):
        place_model(ctx, plan)
    ctx.close()


def _greedy(ctx, prompt, n):
    logits = ctx.eval(prompt)
    out = []
    for _ in range(n):
        t = int(np.argmax(logits[-1]))
        out.append(t)
        logits = ctx.eval([t])
    return out


def test_smollm2_64_greedy_tokens_at_every_budget(model_path):
    """Acceptance: 64 greedy tokens identical to the CPU-only run at budgets 0, 10%, 50%,
    100% of the model's bytes; the device holds exactly the plan's bytes and processed
    the plan's hot rows for every token."""
    g = load_gguf(model_path, verbose=False)
    m = NativeModel(g)
    sizes = P.ModelSizes.from_gguf(g)
    n_ctx, n_batch = 128, 16
    prompt = [1, 4093, 46, 2784, 28, 1078, 11, 1023, 6370, 34, 50, 23451, 30]
    freq = None  # uniform: hot = lowest ids first among equals
    full = P.full_device_bytes(sizes, n_ctx, n_batch)
    ctx = NativeContext(m, n_ctx=n_ctx, n_batch=n_batch, n_threads=2)
    _exact_sparse(ctx, g)
    ref = _greedy(ctx, prompt, 64)
    ctx.close()
    for frac in (0.0, 0.1, 0.5, 1.0):
        plan = P.plan_placement(sizes, freq, int(full * frac), n_ctx=n_ctx, n_batch=n_batch)
        ctx = NativeContext(m, n_ctx=n_ctx, n_batch=n_batch, n_threads=2)
        dev = place_model(ctx, plan) if plan.device_bytes else None
        if dev is None:
            _exact_sparse(ctx, g)
        assert _greedy(ctx, prompt, 64) == ref, frac
        if dev is not None:
            s = dev.stats()
            assert s["high_water"] == s["used"] == plan.device_bytes <= plan.budget_bytes
            assert s["rows"] == (len(prompt) + 64) * sum(L.n_hot for L in plan.layers)
            assert s["n_attn"] == 65 * sum(L.attn_on_device for L in plan.layers)
        if frac == 0.5:
            assert 0 < sum(L.n_hot for L in plan.layers) < sizes.n_layer * sizes.n_ff
        ctx.close()
    m.close()


def test_llama_vram_budget_on_cpu_device(tiny, xdg_cache):
    path, g, _ = tiny
    budget = P.full_device_bytes(P.ModelSizes.from_gguf(g), 64, 8) // 2
    llm = Llama(str(path), n_ctx=64, n_batch=8, n_threads=2, verbose=False, vram_budget=f"{budget}B",
                device="cpu-device")
    out = llm.create_completion([1, 5, 9], max_tokens=8, temperature=0.0)
    d = llm.stats()["device"]
    assert d["kind"] == "cpu-device" and 0 < d["used"] == d["plan_bytes"] <= budget
    assert d["rows"] > 0 and d["n_attn"] > 0
    ref = Llama(str(path), n_ctx=64, n_batch=8, n_threads=2, verbose=False, device="cpu-device",
                vram_budget=f"{budget}B", placement="layers")
    assert ref.create_completion([1, 5, 9], max_tokens=8, temperature=0.0)["choices"][0]["text"] == \
        out["choices"][0]["text"]
    llm.close()
    ref.close()


def test_llama_budget_rules(tiny, xdg_cache):
    path = str(tiny[0])
    kw = dict(n_ctx=64, n_batch=8, n_threads=1, verbose=False)
    for bad in ("-1", -2, "lots", float("nan")):
        with pytest.raises(ValueError, match="vram_budget"):
            Llama(path, vram_budget=bad, **kw)
    with pytest.raises(ValueError, match=r"exceeds the device's free memory \d+ bytes"):
        Llama(path, vram_budget="100TiB", device="cpu-device", **kw)
    with pytest.raises(NotImplementedError, match="CUDA"):
        Llama(path, vram_budget=1, device="cuda", **kw)
    with pytest.raises(ValueError, match="device must be one of"):
        Llama(path, device="tpu", **kw)
    with pytest.warns(UserWarning, match="vram_budget='1GiB' ignored: no GPU device") as rec:
        llm = Llama(path, vram_budget="1GiB", **kw)  # no GPU: CPU only, said once, at the caller
    assert len(rec) == 1 and rec[0].filename == __file__
    assert "device" not in llm.stats()
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=2 ignored"):
        llm = Llama(path, vram_budget="1MiB", n_gpu_layers=2, device="cpu-device", **kw)
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=1 converted to vram_budget"):
        llm = Llama(path, n_gpu_layers=1, device="cpu-device", **kw)  # one whole layer's bytes, said once
    sizes = P.ModelSizes.from_gguf(tiny[1])
    want = P.scratch_bytes(sizes, 64, 8) + P.layer_bytes(sizes, 0, 64)
    assert llm._backend.offload.decision.bytes == want and llm.stats()["device"]["used"] <= want
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=0: CPU only"):
        llm = Llama(path, n_gpu_layers=0, device="cpu-device", **kw)
    assert llm._backend.offload.plan is None
    llm.close()


def test_scratch_alone_is_no_plan_and_exact_mode_is_the_cpu_twin(tiny, xdg_cache):
    """A budget that holds the scratch but nothing else runs on the CPU (no device); a
    placed context reports mode "exact" and equals Llama(sparse="exact") on the CPU."""
    path, g, _ = tiny
    sizes = P.ModelSizes.from_gguf(g)
    kw = dict(n_ctx=64, n_batch=8, n_threads=2, verbose=False)
    scratch = P.scratch_bytes(sizes, 64, 8)
    for extra in (0, 255, 256):
        plan = P.plan_placement(sizes, None, scratch + extra, n_ctx=64, n_batch=8, disable_gpu_index=True)
        assert plan.device_bytes == 0 and plan.scratch_bytes == 0
        with Llama(str(path), vram_budget=f"{scratch + extra}B", device="cpu-device", **kw) as llm:
            assert llm._backend.offload.plan is None and "device" not in llm.stats()
    with Llama(str(path), vram_budget=f"{scratch * 3}B", device="cpu-device", **kw) as placed, \
            Llama(str(path), sparse="exact", **kw) as cpu:
        assert placed.stats()["mode"] == cpu.stats()["mode"] == "exact"
        a = placed.create_completion([1, 5, 9], max_tokens=12, temperature=0.0)["choices"][0]["text"]
        assert a == cpu.create_completion([1, 5, 9], max_tokens=12, temperature=0.0)["choices"][0]["text"]
    for bad in (0, -1, 1000, None, 2.5, "2", True):
        with pytest.raises(ValueError, match="device_threads must be an integer"):
            Llama(str(path), vram_budget="1MiB", device="cpu-device", device_threads=bad, **kw)


def test_placement_refusals_and_f32_models(tmp_path, xdg_cache):
    """Falcon/OPT under a budget: a clear NotImplementedError (no gate to split, no device
    path for their dense blocks), not a byte-count mismatch; an F32 llama (down_t kept
    F32) places with exact bytes."""
    from tests.fixtures.tiny_archs import write_tiny_falcon, write_tiny_opt
    from gguf import GGMLQuantizationType as GT

    kw = dict(n_ctx=32, n_batch=8, n_threads=1, verbose=False, device="cpu-device")
    for path in (write_tiny_falcon(tmp_path / "f.gguf", ffn_act="relu", matrix_type=GT.Q8_0),
                 write_tiny_opt(tmp_path / "o.gguf")):
        for extra in (dict(vram_budget=1), dict(n_gpu_layers=1), dict(vram_budget=1, placement="layers")):
            with pytest.raises(NotImplementedError, match="gated FFN|not supported yet"):
                Llama(str(path), **kw, **extra)
    f32 = write_tiny_llama(tmp_path / "f32.gguf", types={"matrix": GT.F32})
    with Llama(str(f32), vram_budget=1, **kw) as llm:
        d = llm.stats()["device"]
        assert d["used"] == d["plan_bytes"] > 0
        llm.create_completion([1, 2, 3], max_tokens=4, temperature=0.0)
