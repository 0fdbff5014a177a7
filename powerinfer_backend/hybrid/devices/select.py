"""Device selection by name (issue 14): what ``Llama(device=...)`` means, over the devices
ggml reports (:mod:`powerinfer_backend.engine.ggml`), and the byte rule of an open device
(:class:`DeviceSizer`) that placement plans with.

Names (case-insensitive, except that lower-case ``"cpu"`` means no device while ggml's
own name ``"CPU"`` is its CPU device):

* ``"auto"`` (or None): the first discrete GPU ggml reports; none → CPU only (one message);
  an integrated GPU only when asked for by name;
* ``"cuda"``, ``"metal"``, ``"vulkan"``, ``"hip"``: the first ggml device of that backend
  (a GPU build of llama-cpp-python brings it; docs/building.md);
* any ggml device name (``"CUDA0"``, ``"Vulkan1"``, ``"CPU"``);
* ``"ggml-cpu"``: ggml's CPU backend as the device (``device_threads`` threads) — how CI
  runs the device half without a GPU;
* ``"cpu"``: no device.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

from ..placement.sizes import kv_cells

__all__ = [
    "BACKENDS",
    "CPU_DEVICE_NAME",
    "DeviceChoice",
    "DeviceSizer",
    "resolve_device",
    "open_device",
    "ggml_lib_dir",
    "describe_devices",
    "planning_sizer",
]

#: backend name -> the prefixes of its ggml device names (HIP builds of ggml-cuda say "ROCm")
BACKENDS = {"cuda": ("CUDA",), "metal": ("Metal", "MTL"), "vulkan": ("Vulkan",), "hip": ("ROCm", "HIP")}
#: our name for ggml's CPU backend as the device
CPU_DEVICE_NAME = "ggml-cpu"
#: ggml's name of its CPU device
_GGML_CPU = "CPU"


@dataclass(frozen=True)
class DeviceChoice:
    """What a ``device`` argument resolved to.

    Attributes:
        requested: the argument, lower-cased ("auto" for None).
        ggml_name: the ggml device to open ("CUDA0", "CPU"), None for CPU only.
        type: its ggml type ("cpu", "gpu", "igpu", "accel"), "" for CPU only.
        message: why CPU only (``"auto"`` without a GPU), else "".
    """

    requested: str
    ggml_name: Optional[str]
    type: str = ""
    message: str = ""


def ggml_lib_dir() -> str:
    """The folder ggml is loaded from: llama_cpp's ``lib`` (where a GPU build puts its
    backend libraries; :func:`powerinfer_backend.engine.ggml.lib_dir`)."""
    from ...engine.ggml import lib_dir

    return str(lib_dir())


def describe_devices(devices) -> str:
    """``"CPU (cpu), CUDA0 (gpu)"`` for an error message; ``"none"`` when empty."""
    return ", ".join(f"{d.name} ({d.type})" for d in devices) or "none"


def resolve_device(device: Optional[str]) -> DeviceChoice:
    """The ggml device ``device`` names (see the module docstring).

    Raises:
        ValueError: not a string, or no ggml device of that name or backend (the message
            names it and lists the devices ggml found and the folder it looked in).
        RuntimeError: ggml missing or of an unsupported version, for a named device
            (:func:`powerinfer_backend.engine.ggml.bind`'s message: folder, files, versions).
    """
    if device is None:
        device = "auto"
    if not isinstance(device, str) or not device.strip():
        raise ValueError(
            f"device must be a name ('auto', 'cuda', 'metal', 'vulkan', 'hip', a ggml device name, "
            f"'ggml-cpu', 'cpu'), got {device!r}"
        )
    name = device.strip()
    if name == "cpu":
        return DeviceChoice(name, None)
    req = name.lower()
    from ...engine import ggml

    if req == "auto":
        try:
            ggml.bind()
        except RuntimeError as e:  # auto never fails for want of ggml: CPU only, said once
            return DeviceChoice(req, None, message=f"device='auto': ggml unavailable ({e})")
        devs = ggml.list_devices()
        gpu = next((d for d in devs if d.type == "gpu"), None)
        if gpu is None:
            return DeviceChoice(
                req, None, message=f"device='auto': ggml found no discrete GPU (devices: {describe_devices(devs)})"
            )
        return DeviceChoice(req, gpu.name, gpu.type)
    ggml.bind()
    devs = ggml.list_devices()
    if req == CPU_DEVICE_NAME:
        found = [d for d in devs if d.name == _GGML_CPU]
    elif req in BACKENDS:
        found = [d for d in devs if any(d.name.lower().startswith(p.lower()) for p in BACKENDS[req])]
    else:  # a ggml name: exactly, else ignoring case
        found = [d for d in devs if d.name == name] or [d for d in devs if d.name.lower() == name.lower()]
    if not found:
        what = f"no {req} device" if req in BACKENDS else f"no device named {device!r}"
        hint = (
            " (a GPU backend comes with a GPU build of llama-cpp-python, docs/building.md)" if req in BACKENDS else ""
        )
        raise ValueError(
            f"device={device!r}: ggml reports {what}; devices found: {describe_devices(devs)} "
            f"(backends loaded from {ggml_lib_dir()}){hint}"
        )
    keyword = req == CPU_DEVICE_NAME or req in BACKENDS
    return DeviceChoice(req if keyword else name, found[0].name, found[0].type)


def open_device(choice: DeviceChoice, n_threads: int = 1):
    """Open the ggml device of ``choice`` (:class:`powerinfer_backend.engine.ggml.GgmlDevice`;
    ``n_threads``: the CPU backend's threads, ignored by GPUs).

    Raises:
        ValueError: ``choice`` is CPU only.
    """
    if choice.ggml_name is None:
        raise ValueError(f"device={choice.requested!r} is CPU only: no device to open")
    from ...engine.ggml import GgmlDevice

    return GgmlDevice(choice.ggml_name, n_threads=n_threads)


class DeviceSizer:
    """The byte rule of an open ggml device (a :class:`~powerinfer_backend.hybrid.placement.Sizer`):
    each tensor's bytes from its buffer type (``ggml_backend_buft_get_alloc_size``), its
    alignment, the compute buffer ``ctx`` reserves there
    (``NativeContext.ggml_compute_bytes``, a constant of model, n_ctx, n_batch, n_seq_max and
    device) and the KV cells of ``ctx`` (``n_seq_max`` slots).

    Args:
        dev: a :class:`powerinfer_backend.engine.ggml.GgmlDevice`.
        ctx: the :class:`powerinfer_backend.engine.native.NativeContext` to be placed.
    """

    exact = True

    def __init__(self, dev, ctx) -> None:
        self._dev, self._ctx = dev, ctx
        self.name, self.type = dev.info.name, dev.info.type
        self.alignment = int(dev.alignment)
        self._compute: Optional[int] = None
        self._sizes: dict[tuple[int, int, int], int] = {}

    def tensor_bytes(self, ggml_type: int, ne0: int, ne1: int = 1) -> int:
        key = (int(ggml_type), int(ne0), int(ne1))
        if key not in self._sizes:  # the knapsack asks for the same shapes many times
            self._sizes[key] = int(self._dev.tensor_bytes(*key))
        return self._sizes[key]

    def kv_cells(self, n_ctx: int) -> int:
        """The context's KV cells (:func:`~powerinfer_backend.hybrid.placement.sizes.kv_cells` of its
        n_ctx and n_seq_max).

        Raises:
            ValueError: asked for another n_ctx than the context's.
        """
        if int(n_ctx) != self._ctx.n_ctx:
            raise ValueError(
                f"the device's KV cache is counted for the context's n_ctx {self._ctx.n_ctx}; asked for n_ctx {n_ctx}"
            )
        return kv_cells(self._ctx.n_ctx, self._ctx.n_seq_max)

    def compute_bytes(self, sizes, n_ctx: int, n_batch: int) -> int:
        """The compute buffer bytes (once per sizer).

        Raises:
            ValueError: asked for another n_ctx / n_batch than the context's.
        """
        if (int(n_ctx), int(n_batch)) != (self._ctx.n_ctx, self._ctx.n_batch):
            raise ValueError(
                f"the device's compute buffer is measured for the context's n_ctx {self._ctx.n_ctx}, "
                f"n_batch {self._ctx.n_batch}; asked for n_ctx {n_ctx}, n_batch {n_batch}"
            )
        if self._compute is None:
            self._compute = int(self._ctx.ggml_compute_bytes(self._dev))
        return self._compute


@contextmanager
def planning_sizer(device: Optional[str], gguf, *, n_ctx: int, n_batch: int, predictors=None) -> Iterator:
    """The sizer a plan made ahead of time counts with (``powerinfer-backend plan``): the
    device's own rule and compute buffer (measured on a context of ``n_ctx`` / ``n_batch``
    over ``gguf``, a loaded :class:`powerinfer_backend.loader.GGUFModel`, carrying
    ``predictors``, a :class:`powerinfer_backend.sparsity.predictors.PredictorSet`, as the
    context ``Llama`` places would: its compute buffer then holds the graphs that skip
    unselected hot neurons), or the pure-Python
    :data:`powerinfer_backend.hybrid.placement.CPU_BUFT` when ``device`` resolves to CPU only
    ("cpu", or "auto" without a GPU).

    Raises:
        ValueError, RuntimeError: as :func:`resolve_device`.
    """
    from ...engine.native import NativeContext, NativeModel
    from ..placement import CPU_BUFT

    choice = resolve_device(device)
    if choice.ggml_name is None:
        yield CPU_BUFT
        return
    model = NativeModel(gguf)
    try:
        ctx = NativeContext(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=1)
        for layer in predictors.layers if predictors is not None else ():
            ctx.set_ffn_predictor(layer, predictors.fc1[layer], predictors.fc2[layer], 0.0)
        try:
            with open_device(choice) as dev:
                yield DeviceSizer(dev, ctx)
        finally:
            ctx.close()
    finally:
        model.close()
