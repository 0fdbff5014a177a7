"""Device selection by name: :func:`open_device` (the CUDA library is loaded only when
"cuda" is asked for)."""

from __future__ import annotations

from .base import Device
from .cpu import CpuDevice

__all__ = ["open_device"]


def open_device(kind: str, reserve_bytes: int, n_threads: int = 1, *, device: int = 0) -> Device:
    """A device by name: ``"cpu-device"`` (:class:`CpuDevice`) or ``"cuda"``
    (:class:`powerinfer_backend.hybrid.devices.cuda.CudaDevice` on GPU ``device``; its library is
    loaded only now).

    Raises:
        ValueError: unknown kind (or bad arguments, see the classes).
        RuntimeError: "cuda" without the CUDA library built, a driver or a device (the
            message says which).
    """
    if kind == "cpu-device":
        return CpuDevice(reserve_bytes, n_threads)
    if kind == "cuda":
        from .cuda import CudaDevice

        return CudaDevice(reserve_bytes, n_threads, device)
    raise ValueError(f"unknown device {kind!r} (cpu-device, cuda)")
