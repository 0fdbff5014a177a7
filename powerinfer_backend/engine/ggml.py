"""ggml backend devices (native/src/device/ggml/): binding the ggml that llama-cpp-python
ships (its ``llama_cpp/lib`` folder: ``libggml-base.so.0``, ``libggml.so.0``,
``libggml-cpu.so.0``; a GPU build of llama-cpp-python adds its backend's library there),
the devices ggml reports, and :class:`GgmlDevice`, an open device a
:class:`~powerinfer_backend.engine.NativeContext` places a plan on
(:meth:`~powerinfer_backend.engine.NativeContext.set_ggml_device`)."""

from __future__ import annotations

import dataclasses
import threading
import weakref
from pathlib import Path

from .._native import check, ffi, lib
from .closing import Closing

__all__ = ["GGML_VERSION_RANGE", "GGML_LIBS", "GgmlDeviceInfo", "GgmlDevice", "bind", "lib_dir", "list_devices"]

#: ggml versions this library's prototypes were written against: (">=min", "<max"), as pyproject.toml's
#: ``[tool.powerinfer_backend] ggml``.
GGML_VERSION_RANGE = (">=0.25.0", "<0.26.0")
#: The files bound from llama_cpp's lib folder (the sonames its libllama links).
GGML_LIBS = ("libggml-base.so.0", "libggml.so.0", "libggml-cpu.so.0")
_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
_lock = threading.Lock()
_bound: str | None = None


def lib_dir() -> Path:
    """llama_cpp's lib folder (importing llama_cpp maps its ggml there first).

    Raises:
        RuntimeError: llama-cpp-python is not installed.
    """
    try:
        import llama_cpp
    except ImportError as e:
        raise RuntimeError(f"ggml devices need llama-cpp-python (its llama_cpp/lib holds ggml): {e}") from e
    return Path(llama_cpp.__file__).resolve().parent / "lib"


def _bounds(version_range) -> tuple[str, str]:
    lo, hi = version_range
    if not (lo.startswith(">=") and hi.startswith("<")):
        raise ValueError(f"version range must be ('>=a.b.c', '<x.y.z'), got {version_range!r}")
    return lo[2:].strip(), hi[1:].strip()


def bind(*, version_range: tuple[str, str] = GGML_VERSION_RANGE, folder: str | Path | None = None) -> str:
    """Bind llama_cpp's ggml (once per process; later calls return at once) and load the GPU
    backends of that folder. ``folder`` (default :func:`lib_dir`) and ``version_range`` are for tests.

    Returns:
        ggml's version, e.g. ``"0.25.3"``.

    Raises:
        RuntimeError: a file or symbol is missing (naming the folder and the files looked for),
            or ggml's version is outside ``version_range`` (naming both).
    """
    global _bound
    where = Path(folder) if folder is not None else lib_dir()
    lo, hi = _bounds(version_range)
    with _lock:
        out = ffi.new("char[64]")
        rc = lib.pi_ggml_bind(str(where).encode(), lo.encode(), hi.encode(), out, 64)
        try:
            check(rc, f"binding ggml from {where}")
        except (ValueError, NotImplementedError) as e:
            raise RuntimeError(str(e)) from None
        if _bound is None:  # GPU backends (a CUDA / Vulkan / ... build) live in the same folder
            check(lib.pi_ggml_load_backends(str(where).encode()), "loading ggml backends")
        _bound = ffi.string(out).decode()
        return _bound


@dataclasses.dataclass(frozen=True)
class GgmlDeviceInfo:
    """One device ggml reports: ``index`` in ggml's list, ``name`` (``"CPU"``, ``"CUDA0"``),
    ``description``, ``type`` (``"cpu"``, ``"gpu"``, ``"igpu"``, ``"accel"``), and its memory
    ``free_bytes`` / ``total_bytes`` (system memory for the CPU)."""

    index: int
    name: str
    description: str
    type: str
    free_bytes: int
    total_bytes: int


def _info(c, index: int) -> GgmlDeviceInfo:
    return GgmlDeviceInfo(
        index,
        ffi.string(c.name).decode(),
        ffi.string(c.description).decode(),
        _TYPES.get(int(c.type), str(int(c.type))),
        int(c.free_bytes),
        int(c.total_bytes),
    )


def list_devices() -> list[GgmlDeviceInfo]:
    """The devices ggml found (binding it first; see :func:`bind`), in ggml's order."""
    bind()
    out = []
    for i in range(lib.pi_ggml_dev_count()):
        c = ffi.new("pi_gdev_info *")
        check(lib.pi_ggml_dev_info(i, c), f"ggml device {i}")
        out.append(_info(c, i))
    return out


class GgmlDevice(Closing):
    """An open ggml device by ggml name (``"CPU"``, ``"CUDA0"``, ...); ``n_threads``: the CPU
    backend's threads (ggml's CPU device uses the plain CPU buffer type: no repacked or AMX
    buffers). Contexts placed on it keep it alive; :meth:`close` frees it. Contexts sharing it
    may run on several threads: its steps (graphs) run one at a time (the C device's lock).

    Raises:
        ValueError: no such device (the message lists ggml's devices) or n_threads outside [1, 512].
        RuntimeError: ggml cannot be bound (see :func:`bind`).
    """

    def __init__(self, name: str, n_threads: int = 1):
        bind()
        out = ffi.new("pi_gdev **")
        check(lib.pi_gdev_open(str(name).encode(), int(n_threads), out), f"opening ggml device {name!r}")
        self._ptr = out[0]
        self.name = str(name)
        self.n_threads = int(n_threads)
        # contexts placed here point into the device: it must outlive them
        self._contexts: weakref.WeakSet = weakref.WeakSet()
        self._close_requested = False

    @property
    def ptr(self):
        """The ``pi_gdev *`` (None once closed)."""
        return self._ptr

    def _live(self):
        if getattr(self, "_ptr", None) is None:
            raise ValueError(f"ggml device {self.name!r} is closed")
        return self._ptr

    @property
    def info(self) -> GgmlDeviceInfo:
        """This device's entry (``index`` -1: opened by name), with its current free memory."""
        c = ffi.new("pi_gdev_info *")
        check(lib.pi_gdev_get_info(self._live(), c), "pi_gdev_get_info")
        return _info(c, -1)

    def tensor_bytes(self, ggml_type: int, ne0: int, ne1: int = 1) -> int:
        """Bytes the device's buffer type allocates for one [ne0, ne1] tensor of ``ggml_type``
        (``ggml_backend_buft_get_alloc_size``; not rounded to :attr:`alignment`).

        Raises:
            ValueError: unknown type, or ne0 not a positive multiple of the type's block size.
        """
        n = int(lib.pi_gdev_tensor_bytes(self._live(), int(ggml_type), int(ne0), int(ne1)))
        if n < 0:
            check(lib.PI_ERR_INVALID, f"tensor_bytes({ggml_type}, {ne0}, {ne1})")
        return n

    @property
    def alignment(self) -> int:
        """The alignment of the device's buffer type in bytes (each tensor's offset is a multiple)."""
        return int(lib.pi_gdev_alignment(self._live()))

    def close(self) -> None:
        """Free the device once no open context is placed on it (until then the free is deferred)."""
        self._close_requested = True
        if getattr(self, "_ptr", None) is not None and not any(c.is_open for c in self._contexts):
            lib.pi_gdev_free(self._ptr)
            self._ptr = None
