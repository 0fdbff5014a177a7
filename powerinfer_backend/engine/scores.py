"""The C activation-predictor scores over numpy arrays (docs/predictors.md), and the
Q8_0 operand they also read.

Shapes follow PowerInfer's GGUF tensors: fc1 numpy (rank, n_embd) (ne [n_embd, rank]),
fc2 numpy (n_ff, rank) (ne [rank, n_ff]); x rows of n_embd float32."""

from __future__ import annotations

import numpy as np

from .._native import check, ffi, lib
from .tensors import _NP_TYPES, float_matrix

__all__ = ["scores", "quantize_q8_0"]

# one worker pool per thread count, kept for the process: scores are called per layer
_POOLS: dict[int, object] = {}


def _pool(n_threads: int):
    if n_threads not in _POOLS:
        out = ffi.new("pi_pool **")
        check(lib.pi_pool_create(int(n_threads), out), "pi_pool_create")
        _POOLS[n_threads] = ffi.gc(out[0], lib.pi_pool_free)
    return _POOLS[n_threads]


def quantize_q8_0(w: np.ndarray, name: str = ""):
    """A (rows, cols) float array as a Q8_0 :class:`~powerinfer_backend.loader.TensorView`
    (ne [cols, rows]; cols % 32 == 0), the type the native predictor reads as any matmul
    weight (docs/predictors.md: ``--quantize q8_0``)."""
    from gguf import GGMLQuantizationType, quants

    from ..loader import TensorView

    w = np.ascontiguousarray(w, np.float32)
    if w.ndim != 2 or w.shape[1] % 32:
        raise ValueError(f"{name or 'tensor'}: Q8_0 needs rows whose length is a multiple of 32, got shape {w.shape}")
    q = np.ascontiguousarray(quants.quantize(w, GGMLQuantizationType.Q8_0)).reshape(-1)
    return TensorView(
        name=name, type=int(GGMLQuantizationType.Q8_0), ne=(w.shape[1], w.shape[0]), data=q, nbytes=int(q.nbytes)
    )


def _operand(w):
    """-> (type id, buffer, numpy-order shape) for an ndarray (F32/F16) or a TensorView."""
    if isinstance(w, np.ndarray):
        w = float_matrix(w, "predictor weights (or a quantized TensorView)")
        return _NP_TYPES[w.dtype], w, w.shape
    if len(w.ne) != 2:
        raise ValueError(f"predictor weights must be 2-D, got ne {list(w.ne)}")
    return int(w.type), w.data, (w.ne[1], w.ne[0])


def scores(fc1, fc2, x: np.ndarray, n_threads: int = 1) -> np.ndarray:
    """C predictor scores ``fc2 . relu(fc1 . x)`` for rows x (n_tok, n_embd) float32;
    fc1 (rank, n_embd), fc2 (n_ff, rank), float32 or float16 ndarrays or TensorViews of
    any matmul type (Q8_0: :func:`quantize_q8_0`). -> (n_tok, n_ff) float32.

    Raises:
        ValueError: a dtype other than float32/float16, weights not 2-D, or shapes that
            do not fit.
    """
    t1, b1, s1 = _operand(fc1)
    t2, b2, s2 = _operand(fc2)
    x = np.ascontiguousarray(np.atleast_2d(x), np.float32)
    if s2[1] != s1[0] or x.shape[1] != s1[1]:
        raise ValueError(f"predictor shapes fc1 {s1}, fc2 {s2}, x {x.shape} do not fit")
    rank, n_embd = s1
    n_ff = s2[0]
    out = np.empty((x.shape[0], n_ff), np.float32)
    check(
        lib.pi_op_predictor_scores(
            _pool(n_threads),
            t1,
            ffi.from_buffer(b1),
            t2,
            ffi.from_buffer(b2),
            n_embd,
            rank,
            n_ff,
            ffi.cast("float *", ffi.from_buffer(x)),
            x.shape[0],
            ffi.cast("float *", ffi.from_buffer(out)),
        ),
        "predictor scores",
    )
    return out
