"""Disk cache of the transposed FFN down projections (``down_t``).

The sparse FFN operator (``pi_op_ffn_sparse``, docs/sparsity.md) reads the down
matrix as n_ff rows of n_embd, so that one neuron's weights are one contiguous
row. A GGUF ``ffn_down`` is stored the other way round (n_embd rows of n_ff), so
it is transposed once with the native ``pi_op_transpose_to`` and kept on disk:

* ``<artifact dir>/down_t.<dtype>.npy``: every layer, shape
  ``(n_layer, n_ff, n_embd)``, dtype float16 (``"f16"``, the default: values
  rounded to nearest even; not exact for Q4_0/Q4_1/Q8_0 sources, see
  docs/sparsity.md) or float32 (``"f32"``: the exact dequantized weights);
  memory-mapped read-only on load.
* ``<artifact dir>/down_t.<dtype>.npy.meta.json``: model fingerprint (SHA-256),
  model path and size, dtype, shape, format version, and the source types.

The artifact dir is :func:`powerinfer_backend.loader.artifacts.artifact_dir`. This is a
cache, not a result: when the metadata is missing, unreadable or records another
model, dtype or shape, the file is rebuilt without asking (no ``force``). Both
files are written atomically, the array first and the metadata last, so
metadata present and matching means the array beside it is complete. The model
file is only read.

Size: n_layer * n_ff * n_embd * 2 bytes for F16 (53 MB for SmolLM2-135M,
about 1.1 GB for a 7B llama); build time about 0.2 s per 7B layer, one thread.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import _native
from ..loader.artifacts import (FINGERPRINT_KEY, artifact_dir, artifact_metadata, atomic_write,
                        atomic_write_json, metadata_path, model_fingerprint,
                        read_metadata)
from ..loader import GGUFModel, load_gguf

__all__ = ["transposed_down", "build_down_cache", "load_down_cache", "down_cache_path", "down_t_dtype"]

FORMAT_VERSION = 1
#: dtype name -> (numpy dtype, ggml type id of the transpose output).
_DTYPES: dict[str, tuple[np.dtype, int]] = {
    "f16": (np.dtype("<f2"), 1),  # GGML_TYPE_F16
    "f32": (np.dtype("<f4"), 0),  # GGML_TYPE_F32
}

_lock = threading.Lock()
# npy path -> (stat key, meta fingerprint, memmap of the whole cache)
_loaded: dict[str, tuple[tuple[int, int], str, np.ndarray]] = {}


def down_t_dtype(model: GGUFModel) -> str:
    """The cache dtype sparse inference uses for ``model``: "f32" when every
    ffn_down is stored F32 (exact), else "f16" (exact for F16 sources; quantized
    sources are rounded, docs/sparsity.md)."""
    types = {model.layer_tensor(i, "ffn_down").type_name for i in range(model.hparams.n_layer)}
    return "f32" if types == {"F32"} else "f16"


def _dtype_name(dtype: Any) -> str:
    """Normalise "f16" / "F16" / "float16" / np.float16 (and f32 likewise).

    Raises:
        ValueError: any other dtype.
    """
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return dtype.lower()
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise ValueError(f"down_t dtype must be 'f16' or 'f32', got {dtype!r}") from e
    for name, (npdt, _) in _DTYPES.items():
        if dt == npdt:
            return name
    raise ValueError(f"down_t dtype must be 'f16' or 'f32', got {dtype!r}")


def down_cache_path(model_path: str | os.PathLike, dtype: Any = "f16", *,
                    create: bool = True) -> Path:
    """Path of the ``down_t.<dtype>.npy`` file for the model (may not exist yet);
    its metadata is ``artifacts.metadata_path(...)`` of it. ``create`` creates the
    artifact folder (see :func:`~powerinfer_backend.loader.artifacts.artifact_dir`)."""
    name = _dtype_name(dtype)
    return artifact_dir(model_path, create=create) / f"down_t.{name}.npy"


def _expected_shape(model: GGUFModel) -> tuple[int, int, int]:
    hp = model.hparams
    return (hp.n_layer, hp.n_ff, hp.n_embd)


def _meta_matches(meta: dict | None, fp: str, name: str, shape: tuple[int, ...]) -> bool:
    return (isinstance(meta, dict) and meta.get(FINGERPRINT_KEY) == fp
            and meta.get("dtype") == name and meta.get("format_version") == FORMAT_VERSION
            and tuple(meta.get("shape", ())) == tuple(shape))


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


def load_down_cache(model_path: str | os.PathLike, dtype: Any = "f16",
                    n_layer_ff_embd: tuple[int, int, int] | None = None) -> np.ndarray | None:
    """The cached ``(n_layer, n_ff, n_embd)`` array for the model as a read-only
    ``np.memmap``, or None when there is no cache for this exact model file
    (fingerprint), dtype and (if given) shape. Never builds."""
    name = _dtype_name(dtype)
    npy = down_cache_path(model_path, name, create=False)
    fp = model_fingerprint(model_path)
    meta = read_metadata(npy)
    if n_layer_ff_embd is None:
        if not isinstance(meta, dict) or "shape" not in meta:
            return None
        n_layer_ff_embd = tuple(int(v) for v in meta["shape"])  # type: ignore[assignment]
    return _open(npy, fp, name, tuple(n_layer_ff_embd))  # type: ignore[arg-type]


def _transpose_layer(model: GGUFModel, layer: int, name: str) -> np.ndarray:
    hp = model.hparams
    tv = model.layer_tensor(layer, "ffn_down")
    if tuple(tv.ne[:2]) != (hp.n_ff, hp.n_embd) or any(d != 1 for d in tv.ne[2:]):
        raise ValueError(f"{model.path}: {tv.name} has ne {tv.ne}, expected "
                         f"({hp.n_ff}, {hp.n_embd})")
    npdt, type_out = _DTYPES[name]
    dst = np.empty((hp.n_ff, hp.n_embd), dtype=npdt)
    ffi, lib = _native.ffi, _native.lib
    _native.check(lib.pi_op_transpose_to(type_out, ffi.from_buffer(tv.data), tv.type,
                                         hp.n_embd, hp.n_ff, ffi.from_buffer(dst)),
                  f"pi_op_transpose_to({tv.name})")
    return dst


def build_down_cache(model_path: str | os.PathLike, gguf_model: GGUFModel | None = None,
                     dtype: Any = "f16", progress: bool | None = True, *,
                     rebuild: bool = False) -> Path:
    """Make sure the down_t cache for the model exists and is current; build it
    if missing or stale (or when ``rebuild``).

    Args:
        model_path: the GGUF file.
        gguf_model: the already-loaded model for ``model_path`` (loaded here,
            quietly, when None).
        dtype: "f16" (default) or "f32" (or the numpy dtypes).
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
    shape = _expected_shape(model)
    if not rebuild and _open(npy, fp, name, shape) is not None:
        return npy
    _build(model, model_path, npy, name, shape, progress)
    return npy


def _build(model: GGUFModel, model_path: str | os.PathLike, npy: Path, name: str,
           shape: tuple[int, int, int], progress: bool | None) -> None:
    from tqdm.auto import tqdm

    npdt = _DTYPES[name][0]
    src_types: list[str] = []

    def write(f) -> None:
        np.lib.format.write_array_header_1_0(
            f, {"descr": np.lib.format.dtype_to_descr(npdt), "fortran_order": False,
                "shape": shape})
        bar = tqdm(range(shape[0]), desc=f"down_t {name}", unit="layer",
                   disable=(None if progress is None else not progress), leave=False)
        try:
            for i in bar:
                src_types.append(model.layer_tensor(i, "ffn_down").type_name)
                f.write(_transpose_layer(model, i, name).tobytes())
        finally:
            bar.close()

    # Array first, metadata last: matching metadata means a complete array.
    atomic_write(npy, write)
    meta = artifact_metadata(model_path, kind="down_t", format_version=FORMAT_VERSION,
                             dtype=name, shape=list(shape), layout="n_layer x n_ff x n_embd",
                             source_types=src_types)
    atomic_write_json(metadata_path(npy), meta)
    with _lock:
        _loaded.pop(str(npy), None)


def transposed_down(gguf_model: GGUFModel, layer: int, *, dtype: Any = "f16",
                    progress: bool | None = None) -> np.ndarray:
    """Layer ``layer``'s ffn_down as ``down_t``: n_ff rows of n_embd, C-contiguous.

    The first call for a model builds the disk cache of every layer
    (:func:`build_down_cache`, ``pi_op_transpose_to``); later calls, in this or
    another process, memory-map it. The model file is fingerprinted (see
    :func:`~powerinfer_backend.loader.artifacts.model_fingerprint` for the cost, paid
    once per process).

    Args:
        gguf_model: the loaded model (its ``path`` locates the cache).
        layer: 0 <= layer < n_layer.
        dtype: "f16" (default, round to nearest even) or "f32" (exact).
        progress: tqdm bar while building (None: only on a terminal).

    Returns:
        A read-only ``np.memmap`` of shape (n_ff, n_embd), dtype float16 or
        float32; it keeps the file mapping alive.

    Raises:
        IndexError: ``layer`` out of range. ValueError: bad dtype.
        Others as :func:`build_down_cache`.
    """
    name = _dtype_name(dtype)
    n_layer = gguf_model.hparams.n_layer
    if not 0 <= layer < n_layer:
        raise IndexError(f"layer {layer} out of range [0, {n_layer})")
    path = gguf_model.path
    shape = _expected_shape(gguf_model)
    npy = down_cache_path(path, name)
    fp = model_fingerprint(path)
    arr = _open(npy, fp, name, shape)
    if arr is None:
        _build(gguf_model, path, npy, name, shape, progress)
        arr = _open(npy, fp, name, shape)
        if arr is None:  # pragma: no cover - only if another writer raced us badly
            raise OSError(f"down_t cache {npy} could not be read back after building it")
    return arr[layer]
