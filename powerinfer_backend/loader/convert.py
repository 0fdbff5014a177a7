"""Tensor views for the kernels (:func:`_make_view`): zero-copy for kernel types, else a
one-time conversion at load (chunked, with an :class:`UnsupportedTensorTypeWarning`), and
``ffn_down`` rebuilt from PowerInfer's transposed ``ffn_down_t`` (:func:`_untranspose`)."""

from __future__ import annotations

import math
import warnings
from typing import Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import quants as _quants

from . import arch as _arch
from .reader import _TensorInfo
from .types import KERNEL_TYPES, _T, TensorView, UnsupportedTensorTypeWarning, _dequantize, _type_name

# Conversion work is done in chunks of about this many elements (bounds the
# temporary float32 memory to ~64 MiB whatever the tensor size).
_CONVERT_CHUNK_ELEMS = 1 << 24


def _iter_row_chunks(n_rows: int, ne0: int) -> Iterator[tuple[int, int]]:
    step = max(1, _CONVERT_CHUNK_ELEMS // ne0)
    for a in range(0, n_rows, step):
        yield a, min(n_rows, a + step)


def _convert(path: str, info: _TensorInfo, raw: np.ndarray, dst: int) -> np.ndarray:
    """Convert ``raw`` (bytes of info.type) to type ``dst`` (F32, F16 or Q8_0),
    chunk by chunk. Returns a new 1-D uint8 array."""
    ne0 = info.ne[0]
    n_rows = math.prod(info.ne) // ne0
    src_row = info.nbytes // n_rows
    block, tsize = GGML_QUANT_SIZES[_T(dst)]
    dst_row = ne0 // block * tsize
    out = np.empty(n_rows * dst_row, dtype=np.uint8)
    src = raw.reshape(n_rows, src_row)
    dst_rows = out.reshape(n_rows, dst_row)
    for a, b in _iter_row_chunks(n_rows, ne0):
        try:
            f = _dequantize(src[a:b], info.type, b - a, ne0)
        except NotImplementedError:
            raise ValueError(
                f"{path}: tensor '{info.name}' has type {_type_name(info.type)}, which the "
                "kernels do not run and which cannot be converted"
            ) from None
        if dst == _T.F32:
            q = f.view(np.uint8)
        elif dst == _T.F16:
            q = f.astype("<f2").view(np.uint8)
        else:
            q = np.asarray(_quants.quantize(f, _T(dst)), dtype=np.uint8)
        dst_rows[a:b] = q.reshape(b - a, dst_row)
    out.flags.writeable = False
    return out


_INTEGER_TENSOR_TYPES = frozenset(int(t) for t in (_T.I8, _T.I16, _T.I32, _T.I64))


def _make_view(path: str, info: _TensorInfo, raw: np.ndarray, kind: str) -> TensorView:
    t = info.type
    if t in _INTEGER_TENSOR_TYPES:
        raise ValueError(
            f"{path}: tensor '{info.name}' has integer type {_type_name(t)}; expected a float or quantized type"
        )
    if kind == _arch.KIND_F32:
        if t == _T.F32:
            return TensorView(info.name, t, info.ne, raw, info.nbytes)
        if t not in (_T.F16, _T.BF16):
            warnings.warn(
                f"{info.name}: {_type_name(t)} is not supported for this tensor; converted to F32 at load",
                UnsupportedTensorTypeWarning,
                stacklevel=3,
            )
        dst = int(_T.F32)
    else:
        if t in KERNEL_TYPES:
            return TensorView(info.name, t, info.ne, raw, info.nbytes)
        if t == _T.F64:
            dst = int(_T.F32)
        elif info.ne[0] % GGML_QUANT_SIZES[_T.Q8_0][0] == 0:
            dst = int(_T.Q8_0)
        else:
            dst = int(_T.F16)
        warnings.warn(
            f"{info.name}: {_type_name(t)} is not supported by the kernels; converted to {_type_name(dst)} at load",
            UnsupportedTensorTypeWarning,
            stacklevel=3,
        )
    data = _convert(path, info, raw, dst)
    return TensorView(info.name, dst, info.ne, data, int(data.nbytes), converted_from=t)


def _untranspose(name: str, dt: TensorView) -> TensorView:
    """ffn_down [n_ff, n_embd] from a transposed ffn_down_t [n_embd, n_ff]: F32 when
    ffn_down_t is F32, else F16 (exact for F16; rounds quantized values to F16)."""
    n_embd, n_ff = dt.ne
    vals = _quants.dequantize(dt.data, _T(dt.type)).reshape(n_ff, n_embd)
    dst = _T.F32 if dt.type == _T.F32 else _T.F16
    arr = np.ascontiguousarray(vals.T.astype(np.float32 if dst == _T.F32 else np.float16))
    raw = arr.reshape(-1).view(np.uint8)
    return TensorView(name, int(dst), (n_ff, n_embd), raw, int(raw.nbytes), converted_from=int(dt.type))
