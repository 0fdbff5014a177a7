"""The CUDA device of the hybrid executor (issue 6): the same interface as
:class:`powerinfer_backend.hybrid.devices.cpu.CpuDevice`, backed by ``libpi_cuda.so`` (native/cuda/).

The shared object is built only on request (``POWERINFER_CUDA=1 python3 setup.py
build_ext --inplace`` or ``POWERINFER_CUDA=1 pip install .``) and loaded (cffi ABI mode,
``dlopen``) only when a :class:`CudaDevice` is created, so importing the package and
every CPU path work without CUDA. What is missing is said by a ``RuntimeError``: the
library not built, no driver (``libcuda.so.1``), or no usable device.

Per layer: :meth:`CudaDevice.upload_ffn` puts the hot rows in the device's pool;
:meth:`CudaFFN.run` starts them on the GPU's stream, computes the cold neurons on the
CPU meanwhile (``pi_op_ffn_sparse`` over the cold ids), waits, and returns
``y = y_device + y_cpu``. Status: per-layer only; whole-model execution on the device is
not wired (docs/placement.md).
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from ...engine.kernels import ffn_sparse
from ...engine.pool import NativePool
from .base import Closing

__all__ = ["CudaDevice", "CudaFFN", "cuda_ffn_bytes", "library_path", "load", "CDEF"]

#: The cffi declarations of native/cuda/pi_cuda.h (its text without comments and
#: preprocessor lines; tests/hybrid/devices/test_cuda_build.py checks that the two agree). Kept here
#: because an installed package has no native/ folder.
CDEF = """
typedef struct pi_cuda_device pi_cuda_device;
typedef struct pi_cuda_ffn pi_cuda_ffn;
typedef struct pi_cuda_stats {
    int64_t reserved;
    int64_t used;
    int64_t high_water;
    int64_t n_refused;
    int64_t n_jobs;
    int64_t rows;
    int64_t total_bytes;
    int64_t context_bytes;
    int64_t workspace_bytes;
    int64_t free_bytes;
    int32_t device;
    int32_t cc_major, cc_minor;
    int32_t runtime_version, driver_version;
    char name[96];
} pi_cuda_stats;
int pi_cuda_device_count(int32_t *out);
int pi_cuda_create(int32_t device, int64_t reserve_bytes, pi_cuda_device **out);
void pi_cuda_free(pi_cuda_device *dev);
int pi_cuda_alloc(pi_cuda_device *dev, int64_t nbytes, void **out);
int pi_cuda_get_stats(const pi_cuda_device *dev, pi_cuda_stats *out);
enum { PI_CUDA_FFN_RELU_UNGATED = 4 };
enum { PI_CUDA_DOWN_SPLIT = 8, PI_CUDA_DOWN_SPLIT_MAX_TOK = 8 };
int64_t pi_cuda_ffn_bytes(int32_t gate_up_type, int32_t down_t_type, int64_t n_embd, int64_t n_hot,
                          int64_t max_tok, int32_t has_gate);
int pi_cuda_ffn_upload(pi_cuda_device *dev, int32_t gate_up_type, const void *gate, const void *up,
                       int64_t n_embd, int64_t n_ff, int32_t down_t_type, const void *down_t,
                       const int32_t *hot_ids, int64_t n_hot, int64_t max_tok, pi_cuda_ffn **out);
void pi_cuda_ffn_free(pi_cuda_ffn *f);
int64_t pi_cuda_ffn_n_hot(const pi_cuda_ffn *f);
int pi_cuda_ffn_run_async(pi_cuda_ffn *f, int32_t act, const float *x, int64_t n_tok, float threshold);
int pi_cuda_ffn_wait(pi_cuda_ffn *f, float *y_device, int64_t *n_used);
const char *pi_cuda_last_error(void);
"""

LIB_NAME = "libpi_cuda.so"
#: powerinfer_backend/_native/: setup.py builds the library there, next to the extension
_NATIVE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "_native")
#: FFN forms: device.FFN_FORMS plus the ungated ReLU (h = relu(up.x), no gate matrix)
CUDA_FFN_FORMS = {"swiglu": 0, "geglu": 1, "relu": 2, "drelu": 3, "relu_ungated": 4}
_STAT_KEYS = ("reserved", "used", "high_water", "n_refused", "n_jobs", "rows", "total_bytes", "context_bytes",
              "workspace_bytes", "free_bytes", "device", "cc_major", "cc_minor", "runtime_version", "driver_version")

_lock = threading.Lock()
_loaded = None  # (ffi, lib) once loaded


def library_path() -> str:
    """Where ``libpi_cuda.so`` is looked for: ``POWERINFER_CUDA_LIB``, else next to the
    package's extension (``powerinfer_backend/_native/``, where setup.py builds it)."""
    return os.environ.get("POWERINFER_CUDA_LIB") or os.path.join(_NATIVE_DIR, LIB_NAME)


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def load():
    """``(ffi, lib)`` of ``libpi_cuda.so``, loaded once.

    Raises:
        RuntimeError: the library is not built (rebuild with ``POWERINFER_CUDA=1``), the
            CUDA driver ``libcuda.so.1`` is not found, the library does not load, or the
            runtime reports no usable device (its message included).
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        if not os.path.isfile(path):
            raise RuntimeError(
                f"the CUDA device is not built: {path} does not exist. Rebuild with CUDA on a machine with nvcc: "
                f"POWERINFER_CUDA=1 python3 setup.py build_ext --inplace (or POWERINFER_CUDA=1 pip install .), "
                f"or point POWERINFER_CUDA_LIB at a built libpi_cuda.so")
        if not _driver_present():
            raise RuntimeError("no CUDA driver: libcuda.so.1 not found (install the NVIDIA driver, or use the CPU: "
                               "device='cpu' / CpuDevice)")
        from cffi import FFI

        ffi = FFI()
        ffi.cdef(CDEF)
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            raise RuntimeError(f"cannot load the CUDA device library {path}: {e}") from e
        n = ffi.new("int32_t *")
        if lib.pi_cuda_device_count(n) != 0:
            raise RuntimeError(f"no usable CUDA device: {ffi.string(lib.pi_cuda_last_error()).decode()}")
        if n[0] < 1:
            raise RuntimeError("no usable CUDA device: the driver reports 0 devices")
        _loaded = (ffi, lib)
        return _loaded


def _check(ffi, lib, rc: int, what: str) -> None:
    """Status codes as :func:`powerinfer_backend._native.check`: 1 ValueError, 2
    MemoryError, 3 NotImplementedError (CUDA failures: the call and the runtime's text)."""
    if rc == 0:
        return
    msg = f"{what}: {ffi.string(lib.pi_cuda_last_error()).decode('utf-8', 'replace')}"
    if rc == 2:
        raise MemoryError(msg)
    if rc == 3:
        raise NotImplementedError(msg)
    raise ValueError(msg)


def cuda_ffn_bytes(gate_up_type: int, down_t_type: int, n_embd: int, n_hot: int, max_tok: int = 1,
                   has_gate: bool = True) -> int:
    """Device bytes :meth:`CudaDevice.upload_ffn` takes for one layer (``pi_cuda_ffn_bytes``:
    rows, map, x/y, converted x, h/kept lists, down pieces; each aligned to 256).

    Raises:
        RuntimeError: the library cannot be loaded (see :func:`load`).
        ValueError: bad types or sizes.
    """
    ffi, lib = load()
    n = int(lib.pi_cuda_ffn_bytes(gate_up_type, down_t_type, n_embd, n_hot, max_tok, int(bool(has_gate))))
    if n < 0:
        raise ValueError(f"no CUDA FFN of types ({gate_up_type}, {down_t_type}), n_embd {n_embd}, n_hot {n_hot}, "
                         f"max_tok {max_tok}")
    return n


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


class CudaDevice(Closing):
    """The ``"cuda"`` device: ``reserve_bytes`` cudaMalloc'ed now on GPU ``device``;
    ``n_threads`` CPU threads compute the cold neurons of :meth:`CudaFFN.run`.

    Raises:
        RuntimeError: CUDA unavailable (see :func:`load`).
        ValueError: reserve_bytes < 0, n_threads outside [1, 512], bad device ordinal.
        MemoryError: the reservation cannot be made.
    """

    def __init__(self, reserve_bytes: int, n_threads: int = 1, device: int = 0):
        self._ffi, self._lib = load()
        out = self._ffi.new("pi_cuda_device **")
        _check(self._ffi, self._lib, self._lib.pi_cuda_create(int(device), int(reserve_bytes), out), "pi_cuda_create")
        self._ptr = out[0]
        self._ffns: list[CudaFFN] = []
        self.n_threads = int(n_threads)
        try:
            self._cpu_pool = NativePool(self.n_threads)
        except BaseException:
            self._lib.pi_cuda_free(self._ptr)
            self._ptr = None
            raise

    @classmethod
    def probe(cls, device: int = 0) -> dict:
        """Memory of ``device`` measured at start-up, reserving nothing: ``total_bytes``,
        ``context_bytes`` (total - free after the context: the context and other
        processes' use), ``workspace_bytes`` (our streams and kernels), ``free_bytes``
        (what placement may plan with), and the device's name and versions."""
        with cls(0, 1, device) as d:
            return d.stats()

    def stats(self) -> dict:
        """Byte counters (``reserved``, ``used``, ``high_water``, in bytes), work counters
        (``n_refused``, ``n_jobs``, ``rows``: hot rows x tokens), ``n_threads``, the
        start-up memory measurement (see :meth:`probe`) and ``name``."""
        s = self._ffi.new("pi_cuda_stats *")
        _check(self._ffi, self._lib, self._lib.pi_cuda_get_stats(self._ptr, s), "pi_cuda_get_stats")
        d = {k: int(getattr(s, k)) for k in _STAT_KEYS}
        d["n_threads"] = self.n_threads
        d["name"] = self._ffi.string(s.name).decode("utf-8", "replace")
        return d

    def alloc(self, nbytes: int) -> None:
        """Take ``nbytes`` of the reservation (for tests of the pool).

        Raises:
            MemoryError: past the reservation.
        """
        p = self._ffi.new("void **")
        _check(self._ffi, self._lib, self._lib.pi_cuda_alloc(self._ptr, int(nbytes), p), "pi_cuda_alloc")

    def upload_ffn(self, act: str, gate_up_type: int, gate, up: np.ndarray, down_t_type: int, down_t: np.ndarray,
                   n_embd: int, n_ff: int, hot_ids, max_tok: int = 1) -> "CudaFFN":
        """Put one layer's hot rows on the GPU (synchronous copy).

        Args:
            act: "swiglu" | "geglu" | "relu" | "drelu" | "relu_ungated" (gate None).
            gate, up: n_ff rows of n_embd in ``gate_up_type`` (F32, F16, Q4_0, Q4_1, Q8_0;
                any array, its bytes are used).
            down_t: n_ff rows of n_embd in ``down_t_type`` (F32, F16, Q8_0, Q4_0).
            hot_ids: strictly increasing neuron ids (int32) the GPU computes.
            max_tok: most tokens per :meth:`CudaFFN.run` (<= 65535).

        Raises:
            ValueError: bad arguments. MemoryError: the rows exceed the reservation.
        """
        if act not in CUDA_FFN_FORMS:
            raise ValueError(f"unknown FFN form {act!r} ({', '.join(CUDA_FFN_FORMS)})")
        if (act == "relu_ungated") != (gate is None):
            raise ValueError("gate must be None exactly for act='relu_ungated'")
        ffi = self._ffi
        g = _u8(gate) if gate is not None else None
        u, d = _u8(up), _u8(down_t)
        ids = np.ascontiguousarray(hot_ids, dtype=np.int32).reshape(-1)
        out = ffi.new("pi_cuda_ffn **")
        _check(ffi, self._lib, self._lib.pi_cuda_ffn_upload(
            self._ptr, gate_up_type, ffi.from_buffer(g) if g is not None else ffi.NULL, ffi.from_buffer(u), n_embd,
            n_ff, down_t_type, ffi.from_buffer(d), ffi.cast("const int32_t *", ffi.from_buffer(ids)), ids.shape[0],
            max_tok, out), "pi_cuda_ffn_upload")
        f = CudaFFN(self, out[0], act, gate_up_type, down_t_type, (g, u, d), ids, n_embd, n_ff, max_tok)
        self._ffns.append(f)
        return f

    def close(self) -> None:
        """Free the uploads, the reservation and the CPU pool (idempotent)."""
        if getattr(self, "_ptr", None) is not None:
            for f in self._ffns:
                self._lib.pi_cuda_ffn_free(f._ptr)
            self._ffns = []
            self._lib.pi_cuda_free(self._ptr)
            self._cpu_pool.close()
            self._ptr = None



class CudaFFN:
    """One layer split between the GPU (hot rows) and the CPU (the rest)."""

    def __init__(self, dev: CudaDevice, ptr, act: str, gate_up_type: int, down_t_type: int, host: tuple,
                 hot_ids: np.ndarray, n_embd: int, n_ff: int, max_tok: int):
        self._dev, self._ptr, self.act, self._host = dev, ptr, act, host
        self._act = CUDA_FFN_FORMS[act]
        self.gate_up_type, self.down_t_type = gate_up_type, down_t_type
        self.n_embd, self.n_ff, self.max_tok = n_embd, n_ff, max_tok
        self.n_hot = int(dev._lib.pi_cuda_ffn_n_hot(ptr))
        self.hot_ids = np.ascontiguousarray(hot_ids, dtype=np.int32)
        mask = np.ones(n_ff, dtype=bool)
        mask[hot_ids] = False
        self.cold_ids = np.flatnonzero(mask).astype(np.int32)
        #: kept hot rows per token of the last run (device side), int64 (n_tok,)
        self.last_n_used = np.zeros(0, dtype=np.int64)
        self._cold_lists: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n_tok -> (ids, offsets) for the CPU half

    def offload_pointers(self) -> tuple[int, int, int]:
        """Addresses (upload, ``pi_cuda_ffn_run_async``, ``pi_cuda_ffn_wait``) for the
        engine's ``pi_context_set_ffn_offload``: the whole-model forward pass then runs
        this layer's hot rows on the GPU (:meth:`NativeContext.set_ffn_offload`)."""
        ffi, lib = self._dev._ffi, self._dev._lib
        return tuple(int(ffi.cast("uintptr_t", p)) for p in (self._ptr, lib.pi_cuda_ffn_run_async,
                                                              lib.pi_cuda_ffn_wait))

    def run(self, x: np.ndarray, threshold: float = 0.0, *, return_device_part: bool = False):
        """y = GPU partial (hot rows) + CPU partial (cold neurons), float32 (n_tok, n_embd).

        Args:
            x: float32 (n_tok, n_embd), n_tok <= max_tok.
            threshold: |h| below it is skipped (``pi_op_ffn_sparse`` semantics), >= 0.
            return_device_part: also return the GPU partial.

        Raises:
            ValueError: bad shapes or threshold. NotImplementedError: "relu_ungated" with
                cold neurons (the CPU library has no ungated form), or a CUDA failure.
        """
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, self.n_embd)
        n_tok = x.shape[0]
        n_cold = self.cold_ids.shape[0]
        if self._act == 4 and n_cold > 0:
            raise NotImplementedError("relu_ungated runs only with every neuron on the device (the CPU library "
                                      "has no ungated FFN form)")
        dev, ffi, lib = self._dev, self._dev._ffi, self._dev._lib
        yd = np.empty_like(x)
        n_used = np.empty(n_tok, dtype=np.int64)
        _check(ffi, lib, lib.pi_cuda_ffn_run_async(self._ptr, self._act, ffi.cast("const float *", ffi.from_buffer(x)),
                                                   n_tok, float(threshold)), "pi_cuda_ffn_run_async")
        try:  # the CPU half while the GPU runs
            y = np.zeros_like(x)
            if n_cold > 0:
                g, u, d = self._host
                if n_tok not in self._cold_lists:
                    self._cold_lists[n_tok] = (np.tile(self.cold_ids, n_tok),
                                               np.arange(n_tok + 1, dtype=np.int64) * n_cold)
                ids, off = self._cold_lists[n_tok]
                ffn_sparse(dev._cpu_pool, self._act, self.gate_up_type, g, u, self.n_embd, self.n_ff,
                           self.down_t_type, d, x, ids, off, threshold, y)
        finally:  # always collect the job, so the device is free for the next one
            _check(ffi, lib, lib.pi_cuda_ffn_wait(self._ptr, ffi.cast("float *", ffi.from_buffer(yd)),
                                                  ffi.cast("int64_t *", ffi.from_buffer(n_used))), "pi_cuda_ffn_wait")
        self.last_n_used = n_used
        y = yd + y  # the cpu-device's merge: device partial + CPU partial, element by element
        return (y, yd) if return_device_part else y
