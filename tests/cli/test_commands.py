"""The ``powerinfer-backend`` command line (``python -m powerinfer_backend``), run as a
subprocess from the repository root on the real default model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from powerinfer_backend.loader.models import default_model_path

from tests.fixtures import ROOT



@pytest.fixture(scope="module", autouse=True)
def _default_model():
    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "powerinfer_backend", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_generate_prints_text():
    p = _run("generate", "--prompt", "The capital of France is", "-n", "8", "--temp", "0", "--threads", "2",
             "--ctx", "64")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # quiet without --verbose (no llama.cpp log lines either)
    out = p.stdout
    assert out.endswith("\n") and out.strip()
    assert "Paris" in out  # greedy: " Paris.\n\nThe United States ..."


def test_generate_missing_model_is_one_clear_line():
    p = _run("generate", "--model", "/nonexistent/model.gguf", "--prompt", "hi", "-n", "1")
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines == ["powerinfer-backend: error: Model path does not exist: /nonexistent/model.gguf"]
    assert p.stdout == ""


def test_bad_arguments_exit_2():
    p = _run("generate", "-n", "many")
    assert p.returncode == 2 and "invalid int value" in p.stderr and "Traceback" not in p.stderr


def test_bench_json():
    p = _run("bench", "--n-decode", "4", "--n-prefill", "16", "--repeats", "1", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert {"ours", "llama_cpp", "ratio"} <= set(r)
    assert r["n_decode"] == 4 and r["n_prefill"] == 16 and r["threads"] == 2
    for engine in ("ours", "llama_cpp"):
        assert r[engine]["decode_tok_s"] > 0 and r[engine]["prefill_tok_s"] > 0
    assert r["ratio"]["decode"] > 0 and r["ratio"]["prefill"] > 0
    assert 0 <= r["ours"]["python_overhead_pct"] <= 100 and r["ours"]["llama_decode_tok_s"] > 0


def test_devices_lists_what_ggml_found():
    from powerinfer_backend.engine import ggml

    p = _run("devices")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == f"ggml {ggml.bind()} from {ggml.lib_dir()}: {len(ggml.list_devices())} device(s)"
    assert lines[1].split() == ["index", "name", "type", "free", "total", "description"]
    cpu = next(line.split() for line in lines[2:] if line.split()[1] == "CPU")
    assert cpu[2] == "cpu" and cpu[4] in ("MiB", "GiB") and float(cpu[5]) > 0  # total memory
    p = _run("devices", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["ggml_version"] == ggml.bind() and d["lib_dir"] == str(ggml.lib_dir())
    cpu = next(x for x in d["devices"] if x["name"] == "CPU")
    assert cpu["type"] == "cpu" and 0 < cpu["free_bytes"] <= cpu["total_bytes"]


def test_generate_on_a_missing_device_is_one_clear_line():
    p = _run("generate", "--prompt", "hi", "-n", "1", "--device", "Vulkan7", "--ctx", "64")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "device='Vulkan7': ggml reports no device named 'Vulkan7'; devices found: CPU (cpu)" in p.stderr
