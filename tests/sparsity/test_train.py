"""train-predictor end to end on a tiny model (the reduced CI version; SmolLM2 figures
are in docs/predictors.md), the numpy and torch fits, and C scores vs the torch model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from powerinfer_backend import Llama
from powerinfer_backend.cli import main as cli_main
from powerinfer_backend.sparsity.predictors import quantize_q8_0, scores
from powerinfer_backend.sparsity.sidecar import read_sidecar, sidecar_path
from powerinfer_backend.sparsity.train import (
    LAYER_DENSITIES,
    TrainError,
    allocate_densities,
    error_curve,
    threshold_for_recall,
    train_predictors,
)

from tests.fixtures.tiny_gguf import write_tiny_llama

F32 = {"matrix": T.F32, "token_embd": T.F32}
TEXT = "the quick brown fox jumps over the lazy dog. " * 60 + "to be or not to be, that is the question. " * 60


pytestmark = pytest.mark.usefixtures("xdg_cache")  # artifacts of every test in its own user cache


def tiny(tmp_path):
    return write_tiny_llama(
        tmp_path / "m.gguf", n_vocab=64, n_embd=64, n_ff=128, n_layer=2, types=F32, seed=3, n_ctx_train=512
    )


def text_file(tmp_path):
    p = tmp_path / "t.txt"
    p.write_text(TEXT)
    return str(p)


def test_threshold_for_recall():
    s = np.arange(10, dtype=np.float32)
    y = np.ones(10)
    assert threshold_for_recall(s, y, 1.0) == 0.0
    assert threshold_for_recall(s, y, 0.8) == 2.0
    assert threshold_for_recall(s, np.zeros(10), 0.9) == np.inf


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_train_predictor_cli_and_predictor_mode(tmp_path, capsys, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    model, text = tiny(tmp_path), text_file(tmp_path)
    rc = cli_main(
        [
            "train-predictor",
            "--model",
            model,
            "--text",
            text,
            "--rank",
            "16",
            "--epochs",
            "2",
            "--tokens",
            "512",
            "--heldout-tokens",
            "128",
            "--ctx",
            "64",
            "--threads",
            "1",
            "--backend",
            backend,
            "--json",
            "--max-ppl-increase",
            "0.05",
            "--no-speed-check",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == backend and len(out["layer_recall"]) == 2 and len(out["density"]) == 2
    prof = read_sidecar(sidecar_path(model), model_path=model)
    ps = prof.predictors
    assert ps is not None and ps.layers == out["layers"]
    for x in ps.layers:
        assert ps.fc1[x].shape == (16, 64) and ps.fc2[x].shape == (128, 16) and ps.fc1[x].dtype == np.float16
    assert out["select"] == "density" and out["loss"] == "mse" and len(out["layer_error"]) == 2
    assert ps.info["ppl_predictor"] <= ps.info["ppl_dense"] * 1.05 or ps.info["density_target"] == 0.95
    with Llama(model, sparse="predictor", n_ctx=64, n_threads=1, verbose=False) as llm:
        llm.eval([1, 2, 3, 4])
        st = llm.stats()
        assert st["mode"] == "predictor"
        for x in ps.layers:
            assert 0.0 < st["predicted_density"][x] <= 1.0
        assert st["predictor_ns"] > 0 and 0 < st["predictor_share_of_ffn"] < 1
    if ps.layers:  # auto picks the sidecar's predictors
        with Llama(model, n_ctx=64, n_threads=1, verbose=False) as llm:
            assert llm.stats()["mode"] == "predictor"


def test_train_predictor_fixed_recall_and_layers(tmp_path):
    model, text = tiny(tmp_path), text_file(tmp_path)
    ps = train_predictors(
        model,
        text,
        recall=0.9,
        rank=8,
        epochs=1,
        tokens=256,
        heldout_tokens=64,
        n_ctx=64,
        layers=[1],
        backend="numpy",
        n_threads=1,
        progress=False,
        log=lambda s: None,
    )
    assert ps.info["recall_target"] == 0.9
    assert set(ps.layers) <= {1}
    assert ps.info["layer_recall"][1] >= 0.85


def test_train_predictor_fixed_density_q8_0(tmp_path):
    """--density allocates a mean density over the layers; --quantize q8_0 stores Q8_0
    predictors that survive the sidecar round trip and run in predictor mode."""
    model, text = tiny(tmp_path), text_file(tmp_path)
    ps = train_predictors(
        model,
        text,
        density=0.6,
        rank=32,
        epochs=2,
        tokens=512,
        heldout_tokens=128,
        n_ctx=64,
        quantize="q8_0",
        backend="numpy",
        n_threads=1,
        progress=False,
        log=lambda s: None,
    )
    assert ps.info["density_target"] == 0.6 and ps.info["select"] == "density" and ps.info["quantize"] == "q8_0"
    assert ps.info["decode_speedup"] > 0 and ps.info["speed_threads"] == 1  # timed vs dense (sparse="auto" uses it)
    dens = ps.info["density"]
    assert 0.4 < np.mean(dens) <= 0.61  # measured on the validation slice: the grid point, up to ties
    assert all(e >= 0.0 for e in ps.info["layer_error"])
    prof = read_sidecar(sidecar_path(model), model_path=model)
    back = prof.predictors
    assert back.layers == ps.layers and back.layers
    for x in back.layers:
        assert back.fc1[x].type == int(T.Q8_0) and tuple(back.fc1[x].ne) == (64, 32)
        assert back.fc2[x].type == int(T.Q8_0) and tuple(back.fc2[x].ne) == (32, 128)
        assert np.array_equal(back.fc2[x].data, ps.fc2[x].data)
    with Llama(model, sparse="predictor", n_ctx=64, n_threads=1, verbose=False) as llm:
        llm.eval(list(range(1, 40)))
        st = llm.stats()
        assert st["mode"] == "predictor"
        got = np.mean([st["predicted_density"][x] for x in back.layers])
        want = np.mean([dens[x] for x in back.layers])
        assert abs(got - want) < 0.25
    with pytest.raises(TrainError, match="multiples of 32"):
        train_predictors(model, text, density=0.6, rank=24, quantize="q8_0", progress=False)
    with pytest.raises(TrainError, match="not both"):
        train_predictors(model, text, density=0.6, recall=0.9, progress=False)


def test_train_predictor_cli_options(tmp_path, capsys):
    """The new options reach train_predictors: uniform allocation at a fixed density, BCE."""
    model, text = tiny(tmp_path), text_file(tmp_path)
    rc = cli_main(
        [
            "train-predictor",
            "--model",
            model,
            "--text",
            text,
            "--rank",
            "8",
            "--epochs",
            "1",
            "--tokens",
            "256",
            "--heldout-tokens",
            "128",
            "--ctx",
            "64",
            "--threads",
            "1",
            "--backend",
            "numpy",
            "--json",
            "--density",
            "0.5",
            "--allocate",
            "uniform",
            "--loss",
            "bce",
            "--max-density",
            "0.8",
            "--probe-tokens",
            "64",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["allocate"] == "uniform" and out["loss"] == "bce" and out["density_target"] == 0.5
    assert out["density"] == [0.5, 0.5] or all(abs(d - 0.5) < 0.02 for d in out["density"])


def test_error_curve_and_allocation():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((50, 40)).astype(np.float32)
    down = rng.standard_normal((8, 40)).astype(np.float32)
    oracle = error_curve(np.abs(h), h, down)
    noise = error_curve(rng.standard_normal(h.shape).astype(np.float32), h, down)
    assert oracle[0] == (-np.inf, 0.0)  # density 1: nothing dropped
    errs = [e for _, e in oracle]
    assert all(b >= a - 1e-6 for a, b in zip(errs, errs[1:])) and errs[-1] > 0
    assert sum(e for _, e in oracle) < sum(e for _, e in noise)
    # an easy layer (oracle scores) gets a lower density than a hard one (random scores)
    alloc = allocate_densities({0: oracle, 1: noise}, 0.7, max_density=0.9)
    d = {k: LAYER_DENSITIES[i] for k, i in alloc.items()}
    assert (d[0] + d[1]) / 2 <= 0.7 + 1e-9 and d[0] < d[1]
    # layers outside the curves count as dense; max_density: nothing between 0.9 and 1
    alloc = allocate_densities({0: oracle}, 0.8, max_density=0.9, n_layer=2)
    assert LAYER_DENSITIES[alloc[0]] <= 0.6 + 1e-9
    alloc = allocate_densities({0: oracle, 1: noise}, 0.97, max_density=0.9)
    assert sorted(LAYER_DENSITIES[i] for i in alloc.values()) == [0.9, 1.0]


def test_q8_0_scores_close_to_float():
    rng = np.random.default_rng(1)
    fc1 = rng.standard_normal((32, 64)).astype(np.float32) * 0.1
    fc2 = rng.standard_normal((96, 32)).astype(np.float32) * 0.1
    x = rng.standard_normal((5, 64)).astype(np.float32)
    ref = scores(fc1, fc2, x)
    q = scores(quantize_q8_0(fc1), quantize_q8_0(fc2), x)
    assert np.abs(q - ref).max() < 0.02 * np.abs(ref).max()
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q8_0(fc1[:, :40])


def test_train_predictor_refuses_bad_input(tmp_path):
    model = tiny(tmp_path)
    empty = tmp_path / "e.txt"
    empty.write_text("")
    with pytest.raises(TrainError, match="empty"):
        train_predictors(model, str(empty), progress=False)
    with pytest.raises(TrainError, match="does not exist"):
        train_predictors(model, str(tmp_path / "nope.txt"), progress=False)
    short = tmp_path / "s.txt"
    short.write_text("to be or not")
    with pytest.raises(TrainError, match="two chunks"):
        train_predictors(model, str(short), n_ctx=64, progress=False)
    with pytest.raises(TrainError, match="recall"):
        train_predictors(model, str(short), recall=1.5, progress=False)


def test_c_scores_equal_torch_model():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    n_embd, rank, n_ff = 96, 32, 160
    l1 = torch.nn.Linear(n_embd, rank, bias=False)
    l2 = torch.nn.Linear(rank, n_ff, bias=False)
    x = rng.standard_normal((7, n_embd)).astype(np.float32)
    with torch.no_grad():
        ref = l2(torch.relu(l1(torch.from_numpy(x)))).numpy()
    fc1 = l1.weight.detach().numpy().astype(np.float32)
    fc2 = l2.weight.detach().numpy().astype(np.float32)
    np.testing.assert_allclose(scores(fc1, fc2, x), ref, rtol=1e-4, atol=1e-5)
    # stored as F16 (what train-predictor writes): within F16 rounding of the torch model
    np.testing.assert_allclose(scores(fc1.astype(np.float16), fc2.astype(np.float16), x), ref, rtol=0, atol=2e-2)
