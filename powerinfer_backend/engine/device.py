"""The native device (``pi_device``): :class:`NativeDevice` owns one, with the FFN
halves uploaded to it (:class:`NativeDeviceFFN`), whose split runs with
``pi_op_ffn_hybrid``. The Python devices (:mod:`powerinfer_backend.hybrid.devices`)
build on these."""

from __future__ import annotations

import numpy as np

from .._native import check, ffi, lib
from .closing import Closing
from .pool import NativePool

__all__ = ["NativeDevice", "NativeDeviceFFN", "ffn_bytes"]

_STAT_KEYS = ("reserved", "used", "high_water", "n_refused", "n_jobs", "rows", "n_attn", "n_output", "n_threads")


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


def _f32(a: np.ndarray | None):
    return ffi.cast("float *", ffi.from_buffer(a)) if a is not None else ffi.NULL


def ffn_bytes(gate_up_type: int, down_t_type: int, n_embd: int, n_hot: int, max_tok: int) -> int:
    """Device bytes :meth:`NativeDevice.upload_ffn` takes for one layer (see
    ``pi_device_ffn_bytes``: rows, map, scratch and x/y buffers, each aligned to 256).

    Raises:
        ValueError: bad types or sizes.
    """
    n = int(lib.pi_device_ffn_bytes(gate_up_type, down_t_type, n_embd, n_hot, max_tok))
    if n < 0:
        raise ValueError(f"no device FFN of types ({gate_up_type}, {down_t_type}), n_embd {n_embd}, n_hot {n_hot}, "
                         f"max_tok {max_tok}")
    return n


class NativeDevice(Closing):
    """A ``pi_device`` of ``kind`` reserving ``reserve_bytes`` now, with ``n_threads``
    device workers; :meth:`close` frees its uploads, then the device.

    Raises:
        ValueError: reserve_bytes < 0, n_threads outside [1, 512], or an unknown kind.
        MemoryError: the reservation cannot be made.
    """

    def __init__(self, kind: str, reserve_bytes: int, n_threads: int):
        out = ffi.new("pi_device **")
        check(lib.pi_device_create(kind.encode(), int(reserve_bytes), int(n_threads), out), "pi_device_create")
        self._ptr = out[0]
        self._ffns: list[NativeDeviceFFN] = []

    @property
    def ptr(self):
        """The ``pi_device *`` (for the engine's calls; None once closed)."""
        return self._ptr

    def stats(self) -> dict[str, int]:
        """``pi_device_get_stats``: reserved, used, high_water (bytes), n_refused,
        n_jobs, rows, n_attn, n_output, n_threads."""
        s = ffi.new("pi_device_stats *")
        check(lib.pi_device_get_stats(self._ptr, s), "pi_device_get_stats")
        return {k: int(getattr(s, k)) for k in _STAT_KEYS}

    def alloc(self, nbytes: int) -> None:
        """Take ``nbytes`` of the reservation. Raises MemoryError past it."""
        p = ffi.new("void **")
        check(lib.pi_device_alloc(self._ptr, int(nbytes), p), "pi_device_alloc")

    def upload_ffn(self, gate_up_type: int, gate: np.ndarray, up: np.ndarray, n_embd: int, n_ff: int,
                   down_t_type: int, down_t: np.ndarray, hot_ids, max_tok: int) -> "NativeDeviceFFN":
        """``pi_device_ffn_upload``: one layer's rows ``hot_ids`` (strictly increasing
        int32) on the device. ``gate``, ``up``, ``down_t``: n_ff rows of n_embd in
        their types, any arrays (their bytes are used, and kept for the CPU half).

        Raises:
            ValueError: bad arguments. MemoryError: the rows exceed the reservation.
        """
        g, u, d = _u8(gate), _u8(up), _u8(down_t)
        ids = np.ascontiguousarray(hot_ids, dtype=np.int32)
        out = ffi.new("pi_device_ffn **")
        check(lib.pi_device_ffn_upload(
            self._ptr, gate_up_type, ffi.from_buffer(g), ffi.from_buffer(u), n_embd, n_ff, down_t_type,
            ffi.from_buffer(d), ffi.cast("const int32_t *", ffi.from_buffer(ids)), ids.shape[0], max_tok, out),
            "pi_device_ffn_upload")
        f = NativeDeviceFFN(out[0], (g, u, d))
        self._ffns.append(f)
        return f

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            for f in self._ffns:
                lib.pi_device_ffn_free(f._ptr)
            self._ffns = []
            lib.pi_device_free(self._ptr)
            self._ptr = None


class NativeDeviceFFN:
    """One uploaded layer (a ``pi_device_ffn``, freed by its :class:`NativeDevice`),
    with the host rows its CPU half reads."""

    def __init__(self, ptr, host: tuple[np.ndarray, np.ndarray, np.ndarray]):
        self._ptr, self._host = ptr, host
        self.n_hot = int(lib.pi_device_ffn_n_hot(ptr))

    def run(self, pool: NativePool, act: int, x: np.ndarray, threshold: float, y: np.ndarray,
            y_device: np.ndarray | None = None) -> None:
        """``pi_op_ffn_hybrid``: ``y`` = the device's sum over the hot rows continued on
        ``pool`` by the cold rows. ``x``, ``y`` (and ``y_device``, which receives the
        device partial): float32 (n_tok, n_embd), C-contiguous; ``act``: enum pi_ffn_act."""
        g, u, d = self._host
        check(lib.pi_op_ffn_hybrid(
            pool.ptr, self._ptr, act, ffi.from_buffer(g), ffi.from_buffer(u), ffi.from_buffer(d),
            ffi.cast("const float *", ffi.from_buffer(x)), x.shape[0], float(threshold), _f32(y), _f32(y_device)),
            "pi_op_ffn_hybrid")
