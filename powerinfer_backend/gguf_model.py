"""GGUF model loading: memory-map a GGUF file, validate it against the
architecture table (:mod:`powerinfer_backend.arch`) and expose hyper-parameters,
metadata and zero-copy tensor views ready to hand to the native engine.

Entry point: :func:`load_gguf`.

The GGUF header (key/value metadata and tensor directory) is parsed here with
strict bounds checks, so that truncated, corrupt or hostile files raise a
:class:`ValueError` naming the file and the offending key or tensor instead of
an arbitrary exception (or a crash later in native code). Tensor data are never
copied when their type is one the kernels run (F32, F16, BF16, Q4_0, Q4_1,
Q8_0); other types are converted once at load with ``gguf.quants`` and a
warning per tensor.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
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
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS

_T = GGMLQuantizationType

#: ggml type ids the native kernels accept for weight matrices.
KERNEL_TYPES: frozenset[int] = frozenset(
    int(t) for t in (_T.F32, _T.F16, _T.Q4_0, _T.Q4_1, _T.Q8_0, _T.BF16)
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


class UnsupportedTensorTypeWarning(UserWarning):
    """A tensor's type is not run by the kernels and was converted at load."""


# ---- GGUF value types ------------------------------------------------------

_GT_STRING = 8
_GT_ARRAY = 9
_SCALAR_FMT = {
    0: "<B",  # UINT8
    1: "<b",  # INT8
    2: "<H",  # UINT16
    3: "<h",  # INT16
    4: "<I",  # UINT32
    5: "<i",  # INT32
    6: "<f",  # FLOAT32
    7: "<B",  # BOOL
    10: "<Q",  # UINT64
    11: "<q",  # INT64
    12: "<d",  # FLOAT64
}
_SCALAR_SIZE = {t: struct.calcsize(f) for t, f in _SCALAR_FMT.items()}
_SCALAR_DTYPE = {
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4",
    6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8", 12: "<f8",
}
_INT_TYPES = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_FLOAT_TYPES = frozenset({6, 12})
_GT_BOOL = 7
_VALUE_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32",
    6: "float32", 7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64",
    12: "float64",
}


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
        rms_eps: RMSNorm epsilon.
        rope_freq_base: RoPE base frequency (theta).
        rope_freq_scale: RoPE position multiplier, 1 / linear scaling factor.
        rope_type: enum pi_rope_type (:data:`arch.ROPE_NORM` for llama).
        act: enum pi_act of the FFN gate activation (:data:`arch.ACT_SILU`).
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
            "n_rot_half": self.n_rot // 2,
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

    @property
    def spec(self) -> ArchSpec:
        """The architecture's :class:`arch.ArchSpec`."""
        return _arch.get_arch(self.arch)

    @property
    def tied_output(self) -> bool:
        """True when the file has no output.weight and the output projection
        reuses the token embedding."""
        return self.global_tensors()["output"] is None

    def global_tensors(self) -> dict[str, TensorView | None]:
        """Slot name -> tensor for the model-wide slots, in
        :data:`arch.GLOBAL_SLOTS` order: ``tok_embd`` [n_embd, n_vocab],
        ``output_norm`` F32 [n_embd], ``output`` [n_embd, n_vocab] (None when
        tied to tok_embd), ``rope_freqs`` F32 [n_rot/2] (None when absent)."""
        return {t.slot: self.tensors.get(t.name) for t in self.spec.global_tensors}

    def layer_tensors(self, i: int) -> list[TensorView]:
        """Layer ``i``'s 9 tensors in enum pi_layer_slot order.

        Raises:
            IndexError: ``i`` not in ``[0, n_layer)``.
        """
        if not 0 <= i < self.hparams.n_layer:
            raise IndexError(f"layer {i} out of range [0, {self.hparams.n_layer})")
        return [self.tensors[n] for n in self.spec.layer_tensor_names(i)]

    def get_kv(self, key: str, default: Any = None) -> Any:
        """Typed value of metadata key ``key`` (``default`` when absent).

        Scalars come back as int / float / bool / str. String arrays (e.g.
        ``tokenizer.ggml.tokens``, ``tokenizer.ggml.merges``) come back as a
        list of str (invalid UTF-8 kept with ``surrogateescape``, so
        ``s.encode("utf-8", "surrogateescape")`` gives the exact bytes); numeric
        arrays as a read-only 1-D numpy array (bool arrays as uint8).
        """
        if key not in self._kv:
            return default
        vtype, value = self._kv[key]
        if vtype != _GT_ARRAY:
            return value
        return _decode_array(self._mm, value)

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


# ---- header parsing ----------------------------------------------------------


@dataclass(frozen=True)
class _ArrayRef:
    elem_type: int
    count: int
    offset: int  # file offset of the first element


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    ne: tuple[int, ...]
    type: int
    offset: int  # relative to the data section
    nbytes: int


class _HeaderReader:
    """Bounds-checked cursor over the memory-mapped file."""

    def __init__(self, path: str, buf: memoryview, size: int):
        self.path = path
        self.buf = buf
        self.size = size
        self.pos = 0

    def fail(self, msg: str) -> ValueError:
        return ValueError(f"{self.path}: {msg}")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"truncated or corrupt GGUF header: {what} at byte {self.pos} needs {n} bytes "
                f"but the file has {self.size} bytes"
            )

    def scalar(self, vtype: int, what: str) -> Any:
        n = _SCALAR_SIZE[vtype]
        self.need(n, what)
        (v,) = struct.unpack_from(_SCALAR_FMT[vtype], self.buf, self.pos)
        self.pos += n
        if vtype == _GT_BOOL:
            return v != 0
        return v

    def u32(self, what: str) -> int:
        return self.scalar(4, what)

    def u64(self, what: str) -> int:
        return self.scalar(10, what)

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return b

    def name(self, what: str) -> str:
        b = self.raw_string(what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {self.pos - len(b)} is not valid UTF-8") from None

    def value(self, vtype: int, key: str) -> Any:
        what = f"value of key '{key}'"
        if vtype in _SCALAR_FMT:
            return self.scalar(vtype, what)
        if vtype == _GT_STRING:
            return self.raw_string(what).decode("utf-8", "replace")
        if vtype == _GT_ARRAY:
            etype = self.u32(f"element type of key '{key}'")
            count = self.u64(f"element count of key '{key}'")
            start = self.pos
            if etype in _SCALAR_FMT:
                self.need(count * _SCALAR_SIZE[etype], what)
                self.pos += count * _SCALAR_SIZE[etype]
            elif etype == _GT_STRING:
                # each element takes at least its 8-byte length
                self.need(count * 8, what)
                buf, size, pos = self.buf, self.size, self.pos
                unpack = struct.Struct("<Q").unpack_from
                for _ in range(count):
                    if pos + 8 > size:
                        break
                    pos += 8 + unpack(buf, pos)[0]
                    if pos > size:
                        break
                else:
                    self.pos = pos
                    return _ArrayRef(etype, count, start)
                self.pos = min(pos, size)
                raise self.fail(
                    f"truncated or corrupt GGUF header: string array of key '{key}' runs past "
                    f"the end of the file ({size} bytes)"
                )
            elif etype == _GT_ARRAY:
                raise self.fail(f"key '{key}': nested arrays are not supported")
            else:
                raise self.fail(f"key '{key}': unknown array element type {etype}")
            return _ArrayRef(etype, count, start)
        raise self.fail(f"key '{key}': unknown value type {vtype}")


def _type_name(t: int) -> str:
    try:
        return _T(t).name
    except ValueError:
        return f"type {t}"


def _parse_header(path: str, mm: np.ndarray, size: int):
    """Parse the GGUF header. Returns (version, kv, tensor infos, alignment,
    data_offset); kv maps key -> (value type, value or _ArrayRef)."""
    r = _HeaderReader(path, memoryview(mm), size)
    r.need(4, "magic")
    r.pos = 4
    version = r.u32("version")
    if version not in _SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in _SUPPORTED_VERSIONS:
            raise r.fail("big-endian GGUF files are not supported")
        raise r.fail(f"unsupported GGUF version {version} (supported: 2, 3)")
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata key count")
    # every key takes >= 12 bytes, every tensor info >= 28: reject absurd counts early
    if n_kv * 12 > size or n_tensors * 28 > size:
        raise r.fail(
            f"corrupt GGUF header: {n_kv} keys / {n_tensors} tensors cannot fit in {size} bytes"
        )

    kv: dict[str, tuple[int, Any]] = {}
    for k in range(n_kv):
        key = r.name(f"name of metadata key #{k}")
        vtype = r.u32(f"value type of key '{key}'")
        value = r.value(vtype, key)
        if key in kv:
            raise r.fail(f"duplicate metadata key '{key}'")
        kv[key] = (vtype, value)

    infos: dict[str, _TensorInfo] = {}
    for k in range(n_tensors):
        name = r.name(f"name of tensor #{k}")
        n_dims = r.u32(f"dimension count of tensor '{name}'")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise r.fail(f"tensor '{name}' has {n_dims} dimensions (supported: 1 to {_MAX_DIMS})")
        ne = tuple(r.u64(f"shape of tensor '{name}'") for _ in range(n_dims))
        ttype = r.u32(f"type of tensor '{name}'")
        offset = r.u64(f"data offset of tensor '{name}'")
        if name in infos:
            raise r.fail(f"duplicate tensor '{name}'")
        try:
            qtype = _T(ttype)
            block, tsize = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise r.fail(f"tensor '{name}' has unknown type id {ttype}") from None
        if any(d <= 0 or d >= 1 << 40 for d in ne):
            raise r.fail(f"tensor '{name}' has an absurd shape {list(ne)}")
        if ne[0] % block != 0:
            raise r.fail(
                f"tensor '{name}' of type {qtype.name} has row length ne[0] = {ne[0]}, "
                f"not a multiple of the type's block size {block}"
            )
        nbytes = math.prod(ne) // block * tsize
        infos[name] = _TensorInfo(name, ne, ttype, offset, nbytes)

    alignment = _DEFAULT_ALIGNMENT
    if "general.alignment" in kv:
        atype, aval = kv["general.alignment"]
        if atype != 4 or aval <= 0 or aval & (aval - 1):
            raise r.fail(
                f"key 'general.alignment' must be a uint32 power of two (found {aval!r})"
            )
        alignment = aval
    data_offset = -(-r.pos // alignment) * alignment

    for t in infos.values():
        if t.offset % alignment:
            raise r.fail(
                f"tensor '{t.name}' data offset {t.offset} is not a multiple of the "
                f"alignment {alignment}"
            )
        start = data_offset + t.offset
        end = start + t.nbytes
        if end > size:
            raise r.fail(
                f"tensor '{t.name}' data (bytes {start} to {end}) runs past the end of the "
                f"file ({size} bytes): the file is truncated or corrupt"
            )
    return version, kv, infos, alignment, data_offset


def _decode_array(mm: np.ndarray, ref: _ArrayRef) -> Any:
    if ref.elem_type == _GT_STRING:
        buf = memoryview(mm)
        unpack = struct.Struct("<Q").unpack_from
        out = []
        pos = ref.offset
        for _ in range(ref.count):
            (n,) = unpack(buf, pos)
            pos += 8
            out.append(bytes(buf[pos : pos + n]).decode("utf-8", "surrogateescape"))
            pos += n
        return out
    n = ref.count * _SCALAR_SIZE[ref.elem_type]
    arr = mm[ref.offset : ref.offset + n].view(np.dtype(_SCALAR_DTYPE[ref.elem_type]))
    return arr


def _kv_to_str(vtype: int, value: Any) -> str:
    """Format a scalar value the way llama.cpp's gguf_kv_to_str does."""
    if vtype == _GT_BOOL:
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
        if vtype == _GT_ARRAY:
            raise self.fail(f"key '{key}' is an array; per-layer values are not supported")
        return vtype, value

    def get_int(self, key: str, lo: int, hi: int, default: Any = _MISSING) -> int:
        got = self._raw(key, default)
        if got is None:
            return default
        vtype, value = got
        if vtype not in _INT_TYPES:
            raise self.fail(
                f"key '{key}' has type {_VALUE_TYPE_NAMES.get(vtype, vtype)}, expected an integer"
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
                f"key '{key}' has type {_VALUE_TYPE_NAMES.get(vtype, vtype)}, expected a number"
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
        if vtype != _GT_STRING:
            raise self.fail(
                f"key '{key}' has type {_VALUE_TYPE_NAMES.get(vtype, vtype)}, expected a string"
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

    rms_eps = a.get_float(key("rms_eps"), 0.0, 1.0, default=_arch.DEFAULT_RMS_EPS)
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
    elif _arch.TOKENS_KEY in kv and kv[_arch.TOKENS_KEY][0] == _GT_ARRAY:
        n_vocab = kv[_arch.TOKENS_KEY][1].count
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
    )
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
        act=_arch.ACT_IDS[spec.act],
    )
    return hp, src


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


def _pad4(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (_MAX_DIMS - len(ne))


# ---- entry point ---------------------------------------------------------------


def load_gguf(path: str | os.PathLike, *, verbose: bool = True) -> GGUFModel:
    """Memory-map and validate the GGUF model at ``path``.

    The header is parsed and checked (keys, tensor directory, bounds of every
    tensor's data against the file size), hyper-parameters are read with their
    defaults (:mod:`powerinfer_backend.arch`), and every tensor the
    architecture uses is checked for presence and shape (GGUF ne order).

    Tensor data of kernel types (:data:`KERNEL_TYPES`: F32, F16, BF16, Q4_0,
    Q4_1, Q8_0) are zero-copy read-only views of the memory map. Other types
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
            byte order, a truncated or corrupt header, tensor data past the end
            of the file, an unknown architecture, a missing required key or
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
    if magic != GGUF_MAGIC:
        raise ValueError(f"{path_str}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")

    try:
        mm = np.memmap(path_str, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path_str}: cannot memory-map the file: {e}") from e

    try:
        version, kv, infos, alignment, data_offset = _parse_header(path_str, mm, size)
    except ValueError:
        raise
    except Exception as e:  # defensive: nothing but ValueError leaves the parser
        raise ValueError(f"{path_str}: corrupt GGUF header ({type(e).__name__}: {e})") from e

    if "general.architecture" not in kv:
        raise ValueError(f"{path_str}: missing required metadata key 'general.architecture'")
    atype, arch_name = kv["general.architecture"]
    if atype != _GT_STRING:
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

    wanted: list[tuple[str, TensorSpec]] = [(ts.name, ts) for ts in spec.global_tensors]
    for i in range(hp.n_layer):
        wanted += [(ts.name.format(i=i), ts) for ts in spec.layer_tensors]

    tensors: dict[str, TensorView] = {}
    for name, ts in wanted:
        info = infos.get(name)
        if info is None:
            if ts.required:
                raise ValueError(f"{path_str}: missing tensor '{name}'")
            continue
        exp = expected(ts)
        if _pad4(info.ne) != _pad4(exp):
            notes = ", ".join(f"{d} = {dims[d]} from {dim_src[d]}" for d in dict.fromkeys(ts.shape))
            raise ValueError(
                f"{path_str}: tensor '{name}' has shape {list(info.ne)}, expected {list(exp)} "
                f"({notes})"
            )
        start = data_offset + info.offset
        raw = mm[start : start + info.nbytes]
        tensors[name] = _make_view(path_str, info, raw, ts.kind)

    unused = [n for n in infos if n not in tensors]
    if unused:
        shown = ", ".join(unused[:5]) + (", ..." if len(unused) > 5 else "")
        warnings.warn(
            f"{path_str}: {len(unused)} tensor(s) not used by architecture '{arch_name}' "
            f"were ignored: {shown}",
            stacklevel=2,
        )

    metadata = {k: _kv_to_str(t, v) for k, (t, v) in kv.items() if t != _GT_ARRAY}

    model = GGUFModel(
        path=path_str,
        arch=arch_name,
        hparams=hp,
        metadata=metadata,
        tensors=tensors,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
        file_size=size,
        _kv=kv,
        _mm=mm,
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
