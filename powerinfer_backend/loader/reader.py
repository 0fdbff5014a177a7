"""A parsed header (:func:`.gguf_meta.parse_header`) in the forms its readers keep: for
:func:`~powerinfer_backend.loader.load.load_gguf`, the metadata as typed values
(:func:`_read_kv`, :func:`_kv_to_str`) and the tensor directory as zero-copy views
(:func:`_tensor_infos`); for the small files of plain values and arrays (sparsity sidecars,
PowerInfer's ``.generated.gpuidx``), :func:`plain_value` and :func:`tensor_array`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .gguf_meta import Header, MetaValue, StringArray, TensorEntry
from .types import _FLOAT_TYPES, _T, _V

# ggml types whose elements are plain numbers -> numpy dtype (the rest are blocks of bytes)
_PLAIN_NP = {
    int(_T.F32): "<f4",
    int(_T.F16): "<f2",
    int(_T.F64): "<f8",
    int(_T.I8): "<i1",
    int(_T.I16): "<i2",
    int(_T.I32): "<i4",
    int(_T.I64): "<i8",
}


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    ne: tuple[int, ...]
    type: int
    nbytes: int
    data: np.ndarray  # 1-D uint8 zero-copy view of the memory map


def _read_kv(h: Header) -> dict[str, tuple[int, Any]]:
    """key -> (value type, value) for every metadata key of ``h``, as GGUFModel keeps them:
    scalars as int / float / bool / str (invalid UTF-8 replaced), numeric arrays as
    read-only 1-D numpy views (bool as uint8), string arrays as :class:`StringArray`
    (decoded only when asked for, by ``GGUFModel.get_kv``)."""
    kv: dict[str, tuple[int, Any]] = {}
    for key, v in h.kv.items():
        value = v.value
        if v.vtype == _V.STRING:
            value = value.decode("utf-8", "replace")
        kv[key] = (v.vtype, value)
    return kv


def _tensor_infos(h: Header) -> dict[str, _TensorInfo]:
    """The tensor directory by name, each with its data as a zero-copy view of the map."""
    data = h.data.view(np.ndarray)  # plain views (fast to slice) that still lead back to the map
    return {
        t.name: _TensorInfo(t.name, t.ne, t.type, t.nbytes, data[t.offset : t.offset + t.nbytes]) for t in h.tensors
    }


def _kv_to_str(vtype: int, value: Any) -> str:
    """Format a scalar value the way llama.cpp's gguf_kv_to_str does."""
    if vtype == _V.BOOL:
        return "true" if value else "false"
    if vtype in _FLOAT_TYPES:
        return f"{value:f}"
    return str(value)


def plain_value(v: MetaValue) -> Any:
    """A metadata value as plain Python: str (invalid UTF-8 replaced), int, float or bool;
    an array as a list of those."""
    if v.vtype == _V.STRING:
        return v.value.decode("utf-8", "replace")
    if isinstance(v.value, StringArray):
        return v.value.decode("replace")
    if isinstance(v.value, np.ndarray):
        return (v.value.astype(bool) if v.etype == _V.BOOL else v.value).tolist()
    return v.value


def tensor_array(h: Header, t: TensorEntry) -> np.ndarray:
    """Tensor ``t`` of header ``h`` as a read-only view of the file's map: numpy shape
    ``t.ne[::-1]`` in its own dtype for plain types (F32, F16, F64, I8 to I64), else its
    raw bytes as uint8 of shape (rows, bytes per row) (rows = the product of ``ne[1:]``)."""
    raw = h.data.view(np.ndarray)[t.offset : t.offset + t.nbytes]
    dtype = _PLAIN_NP.get(t.type)
    if dtype is not None:
        return raw.view(dtype).reshape(t.ne[::-1])
    return raw.reshape(int(np.prod(t.ne[1:], dtype=np.int64)), -1)  # parse_header: no dimension <= 0
