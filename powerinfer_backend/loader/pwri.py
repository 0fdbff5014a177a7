"""PowerInfer's own model files (docs/predictors.md, "PowerInfer files").

* The model: a GGUF whose first four bytes are ``PWRI`` (read by
  :func:`powerinfer_backend.loader.load_gguf`, which patches the magic in memory),
  with per layer ``blk.N.fc1.weight`` (ne [n_embd, rank]) and ``blk.N.fc2.weight``
  (ne [rank, n_ff]) predictors, the down projection stored transposed as
  ``blk.N.ffn_down_t.weight`` (ne [n_embd, n_ff]: n_ff rows of n_embd, our down_t),
  and the key ``powerinfer.sparse_threshold`` (the predictor score threshold).
* ``<model>.generated.gpuidx``: a GGUF (magic ``GGUF`` or ``PWRI``) with per layer
  ``blk.N.gpu_idx`` (int32 [n_ff], 0/1: neuron on the GPU) and ``blk.N.gpu_bucket``
  (int32, the sorted ids where gpu_idx is 1), and ``split.vram_capacity``. Parsed and
  validated here (:func:`read_gpuidx`); placement uses it in the hybrid issue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .arch import POWERINFER_THRESHOLD_KEY
from .gguf_meta import parse_header
from .reader import tensor_array
from .types import _INT_TYPES, _T, _type_name, _vtype_name

__all__ = ["has_predictors", "GpuIndex", "read_gpuidx", "gpuidx_path"]


def has_predictors(gguf) -> bool:
    return any(k.endswith(".fc1.weight") for k in getattr(gguf, "extra_tensors", {}))


def pwri_threshold(gguf) -> float:
    kv = getattr(gguf, "_kv", {}).get(POWERINFER_THRESHOLD_KEY)
    return 0.0 if kv is None else float(kv[1])


def down_t_views(gguf) -> dict:
    """layer -> ``blk.N.ffn_down_t.weight`` TensorView of a PowerInfer file (may be empty)."""
    out = {}
    for layer in range(gguf.hparams.n_layer):
        v = gguf.extra_tensors.get(f"blk.{layer}.ffn_down_t.weight")
        if v is not None:
            out[layer] = v
    return out


def _first_kv_string(f) -> tuple[str, str] | None:
    """(key, value) of a GGUF's first metadata entry when it is a string (the writers
    put general.architecture first), else None. ``f`` is positioned after the magic."""
    import struct

    try:
        hdr = f.read(20)  # version u32, tensor count u64, kv count u64
        (n_kv,) = struct.unpack("<Q", hdr[12:20])
        if n_kv < 1:
            return None
        (klen,) = struct.unpack("<Q", f.read(8))
        if klen > 256:
            return None
        key = f.read(klen).decode("utf-8", "replace")
        (vtype,) = struct.unpack("<I", f.read(4))
        if vtype != 8:  # GGUFValueType.STRING
            return None
        (vlen,) = struct.unpack("<Q", f.read(8))
        return (key, f.read(min(vlen, 256)).decode("utf-8", "replace")) if vlen <= 256 else None
    except (struct.error, OSError):
        return None


def vocab_path(model_path) -> str:
    """``model_path`` itself, or a GGUF holding only its metadata (for the llama.cpp
    vocabulary), made once in the artifact folder, for a PWRI file (which llama.cpp
    rejects) and for an architecture llama.cpp does not load (``opt``: the copy says
    ``llama``, its ``opt.*`` keys renamed ``llama.*``)."""
    from .arch import ARCHITECTURES

    model_path = os.fspath(model_path)
    try:
        with open(model_path, "rb") as f:
            pwri = f.read(4) == b"PWRI"
            first = _first_kv_string(f)
    except OSError:
        return model_path
    foreign = None  # an architecture llama.cpp proper lacks: its vocabulary is read as llama's
    if first is not None and first[0] == "general.architecture":
        spec = ARCHITECTURES.get(first[1])
        foreign = first[1] if spec is not None and not spec.llamacpp_loads else None
    if not pwri and foreign is None:
        return model_path
    import gguf as _g

    from .artifacts import artifact_dir, atomic_write_path

    out = artifact_dir(model_path, create=True) / "vocab.gguf"
    if out.is_file() and out.stat().st_mtime >= os.stat(model_path).st_mtime:
        return str(out)
    kv = parse_header(model_path, pwri=pwri).kv  # checked as load_gguf checks it

    def write(tmp):
        V = _g.GGUFValueType
        w = _g.GGUFWriter(tmp, "llama")
        w.kv_data[0].clear()
        for name, v in kv.items():
            if foreign is not None and name.startswith(foreign + "."):
                name = "llama." + name[len(foreign) + 1 :]
            vt = V(v.vtype)
            if vt == V.ARRAY:
                sub = V(v.etype)
                val = v.value.decode("replace") if sub == V.STRING else v.value.tolist()
                w.add_key_value(name, val, vt, sub_type=sub)
            elif foreign is not None and name == "general.architecture":
                w.add_key_value(name, "llama", vt)
            elif vt == V.STRING:
                w.add_key_value(name, v.value.decode("utf-8", "replace"), vt)
            else:
                w.add_key_value(name, v.value, vt)
        if foreign is not None and "llama.attention.layer_norm_rms_epsilon" not in (
            "llama." + n[len(foreign) + 1 :] for n in kv if n.startswith(foreign + ".")
        ):
            w.add_key_value("llama.attention.layer_norm_rms_epsilon", 1e-5, V.FLOAT32)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    atomic_write_path(out, write)
    return str(out)


def gpuidx_path(model_path) -> str:
    return os.fspath(model_path) + ".generated.gpuidx"


@dataclass
class GpuIndex:
    """A parsed ``.generated.gpuidx``: per layer the 0/1 mask and the sorted ids."""

    gpu_idx: list = field(default_factory=list)
    gpu_bucket: list = field(default_factory=list)
    vram_capacity: int = 0
    path: str = ""

    @property
    def n_gpu_neurons(self) -> int:
        return int(sum(len(b) for b in self.gpu_bucket))


def read_gpuidx(path, n_layer: int, n_ff: int) -> GpuIndex:
    """Parse and validate a PowerInfer ``.generated.gpuidx`` for a model of ``n_layer``
    layers of ``n_ff`` neurons. Raises ValueError naming the file, layer and tensor."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: gpuidx file does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic not in (b"GGUF", b"PWRI"):
        raise ValueError(f"{path}: not a gpuidx GGUF (magic {magic!r})")
    h = parse_header(path, pwri=magic == b"PWRI")  # ValueError naming the file and the key or tensor
    cap = h.kv.get("split.vram_capacity")
    if cap is None:
        raise ValueError(f"{path}: missing key 'split.vram_capacity'")
    if cap.vtype not in _INT_TYPES:
        raise ValueError(f"{path}: key 'split.vram_capacity' has type {_vtype_name(cap.vtype)}, expected an integer")
    out = GpuIndex(vram_capacity=int(cap.value), path=path)
    tensors = {t.name: t for t in h.tensors}
    for layer in range(n_layer):
        ni, nb = f"blk.{layer}.gpu_idx", f"blk.{layer}.gpu_bucket"
        for n in (ni, nb):
            if n not in tensors:
                raise ValueError(f"{path}: layer {layer}: tensor '{n}' missing")
            if tensors[n].type != _T.I32:
                raise ValueError(
                    f"{path}: layer {layer}: tensor '{n}' must be int32, got {_type_name(tensors[n].type)}"
                )
        idx = tensor_array(h, tensors[ni]).reshape(-1)
        bucket = tensor_array(h, tensors[nb]).reshape(-1)
        if idx.size != n_ff:
            raise ValueError(f"{path}: layer {layer}: tensor '{ni}' has {idx.size} entries, expected n_ff {n_ff}")
        if not np.isin(idx, (0, 1)).all():
            raise ValueError(f"{path}: layer {layer}: tensor '{ni}' must hold only 0 and 1")
        if bucket.size and (np.any(np.diff(bucket) <= 0) or bucket[0] < 0 or bucket[-1] >= n_ff):
            raise ValueError(f"{path}: layer {layer}: tensor '{nb}' must be strictly increasing ids in [0, {n_ff})")
        if not np.array_equal(bucket, np.flatnonzero(idx).astype(np.int32)):
            raise ValueError(f"{path}: layer {layer}: tensor '{nb}' is not the ids where '{ni}' is 1")
        out.gpu_idx.append(idx.copy())
        out.gpu_bucket.append(bucket.copy())
    return out
