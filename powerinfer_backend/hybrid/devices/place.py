"""A placement plan on a device: its hot rows uploaded layer by layer
(:func:`upload_plan`, bytes by :func:`plan_ffn_bytes`), or a whole context run under it
(:func:`place_model`), with the FFN arithmetic a split uses (:func:`split_arithmetic`)."""

from __future__ import annotations

from ..._native.enums import Act
from .base import Device, DeviceFFNHalf
from .cpu import CpuDevice, ffn_bytes

__all__ = ["upload_plan", "plan_ffn_bytes", "split_arithmetic", "place_model"]

#: enum pi_act -> the gated FFN form it computes (enum pi_ffn_act's name)
_ACT_FORM = {int(Act.SILU): "swiglu", int(Act.GELU): "geglu", int(Act.RELU): "relu", int(Act.DRELU): "drelu"}


def upload_plan(dev: Device, model, plan, *, max_tok: int = 1) -> list[DeviceFFNHalf]:
    """Every layer's hot rows of ``plan`` (:class:`powerinfer_backend.hybrid.placement.Plan`)
    on ``dev`` (a :class:`CpuDevice` or a ``CudaDevice``), from the loaded GGUF ``model``
    (gate/up as stored, down_t from the down cache,
    :func:`powerinfer_backend.engine.down_cache.transposed_down`). Returns one FFN half
    per layer (a :class:`~.cpu.DeviceFFN` or ``CudaFFN``; n_hot 0 where the plan places none).

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
