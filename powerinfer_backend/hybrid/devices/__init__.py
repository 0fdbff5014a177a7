"""The devices a plan is placed on: the common base (``base``: closing, the device
interface), the ``cpu-device`` test device (``cpu``), the optional CUDA device
(``cuda``, imported only when asked for), choosing one by name (``select``) and putting
a plan on one (``place``). The names of ``cpu``, ``select`` and ``place`` are
re-exported here (the old ``powerinfer_backend.device`` module)."""

from .base import Closing, Device, DeviceFFNHalf  # noqa: F401
from .cpu import FFN_FORMS, CpuDevice, DeviceFFN, ffn_bytes  # noqa: F401
from .place import _ACT_FORM, place_model, plan_ffn_bytes, split_arithmetic, upload_plan  # noqa: F401
from .select import open_device  # noqa: F401

__all__ = ["CpuDevice", "DeviceFFN", "FFN_FORMS", "ffn_bytes", "open_device", "upload_plan", "plan_ffn_bytes",
           "place_model", "split_arithmetic", "Closing", "Device", "DeviceFFNHalf"]
