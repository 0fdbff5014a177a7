"""bench/gpu_validate.py: a missing device is a clear message (exit 2), and, where this
checkout has the ggml device (issue 14), its --small smoke on ggml's CPU backend runs
every check and writes the JSON the GPU run writes."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.fixtures import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import gpu_validate as gv

HAVE_GGML = importlib.util.find_spec("powerinfer_backend.engine.ggml") is not None


def test_missing_device_is_a_clear_message(capsys):
    assert gv.main(["--device", "NoSuchDevice0", "--small"]) == 2
    err = capsys.readouterr().err
    if HAVE_GGML:  # the binding is there: the device is looked up among ggml's
        assert "no ggml device for 'NoSuchDevice0'" in err and "docs/building.md" in err and "found:" in err
    else:
        assert "this checkout has no ggml device (powerinfer_backend.engine.ggml" in err


@pytest.mark.skipif(not HAVE_GGML, reason="needs the ggml device (issue 14: engine/ggml.py)")
def test_small_smoke_on_ggml_cpu(tmp_path):
    out = tmp_path / "v.json"
    rc = gv.main(
        [
            "--device",
            "ggml-cpu",
            "--small",
            "--models",
            "relu",
            "--threads",
            "2",
            "--dir",
            str(tmp_path / "m"),
            "--out",
            str(out),
            "--device-bandwidth",
            "10",
            "--host-bandwidth",
            "10",
        ]
    )
    res = json.loads(out.read_text())
    assert rc == (0 if res["ok"] else 1) and res["device"]["type"] == "cpu"
    assert [m["kind"] for m in res["models"]] == ["relu"]  # the SwiGLU path is the same code (time)
    for m in res["models"]:
        assert [b["fraction"] for b in m["budgets"]] == [0.1, 0.25, 0.5]
        for b in m["budgets"]:
            assert b["high_water"] <= b["budget"] and b["top1_agree_margin"] == 1.0, b
        assert m["cpu"]["ours"]["decode_tok_s"] > 0 and m["cpu"]["llama_cpp"]["decode_tok_s"] > 0
        assert [s["fraction"] for s in m["speeds"]] == [0.25, 0.5]
        for s in m["speeds"]:
            assert s["ours"]["decode_tok_s"] > 0 and s["llama_cpp_layers"]["decode_tok_s"] > 0
            p = s["predicted"]  # --device-bandwidth given: the prediction and the round-trip fit
            assert p["split_layers"] >= 0 and p["host_scale"] > 0
            assert (p["sync_fit_s"] is None) == (p["split_layers"] == 0) and p["ratio"] > 0
            assert p["sync_s"] == 0.0  # ggml's CPU backend: no round trip planned
            # where auto chose another plan, the neuron plan's speed too (its split layers: the fit)
            assert ("ours_neurons" in s) == (s["ours"]["placement"]["policy"] != "neurons")
        sk = m["skips"]  # random predictors: the device skipping computes fewer rows, closer to the CPU's
        assert "error" not in sk and sk["hot_neurons"] > 0, sk
        assert sk["skips"]["ffn_rows_computed"] < sk["every_hot"]["ffn_rows_computed"]
        assert sk["skips"]["top1_agree"] >= sk["every_hot"]["top1_agree"] and sk["skips"]["decode_tok_s"] > 0
    assert res["ok"]
