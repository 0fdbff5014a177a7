"""GGUF format and ggml type facts shared by the loader's modules: file magics,
alignment and dimension limits, the kernel types (:data:`KERNEL_TYPES`), type and value
type names, decoding any ggml type to float32, and :class:`TensorView` (one tensor's
bytes as the kernels take them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType
from gguf import quants as _quants

GGUF_MAGIC = b"GGUF"
#: PowerInfer's own files: a GGUF whose first four bytes are "PWRI" (same layout).
PWRI_MAGIC = b"PWRI"
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS

_T = GGMLQuantizationType

#: ggml type ids the native kernels accept for weight matrices.
KERNEL_TYPES: frozenset[int] = frozenset(
    int(t) for t in (_T.F32, _T.F16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q8_0, _T.Q4_K, _T.Q5_K, _T.Q6_K, _T.BF16)
)


class UnsupportedTensorTypeWarning(UserWarning):
    """A tensor's type is not run by the kernels and was converted at load."""


# GGUF metadata value types
_V = GGUFValueType
_INT_TYPES = frozenset(
    int(t) for t in (_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32, _V.UINT64, _V.INT64)
)
_FLOAT_TYPES = frozenset({int(_V.FLOAT32), int(_V.FLOAT64)})


def _vtype_name(vtype: int) -> str:
    try:
        return _V(vtype).name.lower()
    except ValueError:
        return f"type {vtype}"


def _type_name(t: int) -> str:
    try:
        return _T(t).name
    except ValueError:
        return f"type {t}"


def _dequantize(raw: np.ndarray, ttype: int, n_rows: int, ne0: int) -> np.ndarray:
    """float32 array of shape (n_rows, ne0) from ``raw`` bytes of type ``ttype``."""
    rows = raw.reshape(n_rows, -1)
    if ttype == _T.F32:
        return rows.view("<f4").astype(np.float32)
    if ttype == _T.F16:
        return rows.view("<f2").astype(np.float32)
    if ttype == _T.F64:
        return rows.view("<f8").astype(np.float32)
    return np.asarray(_quants.dequantize(rows, _T(ttype)), dtype=np.float32).reshape(n_rows, ne0)


@dataclass(frozen=True, eq=False)
class TensorView:
    """One tensor's bytes, ready for the kernels.

    Attributes:
        name: GGUF tensor name.
        type: ggml type id (``gguf.GGMLQuantizationType`` value); always a
            kernel type (:data:`KERNEL_TYPES`), and F32 for norm weights and
            rope_freqs.
        ne: elements per dimension in GGUF order, ``ne[0]`` = contiguous row
            length; 1 to 4 entries.
        data: 1-D C-contiguous read-only uint8 array of ``nbytes`` bytes. A
            zero-copy view of the file's memory map, or a new array when the
            tensor was converted at load (see ``converted_from``).
        nbytes: byte size, ``prod(ne) / block_size * type_size`` of ``type``.
        converted_from: the file's type id when the tensor was converted at
            load, else None.
    """

    name: str
    type: int
    ne: tuple[int, ...]
    data: np.ndarray = field(repr=False)
    nbytes: int
    converted_from: int | None = None

    @property
    def type_name(self) -> str:
        """ggml type name, e.g. "Q8_0"."""
        return _type_name(self.type)

    @property
    def n_dims(self) -> int:
        """Number of entries in ``ne``."""
        return len(self.ne)

    @property
    def n_elements(self) -> int:
        """Product of ``ne``."""
        return math.prod(self.ne)

    def to_float32(self) -> np.ndarray:
        """Dequantized copy as float32 with numpy shape ``ne[::-1]`` (rows last
        index = row length). For tests and reference code; slow for big tensors."""
        flat = _dequantize(self.data, self.type, self.n_elements // self.ne[0], self.ne[0])
        return flat.reshape(self.ne[::-1])
