"""The throughput-aware planner (:func:`plan_throughput`) and ``placement="auto"``
(:func:`plan_auto`): the cost model of :mod:`.predict` decides the placement.

Per layer the choices are: CPU only; the attention block on the device or not, with the
layer's ``k`` most frequent neurons there (``k`` in steps of whole
:data:`~.sizes.NEURON_GROUP` groups, about :data:`GRID` steps per layer) or every neuron
(the whole FFN as stored: with the attention block, the whole layer, as llama.cpp's split
places it). The output block is one more choice. Each choice has exact
device bytes (the sizer's) and predicted seconds per token (:func:`~.predict.layer_time`).
Greedy: from everything on the CPU, repeatedly take the move of one layer (or the output
block) to another of its choices that saves the most predicted seconds per added device
byte among those that still fit the budget left; stop when no move saves time. Then the
bytes left go, a layer at a time, to the most neurons that still fit in the layer whose
time falls most (any count, not only the steps).

:func:`plan_auto` runs this, PowerInfer's neuron plan (:func:`~.planners.plan_placement`)
and the layer split (:func:`~.planners.plan_layer_split`) and keeps the fastest predicted,
so its prediction is never below the layer split it can replay.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np

from .plan import LayerPlan, Plan
from .planners import _check_freq, _check_int, ffn_key, plan_layer_split, plan_placement, why_nothing_placed
from .predict import LayerBytes, _check_predict_args, layer_time, predict_layer_split, predict_ours
from .sizes import (
    CPU_BUFT,
    NEURON_GROUP,
    ModelSizes,
    Sizer,
    attn_block_bytes,
    compute_bytes,
    hot_bytes,
    kv_bytes_per_layer,
    output_block_bytes,
)

__all__ = [
    "POLICIES",
    "plan_throughput",
    "plan_auto",
    "device_skips_for",
    "why_auto_placed_nothing",
    "why_placed_nothing",
]

#: the candidates of ``placement="auto"``, in the order ties are broken
POLICIES = ("throughput", "neurons", "layers")
#: at most about this many neuron counts per layer are tried in the greedy (then the fill)
GRID = 64


class _Layer:
    """One layer's choices: arrays ``b`` (device bytes), ``t`` (seconds), ``a`` (attention
    on the device), ``k`` (neurons there), CPU only first; :meth:`cost` of any (a, k).
    ``memo``: hot bytes by (:func:`~.planners.ffn_key`, k), shared by layers of equal keys."""

    def __init__(self, sizes: ModelSizes, i: int, f_sorted: np.ndarray, n_ctx: int, sizer: Sizer, timer, memo: dict):
        self.sizes, self.i, self.sizer, self.timer, self.memo = sizes, i, sizer, timer, memo
        self.key = memo.setdefault(ffn_key(sizes, i), len(memo))  # a small int: cheap to hash per (key, k)
        self.cum = np.concatenate([[0.0], np.cumsum(f_sorted)])
        self.attn = attn_block_bytes(sizes, i, n_ctx, sizer)
        nff = sizes.n_ff
        step = -(-max(1, nff // GRID) // NEURON_GROUP) * NEURON_GROUP  # whole groups
        rows = [(a, k) + self.cost(a, k) for a in (False, True) for k in sorted(set(range(0, nff, step)) | {nff})]
        a, k, b, t = zip(*rows)
        self.a, self.k = np.asarray(a, bool), np.asarray(k, np.int64)
        self.b, self.t = np.asarray(b, np.int64), np.asarray(t, np.float64)

    def cost(self, a: bool, k: int) -> tuple[int, float]:
        hb = self.memo.get((self.key, k))
        if hb is None:
            hb = self.memo[self.key, k] = hot_bytes(self.sizes, self.i, k, self.sizer)
        hot = float(self.cum[k])
        return (self.attn if a else 0) + hb, self.timer(self.i, a, k, hot, float(self.cum[-1]) - hot)

    def widest(self, a: bool, k: int, left: int) -> tuple[int, int, float] | None:
        """(k', added bytes, seconds) of the most neurons k' > k (below n_ff) that fit in
        ``left`` more bytes with the same attention placement; None if none fits."""
        base = self.cost(a, k)[0]
        lo, hi = k, self.sizes.n_ff - 1
        while lo < hi:  # bytes grow with k' below n_ff
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.cost(a, mid)[0] - base <= left else (lo, mid - 1)
        if lo == k:
            return None
        b, t = self.cost(a, lo)
        return lo, b - base, t


def _best_move(b: np.ndarray, t: np.ndarray, cur: int, left: int) -> tuple[float, int] | None:
    """The choice saving the most seconds per added byte from choice ``cur`` within ``left``
    bytes (a move to fewer bytes that saves time counts as infinitely good); None if none
    saves time."""
    db, dt = b - b[cur], t[cur] - t
    ok = (dt > 0) & (db <= left)
    if not ok.any():
        return None
    rate = np.where(db > 0, dt / np.maximum(db, 1), math.inf)
    rate = np.where(ok, rate, -1.0)
    j = int(np.argmax(rate))  # ties: the first (fewest bytes within a choice kind)
    return float(rate[j]), j


def plan_throughput(
    sizes: ModelSizes,
    neuron_freq: np.ndarray | None,
    vram_budget: int,
    *,
    n_ctx: int,
    n_batch: int,
    device_gbps: float,
    host_gbps: float,
    mode: str,
    sizer: Sizer = CPU_BUFT,
    device_skips: bool = False,
    n_past: int = 0,
    predictor_bytes: int = 0,
    sync_s: float = 0.0,
) -> Plan:
    """The placement that the greedy on predicted seconds saved per device byte chooses
    (module docstring) within ``vram_budget`` bytes.

    Args:
        sizes, neuron_freq, vram_budget, n_ctx, n_batch, sizer: as :func:`~.planners.plan_placement`.
        device_gbps, host_gbps, mode, device_skips, n_past, predictor_bytes, sync_s: the
            cost model's, as :func:`~.predict.predict_ours`.

    Returns:
        A :class:`Plan` with ``device_bytes <= vram_budget`` (deterministic).

    Raises:
        ValueError: as :func:`~.planners.plan_placement` and :func:`~.predict.predict_ours`.
    """
    budget = _check_int("vram_budget", vram_budget, 0)
    n_ctx, n_batch = _check_int("n_ctx", n_ctx, 1), _check_int("n_batch", n_batch, 1)
    bd, bh, n_past, predictor_bytes = _check_predict_args(device_gbps, host_gbps, mode, n_past, predictor_bytes, sync_s)
    freq = _check_freq(sizes, neuron_freq)
    nl, nff = sizes.n_layer, sizes.n_ff
    order = [np.lexsort((np.arange(nff), -freq[i])) for i in range(nl)]  # as plan_placement ranks
    compute = compute_bytes(sizes, n_ctx, n_batch, sizer)
    cur = [0] * (nl + 1)  # per layer the index of its choice (0: CPU only); the last: the output block
    choices: list[tuple] = []
    if compute <= budget:
        lb = [LayerBytes.of(sizes, i, n_past) for i in range(nl)]

        def timer(i, a, k, hot, cold):
            return layer_time(
                lb[i],
                i,
                n_ff=nff,
                attn_on=a,
                n_hot=k,
                hot_fsum=hot,
                cold_fsum=cold,
                bd=bd,
                bh=bh,
                mode=mode,
                device_skips=device_skips,
                predictor_bytes=predictor_bytes,
                sync_s=sync_s,
            ).t

        memo: dict = {}
        lays = [_Layer(sizes, i, freq[i][order[i]], n_ctx, sizer, timer, memo) for i in range(nl)]
        choices = [(L.b, L.t, L.a, L.k) for L in lays]
        out = sizes.output_norm.nbytes + sizes.output.nbytes
        choices.append(
            (
                np.asarray([0, output_block_bytes(sizes, n_batch, sizer)], np.int64),
                np.asarray([out / bh, out / bd]),
                None,
                None,
            )
        )
        left = budget - compute
        version = [0] * (nl + 1)
        heap: list[tuple] = []

        def push(x):
            m = _best_move(choices[x][0], choices[x][1], cur[x], left)
            if m is not None:
                heapq.heappush(heap, (-m[0], x, version[x], m[1]))

        for x in range(nl + 1):
            push(x)
        while heap:
            _, x, v, j = heapq.heappop(heap)
            if v != version[x]:
                continue
            db = int(choices[x][0][j] - choices[x][0][cur[x]])
            if db > left:  # the budget shrank since: the best move that fits now
                version[x] += 1
                push(x)
                continue
            left -= db
            cur[x] = j
            version[x] += 1
            push(x)
        # the choices step by NEURON_GROUP: what is left goes to the layer whose most neurons
        # that still fit (same attention placement) save the most time, while any saves
        state = [(bool(L.a[cur[i]]), int(L.k[cur[i]]), float(L.t[cur[i]])) for i, L in enumerate(lays)]
        while True:
            best = None
            for i, L in enumerate(lays):
                w = L.widest(state[i][0], state[i][1], left)
                if w is not None and state[i][2] - w[2] > 0 and (best is None or state[i][2] - w[2] > best[0]):
                    best = (state[i][2] - w[2], i, w)
            if best is None:
                break
            _, i, (k, db, t) = best
            left -= db
            state[i] = (state[i][0], k, t)
    layers = []
    for i in range(nl):
        a, k = (state[i][0], state[i][1]) if choices else (False, 0)
        ids = np.sort(order[i][:k]).astype(np.int32)
        total = float(freq[i].sum())
        mass = float(freq[i][ids].sum()) / total if total > 0 else (1.0 if k == nff else 0.0)
        layers.append(
            LayerPlan(
                i,
                a,
                attn_block_bytes(sizes, i, n_ctx, sizer) if a else 0,
                kv_bytes_per_layer(sizes, n_ctx, sizer) if a else 0,
                ids,
                hot_bytes(sizes, i, k, sizer),
                mass,
            )
        )
    output_on = bool(choices) and cur[nl] == 1
    if not output_on and not any(L.attn_on_device or L.n_hot for L in layers):
        compute = 0  # nothing placed: no compute buffer either
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
    assert plan.device_bytes <= budget, (plan.device_bytes, budget)
    return plan


def plan_auto(
    sizes: ModelSizes,
    neuron_freq: np.ndarray | None,
    vram_budget: int,
    *,
    n_ctx: int,
    n_batch: int,
    device_gbps: float,
    host_gbps: float,
    mode: str,
    sizer: Sizer = CPU_BUFT,
    disable_gpu_index: bool = False,
    device_skips: bool | None = None,
    n_past: int = 0,
    predictor_bytes: int = 0,
    sync_s: float = 0.0,
) -> Plan:
    """``placement="auto"``: the fastest predicted of :func:`plan_throughput`, the neuron plan
    and the layer split (:data:`POLICIES`; ties go to the earlier). With
    ``disable_gpu_index`` (no FFN neurons on the device) the neuron plan's dense blocks.

    Returns:
        The chosen :class:`Plan`, its ``choice``: ``policy`` (the winner), ``tok_s`` (each
        candidate's predicted decode tok/s), ``llama_cpp_tok_s`` (llama.cpp's layer split at
        the budget, :func:`~.predict.predict_layer_split`), ``ratio`` (the winner's over
        that), ``cpu_tok_s`` (nothing placed), ``device_bytes`` (each candidate's),
        ``sync_s``, ``device_gbps``, ``host_gbps``, ``mode``, ``device_skips`` (whether the
        device computes only the hot neurons the predictor selects: ``device_skips`` as given,
        or with None in mode "predictor" whichever is predicted faster for each candidate,
        the throughput planner planning for it; False in other modes). With ``sync_s`` > 0 the
        throughput plan may place nothing: no placement within the budget is then predicted
        faster than the CPU alone.

    Raises:
        ValueError: as :func:`plan_throughput`.
    """
    # None in mode "predictor": plan for skipping, then keep it only where predicted faster (ties: not)
    skip_opts = (False, True) if device_skips is None and mode == "predictor" else (bool(device_skips),)
    kw: dict[str, Any] = dict(
        device_gbps=device_gbps,
        host_gbps=host_gbps,
        mode=mode,
        device_skips=skip_opts[-1],
        n_past=n_past,
        predictor_bytes=predictor_bytes,
        sync_s=sync_s,
    )
    if disable_gpu_index:
        plans = {
            "neurons": plan_placement(
                sizes, neuron_freq, vram_budget, n_ctx=n_ctx, n_batch=n_batch, disable_gpu_index=True, sizer=sizer
            )
        }
    else:
        plans = {
            "throughput": plan_throughput(
                sizes, neuron_freq, vram_budget, n_ctx=n_ctx, n_batch=n_batch, sizer=sizer, **kw
            ),
            "neurons": plan_placement(sizes, neuron_freq, vram_budget, n_ctx=n_ctx, n_batch=n_batch, sizer=sizer),
            "layers": plan_layer_split(sizes, vram_budget, n_ctx=n_ctx, n_batch=n_batch, sizer=sizer),
        }
    # each candidate with the device's skipping or not, whichever is predicted faster
    skips = {k: max(skip_opts, key=lambda o: _tok_s(sizes, p, neuron_freq, kw, o)) for k, p in plans.items()}
    tok_s = {k: _tok_s(sizes, p, neuron_freq, kw, skips[k]) for k, p in plans.items()}
    cpu = plan_throughput(sizes, neuron_freq, 0, n_ctx=n_ctx, n_batch=n_batch, sizer=sizer, **kw)
    best = max(plans, key=lambda k: (tok_s[k], -POLICIES.index(k)))
    llama = predict_layer_split(
        sizes, vram_budget, device_gbps=device_gbps, host_gbps=host_gbps, n_ctx=n_ctx, n_batch=n_batch, n_past=n_past
    ).tok_s
    plan = plans[best]
    plan.choice = {
        "policy": best,
        "tok_s": tok_s,
        "llama_cpp_tok_s": llama,
        "ratio": tok_s[best] / llama,
        "cpu_tok_s": predict_ours(sizes, cpu, neuron_freq, **kw).tok_s,
        "device_bytes": {k: int(p.device_bytes) for k, p in plans.items()},
        "sync_s": float(sync_s),
        "device_gbps": float(device_gbps),
        "host_gbps": float(host_gbps),
        "mode": mode,
        "device_skips": skips[best] and mode == "predictor",
    }
    return plan


def _tok_s(sizes: ModelSizes, plan: Plan, freq, kw: dict, device_skips: bool) -> float:
    return predict_ours(sizes, plan, freq, **{**kw, "device_skips": device_skips}).tok_s


def device_skips_for(mode: str, plan: Plan, asked: bool | None = None) -> bool:
    """Whether the ggml device computes only the hot neurons a predictor selects under
    ``plan`` with the CPU half's FFN ``mode`` (the engine's ``device_skips``): never outside
    mode "predictor" or without a split layer (:attr:`Plan.splits_ffn`); else ``asked`` when
    given, else :func:`plan_auto`'s choice, else yes (on ggml's CPU backend, which shares the
    host's memory, it read fewer bytes and ran 1.05-1.24x faster: bench/device_skips.py,
    docs/placement.md)."""
    if mode != "predictor" or not plan.splits_ffn:
        return False
    if asked is not None:
        return bool(asked)
    return bool(plan.choice.get("device_skips", True)) if plan.choice else True


def why_auto_placed_nothing(choice: dict) -> str:
    """The sentence for a :func:`plan_auto` result (``choice``: the plan's) that places
    nothing although a candidate would: each one that places something was predicted
    slower than the CPU alone; "" where none places anything (the budget's reason:
    :func:`~.planners.why_nothing_placed`)."""
    placed = [k for k, b in choice.get("device_bytes", {}).items() if b > 0]
    if not placed:
        return ""
    best = max(placed, key=lambda k: choice["tok_s"][k])
    return (
        f"placement auto places nothing: the CPU alone is predicted at {choice['cpu_tok_s']:.1f} tok/s, "
        f"the fastest placement within vram_budget ({best}) at {choice['tok_s'][best]:.1f}"
        + (
            f" (the device's round trip, {choice['sync_s'] * 1e3:.2f} ms per layer split between it and the "
            "CPU, outweighs what it saves)"
            if choice.get("sync_s")
            else ""
        )
    )


def why_placed_nothing(
    plan: Plan,
    sizes: ModelSizes,
    vram_budget: int,
    *,
    n_ctx: int,
    n_batch: int,
    sizer: Sizer = CPU_BUFT,
    neurons: bool = True,
) -> str:
    """Why ``plan``, which places nothing, does so: the budget's reason
    (:func:`~.planners.why_nothing_placed`), else ``placement="auto"``'s
    (:func:`why_auto_placed_nothing`); "" when neither applies (e.g. a budget of 0)."""
    why = why_nothing_placed(sizes, vram_budget, n_ctx=n_ctx, n_batch=n_batch, sizer=sizer, neurons=neurons)
    if not why and plan.choice and "cpu_tok_s" in plan.choice:
        why = why_auto_placed_nothing(plan.choice)
    return why
