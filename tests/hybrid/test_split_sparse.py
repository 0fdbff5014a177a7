"""The CPU half of a split at full strength (issue 24 item 3) on ``device="ggml-cpu"``: a
predictor skips the gate rows of the cold neurons it predicts inactive, and gate thresholds
(the CATS form) skip a cold neuron's up and down rows; the device computes every hot row, or
with a predictor and ``device_skips`` (the default) only the hot neurons it selects.
Teacher-forced against the CPU engine with the same predictor / thresholds, with the
tolerance of tests/hybrid/test_ggml_parity.py (llama.cpp's own largest difference on the
same tokens, x 1.25; top-1 equal where the CPU engine's margin is at least that).

The model is a tiny SwiGLU llama (Q4_1, n_embd 256: llama.cpp's own runs differ measurably)
carrying PowerInfer-style predictors (``blk.N.fc1/fc2.weight``, random, rank 16, score
threshold 0, about half the neurons predicted, the same ones for every token: a decision near
the threshold would flip with the device's rounding and move a random model far more than
llama.cpp's tolerance; gate thresholds give every token its own cold set) in a second copy of the file, since llama.cpp
refuses the extra tensors; both copies have the same weights (same seed)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from tests.fixtures.tiny_gguf import write_tiny_llama
from tests.hybrid.test_ggml_parity import MARGIN, N_BATCH, N_CTX, PROMPTS, SLACK, THREADS, _compare, _greedy, _llama_cpp
from tests.fixtures.teacher_forced import schedule, teacher_forced

from powerinfer_backend.engine.down_cache import down_t_dtype, transposed_down
from powerinfer_backend.engine.native import NativeContext, NativeModel
from powerinfer_backend.hybrid import placement as P
from powerinfer_backend.hybrid.devices import DeviceSizer, open_device, resolve_device
from powerinfer_backend.hybrid.offload import offload, split_arithmetic
from powerinfer_backend.loader import load_gguf
from powerinfer_backend.plugins.hybrid import HybridBackend
from powerinfer_backend.sparsity import modes as sparsity

N_LAYER, N_EMBD, N_FF, RANK = 4, 256, 512, 16
GATE_THRESHOLD = 0.05  # |silu(gate x)| below this skips the neuron: about a third of them
N_GEN = 32
SHAPE = dict(n_layer=N_LAYER, n_embd=N_EMBD, n_head=4, n_head_kv=2, n_ff=N_FF, n_vocab=256, seed=5)


def _predictors() -> dict:
    rng = np.random.default_rng(11)
    out = {}
    for layer in range(N_LAYER):
        out[f"blk.{layer}.fc1.weight"] = (rng.standard_normal((RANK, N_EMBD)) / np.sqrt(N_EMBD)).astype(np.float32)
        # each neuron's row of one sign: >= 0 scores it always predicted, <= 0 never (unless all
        # 16 relu(fc1 x) are 0), so the device's rounding of the FFN input flips no decision
        sign = np.where(rng.random(N_FF) < 0.5, 1.0, -1.0)[:, None]
        out[f"blk.{layer}.fc2.weight"] = (sign * np.abs(rng.standard_normal((N_FF, RANK)))).astype(np.float32)
    return out


def write_model(path, predictors: bool) -> str:
    """The tiny SwiGLU llama (Q4_1), with its predictors or without (the same weights)."""
    extra = _predictors() if predictors else None
    return write_tiny_llama(path, types={"matrix": GT.Q4_1}, extra_tensors=extra, **SHAPE)


def gate_thresholds(ctx, g) -> None:
    """Every layer of ``ctx`` (the tiny model ``g``) in the gate form at GATE_THRESHOLD."""
    ctx.set_ffn_threshold_on("gate")
    for i in range(g.hparams.n_layer):
        ctx.set_ffn_sparsity(i, transposed_down(g, i, dtype=down_t_dtype(g)), GATE_THRESHOLD)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path with predictors, llama.cpp's bound, tokens, prompt lengths, model, the full
    device bytes)."""
    d = tmp_path_factory.mktemp("split_sparse")
    with pytest.MonkeyPatch.context() as mp:  # plans and down_t caches in a private folder
        mp.setenv("XDG_CACHE_HOME", str(d / "xdg"))
        plain, path = write_model(d / "plain.gguf", predictors=False), write_model(d / "pred.gguf", predictors=True)
        prompts = _llama_cpp(plain, PROMPTS)
        model = NativeModel(load_gguf(path, verbose=False))
        ctx = _context(model, "predictor")
        try:
            seqs = [_greedy(ctx, p, N_GEN) for p in prompts]
            with open_device(resolve_device("ggml-cpu")) as dev:
                full = P.full_device_bytes(P.ModelSizes.from_gguf(model.gguf), N_CTX, N_BATCH, DeviceSizer(dev, ctx))
        finally:
            ctx.close()
        bound = SLACK * _llama_cpp(plain, seqs=seqs)
        assert bound > 0
        yield path, bound, seqs, [len(p) for p in prompts], model, full
        model.close()


def _context(model, form: str) -> NativeContext:
    """A context of ``model`` in FFN form "predictor" (the file's) or "gate" (CATS thresholds)."""
    ctx = NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS)
    g = model.gguf
    if form == "predictor":
        assert sparsity.configure(ctx, g, g.path, "predictor").mode == "predictor"
    elif form == "exact":
        split_arithmetic(ctx)
    else:
        gate_thresholds(ctx, g)
    return ctx


def _reference(model, form: str, hot: dict) -> NativeContext:
    """The CPU engine computing what the split computes: with "predictor" the file's
    predictor (the device skips what it leaves out); with "every-hot" the device runs every
    hot row, so the hot neurons are always predicted (their fc2 rows made >= 0: score >= 0 =
    the threshold)."""
    ctx = _context(model, "predictor" if form == "every-hot" else form)
    if form == "every-hot":
        pred = _predictors()
        for layer, ids in hot.items():
            fc2 = pred[f"blk.{layer}.fc2.weight"].copy()
            fc2[ids] = np.abs(fc2[ids])
            ctx.set_ffn_predictor(layer, pred[f"blk.{layer}.fc1.weight"], fc2, 0.0)
    return ctx


@pytest.mark.parametrize("form", ["predictor", "every-hot", "gate"])
def test_split_with_predictor_or_gate_thresholds_tracks_the_cpu_engine(tiny, form):
    path, bound, seqs, n_prompt, model, full = tiny
    pred = form != "gate"
    ctx = _context(model, "predictor" if pred else form)
    off = None
    try:
        off = offload(
            ctx,
            path,
            vram_budget=f"{full // 2}B",
            device="ggml-cpu",
            placement="neurons",
            device_threads=THREADS,
            device_skips=False if form == "every-hot" else None,
        )
        assert off.plan is not None and off.device_skips == (form == "predictor")
        hot = {L.layer: np.asarray(L.hot_ids) for L in off.plan.layers if L.n_hot > 0}
        assert any(0 < len(ids) < N_FF for ids in hot.values()), hot  # split layers: a CPU half to skip in
        ctx.ffn_stats(reset=True)
        if pred:
            ctx.predictor_stats(reset=True)
        placed = [teacher_forced(ctx, s, n) for s, n in zip(seqs, n_prompt)]
        used_l, total_l = ctx.ffn_stats(reset=False, per_layer=True)
        used, total = int(used_l.sum()), int(total_l.sum())
        if pred:  # per layer: the predictor's choice, every neuron where all are hot
            ps = ctx.predictor_stats(reset=False)
            assert ps["pred_ns"].sum() > 0
            for layer, n_hot in enumerate(L.n_hot for L in off.plan.layers):
                pred = ps["predicted"][layer]
                assert pred == total_l[layer] if n_hot == N_FF else 0 < pred < total_l[layer], (layer, n_hot)
    finally:
        ctx.close()
        if off is not None:
            off.close()
    refs = {}
    for name in (form, "exact"):  # the split's function, and with the gate form its dense bound
        cpu = _reference(model, name, hot) if name == form else _context(model, "exact")
        try:
            cpu.ffn_stats(reset=True)
            refs[name] = [teacher_forced(cpu, s, n) for s, n in zip(seqs, n_prompt)]
            if name == form:
                used_cpu, total_cpu = cpu.ffn_stats(reset=False)
        finally:
            cpu.close()
    assert total == total_cpu and used < total  # the cold half skipped neurons
    if form == "predictor":  # the predictor's neurons on both sides (no score near its threshold)
        assert used == used_cpu, (used, used_cpu, total)
    elif pred:
        # the CPU engine's neurons with the hot ones predicted, up to scores at the threshold
        # moved by the device's rounding of the FFN input
        assert abs(used - used_cpu) <= 0.002 * total, (used, used_cpu, total)
    need = max(MARGIN, bound)
    results = {name: _compare(placed, ref, need) for name, ref in refs.items()}
    print(form, {k: (v[0], len(v[1]), v[2]) for k, v in results.items()}, used, used_cpu, total)  # docs/placement.md
    worst, flips, checked = results[form]
    assert checked >= sum(len(s) - 1 for s in seqs) // 2
    assert flips == [], f"top-1 differs from the CPU engine at {flips} (margins >= {need:.3g} checked)"
    assert worst <= bound, f"max |delta logprob| {worst:.4g} > {bound:.4g}"


def test_predictor_file_with_a_device_runs_and_auto_plans_for_the_predictor(tiny):
    """Llama's path: sparse "auto" takes the file's predictors, a placement is not refused,
    and placement "auto" (a bandwidth given: ggml-cpu shares the host's) plans for the CPU
    half's predictor mode, counting the predictor's bytes read per token."""
    path, budget = tiny[0], f"{tiny[-1] // 2}B"
    b = HybridBackend(
        path,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        n_threads=1,
        vram_budget=budget,
        device="ggml-cpu",
        device_bandwidth=100,
        verbose=False,
    )
    try:
        assert b.sparse.mode == "predictor" and b.offload.plan is not None
        assert b.ctx.ffn_predictor_bytes() == 4 * (RANK * N_EMBD + N_FF * RANK)  # F32 fc1 + fc2
        choice = b.offload.plan.choice
        assert choice["mode"] == "predictor" and b.offload.plan.inputs["predictor_bytes"] == 4 * RANK * (N_EMBD + N_FF)
        b.eval([1, 2, 3])
        assert b.stats()["mode"] == "predictor"
    finally:
        b.close()


def test_predictor_layers_wholly_on_the_device_count_every_neuron_predicted(tiny):
    """The layer split at the full budget: no cold neuron, no scores; the predictor's count is
    every neuron (all computed), as for a layer without a predictor."""
    path, _, seqs, _, model, full = tiny
    ctx = _context(model, "predictor")
    off = offload(ctx, path, vram_budget=f"{full}B", device="ggml-cpu", placement="layers", device_threads=THREADS)
    try:
        assert all(L.n_hot == N_FF for L in off.plan.layers)
        ctx.eval(seqs[0][:8])
        ps = ctx.predictor_stats(reset=False)
        used, total = ctx.ffn_stats(reset=False, per_layer=True)
        assert list(ps["predicted"]) == list(total) == list(used) == [8 * N_FF] * N_LAYER
        assert ps["pred_ns"].sum() == 0
    finally:
        ctx.close()
        off.close()


def _logits(ctx, seq, n_prompt) -> np.ndarray:
    ctx.truncate(0)
    return np.concatenate([ctx.eval(seq[a:b], logits_all=True) for a, b in schedule(n_prompt, len(seq))])


@pytest.mark.parametrize("skips", [True, False])
def test_device_skipping_where_the_host_sums_the_down_is_the_cpu_engine_bit_for_bit(tiny, skips):
    """Split layers whose whole down the host sums (few hot neurons: the device gives their
    gate and up products) under the file's predictor: with ``device_skips`` the device
    computes exactly the hot neurons the predictor selects, so the logits are the CPU engine's
    with that predictor bit for bit (prompts as batches, then tokens alone); computing every
    hot neuron is not."""
    path, _, seqs, n_prompt, model, _ = tiny
    g, pred = model.gguf, _predictors()
    rng = np.random.default_rng(7)
    hot = [np.arange(40), np.sort(rng.choice(N_FF, 48, replace=False)), np.arange(0), np.arange(0)]
    layers = [P.LayerPlan(i, False, 0, 0, np.asarray(h, np.int32), 0, 0.0) for i, h in enumerate(hot)]
    sizes = P.ModelSizes.from_gguf(g)
    assert all(sizes.host_down(i, len(h)) for i, h in enumerate(hot) if len(h))

    def context() -> NativeContext:
        ctx = NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=THREADS)
        for i in range(N_LAYER):
            ctx.set_ffn_predictor(i, pred[f"blk.{i}.fc1.weight"], pred[f"blk.{i}.fc2.weight"], 0.0)
        split_arithmetic(ctx, layers)
        return ctx

    logits, used = {}, {}
    with open_device(resolve_device("ggml-cpu"), THREADS) as dev:
        for name in ("cpu", "device"):
            ctx = context()
            try:
                if name == "device":
                    ctx.set_ggml_device(dev, layers, False, 1 << 40, device_skips=skips)
                ctx.ffn_stats(reset=True)
                logits[name] = [_logits(ctx, s, n) for s, n in zip(seqs[:2], n_prompt)]
                used[name] = ctx.ffn_stats(reset=False)[0]
            finally:
                ctx.close()
    same = all(np.array_equal(a, b) for a, b in zip(logits["cpu"], logits["device"]))
    assert same == skips and (used["cpu"] == used["device"]) == skips, (used, same)


def test_plan_of_a_predictor_file_is_the_plan_llama_places(tmp_path, monkeypatch, capsys):
    """``powerinfer-backend plan`` plans a PowerInfer file carrying predictors as ``Llama``
    places it (the same inputs: every layer sparse, a compute buffer holding the skipping
    graphs; the same hot neurons); ``--predict`` counts mode predictor; stats say whether the
    device skips (only where a layer is split), and bad ``device_skips`` values are refused."""
    import json

    from powerinfer_backend import Llama
    from powerinfer_backend.cli import main as cli_main
    from powerinfer_backend.hybrid.placement.cache import read_metadata

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = write_model(tmp_path / "pred.gguf", predictors=True)
    common = ["--vram-budget", "700000B", "--ctx", "128", "--batch", "16", "--device", "ggml-cpu", "--no-plot"]
    assert cli_main(["plan", "--model", path, *common, "--placement", "neurons", "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)
    kw = dict(n_ctx=128, n_batch=16, n_threads=1, device="ggml-cpu", verbose=False)
    llm = Llama(path, vram_budget="700000B", placement="neurons", **kw)
    try:
        plan = llm.engine.offload.plan
        assert plan.inputs == read_metadata(stored["plan_file"])["inputs"]
        assert [L.n_hot for L in plan.layers] == [L["n_hot"] for L in stored["layers"]]
        dev = llm.stats()["device"]
        assert dev["device_skips"] == any(0 < L.n_hot < N_FF for L in plan.layers)
    finally:
        llm.close()
    llm = Llama(path, vram_budget="2GiB", placement="layers", **kw)  # whole layers: nothing split
    try:
        assert llm.stats()["device"]["device_skips"] is False
    finally:
        llm.close()
    args = ["plan", "--model", path, *common, "--predict", "--device-bandwidth", "50", "--host-bandwidth", "10"]
    assert cli_main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pred = out["prediction"]
    assert pred["ours"]["mode"] == "predictor" and pred["choice"]["mode"] == "predictor"
    assert read_metadata(out["plan_file"])["inputs"]["predictor_bytes"] == 4 * RANK * (N_EMBD + N_FF)
    assert cli_main([*args, "--placement", "layers", "--json"]) == 0  # whole layers: nothing to skip
    assert json.loads(capsys.readouterr().out)["prediction"]["device_skips"] is False
    assert cli_main([*args, "--mode", "dense", "--device-skips"]) == 0
    assert "--device-skips ignored" in capsys.readouterr().err
    model = NativeModel(load_gguf(path, verbose=False))
    ctx = NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
    try:
        with pytest.raises(ValueError, match="device_skips must be True, False or None"):
            offload(ctx, path, vram_budget="1MiB", device="ggml-cpu", device_skips="no")
    finally:
        ctx.close()
        model.close()


def test_llama_takes_device_skips_and_refuses_bad_values(tiny):
    """``Llama(device_skips=...)``: False computes every hot neuron (stats say so), a value
    that is not None/True/False is refused before the model loads, and a NaN predictor weight
    is refused naming the tensor."""
    from powerinfer_backend import Llama

    path, full = tiny[0], tiny[-1]
    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1, device="ggml-cpu", verbose=False, placement="neurons")
    for asked in (False, True):
        llm = Llama(path, vram_budget=f"{full // 2}B", device_skips=asked, **kw)
        try:
            assert llm.stats()["device"]["device_skips"] is asked
        finally:
            llm.close()
    with pytest.raises(ValueError, match="device_skips must be True, False or None"):
        Llama(path, vram_budget="1MiB", device_skips="no", **kw)
    model = tiny[4]
    ctx = NativeContext(model, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1)
    try:
        fc1 = _predictors()["blk.0.fc1.weight"].copy()
        fc1[0, 0] = np.nan
        with pytest.raises(ValueError, match="blk.0.fc1.weight: has NaN"):
            ctx.set_ffn_predictor(0, fc1, _predictors()["blk.0.fc2.weight"], 0.0)
    finally:
        ctx.close()
