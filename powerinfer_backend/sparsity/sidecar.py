"""The sparsity sidecar: a small GGUF holding what calibration learned about a model.

File: ``<artifact dir>/sparsity.gguf`` (:func:`sidecar_path`; the artifact dir is
:func:`powerinfer_backend.loader.artifacts.artifact_dir`: beside the model when its folder
is writable, else the user cache keyed by the model's hash). ``--out`` may put it
anywhere. Written atomically; the model file is never touched.

Contents (format version 1; docs/sparsity.md has the table):

* keys ``powerinfer.sidecar.*``: format version, model SHA-256 / file name / size,
  text SHA-256 / file name / byte range, tokens seen, context length;
* keys ``powerinfer.calibration.*``: dense and sparse perplexity on the held-out
  tail, the budget asked for, mean expected FFN sparsity, what the thresholds
  compare against (``threshold_on``: "product" |h| or "gate" |act(gate x)|),
  per-layer thresholds (float32 array) and expected sparsities; the decode speedup of
  the thresholds over dense measured at calibration (with the host and thread count);
* ``powerinfer.ffn_act``: the FFN activation the thresholds apply to;
* predictors (``powerinfer-backend train-predictor``), per layer N: ``blk.N.fc1.weight``
  (ne [n_embd, rank]) and ``blk.N.fc2.weight`` (ne [rank, n_ff]) (PowerInfer's names),
  keys ``powerinfer.predictor.*`` (layers, score thresholds, ranks, measured
  precision / recall / predicted density per layer, perplexities);
* tensors, per layer N: ``blk.N.ffn_act_freq`` (F32 [n_ff]: fraction of calibration
  tokens with |h_j| >= the layer's threshold: the per-neuron firing frequency,
  the hot/cold ranking VRAM placement uses), ``blk.N.ffn_act_quantiles``
  (F32 [n_ff, 3]: |h_j| at the 50th, 90th and 99th percentile), ``blk.N.ffn_act_hist``
  (F32 [BINS]: the layer's |h| histogram as fractions, bins of
  :func:`powerinfer_backend.sparsity.calibrate.hist_edges`).

Later tools (predictors) add their tensors to the same file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..loader.artifacts import artifact_dir, atomic_write_path, model_fingerprint

__all__ = [
    "SIDECAR_NAME",
    "FORMAT_VERSION",
    "QUANTILES",
    "SparsityProfile",
    "sidecar_path",
    "read_sidecar",
    "write_sidecar",
    "check_overwrite",
]

SIDECAR_NAME = "sparsity.gguf"
FORMAT_VERSION = 1
#: Quantiles of |h| stored per neuron.
QUANTILES = (0.5, 0.9, 0.99)
_ARCH = "powerinfer-sidecar"
_S = "powerinfer.sidecar."
_C = "powerinfer.calibration."
_P = "powerinfer.predictor."

#: info key -> (GGUF key, type) for the scalar metadata.
_INFO_KEYS: dict[str, tuple[str, str]] = {
    "model_sha256": (_S + "model_sha256", "str"),
    "model_file": (_S + "model_file", "str"),
    "model_size": (_S + "model_size", "u64"),
    "text_sha256": (_S + "text_sha256", "str"),
    "text_file": (_S + "text_file", "str"),
    "offset_bytes": (_S + "text_offset_bytes", "u64"),
    "text_bytes": (_S + "text_bytes", "u64"),
    "tokens_stats": (_S + "tokens_stats", "u64"),
    "tokens_heldout": (_S + "tokens_heldout", "u64"),
    "n_ctx": (_S + "n_ctx", "u32"),
    "created": (_S + "created", "f64"),
    "ppl_dense": (_C + "ppl_dense", "f64"),
    "ppl_sparse": (_C + "ppl_sparse", "f64"),
    "max_ppl_increase": (_C + "max_ppl_increase", "f64"),
    "target_sparsity": (_C + "target_sparsity", "f64"),
    "mean_sparsity": (_C + "mean_sparsity", "f64"),
    "heldout_sparsity": (_C + "heldout_sparsity", "f64"),
    "method": (_C + "method", "str"),
    "threshold_on": (_C + "threshold_on", "str"),
    "forms_tried": (_C + "forms_tried", "str"),
    "calibration_seconds": (_C + "seconds", "f64"),
    "calibration_cpu_seconds": (_C + "cpu_seconds", "f64"),
    # decode speed measured at calibration (sparsity/speed.py); sparse="auto" runs dense below 1
    "decode_speedup": (_C + "decode_speedup", "f64"),
    "decode_dense_tok_s": (_C + "decode_dense_tok_s", "f64"),
    "decode_sparse_tok_s": (_C + "decode_sparse_tok_s", "f64"),
    "speed_threads": (_C + "speed_threads", "u32"),
    "speed_host": (_C + "speed_host", "str"),
    # what the dense side of that measurement ran on: "rows" (the file's) or "row groups" (repack)
    "speed_dense_layout": (_C + "speed_dense_layout", "str"),
}


@dataclass
class SparsityProfile:
    """Calibration results for one model.

    Attributes:
        thresholds: float32 (n_layer,): per layer, neurons with |h| below it are
            skipped in the down projection (h = act(gate x) * up x).
        layer_sparsity: float32 (n_layer,): expected fraction skipped per layer
            (on the calibration tokens).
        neuron_freq: float32 (n_layer, n_ff): per-neuron firing frequency at the
            layer's threshold.
        neuron_quantiles: float32 (n_layer, n_ff, len(QUANTILES)): |h| quantiles.
        layer_hist: float32 (n_layer, BINS): |h| histogram per layer, as fractions.
        ffn_act: activation name ("silu", "gelu", "relu", "drelu").
        info: provenance and measurements (keys of ``_INFO_KEYS``).
        path: where it was read from or written to (None before).
    """

    thresholds: np.ndarray
    layer_sparsity: np.ndarray
    neuron_freq: np.ndarray
    neuron_quantiles: np.ndarray
    layer_hist: np.ndarray
    ffn_act: str
    info: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    #: activation predictors (predictor.PredictorSet with ndarray weights) or None
    predictors: Any = None

    @property
    def n_layer(self) -> int:
        return int(self.thresholds.shape[0])


def sidecar_path(model_path: str | os.PathLike, *, create: bool = False) -> Path:
    """``<artifact dir of the model>/sparsity.gguf`` (the folder is created when
    ``create``). Raises OSError when ``create`` and no folder can be made."""
    return artifact_dir(model_path, create=create) / SIDECAR_NAME


def write_sidecar(path: str | os.PathLike, prof: SparsityProfile) -> Path:
    """Write ``prof`` to ``path`` atomically (GGUF via ``gguf.GGUFWriter``).

    Raises:
        ValueError: inconsistent array shapes. OSError: the folder is not writable.
    """
    import gguf

    n_layer = prof.n_layer
    n_ff = prof.neuron_freq.shape[1]
    if (
        prof.neuron_freq.shape != (n_layer, n_ff)
        or prof.layer_sparsity.shape != (n_layer,)
        or prof.neuron_quantiles.shape != (n_layer, n_ff, len(QUANTILES))
        or prof.layer_hist.shape[0] != n_layer
    ):
        raise ValueError("sparsity profile arrays have inconsistent shapes")
    path = Path(path)

    def write(tmp: Path) -> None:
        w = gguf.GGUFWriter(tmp, _ARCH)
        add: dict[str, Callable[[str, Any], None]] = {
            "str": w.add_string,
            "u64": w.add_uint64,
            "u32": w.add_uint32,
            "f64": w.add_float64,
        }
        w.add_uint32(_S + "version", FORMAT_VERSION)
        for name, (key, kind) in _INFO_KEYS.items():
            v = prof.info.get(name)
            if v is None:
                continue
            add[kind](key, str(v) if kind == "str" else (float(v) if kind == "f64" else int(v)))
        w.add_string("powerinfer.ffn_act", prof.ffn_act)
        w.add_array(_C + "thresholds", [float(x) for x in prof.thresholds])
        w.add_array(_C + "layer_sparsity", [float(x) for x in prof.layer_sparsity])
        w.add_array(_C + "quantiles", [float(q) for q in QUANTILES])
        for i in range(n_layer):
            w.add_tensor(f"blk.{i}.ffn_act_freq", np.ascontiguousarray(prof.neuron_freq[i], np.float32))
            w.add_tensor(f"blk.{i}.ffn_act_quantiles", np.ascontiguousarray(prof.neuron_quantiles[i], np.float32))
            w.add_tensor(f"blk.{i}.ffn_act_hist", np.ascontiguousarray(prof.layer_hist[i], np.float32))
        ps = prof.predictors
        if ps is not None:
            layers = ps.layers
            w.add_array(_P + "layers", [int(x) for x in layers])
            w.add_array(_P + "thresholds", [float(ps.thresholds[x]) for x in layers])
            for k, v in ps.info.items():
                if isinstance(v, (list, tuple, np.ndarray)):
                    w.add_array(_P + k, [float(x) for x in v])
                elif isinstance(v, str):
                    w.add_string(_P + k, v)
                elif v is not None:
                    w.add_float64(_P + k, float(v))
            for x in layers:
                for stem, t in (("fc1", ps.fc1[x]), ("fc2", ps.fc2[x])):
                    if isinstance(t, np.ndarray):
                        w.add_tensor(f"blk.{x}.{stem}.weight", np.ascontiguousarray(t))
                    else:  # a quantized TensorView (train-predictor --quantize q8_0)
                        from gguf import GGMLQuantizationType

                        w.add_tensor(
                            f"blk.{x}.{stem}.weight",
                            np.asarray(t.data, np.uint8).reshape(t.ne[1], -1),
                            raw_dtype=GGMLQuantizationType(t.type),
                        )
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    atomic_write_path(path, write)
    prof.path = path
    return path


def read_sidecar(path: str | os.PathLike, *, model_path: str | os.PathLike | None = None) -> SparsityProfile:
    """Read a sidecar written by :func:`write_sidecar`.

    Args:
        path: the sidecar file.
        model_path: when given, the sidecar must have been made from this model
            file (its SHA-256 is compared with the recorded one).

    Raises:
        ValueError: missing, unreadable or malformed file (naming the file and
            the key or tensor), a format version this code does not know, or a
            sidecar made for another model (naming both files and hashes).
    """
    from ..loader.gguf_meta import parse_header
    from ..loader.reader import plain_value, tensor_array

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"sparsity sidecar does not exist: {p}")
    try:
        h = parse_header(str(p))  # a corrupt file: ValueError naming it and the key or tensor
    except OSError as e:
        raise ValueError(f"{p}: unreadable sparsity sidecar ({e})") from e
    fields = {k: plain_value(v) for k, v in h.kv.items()}
    tensors = {t.name: np.array(tensor_array(h, t)) for t in h.tensors}  # copies: the map is not kept
    ttypes = {t.name: t.type for t in h.tensors}
    if fields.get("general.architecture") != _ARCH:
        raise ValueError(
            f"{p}: not a sparsity sidecar (general.architecture = "
            f"{fields.get('general.architecture')!r}, expected {_ARCH!r})"
        )
    version = fields.get(_S + "version")
    if version != FORMAT_VERSION:
        raise ValueError(f"{p}: sidecar format version {version}, this code reads {FORMAT_VERSION}")
    info = {name: fields[key] for name, (key, _) in _INFO_KEYS.items() if key in fields}
    if model_path is not None:
        want = model_fingerprint(model_path)
        if info.get("model_sha256") != want:
            raise ValueError(
                f"sparsity sidecar {p} was made for another model ({info.get('model_file', '?')}, "
                f"sha256 {info.get('model_sha256', '?')}), not {os.fspath(model_path)} (sha256 {want}); "
                f"recalibrate with `powerinfer-backend calibrate` or pass sparse='off'"
            )

    def need(key: str) -> Any:
        if key not in fields:
            raise ValueError(f"{p}: missing key '{key}'")
        return fields[key]

    thresholds = np.asarray(need(_C + "thresholds"), np.float32)
    n_layer = thresholds.shape[0]
    if n_layer < 1 or not np.all(np.isfinite(thresholds)) or np.any(thresholds < 0):
        raise ValueError(f"{p}: key '{_C}thresholds' must be finite values >= 0 (got {thresholds[:4]}...)")
    layer_sparsity = np.asarray(need(_C + "layer_sparsity"), np.float32)
    if layer_sparsity.shape != (n_layer,):
        raise ValueError(f"{p}: '{_C}layer_sparsity' has {layer_sparsity.shape[0]} entries, expected {n_layer}")

    def stack(kind: str) -> np.ndarray:
        rows = []
        for i in range(n_layer):
            name = f"blk.{i}.{kind}"
            if name not in tensors:
                raise ValueError(f"{p}: missing tensor '{name}'")
            rows.append(np.asarray(tensors[name], np.float32))
        if any(r.shape != rows[0].shape for r in rows):
            raise ValueError(f"{p}: tensors 'blk.N.{kind}' differ in shape across layers")
        return np.stack(rows)

    prof = SparsityProfile(
        thresholds=thresholds,
        layer_sparsity=layer_sparsity,
        neuron_freq=stack("ffn_act_freq"),
        neuron_quantiles=stack("ffn_act_quantiles"),
        layer_hist=stack("ffn_act_hist"),
        ffn_act=str(need("powerinfer.ffn_act")),
        info=info,
        path=p,
    )
    if _P + "layers" in fields or any(k.endswith(".fc1.weight") for k in tensors):
        prof.predictors = _read_predictors(p, fields, tensors, n_layer, prof.neuron_freq.shape[1], ttypes)
    return prof


def _read_predictors(p, fields, tensors, n_layer, n_ff, ttypes=None):
    from ..loader import TensorView
    from .predictors import PredictorSet

    layers = [int(x) for x in fields.get(_P + "layers", [])]
    thr = fields.get(_P + "thresholds", [])
    if len(thr) != len(layers):
        raise ValueError(f"{p}: key '{_P}thresholds' has {len(thr)} entries, '{_P}layers' {len(layers)}")
    ps = PredictorSet(source=str(p))
    for layer, t in zip(layers, thr):
        for stem, dst in (("fc1", ps.fc1), ("fc2", ps.fc2)):
            name = f"blk.{layer}.{stem}.weight"
            if name not in tensors:
                raise ValueError(f"{p}: layer {layer}: tensor '{name}' missing")
            ty = (ttypes or {}).get(name, 0)
            if ty in (0, 1):  # F32, F16
                dst[layer] = np.ascontiguousarray(tensors[name])
            else:  # quantized (Q8_0): bytes (rows, row bytes) -> a TensorView for the kernels
                from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

                raw = np.ascontiguousarray(tensors[name], np.uint8)
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ty)]
                rows = raw.shape[0] if raw.ndim == 2 else 1
                cols = raw.size // rows // size * block
                dst[layer] = TensorView(
                    name=name, type=ty, ne=(cols, rows), data=raw.reshape(-1), nbytes=int(raw.nbytes)
                )
        ps.thresholds[layer] = float(t)
    for k, v in fields.items():
        if k.startswith(_P) and k not in (_P + "layers", _P + "thresholds"):
            ps.info[k[len(_P) :]] = v
    f1 = ps.fc1[layers[0]] if layers else None
    n_embd = 0 if f1 is None else (f1.shape[1] if isinstance(f1, np.ndarray) else f1.ne[0])
    try:
        ps.validate(n_layer, n_embd, n_ff)
    except ValueError as e:
        raise ValueError(f"{p}: {e}") from None
    return ps


def check_overwrite(path: str | os.PathLike, model_sha256: str, text_sha256: str, *, force: bool) -> None:
    """Refuse to replace a sidecar made from another model or another text.

    No error when ``path`` does not exist, records the same model and text, or
    ``force``. Raises ValueError naming the file, what it was made from, and
    ``--force``; also for an existing file that is not a readable sidecar."""
    p = Path(path)
    if force or not p.exists():
        return
    try:
        old = read_sidecar(p)
    except ValueError as e:
        raise ValueError(
            f"refusing to overwrite {p}: it is not a readable sparsity sidecar ({e}); pass --force to replace it"
        ) from e
    src_model, src_text = old.info.get("model_sha256"), old.info.get("text_sha256")
    if src_model != model_sha256:
        raise ValueError(
            f"refusing to overwrite {p}: it was made from another model "
            f"({old.info.get('model_file', '?')}, sha256 {src_model}); pass --force to replace it"
        )
    if src_text != text_sha256:
        raise ValueError(
            f"refusing to overwrite {p}: it was calibrated on another text "
            f"({old.info.get('text_file', '?')}, sha256 {src_text}); pass --force to replace it"
        )
