"""A model under a placement plan on a ggml device, here ggml's CPU backend ("ggml-cpu";
issue 14): ggml allocates exactly the plan's bytes per buffer, a budget short of a plan is
refused before anything is allocated, and the vram_budget / n_gpu_layers / device rules
through ``Llama``. Accuracy against the CPU engine: tests/hybrid/test_ggml_parity.py."""

from __future__ import annotations

import numpy as np
import pytest
from tests.fixtures.tiny_gguf import write_tiny_llama

from powerinfer_backend import Llama
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device
from powerinfer_backend.hybrid.offload import place_plan
from powerinfer_backend.loader import load_gguf

N_CTX, N_BATCH = 64, 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_llama(tmp_path_factory.mktemp("offload") / "m.gguf", n_layer=3, n_ff=128)
    g = load_gguf(path, verbose=False)
    m = NativeModel(g)
    yield path, g, m
    m.close()


@pytest.fixture(scope="module")
def cpu_dev():
    with open_device(resolve_device("ggml-cpu"), 1) as d:
        yield d


def _ctx(m):
    return NativeContext(m, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2)


def _plan(g, sizer, frac, layers=False, seed=0):
    sizes = P.ModelSizes.from_gguf(g)
    budget = int(P.full_device_bytes(sizes, N_CTX, N_BATCH, sizer) * frac)
    if layers:
        return P.plan_layer_split(sizes, budget, n_ctx=N_CTX, n_batch=N_BATCH, sizer=sizer)
    freq = np.random.default_rng(seed).random((g.hparams.n_layer, g.hparams.n_ff))
    return P.plan_placement(sizes, freq, budget, n_ctx=N_CTX, n_batch=N_BATCH, sizer=sizer)


@pytest.mark.parametrize("frac", [0.4, 0.5, 0.8, 1.0])
@pytest.mark.parametrize("layers", [False, True])
def test_ggml_allocates_the_plans_bytes_per_buffer(tiny, cpu_dev, frac, layers):
    _, g, m = tiny
    ctx = _ctx(m)
    plan = _plan(g, DeviceSizer(cpu_dev, ctx), frac, layers=layers)
    assert plan.device_bytes > 0
    place_plan(ctx, cpu_dev, plan, plan.budget_bytes)  # raises on any per-buffer difference
    assert ctx.ggml_buffers() == plan.buffer_bytes() and sum(plan.buffer_bytes().values()) == plan.device_bytes
    assert ctx.eval([1, 5, 9, 3]).shape[-1] == g.hparams.n_vocab  # and it runs
    ctx.close()


def test_one_byte_short_is_refused_before_allocating(tiny, cpu_dev):
    _, g, m = tiny
    ctx = _ctx(m)
    plan = _plan(g, DeviceSizer(cpu_dev, ctx), 0.5)
    free_before = cpu_dev.info.free_bytes
    with pytest.raises(
        MemoryError,
        match=rf"{plan.device_bytes}\b.*{plan.device_bytes - 1}\b|"
        rf"{plan.device_bytes - 1}\b.*{plan.device_bytes}\b",
    ):
        place_plan(ctx, cpu_dev, plan, plan.device_bytes - 1)
    with pytest.raises(ValueError, match="not placed on a ggml device"):  # nothing was allocated
        ctx.ggml_buffers()
    assert abs(cpu_dev.info.free_bytes - free_before) < plan.device_bytes + (64 << 20)  # host noise aside
    place_plan(ctx, cpu_dev, plan, plan.device_bytes)  # the exact budget is enough
    ctx.close()


def test_plan_must_match_the_context(tiny, cpu_dev):
    _, g, m = tiny
    ctx = _ctx(m)
    sizes = P.ModelSizes.from_gguf(g)
    plan = P.plan_placement(sizes, None, 1 << 30, n_ctx=2 * N_CTX, n_batch=N_BATCH)
    with pytest.raises(
        ValueError, match=f"made for n_ctx {2 * N_CTX}, n_batch {N_BATCH}; the context has n_ctx {N_CTX}"
    ):
        place_plan(ctx, cpu_dev, plan, 1 << 30)
    ctx.close()


def test_llama_on_ggml_cpu_reports_device_memory(tiny, xdg_cache):
    path, g, _ = tiny
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, verbose=False)
    with Llama(str(path), device="ggml-cpu", vram_budget="1GiB", **kw) as llm:  # everything fits
        full = llm._backend.offload.plan.device_bytes
        out = llm.create_completion([1, 5, 9], max_tokens=6, temperature=0.0)["choices"][0]["text"]
        d = llm.stats()["device"]
        assert (d["kind"], d["name"], d["type"]) == ("ggml-cpu", "CPU", "cpu")
        assert d["reserved"] == d["used"] == d["high_water"] == full == sum(d["buffers"].values())
        assert d["buffers"] == llm._backend.offload.plan.buffer_bytes() and d["buffers"]["kv"] > 0
        assert 0 < d["free_bytes"] <= d["total_bytes"]
    budget = full // 2
    with Llama(str(path), device="ggml-cpu", vram_budget=f"{budget}B", **kw) as llm:  # half fits
        d = llm.stats()["device"]
        assert d["kind"] == "ggml-cpu" and d["name"] == "CPU" and 0 < d["used"] == d["reserved"] <= budget
        assert llm.stats()["mode"] == "exact"
        assert isinstance(llm.create_completion([1, 5, 9], max_tokens=6, temperature=0.0)["choices"][0]["text"], str)
    assert isinstance(out, str)


def test_llama_budget_rules(tiny, xdg_cache):
    path, g, _ = tiny
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1, verbose=False)
    for bad in ("-1", -2, "lots", float("nan")):
        with pytest.raises(ValueError, match="vram_budget"):
            Llama(str(path), vram_budget=bad, **kw)
    with pytest.raises(ValueError, match=r"= 109951162777600 bytes exceeds the device's free memory \d+ bytes"):
        Llama(str(path), vram_budget="100TiB", device="ggml-cpu", **kw)
    with pytest.raises(ValueError, match="device='tpu': ggml reports no device named 'tpu'; devices found: CPU"):
        Llama(str(path), device="tpu", **kw)
    with pytest.warns(UserWarning, match="vram_budget='1GiB' ignored: device='cpu'") as rec:
        llm = Llama(str(path), vram_budget="1GiB", device="cpu", **kw)
    assert len(rec) == 1 and rec[0].filename == __file__ and "device" not in llm.stats()
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=2 ignored"):
        llm = Llama(str(path), vram_budget="1MiB", n_gpu_layers=2, device="ggml-cpu", **kw)
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=1 converted to vram_budget"):
        llm = Llama(str(path), n_gpu_layers=1, device="ggml-cpu", **kw)  # one whole layer's bytes, said once
    with open_device(resolve_device("ggml-cpu")) as dev:
        z = DeviceSizer(dev, llm._backend.ctx)
        sizes = P.ModelSizes.from_gguf(g)
        want = P.compute_bytes(sizes, N_CTX, N_BATCH, z) + P.layer_bytes(sizes, 0, N_CTX, z)
    assert llm._backend.offload.decision.bytes == want and llm.stats()["device"]["used"] <= want
    llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=0: CPU only"):
        llm = Llama(str(path), n_gpu_layers=0, device="ggml-cpu", **kw)
    assert llm._backend.offload.plan is None
    llm.close()
    for bad in (0, -1, 1000, None, 2.5, "2", True):
        with pytest.raises(ValueError, match="device_threads must be an integer"):
            Llama(str(path), vram_budget="1MiB", device="ggml-cpu", device_threads=bad, **kw)


def test_auto_without_a_gpu_is_cpu_only_with_one_message(tiny, xdg_cache, capsys):
    from powerinfer_backend.engine import ggml

    if any(d.type == "gpu" for d in ggml.list_devices()):
        pytest.skip("this machine has a discrete GPU")
    path = str(tiny[0])
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
    with pytest.warns(UserWarning) as rec:  # a budget asked for: one notice naming why
        llm = Llama(path, vram_budget="1MiB", verbose=False, **kw)
    assert [str(w.message) for w in rec] == [
        "vram_budget='1MiB' ignored: device='auto': ggml found no discrete GPU (devices: CPU (cpu)); running on the CPU"
    ]
    assert "device" not in llm.stats() and capsys.readouterr().err == ""
    llm.close()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = Llama(path, verbose=True, **kw)  # no budget: the verbose line says it, once
    err = capsys.readouterr().err
    assert err.count("ggml found no discrete GPU") == 1 and "device: none, CPU only" in err
    llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Llama(path, verbose=False, **kw).close()  # and quiet without verbose
    assert capsys.readouterr().err == ""


def test_compute_alone_is_no_plan(tiny, xdg_cache):
    """A budget that holds the compute buffer but no block runs on the CPU (no device)."""
    path, g, m = tiny
    ctx = _ctx(m)
    with open_device(resolve_device("ggml-cpu")) as dev:
        compute = P.compute_bytes(P.ModelSizes.from_gguf(g), N_CTX, N_BATCH, DeviceSizer(dev, ctx))
    ctx.close()
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, verbose=False)
    for extra in (0, 31, 32):
        with Llama(
            str(path), vram_budget=f"{compute + extra}B", device="ggml-cpu", disable_gpu_index=True, **kw
        ) as llm:
            assert llm._backend.offload.plan is None and "device" not in llm.stats()


def test_bad_device_options_fail_before_the_model_loads(tmp_path):
    """device_threads / placement are checked before the GGUF is read (a file that is no
    GGUF at all shows which check ran first)."""
    path = tmp_path / "not-a-model.gguf"
    path.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match="device_threads must be an integer in \\[1, 512\\], got 0"):
        Llama(str(path), device="ggml-cpu", device_threads=0, verbose=False)
    with pytest.raises(ValueError, match="placement must be one of auto, neurons, layers, got 'rows'"):
        Llama(str(path), placement="rows", verbose=False)


def test_a_budget_that_places_nothing_says_why(tiny, xdg_cache):
    """Without --verbose too: the warning names the compute buffer the budget missed."""
    with pytest.warns(
        UserWarning,
        match=r"vram_budget 1024 bytes places nothing: the device's compute buffer alone "
        r"needs [\d.]+ (MiB|bytes) at n_ctx 64, n_batch 16 .*; running on the CPU",
    ):
        llm = Llama(
            str(tiny[0]), n_ctx=64, n_batch=16, n_threads=1, verbose=False, vram_budget="1KiB", device="ggml-cpu"
        )
    assert "device" not in llm.stats()
    llm.close()


def test_a_gpu_runtime_reserve_comes_out_of_the_budget(tiny, xdg_cache, monkeypatch):
    """A GPU backend allocates its own buffers beside a plan's (GPU_RUNTIME_RESERVE, measured on
    an H200): they come out of vram_budget, so the plan is made under the rest. ggml's CPU backend
    sets nothing aside; the GPU rule is applied to it here through device_reserve, which
    budget_after_reserve asks (no GPU on this host). n_gpu_layers (layers, as llama.cpp) keeps
    its bytes."""
    assert P.device_reserve("CPU", "cpu")[0] == 0
    assert P.device_reserve("CUDA0", "gpu")[0] == P.GPU_RUNTIME_RESERVE == 128 * 2**20
    path = str(tiny[0])
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1, verbose=False, device="ggml-cpu")
    with Llama(path, vram_budget="1GiB", **kw) as llm:
        full = llm._backend.offload.plan.device_bytes
        assert llm.stats()["device"]["runtime_reserve"] == 0
    reserve = full // 2
    from powerinfer_backend.hybrid.placement import bandwidth

    monkeypatch.setattr(bandwidth, "device_reserve", lambda name, type_: (reserve, "a GPU's"))
    with Llama(path, vram_budget=f"{full}B", **kw) as llm:  # the whole model fitted this budget
        d = llm.stats()["device"]
        assert d["runtime_reserve"] == reserve and d["budget_bytes"] == full - reserve
        assert 0 < d["reserved"] == d["used"] <= full - reserve
        assert f"({reserve} more set aside for the runtime)" in llm._backend.offload.summary()
    for budget in (reserve + 1024, reserve):  # a little past the reserve, and all of it
        with pytest.warns(UserWarning, match=rf"of vram_budget {budget} bytes, {reserve} are set aside"):
            llm = Llama(path, vram_budget=f"{budget}B", **kw)
        assert "device" not in llm.stats()
        llm.close()
    with pytest.warns(UserWarning, match="n_gpu_layers=1 converted"):
        llm = Llama(path, n_gpu_layers=1, **kw)
    assert llm.stats()["device"]["runtime_reserve"] == 0
    assert llm.stats()["device"]["budget_bytes"] == llm._backend.offload.decision.bytes
    llm.close()
