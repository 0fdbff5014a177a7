"""``bench --roofline``: the roofs are measured, the bytes per decoded token are exactly
the tensors a dense decode reads (computed here independently from the GGUF with the
``gguf`` package), and each engine's percentages follow from its tok/s. One cheap bench
run (a 8 MiB bandwidth buffer, 4 decoded tokens) shared by the tests."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import pytest

from powerinfer_backend.cli.roofline import decode_reads, format_roofline
from powerinfer_backend.engine.roofline import int8_peak, microkernel_isa, read_bandwidth
from powerinfer_backend.loader.models import default_model_path

from tests.fixtures import ROOT
from tests.fixtures.tiny_archs import write_tiny_falcon, write_tiny_opt


@pytest.fixture(scope="module")
def bench():
    try:
        path = default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "powerinfer_backend",
            "bench",
            "--roofline",
            "--roofline-mib",
            "8",
            "--json",
            "--n-decode",
            "4",
            "--n-prefill",
            "16",
            "--repeats",
            "1",
            "--sparse",
            "off",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    return path, json.loads(p.stdout)


def _dense_decode_bytes(path: str) -> int:
    """What a dense step reads, from the file alone: every tensor once (these files hold
    only tensors the forward pass uses), except that the token embedding — unless it is
    also the output head (no output.weight: tied) — and learned positions give one row."""
    r = gguf.GGUFReader(path)
    names = {t.name: t for t in r.tensors}
    total = sum(int(t.n_bytes) for t in r.tensors)

    def row(t):
        n_rows = int(t.shape[1])  # gguf order: shape[0] = the row length
        assert int(t.n_bytes) % n_rows == 0
        return int(t.n_bytes) // n_rows

    emb = names["token_embd.weight"]
    total += row(emb) - (0 if "output.weight" not in names else int(emb.n_bytes))
    if "position_embd.weight" in names:
        pos = names["position_embd.weight"]
        total += row(pos) - int(pos.n_bytes)
    return total


def test_bytes_per_token_is_what_a_dense_decode_reads(bench):
    path, r = bench
    rl = r["roofline"]
    assert rl["bytes_per_token"] == _dense_decode_bytes(path)
    assert rl["file_bytes_per_token"] == rl["bytes_per_token"] and rl["converted_tensors"] == 0
    assert rl["bytes_per_token"] == rl["layer_bytes"] + rl["output_bytes"] + rl["embedding_row_bytes"]
    # SmolLM2-135M: 30 layers x 9 tensors, output_norm, token_embd
    assert rl["n_tensors"] == 30 * 9 + 2
    # q, k, v, o of 576 x (576, 192, 192, 576) and gate/up/down of 576 x 1536, per layer
    assert rl["matmul_macs_per_token"] == 30 * (576 * (576 + 192 + 192 + 576) + 3 * 576 * 1536)
    assert rl["head_macs"] == 576 * 49152
    assert rl["kv_bytes_per_position"] == 30 * 2 * 2 * 192


@pytest.mark.parametrize("arch", ["falcon", "opt"])
def test_bytes_per_token_other_layouts(tmp_path, arch):
    """Falcon 7B: one norm fills two slots (counted once), fused q/k/v, an untied head (one
    embedding row read); OPT: learned positions (one row) and a tied head."""
    if arch == "falcon":
        path = write_tiny_falcon(tmp_path / "f.gguf", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    else:
        path = write_tiny_opt(tmp_path / "o.gguf")
    r = decode_reads(path)
    assert r["bytes_per_token"] == r["file_bytes_per_token"] == _dense_decode_bytes(path)
    assert r["embedding_row_bytes"] > 0
    assert r["converted_tensors"] == (2 if arch == "opt" else 0)  # OPT: ffn_down rebuilt from ffn_down_t


def test_roofs_and_percentages(bench):
    _, r = bench
    rl = r["roofline"]
    assert rl["threads"] == 2 and rl["bandwidth_mib"] == 8 and rl["isa"] == microkernel_isa()
    assert rl["read_bytes_per_s"] > 1e9 and rl["int8_ops_per_s"] > 1e9  # any x86 core of the last decade
    assert rl["decode_roof_tok_s"] == pytest.approx(rl["read_bytes_per_s"] / rl["bytes_per_token"], rel=1e-12)
    ops = 2 * (rl["matmul_macs_per_token"] + rl["head_macs"] / 16)
    assert rl["prefill_ops_per_token"] == pytest.approx(ops, rel=1e-12)
    assert rl["prefill_roof_tok_s"] == pytest.approx(rl["int8_ops_per_s"] / ops, rel=1e-12)
    for engine in ("ours", "llama_cpp"):
        e = rl[engine]
        assert e["decode_pct_of_roof"] == pytest.approx(100 * r[engine]["decode_tok_s"] / rl["decode_roof_tok_s"])
        assert e["prefill_pct_of_roof"] == pytest.approx(100 * r[engine]["prefill_tok_s"] / rl["prefill_roof_tok_s"])
    assert rl["loadavg_1m"] >= 0
    assert isinstance(r["llama_cpp"]["extra_buffer_types"], bool) and r["llama_cpp"]["reference_mode"]


def test_roofline_text(bench):
    _, r = bench
    rl = r["roofline"]
    lines = format_roofline(rl).splitlines()
    assert lines[0] == f"roofline (2 threads, {rl['isa']} microkernels, load average {rl['loadavg_1m']:.2f}):"
    assert f"{rl['bytes_per_token'] / 1e6:.1f} MB read per decoded token" in lines[1]
    assert lines[3].split()[:3] == ["ours", "(dense)", "decode"] and lines[4].split()[:2] == ["llama.cpp", "decode"]
    assert f"{rl['llama_cpp']['decode_pct_of_roof']:5.1f}% of roof" in lines[4]


def test_microbenchmarks_check_their_arguments():
    with pytest.raises(ValueError, match="nbytes must be >= 1 MiB"):
        read_bandwidth(1, nbytes=4096)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        int8_peak(1, iters=0)
    with pytest.raises(ValueError):
        read_bandwidth(0, nbytes=1 << 20)  # threads outside [1, 512]: the pool refuses
