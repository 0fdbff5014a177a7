"""The llama.cpp reference's mode: extra buffer types (repacked weights) on where the
child-process probe passes, off with a warning where it fails (a real child that
aborts, forced by POWERINFER_REFERENCE_PROBE_FAIL=1)."""

from __future__ import annotations

import json

import pytest

from powerinfer_backend.plugins import reference
from powerinfer_backend.plugins.reference import (
    ReferenceProbeWarning,
    extra_buffer_types_work,
    load_reference,
    reference_mode,
)
from powerinfer_backend.plugins.reference_probe import FORCE_FAIL_ENV


def test_extra_buffer_types_follow_the_probe(model_path, xdg_cache, monkeypatch, recwarn):
    monkeypatch.setattr(reference, "_verdicts", {})  # this process has not probed yet
    verdict = extra_buffer_types_work(2)
    assert verdict["cached"] is None  # a fresh cache folder: the child ran
    stored = json.loads((xdg_cache / "powerinfer_backend" / "reference_probe.json").read_text())
    assert [{"ok": verdict["ok"], "reason": verdict["reason"]}] == list(stored.values())

    ref = load_reference(model_path, n_ctx=32, n_threads=2, n_threads_batch=2)
    try:
        # the probe passes on every CPU but AMX-in-a-VM hosts: then on, as llama.cpp's default
        assert reference_mode(ref) == {"extra_buffer_types": verdict["ok"], "reason": verdict["reason"]}
        assert ref.model_params.use_extra_bufts is verdict["ok"]  # what llama.cpp was given
    finally:
        ref.close()
    assert extra_buffer_types_work(2)["cached"] == "process"  # no second child in this process
    monkeypatch.setattr(reference, "_verdicts", {})
    assert extra_buffer_types_work(2) == {**verdict, "cached": "disk"}  # nor in the next one
    if verdict["ok"]:
        assert verdict["reason"] == "probe passed" and not [w for w in recwarn if w.category is ReferenceProbeWarning]


def test_failing_probe_turns_them_off_with_a_message(model_path, xdg_cache, monkeypatch):
    monkeypatch.setenv(FORCE_FAIL_ENV, "1")  # the child aborts: SIGABRT, as a crash in a kernel would
    with pytest.warns(
        ReferenceProbeWarning,
        match=r"failed a probe in a child process \(the probe child was "
        r"killed by SIGABRT.*\); the llama.cpp reference runs "
        r"with them off",
    ):
        ref = load_reference(model_path, n_ctx=32, n_threads=2, n_threads_batch=2)
    try:
        mode = reference_mode(ref)
        assert mode["extra_buffer_types"] is False and "SIGABRT" in mode["reason"]
        assert ref.model_params.use_extra_bufts is False
        ref.eval(ref.tokenize(b"Hello"))  # and the reference still runs
    finally:
        ref.close()
    assert not (xdg_cache / "powerinfer_backend" / "reference_probe.json").exists()  # a forced verdict is not kept


def test_explicit_mode_skips_the_probe(model_path, monkeypatch):
    monkeypatch.setenv(FORCE_FAIL_ENV, "1")  # a probe would fail and warn
    ref = load_reference(model_path, n_ctx=32, extra_buffer_types=True)
    try:
        assert reference_mode(ref) == {"extra_buffer_types": True, "reason": "requested"}
        assert ref.model_params.use_extra_bufts is True
    finally:
        ref.close()
    with pytest.raises(ValueError, match="extra_buffer_types must be 'auto', True or False, got 'yes'"):
        load_reference(model_path, extra_buffer_types="yes")


def test_a_probe_timeout_is_kept_for_the_process_only(xdg_cache, monkeypatch):
    monkeypatch.setattr(reference, "_verdicts", {})
    v = extra_buffer_types_work(2, timeout=0.01)  # a real child, killed long before it could finish
    assert v == {"ok": False, "reason": "the probe child did not finish within 0.01 s", "cached": None}
    assert not (xdg_cache / "powerinfer_backend" / "reference_probe.json").exists()  # a loaded host, maybe
    assert extra_buffer_types_work(2) == {**v, "cached": "process"}
