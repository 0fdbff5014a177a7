"""textgen's (formerly text-generation-webui, tgw) "PowerInfer" loader, against a real
checkout named by ``TGW_DIR`` (never committed here; setup in
docs/adapters/text-generation-webui.md). Without ``TGW_DIR`` these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.fixtures import ROOT
from tests.fixtures.server import free_port

TGW_DIR = os.environ.get("TGW_DIR")
pytestmark = pytest.mark.skipif(
    not TGW_DIR,
    reason="TGW_DIR is not set (path of a text-generation-webui checkout with its portable CPU requirements installed)",
)
TGW_PYTHON = os.environ.get("TGW_PYTHON", sys.executable)  # the interpreter tgw's requirements are installed in


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


TABLES = r"""
import json, os, sys
tgw = os.environ["TGW_DIR"]
os.chdir(tgw); sys.path.insert(0, tgw); sys.argv = ["server.py", "--nowebui"]
import modules.shared as shared
from powerinfer_backend.adapters import text_generation_webui as a
a.apply()
from modules import loaders
print(json.dumps({
    "loaders": list(loaders.loaders_and_params),
    "params": loaders.loaders_and_params["PowerInfer"],
    "samplers": sorted(loaders.loaders_samplers["PowerInfer"]) == sorted(loaders.loaders_samplers["llama.cpp"]),
    "elements": loaders.list_model_elements(),
    "all_params": loaders.get_all_params(),
    "vram_budget": shared.args.vram_budget,
    "missing_widgets": a.missing_widgets(),
    "spec_types": next(x.choices for x in shared.parser._actions if x.dest == "spec_type"),
}))
"""


@pytest.fixture(scope="module")
def tables():
    """What tgw's modules say once the adapter is applied (one child process)."""
    p = subprocess.run(
        [TGW_PYTHON, "-c", TABLES], env={**_env(), "TGW_DIR": TGW_DIR}, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_loader_tables_and_widgets(tables):
    """The model menu offers "PowerInfer" and every parameter it lists has a widget
    (tgw's own, or vram_budget created by the adapter); the API accepts vram_budget."""
    r = tables
    assert "PowerInfer" in r["loaders"] and "llama.cpp" in r["loaders"]
    assert r["params"] == ["vram_budget", "threads", "batch_size", "ctx_size"] and r["samplers"]
    assert "vram_budget" in r["elements"] and "vram_budget" in r["all_params"]
    assert r["missing_widgets"] == [] and r["vram_budget"] == 0


def test_headless_tgw_completion_is_ours(model_path, tmp_path, tables):
    """tgw started headless loads SmolLM2 with loader "PowerInfer" and a vram_budget, and
    its /v1/completions greedy text equals powerinfer_backend.Llama's; so it does after a
    load with each speculative-decoding kind tgw offers (a draft model with "none"), whose
    llama-server flags our server accepts."""
    import httpx

    from powerinfer_backend import Llama

    models = tmp_path / "models"
    models.mkdir()
    name = os.path.basename(model_path)
    os.symlink(model_path, models / name)
    port = free_port()
    log = open(tmp_path / "tgw.log", "w")
    proc = subprocess.Popen(
        [
            TGW_PYTHON,
            "-m",
            "powerinfer_backend.adapters.text_generation_webui",
            "--tgw-dir",
            TGW_DIR,
            "--nowebui",
            "--api",
            "--api-port",
            str(port),
            "--model-dir",
            str(models),
            "--verbose",
        ],  # tgw logs the flags it starts the server with
        env=_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "tgw.log").read_text()[-5000:]
            try:
                if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "tgw.log").read_text()[-5000:]
            time.sleep(0.5)
        prompt = "The capital of France is"
        texts = {}
        for spec in tables["spec_types"]:
            extra = {"spec_type": spec} if spec != "none" else {"model_draft": name}
            r = httpx.post(
                url + "/v1/internal/model/load",
                timeout=300,
                json={
                    "model_name": name,
                    "args": {"loader": "PowerInfer", "vram_budget": 1.5, "ctx_size": 1024, "threads": 1, **extra},
                },
            )
            assert r.status_code == 200, r.text + (tmp_path / "tgw.log").read_text()[-5000:]
            info = httpx.get(url + "/v1/internal/model/info", timeout=30).json()
            assert info["model_name"] == name
            r = httpx.post(
                url + "/v1/completions",
                timeout=300,
                json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "top_k": 1, "repetition_penalty": 1.0},
            )
            assert r.status_code == 200, r.text
            texts[spec] = r.json()["choices"][0]["text"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    tgw_log = (tmp_path / "tgw.log").read_text()
    with Llama(model_path, n_ctx=1024, n_threads=1, verbose=False) as llm:
        want = llm.create_completion(prompt, max_tokens=12, temperature=0)["choices"][0]["text"]
    assert texts == {spec: want for spec in tables["spec_types"]}, tgw_log[-3000:]
    assert tgw_log.count("powerinfer-backend: serving") == len(tables["spec_types"])  # ours was started each time
    for flag in ("--model-draft", "--spec-draft-n-max", *(f"--spec-type {s}" for s in tables["spec_types"][1:])):
        assert flag in tgw_log  # the flags reached our server
