"""GGUF model loading: memory-map a GGUF file, validate it against the
architecture table (:mod:`powerinfer_backend.loader.arch`) and expose hyper-parameters,
metadata and zero-copy tensor views ready to hand to the native engine.

Entry point: :func:`load_gguf`.

The header is parsed straight from the memory map, with bounds and sanity checks
(:func:`~powerinfer_backend.loader.gguf_meta.parse_header`; ``gguf.GGUFReader`` yields the
same metadata and tensor table, checked by tests/loader/test_header.py). Tensor data are never copied when
their type is one the kernels run (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K,
Q6_K); other types are converted once at load with ``gguf.quants`` and a warning per
tensor (:mod:`powerinfer_backend.loader.convert`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import arch as _arch
from .arch import ArchSpec, TensorSpec
from .convert import _make_view, _untranspose
from .hparams import HParams, _read_hparams
from .gguf_meta import StringArray, parse_header
from .reader import _kv_to_str, _read_kv, _tensor_infos
from .types import _DEFAULT_ALIGNMENT, _MAX_DIMS, _V, GGUF_MAGIC, PWRI_MAGIC, TensorView

#: Tensors of PowerInfer files kept in GGUFModel.extra_tensors (per layer).
PWRI_LAYER_TENSORS = ("fc1", "fc2", "ffn_down_t")


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
    _header: Any = field(default=None, repr=False)  # the parsed header (gguf_meta reuses it while alive)
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
        arrays are refused at load (llama.cpp rejects them too).
        """
        if key not in self._kv:
            return default
        vtype, value = self._kv[key]
        if isinstance(value, StringArray):  # decoded on demand: a fresh list per call
            return value.decode("surrogateescape")
        return value

    def close(self) -> None:
        """Drop this object's references to the memory map. The mapping is
        released once no TensorView data (or other views) remain alive."""
        self.tensors = {}
        self._kv = {}
        self._mm = None
        self._header = None

    def __repr__(self) -> str:
        hp = self.hparams
        return (
            f"GGUFModel(path={self.path!r}, arch={self.arch!r}, n_layer={hp.n_layer}, "
            f"n_embd={hp.n_embd}, n_vocab={hp.n_vocab}, tensors={len(self.tensors)})"
        )


def _pad4(ne: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(ne) + (1,) * (_MAX_DIMS - len(ne))


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
            too long for the file, over 2**21 array elements in all, an array
            of arrays, a duplicated key or tensor name), tensor
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
        raise ValueError(
            f"{path_str}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r} or PowerInfer's {PWRI_MAGIC!r})"
        )
    pwri = magic == PWRI_MAGIC

    try:
        header = parse_header(path_str, pwri=pwri)
    except OSError as e:
        raise ValueError(f"{path_str}: cannot read the file: {e}") from e
    kv = _read_kv(header)
    infos = _tensor_infos(header)

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
                pinfo = infos[name]
                if len(pinfo.ne) != 2:
                    raise ValueError(
                        f"{path_str}: layer {i}: tensor '{name}' has shape {list(pinfo.ne)}, expected 2 dimensions"
                    )
                extra[name] = _make_view(path_str, pinfo, pinfo.data, _arch.KIND_MATRIX)
    for name, ts in wanted:
        info = infos.get(name)
        dt_name = name.replace(".ffn_down.", ".ffn_down_t.")
        if info is None and name.endswith(".ffn_down.weight") and dt_name in extra:
            # PowerInfer files store only the transposed down: rebuild ffn_down for the dense path
            dt = extra[dt_name]
            if tuple(dt.ne) != (hp.n_embd, hp.n_ff):
                raise ValueError(
                    f"{path_str}: tensor '{dt_name}' has shape {list(dt.ne)}, expected "
                    f"{[hp.n_embd, hp.n_ff]} (n_embd, n_ff)"
                )
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
            raise ValueError(f"{path_str}: tensor '{name}' has shape {list(info.ne)}, expected {list(exp)} ({notes})")
        if name in tensors:  # a fallback already loaded for another slot
            continue
        tensors[name] = _make_view(path_str, info, info.data, ts.kind)

    unused = [n for n in infos if n not in tensors and n not in extra]
    if unused:
        shown = ", ".join(unused[:5]) + (", ..." if len(unused) > 5 else "")
        warnings.warn(
            f"{path_str}: {len(unused)} tensor(s) not used by architecture '{arch_name}' were ignored: {shown}",
            stacklevel=2,
        )

    metadata = {k: _kv_to_str(t, v) for k, (t, v) in kv.items() if t != _V.ARRAY}

    model = GGUFModel(
        path=path_str,
        arch=arch_name,
        hparams=hp,
        metadata=metadata,
        tensors=tensors,
        version=header.version,
        alignment=header.alignment,
        data_offset=header.data_offset,
        file_size=size,
        _kv=kv,
        _mm=header.data,
        _header=header,
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
