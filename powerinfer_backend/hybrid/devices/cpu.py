"""Devices for the hybrid executor (issue 6): thin owners of the native ``pi_device``.

``CpuDevice`` is the ``"cpu-device"`` test device: a memory pool that reserves exactly
the bytes it is given up front and refuses more, with its own thread and workers,
running the device half of a placement plan (hot FFN rows) while the calling thread
computes the cold neurons (docs/placement.md). It exists so that the split, the
concurrency, the byte accounting and the merge are tested without a GPU. The CUDA device
(``cuda_device.CudaDevice``, same interface) lives in its own shared object, built with
``POWERINFER_CUDA=1`` and loaded only when asked for (:func:`open_device`).

A whole model runs under a plan with :func:`place_model` (the context's placed
attention blocks, KV caches, output block and hot rows on the device); one layer's
split alone with :meth:`CpuDevice.upload_ffn` / :meth:`DeviceFFN.run`.
"""

from __future__ import annotations

import numpy as np

from ... import _native
from ..._native import ffi, lib
from ..._native.enums import Act

__all__ = ["CpuDevice", "DeviceFFN", "FFN_FORMS", "ffn_bytes", "open_device", "upload_plan", "plan_ffn_bytes",
           "place_model"]

#: enum pi_ffn_act: name -> value
FFN_FORMS = {"swiglu": 0, "geglu": 1, "relu": 2, "drelu": 3}


def _u8(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint8).reshape(-1)


def ffn_bytes(gate_up_type: int, down_t_type: int, n_embd: int, n_hot: int, max_tok: int) -> int:
    """Device bytes :meth:`CpuDevice.upload_ffn` takes for one layer (see
    ``pi_device_ffn_bytes``: rows, map, scratch and x/y buffers, each aligned to 256).

    Raises:
        ValueError: bad types or sizes.
    """
    n = int(lib.pi_device_ffn_bytes(gate_up_type, down_t_type, n_embd, n_hot, max_tok))
    if n < 0:
        raise ValueError(f"no device FFN of types ({gate_up_type}, {down_t_type}), n_embd {n_embd}, n_hot {n_hot}, "
                         f"max_tok {max_tok}")
    return n


class Closing:
    """``with`` support and closing on garbage collection for an object with ``close()``."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


class CpuDevice(Closing):
    """The ``"cpu-device"``: ``reserve_bytes`` reserved now, ``n_threads`` device workers.

    Raises:
        ValueError: reserve_bytes < 0 or n_threads outside [1, 512].
        MemoryError: the reservation cannot be made.
    """

    def __init__(self, reserve_bytes: int, n_threads: int = 1, kind: str = "cpu-device"):
        out = ffi.new("pi_device **")
        _native.check(lib.pi_device_create(kind.encode(), int(reserve_bytes), int(n_threads), out),
                      "pi_device_create")
        self._ptr = out[0]
        self._ffns: list[DeviceFFN] = []
        pool = ffi.new("pi_pool **")
        rc = lib.pi_pool_create(int(n_threads), pool)
        if rc:
            lib.pi_device_free(self._ptr)
            _native.check(rc, "pi_pool_create")
        self._cpu_pool = pool[0]

    def stats(self) -> dict[str, int]:
        """Byte counters (reserved, used, high_water) and work counters (n_refused;
        n_jobs: jobs run; rows: hot FFN rows processed, summed over tokens; n_attn,
        n_output: attention and output blocks run for a placed model)."""
        s = ffi.new("pi_device_stats *")
        _native.check(lib.pi_device_get_stats(self._ptr, s), "pi_device_get_stats")
        return {k: int(getattr(s, k)) for k in ("reserved", "used", "high_water", "n_refused", "n_jobs", "rows",
                                                 "n_attn", "n_output", "n_threads")}

    def alloc(self, nbytes: int) -> None:
        """Allocate ``nbytes`` of device memory (for tests of the reservation).

        Raises:
            MemoryError: past the reservation.
        """
        p = ffi.new("void **")
        _native.check(lib.pi_device_alloc(self._ptr, int(nbytes), p), "pi_device_alloc")

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
        g, u, d = _u8(gate), _u8(up), _u8(down_t)
        ids = np.ascontiguousarray(hot_ids, dtype=np.int32)
        out = ffi.new("pi_device_ffn **")
        _native.check(lib.pi_device_ffn_upload(
            self._ptr, gate_up_type, ffi.from_buffer(g), ffi.from_buffer(u), n_embd, n_ff, down_t_type,
            ffi.from_buffer(d), ffi.cast("const int32_t *", ffi.from_buffer(ids)), ids.shape[0], max_tok, out),
            "pi_device_ffn_upload")
        f = DeviceFFN(self, out[0], FFN_FORMS[act], (g, u, d), n_embd, max_tok)
        self._ffns.append(f)
        return f

    def close(self) -> None:
        if getattr(self, "_ptr", None) is not None:
            for f in self._ffns:
                lib.pi_device_ffn_free(f._ptr)
            self._ffns = []
            lib.pi_device_free(self._ptr)
            lib.pi_pool_free(self._cpu_pool)
            self._ptr = None



def open_device(kind: str, reserve_bytes: int, n_threads: int = 1, *, device: int = 0):
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


class DeviceFFN:
    """One layer split between the device (hot rows) and the CPU (the rest)."""

    def __init__(self, dev: CpuDevice, ptr, act: int, host: tuple, n_embd: int, max_tok: int):
        self._dev, self._ptr, self._act, self._host = dev, ptr, act, host
        self.n_embd, self.max_tok = n_embd, max_tok
        self.n_hot = int(lib.pi_device_ffn_n_hot(ptr))

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
        g, u, d = self._host
        _native.check(lib.pi_op_ffn_hybrid(
            self._dev._cpu_pool, self._ptr, self._act, ffi.from_buffer(g), ffi.from_buffer(u), ffi.from_buffer(d),
            ffi.cast("const float *", ffi.from_buffer(x)), x.shape[0], float(threshold),
            ffi.cast("float *", ffi.from_buffer(y)),
            ffi.cast("float *", ffi.from_buffer(yd)) if yd is not None else ffi.NULL), "pi_op_ffn_hybrid")
        return (y, yd) if return_device_part else y


def upload_plan(dev: CpuDevice, model, plan, *, max_tok: int = 1) -> list[DeviceFFN]:
    """Every layer's hot rows of ``plan`` (:class:`powerinfer_backend.hybrid.placement.Plan`)
    on ``dev`` (a :class:`CpuDevice` or a ``CudaDevice``), from the loaded GGUF ``model`` (gate/up as stored, down_t from the
    down cache, :func:`powerinfer_backend.engine.down_cache.transposed_down`). Returns one
    :class:`DeviceFFN` per layer (n_hot 0 where the plan places none).

    Raises:
        ValueError: the plan is for another n_ff or layer count.
        MemoryError: the rows do not fit the device's reservation.
        NotImplementedError: an ungated FFN (Falcon, OPT).
    """
    from ...engine.down_cache import down_t_dtype, transposed_down

    hp = model.hparams
    if plan.n_ff != hp.n_ff or len(plan.layers) != hp.n_layer:
        raise ValueError(f"plan for n_ff {plan.n_ff} x {len(plan.layers)} layers, model has {hp.n_ff} x {hp.n_layer}")
    dname = down_t_dtype(model)
    dtype_id = 0 if dname == "f32" else 1
    out = []
    for i, L in enumerate(plan.layers):
        gate, up = model.layer_tensor(i, "ffn_gate"), model.layer_tensor(i, "ffn_up")
        if gate is None:
            raise NotImplementedError(f"blk.{i}: the hybrid FFN split needs a gated FFN; {model.arch} is ungated")
        dt = transposed_down(model, i, dtype=dname)
        out.append(dev.upload_ffn(_ACT_FORM[hp.act], gate.type, gate.data, up.data, dtype_id, dt, hp.n_embd, hp.n_ff,
                                  L.hot_ids, max_tok))
    return out


#: enum pi_act -> the gated FFN form it computes (enum pi_ffn_act's name)
_ACT_FORM = {int(Act.SILU): "swiglu", int(Act.GELU): "geglu", int(Act.RELU): "relu", int(Act.DRELU): "drelu"}


def plan_ffn_bytes(model, plan, *, max_tok: int = 1, kind: str = "cpu-device") -> int:
    """Device bytes :func:`upload_plan` takes on a device of ``kind`` (sum of
    :func:`ffn_bytes`, or ``cuda_device.cuda_ffn_bytes`` for "cuda", over layers)."""
    from ...engine.down_cache import down_t_dtype

    d = 0 if down_t_dtype(model) == "f32" else 1
    if kind == "cuda":
        from .cuda import cuda_ffn_bytes

        return sum(cuda_ffn_bytes(model.layer_tensor(i, "ffn_up").type, d, model.hparams.n_embd, L.n_hot, max_tok)
                   for i, L in enumerate(plan.layers))
    return sum(ffn_bytes(model.layer_tensor(i, "ffn_up").type, d, model.hparams.n_embd, L.n_hot, max_tok)
               for i, L in enumerate(plan.layers))


def split_arithmetic(ctx) -> None:
    """Give every layer of ``ctx`` that has no sparse FFN yet its transposed down with
    threshold 0: the arithmetic a device split uses, so it is the same at every budget
    (docs/placement.md, "Exactness")."""
    from ...engine.down_cache import down_t_dtype, transposed_down

    gguf = ctx.model.gguf
    dtype = down_t_dtype(gguf)
    for i in range(gguf.hparams.n_layer):
        if not ctx.has_ffn_sparsity(i):
            ctx.set_ffn_sparsity(i, transposed_down(gguf, i, dtype=dtype), 0.0)


def place_model(ctx, plan, *, n_threads: int = 1, kind: str = "cpu-device") -> CpuDevice:
    """Put ``plan`` (:class:`powerinfer_backend.hybrid.placement.Plan`, made for ``ctx``'s
    n_ctx and n_batch) on a new device reserving exactly ``plan.device_bytes``, and
    run ``ctx`` (:class:`powerinfer_backend.engine.native.NativeContext`) under it. Every
    layer without a sparse FFN yet gets its down_t with threshold 0 (exact: all nonzero
    h computed, hot ones on the device, cold ones on the CPU), so the FFN arithmetic is
    the same at every budget: the down projection over the transposed copy, as
    PowerInfer's split (:func:`split_arithmetic`).

    Returns:
        the device (its :meth:`CpuDevice.stats` show bytes and work done).

    Raises:
        ValueError: the plan does not match the model or context, or its byte count
            differs from the C library's (a placement/engine mismatch).
        MemoryError: the reservation cannot be made.
    """
    ctx.plan_bytes(plan)  # what cannot be placed is refused before anything changes
    gguf = ctx.model.gguf
    if plan.device_bytes > 0:
        split_arithmetic(ctx)
    total, _ = ctx.plan_bytes(plan)  # with the down_t types now set
    if total != plan.device_bytes:
        raise ValueError(f"placement plan accounts {plan.device_bytes} device bytes, the engine needs {total} "
                         f"(model {gguf.path})")
    dev = CpuDevice(plan.device_bytes, n_threads=n_threads, kind=kind)
    ctx.set_device(dev, plan)
    return dev
