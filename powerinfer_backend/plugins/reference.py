"""llama.cpp (through llama-cpp-python) as the reference engine for benchmarks and
parity tests, loaded on the same GGUF and thread count as ours.

llama.cpp's *extra buffer types* — its repacked weights (Q4_0, Q4_K, IQ4_NL on AVX2)
with their own GEMM/GEMV kernels, and AMX buffers on CPUs with AMX — are on by default
in llama.cpp, and so they are here (``extra_buffer_types="auto"``), so that benchmarks
compare against llama.cpp as users run it. Where they crash (AMX kernels inside VMs
that report AMX without granting it) they are turned off: a probe in a child process
(:mod:`.reference_probe`: a tiny model with those types, loaded with them on, a prompt
and a token evaluated, logits checked against the plain kernels) decides, once per
process and cached on disk per CPU and llama-cpp-python version. The returned
``Llama`` says which it was (:func:`reference_mode`).

Parity tests pass ``extra_buffer_types=False``: ours follows the numerics of llama.cpp's
plain CPU kernels; the repacked ones sum in another order.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import warnings

from .reference_probe import FORCE_FAIL_ENV, use_extra_buffer_types

#: seconds the probe child may take before it counts as failed (a hang)
PROBE_TIMEOUT_S = 120.0
_PROBE_VERSION = 1  # bump when the probe changes what it checks: old cached verdicts are ignored
_verdicts: dict[str, dict] = {}  # per process: cache key -> verdict


class ReferenceProbeWarning(RuntimeWarning):
    """llama.cpp's extra buffer types failed the probe: the reference runs without them."""


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _cache_key() -> str:
    import llama_cpp

    text = f"{_PROBE_VERSION}|{llama_cpp.__version__}|{_cpu_flags()}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_file():
    from ..loader.artifacts import cache_root

    return cache_root() / "reference_probe.json"


def _read_disk(key: str) -> dict | None:
    try:
        v = json.loads(_cache_file().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return v if isinstance(v, dict) and isinstance(v.get("ok"), bool) else None


def _write_disk(key: str, verdict: dict) -> None:
    from ..loader.artifacts import atomic_write_json

    path = _cache_file()
    try:
        try:
            table = json.loads(path.read_text())
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table[key] = verdict
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, table)
    except OSError:  # a read-only cache only costs a probe per process
        pass


def _run_probe(n_threads: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "powerinfer_backend.plugins.reference_probe", str(int(n_threads))]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "reason": f"the probe child did not finish within {timeout:g} s", "transient": True}
    if p.returncode == 0:
        return {"ok": True, "reason": "probe passed"}
    if p.returncode < 0:
        try:
            how = f"was killed by {signal.Signals(-p.returncode).name}"
        except ValueError:
            how = f"was killed by signal {-p.returncode}"
    else:
        how = f"exited with status {p.returncode}"
    # a failed check's one-line reason (a killed child's stderr is at most a stack dump)
    tail = p.stderr.strip().splitlines()[-1:] if p.stderr and p.returncode > 0 else []
    return {"ok": False, "reason": f"the probe child {how}" + (f": {tail[0]}" if tail else "")}


def extra_buffer_types_work(n_threads: int = 2, *, timeout: float = PROBE_TIMEOUT_S) -> dict:
    """Whether llama.cpp's extra buffer types work on this CPU, by the child-process probe
    (:mod:`.reference_probe`), run once per process and cached on disk
    (``$XDG_CACHE_HOME/powerinfer_backend/reference_probe.json``) per CPU flags and
    llama-cpp-python version (a timeout only for the process: it may be a loaded host).

    Returns ``{"ok": bool, "reason": str, "cached": "process" | "disk" | None}``.
    With ``POWERINFER_REFERENCE_PROBE_FAIL=1`` (tests) the child aborts and no cache is
    read or written.
    """
    if os.environ.get(FORCE_FAIL_ENV) == "1":
        v = _run_probe(n_threads, timeout)
        v.pop("transient", None)
        return {**v, "cached": None}
    key = _cache_key()
    if key in _verdicts:
        return {**_verdicts[key], "cached": "process"}
    disk = _read_disk(key)
    if disk is not None:
        _verdicts[key] = disk
        return {**disk, "cached": "disk"}
    v = _run_probe(n_threads, timeout)
    transient = v.pop("transient", False)  # a hang may be a loaded host: kept for this process only
    _verdicts[key] = v
    if not transient:
        _write_disk(key, v)
    return {**v, "cached": None}


def reference_mode(llm) -> dict:
    """How :func:`load_reference` loaded ``llm``: ``{"extra_buffer_types": bool, "reason": str}``
    (``"requested"`` when the caller chose, else the probe's verdict)."""
    return dict(getattr(llm, "_powerinfer_reference_mode", {"extra_buffer_types": None, "reason": "unknown"}))


def load_reference(model_path: str, *, extra_buffer_types="auto", **kwargs):
    """A ``llama_cpp.Llama`` on ``model_path`` (kwargs as for llama_cpp.Llama).

    Args:
        extra_buffer_types: ``"auto"`` (default): on, as llama.cpp's default, unless the
            probe (:func:`extra_buffer_types_work`) fails on this CPU — then off, with a
            :class:`ReferenceProbeWarning` naming the failure. True / False: on / off
            without a probe (parity tests: False, llama.cpp's plain CPU kernels).

    :func:`reference_mode` gives the mode the returned object runs in.

    Raises:
        ValueError: the file's vocabulary would abort llama.cpp or it refuses it
            (:func:`powerinfer_backend.loader.vocab.check_vocab`), llama-cpp-python
            cannot load the file, or ``extra_buffer_types`` is not "auto", True or False.
    """
    from ..loader.vocab import check_vocab
    from ..text.tokenizer import llama_cpp_class

    if extra_buffer_types not in ("auto", True, False):
        raise ValueError(f"extra_buffer_types must be 'auto', True or False, got {extra_buffer_types!r}")
    check_vocab(model_path)
    if extra_buffer_types == "auto":
        v = extra_buffer_types_work(int(kwargs.get("n_threads") or 2))
        on, reason = v["ok"], v["reason"]
        if not on:
            warnings.warn(
                f"llama.cpp's extra buffer types (repacked weights, AMX) failed a probe in a child "
                f"process ({reason}); the llama.cpp reference runs with them off",
                ReferenceProbeWarning,
                stacklevel=2,
            )
    else:
        on, reason = bool(extra_buffer_types), "requested"

    kwargs.setdefault("verbose", False)
    with use_extra_buffer_types(on):
        llm = llama_cpp_class()(model_path=model_path, **kwargs)
    llm._powerinfer_reference_mode = {"extra_buffer_types": on, "reason": reason}
    return llm
