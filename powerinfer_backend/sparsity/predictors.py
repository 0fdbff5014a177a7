"""Activation predictors (Deja Vu, ICML'23; PowerInfer, SOSP'24): per FFN layer a
bias-free low-rank MLP, ``score = fc2 . relu(fc1 . x)`` on the normed FFN input x;
neuron j is computed only when ``score_j >= threshold`` (docs/predictors.md).

Shapes follow PowerInfer's GGUF tensors: ``blk.N.fc1.weight`` ne [n_embd, rank]
(numpy (rank, n_embd)), ``blk.N.fc2.weight`` ne [rank, n_ff] (numpy (n_ff, rank)).

* :func:`scores` / :func:`scores_reference`: the C evaluation and a numpy reference.
* :class:`PredictorSet`: per-layer weights + thresholds, validated against a model.
* :func:`apply`: install a set into a :class:`~powerinfer_backend.engine.native.NativeContext`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .._native import check, ffi, lib

__all__ = ["scores", "scores_reference", "PredictorSet", "apply", "validate_layer", "quantize_q8_0", "as_float"]

_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
_POOLS: dict[int, object] = {}


def _pool(n_threads: int):
    if n_threads not in _POOLS:
        out = ffi.new("pi_pool **")
        check(lib.pi_pool_create(int(n_threads), out), "pi_pool_create")
        _POOLS[n_threads] = ffi.gc(out[0], lib.pi_pool_free)
    return _POOLS[n_threads]


def quantize_q8_0(w: np.ndarray, name: str = ""):
    """A (rows, cols) float array as a Q8_0 :class:`~powerinfer_backend.loader.gguf_model.TensorView`
    (ne [cols, rows]; cols % 32 == 0), the type the native predictor reads as any matmul
    weight (docs/predictors.md: ``--quantize q8_0``)."""
    from gguf import GGMLQuantizationType, quants

    from ..loader.gguf_model import TensorView

    w = np.ascontiguousarray(w, np.float32)
    if w.ndim != 2 or w.shape[1] % 32:
        raise ValueError(f"{name or 'tensor'}: Q8_0 needs rows whose length is a multiple of 32, got shape {w.shape}")
    q = np.ascontiguousarray(quants.quantize(w, GGMLQuantizationType.Q8_0)).reshape(-1)
    return TensorView(name=name, type=int(GGMLQuantizationType.Q8_0), ne=(w.shape[1], w.shape[0]), data=q,
                      nbytes=int(q.nbytes))


def as_float(w) -> np.ndarray:
    """ndarray (as is) or TensorView (dequantized float32, numpy shape (rows, cols))."""
    return w if isinstance(w, np.ndarray) else w.to_float32()


def _operand(w):
    """-> (type id, buffer, numpy-order shape) for an ndarray (F32/F16) or a TensorView."""
    if isinstance(w, np.ndarray):
        w = np.ascontiguousarray(w)
        if w.dtype not in _TYPES:
            raise ValueError(f"predictor dtype {w.dtype}: expected float32 or float16 (or a quantized TensorView)")
        if w.ndim != 2:
            raise ValueError(f"predictor weights must be 2-D, got shape {w.shape}")
        return _TYPES[w.dtype], w, w.shape
    if len(w.ne) != 2:
        raise ValueError(f"predictor weights must be 2-D, got ne {list(w.ne)}")
    return int(w.type), w.data, (w.ne[1], w.ne[0])


def scores(fc1, fc2, x: np.ndarray, n_threads: int = 1) -> np.ndarray:
    """C predictor scores ``fc2 . relu(fc1 . x)`` for rows x (n_tok, n_embd) float32;
    fc1 (rank, n_embd), fc2 (n_ff, rank), float32 or float16 ndarrays or TensorViews of
    any matmul type (Q8_0: :func:`quantize_q8_0`). -> (n_tok, n_ff) float32."""
    t1, b1, s1 = _operand(fc1)
    t2, b2, s2 = _operand(fc2)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    if s2[1] != s1[0] or x.shape[1] != s1[1]:
        raise ValueError(f"predictor shapes fc1 {s1}, fc2 {s2}, x {x.shape} do not fit")
    rank, n_embd = s1
    n_ff = s2[0]
    out = np.empty((x.shape[0], n_ff), np.float32)
    check(lib.pi_op_predictor_scores(_pool(n_threads), t1, ffi.from_buffer(b1),
                                     t2, ffi.from_buffer(b2), n_embd, rank, n_ff,
                                     ffi.cast("float *", ffi.from_buffer(x)), x.shape[0],
                                     ffi.cast("float *", ffi.from_buffer(out))), "predictor scores")
    return out


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
        raise ValueError(f"layer {layer}: tensor {n1} has shape (rank, n_embd) = {tuple(fc1_shape)}, "
                         f"expected (rank, {n_embd})")
    if len(fc2_shape) != 2 or fc2_shape[0] != n_ff:
        raise ValueError(f"layer {layer}: tensor {n2} has shape (n_ff, rank) = {tuple(fc2_shape)}, "
                         f"expected ({n_ff}, rank)")
    if fc2_shape[1] != fc1_shape[0]:
        raise ValueError(f"layer {layer}: tensor {n2} has rank {fc2_shape[1]}, {n1} has rank {fc1_shape[0]} "
                         f"(rank mismatch)")
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
                    raise ValueError(f"layer {layer}: tensor blk.{layer}.fc1.weight missing "
                                     f"(predictors must cover every layer)")


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
