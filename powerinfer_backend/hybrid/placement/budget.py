"""User input to a budget: ``vram_budget`` parsed to bytes (:func:`parse_vram_budget`)
and the budget decided from ``vram_budget`` / ``n_gpu_layers`` / free device memory
(:func:`resolve_budget`, giving a :class:`BudgetDecision`)."""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .sizes import (
    CPU_BUFT,
    GiB,
    KiB,
    MiB,
    TiB,
    ModelSizes,
    Sizer,
    compute_bytes,
    full_device_bytes,
    layer_bytes,
    output_block_bytes,
)

__all__ = ["DEFAULT_FREE_MARGIN", "parse_vram_budget", "BudgetDecision", "resolve_budget"]

#: When no budget and no n_gpu_layers is given: free device memory minus this.
DEFAULT_FREE_MARGIN = 512 * MiB

_UNITS = {
    "": GiB,
    "b": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": TiB,
    "k": KiB,
    "m": MiB,
    "g": GiB,
    "t": TiB,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}
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
            raise ValueError(
                f"vram_budget {value!r} is not a size: use GiB as a number or a string like '8GiB', '512MiB', '1.5GB'"
            )
        x = float(m.group(1))
        if not math.isfinite(x):
            raise ValueError(f"vram_budget must be finite, got {value!r}")
        return int(x * _UNITS[unit]) if unit else int(x * GiB)
    raise ValueError(
        f"vram_budget must be GiB as a number or a string like '8GiB', got {type(value).__name__} {value!r}"
    )


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


def resolve_budget(
    vram_budget: Any,
    n_gpu_layers: int | None,
    sizes: ModelSizes,
    *,
    free_bytes: int | None,
    n_ctx: int,
    n_batch: int,
    margin: int = DEFAULT_FREE_MARGIN,
    sizer: Sizer = CPU_BUFT,
) -> BudgetDecision:
    """Decide the budget from the user's ``vram_budget`` and ``n_gpu_layers``.

    Rules, in order (issue 6):

    1. an explicit ``vram_budget`` (anything :func:`parse_vram_budget` accepts) wins;
       a given ``n_gpu_layers`` is then ignored with one ``UserWarning``. Above
       ``free_bytes`` -> ValueError with both byte counts.
    2. else an explicit ``n_gpu_layers``: 0 -> CPU only; N > 0 -> the bytes of
       min(N, n_layer) whole layers (:func:`layer_bytes`) plus the compute buffer, plus the
       output block when N > n_layer (llama.cpp counts the output as one more layer);
       -1 -> everything (:func:`full_device_bytes`). Both are capped at
       ``free_bytes`` (never an error). The message says what it became.
    3. else: ``free_bytes - margin`` (at least 0), or 0 without a device.

    Args:
        free_bytes: free device memory (``ggml_backend_dev_memory``), or None when
            there is no device (then rules 2 and 3 give 0; rule 1 is not checked).
        sizer: the device's byte rule, for converting ``n_gpu_layers``.

    Raises:
        ValueError: a bad ``vram_budget``, ``n_gpu_layers`` < -1 or not an int, or a
            ``vram_budget`` above ``free_bytes``.
    """
    b = parse_vram_budget(vram_budget)
    if b is not None:
        if n_gpu_layers is not None:
            warnings.warn(
                f"n_gpu_layers={n_gpu_layers} ignored: vram_budget={vram_budget!r} decides placement",
                UserWarning,
                stacklevel=2,
            )
        if free_bytes is not None and b > free_bytes:
            raise ValueError(
                f"vram_budget {vram_budget!r} = {b} bytes exceeds the device's free memory {free_bytes} bytes"
            )
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
            want = full_device_bytes(sizes, n_ctx, n_batch, sizer)
        else:
            want = compute_bytes(sizes, n_ctx, n_batch, sizer) + sum(
                layer_bytes(sizes, i, n_ctx, sizer) for i in range(min(n, sizes.n_layer))
            )
            if n > sizes.n_layer:
                want += output_block_bytes(sizes, n_batch, sizer)
        got = min(want, free_bytes)
        capped = f", capped at free device memory {free_bytes} bytes" if got < want else ""
        return BudgetDecision(
            got, "n_gpu_layers", f"n_gpu_layers={n} converted to vram_budget {got} bytes ({got / GiB:.3f} GiB){capped}"
        )
    if free_bytes is None:
        return BudgetDecision(0, "no_device", "")
    got = max(0, free_bytes - margin)
    return BudgetDecision(
        got,
        "default",
        f"vram_budget defaults to free device memory {free_bytes} bytes minus {margin} bytes margin = {got} bytes",
    )
