"""``bench --busy N``: the busy processes run during the comparison and are gone after
it, also when the block they serve raises (an error or Ctrl-C)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from powerinfer_backend.cli.busy import busy_processes
from powerinfer_backend.engine import default_threads
from powerinfer_backend.loader.models import default_model_path

from tests.fixtures import ROOT


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().split(")")[-1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_busy_processes_spin_and_are_killed_on_errors(exc):
    import time

    with pytest.raises(exc):
        with busy_processes(2) as pids:
            assert len(pids) == 2 and all(_alive(p) for p in pids)
            # they really compute: each gets CPU time (within 10 s: on a loaded host a new
            # process may wait a while for its first tick)
            deadline = time.monotonic() + 10
            while not all(_cpu_ticks(p) > 0 for p in pids) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert all(_cpu_ticks(p) > 0 for p in pids)
            raise exc()
    assert not any(_alive(p) for p in pids)


def test_busy_processes_rejects_negative():
    with pytest.raises(ValueError, match=">= 0"):
        with busy_processes(-1):
            pass


def test_bench_busy_json():
    try:
        default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "powerinfer_backend",
            "bench",
            "--busy",
            "1",
            "--threads",
            "2",
            "--n-decode",
            "3",
            "--repeats",
            "1",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["n_busy"] == 1 and len(r["busy_pids"]) == 1
    assert not _alive(r["busy_pids"][0])
    llama_default = max(os.cpu_count() // 2, 1)  # llama-cpp-python's own default
    assert r["defaults"]["ours"]["threads"] == default_threads()
    assert r["defaults"]["llama_cpp"]["threads"] == llama_default
    assert r["equal"]["ours"]["threads"] == r["equal"]["llama_cpp"]["threads"] == 2
    for c in ("defaults", "equal"):
        assert r[c]["ours"]["decode_tok_s"] > 0 and r[c]["llama_cpp"]["decode_tok_s"] > 0
        assert r[c]["ratio"] == pytest.approx(r[c]["ours"]["decode_tok_s"] / r[c]["llama_cpp"]["decode_tok_s"])
        # which llama.cpp ran: on unless its probe failed
        assert isinstance(r[c]["llama_cpp"]["extra_buffer_types"], bool)
