"""A fast, guarded scan of a GGUF file's metadata (the key/value section only), for the
checks that run before a file is handed to llama.cpp (:mod:`.vocab`).

``gguf.GGUFReader`` builds a numpy view per array element (~20 us each), so reading a
262k-token vocabulary through it takes seconds; this scan reads numeric arrays as one
numpy array each and walks string arrays with one tight loop, keeping only the strings
of the keys asked for. It reads nothing of the tensor directory. Truncated, corrupt or
absurd headers raise :class:`ValueError` naming the file and the key being read (the
same files ``load_gguf`` and llama.cpp's gguf reader reject).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any, Collection

import numpy as np

from .reader import _MAX_ARRAY_ELEMS
from .types import GGUF_MAGIC, _V, _vtype_name

__all__ = ["MetaValue", "StringArray", "scan_metadata"]

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
# value type -> numpy dtype of its scalars / array elements (little-endian)
_NP = {int(_V.UINT8): "<u1", int(_V.INT8): "<i1", int(_V.UINT16): "<u2", int(_V.INT16): "<i2",
       int(_V.UINT32): "<u4", int(_V.INT32): "<i4", int(_V.FLOAT32): "<f4", int(_V.BOOL): "<u1",
       int(_V.UINT64): "<u8", int(_V.INT64): "<i8", int(_V.FLOAT64): "<f8"}
_STRING, _ARRAY, _BOOL = int(_V.STRING), int(_V.ARRAY), int(_V.BOOL)


@dataclass(frozen=True)
class MetaValue:
    """One metadata value.

    Attributes:
        vtype: GGUF value type id (``gguf.GGUFValueType``).
        etype: element type id of an array, else None.
        count: number of array elements (1 for a scalar).
        value: a scalar as int / float / bool / bytes (strings stay bytes, unchanged);
            a numeric array as a read-only 1-D numpy array (bool as uint8); a string
            array as a :class:`StringArray` when its key was asked for, else None.
    """

    vtype: int
    etype: int | None
    count: int
    value: Any


@dataclass(frozen=True)
class StringArray:
    """A string array's bytes as one buffer: string ``i`` is
    ``buf[starts[i]: starts[i] + lens[i]]`` (``buf`` uint8, ``starts`` / ``lens`` int64)."""

    buf: np.ndarray
    starts: np.ndarray
    lens: np.ndarray

    def __len__(self) -> int:
        return int(self.lens.size)

    def __getitem__(self, i: int) -> bytes:
        s = int(self.starts[i])
        return self.buf[s: s + int(self.lens[i])].tobytes()


class _Truncated(Exception):
    pass


def scan_metadata(path: str, strings: Collection[str] = ()) -> dict[str, MetaValue]:
    """Metadata of the GGUF file ``path``: key -> :class:`MetaValue`, in file order.

    ``strings``: keys whose string arrays are returned as :class:`StringArray` (others
    are only walked). Raises ValueError for a file that is not a little-endian GGUF v2/v3
    or whose metadata is truncated, corrupt or holds more than the project's array
    element limit; OSError if it cannot be read.
    """
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise ValueError(f"{path}: not a GGUF file (empty)") from None
    try:
        return _scan(path, mm, frozenset(strings))
    finally:
        mm.close()


def _scan(path: str, mm: mmap.mmap, want: frozenset[str]) -> dict[str, MetaValue]:
    size = len(mm)
    if size < 24 or mm[:4] != GGUF_MAGIC:
        raise ValueError(f"{path}: not a GGUF file (magic {bytes(mm[:4])!r})")
    version = _U32(mm, 4)[0]
    if version not in (2, 3):
        if version in (2 << 24, 3 << 24):  # 2 or 3 written big-endian
            raise ValueError(f"{path}: big-endian GGUF files are not supported")
        raise ValueError(f"{path}: unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
    n_kv = _U64(mm, 16)[0]
    pos = 24
    if n_kv * 12 > size - pos:  # each entry takes at least 12 bytes
        raise ValueError(f"{path}: truncated or corrupt GGUF header: {n_kv} metadata entries "
                         f"cannot fit in {size - pos} bytes")
    out: dict[str, MetaValue] = {}
    budget = [_MAX_ARRAY_ELEMS]  # array elements left (a corrupt count must not loop for minutes)
    for i in range(n_kv):
        key = f"#{i}"
        try:
            (klen,) = _U64(mm, pos)
            if klen > size - pos - 8:
                raise _Truncated(f"a key of {klen} bytes at byte {pos}")
            key = bytes(mm[pos + 8: pos + 8 + klen]).decode("utf-8", "replace")
            pos += 8 + klen
            (vtype,) = _U32(mm, pos)
            pos += 4
            value, pos = _read_value(mm, pos, vtype, key in want, budget, size)
        except (_Truncated, struct.error, IndexError) as e:
            detail = str(e) if isinstance(e, _Truncated) else f"it runs past the end of the file ({size} bytes)"
            raise ValueError(f"{path}: truncated or corrupt GGUF header: reading key '{key}': {detail}") from None
        except ValueError as e:
            raise ValueError(f"{path}: key '{key}': {e}") from None
        if key in out:  # llama.cpp's gguf reader rejects the file too
            raise ValueError(f"{path}: key '{key}' appears twice in the metadata")
        out[key] = value
    return out


def _read_value(mm, pos: int, vtype: int, keep: bool, budget: list, size: int) -> tuple[MetaValue, int]:
    if vtype == _STRING:
        (n,) = _U64(mm, pos)
        if n > size - pos - 8:
            raise _Truncated(f"a string of {n} bytes at byte {pos}")
        return MetaValue(vtype, None, 1, bytes(mm[pos + 8: pos + 8 + n])), pos + 8 + n
    if vtype in _NP:
        dt = np.dtype(_NP[vtype])
        v = np.frombuffer(mm, dt, 1, pos)[0].item()
        return MetaValue(vtype, None, 1, bool(v) if vtype == _BOOL else v), pos + dt.itemsize
    if vtype != _ARRAY:
        raise ValueError(f"unknown value type {vtype}")
    (etype,) = _U32(mm, pos)
    (count,) = _U64(mm, pos + 4)
    pos += 12
    budget[0] -= count
    if budget[0] < 0:
        raise _Truncated(f"an array of {count} values takes the file past the limit of "
                         f"{_MAX_ARRAY_ELEMS} array elements")
    if etype == _STRING:
        if count * 8 > size - pos:
            raise _Truncated(f"an array of {count} strings cannot fit in the {size - pos} bytes left")
        strings, pos = _walk_strings(mm, pos, count, keep)
        if pos > size:
            raise _Truncated(f"a string of the array runs past the end of the file ({size} bytes)")
        return MetaValue(vtype, etype, count, strings), pos
    if etype not in _NP:
        raise ValueError(f"array of {_vtype_name(etype)} values is not supported (llama.cpp rejects it)")
    dt = np.dtype(_NP[etype])
    if count * dt.itemsize > size - pos:
        raise _Truncated(f"an array of {count} {_vtype_name(etype)} values cannot fit in the "
                         f"{size - pos} bytes left")
    arr = np.frombuffer(mm, dt, count, pos).copy()  # a copy: the map is closed after the scan
    arr.flags.writeable = False
    return MetaValue(vtype, etype, count, arr), pos + count * dt.itemsize


def _walk_strings(mm, pos: int, count: int, keep: bool) -> tuple[StringArray | None, int]:
    """The ``count`` length-prefixed strings at ``pos`` (a :class:`StringArray` if
    ``keep``) and the end position: one tight loop over the lengths, no object per string."""
    u64 = _U64
    if not keep:
        for _ in range(count):
            pos += 8 + u64(mm, pos)[0]
        return None, pos
    lens: list[int] = []
    append = lens.append
    start = pos
    for _ in range(count):
        (n,) = u64(mm, pos)
        append(n)
        pos += 8 + n
    if pos > len(mm):
        return None, pos  # the caller reports the truncation
    ln = np.array(lens, np.int64)
    ends = np.cumsum(ln + 8)
    buf = np.frombuffer(mm, np.uint8, pos - start, start).copy()
    buf.flags.writeable = False
    return StringArray(buf, ends - ln, ln), pos
