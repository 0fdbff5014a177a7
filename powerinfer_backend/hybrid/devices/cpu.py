"""The ``"cpu-device"`` (issue 6): a test device over the native ``pi_device``.

``CpuDevice`` is a memory pool that reserves exactly the bytes it is given up front and
refuses more, with its own thread and workers, running the device half of a placement
plan (hot FFN rows) while the calling thread computes the cold neurons
(docs/placement.md). It exists so that the split, the concurrency, the byte accounting
and the merge are tested without a GPU. The CUDA device (:mod:`.cuda`, same interface)
lives in its own shared object, built with ``POWERINFER_CUDA=1`` and loaded only when
asked for (:func:`powerinfer_backend.hybrid.devices.open_device`).

A whole model runs under a plan with :func:`powerinfer_backend.hybrid.devices.place_model`;
one layer's split alone with :meth:`CpuDevice.upload_ffn` / :meth:`DeviceFFN.run`.
"""

from __future__ import annotations

import numpy as np

from ...engine.device import NativeDevice, NativeDeviceFFN, ffn_bytes
from ...engine.pool import NativePool
from .base import Closing

__all__ = ["CpuDevice", "DeviceFFN", "FFN_FORMS", "ffn_bytes"]

#: enum pi_ffn_act: name -> value
FFN_FORMS = {"swiglu": 0, "geglu": 1, "relu": 2, "drelu": 3}


class CpuDevice(Closing):
    """The ``"cpu-device"``: ``reserve_bytes`` reserved now, ``n_threads`` device workers.

    Raises:
        ValueError: reserve_bytes < 0 or n_threads outside [1, 512].
        MemoryError: the reservation cannot be made.
    """

    def __init__(self, reserve_bytes: int, n_threads: int = 1, kind: str = "cpu-device"):
        self._dev = NativeDevice(kind, reserve_bytes, n_threads)
        try:
            self._cpu_pool = NativePool(n_threads)  # the calling thread's half
        except BaseException:
            self._dev.close()
            raise

    @property
    def _ptr(self):
        # the pi_device NativeContext.set_device places a model on (None once closed)
        return self._dev.ptr if getattr(self, "_dev", None) is not None else None

    def stats(self) -> dict[str, int]:
        """Byte counters (reserved, used, high_water) and work counters (n_refused;
        n_jobs: jobs run; rows: hot FFN rows processed, summed over tokens; n_attn,
        n_output: attention and output blocks run for a placed model)."""
        return self._dev.stats()

    def alloc(self, nbytes: int) -> None:
        """Allocate ``nbytes`` of device memory (for tests of the reservation).

        Raises:
            MemoryError: past the reservation.
        """
        self._dev.alloc(nbytes)

    def upload_ffn(self, act: str, gate_up_type: int, gate: np.ndarray, up: np.ndarray, down_t_type: int,
                   down_t: np.ndarray, n_embd: int, n_ff: int, hot_ids, max_tok: int = 1) -> "DeviceFFN":
        """Put one layer's hot rows on the device.

        Args:
            act: "swiglu" | "geglu" | "relu" | "drelu".
            gate, up: n_ff rows of n_embd in ``gate_up_type`` (any array; its bytes are used).
            down_t: n_ff rows of n_embd in ``down_t_type`` (F32, F16, Q8_0, Q4_0).
            hot_ids: strictly increasing neuron ids (int32) the device computes.
            max_tok: most tokens per :meth:`DeviceFFN.run`.

        Raises:
            ValueError: bad arguments. MemoryError: the rows exceed the reservation.
        """
        f = self._dev.upload_ffn(gate_up_type, gate, up, n_embd, n_ff, down_t_type, down_t, hot_ids, max_tok)
        return DeviceFFN(self, f, FFN_FORMS[act], n_embd, max_tok)

    def close(self) -> None:
        if getattr(self, "_dev", None) is not None:
            self._dev.close()
            self._cpu_pool.close()
            self._dev = None


class DeviceFFN:
    """One layer split between the device (hot rows) and the CPU (the rest)."""

    def __init__(self, dev: CpuDevice, ffn: NativeDeviceFFN, act: int, n_embd: int, max_tok: int):
        self._dev, self._ffn, self._act = dev, ffn, act
        self.n_embd, self.max_tok = n_embd, max_tok
        self.n_hot = ffn.n_hot

    def run(self, x: np.ndarray, threshold: float = 0.0, *, return_device_part: bool = False):
        """y = the device's sum over the hot rows, continued on the CPU by the cold rows
        (``pi_op_ffn_hybrid``), float32 (n_tok, n_embd).

        Args:
            x: float32 (n_tok, n_embd), n_tok <= max_tok.
            threshold: |h| below it is skipped (pi_op_ffn_sparse semantics).
            return_device_part: also return the device partial.
        """
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, self.n_embd)
        y = np.empty_like(x)
        yd = np.empty_like(x) if return_device_part else None
        self._ffn.run(self._dev._cpu_pool, self._act, x, threshold, y, yd)
        return (y, yd) if return_device_part else y
