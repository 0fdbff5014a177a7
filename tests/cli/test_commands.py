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
    return subprocess.run(
        [sys.executable, "-m", "powerinfer_backend", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_generate_prints_text():
    p = _run(
        "generate", "--prompt", "The capital of France is", "-n", "8", "--temp", "0", "--threads", "2", "--ctx", "64"
    )
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
    assert p.returncode == 2 and "-n must be an integer, got 'many'" in p.stderr and "Traceback" not in p.stderr


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
    assert r["repack"] is True and r["ours"]["repacked_bytes"] > 0  # SmolLM2's tied Q8_0 output in row groups


def test_bench_no_repack_keeps_the_files_rows():
    p = _run(
        "bench", "--n-decode", "2", "--n-prefill", "8", "--repeats", "1", "--no-llama-cpp", "--no-repack", "--json"
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["repack"] is False and r["ours"]["repacked_bytes"] == 0
    p = _run("bench", "--busy", "1", "-nr")
    assert (
        p.returncode == 2 and "--no-repack does not apply to bench --busy" in p.stderr and "Traceback" not in p.stderr
    )


def test_bench_runs_json_has_each_run_and_their_medians():
    p = _run(
        "bench", "--n-decode", "4", "--n-prefill", "16", "--repeats", "1", "--runs", "2", "--no-llama-cpp", "--json"
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert len(r["runs"]) == 2 and r["summary"]["runs"] == 2
    dec = [run["ours"]["decode_tok_s"] for run in r["runs"]]
    assert r["summary"]["ours.decode_tok_s"] == {"median": sum(dec) / 2, "min": min(dec), "max": max(dec)}
    assert "ratio.decode" not in r["summary"]  # no llama.cpp measured
    loads = r["summary"]["loadavg_before"]
    assert loads == [run["loadavg_before"] for run in r["runs"]] and all(v >= 0 for v in loads)


def test_bench_runs_and_roofline_refused_in_the_other_modes():
    for extra, flag in ((["--runs", "2", "--profile-ops"], "--runs"), (["--roofline", "--busy", "1"], "--roofline")):
        p = _run("bench", *extra)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert (
            p.stderr.strip()
            == f"powerinfer-backend: error: {flag} does not apply to bench {extra[-1 if flag == '--runs' else -2]}"
        )


def test_summarize_runs_takes_medians_of_per_run_ratios():
    from powerinfer_backend.cli.bench import format_summary, summarize_runs

    runs = [
        {
            "ours": {"decode_tok_s": d},
            "llama_cpp": {"decode_tok_s": lc},
            "ratio": {"decode": d / lc},
            "loadavg_before": 0.5,
        }
        for d, lc in ((10.0, 5.0), (30.0, 10.0), (20.0, 20.0))
    ]
    s = summarize_runs(runs)
    assert s["ours.decode_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert s["ratio.decode"] == {"median": 2.0, "min": 1.0, "max": 3.0}  # not 20 / 10
    assert "ratio.prefill" not in s and s["loadavg_before"] == [0.5] * 3
    assert "medians of 3 runs (load average before each: 0.50, 0.50, 0.50)" in format_summary(s)


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


# ---- frictions a new user met (issue 17): each failed before its fix ---------------------------


def test_a_size_in_the_budget_variable_breaks_no_command():
    """$POWERINFER_VRAM_BUDGET=512MiB used to crash every command while the parser was built."""
    import os

    p = subprocess.run(
        [sys.executable, "-m", "powerinfer_backend", "devices", "--json"],
        cwd=ROOT,
        text=True,
        capture_output=True,
        timeout=120,
        env=dict(os.environ, POWERINFER_VRAM_BUDGET="512MiB"),
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr and json.loads(p.stdout)["devices"]


def test_generate_empty_prompt_is_one_clear_line():
    p = _run("generate", "--prompt", "", "-n", "4")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines() == [
        "powerinfer-backend: error: --prompt is empty: give the text to continue (or to answer, with --chat)"
    ]


def test_plan_says_no_gpu_was_found(tmp_path):
    from powerinfer_backend.engine import ggml

    if any(d.type == "gpu" for d in ggml.list_devices()):
        pytest.skip("a GPU is present")
    p = _run("plan", "--vram-budget", "64MiB", "--no-plot", "--out", str(tmp_path / "plan.json"))
    assert p.returncode == 0, p.stderr
    assert (
        "no GPU: device='auto': ggml found no discrete GPU (devices: CPU (cpu)); bytes counted by ggml's "
        "CPU buffer rule"
    ) in p.stdout
    p = _run("plan", "--vram-budget", "64MiB", "--predict", "--device-bandwidth", "100", "--threads", "0")
    assert p.returncode == 2 and "--threads must be in [1, " in p.stderr and "got 0" in p.stderr


def test_cli_flags_take_sizes_and_llama_cpp_layer_counts():
    from powerinfer_backend.cli.parser import build_parser

    for cmd in ("generate", "serve", "chat"):
        a = build_parser().parse_args(
            [cmd, "--vram-budget", "512MiB", "-ngl", "all", "--device", "ggml-cpu", "--placement", "layers"]
        )
        assert (a.vram_budget, a.n_gpu_layers, a.device, a.placement) == ("512MiB", -1, "ggml-cpu", "layers")
        assert build_parser().parse_args([cmd, "--n-gpu-layers", "auto"]).n_gpu_layers is None
    from powerinfer_backend.server.placement_args import device_kwargs

    for cmd in ("generate", "serve", "chat", "perplexity --text x"):
        argv = cmd.split()
        assert "repack" not in device_kwargs(build_parser().parse_args(argv))  # Llama's default: row groups
        for flag in ("--no-repack", "-nr"):  # llama-server's flag: the file's rows
            assert device_kwargs(build_parser().parse_args([*argv, flag]))["repack"] is False
    for argv in (["serve", "--vram-budget", "lots"], ["serve", "-ngl", "-2"], ["generate", "--device-threads", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(argv)


# ---- a newcomer's first hour (issue 25): each failed before its fix ----------------------------


def _generate_in_process(capsys, *argv):
    """(stdout, the seed --verbose reported) of one `generate` run in this process."""
    import re

    from powerinfer_backend.cli.parser import build_parser

    args = build_parser().parse_args(["generate", "--threads", "2", "--ctx", "64", "--verbose", *argv])
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    m = re.search(r"^powerinfer-backend: seed (\d+) \(--seed \1 repeats this run\)$", err, re.M)
    assert m, err
    return out, int(m.group(1))


def test_generate_draws_a_seed_and_reports_it(capsys):
    """--seed's help said "default: random" but every run gave the same text."""
    argv = ("--prompt", "Once upon a time", "-n", "32", "--temp", "2")
    a, seed_a = _generate_in_process(capsys, *argv)
    b, seed_b = _generate_in_process(capsys, *argv)
    assert seed_a != seed_b and a != b  # 32 tokens at temperature 2: equal texts would mean an unused seed
    again, seed = _generate_in_process(capsys, *argv, "--seed", str(seed_a))
    assert seed == seed_a and again == a


def test_generate_verbose_timings_start_on_their_own_line_after_a_context_full_note():
    """The timing report was glued to the answer's last line; an answer the context cut ended
    silently. stdout and stderr through one pipe, as a terminal shows them."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "powerinfer_backend",
            "generate",
            "--prompt",
            "The capital of France is",
            "-n",
            "0",
            "--temp",
            "0",
            "--threads",
            "2",
            "--ctx",
            "40",
            "--verbose",
        ],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout
    text, note, timings = p.stdout.partition("\n[stopped: context full (40 tokens)]\n")
    assert note and "Paris" in text and "llama_perf" not in text
    assert [line.split(":")[0] for line in timings.splitlines()] == ["llama_perf_context_print"] * 4


def test_plan_writes_only_into_the_cache_and_warns_without_matplotlib(tmp_path, xdg_cache, monkeypatch, capsys):
    """plan wrote placement.json beside the user's model and promised a PNG without matplotlib."""
    from powerinfer_backend.cli.parser import build_parser
    from powerinfer_backend.loader.artifacts import model_fingerprint

    from tests.fixtures.tiny_gguf import write_tiny_llama

    from pathlib import Path

    (tmp_path / "models").mkdir()
    model = Path(write_tiny_llama(tmp_path / "models" / "m.gguf", n_layer=2, n_ff=128))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    args = build_parser().parse_args(
        ["plan", "--model", str(model), "--vram-budget", "60KiB", "--ctx", "100", "--batch", "4", "--device", "cpu"]
    )
    assert args.func(args) == 0
    out, err = capsys.readouterr()
    assert sorted(p.name for p in model.parent.iterdir()) == ["m.gguf"]  # nothing beside the model
    plan = xdg_cache / "powerinfer_backend" / model_fingerprint(model)[:16] / "placement.json"
    assert json.loads(plan.read_text())["budget_bytes"] == 60 * 1024
    assert out.splitlines()[-1] == f"plan: {plan}"
    assert err == (
        "powerinfer-backend: warning: no plot written: matplotlib is not installed (pip install "
        "'.[plot]' in a clone, 'powerinfer_backend[plot]' from PyPI; --no-plot skips the plot)\n"
    )


def test_unknown_chat_format_is_one_clear_line_at_load():
    """`--chat-format bogus` printed a LlamaChatCompletionHandlerNotFoundException traceback
    (generate, chat) or made every chat request a 500 (serve); now the load refuses it."""
    from powerinfer_backend import Llama

    with pytest.raises(
        ValueError, match=r"unknown chat_format 'bogus' \(this model's templates: chat_template.default"
    ):
        Llama(default_model_path(), n_ctx=64, chat_format="bogus", verbose=False)
    with Llama(default_model_path(), n_ctx=64, chat_format="chatml", verbose=False) as llm:  # registered names load
        assert llm.chat_format == "chatml"
    p = _run("generate", "--chat", "--chat-format", "bogus", "--prompt", "hi", "-n", "1")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("powerinfer-backend: error: unknown chat_format 'bogus'")
