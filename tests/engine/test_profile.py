"""The engine's per-op timer (``NativeContext.set_profile`` / ``profile``): off by default,
exact call counts per op kind, times that add up to at most the eval's wall time, logits
unchanged, and ``bench --profile-ops``'s per-token table built on it."""

from __future__ import annotations

import time

import numpy as np
import pytest

from powerinfer_backend import Llama
from powerinfer_backend.cli.profile_ops import format_profile, run_profile_ops


@pytest.fixture(scope="module")
def llm(model_path):
    m = Llama(model_path, n_ctx=64, n_threads=2, verbose=False, sparse="off")
    yield m
    m.close()


def test_timer_counts_every_op_and_changes_nothing(llm):
    be, ctx = llm.engine, llm.engine.ctx
    toks = llm.tokenize(b"The capital of France is", add_bos=False)
    be.truncate(0)
    plain = be.eval(toks).copy()
    assert ctx.profile() is None  # off by default
    ctx.set_profile(True)
    try:
        be.truncate(0)
        t = time.perf_counter()
        timed = be.eval(toks).copy()
        wall_ms = 1e3 * (time.perf_counter() - t)
        prof = ctx.profile()
        L = 30  # SmolLM2-135M's layers
        calls = {op: n for op, (_, n) in prof.items()}
        assert calls == {
            "embed": 1,
            "rope_cache": 1,
            "norm": 2 * L,
            "qkv": L,
            "rope": L,
            "attn": L,
            "attn_out": L,
            "ffn_gate_up": L,
            "ffn_act": L,
            "ffn_down": L,
            "ffn_sparse": 0,
            "output": 1,
            "device": 0,
        }
        assert all(prof[op][0] > 0 for op in ("qkv", "attn", "ffn_gate_up", "ffn_down", "output"))
        assert sum(ms for ms, _ in prof.values()) <= wall_ms  # laps never overlap
        assert np.array_equal(timed, plain)  # same bits with the timer on
        ctx.profile(reset=True)
        assert all(v == (0.0, 0) for v in ctx.profile().values())
    finally:
        ctx.set_profile(False)
    assert ctx.profile() is None


def test_profile_ops_table(model_path):
    r = run_profile_ops(model_path, n_threads=2, n_decode=3, n_prefill=8)
    assert r["mode"] == "dense" and r["decode"]["tokens"] == 3 and r["prefill"]["tokens"] == 8
    for phase in ("decode", "prefill"):
        p = r[phase]
        assert 0 < p["timed_ms_per_token"] <= p["wall_ms_per_token"]
        assert p["ops"]["qkv"]["calls_per_token"] == 30 / (1 if phase == "decode" else 8)
    assert r["decode"]["ops"]["output"]["calls_per_token"] == 1  # the head runs for the last row only
    text = format_profile(r)
    assert text.splitlines()[1].split()[:3] == ["op", "decode", "ms/tok"] and "ffn_gate_up" in text
