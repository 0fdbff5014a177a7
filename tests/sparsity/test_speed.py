"""Decode speed measured at calibration (sparsity/speed.py) and what ``sparse="auto"``
does with it (issue 16 item 4): a sidecar whose thresholds decoded slower than dense runs
dense and says why; a faster one runs sparse."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_backend import Llama
from powerinfer_backend.sparsity.speed import host_id, measure_speedup
from powerinfer_backend.sparsity.sidecar import read_sidecar, write_sidecar

from tests.sparsity.test_calibrate import TEXT, _calibrate_tiny, tiny

pytestmark = pytest.mark.usefixtures("xdg_cache")


def test_calibration_records_decode_speed(tmp_path):
    path = tiny(tmp_path)
    prof = _calibrate_tiny(
        tmp_path, path, target_sparsity=0.4, max_ppl_increase=None, speed_check=True, speed_steps=8, speed_repeats=1
    )
    info = read_sidecar(prof.path).info
    assert info["decode_speedup"] > 0 and info["decode_dense_tok_s"] > 0 and info["decode_sparse_tok_s"] > 0
    assert info["speed_threads"] == 2 and info["speed_host"] == host_id()
    # both forms were searched (the model is gated), and the kept one is named
    assert info["forms_tried"].startswith("product: ") and "gate: " in info["forms_tried"]
    assert info["threshold_on"] in ("product", "gate") and info["calibration_seconds"] > 0


def _with_speedup(path, speedup):
    """The model's sidecar rewritten with a given measured speedup."""
    prof = read_sidecar(path)
    prof.info["decode_speedup"] = speedup
    prof.info["speed_threads"], prof.info["speed_host"] = 2, "testhost/x86_64/2cpu"
    write_sidecar(path, prof)


def _logits(llm, toks):
    llm._backend.truncate(0)
    return np.array(llm._backend.eval(toks, logits_all=True))


def test_auto_runs_dense_when_sparse_decoded_slower(tmp_path, capsys):
    """Acceptance (issue 16): speedup < 1 in the sidecar -> "auto" runs dense (logits equal
    sparse="off"), stats() and the verbose line say why; > 1 -> sparse."""
    path = tiny(tmp_path)
    prof = _calibrate_tiny(tmp_path, path, target_sparsity=0.4, max_ppl_increase=None, threshold_on="product")
    with Llama(path, n_ctx=64, n_threads=2, verbose=False, sparse="off") as llm:
        toks = llm.tokenize(TEXT.encode())[:48]
        dense = _logits(llm, toks)

    _with_speedup(prof.path, 0.8)
    capsys.readouterr()
    with Llama(path, n_ctx=64, n_threads=2, verbose=True) as llm:
        got = _logits(llm, toks)
        st = llm.stats()
    line = capsys.readouterr().err
    np.testing.assert_array_equal(got, dense)
    assert st["mode"] == "dense" and st["ffn_sparsity"] == 0.0 and st["decode_speedup"] == 0.8
    assert "0.80x dense" in st["reason"] and "testhost" in st["reason"] and "2 threads" in st["reason"]
    assert "sparse FFN off (dense): sidecar's thresholds" in line and "0.80x dense" in line
    assert st["reason"].endswith("; sparse='threshold' forces them")
    # asked for: still sparse, with one warning at the caller's line saying what calibration measured
    with pytest.warns(
        UserWarning, match=r"0\.80x dense .*; running them as asked \(sparse='auto' would run dense\)"
    ) as rec:
        llm = Llama(path, n_ctx=64, n_threads=2, verbose=False, sparse="threshold")
    assert len(rec) == 1 and rec[0].filename == __file__
    with llm:
        _logits(llm, toks)
        assert llm.stats()["mode"] == "threshold" and llm.stats()["ffn_sparsity"] > 0.2

    _with_speedup(prof.path, 1.25)
    with Llama(path, n_ctx=64, n_threads=2, verbose=True) as llm:
        sparse = _logits(llm, toks)
        st = llm.stats()
    line = capsys.readouterr().err
    assert st["mode"] == "threshold" and st["ffn_sparsity"] > 0.2 and st["reason"] is None
    assert st["decode_speedup"] == 1.25 and "measured decode 1.25x dense" in line
    assert not np.array_equal(sparse, dense)


def test_measure_speedup_alternates_and_checks_its_input(tmp_path):
    """The timing loop leaves the context dense and reports medians; bad sizes are refused."""
    from powerinfer_backend.engine.native import NativeContext, NativeModel
    from powerinfer_backend.loader import load_gguf

    g = load_gguf(tiny(tmp_path), verbose=False)
    model = NativeModel(g)
    ctx = NativeContext(model, n_ctx=64, n_batch=64, n_threads=1)
    calls = []
    try:
        r = measure_speedup(
            ctx,
            lambda: calls.append("d"),
            lambda: calls.append("s"),
            list(range(40)),
            prompt_tokens=4,
            steps=4,
            repeats=3,
        )
        with pytest.raises(ValueError, match="needs 40 tokens"):
            measure_speedup(ctx, lambda: None, lambda: None, list(range(39)), prompt_tokens=8, steps=32)
        with pytest.raises(ValueError, match=">= 1"):
            measure_speedup(ctx, lambda: None, lambda: None, list(range(40)), repeats=0)
    finally:
        ctx.close()
        model.close()
    # a warm-up pair, then 3 alternating pairs; the last switch is back to dense
    assert calls == ["s", "d", "d", "s", "s", "d", "d", "s", "d"]
    assert r["repeats"] == 3 and r["steps"] == 4 and r["threads"] == 1 and r["speedup"] > 0


def test_auto_prefers_the_fastest_of_predictors_thresholds_and_dense(tmp_path):
    """A sidecar with both: "auto" takes the predictors unless train-predictor measured them
    slower than dense or than the thresholds."""
    from powerinfer_backend.sparsity.train import train_predictors

    path = tiny(tmp_path)
    prof = _calibrate_tiny(tmp_path, path, target_sparsity=0.4, max_ppl_increase=None, threshold_on="product")
    train_predictors(
        path,
        str(tmp_path / "t.txt"),
        density=0.6,
        rank=8,
        epochs=1,
        tokens=256,
        heldout_tokens=64,
        n_ctx=64,
        backend="numpy",
        n_threads=1,
        progress=False,
        log=lambda s: None,
        speed_check=False,
    )

    def auto_with(pred, thr):
        back = read_sidecar(prof.path)
        back.predictors.info["decode_speedup"] = pred
        back.info["decode_speedup"] = thr
        write_sidecar(prof.path, back)
        with Llama(path, n_ctx=64, n_threads=1, verbose=False) as llm:
            return llm.stats()

    assert auto_with(1.5, 1.2)["mode"] == "predictor"
    st = auto_with(1.1, 1.2)
    assert (
        st["mode"] == "threshold"
        and "predictors decoded 1.10x dense (slower than the thresholds' 1.20x)" in st["reason"]
    )
    st = auto_with(0.9, 0.8)
    assert st["mode"] == "dense" and "predictors decoded 0.90x" in st["reason"] and "0.80x dense" in st["reason"]


def test_auto_without_a_sidecar_says_why_it_runs_dense(tmp_path):
    """A gated FFN with no calibration sidecar: "auto" runs dense and stats() says what is missing
    (it said reason None, so a user could not tell why auto stayed dense)."""
    with Llama(tiny(tmp_path), n_ctx=64, n_threads=1, verbose=False) as llm:
        st = llm.stats()
    assert st["mode"] == "dense" and st["reason"].startswith("no calibration sidecar for this model")


def test_auto_distrusts_a_speedup_measured_against_the_files_rows(tmp_path):
    """Dense runs in row groups where the model has such matrices (Llama's repack): a
    sidecar records what its dense side ran on; one measured against the file's rows (an
    older sidecar) no longer makes "auto" sparse, and says why; without a repack it does."""
    from gguf import GGMLQuantizationType as T

    from tests.fixtures.tiny_gguf import write_tiny_llama

    path = write_tiny_llama(
        tmp_path / "q8.gguf",
        n_vocab=64,
        n_embd=64,
        n_ff=128,
        n_layer=2,
        types={"matrix": T.Q8_0},
        seed=3,
        n_ctx_train=512,
    )
    prof = _calibrate_tiny(
        tmp_path,
        path,
        target_sparsity=0.4,
        max_ppl_increase=None,
        speed_check=True,
        speed_steps=8,
        speed_repeats=1,
        threshold_on="product",
    )
    assert read_sidecar(prof.path).info["speed_dense_layout"] == "row groups"
    _with_speedup(prof.path, 1.25)
    with Llama(path, n_ctx=64, n_threads=2, verbose=False) as llm:
        assert llm._backend.repacked > 0
        assert llm.stats()["mode"] == "threshold"
    older = read_sidecar(prof.path)
    del older.info["speed_dense_layout"]
    write_sidecar(prof.path, older)
    with Llama(path, n_ctx=64, n_threads=2, verbose=False) as llm:
        st = llm.stats()
    assert st["mode"] == "dense" and "file's rows" in st["reason"] and "recalibrate" in st["reason"]
    with Llama(path, n_ctx=64, n_threads=2, verbose=False, repack=False) as llm:
        assert llm.stats()["mode"] == "threshold" and llm._backend.repacked == 0
