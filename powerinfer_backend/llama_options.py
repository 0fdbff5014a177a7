"""What a ``llama_cpp.Llama`` caller passes, turned into what our backend takes: the
``Llama`` constructor's keyword checks (warnings for GPU parameters that ``vram_budget``
replaces and for parameters not implemented here) and the options handed to the backend
plugin (docs/api.md, "Differences")."""

from __future__ import annotations

import warnings
from typing import Any, Mapping

import llama_cpp
import numpy as np

from .hybrid.offload import check_device_options
from .hybrid.placement import parse_vram_budget

#: device placement options, passed to the backend (powerinfer_backend.hybrid.offload.offload)
DEVICE_PARAMS = (
    "n_gpu_layers",
    "device",
    "placement",
    "device_threads",
    "reset_gpu_index",
    "disable_gpu_index",
    "device_bandwidth",
    "device_skips",
)
#: engine options, passed to the backend (powerinfer_backend.plugins.hybrid.HybridBackend)
ENGINE_PARAMS = ("repack",)
#: accepted for llama_cpp.Llama compatibility; meaningless here (GPU placement is vram_budget)
GPU_PARAMS = ("split_mode", "main_gpu", "tensor_split", "offload_kqv")

#: llama_cpp.Llama parameters that would change results but are not implemented here:
#: a warning when one is given a value other than llama-cpp-python's default
UNSUPPORTED_DEFAULTS = {
    "kv_overrides": None,
    "lora_base": None,
    "lora_path": None,
    "draft_model": None,
    "tokenizer": None,
    "type_k": None,
    "type_v": None,
    "rope_scaling_type": llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
    "yarn_ext_factor": -1.0,
    "yarn_attn_factor": 1.0,
    "yarn_beta_fast": 32.0,
    "yarn_beta_slow": 1.0,
    "yarn_orig_ctx": 0,
    "vocab_only": False,
}


#: the native context's largest n_ctx (pi_context_create)
N_CTX_MAX = 1 << 24


def _whole(name: str, v: Any, lo: int, hi: int, what: str = "") -> int:
    """``v`` as an int in [lo, hi] (an int or numpy integer, not a bool, not a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}]{what}, got {v!r}")
    return int(v)


def check_sizes(n_ctx: Any, n_batch: Any, n_threads: Any) -> None:
    """Check ``Llama``'s sizes before anything loads: ``n_ctx`` an integer in [0, 2^24]
    (0 = the model's training context), ``n_batch`` >= 1, ``n_threads`` None or an integer
    (<= 0: the default count).

    Raises:
        ValueError: naming the parameter, its range and the value given.
    """
    _whole("n_ctx", n_ctx, 0, N_CTX_MAX, " (0 = the model's training context)")
    _whole("n_batch", n_batch, 1, 2**31 - 1)
    if n_threads is not None:
        _whole("n_threads", n_threads, -(2**31), 2**31 - 1, " (<= 0: the default) or None")


def check_options(vram_budget: Any, rope_freq_base: float, rope_freq_scale: float, kwargs: Mapping[str, Any]) -> None:
    """Validate ``vram_budget`` and warn (at the ``Llama(...)`` caller's line) about GPU
    parameters ignored here and parameters not supported.

    Raises:
        ValueError: a malformed ``vram_budget``, ``placement``, ``device_threads``, ``device_bandwidth`` or
            ``device_skips``, before
            anything loads.
    """
    parse_vram_budget(vram_budget)
    if not isinstance(kwargs.get("repack", True), (bool, np.bool_)):
        raise ValueError(f"repack must be True or False, got {kwargs['repack']!r}")
    check_device_options(
        kwargs.get("placement", "auto"),
        kwargs.get("device_threads", 1),
        kwargs.get("device_bandwidth"),
        kwargs.get("device_skips"),
    )
    gpu = [k for k in GPU_PARAMS if k in kwargs]
    if gpu:
        warnings.warn(f"{', '.join(gpu)} ignored: powerinfer_backend places layers by vram_budget (GiB)", stacklevel=3)
    unsupported = [k for k, d in UNSUPPORTED_DEFAULTS.items() if k in kwargs and kwargs[k] != d]
    unsupported += [k for k, v in (("rope_freq_base", rope_freq_base), ("rope_freq_scale", rope_freq_scale)) if v]
    if unsupported:
        warnings.warn(f"not supported by powerinfer_backend, ignored: {', '.join(unsupported)}", stacklevel=3)


def backend_options(*, kwargs: Mapping[str, Any], **options) -> dict:
    """The backend factory's keyword arguments: ``options`` plus the device placement
    keywords present in ``kwargs`` (:data:`DEVICE_PARAMS`), and ``n_seq_max`` (sequences of the
    native context, docs/api.md) when given and not 1, so backends without it keep their options."""
    seqs = {"n_seq_max": kwargs["n_seq_max"]} if kwargs.get("n_seq_max", 1) != 1 else {}
    return dict(options, **{k: kwargs[k] for k in DEVICE_PARAMS + ENGINE_PARAMS if k in kwargs}, **seqs)
