"""A model's header as :func:`~powerinfer_backend.loader.load.load_gguf` keeps it, from
the fast parse (:func:`.gguf_meta.parse_header`): the metadata as typed values
(:func:`_read_kv`, :func:`_kv_to_str`) and the tensor directory as zero-copy views
(:func:`_tensor_infos`).

Also ``gguf.GGUFReader``, guarded (:class:`_Reader`), for the small files read with it
(sparsity sidecars): truncated, corrupt or hostile files raise a :class:`ValueError`
naming the file and the offending key or tensor instead of an arbitrary exception, a hang,
or a crash later in native code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFReader

from .gguf_meta import MAX_ARRAY_ELEMS as _MAX_ARRAY_ELEMS
from .gguf_meta import Header
from .gguf_meta import _check_entry as _check_meta_entry
from .types import _FLOAT_TYPES, _GGUF_MAGIC_U32, _MAX_DIMS, _SCALAR_NP, _V, _vtype_name

# GGUFReader's pseudo-fields, ahead of the file's keys in GGUFReader.fields
_READER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    ne: tuple[int, ...]
    type: int
    nbytes: int
    data: np.ndarray  # 1-D uint8 zero-copy view of the memory map


class _FileError(ValueError):
    """A finished error message (file path included), passed on unchanged."""


class _Corrupt(Exception):
    """The header, as GGUFReader reads it, is truncated or corrupt."""


_ITEMSIZE: dict[Any, int] = {}  # GGUFReader's dtypes (numpy scalar types) -> item size


class _Reader(GGUFReader):
    """``gguf.GGUFReader`` plus the guards :func:`~powerinfer_backend.loader.load.load_gguf` promises.

    GGUFReader does the parsing. Left alone, it reads past the end of the file
    as short (empty) arrays, so a corrupt array length makes it loop up to
    2**64 times; it builds one numpy view per array element (~1 KB, ~20 us),
    so even a corrupt length that stays inside a large file can take minutes
    and gigabytes; it reports a bad tensor entry as a bare numpy reshape or enum
    error; and its messages name neither the file nor the key or tensor. This
    subclass overrides four of its internal methods (gguf 0.19) to:

    - make any read that runs past the end of the file raise (``_get``);
    - refuse an array whose length cannot fit in the rest of the file, or that
      takes the file past :data:`_MAX_ARRAY_ELEMS` array elements
      (``_get_field_parts``);
    - remember which tensor directory entry is being read
      (``_get_tensor_info_field``);
    - check every tensor entry, by name, before GGUFReader maps its data:
      dimension count, type id, shape, row length against the type's block
      size, data offset against the alignment, data end against the file
      size (``_build_tensors``).

    Any exception from GGUFReader (IndexError, KeyError, MemoryError, ...)
    comes out as ValueError naming the file and the metadata key or tensor
    entry being read. The corrupt-file tests fail (or hang) if a gguf update
    stops these overrides from taking effect.
    """

    def __init__(self, path: str, pwri: bool = False):
        self._path = path
        self._pwri = pwri  # first four bytes "PWRI": read as "GGUF" (the magic patched in memory)
        self._entry: tuple[int, int] | None = None  # (index, file offset) being read
        self._n_entries = 0
        self._building = False
        self._n_array_elems = 0
        try:
            super().__init__(path, "r")
        except _FileError:
            raise
        except Exception as e:  # noqa: BLE001 - whatever GGUFReader raises
            raise self._error(e) from e
        if self.byte_order != "I":
            raise _FileError(f"{path}: big-endian GGUF files are not supported")

    # -- overrides of GGUFReader internals --

    def _get(self, offset, dtype, count=1, override_order=None):
        if self._pwri and int(offset) == 0 and np.dtype(dtype) == np.uint32 and int(count) == 1:
            return np.array([_GGUF_MAGIC_U32], dtype=np.uint32)
        itemsize = _ITEMSIZE.get(dtype)
        if itemsize is None:
            itemsize = _ITEMSIZE[dtype] = np.dtype(dtype).itemsize
        nbytes = itemsize * int(count)
        if int(offset) + nbytes > len(self.data):
            raise _Corrupt(
                f"{nbytes} bytes at byte {offset} run past the end of the file "
                f"({len(self.data)} bytes)"
            )
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        if int(raw_type) == _V.ARRAY:
            item_type = int(self._get(orig_offs, np.uint32)[0])
            count = int(self._get(orig_offs + 4, np.uint64)[0])
            self._n_array_elems += count
            left = len(self.data) - (orig_offs + 12)
            if count * _min_value_size(item_type) > left:
                raise _Corrupt(
                    f"an array of {count} {_vtype_name(item_type)} values cannot fit in the "
                    f"{left} bytes left in the file"
                )
            if self._n_array_elems > _MAX_ARRAY_ELEMS:
                raise _Corrupt(
                    f"an array of {count} {_vtype_name(item_type)} values takes the file past "
                    f"the limit of {_MAX_ARRAY_ELEMS} array elements"
                )
        return super()._get_field_parts(orig_offs, raw_type)

    def _get_tensor_info_field(self, orig_offs):
        self._entry = (self._n_entries, int(orig_offs))
        field_ = super()._get_tensor_info_field(orig_offs)
        self._entry = None
        self._n_entries += 1
        return field_

    def _build_tensors(self, start_offs, fields):
        self._building = True
        size = len(self.data)
        align = int(self.alignment)
        for f in fields:
            _name_len, _name, _n_dims, dims, raw_type, rel_offset = f.parts
            self._check_entry(f.name, [int(d) for d in dims], int(raw_type[0]),
                              int(rel_offset[0]), int(start_offs), align, size)
        super()._build_tensors(start_offs, fields)

    # -- helpers --

    def _check_entry(self, name: str, ne: list[int], ttype: int, rel: int, data_offset: int,
                     align: int, size: int) -> None:
        """The fast parser's entry checks (:func:`.gguf_meta._check_entry`), as _FileError."""
        if not 1 <= len(ne) <= _MAX_DIMS:
            raise _FileError(f"{self._path}: tensor '{name}' has {len(ne)} dimensions (supported: 1 to {_MAX_DIMS})")
        try:
            _check_meta_entry(self._path, name, tuple(ne), ttype, rel, data_offset, align, size)
        except ValueError as e:
            raise _FileError(str(e)) from None

    def _name_at(self, pos: int) -> str:
        """The GGUF string at ``pos`` as `` 'name'``, or "" if unreadable."""
        try:
            _n, raw = self._get_str(pos)
            return " '" + raw[:200].tobytes().decode("utf-8", "replace") + "'"
        except Exception:  # noqa: BLE001
            return ""

    def _where(self) -> str:
        """The header item GGUFReader was reading."""
        fields = getattr(self, "fields", None) or {}
        if "GGUF.kv_count" not in fields:
            return "the file header"
        n_kv = int(fields["GGUF.kv_count"].parts[0][0])
        n_done = len(fields) - len(_READER_FIELDS)
        if n_done < n_kv:
            last = next(reversed(fields.values()))
            pos = last.offset + sum(int(p.nbytes) for p in last.parts)
            return f"metadata key #{n_done}{self._name_at(pos)} at byte {pos}"
        if self._entry is not None:
            i, pos = self._entry
            return f"tensor #{i}{self._name_at(pos)} at byte {pos}"
        if self._building:
            return "the tensor directory"
        return "key 'general.alignment'"  # checked after the directory is read

    def _error(self, e: Exception) -> _FileError:
        if self.byte_order != "I" and "GGUF.version" in (getattr(self, "fields", None) or {}):
            return _FileError(f"{self._path}: big-endian GGUF files are not supported")
        where = self._where()
        if isinstance(e, _Corrupt):
            return _FileError(f"{self._path}: truncated or corrupt GGUF header: reading {where}: {e}")
        detail = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        return _FileError(f"{self._path}: not a valid GGUF file: reading {where}: {detail}")


def _min_value_size(vtype: int) -> int:
    """Fewest bytes a GGUF value of type ``vtype`` takes in the file."""
    if vtype == _V.STRING:
        return 8  # length
    if vtype == _V.ARRAY:
        return 12  # element type + length
    np_type = _SCALAR_NP.get(vtype)
    return np.dtype(np_type).itemsize if np_type is not None else 1


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
    return {t.name: _TensorInfo(t.name, t.ne, t.type, t.nbytes, data[t.offset: t.offset + t.nbytes])
            for t in h.tensors}


def _kv_to_str(vtype: int, value: Any) -> str:
    """Format a scalar value the way llama.cpp's gguf_kv_to_str does."""
    if vtype == _V.BOOL:
        return "true" if value else "false"
    if vtype in _FLOAT_TYPES:
        return f"{value:f}"
    return str(value)

