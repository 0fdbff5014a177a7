"""Disk cache of the transposed FFN down projections (``down_t``).

The sparse FFN operator (``pi_op_ffn_sparse``, docs/sparsity.md) reads the down
matrix as n_ff rows of n_embd, so that one neuron's weights are one contiguous
row. A GGUF ``ffn_down`` is stored the other way round (n_embd rows of n_ff), so
it is transposed once with the native ``pi_op_transpose_to`` and kept on disk:

* ``<artifact dir>/down_t.<dtype>.npy``: every layer, memory-mapped read-only on
  load. ``"f16"``: float16, shape ``(n_layer, n_ff, n_embd)``, values rounded to
  nearest even (not exact for quantized sources, see docs/sparsity.md); ``"f32"``:
  float32, the same shape, the exact dequantized weights; ``"q8_0"``: uint8, shape
  ``(n_layer, n_ff, n_embd / 32 * 34)``, each row n_embd / 32 Q8_0 blocks (the
  dequantized weights re-quantized along the row by the activation quantizer).
  :func:`down_t_dtype` picks the type.
* ``<artifact dir>/down_t.<dtype>.npy.meta.json``: model fingerprint (SHA-256),
  model path and size, dtype, shape, format version, and the source types.

The artifact dir is :func:`powerinfer_backend.loader.artifacts.artifact_dir`. This is a
cache, not a result: when the metadata is missing, unreadable or records another
model, dtype or shape, the file is rebuilt without asking (no ``force``). Both
files are written atomically, the array first and the metadata last, so
metadata present and matching means the array beside it is complete. The model
file is only read.

Size: n_layer * n_ff * n_embd * 2 bytes for F16 (53 MB for SmolLM2-135M,
about 2.9 GB for a 7B llama), 34/64 of that for Q8_0; build time about 0.2 s per 7B
layer, one thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import _native
from ..loader.artifacts import (
    FINGERPRINT_KEY,
    artifact_dir,
    artifact_metadata,
    atomic_write,
    atomic_write_json,
    metadata_path,
    model_fingerprint,
    read_metadata,
)
from ..loader import GGUFModel, TensorView, load_gguf

__all__ = [
    "transposed_down",
    "build_down_cache",
    "load_down_cache",
    "down_cache_path",
    "down_t_dtype",
    "down_t_row_bytes",
    "dense_down_cheaper",
    "QuantizedDownT",
]

FORMAT_VERSION = 1
#: dtype name -> (numpy dtype of the stored array, ggml type id of the transpose output).
_DTYPES: dict[str, tuple[np.dtype, int]] = {
    "f16": (np.dtype("<f2"), 1),  # GGML_TYPE_F16
    "f32": (np.dtype("<f4"), 0),  # GGML_TYPE_F32
    "q8_0": (np.dtype("u1"), 8),  # GGML_TYPE_Q8_0: blocks of 32 (an F16 scale, 32 int8)
}
#: source types whose values F16 holds exactly or nearly (a Q8_0 down_t would round them more)
_UNQUANTIZED = {"F32", "F16", "BF16"}

_lock = threading.Lock()
# npy path -> (stat key, meta fingerprint, memmap of the whole cache)
_loaded: dict[str, tuple[tuple[int, int], str, np.ndarray]] = {}


def down_t_row_bytes(dtype: Any, n_embd: int) -> int:
    """Bytes of one neuron's down_t row (n_embd weights) in ``dtype``: 4 or 2 per weight
    for f32 / f16, 34 per 32 for q8_0 (n_embd a multiple of 32)."""
    name = _dtype_name(dtype)
    return {"f32": 4 * n_embd, "f16": 2 * n_embd, "q8_0": n_embd // 32 * 34}[name]


def down_t_dtype(model: GGUFModel, *, split: bool = False) -> str:
    """The down_t type sparse inference uses for ``model``, chosen by bytes read:

    * "f32" when every ffn_down is stored F32 (exact);
    * "f16" when any ffn_down is unquantized (F32/F16/BF16: F16 holds F16 exactly),
      when n_embd is not a multiple of 32 (no whole Q8_0 blocks), or with ``split``
      (the unquantized down_t: what tests and benches pinning F16 numbers ask for; a
      device split itself uses the default, the CPU-only engine's type);
    * else (quantized sources: Q4_0, Q4_1, Q8_0, K-quants, ...) "q8_0": a kept
      neuron's row costs n_embd / 32 * 34 bytes instead of 2 * n_embd (53%), and the
      sparse down product reads density x n_ff such rows per token, so Q8_0 reads
      fewer bytes than F16 at every density; the source was already quantized, and
      the re-quantization error is measured in docs/sparsity.md.
    """
    types = {_ffn_down(model, i).type_name for i in range(model.hparams.n_layer)}
    if types == {"F32"}:
        return "f32"
    n_embd = model.hparams.n_embd
    if split or types & _UNQUANTIZED or n_embd % 32 != 0:
        return "f16"
    return "q8_0"


def dense_down_cheaper(model: GGUFModel, layer: int, dtype: Any, density: float) -> bool:
    """Whether layer ``layer``'s dense down product over its GGUF ffn_down (every column,
    the skipped neurons' h set to 0) reads fewer bytes per token than ``density`` x n_ff
    rows of a ``dtype`` down_t: e.g. a Q4_0 file with a Q8_0 down_t at density > 0.53
    (2304 against 4352 B per neuron at n_embd 4096)."""
    hp = model.hparams
    return density * hp.n_ff * down_t_row_bytes(dtype, hp.n_embd) > _ffn_down(model, layer).nbytes


class QuantizedDownT:
    """A quantized down_t cache, ``(n_layer, n_ff, n_embd)`` in weights: indexing a
    layer gives a :class:`~powerinfer_backend.loader.TensorView` (type Q8_0, ne
    ``(n_embd, n_ff)``) that ``NativeContext.set_ffn_sparsity`` takes.

    Attributes:
        raw: the uint8 memmap, ``(n_layer, n_ff, row bytes)``. type: ggml type id.
        shape: ``(n_layer, n_ff, n_embd)``.
    """

    def __init__(self, raw: np.ndarray, type_id: int, n_embd: int):
        self.raw, self.type, self.shape = raw, type_id, (raw.shape[0], raw.shape[1], n_embd)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, layer: int):
        from ..loader import TensorView

        layer = int(layer)
        if not 0 <= layer < self.shape[0]:
            raise IndexError(f"layer {layer} out of range [0, {self.shape[0]})")
        data = self.raw[layer].reshape(-1)
        return TensorView(f"blk.{layer}.ffn_down_t", self.type, (self.shape[2], self.shape[1]), data, int(data.nbytes))


def _dtype_name(dtype: Any) -> str:
    """Normalise "f16" / "F16" / "float16" / np.float16 (and f32 likewise).

    "q8_0" / "Q8_0" by name only.

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return dtype.lower()
    bad = f"down_t dtype must be 'f16', 'f32' or 'q8_0', got {dtype!r}"
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(bad) from e
    for name in ("f16", "f32"):
        if dt == _DTYPES[name][0]:
            return name
    raise ValueError(bad)


def down_cache_path(model_path: str | os.PathLike, dtype: Any = "f16", *, create: bool = True) -> Path:
    """Path of the ``down_t.<dtype>.npy`` file for the model (may not exist yet);
    its metadata is ``artifacts.metadata_path(...)`` of it. ``create`` creates the
    artifact folder (see :func:`~powerinfer_backend.loader.artifacts.artifact_dir`)."""
    name = _dtype_name(dtype)
    return artifact_dir(model_path, create=create) / f"down_t.{name}.npy"


def _expected_shape(model: GGUFModel, name: str) -> tuple[int, int, int]:
    """Shape of the stored array (row bytes, not weights, for q8_0)."""
    hp = model.hparams
    return (hp.n_layer, hp.n_ff, hp.n_embd if name != "q8_0" else down_t_row_bytes(name, hp.n_embd))


def _wrap(arr: np.ndarray, name: str, n_embd: int):
    return QuantizedDownT(arr, _DTYPES[name][1], n_embd) if name == "q8_0" else arr


def _meta_matches(meta: dict | None, fp: str, name: str, shape: tuple[int, ...]) -> bool:
    return (
        isinstance(meta, dict)
        and meta.get(FINGERPRINT_KEY) == fp
        and meta.get("dtype") == name
        and meta.get("format_version") == FORMAT_VERSION
        and tuple(meta.get("shape", ())) == tuple(shape)
    )


def _open(npy: Path, fp: str, name: str, shape: tuple[int, int, int]) -> np.ndarray | None:
    """The cached array, memory-mapped read-only, or None when absent or stale."""
    try:
        st = os.stat(npy)
    except OSError:
        return None
    key = (st.st_size, st.st_mtime_ns)
    with _lock:
        hit = _loaded.get(str(npy))
    if hit is not None and hit[0] == key and hit[1] == fp and hit[2].shape == shape:
        return hit[2]
    if not _meta_matches(read_metadata(npy), fp, name, shape):
        return None
    try:
        arr = np.load(npy, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if arr.shape != shape or arr.dtype != _DTYPES[name][0]:
        return None
    with _lock:
        _loaded[str(npy)] = (key, fp, arr)
    return arr


def load_down_cache(
    model_path: str | os.PathLike, dtype: Any = "f16", n_layer_ff_embd: tuple[int, int, int] | None = None
):
    """The cached ``(n_layer, n_ff, n_embd)`` down_t of the model, or None when there is
    no cache for this exact model file (fingerprint), dtype and (if given) shape in
    weights. Never builds. f16 / f32: a read-only ``np.memmap``; q8_0: a
    :class:`QuantizedDownT` over one (``[layer]`` gives the layer's TensorView)."""
    name = _dtype_name(dtype)
    npy = down_cache_path(model_path, name, create=False)
    fp = model_fingerprint(model_path)
    meta = read_metadata(npy)
    if n_layer_ff_embd is None:
        if not isinstance(meta, dict) or "shape" not in meta or "n_embd" not in meta:
            return None
        n_embd = int(meta["n_embd"])
        stored = tuple(int(v) for v in meta["shape"])
    else:
        n_embd = int(n_layer_ff_embd[2])
        stored = (
            int(n_layer_ff_embd[0]),
            int(n_layer_ff_embd[1]),
            n_embd if name != "q8_0" else down_t_row_bytes(name, n_embd),
        )
    arr = _open(npy, fp, name, stored)  # type: ignore[arg-type]
    return None if arr is None else _wrap(arr, name, n_embd)


def _ffn_down(model: GGUFModel, layer: int) -> TensorView:
    t = model.layer_tensor(layer, "ffn_down")
    if t is None:  # not for a file that loaded: every architecture's FFN has a down projection
        raise ValueError(f"{model.path}: layer {layer} has no ffn_down tensor")
    return t


def _transpose_layer(model: GGUFModel, layer: int, name: str) -> np.ndarray:
    hp = model.hparams
    tv = _ffn_down(model, layer)
    if tuple(tv.ne[:2]) != (hp.n_ff, hp.n_embd) or any(d != 1 for d in tv.ne[2:]):
        raise ValueError(f"{model.path}: {tv.name} has ne {tv.ne}, expected ({hp.n_ff}, {hp.n_embd})")
    npdt, type_out = _DTYPES[name]
    dst = np.empty(_expected_shape(model, name)[1:], dtype=npdt)
    ffi, lib = _native.ffi, _native.lib
    _native.check(
        lib.pi_op_transpose_to(type_out, ffi.from_buffer(tv.data), tv.type, hp.n_embd, hp.n_ff, ffi.from_buffer(dst)),
        f"pi_op_transpose_to({tv.name})",
    )
    return dst


def build_down_cache(
    model_path: str | os.PathLike,
    gguf_model: GGUFModel | None = None,
    dtype: Any = "f16",
    progress: bool | None = True,
    *,
    rebuild: bool = False,
) -> Path:
    """Make sure the down_t cache for the model exists and is current; build it
    if missing or stale (or when ``rebuild``).

    Args:
        model_path: the GGUF file.
        gguf_model: the already-loaded model for ``model_path`` (loaded here,
            quietly, when None).
        dtype: "f16" (default), "f32" or "q8_0" (or the numpy dtypes of the first two).
        progress: show a tqdm bar over layers (None: only on a terminal).
        rebuild: rebuild even when a current cache exists.

    Returns:
        Path of the ``.npy`` file.

    Raises:
        ValueError: bad dtype or tensor shape; errors of ``pi_op_transpose_to``
            (NotImplementedError for a source type it lacks) and of loading.
        OSError: the artifact folder cannot be written.
    """
    name = _dtype_name(dtype)
    model = gguf_model if gguf_model is not None else load_gguf(model_path, verbose=False)
    npy = down_cache_path(model_path, name)
    fp = model_fingerprint(model_path)
    shape = _expected_shape(model, name)
    if not rebuild and _open(npy, fp, name, shape) is not None:
        return npy
    _build(model, model_path, npy, name, shape, progress)
    return npy


def _build(
    model: GGUFModel,
    model_path: str | os.PathLike,
    npy: Path,
    name: str,
    shape: tuple[int, int, int],
    progress: bool | None,
) -> None:
    from tqdm.auto import tqdm

    npdt = _DTYPES[name][0]
    src_types: list[str] = []

    def write(f) -> None:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(npdt), "fortran_order": False, "shape": shape}
        )
        bar = tqdm(
            range(shape[0]),
            desc=f"down_t {name}",
            unit="layer",
            disable=(None if progress is None else not progress),
            leave=False,
        )
        try:
            for i in bar:
                src_types.append(_ffn_down(model, i).type_name)
                f.write(_transpose_layer(model, i, name).tobytes())
        finally:
            bar.close()

    # Array first, metadata last: matching metadata means a complete array.
    atomic_write(npy, write)
    meta = artifact_metadata(
        model_path,
        kind="down_t",
        format_version=FORMAT_VERSION,
        dtype=name,
        shape=list(shape),
        n_embd=model.hparams.n_embd,
        layout="n_layer x n_ff x n_embd"
        if name != "q8_0"
        else "n_layer x n_ff x (n_embd / 32 Q8_0 blocks of 34 bytes)",
        source_types=src_types,
    )
    atomic_write_json(metadata_path(npy), meta)
    with _lock:
        _loaded.pop(str(npy), None)


def transposed_down(gguf_model: GGUFModel, layer: int, *, dtype: Any = "f16", progress: bool | None = None):
    """Layer ``layer``'s ffn_down as ``down_t``: n_ff rows of n_embd, C-contiguous.

    The first call for a model builds the disk cache of every layer
    (:func:`build_down_cache`, ``pi_op_transpose_to``); later calls, in this or
    another process, memory-map it. The model file is fingerprinted (see
    :func:`~powerinfer_backend.loader.artifacts.model_fingerprint` for the cost, paid
    once per process).

    Args:
        gguf_model: the loaded model (its ``path`` locates the cache).
        layer: 0 <= layer < n_layer.
        dtype: "f16" (default, round to nearest even), "f32" (exact) or "q8_0"
            (re-quantized rows; :func:`down_t_dtype` says which to use).
        progress: tqdm bar while building (None: only on a terminal).

    Returns:
        f16 / f32: a read-only ``np.memmap`` of shape (n_ff, n_embd), dtype float16
        or float32. q8_0: a :class:`~powerinfer_backend.loader.TensorView` (type Q8_0,
        ne (n_embd, n_ff)) over the memmap. Either keeps the file mapping alive and
        goes to ``NativeContext.set_ffn_sparsity`` as it is.

    Raises:
        IndexError: ``layer`` out of range. ValueError: bad dtype.
        Others as :func:`build_down_cache`.
    """
    name = _dtype_name(dtype)
    n_layer = gguf_model.hparams.n_layer
    if not 0 <= layer < n_layer:
        raise IndexError(f"layer {layer} out of range [0, {n_layer})")
    path = gguf_model.path
    shape = _expected_shape(gguf_model, name)
    npy = down_cache_path(path, name)
    fp = model_fingerprint(path)
    arr = _open(npy, fp, name, shape)
    if arr is None:
        _build(gguf_model, path, npy, name, shape, progress)
        arr = _open(npy, fp, name, shape)
        if arr is None:  # pragma: no cover - only if another writer raced us badly
            raise OSError(f"down_t cache {npy} could not be read back after building it")
    return _wrap(arr, name, gguf_model.hparams.n_embd)[layer]
