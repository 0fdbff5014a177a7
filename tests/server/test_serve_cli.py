"""``powerinfer-backend serve``'s command line as a new user meets it (issue 17): budgets as
sizes (flag or ``$POWERINFER_VRAM_BUDGET``), ``--device`` / ``--placement`` / ``-ngl`` as
``generate`` has them, a taken port refused before the model loads, what ``/props`` and
``/v1/models`` say about a budget, the prompt in ``/completion``'s answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.fixtures import ROOT

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")

from tests.fixtures.server import ServerProcess  # noqa: E402 - needs the packages checked above


def _serve(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "powerinfer_backend", "serve", *args],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def test_taken_port_fails_before_the_model_loads(model_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        p = _serve("--model", model_path, "--port", str(port), "--verbose")
        took = time.monotonic() - t0
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [
        f"powerinfer-backend: error: cannot listen on 127.0.0.1:{port}: Address already "
        f"in use (is another server running there? choose another --port)"
    ]
    assert "serving" not in p.stderr and "loaded" not in p.stderr and took < 60  # the model never loaded


def test_bad_budget_variable_is_one_clear_line(model_path):
    p = _serve("--model", model_path, "--port", "0", env={"POWERINFER_VRAM_BUDGET": "lots"})
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        "powerinfer-backend: error: $POWERINFER_VRAM_BUDGET='lots': vram_budget 'lots' "
        "is not a size: use GiB as a number or a string like '8GiB', '512MiB', '1.5GB'"
    ]


def test_ctx_size_zero_is_the_models_context_split_over_the_slots(model_path):
    """``--ctx-size 0`` means the model's context (SmolLM2: 8192) also with ``--parallel``:
    the slot size is checked once that is known, not against the 0 as written."""
    s = ServerProcess("--model", model_path, "--ctx-size", "0", "--parallel", "2")
    try:
        props = httpx.get(s.url + "/props", timeout=60).json()
    finally:
        s.close()
    assert props["n_ctx"] == 8192 and props["n_ctx_slot"] == 4096 and props["total_slots"] == 2


def test_serve_takes_a_size_budget_device_placement_and_says_what_ngl_does(model_path, monkeypatch):
    """The budget from the environment as a size, the whole model on ggml's CPU backend as
    the device by layers; -ngl beside a budget is ignored, and says so on one line."""
    monkeypatch.setenv("POWERINFER_VRAM_BUDGET", "512MiB")
    s = ServerProcess(
        "--model", model_path, "--ctx-size", "256", "--device", "ggml-cpu", "--placement", "layers", "-ngl", "4"
    )
    try:
        props = httpx.get(s.url + "/props", timeout=60).json()
        card = httpx.get(s.url + "/v1/models", timeout=60).json()["data"][0]
        r = httpx.post(
            s.url + "/completion",
            json={"prompt": "The capital of France is", "n_predict": 2, "temperature": 0},
            timeout=120,
        ).json()
    finally:
        s.proc.terminate()
        s.proc.wait(timeout=30)
        out = s.log()
        s.close()
    assert props["vram_budget"] == "512MiB" and card["meta"]["vram_budget"] == "512MiB"
    assert props["stats"]["device"]["name"] == "CPU"  # placed on ggml's CPU device
    assert r["prompt"] == "The capital of France is" and r["tokens_predicted"] == 2
    lines = out.splitlines()
    assert "powerinfer-backend: warning: n_gpu_layers=4 ignored: vram_budget='512MiB' decides placement" in lines
    assert not [line for line in lines if "warn(" in line or "UserWarning" in line]


def test_an_ignored_budget_is_not_reported(tmp_path):
    """Without a device the budget is ignored (a warning says so): /props and /v1/models
    report none instead of the number given."""
    from fastapi.testclient import TestClient

    from powerinfer_backend import Llama
    from powerinfer_backend.server.app import create_app
    from tests.fixtures.server import write_server_model

    path = write_server_model(tmp_path / "tiny.gguf")
    with pytest.warns(UserWarning, match=r"vram_budget='1GiB' ignored: device='cpu'"):
        llm = Llama(path, n_ctx=64, n_threads=1, verbose=False, vram_budget="1GiB", device="cpu")
    app = create_app(llm)
    try:
        with TestClient(app) as c:
            assert c.get("/props").json()["vram_budget"] is None
            assert c.get("/v1/models").json()["data"][0]["meta"]["vram_budget"] is None
    finally:
        app.state.serve.worker.stop()
        llm.close()


def test_a_budget_from_n_gpu_layers_is_reported_in_bytes(tmp_path):
    """-ngl with no vram_budget still places layers (here on ggml's CPU device): /props and
    /v1/models report the budget the plan was made under, in bytes, not None."""
    from fastapi.testclient import TestClient

    from powerinfer_backend import Llama
    from powerinfer_backend.server.app import create_app
    from tests.fixtures.server import write_server_model

    path = write_server_model(tmp_path / "tiny.gguf")
    with pytest.warns(UserWarning, match="n_gpu_layers=1 converted to vram_budget"):
        llm = Llama(path, n_ctx=64, n_threads=1, verbose=False, n_gpu_layers=1, device="ggml-cpu")
    app = create_app(llm)
    try:
        budget = llm.stats()["device"]["budget_bytes"]
        assert isinstance(budget, int) and budget >= llm.stats()["device"]["reserved"] > 0
        with TestClient(app) as c:
            assert c.get("/props").json()["vram_budget"] == budget
            assert c.get("/v1/models").json()["data"][0]["meta"]["vram_budget"] == budget
    finally:
        app.state.serve.worker.stop()
        llm.close()
