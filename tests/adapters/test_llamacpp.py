"""The llama-cpp drop-in: ``install()`` makes ``llama_cpp.Llama`` ours, for code and for
llama-cpp-python's own server, unmodified."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import llama_cpp
import llama_cpp.llama

from powerinfer_backend import Llama
from powerinfer_backend.adapters import llamacpp

from tests.fixtures import ROOT
from tests.fixtures.server import free_port


def test_install_swaps_and_uninstall_restores(model_path):
    original = llama_cpp.Llama
    assert not llamacpp.installed()
    cls = llamacpp.install(vram_budget=2, n_threads=1, verbose=False)
    try:
        assert llama_cpp.Llama is cls and llamacpp.installed()
        assert llama_cpp.llama.Llama is original  # llama-cpp-python's own code uses that global
        assert issubclass(cls, Llama) and cls.__name__ == "Llama"
        assert llamacpp.original_llama() is original
        from llama_cpp import Llama as Imported  # what third-party code does

        with Imported(model_path=model_path, n_ctx=256, n_gpu_layers=-1) as llm:  # GPU layers: ignored, warns
            assert isinstance(llm, Llama) and llm.vram_budget == 2 and llm.backend == "hybrid"
            text = llm("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
        with Llama(model_path, n_ctx=256, n_threads=1, verbose=False) as ref:
            assert text == ref("The capital of France is", max_tokens=8, temperature=0)["choices"][0]["text"]
        with Imported(model_path=model_path, n_ctx=256, vram_budget=0.5) as llm:  # the caller's keyword wins
            assert llm.vram_budget == 0.5
        with pytest.raises(TypeError):
            Imported(model_path, 256)
    finally:
        llamacpp.uninstall()
    assert llama_cpp.Llama is original and llama_cpp.llama.Llama is original and not llamacpp.installed()
    llamacpp.uninstall()  # idempotent


def test_install_also_patches_modules_that_imported_the_name():
    import types

    mod = types.ModuleType("third_party")
    mod.Llama = llama_cpp.Llama
    original = mod.Llama
    try:
        cls = llamacpp.install(also=[mod])
        assert mod.Llama is cls
    finally:
        llamacpp.uninstall()
    assert mod.Llama is original


def test_llama_cpp_python_server_runs_on_our_llama(model_path, tmp_path):
    """``python -m llama_cpp.server``'s code, unmodified, serving our Llama: the openai
    client gets our greedy text, and our backend's load line shows who answered."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("starlette_context", reason="llama-cpp-python's server needs llama-cpp-python[server]")
    port = free_port()
    log = open(tmp_path / "server.log", "w")  # a file, not a pipe: a full pipe would block the server
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerinfer_backend.adapters.llamacpp.server",
            "--model",
            model_path,
            "--n_ctx",
            "512",
            "--n_threads",
            "1",
            "--port",
            str(port),
            "--vram_budget",
            "1GiB",
            "--verbose",
            "true",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=60)
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                client.models.list()
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.3)
        r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0)
        stream = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0, stream=True
        )
        chat = "".join(c.choices[0].delta.content or "" for c in stream)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
    out = (tmp_path / "server.log").read_text()
    with Llama(model_path, n_ctx=512, n_threads=1, verbose=False) as ref:
        # llama-cpp-python's server defaults to repeat_penalty 1.1
        want = ref("The capital of France is", max_tokens=8, temperature=0, repeat_penalty=1.1)
        assert r.choices[0].text == want["choices"][0]["text"]
        want = ref.create_chat_completion(
            [{"role": "user", "content": "Say hi"}], max_tokens=8, temperature=0, repeat_penalty=1.1
        )
        assert chat == want["choices"][0]["message"]["content"]
    assert "powerinfer_backend: n_ctx 512" in out  # our engine loaded the model (verbose load line)
