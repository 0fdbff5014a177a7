"""GGUF model loading: memory-map a GGUF file, validate it against the
architecture table (:mod:`powerinfer_backend.loader.arch`) and expose hyper-parameters,
metadata and zero-copy tensor views ready to hand to the native engine.

Entry point: :func:`load_gguf`.

The file is parsed by ``gguf.GGUFReader`` (the gguf package, maintained with
llama.cpp), with bounds and sanity checks added around it (:class:`_Reader`),
so that truncated, corrupt or hostile files raise a :class:`ValueError` naming
the file and the offending key or tensor instead of an arbitrary exception, a
hang, or a crash later in native code. Tensor data are never copied when their
type is one the kernels run (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K,
Q6_K); other types are converted once at load with ``gguf.quants`` and a
warning per tensor.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField
from gguf import quants as _quants

from . import arch as _arch
from .arch import ArchSpec, TensorSpec, layer_tensor_names  # noqa: F401  (re-exported)

__all__ = [
    "GGUFModel",
    "HParams",
    "TensorView",
    "UnsupportedTensorTypeWarning",
    "KERNEL_TYPES",
    "load_gguf",
    "layer_tensor_names",
]

GGUF_MAGIC = b"GGUF"
#: PowerInfer's own files: a GGUF whose first four bytes are "PWRI" (same layout).
PWRI_MAGIC = b"PWRI"
_GGUF_MAGIC_U32 = 0x46554747
#: Tensors of PowerInfer files kept in GGUFModel.extra_tensors (per layer).
PWRI_LAYER_TENSORS = ("fc1", "fc2", "ffn_down_t")
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS

_T = GGMLQuantizationType

#: ggml type ids the native kernels accept for weight matrices.
KERNEL_TYPES: frozenset[int] = frozenset(
    int(t)
    for t in (_T.F32, _T.F16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q8_0, _T.Q4_K, _T.Q5_K, _T.Q6_K, _T.BF16)
)

# Conversion work is done in chunks of about this many elements (bounds the
# temporary float32 memory to ~64 MiB whatever the tensor size).
_CONVERT_CHUNK_ELEMS = 1 << 24

# Sanity bounds for hyper-parameters ("absurd dimension" guard).
_MAX_N_EMBD = 1 << 20
_MAX_N_FF = 1 << 22
_MAX_N_LAYER = 1 << 12
_MAX_N_HEAD = 1 << 14
_MAX_N_VOCAB = 1 << 24
_MAX_N_CTX = 1 << 30
# Array elements per file: GGUFReader keeps ~1 KB and takes ~20 us per element,
# so a corrupt array length could otherwise take minutes and gigabytes. The
# largest real tokenizers (tokens + scores/types + merges) are under 800k.
_MAX_ARRAY_ELEMS = 1 << 21


class UnsupportedTensorTypeWarning(UserWarning):
    """A tensor's type is not run by the kernels and was converted at load."""


# ---- GGUF value types ------------------------------------------------------

_V = GGUFValueType
_INT_TYPES = frozenset(
    int(t) for t in (_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32, _V.UINT64, _V.INT64)
)
_FLOAT_TYPES = frozenset({int(_V.FLOAT32), int(_V.FLOAT64)})
# GGUFReader's pseudo-fields, ahead of the file's keys in GGUFReader.fields
_READER_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


# value type id -> numpy type of GGUFReader's scalar views
_SCALAR_NP = {int(k): v for k, v in GGUFReader.gguf_scalar_to_np.items()}


def _vtype_name(vtype: int) -> str:
    try:
        return _V(vtype).name.lower()
    except ValueError:
        return f"type {vtype}"


# ---- public data types -----------------------------------------------------


@dataclass(frozen=True)
class HParams:
    """Model hyper-parameters, validated (all sizes > 0, divisibility holds).

    Attributes:
        n_vocab: vocabulary size (rows of the token embedding).
        n_embd: hidden size.
        n_layer: number of transformer blocks.
        n_ff: feed-forward inner size.
        n_head: query heads.
        n_head_kv: key/value heads (divides n_head; < n_head means GQA).
        n_embd_head: head dimension.
        n_rot: rotated dimensions per head (even, <= n_embd_head).
        n_ctx_train: training context length in tokens.
        rms_eps: norm epsilon (RMSNorm, or LayerNorm when ``layer_norm``).
        rope_freq_base: RoPE base frequency (theta).
        rope_freq_scale: RoPE position multiplier, 1 / linear scaling factor.
        rope_type: enum pi_rope_type (:data:`arch.ROPE_NORM` for llama,
            :data:`arch.ROPE_NONE` for OPT).
        act: enum pi_act of the FFN gate activation (:data:`arch.ACT_SILU`).
        embd_scale: token embeddings multiplied by this (0 = not scaled;
            Gemma: sqrt(n_embd) as float32).
        attn_scale: 0 = attention scores scaled by 1/sqrt(n_embd_head); else
            queries are multiplied by it before attention (Gemma).
        n_swa: sliding window of the local layers in tokens (0 = none).
        swa_pattern: layer l is local when ``l % swa_pattern < swa_pattern - 1``
            (0 = all layers local when n_swa > 0).
        rope_freq_base_swa, rope_freq_scale_swa: RoPE of the local layers.
        layer_norm: 1 = LayerNorm with bias (Falcon, OPT), 0 = RMSNorm.
        parallel_residual: 1 = attention and FFN both read the layer input (Falcon).
        pos_offset: row of position 0 in ``position_embd.weight`` (OPT: 2).
    """

    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head: int
    n_rot: int
    n_ctx_train: int
    rms_eps: float
    rope_freq_base: float
    rope_freq_scale: float
    rope_type: int
    act: int
    embd_scale: float = 0.0
    attn_scale: float = 0.0
    n_swa: int = 0
    swa_pattern: int = 0
    rope_freq_base_swa: float = 0.0
    rope_freq_scale_swa: float = 0.0
    layer_norm: int = 0
    parallel_residual: int = 0
    pos_offset: int = 0

    def is_swa(self, layer: int) -> bool:
        """True when ``layer`` is a sliding-window (local) layer."""
        p = self.swa_pattern
        return self.n_swa > 0 and (p == 0 or layer % p < p - 1)

    @property
    def n_embd_q(self) -> int:
        """Query projection width, n_head * n_embd_head."""
        return self.n_head * self.n_embd_head

    @property
    def n_embd_kv(self) -> int:
        """Key/value projection width, n_head_kv * n_embd_head."""
        return self.n_head_kv * self.n_embd_head

    @property
    def n_gqa(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_head_kv

    @property
    def act_name(self) -> str:
        """Activation name ("silu", "gelu" or "relu")."""
        return {v: k for k, v in _arch.ACT_IDS.items()}[self.act]

    def dims(self) -> dict[str, int]:
        """Symbolic dimension name -> size, for :func:`arch.resolve_shape`."""
        return {
            "n_vocab": self.n_vocab,
            "n_embd": self.n_embd,
            "n_ff": self.n_ff,
            "n_embd_q": self.n_embd_q,
            "n_embd_kv": self.n_embd_kv,
            "n_embd_qkv": self.n_embd_q + 2 * self.n_embd_kv,
            "n_ctx_train": self.n_ctx_train,
            "n_rot_half": self.n_rot // 2,
            "n_embd_head": self.n_embd_head,
        }


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


@dataclass(eq=False)
class GGUFModel:
    """A loaded, validated GGUF model (see :func:`load_gguf`).

    Attributes:
        path: the file path as given (str).
        arch: ``general.architecture``.
        hparams: validated hyper-parameters.
        metadata: every non-array key -> value as str, formatted like
            llama.cpp / llama-cpp-python's ``Llama.metadata`` (ints in decimal,
            floats as C ``%f``, bools "true"/"false", strings verbatim).
        tensors: GGUF name -> :class:`TensorView` for every tensor the
            architecture uses (tensors it does not use are left out).
        version: GGUF format version (2 or 3).
        alignment: tensor data alignment in bytes.
        data_offset: file offset of the tensor data section.
        file_size: file size in bytes.
    """

    path: str
    arch: str
    hparams: HParams
    metadata: dict[str, str] = field(repr=False)
    tensors: dict[str, TensorView] = field(repr=False)
    version: int = 3
    alignment: int = _DEFAULT_ALIGNMENT
    data_offset: int = 0
    file_size: int = 0
    _kv: dict[str, Any] = field(default_factory=dict, repr=False)
    _mm: Any = field(default=None, repr=False)
    #: PowerInfer extras (``blk.N.fc1.weight``, ``blk.N.fc2.weight``, ``blk.N.ffn_down_t.weight``)
    extra_tensors: dict = field(default_factory=dict, repr=False)
    #: True when the file's magic is "PWRI" (PowerInfer's own GGUF)
    pwri: bool = False

    @property
    def spec(self) -> ArchSpec:
        """The architecture's :class:`arch.ArchSpec`."""
        return _arch.get_arch(self.arch)

    @property
    def tied_output(self) -> bool:
        """True when the file has no output.weight and the output projection
        reuses the token embedding."""
        return self.global_tensors()["output"] is None

    @property
    def max_positions(self) -> int:
        """Most positions the model can take (tokens): ``n_ctx_train``, and for learned
        absolute positions (OPT) no more than the table's rows past ``pos_offset``."""
        pe = self.global_tensors().get("pos_embd")
        n = self.hparams.n_ctx_train
        return min(n, int(pe.ne[1]) - self.hparams.pos_offset) if pe is not None else n

    def global_tensors(self) -> dict[str, TensorView | None]:
        """Slot name -> tensor for the model-wide slots, in
        :data:`arch.GLOBAL_SLOTS` order: ``tok_embd`` [n_embd, n_vocab],
        ``output_norm`` F32 [n_embd], ``output`` [n_embd, n_vocab] (None when
        tied to tok_embd), ``rope_freqs`` F32 [n_rot/2], ``output_norm_b`` F32
        [n_embd] (LayerNorm bias), ``pos_embd`` [n_embd, n_ctx_train] (learned
        positions, OPT); None when absent."""
        return {t.slot: self.tensors.get(t.name) if t.name else None for t in self.spec.global_tensors}

    def layer_tensors(self, i: int) -> list[TensorView | None]:
        """Layer ``i``'s tensors in enum pi_layer_slot order (None for optional
        slots the file or architecture does not have). A slot with a fallback
        (:attr:`arch.TensorSpec.fallback`) gives the fallback's tensor when the
        file lacks the primary (Falcon 7B: ``attn_norm`` fills both norm slots),
        so one tensor may appear in two slots.

        Raises:
            IndexError: ``i`` not in ``[0, n_layer)``.
        """
        if not 0 <= i < self.hparams.n_layer:
            raise IndexError(f"layer {i} out of range [0, {self.hparams.n_layer})")
        out = []
        for ts in self.spec.layer_tensors:  # a slot with a fallback: the primary, else the fallback
            t = self.tensors.get(ts.name.format(i=i)) if ts.name else None
            if t is None and ts.fallback:
                t = self.tensors.get(ts.fallback.format(i=i))
            out.append(t)
        return out

    def layer_tensor(self, i: int, slot: str) -> TensorView | None:
        """Layer ``i``'s tensor in slot ``slot`` (a name of :data:`arch.LAYER_SLOTS`, e.g.
        ``"ffn_down"``), as :meth:`layer_tensors` gives it; None when absent.

        Raises:
            IndexError: ``i`` not in ``[0, n_layer)``. KeyError: unknown slot name.
        """
        if slot not in _arch.LAYER_SLOTS:
            raise KeyError(f"unknown layer slot {slot!r}; slots: {', '.join(_arch.LAYER_SLOTS)}")
        return self.layer_tensors(i)[_arch.LAYER_SLOTS.index(slot)]

    def get_kv(self, key: str, default: Any = None) -> Any:
        """Typed value of metadata key ``key`` (``default`` when absent).

        Scalars come back as int / float / bool / str. String arrays (e.g.
        ``tokenizer.ggml.tokens``, ``tokenizer.ggml.merges``) come back as a
        list of str (invalid UTF-8 kept with ``surrogateescape``, so
        ``s.encode("utf-8", "surrogateescape")`` gives the exact bytes); numeric
        arrays as a read-only 1-D numpy array (bool arrays as uint8). Nested
        arrays come flattened, as ``gguf.GGUFReader`` reads them.
        """
        if key not in self._kv:
            return default
        vtype, value = self._kv[key]
        if isinstance(value, tuple):  # string array: a fresh list per call
            return list(value)
        return value

    def close(self) -> None:
        """Drop this object's references to the memory map. The mapping is
        released once no TensorView data (or other views) remain alive."""
        self.tensors = {}
        self._kv = {}
        self._mm = None

    def __repr__(self) -> str:
        hp = self.hparams
        return (
            f"GGUFModel(path={self.path!r}, arch={self.arch!r}, n_layer={hp.n_layer}, "
            f"n_embd={hp.n_embd}, n_vocab={hp.n_vocab}, tensors={len(self.tensors)})"
        )


# ---- reading the file: gguf.GGUFReader ------------------------------------------


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


def _type_name(t: int) -> str:
    try:
        return _T(t).name
    except ValueError:
        return f"type {t}"


_ITEMSIZE: dict[Any, int] = {}  # GGUFReader's dtypes (numpy scalar types) -> item size


class _Reader(GGUFReader):
    """``gguf.GGUFReader`` plus the guards :func:`load_gguf` promises.

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
        def fail(msg: str) -> _FileError:
            return _FileError(f"{self._path}: tensor '{name}' {msg}")

        if not 1 <= len(ne) <= _MAX_DIMS:
            raise fail(f"has {len(ne)} dimensions (supported: 1 to {_MAX_DIMS})")
        try:
            qtype = _T(ttype)
            block, tsize = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise fail(f"has unknown type id {ttype}") from None
        if any(d <= 0 or d >= 1 << 40 for d in ne):
            raise fail(f"has an absurd shape {ne}")
        if ne[0] % block:
            raise fail(
                f"of type {qtype.name} has row length ne[0] = {ne[0]}, not a multiple of the "
                f"type's block size {block}"
            )
        if rel % align:
            raise fail(f"data offset {rel} is not a multiple of the alignment {align}")
        start = data_offset + rel
        end = start + math.prod(ne) // block * tsize
        if end > size:
            raise fail(
                f"data (bytes {start} to {end}) runs past the end of the file ({size} bytes): "
                "the file is truncated or corrupt"
            )

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


def _array_value(f: ReaderField) -> Any:
    """An array field's elements: a tuple of str (invalid UTF-8 kept with
    surrogateescape) or a read-only 1-D numpy array (bool as uint8). Nested
    arrays come flattened, as GGUFReader reads them."""
    elems = [f.parts[i] for i in f.data]
    etype = int(f.types[-1]) if len(f.types) > 1 else int(f.parts[3][0])
    if etype == _V.STRING:
        return tuple(e.tobytes().decode("utf-8", "surrogateescape") for e in elems)
    if elems:
        arr = np.concatenate(elems)
    else:
        arr = np.empty(0, dtype=_SCALAR_NP.get(etype, np.uint8))
    if arr.dtype == np.bool_:
        arr = arr.view(np.uint8)
    arr.flags.writeable = False
    return arr


def _read_kv(path: str, r: GGUFReader) -> dict[str, tuple[int, Any]]:
    """key -> (value type, value) for every metadata key of ``r``: scalars as
    int / float / bool / str (invalid UTF-8 replaced), arrays as by
    :func:`_array_value` (decoded once here, so the model need not keep
    GGUFReader's per-element fields alive)."""
    kv: dict[str, tuple[int, Any]] = {}
    for key, f in r.fields.items():
        if key in _READER_FIELDS:
            continue
        vtype = int(f.types[0])
        try:
            if vtype == _V.ARRAY:
                value = _array_value(f)
            elif vtype == _V.STRING:
                value = f.parts[-1].tobytes().decode("utf-8", "replace")
            else:
                value = f.contents()
        except Exception as e:  # noqa: BLE001
            raise _FileError(f"{path}: cannot read the value of key '{key}': {e}") from e
        kv[key] = (vtype, value)
    return kv


def _tensor_infos(path: str, r: GGUFReader) -> dict[str, _TensorInfo]:
    infos: dict[str, _TensorInfo] = {}
    for t in r.tensors:
        data = t.data.reshape(-1).view(np.uint8)  # views of GGUFReader's memmap: no copy
        if data.nbytes != t.n_bytes:  # ruled out by _Reader._check_entry; never trust silently
            raise _FileError(
                f"{path}: tensor '{t.name}' data has {data.nbytes} bytes, expected {t.n_bytes}"
            )
        infos[t.name] = _TensorInfo(
            t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.n_bytes), data
        )
    return infos


def _kv_to_str(vtype: int, value: Any) -> str:
    """Format a scalar value the way llama.cpp's gguf_kv_to_str does."""
    if vtype == _V.BOOL:
        return "true" if value else "false"
    if vtype in _FLOAT_TYPES:
        return f"{value:f}"
    return str(value)


# ---- hyper-parameters --------------------------------------------------------

_MISSING = object()


class _KVAccess:
    def __init__(self, path: str, kv: dict[str, tuple[int, Any]]):
        self.path = path
        self.kv = kv

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"{self.path}: {msg}")

    def _raw(self, key: str, default: Any) -> tuple[int, Any] | None:
        if key not in self.kv:
            if default is _MISSING:
                raise self.fail(f"missing required metadata key '{key}'")
            return None
        vtype, value = self.kv[key]
        if vtype == _V.ARRAY:
            raise self.fail(f"key '{key}' is an array; per-layer values are not supported")
        return vtype, value

    def get_int(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype not in _INT_TYPES:
            raise self.fail(
                f"key '{key}' has type {_vtype_name(vtype)}, expected an integer"
            )
        if not lo <= value <= hi:
            raise self.fail(f"key '{key}' = {value} is out of range [{lo}, {hi}]")
        return value

    def get_float(self, key: str, lo: float, hi: float, default: Any = _MISSING,
              lo_inclusive: bool = False) -> float:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype not in _FLOAT_TYPES and vtype not in _INT_TYPES:
            raise self.fail(
                f"key '{key}' has type {_vtype_name(vtype)}, expected a number"
            )
        value = float(value)
        ok_lo = value >= lo if lo_inclusive else value > lo
        if not (math.isfinite(value) and ok_lo and value <= hi):
            raise self.fail(f"key '{key}' = {value} is out of range ({lo}, {hi}]")
        return value

    def get_str(self, key: str, default: Any = _MISSING) -> str:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype != _V.STRING:
            raise self.fail(
                f"key '{key}' has type {_vtype_name(vtype)}, expected a string"
            )
        return value


def _read_hparams(path: str, spec: ArchSpec, kv: dict, infos: dict[str, _TensorInfo]):
    """Returns (HParams, {dimension name: where its value came from})."""
    a = _KVAccess(path, kv)
    key = spec.key
    src: dict[str, str] = {}

    n_expert = a.get_int(key("n_expert"), 0, 1 << 16, default=0)
    if n_expert > 0:
        raise a.fail(f"key '{key('n_expert')}' = {n_expert}: mixture-of-experts models are not supported")

    n_layer = a.get_int(key("n_layer"), 1, _MAX_N_LAYER)
    n_embd = a.get_int(key("n_embd"), 1, _MAX_N_EMBD)
    n_ff = a.get_int(key("n_ff"), 1, _MAX_N_FF)
    n_head = a.get_int(key("n_head"), 1, _MAX_N_HEAD)
    n_head_kv = a.get_int(key("n_head_kv"), 1, n_head, default=n_head)
    if n_head % n_head_kv:
        raise a.fail(
            f"key '{key('n_head')}' = {n_head} is not a multiple of "
            f"'{key('n_head_kv')}' = {n_head_kv}"
        )
    n_ctx_train = a.get_int(key("n_ctx_train"), 1, _MAX_N_CTX)
    if key("n_embd_head") in kv:
        n_embd_head = a.get_int(key("n_embd_head"), 1, _MAX_N_HEAD)
        src["n_embd_head"] = key("n_embd_head")
    else:
        if n_embd % n_head:
            raise a.fail(
                f"key '{key('n_embd')}' = {n_embd} is not a multiple of "
                f"'{key('n_head')}' = {n_head} (and '{key('n_embd_head')}' is absent)"
            )
        n_embd_head = n_embd // n_head
        src["n_embd_head"] = f"{key('n_embd')} / {key('n_head')}"
    n_embd_head_v = a.get_int(key("n_embd_head_v"), 1, _MAX_N_HEAD, default=n_embd_head)
    if n_embd_head_v != n_embd_head:
        raise a.fail(
            f"key '{key('n_embd_head_v')}' = {n_embd_head_v} differs from the key length "
            f"{n_embd_head}; unequal key/value head sizes are not supported"
        )
    n_rot = a.get_int(key("n_rot"), 1, n_embd_head, default=n_embd_head)
    if n_rot % 2:
        raise a.fail(f"key '{key('n_rot')}' = {n_rot} must be even")

    # (Falcon requires its layer_norm_epsilon, as llama.cpp does; OPT files have none: HF's 1e-5)
    rms_eps = a.get_float(key("rms_eps"), 0.0, 1.0,
                          default=_MISSING if "rms_eps" in spec.required_keys else _arch.DEFAULT_RMS_EPS)
    rope_freq_base = a.get_float(key("rope_freq_base"), 0.0, 1e12, default=_arch.DEFAULT_ROPE_FREQ_BASE)
    scaling = a.get_str(key("rope_scaling_type"), default="none")
    if scaling not in spec.rope_scaling_types:
        raise a.fail(
            f"key '{key('rope_scaling_type')}' = {scaling!r} is not supported "
            f"(supported: {', '.join(spec.rope_scaling_types)})"
        )
    # As llama.cpp: the factor applies whenever given (0 = none); the legacy
    # key name is the fallback.
    factor = 0.0
    for name in ("rope_scaling_factor", "rope_scale_linear"):
        if key(name) in kv:
            factor = a.get_float(key(name), 0.0, 1e6, lo_inclusive=True)
            break
    rope_freq_scale = 1.0 if factor == 0.0 else 1.0 / factor

    # vocabulary size: explicit key, else the token list, else the embedding
    if key("n_vocab") in kv:
        n_vocab = a.get_int(key("n_vocab"), 1, _MAX_N_VOCAB)
        src["n_vocab"] = key("n_vocab")
    elif _arch.TOKENS_KEY in kv and kv[_arch.TOKENS_KEY][0] == _V.ARRAY:
        n_vocab = len(kv[_arch.TOKENS_KEY][1])
        if not 1 <= n_vocab <= _MAX_N_VOCAB:
            raise a.fail(f"key '{_arch.TOKENS_KEY}' has {n_vocab} entries (expected 1 to {_MAX_N_VOCAB})")
        src["n_vocab"] = f"length of {_arch.TOKENS_KEY}"
    else:
        emb = infos.get(spec.global_tensors[0].name)
        if emb is None or len(emb.ne) < 2:
            raise a.fail(
                f"cannot tell the vocabulary size: no '{key('n_vocab')}' key, no "
                f"'{_arch.TOKENS_KEY}' array and no usable '{spec.global_tensors[0].name}'"
            )
        n_vocab = emb.ne[1]
        if not 1 <= n_vocab <= _MAX_N_VOCAB:
            raise a.fail(f"tensor '{emb.name}' implies an absurd vocabulary size {n_vocab}")
        src["n_vocab"] = f"tensor {emb.name}"

    def origin(name: str, default: str) -> str:
        return key(name) if key(name) in kv else default

    src.update(
        n_embd=key("n_embd"),
        n_ff=key("n_ff"),
        n_embd_q=f"n_head {n_head} * head dim {n_embd_head}",
        n_embd_kv=(
            f"n_head_kv {n_head_kv} ({origin('n_head_kv', 'default = n_head')}) "
            f"* head dim {n_embd_head}"
        ),
        n_rot_half=f"n_rot {n_rot} ({origin('n_rot', 'default = head dim')}) / 2",
        n_embd_head=src["n_embd_head"],
        n_embd_qkv=f"(n_head {n_head} + 2 * n_head_kv {n_head_kv}) * head dim {n_embd_head}",
        n_ctx_train=key("n_ctx_train"),
    )
    # sliding window (Gemma 3, Mistral): local layers by pattern, their own RoPE base
    n_swa = a.get_int(key("n_swa"), 0, _MAX_N_CTX, default=0) if spec.sliding_window else 0
    swa_pattern = a.get_int(key("swa_pattern"), 0, _MAX_N_LAYER, default=spec.swa_pattern) if n_swa else 0
    rope_freq_base_swa = 0.0
    if n_swa:
        rope_freq_base_swa = a.get_float(key("rope_freq_base_swa"), 0.0, 1e12,
                                         default=spec.rope_freq_base_swa or rope_freq_base)
    hp = HParams(
        n_vocab=n_vocab,
        n_embd=n_embd,
        n_layer=n_layer,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_embd_head=n_embd_head,
        n_rot=n_rot,
        n_ctx_train=n_ctx_train,
        rms_eps=rms_eps,
        rope_freq_base=rope_freq_base,
        rope_freq_scale=rope_freq_scale,
        rope_type=spec.rope_type,
        act=_ffn_act(a, spec),
        embd_scale=float(np.sqrt(np.float32(n_embd))) if spec.embd_scale_sqrt else 0.0,
        attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(n_embd_head))) if spec.q_pre_scale else 0.0,
        n_swa=n_swa,
        swa_pattern=swa_pattern,
        rope_freq_base_swa=rope_freq_base_swa,
        rope_freq_scale_swa=1.0 if n_swa else 0.0,
        layer_norm=int(spec.layer_norm),
        parallel_residual=int(spec.parallel_residual),
        pos_offset=spec.pos_offset,
    )
    return hp, src


def _ffn_act(a, spec) -> int:
    """The FFN activation: :data:`arch.FFN_ACT_KEY` when present, "relu" for a
    PowerInfer-converted llama or falcon file (:data:`arch.POWERINFER_THRESHOLD_KEY`),
    else the architecture's own."""
    name = a.get_str(_arch.FFN_ACT_KEY, None)
    if name is None:
        relu_file = spec.powerinfer_relu and _arch.POWERINFER_THRESHOLD_KEY in a.kv
        return _arch.ACT_IDS["relu" if relu_file else spec.act]
    if name not in _arch.ACT_IDS:
        raise a.fail(f"key '{_arch.FFN_ACT_KEY}' = {name!r}; supported: {sorted(_arch.ACT_IDS)}")
    gated = any(t.slot == "ffn_gate" and t.name for t in spec.layer_tensors)
    if name == "drelu" and not gated:  # relu(gate) * relu(up) needs a gate
        raise a.fail(f"key '{_arch.FFN_ACT_KEY}' = 'drelu' needs a gated FFN; this architecture's FFN has no gate "
                     f"(use 'relu' or 'gelu')")
    return _arch.ACT_IDS[name]


# ---- tensor conversion ---------------------------------------------------------


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
            f"{path}: tensor '{info.name}' has integer type {_type_name(t)}; expected a float "
            "or quantized type"
        )
    if kind == _arch.KIND_F32:
        if t == _T.F32:
            return TensorView(info.name, t, info.ne, raw, info.nbytes)
        if t not in (_T.F16, _T.BF16):
            warnings.warn(
                f"{info.name}: {_type_name(t)} is not supported for this tensor; "
                "converted to F32 at load",
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
            f"{info.name}: {_type_name(t)} is not supported by the kernels; converted to "
            f"{_type_name(dst)} at load",
            UnsupportedTensorTypeWarning,
            stacklevel=3,
        )
    data = _convert(path, info, raw, dst)
    return TensorView(info.name, dst, info.ne, data, int(data.nbytes), converted_from=t)


def _untranspose(name: str, dt: TensorView) -> TensorView:
    """ffn_down [n_ff, n_embd] from a transposed ffn_down_t [n_embd, n_ff]: F32 when
    ffn_down_t is F32, else F16 (exact for F16; rounds quantized values to F16)."""
    n_embd, n_ff = dt.ne
    vals = _quants.dequantize(dt.data, dt.type).reshape(n_ff, n_embd)
    dst = _T.F32 if dt.type == _T.F32 else _T.F16
    arr = np.ascontiguousarray(vals.T.astype(np.float32 if dst == _T.F32 else np.float16))
    raw = arr.reshape(-1).view(np.uint8)
    return TensorView(name, int(dst), (n_ff, n_embd), raw, int(raw.nbytes), converted_from=int(dt.type))


def _pad4(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (_MAX_DIMS - len(ne))


# ---- entry point ---------------------------------------------------------------


def load_gguf(path: str | os.PathLike, *, verbose: bool = True) -> GGUFModel:
    """Memory-map and validate the GGUF model at ``path``.

    The header is parsed and checked (keys, tensor directory, bounds of every
    tensor's data against the file size), hyper-parameters are read with their
    defaults (:mod:`powerinfer_backend.loader.arch`), and every tensor the
    architecture uses is checked for presence and shape (GGUF ne order).

    Tensor data of kernel types (:data:`KERNEL_TYPES`: F32, F16, BF16, Q4_0,
    Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K) are zero-copy read-only views of the memory map. Other types
    are converted once: weight matrices to Q8_0 (F16 if the row length is not a
    multiple of 32; F32 for F64), with one :class:`UnsupportedTensorTypeWarning`
    per tensor naming it and both types. Norm weights and rope_freqs are always
    F32 (F16/BF16 converted silently, anything else with a warning).

    Args:
        path: file path (str or path-like).
        verbose: print a one-line summary (arch, layers, sizes, tensor types)
            to stderr.

    Returns:
        The :class:`GGUFModel`. Keep it (or its tensors) alive while the engine
        uses the tensor data.

    Raises:
        ValueError: with the file path and the offending key or tensor in the
            message, for: a missing path ("Model path does not exist: ..."), a
            file that is not GGUF (wrong magic), an unsupported GGUF version or
            byte order, a truncated or corrupt header (including metadata arrays
            too long for the file, or over 2**21 array elements in all), tensor
            data past the end of the file, an unknown architecture, a missing required key or
            tensor, a key of the wrong type or out of range (absurd dimension,
            n_head not a multiple of n_head_kv, ...), unsupported rope scaling
            (e.g. "yarn"), a tensor of the wrong shape (message gives expected
            and found), a row length that is not a multiple of the type's
            block size, or a tensor type that can neither be used nor converted.
    """
    path_str = os.fspath(path)
    if isinstance(path_str, bytes):
        path_str = os.fsdecode(path_str)
    if not os.path.exists(path_str):
        raise ValueError(f"Model path does not exist: {path_str}")
    if not os.path.isfile(path_str):
        raise ValueError(f"{path_str}: not a regular file")
    try:
        size = os.path.getsize(path_str)
        with open(path_str, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ValueError(f"{path_str}: cannot read the file: {e}") from e
    if magic not in (GGUF_MAGIC, PWRI_MAGIC):
        raise ValueError(f"{path_str}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r} "
                         f"or PowerInfer's {PWRI_MAGIC!r})")
    pwri = magic == PWRI_MAGIC

    reader = _Reader(path_str, pwri=pwri)
    kv = _read_kv(path_str, reader)
    infos = _tensor_infos(path_str, reader)

    if "general.architecture" not in kv:
        raise ValueError(f"{path_str}: missing required metadata key 'general.architecture'")
    atype, arch_name = kv["general.architecture"]
    if atype != _V.STRING:
        raise ValueError(f"{path_str}: key 'general.architecture' is not a string")
    if arch_name not in _arch.ARCHITECTURES:
        raise ValueError(
            f"{path_str}: unknown model architecture '{arch_name}' (key 'general.architecture'); "
            f"supported: {', '.join(sorted(_arch.ARCHITECTURES))}"
        )
    spec = _arch.get_arch(arch_name)
    hp, dim_src = _read_hparams(path_str, spec, kv, infos)
    dims = hp.dims()

    def expected(ts: TensorSpec) -> tuple[int, ...]:
        return _arch.resolve_shape(ts.shape, dims)

    wanted: list[tuple[str, TensorSpec]] = [(ts.name, ts) for ts in spec.global_tensors if ts.name]
    alternative: dict[str, str] = {}  # fallback name -> the primary it stands in for (error messages)
    for i in range(hp.n_layer):
        for ts in spec.layer_tensors:
            if not ts.name:
                continue
            name = ts.name.format(i=i)
            stem = name.rsplit(".", 1)[0] + "."
            if ts.fallback and not any(n.startswith(stem) for n in infos):
                # e.g. Falcon 7B: no blk.N.attn_norm_2.*, the one attn_norm serves attention too
                if ts.fallback not in {t.name for t in spec.layer_tensors}:  # not a tensor in its own right
                    alternative[ts.fallback.format(i=i)] = name
                name = ts.fallback.format(i=i)
            wanted.append((name, ts))

    tensors: dict[str, TensorView] = {}
    extra: dict[str, TensorView] = {}
    for i in range(hp.n_layer):
        for stem in PWRI_LAYER_TENSORS:
            name = f"blk.{i}.{stem}.weight"
            if name in infos:
                info = infos[name]
                if len(info.ne) != 2:
                    raise ValueError(f"{path_str}: layer {i}: tensor '{name}' has shape {list(info.ne)}, "
                                     f"expected 2 dimensions")
                extra[name] = _make_view(path_str, info, info.data, _arch.KIND_MATRIX)
    for name, ts in wanted:
        info = infos.get(name)
        dt_name = name.replace(".ffn_down.", ".ffn_down_t.")
        if info is None and name.endswith(".ffn_down.weight") and dt_name in extra:
            # PowerInfer files store only the transposed down: rebuild ffn_down for the dense path
            dt = extra[dt_name]
            if tuple(dt.ne) != (hp.n_embd, hp.n_ff):
                raise ValueError(f"{path_str}: tensor '{dt_name}' has shape {list(dt.ne)}, expected "
                                 f"{[hp.n_embd, hp.n_ff]} (n_embd, n_ff)")
            tensors[name] = _untranspose(name, dt)
            continue
        if info is None:
            if ts.required:
                alt = f" (or '{alternative[name]}')" if name in alternative else ""
                raise ValueError(f"{path_str}: missing tensor '{name}'{alt}")
            continue
        exp = expected(ts)
        if _pad4(info.ne) != _pad4(exp):
            notes = ", ".join(f"{d} = {dims[d]} from {dim_src[d]}" for d in dict.fromkeys(ts.shape))
            raise ValueError(
                f"{path_str}: tensor '{name}' has shape {list(info.ne)}, expected {list(exp)} "
                f"({notes})"
            )
        if name in tensors:  # a fallback already loaded for another slot
            continue
        tensors[name] = _make_view(path_str, info, info.data, ts.kind)

    unused = [n for n in infos if n not in tensors and n not in extra]
    if unused:
        shown = ", ".join(unused[:5]) + (", ..." if len(unused) > 5 else "")
        warnings.warn(
            f"{path_str}: {len(unused)} tensor(s) not used by architecture '{arch_name}' "
            f"were ignored: {shown}",
            stacklevel=2,
        )

    metadata = {k: _kv_to_str(t, v) for k, (t, v) in kv.items() if t != _V.ARRAY}

    model = GGUFModel(
        path=path_str,
        arch=arch_name,
        hparams=hp,
        metadata=metadata,
        tensors=tensors,
        version=int(reader.fields["GGUF.version"].parts[0][0]),
        alignment=int(reader.alignment),
        data_offset=int(reader.data_offset),
        file_size=size,
        _kv=kv,
        _mm=reader.data,
        extra_tensors=extra,
        pwri=pwri,
    )
    if verbose:
        _print_summary(model)
    return model


def _print_summary(model: GGUFModel) -> None:
    hp = model.hparams
    types = Counter(t.type_name for t in model.tensors.values())
    n_conv = sum(1 for t in model.tensors.values() if t.converted_from is not None)
    type_str = ", ".join(f"{n} {name}" for name, n in types.most_common())
    mib = sum(t.nbytes for t in model.tensors.values()) / (1 << 20)
    print(
        f"powerinfer_backend: loaded {model.path}: arch={model.arch} n_layer={hp.n_layer} "
        f"n_embd={hp.n_embd} n_ff={hp.n_ff} n_head={hp.n_head} n_head_kv={hp.n_head_kv} "
        f"n_vocab={hp.n_vocab} n_ctx_train={hp.n_ctx_train} "
        f"output={'tied' if model.tied_output else 'separate'}; tensors: {type_str} "
        f"({mib:.1f} MiB{f', {n_conv} converted at load' if n_conv else ''})",
        file=sys.stderr,
    )
