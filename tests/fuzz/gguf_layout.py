"""Where every structural field of a GGUF file sits, read byte by byte (independent of the
loader under test and of ``gguf.GGUFReader``), so that the mutators can hit each field by
name: the counts, every key's and string's length, value and element types, array lengths,
the tensor directory's dimension counts, dims, type ids and data offsets.

Only well-formed files are parsed here (the seeds); mutants are never parsed.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# GGUF value type -> (struct code, size) of the scalar types
SCALARS = {
    0: ("B", 1),
    1: ("b", 1),
    2: ("H", 2),
    3: ("h", 2),
    4: ("I", 4),
    5: ("i", 4),
    6: ("f", 4),
    7: ("?", 1),
    10: ("Q", 8),
    11: ("q", 8),
    12: ("d", 8),
}
STRING, ARRAY = 8, 9


@dataclass(frozen=True)
class Field:
    """One fixed-width field: ``kind`` (see :data:`KINDS`), position, width in bytes, the
    struct code it is written with, and a label naming it (key or tensor)."""

    kind: str
    pos: int
    size: int
    code: str
    label: str


#: field kinds the boundary mutator knows
KINDS = (
    "version",
    "n_tensors",
    "n_kv",
    "key_len",
    "value_type",
    "str_len",
    "array_type",
    "array_len",
    "scalar",
    "name_len",
    "n_dims",
    "dim",
    "tensor_type",
    "tensor_offset",
)


@dataclass
class Layout:
    """A parsed seed: its fields, its chunks (byte ranges of whole key/value entries and
    tensor directory entries, with labels) and where the header ends / the data begins."""

    fields: list[Field] = field(default_factory=list)
    kv_chunks: list[tuple[int, int, str]] = field(default_factory=list)
    tensor_chunks: list[tuple[int, int, str]] = field(default_factory=list)
    strings: list[tuple[int, int, str]] = field(default_factory=list)  # (pos, length, label) of string bytes
    header_end: int = 0  # end of the tensor directory
    data_start: int = 0  # first byte of the tensor data (after alignment padding)
    alignment: int = 32


def parse(buf: bytes) -> Layout:
    """The :class:`Layout` of a well-formed little-endian GGUF v2/v3 file ``buf``."""
    lay = Layout()
    pos = 0

    def fld(kind: str, code: str, label: str) -> int:
        nonlocal pos
        size = struct.calcsize("<" + code)
        lay.fields.append(Field(kind, pos, size, code, label))
        (value,) = struct.unpack_from("<" + code, buf, pos)
        pos += size
        return value

    def string(kind: str, label: str) -> str:
        nonlocal pos
        n = fld(kind, "Q", label)
        lay.strings.append((pos, n, label))
        s = buf[pos : pos + n].decode("utf-8", "replace")
        pos += n
        return s

    if buf[:4] != b"GGUF":
        raise ValueError("not a GGUF seed")
    pos = 4
    fld("version", "I", "header")
    n_tensors = fld("n_tensors", "Q", "header")
    n_kv = fld("n_kv", "Q", "header")
    for _ in range(n_kv):
        start = pos
        key = string("key_len", "key")
        vtype = fld("value_type", "I", key)
        if vtype == STRING:
            string("str_len", key)
        elif vtype == ARRAY:
            etype = fld("array_type", "I", key)
            count = fld("array_len", "Q", key)
            for i in range(count):
                if etype == STRING:
                    string("str_len", f"{key}[{i}]")
                else:
                    code, _size = SCALARS[etype]
                    fld("scalar", code, f"{key}[{i}]")
        else:
            value = fld("scalar", SCALARS[vtype][0], key)
            if key == "general.alignment":
                lay.alignment = int(value)
        lay.kv_chunks.append((start, pos, key))
    for _ in range(n_tensors):
        start = pos
        name = string("name_len", "tensor")
        n_dims = fld("n_dims", "I", name)
        for _d in range(n_dims):
            fld("dim", "Q", name)
        fld("tensor_type", "I", name)
        fld("tensor_offset", "Q", name)
        lay.tensor_chunks.append((start, pos, name))
    lay.header_end = pos
    lay.data_start = -(-pos // lay.alignment) * lay.alignment
    return lay
