"""Choosing and applying a sparse FFN mode for one context (``Llama(sparse=...)``).

Modes (docs/sparsity.md):

* ``"auto"`` (default): the calibration sidecar when one exists for this model
  (:func:`powerinfer_backend.sparsity.sidecar.sidecar_path`), unless the decode speedup
  calibration measured for its thresholds is below 1 (then dense, saying why in
  ``reason``; a sidecar without a measurement runs sparse); else, for a ReLU-family model
  (activation "relu"/"drelu"), exact sparsity with threshold 0 (a zero activation
  contributes nothing); else dense.
* ``"off"``: dense.
* ``"threshold"``: the sidecar's per-layer |h| thresholds; a ReLU-family model
  without a sidecar uses threshold 0; otherwise an error says to calibrate.
* ``"predictor"``: activation predictors (docs/predictors.md): a PowerInfer file's own
  (``blk.N.fc1/fc2.weight``) or the sidecar's (``powerinfer-backend train-predictor``);
  none → ValueError saying to train them. ``"auto"`` uses predictors when the model
  file has them or the sidecar has them.
* ``"exact"``: every layer over the transposed down with threshold 0 (only exact
  zeros skipped): the FFN arithmetic of a device split (docs/placement.md), on the
  CPU; a placed context uses it whenever the mode would be dense.
* a path: that sidecar file (threshold mode).

The down projection of a sparse layer runs over the cached transposed copy
(:mod:`powerinfer_backend.engine.down_cache`, type by
:func:`~powerinfer_backend.engine.down_cache.down_t_dtype`: Q8_0 for a quantized ffn_down,
F16 for an F16/BF16 one, F32 for an F32 model), built on first use; ``stats()`` reports
the type in use as ``"down_t_type"``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

if TYPE_CHECKING:
    from .predictors import PredictorSet

__all__ = ["MODES", "SparseState", "configure"]

MODES = ("auto", "off", "threshold", "predictor", "exact")
_RELU_FAMILY = ("relu", "drelu")


@dataclass
class SparseState:
    """What :func:`configure` set up.

    Attributes:
        mode: "dense", "threshold", "predictor" or "exact".
        thresholds: float32 (n_layer,) per-layer |h| thresholds (None when dense).
        sidecar: the sidecar file used, if any.
        expected_sparsity: the sidecar's mean expected FFN sparsity (None if unknown).
        reason: why ``"auto"`` chose this mode: no sidecar for a gated FFN, or a measurement
            (e.g. the sidecar's thresholds decoded slower than dense at calibration); else None.
        decode_speedup: the sidecar's measured decode speedup over dense (None if unmeasured).
        notices: warnings for the user (``Llama`` raises them at the caller's line), e.g. a
            sidecar asked for by name whose calibration measured it slower than dense.
    """

    mode: str = "dense"
    thresholds: Optional[np.ndarray] = None
    sidecar: Optional[str] = None
    expected_sparsity: Optional[float] = None
    info: dict = field(default_factory=dict)
    predictors: Optional[PredictorSet] = None  # in predictor mode
    reason: Optional[str] = None
    decode_speedup: Optional[float] = None
    notices: list = field(default_factory=list)

    def summary(self) -> str:
        """One line for ``verbose`` output."""
        if self.mode == "dense":
            return "sparse FFN off (dense)" + (f": {self.reason}" if self.reason else "")
        if self.mode == "predictor":
            n = len(self.predictors.layers) if self.predictors is not None else 0
            exp = "" if self.expected_sparsity is None else f", expected FFN sparsity {self.expected_sparsity:.1%}"
            return f"sparse FFN predictor mode from {self.sidecar}: {n} layers with predictors{exp}"
        if self.mode == "exact":
            return "FFN over the transposed down, threshold 0 (the arithmetic of a device split)"
        n_sparse = int((self.thresholds > 0).sum()) if self.thresholds is not None else 0
        src = f"sidecar {self.sidecar}" if self.sidecar else "exact zeros of the ReLU activation"
        exp = "" if self.expected_sparsity is None else f", expected FFN sparsity {self.expected_sparsity:.1%}"
        ppl = ""
        if self.info.get("ppl_dense") and self.info.get("ppl_sparse"):
            ppl = f", calibrated perplexity {self.info['ppl_sparse'] / self.info['ppl_dense'] - 1:+.2%}"
        speed = "" if self.decode_speedup is None else f", measured decode {self.decode_speedup:.2f}x dense"
        return f"sparse FFN {self.mode} mode from {src}: {n_sparse} thresholded layers{exp}{ppl}{speed}"


def _resolve(sparse, model_path: str, act: str):
    """-> (mode, sidecar path or None). Raises ValueError / NotImplementedError."""
    from .sidecar import sidecar_path

    if sparse is None or sparse is False:
        sparse = "off"
    if sparse is True:
        sparse = "threshold"
    if isinstance(sparse, os.PathLike) or (isinstance(sparse, str) and sparse not in MODES):
        path = os.fspath(sparse)
        if isinstance(sparse, str) and os.sep not in path and not path.endswith(".gguf"):
            raise ValueError(f"sparse must be one of {', '.join(MODES)} or a sidecar path, got {sparse!r}")
        return "threshold", path
    if not isinstance(sparse, str):
        raise ValueError(f"sparse must be one of {', '.join(MODES)} or a sidecar path, got {sparse!r}")
    if sparse == "off":
        return "dense", None
    if sparse == "exact":
        return "exact", None
    found = sidecar_path(model_path)
    have = found.is_file()
    if sparse == "predictor":
        return "predictor", str(found) if have else None
    if sparse == "threshold" and not have and act not in _RELU_FAMILY:
        raise ValueError(
            f"sparse='threshold' needs a calibration sidecar for {model_path} (looked for {found}); "
            f"run `powerinfer-backend calibrate --model {model_path} --text FILE` first"
        )
    if have:
        return "threshold", str(found)
    return ("threshold", None) if act in _RELU_FAMILY else ("dense", None)


def configure(ctx, gguf, model_path: str, sparse="auto", *, row_groups: bool = False) -> SparseState:
    """Make ``ctx`` (a :class:`~powerinfer_backend.engine.native.NativeContext` of ``gguf``)
    sparse as ``sparse`` asks (see the module docstring). ``row_groups``: the dense products
    will run in row groups (``NativeModel.repack``), so a sidecar's speedup measured against
    the file's rows is stale and "auto" does not rely on it.

    Raises:
        ValueError: unknown mode; a sidecar that is missing, malformed, made for
            another model (checked by SHA-256) or for another activation or
            layer count. NotImplementedError: "predictor".
    """
    from ..engine.down_cache import dense_down_cheaper, down_t_dtype, transposed_down
    from .sidecar import read_sidecar

    hp = gguf.hparams
    mode, path = _resolve(sparse, model_path, hp.act_name)
    from ..loader.pwri import has_predictors

    if sparse == "auto" and has_predictors(gguf):
        mode = "predictor"
    if mode == "dense":
        if sparse == "auto":  # a gated FFN without a sidecar: say what would make it sparse
            return SparseState(
                reason="no calibration sidecar for this model (`powerinfer-backend calibrate` makes one)"
            )
        return SparseState()
    pred_reason = None
    if sparse == "auto" and mode != "predictor" and path is not None and _sidecar_has_predictors(path):
        pred_reason = _predictors_slower(path, row_groups)
        if pred_reason is None:
            return _configure_predictor(ctx, gguf, model_path, path)
    if mode == "predictor":
        return _configure_predictor(ctx, gguf, model_path, path)
    if path is not None:
        try:
            prof = read_sidecar(path, model_path=model_path)
        except ValueError as e:
            if sparse != "auto":
                raise
            # "auto" found a stale sidecar (e.g. the model file was replaced): run dense, say why
            warnings.warn(f"{e}; running dense", stacklevel=3)
            return SparseState()
        if prof.n_layer != hp.n_layer or prof.neuron_freq.shape[1] != hp.n_ff:
            raise ValueError(
                f"sparsity sidecar {path}: {prof.n_layer} layers x {prof.neuron_freq.shape[1]} "
                f"neurons, the model has {hp.n_layer} x {hp.n_ff}"
            )
        if prof.ffn_act != hp.act_name:
            raise ValueError(
                f"sparsity sidecar {path} was calibrated for activation {prof.ffn_act!r}, "
                f"the model uses {hp.act_name!r}"
            )
        thresholds = prof.thresholds
        state = SparseState(
            "threshold",
            thresholds,
            str(path),
            float(prof.layer_sparsity.mean()),
            prof.info,
            decode_speedup=prof.info.get("decode_speedup"),
        )
        measured = _slower_than_dense(prof.info, row_groups)
        no_thresholds = pred_reason is not None and not np.any(thresholds > 0) and hp.act_name not in _RELU_FAMILY
        if sparse == "auto" and (measured or no_thresholds):
            slower = (
                "the sidecar has no calibrated thresholds"  # a predictors-only sidecar
                if no_thresholds
                else f"{measured}; sparse='threshold' forces them"
            )
            reason = slower if pred_reason is None else f"{pred_reason}; {slower}"
            return SparseState(
                sidecar=str(path),
                expected_sparsity=state.expected_sparsity,
                info=prof.info,
                reason=reason,
                decode_speedup=state.decode_speedup,
            )
        if measured and sparse != "auto":  # asked for by name: run them, but say what calibration measured
            state.notices.append(f"{measured}; running them as asked (sparse='auto' would run dense)")
        if pred_reason is not None:
            state.reason = pred_reason
    else:
        thresholds = np.zeros(hp.n_layer, np.float32)
        state = SparseState(mode, thresholds)
    exact_zeros = hp.act_name in _RELU_FAMILY or mode == "exact"
    dtype = down_t_dtype(gguf)
    on = state.info.get("threshold_on", "product")
    ctx.set_ffn_threshold_on(on)
    for layer in range(hp.n_layer):
        if thresholds[layer] > 0 or exact_zeros:
            ctx.set_ffn_sparsity(layer, transposed_down(gguf, layer, dtype=dtype), float(thresholds[layer]))
            # the gate form at a high expected density: its skipped neurons still save their up rows,
            # but the dense down over ffn_down reads fewer bytes than the kept down_t rows. Not the
            # product form: calibration chose its thresholds measuring the down_t arithmetic, and the
            # dense down's Q8_0-quantized h moved SmolLM2's held-out perplexity past the budget
            # (+2.37% vs +2% in tests/sparsity/test_calibrate.py)
            if (
                on == "gate"
                and path is not None
                and dense_down_cheaper(gguf, layer, dtype, 1.0 - float(prof.layer_sparsity[layer]))
            ):
                ctx.set_ffn_down_dense(layer, True)
    return state


def _stale(info: dict, row_groups: bool, what: str) -> Optional[str]:
    """Why a measured speedup no longer holds: measured against dense over the file's rows,
    where dense now runs in row groups (faster); None when it still holds or was not measured."""
    if not row_groups or info.get("decode_speedup") is None or info.get("speed_dense_layout") == "row groups":
        return None
    return (
        f"sidecar's {what} measured {info['decode_speedup']:.2f}x a dense decode over the file's rows; dense now "
        f"runs in row groups (repack), faster: recalibrate to measure again"
    )


def _slower_than_dense(info: dict, row_groups: bool = False) -> Optional[str]:
    """Why "auto" should not use a sidecar's thresholds: calibration measured them decoding
    slower than dense (speedup < 1), or measured against a dense decode that is now faster
    (:func:`_stale`); None when faster or not measured."""
    stale = _stale(info, row_groups, "thresholds")
    if stale is not None:
        return stale
    speedup = info.get("decode_speedup")
    if speedup is None or speedup >= 1.0:
        return None
    form = info.get("threshold_on", "product")
    return (
        f"sidecar's thresholds ({form} form, expected FFN sparsity {info.get('mean_sparsity', 0.0):.1%}) decoded "
        f"{speedup:.2f}x dense when calibrated on {info.get('speed_host', '?')} with "
        f"{info.get('speed_threads', '?')} threads"
    )


def _predictors_slower(path, row_groups: bool = False) -> Optional[str]:
    """Why "auto" should not use a sidecar's predictors: train-predictor measured them
    decoding slower than dense, or than the sidecar's thresholds, or against a dense decode
    that is now faster (:func:`_stale`); None otherwise."""
    from .sidecar import read_sidecar

    prof = read_sidecar(path)
    stale = _stale(prof.predictors.info, row_groups, "predictors")
    if stale is not None:
        return stale
    p = prof.predictors.info.get("decode_speedup")
    t = prof.info.get("decode_speedup") if np.any(prof.thresholds > 0) else None
    if p is None or p >= max(1.0, t or 0.0):
        return None
    than = "dense" if p < 1.0 else f"the thresholds' {t:.2f}x"
    return (
        f"sidecar's predictors decoded {p:.2f}x dense (slower than {than}) when trained on "
        f"{prof.predictors.info.get('speed_host', '?')}"
    )


def _sidecar_has_predictors(path) -> bool:
    try:
        from .sidecar import read_sidecar

        return read_sidecar(path).predictors is not None
    except ValueError:
        return False


def _configure_predictor(ctx, gguf, model_path, path) -> SparseState:
    from .predictors import apply, pwri_predictors
    from ..loader.pwri import down_t_views, has_predictors
    from .sidecar import read_sidecar

    hp = gguf.hparams
    if has_predictors(gguf):
        pset = pwri_predictors(gguf)
        src, info = gguf.path, {}
    else:
        prof = read_sidecar(path, model_path=model_path) if path is not None else None
        if prof is None or prof.predictors is None:
            if gguf.layer_tensor(0, "ffn_gate") is None:  # no ffn_gate: train-predictor refuses ungated FFNs
                raise ValueError(
                    f"sparse='predictor': {model_path} has no activation predictors, and training them "
                    f"is not available for ungated FFNs ({gguf.arch}) yet; only PowerInfer's own "
                    f"files with blk.N.fc1/fc2.weight run in predictor mode"
                )
            raise ValueError(
                f"sparse='predictor': {model_path} has no activation predictors (no blk.N.fc1.weight "
                f"in the model file or its sidecar); run `powerinfer-backend train-predictor "
                f"--model {model_path} --text FILE` first"
            )
        pset, src, info = prof.predictors, str(path), dict(prof.info)
        info.update(pset.info)
    apply(ctx, gguf, pset, down_t=down_t_views(gguf))
    dens = pset.info.get("density")
    state = SparseState(
        "predictor", np.zeros(hp.n_layer, np.float32), src, None if dens is None else 1.0 - float(np.mean(dens)), info
    )
    state.predictors = pset
    return state


def stats(ctx, state: SparseState, reset: bool = False) -> dict:
    """Measured FFN sparsity of ``ctx`` since the last reset: ``{"mode",
    "ffn_sparsity" (mean over all layers, dense layers count 0), "layers"
    (per-layer fractions of neurons skipped), "neurons_used", "neurons_total",
    "sidecar", "expected_sparsity", "down_t_type" (ggml type name of the transposed down
    the sparse layers read, e.g. "Q8_0"; several joined by "+"; None when no layer reads
    one), "down_dense_layers" (sparse layers whose down product runs over the GGUF
    ffn_down instead: the gate form at a density where that reads fewer bytes),
    "decode_speedup" (measured at calibration, or None), "reason" (why "auto" ran dense:
    no sidecar, or one whose measured decode was slower; or None)}``."""
    used, total = ctx.ffn_stats(reset=False, per_layer=True)
    frac = np.where(total > 0, 1.0 - used / np.maximum(total, 1), 0.0)
    extra = {}
    if state.mode == "predictor":
        ps = ctx.predictor_stats(reset=reset)
        pred = ps["predicted"]
        has = np.zeros(len(total), bool)
        if state.predictors is not None:
            has[[x for x in state.predictors.layers if x < len(has)]] = True
        dens = np.where(has & (total > 0), pred / np.maximum(total, 1), 1.0)  # no predictor: every neuron
        extra = {
            "predicted_density": [round(float(x), 6) for x in dens],
            "predictor_ns": int(ps["pred_ns"].sum()),
            "sparse_ffn_ns": int(ps["ffn_ns"].sum()),
            "predictor_share_of_ffn": float(ps["pred_ns"].sum() / max(1, ps["ffn_ns"].sum())),
        }
    if reset:
        ctx.ffn_stats(reset=True)
    dd = ctx.ffn_down_dense_layers()
    dt = sorted({t for layer, t in ctx.ffn_down_t_types().items() if layer not in dd})
    extra["down_t_type"] = "+".join(dt) if dt else None
    extra["down_dense_layers"] = dd
    return extra | {
        "mode": state.mode,
        "ffn_sparsity": float(frac.mean()) if len(frac) else 0.0,
        "layers": [round(float(x), 6) for x in frac],
        "neurons_used": int(used.sum()),
        "neurons_total": int(total.sum()),
        "sidecar": state.sidecar,
        "expected_sparsity": state.expected_sparsity,
        "decode_speedup": state.decode_speedup,
        "reason": state.reason,
    }
