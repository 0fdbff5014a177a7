"""The fuzz harness itself: the seed parser finds every structural field, mutants are
reproducible from (run seed, index), and the worker reports each outcome it must count —
a load, a clean rejection, a crash (a real abort in the child) and a hang (a real
timeout) — and saves the crasher with its description."""

from __future__ import annotations

import json
import struct

import gguf
import pytest

from tests.fuzz import harness
from tests.fuzz.seeds import TINY_SEEDS, tiny_seeds


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz_seeds")


@pytest.fixture(scope="module")
def seeds(seed_dir):
    return tiny_seeds(seed_dir)


@pytest.fixture(scope="module")
def worker(seeds, seed_dir):
    w = harness._Worker(str(seed_dir / f"seed_{seeds[0].name}.gguf"), harness.worker_env(1024))
    yield w
    w.close()


def test_layout_finds_every_field(seeds, seed_dir):
    """The parser's counts, keys and tensor entries agree with gguf.GGUFReader's."""
    assert [s.name for s in seeds] == list(TINY_SEEDS)
    for s in seeds:
        r = gguf.GGUFReader(seed_dir / f"seed_{s.name}.gguf")
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert [c[2] for c in s.layout.kv_chunks] == keys
        assert [c[2] for c in s.layout.tensor_chunks] == [t.name for t in r.tensors]
        assert s.layout.data_start == r.data_offset
        kinds = {f.kind for f in s.layout.fields}
        assert {
            "n_tensors",
            "n_kv",
            "key_len",
            "str_len",
            "array_len",
            "array_type",
            "dim",
            "tensor_type",
            "tensor_offset",
            "n_dims",
        } <= kinds
        n_tensors = next(f for f in s.layout.fields if f.kind == "n_tensors")
        assert struct.unpack_from("<Q", s.region, n_tensors.pos)[0] == len(r.tensors)


def test_mutants_depend_only_on_seed_and_index(seeds):
    a = [harness.input_for(i, 7, seeds, None, 0) for i in range(40)]
    b = [harness.input_for(i, 7, seeds, None, 0) for i in range(40)]
    assert [(s.name, d, m) for s, d, m in a] == [(s.name, d, m) for s, d, m in b]
    assert len({d for _s, d, _m in a}) == 40  # all different
    kinds = {step.split(" ")[0] for _s, _d, m in a for step in m.split("; ")}
    assert len(kinds) >= 5, kinds


def _req(path, log, **kw):
    return dict({"path": str(path), "timeout": 20, "mem_mb": 1024, "log": str(log)}, **kw)


def test_worker_outcomes(worker, seeds, tmp_path):
    seed = tmp_path / "seed.gguf"
    seed.write_bytes(seeds[0].region)
    log = tmp_path / "log"
    ok = worker.run(_req(seed, log))
    assert harness.classify(ok) == "loaded" and ok["result"]["evaluated"] >= 1

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(seeds[0].region[:1000])
    rej = worker.run(_req(cut, log))
    assert harness.classify(rej) == "rejected"
    assert str(cut) in rej["result"]["exception"]["message"]

    crash = worker.run(_req(seed, log, selftest="abort"))
    assert crash["status"] == -6 and crash["result"] is None
    assert harness.classify(crash) == "crash"

    hang = worker.run(_req(seed, log, selftest="hang", timeout=1.5))
    assert hang["hang"] and 1.5 <= hang["wall"] < 10
    assert harness.classify(hang) == "hang"
    assert harness.classify(worker.run(_req(seed, log))) == "loaded"  # the worker survives both


def test_unexpected_exception_types_are_not_rejections():
    def reply(*mro):
        return {"hang": False, "status": 0, "result": {"exception": {"type": mro[0], "mro": list(mro)}}}

    assert harness.classify(reply("_FileError", "ValueError", "Exception")) == "rejected"
    assert harness.classify(reply("NotImplementedError", "RuntimeError", "Exception")) == "rejected"
    assert harness.classify(reply("UnicodeDecodeError", "UnicodeError", "ValueError")) == "unexpected"
    assert harness.classify(reply("KeyError", "LookupError", "Exception")) == "unexpected"
    assert harness.classify(reply("RuntimeError", "Exception")) == "unexpected"


def test_crasher_saved_with_its_description(worker, seeds, tmp_path):
    path, log = tmp_path / "input.gguf", tmp_path / "log"
    path.write_bytes(seeds[0].region)
    reply = worker.run(_req(path, log, selftest="abort"))
    (tmp_path / "crashes").mkdir()
    s = harness.Summary()
    harness._count(
        s,
        5,
        seeds[0],
        seeds[0].region,
        "bitflip bytes.bits 1.2",
        str(path),
        str(log),
        reply,
        harness.classify(reply),
        tmp_path,
        3,
    )
    assert s.outcomes == {"crash": 1} and s.bad() == 1
    info = json.loads((tmp_path / "crashes" / "3_0000005_crash.json").read_text())
    assert info["seed"] == seeds[0].name and info["mutation"] == "bitflip bytes.bits 1.2"
    assert info["status"] == -6 and "--seed 3 --start 5" in info["rebuild"]
    assert (tmp_path / "crashes" / "3_0000005_crash.gguf").read_bytes() == seeds[0].region


def test_memory_limit_applies(worker, tmp_path):
    """A child gets its memory limit: RLIMIT_AS refuses the real model's 94 MB map with
    8 MB of headroom (a clean refusal naming the errno); under ASan the worker's watchdog
    kills the child instead."""
    from powerinfer_backend.loader.models import default_model_path

    reply = worker.run(_req(default_model_path(), tmp_path / "log", mem_mb=8, timeout=120))
    if harness.under_asan():
        assert harness.classify(reply) == "oom", reply
    else:
        assert harness.classify(reply) == "rejected", reply
        assert "Cannot allocate memory" in reply["result"]["exception"]["message"]
