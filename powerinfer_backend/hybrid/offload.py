"""From the user's ``vram_budget`` / ``n_gpu_layers`` / ``device`` to a context running
under a placement plan on a ggml device (issues 6, 14; docs/placement.md).

:func:`offload` resolves the device name (:func:`powerinfer_backend.hybrid.devices.select.resolve_device`:
"auto", "cuda", "metal", "vulkan", "hip", a ggml device name, "ggml-cpu",
"cpu"), opens it, decides the budget against its free memory
(:func:`powerinfer_backend.hybrid.placement.resolve_budget`), makes or reuses the plan with
the device's byte rule (:class:`~powerinfer_backend.hybrid.devices.select.DeviceSizer`;
:func:`~powerinfer_backend.hybrid.placement.plan_for_model`: by default ``placement="auto"``,
the fastest predicted of the throughput planner, the neuron plan and the layer split, with the
device's and the host's bandwidths, :mod:`~powerinfer_backend.hybrid.placement.bandwidth`; or
the neuron plan, or whole layers with ``placement="layers"``) and places the context on the device
(``NativeContext.set_ggml_device``), checking that ggml allocated exactly the plan's bytes
per buffer.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from . import placement as P
from .devices.select import DeviceChoice, DeviceSizer, open_device, resolve_device

__all__ = ["PLACEMENTS", "Offload", "offload", "split_arithmetic", "engine_mode", "check_device_options"]

PLACEMENTS = ("auto", "neurons", "layers")
#: why ``placement="auto"`` runs the neuron plan on ggml's CPU backend as the device
SHARED_MEMORY = (
    "ggml's CPU backend reads the host's own memory, so no placement reads faster; auto runs "
    "the neuron plan there (pass device_bandwidth= to plan by the cost model anyway)"
)


@dataclass
class Offload:
    """What :func:`offload` did.

    Attributes:
        device_kind: the ``device`` name as resolved ("ggml-cpu", "cuda", "CUDA0", "auto",
            "cpu", ...).
        decision: the budget and why (:class:`powerinfer_backend.hybrid.placement.BudgetDecision`).
        plan: the plan run (None when nothing is placed).
        device: the open :class:`powerinfer_backend.engine.ggml.GgmlDevice` (None on the CPU).
        ctx: the placed context (None on the CPU).
        notices: warnings for the user (``Llama`` raises them at the caller's line).
        runtime_reserve: bytes of the budget set aside for the device backend's own buffers
            (:func:`powerinfer_backend.hybrid.placement.device_reserve`; the plan gets the rest).
        device_skips: a split layer's device half computes only the hot neurons its predictor
            selects (``NativeContext.set_ggml_device``;
            :func:`powerinfer_backend.hybrid.placement.device_skips_for`); False where the plan
            splits no layer.
        message: the one line ``"auto"`` gives without a GPU (shown with ``verbose``, or as a
            notice when a budget was asked for).
    """

    device_kind: str
    decision: Optional[P.BudgetDecision] = None
    plan: Optional[P.Plan] = None
    device: Any = None
    ctx: Any = None
    notices: list = field(default_factory=list)
    message: str = ""
    runtime_reserve: int = 0
    device_skips: bool = False
    _high_water: int = 0

    def summary(self) -> str:
        """One line for ``verbose`` output."""
        if self.plan is None:
            why = self.message or (self.decision.message if self.decision else "")
            return f"device: none, CPU only{f' ({why})' if why else ''}"
        p = self.plan
        aside = f" ({self.runtime_reserve} more set aside for the runtime)" if self.runtime_reserve else ""
        line = (
            f"device {self.device_kind} (ggml {self.device.info.name}): {p.device_bytes} of {p.budget_bytes} "
            f"budget bytes{aside}; {sum(L.attn_on_device for L in p.layers)}/{len(p.layers)} attention blocks, "
            f"hot neurons {p.hot_fraction:.1%}, output {'device' if p.output_on_device else 'cpu'}"
            + (", the device computing only the hot neurons the predictor selects" if self.device_skips else "")
        )
        c = p.choice
        if c and "tok_s" not in c:
            line += f"; placement auto chose {c['policy']} ({c['reason']})"
        elif c:
            line += (
                f"; placement auto chose {c['policy']}: predicted {c['tok_s'][c['policy']]:.1f} tok/s, "
                f"{c['ratio']:.2f}x llama.cpp's layer split"
                + (f", {c['tok_s'][c['policy']] / c['cpu_tok_s']:.2f}x the CPU alone" if "cpu_tok_s" in c else "")
                + f" (device {c['device_gbps']:g} GB/s, {c.get('device_source', 'given')}; "
                f"host {c['host_gbps']:g} GB/s; round trip {c.get('sync_s', 0.0) * 1e3:g} ms per split layer; "
                f"mode {c['mode']})"
            )
        return line

    def stats(self) -> dict:
        """The device's memory, {} on the CPU: ``kind`` (the name asked for), ``name``
        (ggml's), ``type``, ``budget_bytes`` (the budget the plan was made under, also when it
        came from ``n_gpu_layers``), ``runtime_reserve`` (bytes of ``vram_budget`` set aside for
        the backend's own buffers: 128 MiB on a GPU, 0 on ggml's CPU backend; the plan was made
        under the rest), ``device_skips`` (:attr:`device_skips`), ``reserved`` (the plan's
        bytes), ``used`` (the bytes of the buffers ggml allocated), ``high_water`` (the most ``used`` seen), ``buffers``
        (bytes per buffer: weights, kv, compute), ``free_bytes`` / ``total_bytes`` (the
        device's memory now, ``ggml_backend_dev_memory``), and with ``placement="auto"``
        ``placement``: the plan's ``choice`` (``policy`` that won, predicted ``tok_s`` of
        each candidate, ``llama_cpp_tok_s``, ``ratio``, the bandwidths and mode used)."""
        if self.device is None:
            return {}
        bufs = self.ctx.ggml_buffers()
        used = sum(bufs.values())
        self._high_water = max(self._high_water, used)
        info, plan = self.device.info, self.plan
        assert plan is not None  # a device is placed with its plan
        return {
            "kind": self.device_kind,
            "name": info.name,
            "type": info.type,
            "budget_bytes": int(plan.budget_bytes),
            "runtime_reserve": int(self.runtime_reserve),
            "device_skips": bool(self.device_skips),
            "reserved": plan.device_bytes,
            "used": used,
            "high_water": self._high_water,
            "buffers": dict(bufs),
            "free_bytes": info.free_bytes,
            "total_bytes": info.total_bytes,
            **({"placement": dict(plan.choice)} if plan.choice else {}),
        }

    def close(self) -> None:
        """Free the device (after the context that uses it is closed; idempotent)."""
        if self.device is not None:
            self.device.close()
            self.device = None


def split_arithmetic(ctx, layers=None) -> None:
    """Give every layer of ``ctx`` with neurons on the device (``layers``: the plan's
    :class:`~powerinfer_backend.hybrid.placement.LayerPlan` list; None: every layer) the
    transposed down its CPU half computes the cold neurons over: the CPU-only engine's
    (``down_t_dtype``: Q8_0 for a quantized file), so a split layer's host reads no more
    bytes than CPU-only for the same neurons (docs/placement.md). A layer a sparse mode
    configured keeps its down_t and threshold; a dense layer (no sparse mode) gets
    threshold 0, and with ``layers`` given its whole down runs over the GGUF ffn_down on the
    host (``set_ffn_down_dense``, the device giving the hot neurons' h) where n_cold down_t
    rows would read more (:meth:`~powerinfer_backend.hybrid.placement.ModelSizes.host_down`,
    which the plan counts: the device then holds no down columns), which is the CPU-only dense
    FFN's down. A layer with no neuron on the device keeps the CPU-only engine's FFN."""
    from ..engine.down_cache import down_t_dtype, transposed_down

    gguf = ctx.model.gguf
    dtype, sizes = down_t_dtype(gguf), P.ModelSizes.from_gguf(gguf)
    n_hot = {i: 0 for i in range(gguf.hparams.n_layer)} if layers is None else {L.layer: L.n_hot for L in layers}
    for i, hot in n_hot.items():
        if (layers is not None and hot == 0) or ctx.has_ffn_sparsity(i):
            continue
        ctx.set_ffn_sparsity(i, transposed_down(gguf, i, dtype=dtype), 0.0)
        if layers is not None and sizes.host_down(i, hot):
            ctx.set_ffn_down_dense(i, True)


def engine_mode(ctx) -> str:
    """The FFN mode of the CPU engine as configured on ``ctx``, in the cost model's terms
    (:data:`powerinfer_backend.hybrid.placement.MODES`): "predictor" (a layer with a
    predictor: a split layer's CPU half reads only the predicted cold rows), "relu" (exact
    zeros of a ReLU model), "threshold" (a layer thresholded), else "dense"."""
    if ctx.ffn_predictor_bytes() > 0:
        return "predictor"
    hp = ctx.model.gguf.hparams
    sparse = [i for i in range(hp.n_layer) if ctx.has_ffn_sparsity(i)]
    if sparse and hp.act_name == "relu":
        return "relu"
    return "threshold" if any((ctx.ffn_threshold(i) or 0) > 0 for i in sparse) else "dense"


def check_device_options(
    placement: str = "auto", device_threads: int = 1, device_bandwidth=None, device_skips=None
) -> None:
    """Check ``placement``, ``device_threads``, ``device_bandwidth`` and ``device_skips`` (also
    before a model loads: ``Llama``).

    Raises:
        ValueError: an unknown placement, device_threads not an integer in [1, 512], a
            device_bandwidth that is not None or a finite number of GB/s > 0, or a
            device_skips that is not None, True or False.
    """
    if device_skips is not None and not isinstance(device_skips, bool):
        raise ValueError(f"device_skips must be True, False or None (the cost model's choice), got {device_skips!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(device_threads, bool) or not isinstance(device_threads, int) or not 1 <= device_threads <= 512:
        raise ValueError(f"device_threads must be an integer in [1, 512], got {device_threads!r}")
    if device_bandwidth is not None:
        P.device_bandwidth("", "", "", override=device_bandwidth)


def offload(
    ctx,
    model_path: str,
    *,
    vram_budget: Any = None,
    n_gpu_layers: Optional[int] = None,
    device: Optional[str] = None,
    placement: str = "auto",
    device_threads: int = 1,
    reset_gpu_index: bool = False,
    disable_gpu_index: bool = False,
    device_bandwidth: Optional[float] = None,
    sparsity_sidecar: Any = "auto",
    device_skips: Optional[bool] = None,
    verbose: bool = False,
) -> Offload:
    """Place ``ctx`` (:class:`powerinfer_backend.engine.native.NativeContext`) under the budget.

    Args:
        vram_budget: GiB (number) or a size string ("512MiB", "8GiB"); see
            :func:`powerinfer_backend.hybrid.placement.parse_vram_budget`.
        n_gpu_layers: llama.cpp's parameter, converted once when ``vram_budget`` is
            not given (:func:`powerinfer_backend.hybrid.placement.resolve_budget`).
        device: a device name (:mod:`powerinfer_backend.hybrid.devices.select`); None = "auto".
        placement: "auto" (the fastest predicted of the throughput planner, the neuron plan
            and the layer split: docs/placement.md), "neurons" (attention blocks, then hot
            neurons by firing frequency, PowerInfer) or "layers" (whole layers, llama.cpp's
            -ngl split).
        device_threads: threads of ggml's CPU backend when it is the device ("ggml-cpu").
        reset_gpu_index, disable_gpu_index: as PowerInfer's --reset-gpu-index /
            --disable-gpu-index (:func:`powerinfer_backend.hybrid.placement.plan_for_model`).
        device_bandwidth: the device's memory bandwidth in GB/s for ``placement="auto"``
            (None: the table of common GPUs by ggml's device description; for ggml's CPU
            backend, which shares the host's memory, auto then runs the neuron plan).
        sparsity_sidecar: the calibration sidecar whose firing frequencies rank the hot
            neurons (the one the context's sparse FFN was configured from); "auto": the
            model's own sidecar or gpuidx file beside it
            (:func:`powerinfer_backend.hybrid.placement.neuron_frequencies`).
        device_skips: with predictors, a split layer's device half computes only the hot
            neurons the predictor selects (True) or every hot neuron (False); None:
            :func:`powerinfer_backend.hybrid.placement.device_skips_for` (the cost model's
            choice under ``placement="auto"``).

    Raises:
        ValueError: a bad budget, device or placement name, a device ggml does not have
            (the message lists those it has); a ``vram_budget`` above the device's free
            memory (both byte counts named; nothing allocated).
        RuntimeError: ggml missing or of an unsupported version for a named device.
        NotImplementedError: a model the device cannot run (the engine's message).
    """
    check_device_options(placement, device_threads, device_bandwidth, device_skips)
    P.parse_vram_budget(vram_budget)  # validated before anything opens
    choice = resolve_device(device)
    sizes = P.ModelSizes.of_context(ctx)
    if choice.ggml_name is None:
        return _cpu_only(choice, vram_budget, n_gpu_layers, sizes, ctx)
    dev = open_device(choice, device_threads)
    try:
        return _place(
            ctx,
            dev,
            choice,
            model_path,
            sizes,
            vram_budget=vram_budget,
            n_gpu_layers=n_gpu_layers,
            placement=placement,
            reset_gpu_index=reset_gpu_index,
            disable_gpu_index=disable_gpu_index,
            device_bandwidth=device_bandwidth,
            device_threads=device_threads,
            sparsity_sidecar=sparsity_sidecar,
            device_skips=device_skips,
            verbose=verbose,
        )
    except BaseException:
        if ctx.device is not dev:  # a placed context still points at the device: it goes with the context
            dev.close()
        raise


def _cpu_only(choice: DeviceChoice, vram_budget, n_gpu_layers, sizes, ctx) -> Offload:
    """No device: a given budget is ignored, said once (a notice); ``"auto"`` says why it
    found none once (in that notice, else in the verbose summary line)."""
    given = [
        f"{k}={v!r}" for k, v in (("vram_budget", vram_budget), ("n_gpu_layers", n_gpu_layers)) if v not in (None, 0)
    ]
    dec = P.resolve_budget(None, n_gpu_layers, sizes, free_bytes=None, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch)
    why = choice.message or f"device={choice.requested!r}"
    notices = [f"{', '.join(given)} ignored: {why}; running on the CPU"] if given else []
    return Offload(
        "cpu" if choice.requested == "cpu" else choice.requested, dec, notices=notices, message=choice.message
    )


def _place(
    ctx,
    dev,
    choice,
    model_path,
    sizes,
    *,
    vram_budget,
    n_gpu_layers,
    placement,
    reset_gpu_index,
    disable_gpu_index,
    device_bandwidth,
    device_threads,
    sparsity_sidecar,
    device_skips,
    verbose,
) -> Offload:
    gguf = ctx.model.gguf
    sizer = DeviceSizer(dev, ctx)
    free = int(dev.info.free_bytes)
    dec, notices = _resolve(vram_budget, n_gpu_layers, sizes, free, ctx, sizer)
    if dec.message and verbose:
        print(f"powerinfer_backend: {dec.message}", file=sys.stderr)
    # a budget is the process's device memory: the backend's own buffers come out of it (n_gpu_layers
    # asks for layers, as llama.cpp, whose backend allocates the same beside them)
    budget, reserve = (
        P.budget_after_reserve(dec.bytes, dev.info.name, dev.info.type)
        if dec.source != "n_gpu_layers"
        else (dec.bytes, 0)
    )
    mode = engine_mode(ctx)  # the CPU half's FFN mode, in the cost model's terms
    if placement == "layers":
        plan = P.plan_layer_split(sizes, budget, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, sizer=sizer)
    else:
        auto: dict[str, Any] = {}
        src, sync_src, info = "", "", dev.info
        shared = info.type == "cpu" and device_bandwidth is None
        if placement == "auto" and budget > 0 and not shared:
            bd, src = P.device_bandwidth(
                info.name, info.description, info.type, override=device_bandwidth, n_threads=device_threads
            )
            sync, sync_src = P.device_sync(info.name, info.type)
            auto = dict(
                placement="auto", device_gbps=bd, host_gbps=P.host_bandwidth(ctx.n_threads), mode=mode, sync_s=sync
            )
            if mode == "predictor":
                auto["predictor_bytes"] = ctx.ffn_predictor_bytes()
                if device_skips is not None:  # the plan is made for what will run
                    auto["device_skips"] = device_skips
        plan = P.plan_for_model(
            model_path,
            budget,
            n_ctx=ctx.n_ctx,
            n_batch=ctx.n_batch,
            model=gguf,
            sizes=sizes,
            reset_gpu_index=reset_gpu_index,
            disable_gpu_index=disable_gpu_index,
            sizer=sizer,
            sparsity_sidecar=sparsity_sidecar,
            verbose=verbose,
            **auto,
        )
        if plan.choice:
            plan.choice["device_source"] = src
            if "sync_s" in plan.choice:
                plan.choice["sync_source"] = sync_src
        elif placement == "auto" and shared:
            plan.choice = {"policy": "neurons", "reason": SHARED_MEMORY}
    kind = choice.requested
    if plan.device_bytes == 0:
        why = P.why_placed_nothing(  # sized by the device: before it closes
            plan, sizes, budget, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, sizer=sizer, neurons=not disable_gpu_index
        )
        dev.close()
        if not why and placement == "layers" and budget > 0:
            why = f"placement 'layers': no whole layer fits vram_budget {budget} bytes"
        if not why and dec.bytes > 0 and budget == 0:
            why = f"vram_budget {dec.bytes} bytes places nothing"
        if why and reserve:
            why += f" (of vram_budget {dec.bytes} bytes, {reserve} are set aside for the device's runtime)"
        return Offload(kind, dec, notices=notices + ([f"{why}; running on the CPU"] if why else []))
    skips = P.device_skips_for(mode, plan, device_skips)
    if device_skips and mode != "predictor":
        notices.append("device_skips=True ignored: the context has no predictors (nothing to skip by)")
    try:
        place_plan(ctx, dev, plan, budget, device_skips=skips)
    except NotImplementedError as e:  # a backend without the gather ops (checked before allocating)
        if not skips or device_skips:
            raise
        notices.append(f"{e}; the device computes every hot neuron instead")
        skips = False
        place_plan(ctx, dev, plan, budget, device_skips=False)
    return Offload(kind, dec, plan, dev, ctx, notices, runtime_reserve=reserve, device_skips=skips)


def place_plan(ctx, dev, plan: P.Plan, budget_bytes: int, *, device_skips: bool = False) -> None:
    """Put ``plan`` on ``dev`` for ``ctx`` (``NativeContext.set_ggml_device``) and check
    that ggml allocated exactly the plan's bytes per buffer. Every layer's FFN is first
    given its transposed down at threshold 0 unless a sparse mode set one
    (:func:`split_arithmetic`). ``device_skips``: a split layer's device half computes only
    the hot neurons its predictor selects (``NativeContext.set_ggml_device``).

    Raises:
        MemoryError: the plan exceeds ``budget_bytes`` or the device's free memory
            (refused before anything is allocated; both byte counts in the message).
        ValueError: the plan is for another model or n_ctx / n_batch, or ggml allocated
            other sizes than the plan counts (a placement/engine mismatch: both named).
    """
    hp = ctx.model.gguf.hparams
    if len(plan.layers) != hp.n_layer or plan.n_ff != hp.n_ff:
        raise ValueError(
            f"placement plan for {len(plan.layers)} layers x n_ff {plan.n_ff}, the model has {hp.n_layer} x {hp.n_ff}"
        )
    if (plan.n_ctx, plan.n_batch) != (ctx.n_ctx, ctx.n_batch):
        raise ValueError(
            f"placement plan made for n_ctx {plan.n_ctx}, n_batch {plan.n_batch}; the context has "
            f"n_ctx {ctx.n_ctx}, n_batch {ctx.n_batch}"
        )
    split_arithmetic(ctx, plan.layers)  # the split layers' cold neurons as the CPU-only engine reads them
    ctx.set_ggml_device(dev, plan.layers, bool(plan.output_on_device), int(budget_bytes), device_skips=device_skips)
    ctx.hold_device(dev)  # the device outlives the context's use of it
    got, want = ctx.ggml_buffers(), plan.buffer_bytes()
    if dict(got) != want:
        raise ValueError(
            f"device {dev.info.name}: ggml allocated {dict(got)} bytes per buffer, the placement plan "
            f"counts {want} (model {ctx.model.gguf.path})"
        )


def _resolve(vram_budget, n_gpu_layers, sizes, free, ctx, sizer):
    """resolve_budget, its warnings (and the n_gpu_layers conversion, said once) as
    notices for the caller's line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dec = P.resolve_budget(
            vram_budget, n_gpu_layers, sizes, free_bytes=free, n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, sizer=sizer
        )
    notices = [str(w.message) for w in caught]
    if dec.source == "n_gpu_layers":
        notices.append(dec.message)
    return dec, notices
