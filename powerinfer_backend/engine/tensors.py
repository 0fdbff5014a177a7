"""Conversions of numpy arrays, tensor views and token lists into the C library's argument
structs (pi_tensor, pi_layer_placement, int32 id arrays), shared by the engine wrappers."""

from __future__ import annotations

import numpy as np

from .._native import ffi


def _fill_tensor(dst, view) -> None:
    dst.data = ffi.from_buffer(view.data) if view is not None else ffi.NULL
    if view is None:
        return
    dst.type = view.type
    dst.n_dims = len(view.ne)
    ne = list(view.ne) + [1] * (4 - len(view.ne))
    for i in range(4):
        dst.ne[i] = ne[i]
    dst.nbytes = view.nbytes


_NP_TYPES = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}


def float_matrix(obj: np.ndarray, name: str) -> np.ndarray:
    """``obj`` as a C-contiguous 2-D float32/float16 array (the float operands the C
    library takes besides TensorViews). Raises ValueError naming ``name``."""
    arr = np.ascontiguousarray(obj)
    if arr.dtype not in _NP_TYPES:
        raise ValueError(f"tensor {name}: dtype {arr.dtype}, expected float32 or float16")
    if arr.ndim != 2:
        raise ValueError(f"tensor {name}: must be 2-D, got shape {arr.shape}")
    return arr


def _pred_tensor(obj, name: str):
    """-> (pi_tensor*, object to keep alive) for an ndarray or a TensorView."""
    if obj is None:
        raise ValueError(f"tensor {name}: missing")
    t = ffi.new("pi_tensor *")
    if isinstance(obj, np.ndarray):
        arr = float_matrix(obj, name)
        if not np.isfinite(arr).all():  # a NaN score would silently select nothing or everything
            raise ValueError(f"tensor {name}: has NaN or infinite values")
        t.data = ffi.from_buffer(arr)
        t.type = _NP_TYPES[arr.dtype]
        t.n_dims = 2
        t.ne[0], t.ne[1], t.ne[2], t.ne[3] = arr.shape[1], arr.shape[0], 1, 1
        t.nbytes = arr.nbytes
        return t, arr
    if len(obj.ne) > 2:
        raise ValueError(f"tensor {name}: must be 2-D, got ne {list(obj.ne)}")
    _fill_tensor(t, obj)
    return t, obj


def _layer_array(plan_layers, device_skips: bool = False):
    """-> (pi_layer_placement[] of ``plan_layers`` (attn_on_device, hot_ids; every layer's
    device_skips), the id arrays to keep alive)."""
    layers = ffi.new("pi_layer_placement[]", len(plan_layers))
    keep = []
    for i, L in enumerate(plan_layers):
        ids = np.ascontiguousarray(L.hot_ids, dtype=np.int32)
        keep.append(ids)
        layers[i].attn_on_device = int(L.attn_on_device)
        layers[i].device_skips = int(bool(device_skips))
        layers[i].n_hot = ids.shape[0]
        layers[i].hot_ids = ffi.cast("const int32_t *", ffi.from_buffer(ids)) if ids.size else ffi.NULL
    return layers, keep


def _token_ids(tokens, what: str, n_vocab: int) -> np.ndarray:
    """``tokens`` as a non-empty 1-D int32 array of ids in [0, n_vocab); ValueError (starting with ``what``)
    otherwise. Checked up front so a bad id in a later batch leaves the cache unchanged."""
    ids = np.asarray(tokens)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"{what}: tokens must be a non-empty 1-D sequence")
    if ids.dtype.kind not in "iu":
        if ids.dtype != object:
            raise ValueError(f"{what}: token ids must be integers, got dtype {ids.dtype}")
        if not all(isinstance(t, (int, np.integer)) for t in ids):
            raise ValueError(f"{what}: token ids must be integers")
    values = ids.tolist()  # Python ints: no wrap-around of int64 ids before the range check
    bad = next((i for i, t in enumerate(values) if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise ValueError(f"{what}: token {values[bad]} at index {bad} is outside [0, {n_vocab})")
    return ids.astype(np.int32)
