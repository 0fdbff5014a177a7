"""A fast, guarded parse of a GGUF file's header: the metadata (key/value section) and the
tensor directory, read straight from a memory map (:func:`parse_header`; the metadata alone:
:func:`scan_metadata`).

``gguf.GGUFReader`` builds a numpy view per array element (~20 us each), so a 262k-token
vocabulary takes it seconds. Here a numeric array is one read-only numpy view of the map and
a string array one :class:`StringArray` (its bytes as one view, plus start and length
arrays) after a tight loop over the lengths: no Python object per element. ``gguf`` stays
the writer of files and the reference of the cross-check tests (tests/loader/test_header.py).

Truncated, corrupt, hostile or absurd headers raise :class:`ValueError` naming the file and
the key or tensor entry being read (the files llama.cpp's gguf reader rejects, and a few
more: over :data:`MAX_ARRAY_ELEMS` array elements, arrays of arrays).
"""

from __future__ import annotations

import os
import struct
import weakref
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from .types import GGUF_MAGIC, PWRI_MAGIC, _DEFAULT_ALIGNMENT, _MAX_DIMS, _V, _vtype_name

__all__ = ["MAX_ARRAY_ELEMS", "Header", "MetaValue", "StringArray", "TensorEntry", "parse_header", "scan_metadata"]

#: Array elements per file (all arrays together): a corrupt count must not make the parse walk
#: for minutes. The largest real tokenizers (tokens + scores/types + merges) are under 800k.
MAX_ARRAY_ELEMS = 1 << 21

_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
# value type -> numpy dtype of its scalars / array elements (little-endian)
_NP: dict[int, np.dtype] = {
    k: np.dtype(v)
    for k, v in {
        int(_V.UINT8): "<u1",
        int(_V.INT8): "<i1",
        int(_V.UINT16): "<u2",
        int(_V.INT16): "<i2",
        int(_V.UINT32): "<u4",
        int(_V.INT32): "<i4",
        int(_V.FLOAT32): "<f4",
        int(_V.BOOL): "<u1",
        int(_V.UINT64): "<u8",
        int(_V.INT64): "<i8",
        int(_V.FLOAT64): "<f8",
    }.items()
}
_STRING, _ARRAY, _BOOL, _UINT32 = int(_V.STRING), int(_V.ARRAY), int(_V.BOOL), int(_V.UINT32)
_MIN_TENSOR_ENTRY = 8 + 4 + 4 + 8  # name length, n_dims, type, offset (no name, no dims)


@dataclass(frozen=True)
class MetaValue:
    """One metadata value.

    Attributes:
        vtype: GGUF value type id (``gguf.GGUFValueType``).
        etype: element type id of an array, else None.
        count: number of array elements (1 for a scalar).
        value: a scalar as int / float / bool / bytes (strings stay bytes, unchanged);
            a numeric array as a read-only 1-D numpy view of the file (bool as uint8);
            a string array as a :class:`StringArray`.
    """

    vtype: int
    etype: int | None
    count: int
    value: Any


@dataclass(frozen=True)
class StringArray:
    """A string array's bytes as one buffer: string ``i`` is
    ``buf[starts[i]: starts[i] + lens[i]]`` (``buf`` read-only uint8 covering the array's
    length fields and bytes, ``starts`` / ``lens`` int64)."""

    buf: np.ndarray
    starts: np.ndarray
    lens: np.ndarray

    def __len__(self) -> int:
        return int(self.lens.size)

    def __getitem__(self, i: int) -> bytes:
        s = int(self.starts[i])
        return self.buf[s : s + int(self.lens[i])].tobytes()

    def decode(self, errors: str = "surrogateescape") -> list[str]:
        """Every string as str (UTF-8, invalid bytes handled by ``errors``): one Python
        object per string, built only when asked for."""
        raw = self.buf.tobytes()
        return [raw[s : s + n].decode("utf-8", errors) for s, n in zip(self.starts.tolist(), self.lens.tolist())]


@dataclass(frozen=True)
class TensorEntry:
    """One tensor directory entry, checked (see :func:`parse_header`).

    Attributes:
        name: tensor name. ne: elements per dimension, GGUF order (1 to 4 entries).
        type: ggml type id. offset: absolute file offset of its data.
        nbytes: data size in bytes.
    """

    name: str
    ne: tuple[int, ...]
    type: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Header:
    """A parsed GGUF header (see :func:`parse_header`).

    Attributes:
        version: 2 or 3. alignment: tensor data alignment (bytes).
        data_offset: file offset of the tensor data section.
        kv: key -> :class:`MetaValue`, in file order.
        tensors: the tensor directory, in file order.
        data: the whole file as a read-only uint8 ``np.memmap`` (views into it stay valid
            while referenced).
    """

    version: int
    alignment: int
    data_offset: int
    kv: dict[str, MetaValue]
    tensors: list[TensorEntry]
    data: np.ndarray


class _Truncated(Exception):
    pass


def _map(path: str) -> tuple[np.ndarray, np.ndarray]:
    """The file as a read-only np.memmap, and as a plain ndarray view of it (slices of an
    np.memmap run a Python hook each; views of the plain one still lead back to the map)."""
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except ValueError:  # an empty file cannot be mapped
        raise ValueError(f"{path}: not a GGUF file (empty)") from None
    return mm, mm.view(np.ndarray)


def _stamp(path: str) -> tuple:
    st = os.stat(path)
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)


# The header :func:`parse_header` gave last, while something (a loaded model) keeps it: the
# vocabulary check right after a load (Llama: backend, then tokenizer) reuses its metadata
# instead of walking the token arrays again.
_last: tuple[tuple, weakref.ref] | None = None


def scan_metadata(path: str) -> dict[str, MetaValue]:
    """Metadata of the GGUF file ``path``: key -> :class:`MetaValue`, in file order.

    Reads nothing of the tensor directory; when a header of the unchanged file from
    :func:`parse_header` is still alive, returns its metadata without reading the file.
    Raises ValueError for a file that is not a little-endian GGUF v2/v3 or whose metadata is
    truncated, corrupt, holds an array of arrays or more than :data:`MAX_ARRAY_ELEMS` array
    elements; OSError if it cannot be read.
    """
    last = _last
    if last is not None:
        h = last[1]()
        if h is not None and last[0] == _stamp(path):
            return h.kv
    _mm, data = _map(path)
    kv, _pos, _version, _n_tensors = _parse_kv(path, data, data.data, GGUF_MAGIC)
    return kv


def parse_header(path: str, *, pwri: bool = False) -> Header:
    """Parse and check the header of the GGUF file ``path`` (memory-mapped, nothing copied).

    Args:
        path: file path. pwri: the first four bytes are PowerInfer's "PWRI" (same layout).

    Returns:
        The :class:`Header`. Every tensor entry has been checked: 1 to 4 dimensions, a known
        type id, no dimension <= 0 or >= 2**40, a row length ``ne[0]`` that is a multiple of
        the type's block size, an offset that is a multiple of the alignment, data inside the
        file, a name used once.

    Raises:
        ValueError: ``"<path>: ..."`` naming the key or tensor, as :func:`scan_metadata`, and
            for a corrupt tensor directory, a bad ``general.alignment``, or an entry that
            fails a check above. OSError: the file cannot be read.
    """
    stamp = _stamp(path)  # before the map: a file changed meanwhile gets a stale stamp, never a stale header
    mm, data = _map(path)
    mv = data.data  # memoryview(data)
    kv, pos, version, n_tensors = _parse_kv(path, data, mv, PWRI_MAGIC if pwri else GGUF_MAGIC)
    size = len(data)
    raw = []
    if n_tensors * _MIN_TENSOR_ENTRY > size - pos:
        raise ValueError(
            f"{path}: truncated or corrupt GGUF header: {n_tensors} tensor entries "
            f"cannot fit in the {size - pos} bytes left"
        )
    for i in range(n_tensors):
        entry_pos = pos
        name = f"#{i}"
        try:
            name_b, pos = _string(mv, pos, size)
            name = name_b.decode("utf-8")
            (n_dims,) = _U32(mv, pos)
            if not 1 <= n_dims <= _MAX_DIMS:
                raise ValueError(f"{path}: tensor '{name}' has {n_dims} dimensions (supported: 1 to {_MAX_DIMS})")
            ne = struct.unpack_from(f"<{n_dims}Q", mv, pos + 4)
            pos += 4 + 8 * n_dims
            ttype, rel = struct.unpack_from("<IQ", mv, pos)  # packed: no padding with "<"
            pos += 12
        except (_Truncated, struct.error, OverflowError) as e:
            detail = str(e) if isinstance(e, _Truncated) else f"it runs past the end of the file ({size} bytes)"
            raise ValueError(
                f"{path}: truncated or corrupt GGUF header: reading tensor {_tname(name, i)} "
                f"at byte {entry_pos}: {detail}"
            ) from None
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: tensor #{i} at byte {entry_pos}: its name is not valid UTF-8 ({e.reason} "
                f"at byte {e.start} of the name)"
            ) from None
        raw.append((name, ne, ttype, rel))
    alignment = _alignment(path, kv)
    data_offset = -(-pos // alignment) * alignment
    tensors, seen = [], set()
    for name, ne, ttype, rel in raw:
        if name in seen:
            raise ValueError(f"{path}: tensor '{name}' appears twice in the tensor directory")
        seen.add(name)
        nbytes = _check_entry(path, name, ne, ttype, rel, data_offset, alignment, size)
        tensors.append(TensorEntry(name, tuple(ne), ttype, data_offset + rel, nbytes))
    global _last
    header = Header(version, alignment, data_offset, kv, tensors, mm)
    _last = (stamp, weakref.ref(header))
    return header


def _tname(name: str, i: int) -> str:
    return name if name.startswith("#") else f"#{i} '{name}'"


def _alignment(path: str, kv: dict[str, MetaValue]) -> int:
    v = kv.get("general.alignment")
    if v is None:
        return _DEFAULT_ALIGNMENT
    if v.vtype != _UINT32:
        raise ValueError(f"{path}: key 'general.alignment' has type {_vtype_name(v.vtype)}, expected uint32")
    a = v.value
    if a == 0 or a & (a - 1):
        raise ValueError(f"{path}: key 'general.alignment' = {a} is not a power of two")
    return a


def _check_entry(
    path: str, name: str, ne: tuple[int, ...], ttype: int, rel: int, data_offset: int, align: int, size: int
) -> int:
    """The entry's data size in bytes, after the checks :func:`parse_header` lists."""
    from gguf import GGML_QUANT_SIZES  # ggml's block sizes (a plain dict; the reader is not used)

    from .types import _T

    def fail(msg: str) -> ValueError:
        return ValueError(f"{path}: tensor '{name}' {msg}")

    try:
        qtype = _T(ttype)
        block, tsize = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise fail(f"has unknown type id {ttype}") from None
    if any(d <= 0 or d >= 1 << 40 for d in ne):
        raise fail(f"has an absurd shape {list(ne)}")
    if ne[0] % block:
        raise fail(
            f"of type {qtype.name} has row length ne[0] = {ne[0]}, not a multiple of the type's block size {block}"
        )
    if rel % align:
        raise fail(f"data offset {rel} is not a multiple of the alignment {align}")
    n = 1
    for d in ne:
        n *= d
    start = data_offset + rel
    end = start + n // block * tsize
    if end > size:
        raise fail(
            f"data (bytes {start} to {end}) runs past the end of the file ({size} bytes): "
            "the file is truncated or corrupt"
        )
    return end - start


def _parse_kv(path: str, data: np.ndarray, mv: memoryview, magic: bytes):
    """(kv, position after the metadata, version, tensor count)."""
    size = len(data)
    if bytes(mv[:4]) != magic:
        raise ValueError(f"{path}: not a GGUF file (magic {bytes(mv[:4])!r})")
    if size < 8:
        raise ValueError(f"{path}: truncated or corrupt GGUF header: {size} bytes, the version needs 8")
    (version,) = _U32(mv, 4)
    if version not in (2, 3):
        if version in (2 << 24, 3 << 24):  # 2 or 3 written big-endian
            raise ValueError(f"{path}: big-endian GGUF files are not supported")
        raise ValueError(f"{path}: not a valid GGUF file: unsupported GGUF version {version} (llama.cpp reads 2 and 3)")
    if size < 24:
        raise ValueError(f"{path}: truncated or corrupt GGUF header: {size} bytes, the counts need 24")
    n_tensors, n_kv = struct.unpack_from("<QQ", mv, 8)
    pos = 24
    if n_kv * 12 > size - pos:  # each entry takes at least 12 bytes
        raise ValueError(
            f"{path}: truncated or corrupt GGUF header: {n_kv} metadata entries cannot fit in {size - pos} bytes"
        )
    out: dict[str, MetaValue] = {}
    budget = [MAX_ARRAY_ELEMS]  # array elements left
    for i in range(n_kv):
        key = f"#{i}"
        start = pos
        try:
            key_b, pos = _string(mv, pos, size)
            key = key_b.decode("utf-8")  # strict, as GGUFReader: keys are names, not data
            (vtype,) = _U32(mv, pos)
            value, pos = _read_value(data, mv, pos + 4, vtype, budget, size)
        except (_Truncated, struct.error, OverflowError) as e:
            detail = str(e) if isinstance(e, _Truncated) else f"it runs past the end of the file ({size} bytes)"
            where = f"key '{key}'" if not key.startswith("#") else f"metadata key {key}"
            raise ValueError(
                f"{path}: truncated or corrupt GGUF header: reading {where} at byte {start}: {detail}"
            ) from None
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}: metadata key #{i} at byte {start} is not valid UTF-8 ({e.reason} at "
                f"byte {e.start} of the key)"
            ) from None
        except ValueError as e:
            raise ValueError(f"{path}: key '{key}': {e}") from None
        if key in out:  # llama.cpp's gguf reader rejects the file too
            raise ValueError(f"{path}: key '{key}' appears twice in the metadata")
        out[key] = value
    return out, pos, version, n_tensors


def _string(mv: memoryview, pos: int, size: int) -> tuple[bytes, int]:
    (n,) = _U64(mv, pos)
    if n > size - pos - 8:
        raise _Truncated(f"a string of {n} bytes at byte {pos} runs past the end of the file ({size} bytes)")
    return bytes(mv[pos + 8 : pos + 8 + n]), pos + 8 + n


def _read_value(
    data: np.ndarray, mv: memoryview, pos: int, vtype: int, budget: list, size: int
) -> tuple[MetaValue, int]:
    if vtype == _STRING:
        s, end = _string(mv, pos, size)
        return MetaValue(vtype, None, 1, s), end
    dt = _NP.get(vtype)
    if dt is not None:
        v = np.frombuffer(mv, dt, 1, pos)[0].item()
        return MetaValue(vtype, None, 1, bool(v) if vtype == _BOOL else v), pos + dt.itemsize
    if vtype != _ARRAY:
        raise ValueError(f"unknown value type {vtype}")
    etype, count = struct.unpack_from("<IQ", mv, pos)
    pos += 12
    if etype == _STRING:
        need, what = 8, "strings"
    elif etype in _NP:
        need, what = _NP[etype].itemsize, f"{_vtype_name(etype)} values"
    elif etype == _ARRAY:
        raise ValueError("an array of arrays is not supported (llama.cpp rejects it)")
    else:
        raise ValueError(f"an array of unknown value type {etype}")
    if count * need > size - pos:
        raise _Truncated(f"an array of {count} {what} cannot fit in the {size - pos} bytes left in the file")
    budget[0] -= count
    if budget[0] < 0:
        raise _Truncated(
            f"an array of {count} {what} takes the file past the limit of {MAX_ARRAY_ELEMS} array elements"
        )
    if etype == _STRING:
        return _walk_strings(data, mv, pos, count, size)
    arr = data[pos : pos + count * need].view(_NP[etype])  # a view of the map: no copy
    return MetaValue(vtype, etype, count, arr), pos + count * need


def _walk_strings(data: np.ndarray, mv: memoryview, pos: int, count: int, size: int) -> tuple[MetaValue, int]:
    """The ``count`` length-prefixed strings at ``pos`` as a :class:`StringArray`, and the end
    position: one tight loop over the lengths, no object per string."""
    u64 = _U64
    lens: list[int] = []
    append = lens.append
    start = pos
    try:
        for _ in repeat(None, count):  # the hot loop of a load: ~0.25 us per string
            n = u64(mv, pos)[0]
            append(n)
            pos += 8 + n
    except (struct.error, OverflowError):  # a length took pos past the end (or past 2**63)
        pos = size + 1
    if pos > size:
        raise _Truncated(f"string #{len(lens) - 1} of the array runs past the end of the file ({size} bytes)")
    ln = np.array(lens, np.int64)
    sa = StringArray(data[start:pos], np.cumsum(ln + 8) - ln, ln)  # starts: past each length field
    return MetaValue(_ARRAY, _STRING, count, sa), pos
