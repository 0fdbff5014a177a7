"""The plan cached beside the model: ``placement.json`` in the model's artifact folder
(:mod:`powerinfer_backend.loader.artifacts`), reused while its inputs match
(:func:`plan_for_model`), and the firing frequencies those plans rank neurons by
(:func:`neuron_frequencies`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ...loader.artifacts import (
    artifact_dir,
    artifact_metadata,
    atomic_write_json,
    check_provenance,
    model_fingerprint,
    read_metadata,
)
from .plan import FORMAT_VERSION, Plan
from .planners import _check_int, plan_placement
from .sizes import CPU_BUFT, NEURON_GROUP, ModelSizes, Sizer, _n_cells, _sizer_cells, compute_bytes

__all__ = ["PLAN_NAME", "plan_path", "load_plan", "neuron_frequencies", "plan_for_model"]

PLAN_NAME = "placement.json"


def plan_path(model_path: str | os.PathLike, *, create: bool = False) -> Path:
    """``<artifact dir of the model>/placement.json``."""
    return artifact_dir(model_path, create=create) / PLAN_NAME


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a stored plan. Raises ValueError for a missing or malformed file."""
    p = Path(path)
    try:
        d = json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a readable placement plan ({e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{p}: not a placement plan")
    plan = Plan.from_json(d)
    plan.path = p
    return plan


def neuron_frequencies(
    model_path: str | os.PathLike, *, model=None, sparsity_sidecar: Any = "auto", verbose: bool = False
) -> tuple[np.ndarray | None, str]:
    """The firing frequencies placement ranks neurons by, and their source name:
    the calibration sidecar's ``neuron_freq`` ("sidecar:<sha256>"); else, with
    ``sparsity_sidecar="auto"``, PowerInfer's ``<model>.generated.gpuidx`` beside the
    model (its GPU neurons 1, the rest 0: "gpuidx:<sha256>"); else None ("uniform").

    Raises:
        ValueError: a sidecar for another model, or a malformed gpuidx file.
    """
    from ...loader.pwri import gpuidx_path, read_gpuidx
    from ...sparsity.sidecar import read_sidecar, sidecar_path

    sc = None
    if sparsity_sidecar == "auto":
        cand = sidecar_path(model_path)
        sc = cand if cand.is_file() else None
    elif sparsity_sidecar is not None:
        sc = Path(sparsity_sidecar)
    if sc is not None:
        prof = read_sidecar(sc, model_path=model_path)
        return prof.neuron_freq, "sidecar:" + model_fingerprint(sc)
    gpuidx = Path(gpuidx_path(model_path))
    if sparsity_sidecar == "auto" and gpuidx.is_file():
        # PowerInfer's own hot/cold split: its hot neurons rank first (frequency 1)
        from ...loader import load_gguf

        g = model if model is not None else load_gguf(model_path, verbose=verbose)
        try:
            idx = read_gpuidx(gpuidx, g.hparams.n_layer, g.hparams.n_ff)
        finally:
            if model is None:
                g.close()
        return np.stack([np.asarray(m, np.float64) for m in idx.gpu_idx]), "gpuidx:" + model_fingerprint(gpuidx)
    return None, "uniform"


def plan_for_model(
    model_path: str | os.PathLike,
    vram_budget: int,
    *,
    n_ctx: int,
    n_batch: int,
    model=None,
    sizes: ModelSizes | None = None,
    neuron_freq: np.ndarray | None = None,
    freq_source: str | None = None,
    sparsity_sidecar: str | os.PathLike | None = "auto",
    reset_gpu_index: bool = False,
    disable_gpu_index: bool = False,
    out: str | os.PathLike | None = None,
    sizer: Sizer = CPU_BUFT,
    verbose: bool = False,
    placement: str = "neurons",
    device_gbps: float | None = None,
    host_gbps: float | None = None,
    mode: str = "dense",
    predictor_bytes: int = 0,
    sync_s: float = 0.0,
    device_skips: bool | None = None,
) -> Plan:
    """The plan for the model file at ``model_path``, cached in its artifact folder.

    The stored plan (``out`` or :func:`plan_path`) is reused when its recorded inputs
    equal this call's: plan format, model SHA-256, budget, n_ctx, n_batch,
    disable_gpu_index, the frequency source (the sidecar's SHA-256, or "uniform"),
    the device (the sizer's name, alignment and compute bytes), the group constant, the
    KV type and the layers whose down the host sums (``ModelSizes.host_down_from``), and
    with ``placement="auto"`` the bandwidths, mode and round trip. Otherwise it is computed with
    :func:`plan_placement` (or :func:`~.auto.plan_auto`) and written atomically with provenance.

    Args:
        vram_budget: bytes (int >= 0; see :func:`resolve_budget` for user input).
        model: the loaded GGUFModel (loaded here when None).
        sizes: the model's sizes as the context to be placed holds it
            (:meth:`ModelSizes.of_context`: its KV type); None: :meth:`ModelSizes.from_gguf`.
        neuron_freq: frequencies to use instead of a sidecar's; then ``freq_source``
            names them in the cache key (default: a hash of the array).
        sparsity_sidecar: "auto" (the model's sidecar when present, else PowerInfer's
            ``<model>.generated.gpuidx`` beside it - its GPU neurons rank first -, else
            uniform), a sidecar path, or None (uniform).
        reset_gpu_index: recompute and overwrite even when a stored plan matches,
            and overwrite a plan recorded for another model.
        disable_gpu_index: no FFN neurons on the device.
        sizer: the device's byte rule (:class:`~.sizes.Sizer`); default ggml's CPU
            buffer type (:data:`~.sizes.CPU_BUFT`, for planning without a device).
        placement: "neurons" (:func:`plan_placement`) or "auto" (:func:`~.auto.plan_auto`:
            the fastest predicted of the throughput planner, the neuron plan and the layer
            split, with ``device_gbps`` / ``host_gbps`` in GB/s and the CPU half's FFN
            ``mode``, :data:`~.predict.MODES`; mode "predictor" with ``predictor_bytes``, one
            layer's predictor bytes read per token, and ``sync_s`` seconds per split layer
            and token, the device's round trip: :func:`~.bandwidth.device_sync`; with
            ``device_skips`` None the cost model chooses whether a predictor context's device
            skips unselected hot neurons, else as given: :func:`~.auto.plan_auto`).

    Raises:
        ValueError: bad arguments, a sidecar for another model, or a stored plan
            made from another model (without ``reset_gpu_index``).
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    if neuron_freq is not None:
        if freq_source is None:
            freq_source = "array:" + hashlib.sha256(np.ascontiguousarray(neuron_freq, np.float32).tobytes()).hexdigest()
    else:
        neuron_freq, freq_source = neuron_frequencies(
            model_path, model=model, sparsity_sidecar=sparsity_sidecar, verbose=verbose
        )
    fp = model_fingerprint(model_path)
    if sizes is None:
        own = model is None
        if own:
            from ...loader import load_gguf

            model = load_gguf(model_path, verbose=verbose)
        try:
            sizes = ModelSizes.from_gguf(model)
        finally:
            if own:
                model.close()
    inputs = {
        "format_version": FORMAT_VERSION,
        "model_sha256": fp,
        "vram_budget": budget,
        "n_ctx": int(n_ctx),
        "n_batch": int(n_batch),
        "disable_gpu_index": bool(disable_gpu_index),
        "freq_source": freq_source,
        "device": sizer.name,
        "align": int(sizer.alignment),
        "compute_bytes": compute_bytes(sizes, n_ctx, n_batch, sizer),
        "group": NEURON_GROUP,
        "kv_type": sizes.kv_type,
        "host_down_from": list(sizes.host_down_from),
    }
    cells = _sizer_cells(n_ctx, sizer)
    if cells != _n_cells(n_ctx):  # parallel sequences: their slots' KV cells (n_seq_max)
        inputs["kv_cells"] = cells
    if placement == "auto":
        if device_gbps is None or host_gbps is None:
            raise ValueError("placement='auto' needs device_gbps and host_gbps")
        inputs.update(placement="auto", device_gbps=float(device_gbps), host_gbps=float(host_gbps), mode=mode)
        if predictor_bytes:
            inputs["predictor_bytes"] = _check_int("predictor_bytes", predictor_bytes, 0)
        if sync_s:
            inputs["sync_s"] = float(sync_s)
        if device_skips is not None:
            inputs["device_skips"] = bool(device_skips)
    elif placement != "neurons":
        raise ValueError(f"plan_for_model: placement must be 'neurons' or 'auto', got {placement!r}")
    path = Path(out) if out is not None else plan_path(model_path, create=True)
    if path.is_file() and not reset_gpu_index:
        meta = read_metadata(path) or {}
        if meta.get("inputs") == inputs:
            try:
                plan = load_plan(path)
                plan.cached = True
                return plan
            except ValueError:
                pass  # unreadable: recompute
    check_provenance(
        path, fp, force=reset_gpu_index, model_path=model_path, force_hint="reset_gpu_index=True (--reset-gpu-index)"
    )
    if placement == "auto":
        from .auto import plan_auto

        assert device_gbps is not None and host_gbps is not None  # checked with the inputs above
        plan = plan_auto(
            sizes,
            neuron_freq,
            budget,
            n_ctx=n_ctx,
            n_batch=n_batch,
            device_gbps=device_gbps,
            host_gbps=host_gbps,
            mode=mode,
            sizer=sizer,
            disable_gpu_index=disable_gpu_index,
            predictor_bytes=predictor_bytes,
            sync_s=sync_s,
            device_skips=device_skips,
        )
    else:
        plan = plan_placement(
            sizes, neuron_freq, budget, n_ctx=n_ctx, n_batch=n_batch, disable_gpu_index=disable_gpu_index, sizer=sizer
        )
    plan.inputs = inputs
    d = plan.to_json()
    d.update(artifact_metadata(model_path, inputs=inputs))
    d["inputs"] = inputs
    atomic_write_json(path, d)
    plan.path = path
    return plan
