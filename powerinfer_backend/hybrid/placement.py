"""VRAM placement: which dense blocks and which FFN neurons live on the device.

A pure function, :func:`plan_placement`, turns

* the model's tensor sizes in their stored types (:class:`ModelSizes`, built from a
  loaded GGUF by :meth:`ModelSizes.from_gguf`),
* per-neuron firing frequencies (float (n_layer, n_ff) in [0, 1], from the
  calibration sidecar's ``neuron_freq``; uniform 1.0 when absent),
* a budget in bytes, ``n_ctx`` and ``n_batch``

into a :class:`Plan` whose byte total (:attr:`Plan.device_bytes`) is exact and never
exceeds the budget. docs/placement.md describes the algorithm and the accounting;
in short, every device buffer is rounded up to :data:`DEVICE_ALIGN` bytes, and

* scratch (activations of ``n_batch`` tokens) is reserved first: nothing goes to the
  device unless it fits;
* then the dense blocks, in order: per layer the attention block (attn_norm, q, k, v,
  output, ffn_norm, and the layer's KV cache for ``n_ctx`` tokens), layers 0..n-1,
  then the output block (output_norm, output projection or the tied embedding, and
  the logits of ``n_batch`` tokens); a block that does not fit is skipped and the
  next one tried;
* then FFN neurons across all layers, a fractional knapsack: neurons of a layer are
  ranked by frequency (ties: lower id first), cut into groups of
  :data:`NEURON_GROUP`, and groups are taken in decreasing frequency per byte
  (ties: lower group rank, then lower layer) while they fit; a group that does not
  fit whole is taken in part (the most its layer can still add) and closes its
  layer.

:func:`plan_for_model` caches the plan beside the model (``placement.json`` in the
artifact folder, :mod:`powerinfer_backend.loader.artifacts`) and reuses it when its inputs
match; :func:`parse_vram_budget` and :func:`resolve_budget` turn user input into bytes.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..loader.artifacts import (artifact_dir, artifact_metadata, atomic_write_json, check_provenance,
                        model_fingerprint, read_metadata)

__all__ = [
    "GiB", "MiB", "DEVICE_ALIGN", "NEURON_GROUP", "KV_PAD", "DEFAULT_FREE_MARGIN", "PLAN_NAME",
    "FORMAT_VERSION", "TensorSize", "ModelSizes", "LayerPlan", "Plan", "BudgetDecision",
    "row_bytes", "align_up", "scratch_bytes", "kv_bytes_per_layer", "attn_block_bytes",
    "output_block_bytes", "hot_bytes", "neuron_bytes", "full_device_bytes", "layer_bytes",
    "plan_placement", "plan_layer_split", "neuron_frequencies", "parse_vram_budget", "resolve_budget", "plan_path", "plan_for_model",
    "load_plan",
]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40
#: Every device buffer starts on, and is rounded up to, this many bytes.
DEVICE_ALIGN = 256
#: Neurons per knapsack group (one quantization block's worth of rows).
NEURON_GROUP = 32
#: The KV cache holds a multiple of this many positions (PI_KV_PAD in native/src/pi_internal.h).
KV_PAD = 64
#: Bytes per KV cache element (F16, the engine's default kv_type).
KV_ELEM_BYTES = 2
#: Bytes per activation element in device scratch (F32).
ACT_BYTES = 4
#: Bytes per row -> neuron map entry (int32).
MAP_BYTES = 4
#: When no budget and no n_gpu_layers is given: free device memory minus this.
DEFAULT_FREE_MARGIN = 512 * MiB
PLAN_NAME = "placement.json"
FORMAT_VERSION = 1

_T = GGMLQuantizationType
_F32 = int(_T.F32)
_F16 = int(_T.F16)
#: Per-layer slots placed neuron by neuron (hot rows), not as part of the dense block.
_FFN_ROW_SLOTS = ("ffn_gate", "ffn_up", "ffn_down")


def align_up(n: int, align: int = DEVICE_ALIGN) -> int:
    """``n`` bytes rounded up to a multiple of ``align`` (0 stays 0)."""
    return -(-int(n) // align) * align


def row_bytes(ggml_type: int, n: int) -> int:
    """Bytes of ``n`` elements of ggml type ``ggml_type`` (whole blocks).

    Raises:
        ValueError: unknown type, or ``n`` not a multiple of the type's block size.
    """
    try:
        block, size = GGML_QUANT_SIZES[_T(int(ggml_type))]
    except (ValueError, KeyError) as e:
        raise ValueError(f"unknown ggml type id {ggml_type}") from e
    if n % block:
        raise ValueError(f"{n} elements are not a whole number of {_T(int(ggml_type)).name} blocks of {block}")
    return n // block * size


@dataclass(frozen=True)
class TensorSize:
    """One tensor's stored type and shape.

    Attributes:
        type: ggml type id as held in memory (after any load-time conversion).
        ne: elements per dimension, GGUF order (``ne[0]`` = row length).
    """

    type: int
    ne: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes in the stored type: rows x :func:`row_bytes`."""
        return row_bytes(self.type, self.ne[0]) * math.prod(self.ne[1:])


@dataclass(frozen=True)
class ModelSizes:
    """What placement needs to know about a model: dimensions and tensor sizes.

    Attributes:
        n_layer, n_embd, n_ff, n_head, n_head_kv, n_embd_head, n_vocab: hyper-parameters.
        layers: per layer, slot name (:data:`arch.LAYER_SLOTS`) -> :class:`TensorSize`.
        output_norm: F32 [n_embd].
        output: the output projection [n_embd, n_vocab] (the token embedding when tied).
        down_t_bytes: bytes per element of the transposed down rows a hot neuron
            keeps on the device (2 = F16; 4 = F32 when every ffn_down is F32), the rule
            of :func:`powerinfer_backend.engine.down_cache.down_t_dtype`.
    """

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_embd_head: int
    n_vocab: int
    layers: tuple[Mapping[str, TensorSize], ...]
    output_norm: TensorSize
    output: TensorSize
    down_t_bytes: int = 2

    @property
    def n_embd_kv(self) -> int:
        return self.n_head_kv * self.n_embd_head

    @property
    def n_embd_q(self) -> int:
        return self.n_head * self.n_embd_head

    @classmethod
    def from_gguf(cls, model) -> "ModelSizes":
        """Sizes of a :class:`powerinfer_backend.loader.gguf_model.GGUFModel` (types as loaded)."""
        from ..loader.arch import LAYER_SLOTS

        hp = model.hparams
        layers = []
        for i in range(hp.n_layer):
            layers.append({slot: TensorSize(int(t.type), tuple(int(x) for x in t.ne))
                           for slot, t in zip(LAYER_SLOTS, model.layer_tensors(i))
                           if t is not None})  # optional slots an architecture lacks
        g = model.global_tensors()
        out = g["output"] if g["output"] is not None else g["tok_embd"]
        all_f32 = all(layer["ffn_down"].type == _F32 for layer in layers)
        return cls(n_layer=hp.n_layer, n_embd=hp.n_embd, n_ff=hp.n_ff, n_head=hp.n_head,
                   n_head_kv=hp.n_head_kv, n_embd_head=hp.n_embd_head, n_vocab=hp.n_vocab,
                   layers=tuple(layers),
                   output_norm=TensorSize(int(g["output_norm"].type), tuple(g["output_norm"].ne)),
                   output=TensorSize(int(out.type), tuple(int(x) for x in out.ne)),
                   down_t_bytes=4 if all_f32 else 2)


# ---- byte accounting -----------------------------------------------------------------


def _n_cells(n_ctx: int) -> int:
    return -(-n_ctx // KV_PAD) * KV_PAD


def scratch_bytes(s: ModelSizes, n_ctx: int, n_batch: int) -> int:
    """Device activation scratch for ``n_batch`` tokens (bytes): F32 buffers of
    x, xn and the FFN partial sum y (n_embd each), q and the attention output
    (n_embd_q), k and v (n_embd_kv), gate and up of up to n_ff hot rows, the
    attention scores (n_head x n_cells, n_cells = n_ctx rounded up to 64) and the
    quantized matmul input (max(n_embd, n_embd_q) elements at 4 bytes, the widest
    activation type), each rounded up to :data:`DEVICE_ALIGN`."""
    B, a = n_batch, ACT_BYTES
    bufs = [B * s.n_embd * a] * 3 + [B * s.n_embd_q * a] * 2 + [B * s.n_embd_kv * a] * 2 \
        + [B * s.n_ff * a] * 2 + [B * s.n_head * _n_cells(n_ctx) * a, B * max(s.n_embd, s.n_embd_q) * a]
    return sum(align_up(b) for b in bufs)


def kv_bytes_per_layer(s: ModelSizes, n_ctx: int) -> int:
    """One layer's KV cache (bytes): K and V, each n_cells x n_embd_kv F16
    (n_cells = n_ctx rounded up to 64), each rounded up to DEVICE_ALIGN."""
    return 2 * align_up(_n_cells(n_ctx) * s.n_embd_kv * KV_ELEM_BYTES)


def attn_block_bytes(s: ModelSizes, i: int, n_ctx: int) -> int:
    """Layer ``i``'s dense block on the device (bytes): attn_norm, attn_q/k/v,
    attn_output, ffn_norm in their stored types, each aligned, plus its KV cache."""
    dense = [slot for slot in s.layers[i] if slot not in _FFN_ROW_SLOTS]  # incl. optional norms / biases
    return sum(align_up(s.layers[i][slot].nbytes) for slot in dense) + kv_bytes_per_layer(s, n_ctx)


def output_block_bytes(s: ModelSizes, n_batch: int) -> int:
    """The output block (bytes): output_norm, the output projection (the token
    embedding when tied) in its stored type, and F32 logits of n_batch tokens."""
    return (align_up(s.output_norm.nbytes) + align_up(s.output.nbytes)
            + align_up(n_batch * s.n_vocab * ACT_BYTES))


def neuron_bytes(s: ModelSizes, i: int) -> tuple[int, int, int]:
    """Bytes of one hot neuron's rows in layer ``i``: (gate row, up row, down_t row)
    — gate and up rows of n_embd in their stored types (gate 0 without one), the
    down_t row of n_embd at ``s.down_t_bytes`` per element."""
    L = s.layers[i]
    gate = row_bytes(L["ffn_gate"].type, s.n_embd) if "ffn_gate" in L else 0  # ungated FFN (Falcon, OPT)
    return (gate, row_bytes(L["ffn_up"].type, s.n_embd), s.n_embd * s.down_t_bytes)


def hot_bytes(s: ModelSizes, i: int, n_hot: int) -> int:
    """Device bytes of ``n_hot`` compact hot rows in layer ``i``: the gate, up and
    down_t row arrays and the int32 row -> neuron map, each aligned (0 for 0 rows)."""
    g, u, d = neuron_bytes(s, i)
    return (align_up(n_hot * g) + align_up(n_hot * u) + align_up(n_hot * d)
            + align_up(n_hot * MAP_BYTES))


def layer_bytes(s: ModelSizes, i: int, n_ctx: int) -> int:
    """Layer ``i`` whole on the device: its dense block, KV cache and all n_ff neurons."""
    return attn_block_bytes(s, i, n_ctx) + hot_bytes(s, i, s.n_ff)


def full_device_bytes(s: ModelSizes, n_ctx: int, n_batch: int) -> int:
    """Bytes of a plan that puts everything on the device (scratch, every layer
    whole, the output block): the smallest budget at which nothing stays on the CPU."""
    return (scratch_bytes(s, n_ctx, n_batch) + sum(layer_bytes(s, i, n_ctx) for i in range(s.n_layer))
            + output_block_bytes(s, n_batch))


# ---- the plan ------------------------------------------------------------------------


@dataclass
class LayerPlan:
    """One layer's placement.

    Attributes:
        layer: index.
        attn_on_device: the dense block (attention, norms) and the layer's KV cache
            are on the device.
        attn_bytes: device bytes of that block with its KV cache (0 when on the CPU).
        kv_bytes: device bytes of the KV cache alone (0 when on the CPU).
        hot_ids: int32 (n_hot,), strictly increasing neuron ids held as compact rows
            on the device; row r of the device arrays is neuron ``hot_ids[r]``.
        hot_bytes: device bytes of those rows and the map.
        freq_mass: fraction of the layer's firing-frequency mass on the device
            (sum of hot frequencies / sum of all; 1.0 when all are hot, 0.0 when none).
    """

    layer: int
    attn_on_device: bool
    attn_bytes: int
    kv_bytes: int
    hot_ids: np.ndarray
    hot_bytes: int
    freq_mass: float

    @property
    def n_hot(self) -> int:
        return int(self.hot_ids.shape[0])

    @property
    def device_bytes(self) -> int:
        return self.attn_bytes + self.hot_bytes


@dataclass
class Plan:
    """A placement (see the module doc).

    Attributes:
        budget_bytes: the budget it was made for.
        n_ctx, n_batch, n_ff: what it was made for.
        scratch_bytes: activation scratch on the device (0 when nothing is placed).
        output_on_device: the output block is on the device.
        output_bytes: its device bytes (0 when on the CPU).
        layers: one :class:`LayerPlan` per layer.
        inputs: what the plan was computed from (cache key, see :func:`plan_for_model`).
        path: where it was read from or written to, if anywhere.
        cached: True when :func:`plan_for_model` reused a stored plan.
    """

    budget_bytes: int
    n_ctx: int
    n_batch: int
    n_ff: int
    scratch_bytes: int
    output_on_device: bool
    output_bytes: int
    layers: list[LayerPlan]
    inputs: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    cached: bool = False

    @property
    def device_bytes(self) -> int:
        """Every byte the device holds under this plan (<= budget_bytes)."""
        return self.scratch_bytes + self.output_bytes + sum(L.device_bytes for L in self.layers)

    @property
    def kv_location(self) -> str:
        """"device" (every layer's KV cache), "cpu" (none) or "split"."""
        on = sum(L.attn_on_device for L in self.layers)
        return "device" if on == len(self.layers) else ("cpu" if on == 0 else "split")

    @property
    def hot_fraction(self) -> float:
        """Hot neurons / all neurons, over all layers."""
        return sum(L.n_hot for L in self.layers) / max(1, self.n_ff * len(self.layers))

    def bytes_by_category(self) -> dict[str, int]:
        """Device bytes per category: scratch, attention (weights), kv_cache, output,
        ffn_hot; and free (budget - device_bytes)."""
        kv = sum(L.kv_bytes for L in self.layers)
        return {"scratch": self.scratch_bytes, "attention": sum(L.attn_bytes for L in self.layers) - kv,
                "kv_cache": kv, "output": self.output_bytes, "ffn_hot": sum(L.hot_bytes for L in self.layers),
                "free": self.budget_bytes - self.device_bytes}

    def to_json(self) -> dict[str, Any]:
        return {"format_version": FORMAT_VERSION, "budget_bytes": self.budget_bytes, "n_ctx": self.n_ctx,
                "n_batch": self.n_batch, "n_ff": self.n_ff, "scratch_bytes": self.scratch_bytes,
                "output_on_device": self.output_on_device, "output_bytes": self.output_bytes,
                "device_bytes": self.device_bytes, "inputs": self.inputs,
                "layers": [{"layer": L.layer, "attn_on_device": L.attn_on_device, "attn_bytes": L.attn_bytes,
                            "kv_bytes": L.kv_bytes, "hot_bytes": L.hot_bytes, "freq_mass": L.freq_mass,
                            "hot_ids": L.hot_ids.tolist()} for L in self.layers]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Plan":
        """Inverse of :meth:`to_json`. Raises ValueError for another format version
        or a malformed plan (missing keys, inconsistent byte total)."""
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"placement plan format version {d.get('format_version')!r}, "
                             f"this code reads {FORMAT_VERSION}")
        try:
            layers = [LayerPlan(int(L["layer"]), bool(L["attn_on_device"]), int(L["attn_bytes"]),
                                int(L["kv_bytes"]), np.asarray(L["hot_ids"], dtype=np.int32),
                                int(L["hot_bytes"]), float(L["freq_mass"])) for L in d["layers"]]
            plan = cls(int(d["budget_bytes"]), int(d["n_ctx"]), int(d["n_batch"]), int(d["n_ff"]),
                       int(d["scratch_bytes"]), bool(d["output_on_device"]), int(d["output_bytes"]), layers,
                       dict(d.get("inputs", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed placement plan ({type(e).__name__}: {e})") from e
        if plan.device_bytes != d.get("device_bytes") or plan.device_bytes > plan.budget_bytes:
            raise ValueError(f"malformed placement plan: device_bytes {d.get('device_bytes')} recorded, "
                             f"{plan.device_bytes} summed, budget {plan.budget_bytes}")
        return plan

    def format_table(self) -> str:
        """Human-readable per-layer table and byte totals."""
        mib = lambda b: f"{b / MiB:9.2f}"  # noqa: E731
        lines = [f"vram budget {self.budget_bytes} B ({self.budget_bytes / GiB:.3f} GiB), plan uses "
                 f"{self.device_bytes} B ({self.device_bytes / GiB:.3f} GiB); n_ctx {self.n_ctx}, "
                 f"n_batch {self.n_batch}; KV cache: {self.kv_location}; output: "
                 f"{'device' if self.output_on_device else 'cpu'}",
                 "layer  attn+kv     hot/n_ff    hot%  freq%   attn MiB    kv MiB   hot MiB",
                 ]
        for L in self.layers:
            lines.append(f"{L.layer:5d}  {'device' if L.attn_on_device else 'cpu':7s} {L.n_hot:6d}/{self.n_ff:<6d}"
                         f" {100 * L.n_hot / self.n_ff:6.1f} {100 * L.freq_mass:6.1f} "
                         f"{mib(L.attn_bytes - L.kv_bytes)} {mib(L.kv_bytes)} {mib(L.hot_bytes)}")
        lines.append("bytes by category: " + ", ".join(f"{k} {v}" for k, v in self.bytes_by_category().items()))
        return "\n".join(lines)


def _check_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _check_freq(s: ModelSizes, neuron_freq: np.ndarray | None) -> np.ndarray:
    if neuron_freq is None:
        return np.ones((s.n_layer, s.n_ff), np.float64)
    f = np.asarray(neuron_freq, dtype=np.float64)
    if f.shape != (s.n_layer, s.n_ff):
        raise ValueError(f"neuron_freq must have shape (n_layer, n_ff) = {(s.n_layer, s.n_ff)}, got {f.shape}")
    if not np.all(np.isfinite(f)) or f.min(initial=0.0) < 0 or f.max(initial=0.0) > 1:
        raise ValueError("neuron_freq must hold finite frequencies in [0, 1]")
    return f


def plan_placement(sizes: ModelSizes, neuron_freq: np.ndarray | None, vram_budget: int, *, n_ctx: int,
                   n_batch: int, disable_gpu_index: bool = False, neurons_only: bool = False) -> Plan:
    """Place dense blocks and FFN neurons on the device within ``vram_budget`` bytes.

    Args:
        sizes: the model's dimensions and stored tensor sizes.
        neuron_freq: float (n_layer, n_ff), firing frequencies in [0, 1]; None = uniform.
        vram_budget: device bytes available to our allocations (int >= 0).
        n_ctx: KV cache length in tokens (>= 1).
        n_batch: most tokens per eval call (>= 1), sizes the scratch and logits.
        disable_gpu_index: place no FFN neurons (dense blocks only).
        neurons_only: no scratch and no dense blocks, FFN neurons only (a device that
            runs only FFN halves and holds its own buffers, e.g. the CUDA device today).

    Returns:
        A :class:`Plan` with ``device_bytes <= vram_budget`` (deterministic: the same
        inputs give the same plan).

    Raises:
        ValueError: a negative or non-integer budget, n_ctx or n_batch < 1, or a
            neuron_freq of the wrong shape or outside [0, 1].
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_batch = _check_int("n_batch", n_batch, 1)
    freq = _check_freq(sizes, neuron_freq)
    nl, nff = sizes.n_layer, sizes.n_ff
    attn_on = [False] * nl
    output_on = False
    n_hot = [0] * nl
    order: list[np.ndarray] = []
    scratch = 0 if neurons_only else scratch_bytes(sizes, n_ctx, n_batch)
    used = 0
    if scratch <= budget and not neurons_only:
        used = scratch
        for i in range(nl):
            b = attn_block_bytes(sizes, i, n_ctx)
            if used + b <= budget:
                attn_on[i], used = True, used + b
        ob = output_block_bytes(sizes, n_batch)
        if used + ob <= budget:
            output_on, used = True, used + ob
    if scratch <= budget and not disable_gpu_index:
        # rank neurons per layer: frequency descending, id ascending
        order = [np.lexsort((np.arange(nff), -freq[i])) for i in range(nl)]
        groups = []  # (-density, group rank, layer)
        for i in range(nl):
            per = sum(neuron_bytes(sizes, i))
            f_sorted = freq[i][order[i]]
            prev = math.inf
            for g in range(0, nff, NEURON_GROUP):
                k = min(NEURON_GROUP, nff - g)
                # mean frequency per byte; non-increasing by rank (guards float rounding)
                prev = min(prev, float(f_sorted[g:g + k].sum()) / (k * per))
                groups.append((-prev, g // NEURON_GROUP, i))
        groups.sort()
        closed = [False] * nl
        for _, g, i in groups:
            if closed[i]:
                continue
            start, k = g * NEURON_GROUP, min(NEURON_GROUP, nff - g * NEURON_GROUP)
            assert n_hot[i] == start  # groups of one layer come in rank order
            cur = hot_bytes(sizes, i, start)
            if used - cur + hot_bytes(sizes, i, start + k) <= budget:
                used += hot_bytes(sizes, i, start + k) - cur
                n_hot[i] = start + k
                continue
            lo, hi = 0, k  # largest take in [0, k) that fits
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if used - cur + hot_bytes(sizes, i, start + mid) <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            used += hot_bytes(sizes, i, start + lo) - cur
            n_hot[i] = start + lo
            closed[i] = True
    if scratch > budget or (not any(attn_on) and not output_on and not any(n_hot)):
        used -= scratch if scratch <= budget else 0
        scratch = 0  # scratch alone is no plan: nothing goes to the device
    layers = []
    for i in range(nl):
        ids = np.sort(order[i][:n_hot[i]]).astype(np.int32) if order else np.zeros(0, np.int32)
        total = float(freq[i].sum())
        mass = float(freq[i][ids].sum()) / total if total > 0 else (1.0 if n_hot[i] == nff else 0.0)
        kv = kv_bytes_per_layer(sizes, n_ctx) if attn_on[i] else 0
        layers.append(LayerPlan(i, attn_on[i], attn_block_bytes(sizes, i, n_ctx) if attn_on[i] else 0, kv, ids,
                                hot_bytes(sizes, i, n_hot[i]), mass))
    plan = Plan(budget, n_ctx, n_batch, nff, scratch, output_on,
                output_block_bytes(sizes, n_batch) if output_on else 0, layers)
    assert plan.device_bytes == used and used <= budget, (plan.device_bytes, used, budget)
    return plan


def plan_layer_split(sizes: ModelSizes, vram_budget: int, *, n_ctx: int, n_batch: int) -> Plan:
    """The classic split llama.cpp's ``-ngl`` makes, in the same :class:`Plan` form:
    whole layers (attention block, KV cache and all n_ff neurons) on the device from
    the last layer backwards while they fit, then the output block (llama.cpp counts it
    as one more layer after the last); scratch first, as :func:`plan_placement`. For
    comparing the neuron-level policy with layer offloading at the same budget.

    Raises:
        ValueError: as :func:`plan_placement`.
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_batch = _check_int("n_batch", n_batch, 1)
    nl, nff = sizes.n_layer, sizes.n_ff
    whole = [False] * nl
    output_on = False
    scratch = scratch_bytes(sizes, n_ctx, n_batch)
    used = scratch
    if scratch <= budget:
        for i in reversed(range(nl)):
            if used + layer_bytes(sizes, i, n_ctx) > budget:
                break
            whole[i], used = True, used + layer_bytes(sizes, i, n_ctx)
        if all(whole) and used + output_block_bytes(sizes, n_batch) <= budget:
            output_on, used = True, used + output_block_bytes(sizes, n_batch)
    else:
        scratch = used = 0
    if not any(whole) and not output_on:
        scratch = used = 0
    layers = [LayerPlan(i, whole[i], attn_block_bytes(sizes, i, n_ctx) if whole[i] else 0,
                        kv_bytes_per_layer(sizes, n_ctx) if whole[i] else 0,
                        np.arange(nff if whole[i] else 0, dtype=np.int32),
                        hot_bytes(sizes, i, nff if whole[i] else 0), 1.0 if whole[i] else 0.0) for i in range(nl)]
    plan = Plan(budget, n_ctx, n_batch, nff, scratch, output_on,
                output_block_bytes(sizes, n_batch) if output_on else 0, layers)
    assert plan.device_bytes == used <= budget, (plan.device_bytes, used, budget)
    return plan


# ---- vram_budget and n_gpu_layers -------------------------------------------------------

_UNITS = {"": GiB, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB, "k": KiB, "m": MiB, "g": GiB,
          "t": TiB, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_vram_budget(value: Any) -> int | None:
    """``vram_budget`` as bytes.

    Accepts None (-> None: not given), a number of GiB (int or float: 8, 0.5), or a
    string: a number with an optional unit, case-insensitive — none or "GiB"/"G"
    (GiB), "B", "KiB"/"K", "MiB"/"M", "TiB"/"T", and decimal "KB"/"MB"/"GB"/"TB"
    (powers of 1000): "8", "8GiB", "512MiB", "1.5 GB". Fractions of a byte are
    rounded down.

    Raises:
        ValueError: negative, NaN, infinite, a bool, or an unparseable string
            (the message names ``vram_budget`` and what was given).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"vram_budget must be GiB as a number or a string like '8GiB', got {value!r}")
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise ValueError(f"vram_budget must be >= 0, got {value!r}")
        return int(value) * GiB
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"vram_budget must be a finite number of GiB >= 0, got {value!r}")
        return int(value * GiB)
    if isinstance(value, str):
        m = _BUDGET_RE.match(value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            if value.strip().startswith("-"):
                raise ValueError(f"vram_budget must be >= 0, got {value!r}")
            raise ValueError(f"vram_budget {value!r} is not a size: use GiB as a number or a string like "
                             f"'8GiB', '512MiB', '1.5GB'")
        x = float(m.group(1))
        if not math.isfinite(x):
            raise ValueError(f"vram_budget must be finite, got {value!r}")
        return int(x * _UNITS[unit]) if unit else int(x * GiB)
    raise ValueError(f"vram_budget must be GiB as a number or a string like '8GiB', got {type(value).__name__} "
                     f"{value!r}")


@dataclass(frozen=True)
class BudgetDecision:
    """The budget to plan with, and why.

    Attributes:
        bytes: device bytes for our allocations (0 = CPU only).
        source: "vram_budget", "n_gpu_layers", "default" or "no_device".
        message: the one line to show the user (empty when nothing to say).
    """

    bytes: int
    source: str
    message: str


def resolve_budget(vram_budget: Any, n_gpu_layers: int | None, sizes: ModelSizes, *, free_bytes: int | None,
                   n_ctx: int, n_batch: int, margin: int = DEFAULT_FREE_MARGIN) -> BudgetDecision:
    """Decide the budget from the user's ``vram_budget`` and ``n_gpu_layers``.

    Rules, in order (issue 6):

    1. an explicit ``vram_budget`` (anything :func:`parse_vram_budget` accepts) wins;
       a given ``n_gpu_layers`` is then ignored with one ``UserWarning``. Above
       ``free_bytes`` -> ValueError with both byte counts.
    2. else an explicit ``n_gpu_layers``: 0 -> CPU only; N > 0 -> the bytes of
       min(N, n_layer) whole layers (:func:`layer_bytes`) plus scratch, plus the
       output block when N > n_layer (llama.cpp counts the output as one more layer);
       -1 -> everything (:func:`full_device_bytes`). Both are capped at
       ``free_bytes`` (never an error). The message says what it became.
    3. else: ``free_bytes - margin`` (at least 0), or 0 without a device.

    Args:
        free_bytes: free device memory after the runtime's own use, or None when
            there is no device (then rules 2 and 3 give 0; rule 1 is not checked).

    Raises:
        ValueError: a bad ``vram_budget``, ``n_gpu_layers`` < -1 or not an int, or a
            ``vram_budget`` above ``free_bytes``.
    """
    b = parse_vram_budget(vram_budget)
    if b is not None:
        if n_gpu_layers is not None:
            warnings.warn(f"n_gpu_layers={n_gpu_layers} ignored: vram_budget={vram_budget!r} decides placement",
                          UserWarning, stacklevel=2)
        if free_bytes is not None and b > free_bytes:
            raise ValueError(f"vram_budget {vram_budget!r} = {b} bytes exceeds the device's free memory "
                             f"{free_bytes} bytes")
        return BudgetDecision(b, "vram_budget", "")
    if n_gpu_layers is not None:
        if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, (int, np.integer)) or n_gpu_layers < -1:
            raise ValueError(f"n_gpu_layers must be an integer >= -1, got {n_gpu_layers!r}")
        n = int(n_gpu_layers)
        if free_bytes is None:
            return BudgetDecision(0, "no_device", f"n_gpu_layers={n}: no device, CPU only")
        if n == 0:
            return BudgetDecision(0, "n_gpu_layers", "n_gpu_layers=0: CPU only")
        if n == -1:
            want = full_device_bytes(sizes, n_ctx, n_batch)
        else:
            want = scratch_bytes(sizes, n_ctx, n_batch) + sum(
                layer_bytes(sizes, i, n_ctx) for i in range(min(n, sizes.n_layer)))
            if n > sizes.n_layer:
                want += output_block_bytes(sizes, n_batch)
        got = min(want, free_bytes)
        capped = f", capped at free device memory {free_bytes} bytes" if got < want else ""
        return BudgetDecision(got, "n_gpu_layers", f"n_gpu_layers={n} converted to vram_budget {got} bytes "
                                                   f"({got / GiB:.3f} GiB){capped}")
    if free_bytes is None:
        return BudgetDecision(0, "no_device", "")
    got = max(0, free_bytes - margin)
    return BudgetDecision(got, "default", f"vram_budget defaults to free device memory {free_bytes} bytes minus "
                                          f"{margin} bytes margin = {got} bytes")


# ---- cached plans --------------------------------------------------------------------


def plan_path(model_path: str | os.PathLike, *, create: bool = False) -> Path:
    """``<artifact dir of the model>/placement.json``."""
    return artifact_dir(model_path, create=create) / PLAN_NAME


def load_plan(path: str | os.PathLike) -> Plan:
    """Read a stored plan. Raises ValueError for a missing or malformed file."""
    p = Path(path)
    try:
        d = json.loads(p.read_bytes().decode("utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{p}: not a readable placement plan ({e})") from e
    if not isinstance(d, dict):
        raise ValueError(f"{p}: not a placement plan")
    plan = Plan.from_json(d)
    plan.path = p
    return plan


def neuron_frequencies(model_path: str | os.PathLike, *, model=None, sparsity_sidecar: Any = "auto",
                       verbose: bool = False) -> tuple[np.ndarray | None, str]:
    """The firing frequencies placement ranks neurons by, and their source name:
    the calibration sidecar's ``neuron_freq`` ("sidecar:<sha256>"); else, with
    ``sparsity_sidecar="auto"``, PowerInfer's ``<model>.generated.gpuidx`` beside the
    model (its GPU neurons 1, the rest 0: "gpuidx:<sha256>"); else None ("uniform").

    Raises:
        ValueError: a sidecar for another model, or a malformed gpuidx file.
    """
    from ..loader.pwri import gpuidx_path, read_gpuidx
    from ..sparsity.sidecar import read_sidecar, sidecar_path

    sc = None
    if sparsity_sidecar == "auto":
        cand = sidecar_path(model_path)
        sc = cand if cand.is_file() else None
    elif sparsity_sidecar is not None:
        sc = Path(sparsity_sidecar)
    if sc is not None:
        prof = read_sidecar(sc, model_path=model_path)
        return prof.neuron_freq, "sidecar:" + model_fingerprint(sc)
    gpuidx = Path(gpuidx_path(model_path))
    if sparsity_sidecar == "auto" and gpuidx.is_file():
        # PowerInfer's own hot/cold split: its hot neurons rank first (frequency 1)
        from ..loader.gguf_model import load_gguf

        g = model if model is not None else load_gguf(model_path, verbose=verbose)
        try:
            idx = read_gpuidx(gpuidx, g.hparams.n_layer, g.hparams.n_ff)
        finally:
            if model is None:
                g.close()
        return np.stack([np.asarray(m, np.float64) for m in idx.gpu_idx]), "gpuidx:" + model_fingerprint(gpuidx)
    return None, "uniform"


def plan_for_model(model_path: str | os.PathLike, vram_budget: int, *, n_ctx: int, n_batch: int,
                   model=None, neuron_freq: np.ndarray | None = None, freq_source: str | None = None,
                   sparsity_sidecar: str | os.PathLike | None = "auto", reset_gpu_index: bool = False,
                   disable_gpu_index: bool = False, out: str | os.PathLike | None = None,
                   verbose: bool = False) -> Plan:
    """The plan for the model file at ``model_path``, cached in its artifact folder.

    The stored plan (``out`` or :func:`plan_path`) is reused when its recorded inputs
    equal this call's: plan format, model SHA-256, budget, n_ctx, n_batch,
    disable_gpu_index, the frequency source (the sidecar's SHA-256, or "uniform")
    and the alignment/group constants. Otherwise it is computed with
    :func:`plan_placement` and written atomically with provenance.

    Args:
        vram_budget: bytes (int >= 0; see :func:`resolve_budget` for user input).
        model: the loaded GGUFModel (loaded here when None).
        neuron_freq: frequencies to use instead of a sidecar's; then ``freq_source``
            names them in the cache key (default: a hash of the array).
        sparsity_sidecar: "auto" (the model's sidecar when present, else PowerInfer's
            ``<model>.generated.gpuidx`` beside it - its GPU neurons rank first -, else
            uniform), a sidecar path, or None (uniform).
        reset_gpu_index: recompute and overwrite even when a stored plan matches,
            and overwrite a plan recorded for another model.
        disable_gpu_index: no FFN neurons on the device.

    Raises:
        ValueError: bad arguments, a sidecar for another model, or a stored plan
            made from another model (without ``reset_gpu_index``).
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    if neuron_freq is not None:
        if freq_source is None:
            freq_source = "array:" + hashlib.sha256(np.ascontiguousarray(neuron_freq, np.float32).tobytes()).hexdigest()
    else:
        neuron_freq, freq_source = neuron_frequencies(model_path, model=model, sparsity_sidecar=sparsity_sidecar,
                                                      verbose=verbose)
    fp = model_fingerprint(model_path)
    inputs = {"format_version": FORMAT_VERSION, "model_sha256": fp, "vram_budget": budget, "n_ctx": int(n_ctx),
              "n_batch": int(n_batch), "disable_gpu_index": bool(disable_gpu_index), "freq_source": freq_source,
              "align": DEVICE_ALIGN, "group": NEURON_GROUP, "kv_elem_bytes": KV_ELEM_BYTES}
    path = Path(out) if out is not None else plan_path(model_path, create=True)
    if path.is_file() and not reset_gpu_index:
        meta = read_metadata(path) or {}
        if meta.get("inputs") == inputs:
            try:
                plan = load_plan(path)
                plan.cached = True
                return plan
            except ValueError:
                pass  # unreadable: recompute
    check_provenance(path, fp, force=reset_gpu_index, model_path=model_path,
                     force_hint="reset_gpu_index=True (--reset-gpu-index)")
    own = model is None
    if own:
        from ..loader.gguf_model import load_gguf

        model = load_gguf(model_path, verbose=verbose)
    try:
        sizes = ModelSizes.from_gguf(model)
    finally:
        if own:
            model.close()
    plan = plan_placement(sizes, neuron_freq, budget, n_ctx=n_ctx, n_batch=n_batch,
                          disable_gpu_index=disable_gpu_index)
    plan.inputs = inputs
    d = plan.to_json()
    d.update(artifact_metadata(model_path, inputs=inputs))
    d["inputs"] = inputs
    atomic_write_json(path, d)
    plan.path = path
    return plan


def _human(n: int) -> str:
    return f"{n / GiB:.3f} GiB" if n >= GiB else f"{n / MiB:.3f} MiB"


def _layer_rows(plan: Plan) -> Sequence[tuple[int, float, float]]:
    return [(L.layer, L.n_hot / plan.n_ff, L.freq_mass) for L in plan.layers]


def write_plot(plan: Plan, path: str | os.PathLike, *, force: bool = False) -> Path:
    """PNG with two panels: hot fraction (and frequency mass) per layer, and device
    bytes by category. Needs matplotlib (``pip install matplotlib``). An existing file
    is replaced only when it is one of these plots (or ``force``).

    Raises:
        ImportError: matplotlib is not installed.
        ValueError: ``path`` holds another file and not ``force``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..loader.artifacts import atomic_write

    rows = _layer_rows(plan)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    xs = [r[0] for r in rows]
    a.bar(xs, [r[1] for r in rows], color="tab:blue", label="hot neurons / n_ff")
    a.plot(xs, [r[2] for r in rows], "o-", color="tab:orange", label="firing-frequency mass on device")
    a.set_xlabel("layer")
    a.set_ylim(0, 1.05)
    a.set_title("FFN neurons on the device")
    a.legend(loc="upper right", fontsize=8)
    a.xaxis.get_major_locator().set_params(integer=True)
    cats = plan.bytes_by_category()
    names = list(cats)
    b.barh(names, [cats[k] / MiB for k in names], color="tab:green")
    b.set_xlabel("MiB")
    b.set_title(f"budget {_human(plan.budget_bytes)}, used {_human(plan.device_bytes)}")
    fig.tight_layout()
    out = Path(path)
    if out.exists() and not force and _PLOT_MARK.encode() not in out.read_bytes()[:4096]:
        plt.close(fig)
        raise ValueError(f"Refusing to overwrite {out}: it is not a plot written by powerinfer-backend plan "
                         f"(pass --force / force=True to replace it)")
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100, metadata={"Software": _PLOT_MARK}))
    plt.close(fig)
    return out


#: PNG text written into our plots, so a later run may replace them and nothing else
_PLOT_MARK = "powerinfer-backend plan"
