"""The planners: :func:`plan_placement` (PowerInfer's policy: compute buffer, dense blocks,
then hot FFN neurons by firing frequency per byte) and :func:`plan_layer_split` (whole
layers, as llama.cpp's ``-ngl``), both pure functions of sizes, frequencies and budget."""

from __future__ import annotations

from typing import Any

import numpy as np

from .plan import LayerPlan, Plan
from .sizes import (
    CPU_BUFT,
    NEURON_GROUP,
    ModelSizes,
    Sizer,
    attn_block_bytes,
    compute_bytes,
    hot_bytes,
    kv_bytes_per_layer,
    layer_bytes,
    neuron_bytes,
    output_block_bytes,
)

__all__ = ["plan_placement", "plan_layer_split", "why_nothing_placed"]


def _check_int(name: str, v: Any, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    return int(v)


def _check_freq(s: ModelSizes, neuron_freq: np.ndarray | None) -> np.ndarray:
    if neuron_freq is None:
        return np.ones((s.n_layer, s.n_ff), np.float64)
    f = np.asarray(neuron_freq, dtype=np.float64)
    if f.shape != (s.n_layer, s.n_ff):
        raise ValueError(f"neuron_freq must have shape (n_layer, n_ff) = {(s.n_layer, s.n_ff)}, got {f.shape}")
    if not np.all(np.isfinite(f)) or f.min(initial=0.0) < 0 or f.max(initial=0.0) > 1:
        raise ValueError("neuron_freq must hold finite frequencies in [0, 1]")
    return f


def ffn_key(s: ModelSizes, i: int) -> tuple:
    """What layer ``i``'s :func:`~.sizes.hot_bytes` depend on besides the count: its FFN
    tensors and where its down is summed (layers of equal keys share their counts)."""
    return tuple(sorted((k, v) for k, v in s.layers[i].items() if k.startswith("ffn_"))) + (s.host_down_from[i],)


def _run_bytes(s: ModelSizes, i: int, n: int) -> int:
    """Bytes of layer ``i``'s first ``n`` hot neurons before alignment (the knapsack's
    ranking): their gate and up rows, and their down columns unless the host sums the
    layer's down (:meth:`ModelSizes.host_down`)."""
    gate, up, down = neuron_bytes(s, i)
    return n * (gate + up + (0 if s.host_down(i, n) else down))


def plan_placement(
    sizes: ModelSizes,
    neuron_freq: np.ndarray | None,
    vram_budget: int,
    *,
    n_ctx: int,
    n_batch: int,
    disable_gpu_index: bool = False,
    sizer: Sizer = CPU_BUFT,
) -> Plan:
    """Place dense blocks and FFN neurons on the device within ``vram_budget`` bytes.

    Args:
        sizes: the model's dimensions and stored tensor sizes.
        neuron_freq: float (n_layer, n_ff), firing frequencies in [0, 1]; None = uniform.
        vram_budget: device bytes available to our allocations (int >= 0).
        n_ctx: KV cache length in tokens (>= 1).
        n_batch: most tokens per eval call (>= 1), sizes the compute buffer.
        disable_gpu_index: place no FFN neurons (dense blocks only).
        sizer: the device's byte rule (:class:`~.sizes.Sizer`; default: ggml's CPU
            buffer type with an estimated compute buffer).

    Returns:
        A :class:`Plan` with ``device_bytes <= vram_budget`` (deterministic: the same
        inputs give the same plan).

    Raises:
        ValueError: a negative or non-integer budget, n_ctx or n_batch < 1, or a
            neuron_freq of the wrong shape or outside [0, 1].
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_batch = _check_int("n_batch", n_batch, 1)
    freq = _check_freq(sizes, neuron_freq)
    nl, nff = sizes.n_layer, sizes.n_ff
    attn_on = [False] * nl
    output_on = False
    n_hot = [0] * nl
    order: list[np.ndarray] = []
    compute = compute_bytes(sizes, n_ctx, n_batch, sizer)
    used = 0
    if compute <= budget:
        used = compute
        for i in range(nl):
            b = attn_block_bytes(sizes, i, n_ctx, sizer)
            if used + b <= budget:
                attn_on[i], used = True, used + b
        ob = output_block_bytes(sizes, n_batch, sizer)
        if used + ob <= budget:
            output_on, used = True, used + ob
    if compute <= budget and not disable_gpu_index:
        # rank neurons per layer: frequency descending, id ascending
        order = [np.lexsort((np.arange(nff), -freq[i])) for i in range(nl)]
        groups = []  # (-density, group rank, layer)
        starts = np.arange(0, nff, NEURON_GROUP)
        for i in range(nl):
            # mean frequency per byte a group adds: its neurons' rows, and where a layer's down
            # moves from the host to the device, every hot neuron's down column before it
            cost = np.diff([_run_bytes(sizes, i, int(n)) for n in np.append(starts, nff)])
            # non-increasing by rank (guards float rounding; a group that brings the down ranks
            # the rest of its layer as low)
            dens = np.minimum.accumulate(np.add.reduceat(freq[i][order[i]], starts) / cost)
            groups += [(-float(d), g, i) for g, d in enumerate(dens)]
        groups.sort()
        memo: dict = {}
        kinds: dict = {}
        ffn_keys = [kinds.setdefault(ffn_key(sizes, i), len(kinds)) for i in range(nl)]

        def hb(i, n):  # hot_bytes; layers of equal FFN tensors and host down share their counts
            key = (ffn_keys[i], n)
            if key not in memo:
                memo[key] = hot_bytes(sizes, i, n, sizer)
            return memo[key]

        def fill(used: int) -> int:
            """The knapsack over the groups, each layer from its current n_hot on."""
            closed = [False] * nl
            for _, g, i in groups:
                start, k = g * NEURON_GROUP, min(NEURON_GROUP, nff - g * NEURON_GROUP)
                if closed[i] or n_hot[i] >= start + k:
                    continue
                assert start <= n_hot[i]  # groups of one layer come in rank order
                cur = hb(i, n_hot[i])
                if used - cur + hb(i, start + k) <= budget:
                    used += hb(i, start + k) - cur
                    n_hot[i] = start + k
                    continue
                lo, hi = n_hot[i] - start, k  # largest take in [n_hot - start, k) that fits
                while lo < hi:
                    mid = (lo + hi + 1) // 2
                    if used - cur + hb(i, start + mid) <= budget:
                        lo = mid
                    else:
                        hi = mid - 1
                used += hb(i, start + lo) - cur
                n_hot[i] = start + lo
                closed[i] = True
            return used

        def complete(used: int) -> int:
            """A layer's whole FFN is held as stored, often in fewer bytes than most of its
            neurons gathered (Q8_0 or F16 down columns): complete the started layers that fit,
            cheapest first."""
            for i in sorted(range(nl), key=lambda i: (hb(i, nff) - hb(i, n_hot[i]), i)):
                if 0 < n_hot[i] < nff and used + hb(i, nff) - hb(i, n_hot[i]) <= budget:
                    used, n_hot[i] = used + hb(i, nff) - hb(i, n_hot[i]), nff
            return used

        used = complete(fill(used))
        used = complete(fill(used))  # the bytes completed layers freed
    if compute > budget or (not any(attn_on) and not output_on and not any(n_hot)):
        used -= compute if compute <= budget else 0
        compute = 0  # a compute buffer alone is no plan: nothing goes to the device
    layers = []
    for i in range(nl):
        ids = np.sort(order[i][: n_hot[i]]).astype(np.int32) if order else np.zeros(0, np.int32)
        total = float(freq[i].sum())
        mass = float(freq[i][ids].sum()) / total if total > 0 else (1.0 if n_hot[i] == nff else 0.0)
        kv = kv_bytes_per_layer(sizes, n_ctx, sizer) if attn_on[i] else 0
        layers.append(
            LayerPlan(
                i,
                attn_on[i],
                attn_block_bytes(sizes, i, n_ctx, sizer) if attn_on[i] else 0,
                kv,
                ids,
                hot_bytes(sizes, i, n_hot[i], sizer),
                mass,
            )
        )
    plan = Plan(
        budget,
        n_ctx,
        n_batch,
        nff,
        compute,
        output_on,
        output_block_bytes(sizes, n_batch, sizer) if output_on else 0,
        layers,
    )
    assert plan.device_bytes == used and used <= budget, (plan.device_bytes, used, budget)
    return plan


def plan_layer_split(sizes: ModelSizes, vram_budget: int, *, n_ctx: int, n_batch: int, sizer: Sizer = CPU_BUFT) -> Plan:
    """The classic split llama.cpp's ``-ngl`` makes, in the same :class:`Plan` form:
    whole layers (attention block, KV cache and all n_ff neurons) on the device from
    the last layer backwards while they fit, then the output block (llama.cpp counts it
    as one more layer after the last); the compute buffer first, as :func:`plan_placement`. For
    comparing the neuron-level policy with layer offloading at the same budget.

    Raises:
        ValueError: as :func:`plan_placement`.
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    n_ctx = _check_int("n_ctx", n_ctx, 1)
    n_batch = _check_int("n_batch", n_batch, 1)
    nl, nff = sizes.n_layer, sizes.n_ff
    whole = [False] * nl
    output_on = False
    compute = compute_bytes(sizes, n_ctx, n_batch, sizer)
    used = compute
    if compute <= budget:
        for i in reversed(range(nl)):
            if used + layer_bytes(sizes, i, n_ctx, sizer) > budget:
                break
            whole[i], used = True, used + layer_bytes(sizes, i, n_ctx, sizer)
        ob = output_block_bytes(sizes, n_batch, sizer)
        if all(whole) and used + ob <= budget:
            output_on, used = True, used + ob
    else:
        compute = used = 0
    if not any(whole) and not output_on:
        compute = used = 0
    layers = [
        LayerPlan(
            i,
            whole[i],
            attn_block_bytes(sizes, i, n_ctx, sizer) if whole[i] else 0,
            kv_bytes_per_layer(sizes, n_ctx, sizer) if whole[i] else 0,
            np.arange(nff if whole[i] else 0, dtype=np.int32),
            hot_bytes(sizes, i, nff if whole[i] else 0, sizer),
            1.0 if whole[i] else 0.0,
        )
        for i in range(nl)
    ]
    plan = Plan(
        budget,
        n_ctx,
        n_batch,
        nff,
        compute,
        output_on,
        output_block_bytes(sizes, n_batch, sizer) if output_on else 0,
        layers,
    )
    assert plan.device_bytes == used <= budget, (plan.device_bytes, used, budget)
    return plan


def why_nothing_placed(
    sizes: ModelSizes, vram_budget: int, *, n_ctx: int, n_batch: int, sizer: Sizer = CPU_BUFT, neurons: bool = True
) -> str:
    """Why a plan at ``vram_budget`` bytes puts nothing on the device, as one sentence for
    the user (the planners place nothing until the compute buffer and then at least one
    block, or with ``neurons`` one hot neuron group, fit); "" for a budget of 0 (CPU only
    was asked for) or one where something fits (then nothing was placed for another
    reason: ``placement="auto"``'s, :func:`~.auto.why_auto_placed_nothing`)."""
    if vram_budget <= 0:
        return ""

    def size(n: int) -> str:
        return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"

    compute = compute_bytes(sizes, n_ctx, n_batch, sizer)
    if compute > vram_budget:
        return (
            f"vram_budget {size(vram_budget)} places nothing: the device's compute buffer alone needs "
            f"{size(compute)} at n_ctx {n_ctx}, n_batch {n_batch} (a larger budget, or a smaller "
            f"context or batch, needs less)"
        )
    need = min(
        [attn_block_bytes(sizes, i, n_ctx, sizer) for i in range(sizes.n_layer)]
        + [output_block_bytes(sizes, n_batch, sizer)]
        + ([hot_bytes(sizes, i, min(NEURON_GROUP, sizes.n_ff), sizer) for i in range(sizes.n_layer)] if neurons else [])
    )
    if compute + need <= vram_budget:
        return ""
    return (
        f"vram_budget {size(vram_budget)} places nothing: after the compute buffer ({size(compute)}) "
        f"{size(vram_budget - compute)} are left, the smallest block{' or neuron group' if neurons else ''} "
        f"needs {size(need)}"
    )
