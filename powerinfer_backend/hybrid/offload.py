"""From the user's ``vram_budget`` / ``n_gpu_layers`` / ``device`` to a context running
under a placement plan (issue 6; docs/placement.md).

:func:`offload` decides the budget (:func:`powerinfer_backend.hybrid.placement.resolve_budget`),
makes or reuses the plan (:func:`~powerinfer_backend.hybrid.placement.plan_for_model`, or the
classic whole-layer split with ``placement="layers"``), opens the device reserving
exactly the plan's bytes, and places the context on it
(:func:`powerinfer_backend.hybrid.devices.place.place_model`).

Devices: ``"cpu"`` (none: everything on the CPU), ``"cpu-device"`` (the test device:
a separate pool and threads on the CPU running the whole plan - attention blocks, KV
caches, output block, hot rows - so the split is exercised without a GPU; its "free
memory" is the host's available memory) and ``"cuda"`` (a GPU, with the CUDA part built
with ``POWERINFER_CUDA=1``: hot FFN rows only for now, attention stays on the CPU).
``None`` = ``"cuda"`` when it loads, else ``"cpu"``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from . import placement as P

__all__ = ["DEVICES", "PLACEMENTS", "Offload", "offload", "host_available_bytes"]

DEVICES = ("cpu", "cpu-device", "cuda")
PLACEMENTS = ("neurons", "layers")


@dataclass
class Offload:
    """What :func:`offload` did.

    Attributes:
        device_kind: "cpu", "cpu-device" or "cuda".
        decision: the budget and why (:class:`powerinfer_backend.hybrid.placement.BudgetDecision`).
        plan: the plan run (None when nothing is placed).
        device: the open device object (None on the CPU).
        notices: warnings for the user (``Llama`` raises them at the caller's line).
    """

    device_kind: str
    decision: Optional[P.BudgetDecision] = None
    plan: Optional[P.Plan] = None
    device: Any = None
    notices: list = field(default_factory=list)

    def summary(self) -> str:
        """One line for ``verbose`` output."""
        if self.plan is None:
            why = f" ({self.decision.message})" if self.decision and self.decision.message else ""
            return f"device: none, CPU only{why}"
        p = self.plan
        return (f"device {self.device_kind}: {p.device_bytes} of {p.budget_bytes} budget bytes; "
                f"{sum(L.attn_on_device for L in p.layers)}/{len(p.layers)} attention blocks, "
                f"hot neurons {p.hot_fraction:.1%}, output {'device' if p.output_on_device else 'cpu'}")

    def stats(self) -> dict:
        """Device counters (:meth:`powerinfer_backend.hybrid.devices.cpu.CpuDevice.stats`), {} on the CPU."""
        return self.device.stats() if self.device is not None else {}


def host_available_bytes() -> int:
    """MemAvailable of this host (bytes): the cpu-device's "free device memory"."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cuda_available() -> bool:
    from .devices.cuda import load

    try:
        load()
        return True
    except RuntimeError:
        return False


def offload(ctx, model_path: str, *, vram_budget: Any = None, n_gpu_layers: Optional[int] = None,
            device: Optional[str] = None, placement: str = "neurons", device_threads: int = 1,
            reset_gpu_index: bool = False, disable_gpu_index: bool = False,
            verbose: bool = False) -> Offload:
    """Place ``ctx`` (:class:`powerinfer_backend.engine.native.NativeContext`) under the budget.

    Args:
        vram_budget: GiB (number) or a size string ("512MiB", "8GiB"); see
            :func:`powerinfer_backend.hybrid.placement.parse_vram_budget`.
        n_gpu_layers: llama.cpp's parameter, converted once when ``vram_budget`` is
            not given (:func:`powerinfer_backend.hybrid.placement.resolve_budget`).
        device: one of :data:`DEVICES` or None (auto).
        placement: "neurons" (hot neurons by firing frequency, PowerInfer) or
            "layers" (whole layers, llama.cpp's -ngl split).
        device_threads: worker threads of the cpu-device.
        reset_gpu_index, disable_gpu_index: as PowerInfer's --reset-gpu-index /
            --disable-gpu-index (:func:`powerinfer_backend.hybrid.placement.plan_for_model`).

    Raises:
        ValueError: a bad budget, device or placement name; a ``vram_budget`` above
            the device's free memory (both byte counts named; nothing allocated).
        NotImplementedError: device="cuda" without the CUDA part.
    """
    if device is not None and device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)} or None, got {device!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(device_threads, bool) or not isinstance(device_threads, int) or not 1 <= device_threads <= 512:
        raise ValueError(f"device_threads must be an integer in [1, 512], got {device_threads!r}")
    if device is None:
        device = "cuda" if _cuda_available() else "cpu"
    if device == "cuda":
        from .devices.cuda import load

        try:
            load()
        except RuntimeError as e:
            raise NotImplementedError(f"device='cuda': {e}") from e
    gguf = ctx.model.gguf
    sizes = P.ModelSizes.from_gguf(gguf)
    if device == "cpu":
        P.parse_vram_budget(vram_budget)  # still validated
        given = [f"{k}={v!r}" for k, v in (("vram_budget", vram_budget), ("n_gpu_layers", n_gpu_layers))
                 if v not in (None, 0)]
        dec = P.resolve_budget(None, n_gpu_layers, sizes, free_bytes=None, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch)
        return Offload("cpu", dec, notices=[f"{', '.join(given)} ignored: no GPU device (the CUDA part is not "
                                            f"built); running on the CPU"] if given else [])
    if device == "cuda":
        return _offload_cuda(ctx, model_path, sizes, vram_budget=vram_budget, n_gpu_layers=n_gpu_layers,
                             device_threads=device_threads, disable_gpu_index=disable_gpu_index, verbose=verbose)
    free = host_available_bytes()
    dec, notices = _resolve(vram_budget, n_gpu_layers, sizes, free, ctx)
    if dec.message and verbose:
        import sys

        print(f"powerinfer_backend: {dec.message}", file=sys.stderr)
    if placement == "layers":
        plan = P.plan_layer_split(sizes, dec.bytes, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch)
    else:
        plan = P.plan_for_model(model_path, dec.bytes, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, model=gguf,
                                reset_gpu_index=reset_gpu_index, disable_gpu_index=disable_gpu_index,
                                verbose=verbose)
    if plan.device_bytes == 0:
        return Offload(device, dec, notices=notices)
    from .devices.place import place_model

    dev = place_model(ctx, plan, n_threads=device_threads, kind=device)
    return Offload(device, dec, plan, dev, notices)


def _resolve(vram_budget, n_gpu_layers, sizes, free, ctx):
    """resolve_budget, its warnings (and the n_gpu_layers conversion, said once) as
    notices for the caller's line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = P.resolve_budget(vram_budget, n_gpu_layers, sizes, free_bytes=free, n_ctx=ctx.n_ctx,
                               n_batch=ctx.n_batch)
    notices = [str(w.message) for w in caught]
    if dec.source == "n_gpu_layers":
        notices.append(dec.message)
    return dec, notices


def _offload_cuda(ctx, model_path, sizes, *, vram_budget, n_gpu_layers, device_threads, disable_gpu_index,
                  verbose) -> Offload:
    """The GPU holds hot FFN rows only (attention, KV cache and output stay on the CPU):
    the largest neuron plan whose CUDA uploads (rows plus each layer's own buffers for
    n_batch tokens, ``cuda_ffn_bytes``) fit the budget; each layer is then split by the
    engine (``pi_context_set_ffn_offload``): GPU partial sum, continued on the CPU."""
    from .devices.cuda import CudaDevice, cuda_ffn_bytes
    from ..engine.down_cache import down_t_dtype, transposed_down
    from .devices.place import _ACT_FORM, split_arithmetic

    gguf = ctx.model.gguf
    hp = gguf.hparams
    free = CudaDevice.probe()["free_bytes"]  # after the CUDA context and our kernels
    dec, notices = _resolve(vram_budget, n_gpu_layers, sizes, free, ctx)
    dname = down_t_dtype(gguf)
    dtype_id = 0 if dname == "f32" else 1
    gate_types = [gguf.layer_tensor(i, "ffn_up").type for i in range(hp.n_layer)]  # up: gate's type, always present

    def cuda_bytes(plan):
        return sum(cuda_ffn_bytes(int(gate_types[i]), dtype_id, hp.n_embd, L.n_hot, ctx.n_batch)
                   for i, L in enumerate(plan.layers))

    freq, _ = P.neuron_frequencies(model_path, model=gguf)
    lo, hi = 0, dec.bytes  # the largest planning budget whose real bytes fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cuda_bytes(P.plan_placement(sizes, freq, mid, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch,
                                       neurons_only=True, disable_gpu_index=disable_gpu_index)) <= dec.bytes:
            lo = mid
        else:
            hi = mid - 1
    plan = P.plan_placement(sizes, freq, lo, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, neurons_only=True,
                            disable_gpu_index=disable_gpu_index)
    reserve = cuda_bytes(plan)
    if reserve == 0:
        return Offload("cuda", dec, notices=notices)
    dev = CudaDevice(reserve, n_threads=device_threads)
    form = _ACT_FORM[hp.act]
    split_arithmetic(ctx)
    for i, L in enumerate(plan.layers):
        if L.n_hot:
            gate, up = gguf.layer_tensor(i, "ffn_gate"), gguf.layer_tensor(i, "ffn_up")
            f = dev.upload_ffn(form, int(gate.type), gate.data, up.data, dtype_id,
                               transposed_down(gguf, i, dtype=dname), hp.n_embd, hp.n_ff, L.hot_ids,
                               max_tok=ctx.n_batch)
            ctx.set_ffn_offload(i, f)
    ctx.hold_device(dev)
    return Offload("cuda", dec, plan, dev, notices)

