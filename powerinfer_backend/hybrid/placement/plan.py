"""The placement plan (:class:`Plan`, one :class:`LayerPlan` per layer) and its JSON
form, the ``placement.json`` format (:data:`FORMAT_VERSION`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from .sizes import GiB, MiB

__all__ = ["FORMAT_VERSION", "LayerPlan", "Plan"]

# 2: ggml buffers (weights, kv, compute), compute_bytes; 3: a whole layer's down as stored;
# 4: no down columns where the host sums the layer's down, the KV in the context's type;
# 5: a predictor context's device skips unselected hot neurons (cost model, choice["device_skips"])
FORMAT_VERSION = 5


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
    """A placement (see :mod:`powerinfer_backend.hybrid.placement`).

    Attributes:
        budget_bytes: the budget it was made for.
        n_ctx, n_batch, n_ff: what it was made for.
        compute_bytes: the compute buffer on the device (0 when nothing is placed).
        output_on_device: the output block is on the device.
        output_bytes: its device bytes (0 when on the CPU).
        layers: one :class:`LayerPlan` per layer.
        inputs: what the plan was computed from (cache key, see :func:`plan_for_model`).
        path: where it was read from or written to, if anywhere.
        cached: True when :func:`plan_for_model` reused a stored plan.
        choice: with ``placement="auto"``, which policy won and the predictions it was
            chosen by (:func:`~.auto.plan_auto`); {} otherwise.
    """

    budget_bytes: int
    n_ctx: int
    n_batch: int
    n_ff: int
    compute_bytes: int
    output_on_device: bool
    output_bytes: int
    layers: list[LayerPlan]
    inputs: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    cached: bool = False
    choice: dict[str, Any] = field(default_factory=dict)

    @property
    def device_bytes(self) -> int:
        """Every byte the device holds under this plan (<= budget_bytes)."""
        return self.compute_bytes + self.output_bytes + sum(L.device_bytes for L in self.layers)

    @property
    def kv_location(self) -> str:
        """ "device" (every layer's KV cache), "cpu" (none) or "split"."""
        on = sum(L.attn_on_device for L in self.layers)
        return "device" if on == len(self.layers) else ("cpu" if on == 0 else "split")

    @property
    def splits_ffn(self) -> bool:
        """Some layer has FFN neurons on both sides (0 < n_hot < n_ff): a split layer, the
        only kind whose device half can skip hot neurons."""
        return any(0 < L.n_hot < self.n_ff for L in self.layers)

    @property
    def hot_fraction(self) -> float:
        """Hot neurons / all neurons, over all layers."""
        return sum(L.n_hot for L in self.layers) / max(1, self.n_ff * len(self.layers))

    def buffer_bytes(self) -> dict[str, int]:
        """Bytes per ggml buffer the device allocates for this plan: ``weights``
        (attention tensors, hot neurons, output block), ``kv`` (KV caches) and
        ``compute`` (docs/placement.md, "Byte accounting")."""
        kv = sum(L.kv_bytes for L in self.layers)
        return {"weights": self.device_bytes - kv - self.compute_bytes, "kv": kv, "compute": self.compute_bytes}

    def bytes_by_category(self) -> dict[str, int]:
        """Device bytes per category: compute, attention (weights), kv_cache, output,
        ffn_hot; and free (budget - device_bytes)."""
        kv = sum(L.kv_bytes for L in self.layers)
        return {
            "compute": self.compute_bytes,
            "attention": sum(L.attn_bytes for L in self.layers) - kv,
            "kv_cache": kv,
            "output": self.output_bytes,
            "ffn_hot": sum(L.hot_bytes for L in self.layers),
            "free": self.budget_bytes - self.device_bytes,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "budget_bytes": self.budget_bytes,
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ff": self.n_ff,
            "compute_bytes": self.compute_bytes,
            "output_on_device": self.output_on_device,
            "output_bytes": self.output_bytes,
            "device_bytes": self.device_bytes,
            "inputs": self.inputs,
            "choice": self.choice,
            "layers": [
                {
                    "layer": L.layer,
                    "attn_on_device": L.attn_on_device,
                    "attn_bytes": L.attn_bytes,
                    "kv_bytes": L.kv_bytes,
                    "hot_bytes": L.hot_bytes,
                    "freq_mass": L.freq_mass,
                    "hot_ids": L.hot_ids.tolist(),
                }
                for L in self.layers
            ],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Plan":
        """Inverse of :meth:`to_json`. Raises ValueError for another format version
        or a malformed plan (missing keys, inconsistent byte total)."""
        if d.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"placement plan format version {d.get('format_version')!r}, this code reads {FORMAT_VERSION}"
            )
        try:
            layers = [
                LayerPlan(
                    int(L["layer"]),
                    bool(L["attn_on_device"]),
                    int(L["attn_bytes"]),
                    int(L["kv_bytes"]),
                    np.asarray(L["hot_ids"], dtype=np.int32),
                    int(L["hot_bytes"]),
                    float(L["freq_mass"]),
                )
                for L in d["layers"]
            ]
            plan = cls(
                int(d["budget_bytes"]),
                int(d["n_ctx"]),
                int(d["n_batch"]),
                int(d["n_ff"]),
                int(d["compute_bytes"]),
                bool(d["output_on_device"]),
                int(d["output_bytes"]),
                layers,
                dict(d.get("inputs", {})),
                choice=dict(d.get("choice", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed placement plan ({type(e).__name__}: {e})") from e
        if plan.device_bytes != d.get("device_bytes") or plan.device_bytes > plan.budget_bytes:
            raise ValueError(
                f"malformed placement plan: device_bytes {d.get('device_bytes')} recorded, "
                f"{plan.device_bytes} summed, budget {plan.budget_bytes}"
            )
        return plan

    def format_table(self) -> str:
        """Human-readable per-layer table and byte totals."""

        def mib(b):
            return f"{b / MiB:9.2f}"

        lines = [
            f"vram budget {self.budget_bytes} B ({self.budget_bytes / GiB:.3f} GiB), plan uses "
            f"{self.device_bytes} B ({self.device_bytes / GiB:.3f} GiB); n_ctx {self.n_ctx}, "
            f"n_batch {self.n_batch}; KV cache: {self.kv_location}; output: "
            f"{'device' if self.output_on_device else 'cpu'}",
            "layer  attn+kv     hot/n_ff    hot%  freq%   attn MiB    kv MiB   hot MiB",
        ]
        for L in self.layers:
            lines.append(
                f"{L.layer:5d}  {'device' if L.attn_on_device else 'cpu':7s} {L.n_hot:6d}/{self.n_ff:<6d}"
                f" {100 * L.n_hot / self.n_ff:6.1f} {100 * L.freq_mass:6.1f} "
                f"{mib(L.attn_bytes - L.kv_bytes)} {mib(L.kv_bytes)} {mib(L.hot_bytes)}"
            )
        lines.append("bytes by category: " + ", ".join(f"{k} {v}" for k, v in self.bytes_by_category().items()))
        return "\n".join(lines)
