"""Single C operators over numpy arrays: ``pi_op_matmul`` and ``pi_op_ffn_sparse``, for
the FFN density sweep (``powerinfer-backend bench --ffn-density-sweep``, cli/sweeps.py).

A ``bind_*`` function makes the C pointers once and returns the call, to be repeated
over the same arrays (which must stay alive and in place): a benchmark then times the C
operator alone, not the argument conversion."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .._native import check, ffi, lib
from .pool import NativePool

__all__ = ["bind_matmul", "bind_ffn_sparse"]


def _ptr(ctype: str, a: np.ndarray | None):
    return ffi.cast(ctype, ffi.from_buffer(a)) if a is not None else ffi.NULL


def bind_matmul(
    pool: NativePool, type_id: int, w: np.ndarray, n_rows: int, n_cols: int, x: np.ndarray, y: np.ndarray
) -> Callable[[], None]:
    """``pi_op_matmul``: y[t][r] = dot(row r of ``w``, x[t]), ``w`` n_rows rows of n_cols
    in ggml type ``type_id`` (its bytes), ``x`` float32 (n_tok, n_cols), ``y`` float32
    (n_tok, n_rows). The returned call raises as :func:`powerinfer_backend._native.check`."""
    fn, args = (
        lib.pi_op_matmul,
        (
            pool.ptr,
            int(type_id),
            ffi.from_buffer(w),
            n_rows,
            n_cols,
            _ptr("const float *", x),
            x.shape[0],
            _ptr("float *", y),
        ),
    )
    return lambda: check(fn(*args), "pi_op_matmul")


def bind_ffn_sparse(
    pool: NativePool,
    act: int,
    gate_up_type: int,
    gate: np.ndarray,
    up: np.ndarray,
    n_embd: int,
    n_ff: int,
    down_t_type: int,
    down_t: np.ndarray,
    x: np.ndarray,
    active: np.ndarray | None,
    active_off: np.ndarray | None,
    threshold: float,
    y: np.ndarray,
    n_used: np.ndarray | None = None,
) -> Callable[[], None]:
    """``pi_op_ffn_sparse`` (semantics in native/include/powerinfer.h): the FFN of
    ``x`` float32 (n_tok, n_embd) over per-token neuron lists ``active`` int32 /
    ``active_off`` int64 (n_tok + 1) (None: all neurons) into ``y`` float32
    (n_tok, n_embd); ``n_used`` int64 (n_tok,), optional, receives the kept counts;
    ``act``: enum pi_ffn_act. The returned call raises as
    :func:`powerinfer_backend._native.check`."""
    fn = lib.pi_op_ffn_sparse
    args = (
        pool.ptr,
        int(act),
        int(gate_up_type),
        ffi.from_buffer(gate),
        ffi.from_buffer(up),
        n_embd,
        n_ff,
        int(down_t_type),
        ffi.from_buffer(down_t),
        _ptr("const float *", x),
        x.shape[0],
        _ptr("const int32_t *", active),
        _ptr("const int64_t *", active_off),
        float(threshold),
        _ptr("float *", y),
        _ptr("int64_t *", n_used),
    )
    return lambda: check(fn(*args), "pi_op_ffn_sparse")
