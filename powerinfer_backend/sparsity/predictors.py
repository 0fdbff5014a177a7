"""Activation predictors (Deja Vu, ICML'23; PowerInfer, SOSP'24): per FFN layer a
bias-free low-rank MLP, ``score = fc2 . relu(fc1 . x)`` on the normed FFN input x;
neuron j is computed only when ``score_j >= threshold`` (docs/predictors.md).

Shapes follow PowerInfer's GGUF tensors: ``blk.N.fc1.weight`` ne [n_embd, rank]
(numpy (rank, n_embd)), ``blk.N.fc2.weight`` ne [rank, n_ff] (numpy (n_ff, rank)).

* :func:`scores` / :func:`scores_reference`: the C evaluation (from
  :mod:`powerinfer_backend.engine.scores`) and a numpy reference.
* :class:`PredictorSet`: per-layer weights + thresholds, validated against a model.
* :func:`pwri_predictors`: the set stored in a PowerInfer file.
* :func:`apply`: install a set into a :class:`~powerinfer_backend.engine.native.NativeContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..engine.scores import quantize_q8_0, scores
from ..loader.pwri import pwri_threshold

__all__ = [
    "scores",
    "scores_reference",
    "PredictorSet",
    "apply",
    "validate_layer",
    "quantize_q8_0",
    "as_float",
    "pwri_predictors",
]


def as_float(w) -> np.ndarray:
    """ndarray (as is) or TensorView (dequantized float32, numpy shape (rows, cols))."""
    return w if isinstance(w, np.ndarray) else w.to_float32()


def scores_reference(fc1: np.ndarray, fc2: np.ndarray, x: np.ndarray) -> np.ndarray:
    """numpy (float64) reference of :func:`scores`. F16 weights see an F16-rounded x,
    as the C path converts x to the F16 activation type."""
    x = np.atleast_2d(np.asarray(x, np.float32))
    x1 = x.astype(np.float16) if fc1.dtype == np.float16 else x
    z = np.maximum(x1.astype(np.float64) @ fc1.astype(np.float64).T, 0.0).astype(np.float32)
    z2 = z.astype(np.float16) if fc2.dtype == np.float16 else z
    return (z2.astype(np.float64) @ fc2.astype(np.float64).T).astype(np.float32)


def validate_layer(layer: int, fc1_shape, fc2_shape, n_embd: int, n_ff: int) -> int:
    """Check numpy shapes (rank, n_embd) / (n_ff, rank) of layer ``layer``'s predictor;
    returns the rank. Raises ValueError naming the layer and tensor."""
    n1, n2 = f"blk.{layer}.fc1.weight", f"blk.{layer}.fc2.weight"
    if len(fc1_shape) != 2 or fc1_shape[1] != n_embd or fc1_shape[0] < 1:
        raise ValueError(
            f"layer {layer}: tensor {n1} has shape (rank, n_embd) = {tuple(fc1_shape)}, expected (rank, {n_embd})"
        )
    if len(fc2_shape) != 2 or fc2_shape[0] != n_ff:
        raise ValueError(
            f"layer {layer}: tensor {n2} has shape (n_ff, rank) = {tuple(fc2_shape)}, expected ({n_ff}, rank)"
        )
    if fc2_shape[1] != fc1_shape[0]:
        raise ValueError(
            f"layer {layer}: tensor {n2} has rank {fc2_shape[1]}, {n1} has rank {fc1_shape[0]} (rank mismatch)"
        )
    return int(fc1_shape[0])


@dataclass
class PredictorSet:
    """Predictors for (some) layers of one model.

    Attributes:
        fc1, fc2: layer -> ndarray (rank, n_embd) / (n_ff, rank), float32 or float16,
            or a TensorView (ne [n_embd, rank] / [rank, n_ff]).
        thresholds: layer -> score threshold.
        info: per-layer measurements (precision, recall, density, ...) and provenance.
    """

    fc1: dict = field(default_factory=dict)
    fc2: dict = field(default_factory=dict)
    thresholds: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    source: Optional[str] = None

    @property
    def layers(self) -> list[int]:
        return sorted(self.fc1)

    def validate(self, n_layer: int, n_embd: int, n_ff: int, *, require_all: bool = False) -> None:
        """Raises ValueError naming the layer and tensor for a missing or misshapen
        predictor tensor, a layer out of range or (``require_all``) a layer missing."""
        for layer in sorted(set(self.fc1) | set(self.fc2)):
            if not 0 <= layer < n_layer:
                raise ValueError(f"layer {layer}: predictor for a layer outside [0, {n_layer})")
            if layer not in self.fc1:
                raise ValueError(f"layer {layer}: tensor blk.{layer}.fc1.weight missing (fc2 present)")
            if layer not in self.fc2:
                raise ValueError(f"layer {layer}: tensor blk.{layer}.fc2.weight missing (fc1 present)")
            validate_layer(layer, _np_shape(self.fc1[layer]), _np_shape(self.fc2[layer]), n_embd, n_ff)
        if require_all:
            for layer in range(n_layer):
                if layer not in self.fc1:
                    raise ValueError(
                        f"layer {layer}: tensor blk.{layer}.fc1.weight missing (predictors must cover every layer)"
                    )


def _np_shape(obj) -> tuple:
    if isinstance(obj, np.ndarray):
        return obj.shape
    return tuple(reversed(obj.ne))


def apply(ctx, gguf, pset: PredictorSet, product_thresholds=None, down_t=None) -> None:
    """Make every layer of ``pset`` predictor-sparse in ``ctx`` (the transposed down
    from :mod:`powerinfer_backend.engine.down_cache`; ``product_thresholds`` per layer, default 0:
    every predicted neuron with a nonzero h is used)."""
    from ..engine.down_cache import down_t_dtype, transposed_down

    hp = gguf.hparams
    pset.validate(hp.n_layer, hp.n_embd, hp.n_ff)
    dtype = down_t_dtype(gguf)
    for layer in pset.layers:
        thr = 0.0 if product_thresholds is None else float(product_thresholds[layer])
        dt = (down_t or {}).get(layer)
        ctx.set_ffn_sparsity(layer, dt if dt is not None else transposed_down(gguf, layer, dtype=dtype), thr)
        ctx.set_ffn_predictor(layer, pset.fc1[layer], pset.fc2[layer], float(pset.thresholds.get(layer, 0.0)))


def pwri_predictors(gguf) -> PredictorSet:
    """The predictors of a PowerInfer file, one per layer, threshold from
    ``powerinfer.sparse_threshold`` (0 when absent). Raises ValueError naming the
    layer and tensor when one is missing or misshapen."""
    hp = gguf.hparams
    ex = gguf.extra_tensors
    ps = PredictorSet(source=gguf.path)
    thr = pwri_threshold(gguf)
    for layer in range(hp.n_layer):
        f1, f2 = ex.get(f"blk.{layer}.fc1.weight"), ex.get(f"blk.{layer}.fc2.weight")
        if f1 is None and f2 is None:
            continue
        if f1 is not None:
            ps.fc1[layer] = f1
        if f2 is not None:
            ps.fc2[layer] = f2
        ps.thresholds[layer] = thr
    ps.validate(hp.n_layer, hp.n_embd, hp.n_ff, require_all=True)
    return ps
