"""The devices a plan is placed on: ggml backend devices (issue 14), chosen by name
(``select``: :func:`resolve_device`, :func:`open_device`) and measured through their
buffer type (:class:`DeviceSizer`). The device half itself runs in C
(native/src/device/ggml/), reached through :mod:`powerinfer_backend.engine.ggml`."""

from .select import (
    BACKENDS,
    CPU_DEVICE_NAME,
    DeviceChoice,
    DeviceSizer,
    describe_devices,
    ggml_lib_dir,
    open_device,
    planning_sizer,
    resolve_device,
)

__all__ = [
    "BACKENDS",
    "CPU_DEVICE_NAME",
    "DeviceChoice",
    "DeviceSizer",
    "describe_devices",
    "ggml_lib_dir",
    "open_device",
    "planning_sizer",
    "resolve_device",
]
