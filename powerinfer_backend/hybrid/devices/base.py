"""What every device shares: closing (:class:`Closing`) and the interface the hybrid
executor uses (:class:`Device`, :class:`DeviceFFNHalf`), which the cpu-device
(:mod:`.cpu`) and the CUDA device (:mod:`.cuda`) both provide."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...engine.closing import Closing

__all__ = ["Closing", "Device", "DeviceFFNHalf"]


class DeviceFFNHalf(Protocol):
    """One layer split between a device (hot rows) and the CPU (the rest)."""

    n_hot: int

    def run(self, x: np.ndarray, threshold: float = 0.0, *, return_device_part: bool = False):
        """y = device partial + CPU partial, float32 (n_tok, n_embd)."""


class Device(Protocol):
    """A device reserving its bytes up front, holding FFN halves (``with`` closes it)."""

    def stats(self) -> dict:
        """Byte counters (reserved, used, high_water) and work counters."""

    def alloc(self, nbytes: int) -> None:
        """Take ``nbytes`` of the reservation. Raises MemoryError past it."""

    def upload_ffn(self, act: str, gate_up_type: int, gate, up: np.ndarray, down_t_type: int, down_t: np.ndarray,
                   n_embd: int, n_ff: int, hot_ids, max_tok: int = 1) -> DeviceFFNHalf:
        """Put one layer's hot rows on the device."""

    def close(self) -> None:
        """Free everything the device holds (idempotent)."""
