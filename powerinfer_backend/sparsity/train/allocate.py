"""Choosing the trained predictors' thresholds: per layer an error curve on the
validation slice (per density, the score threshold keeping it and the relative FFN
output error), per-layer densities under a mean (:func:`allocate_densities`, on the
curves as measured or rescaled by each layer's NLL sensitivity), thresholds for a
recall, the per-layer metrics, and the search for the lowest grid point within the
perplexity budget."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..predictors import PredictorSet

__all__ = [
    "RECALL_GRID",
    "DENSITY_GRID",
    "LAYER_DENSITIES",
    "threshold_for_recall",
    "layer_metrics",
    "error_curve",
    "allocate_densities",
    "sensitivity_costs",
    "Trained",
    "predictor_set_at",
    "lowest_within_budget",
]

RECALL_GRID = (0.80, 0.85, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
#: mean predicted densities tried by the budget search (``select="density"``)
DENSITY_GRID = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: per-layer densities the allocation chooses from (1.0: the layer stays dense)
LAYER_DENSITIES = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)


def threshold_for_recall(scores: np.ndarray, y: np.ndarray, recall: float) -> float:
    """Largest threshold keeping at least ``recall`` of the positives (y > 0)."""
    pos = np.sort(scores[y > 0])
    if pos.size == 0:
        return float(np.inf)
    k = int(math.floor((1.0 - recall) * pos.size + 1e-6))
    return float(pos[min(k, pos.size - 1)])


def layer_metrics(scores: np.ndarray, y: np.ndarray, h: np.ndarray, dnorm: np.ndarray, tau: float) -> dict:
    pred = scores >= tau
    tp = float((pred & (y > 0)).sum())
    mag = h * dnorm[None, :]
    return {
        "density": float(pred.mean()),
        "recall": tp / max(1.0, float((y > 0).sum())),
        "precision": tp / max(1.0, float(pred.sum())),
        "mass_recall": float(mag[pred].sum() / max(1e-30, mag.sum())),
    }


def error_curve(scores: np.ndarray, h: np.ndarray, down: np.ndarray, densities=LAYER_DENSITIES):
    """Per density d: (threshold keeping a fraction d of the (token, neuron) scores,
    relative squared error of the FFN output ||down.(h*(1-mask))||^2 / ||down.h||^2).
    h signed (n_tok, n_ff), down (n_embd, n_ff)."""
    y = h @ down.T
    ref = max(float((y * y).sum()), 1e-30)
    flat = np.sort(scores, axis=None)
    out = []
    for d in densities:
        if d >= 1.0:
            out.append((-np.inf, 0.0))
            continue
        k = min(flat.size - 1, max(0, int(round((1.0 - d) * flat.size))))
        tau = float(flat[k])
        e = (h * (scores < tau)) @ down.T
        out.append((tau, float((e * e).sum()) / ref))
    return out


def allocate_densities(
    curves: dict,
    target: float,
    max_density: float = 0.9,
    densities=LAYER_DENSITIES,
    n_layer: Optional[int] = None,
    min_density: float = 0.0,
) -> dict:
    """Per-layer densities with mean <= ``target`` (layers missing from ``curves`` count
    as dense), chosen greedily: each step lowers the layer whose next allowed density
    adds the least output error per unit of density saved. Allowed: 1.0 (dense, no
    predictor) or a grid value in [``min_density``, ``max_density``]. -> layer -> index
    into ``densities``."""
    allowed = [i for i, d in enumerate(densities) if d >= 1.0 or min_density - 1e-9 <= d <= max_density + 1e-9]
    pos = {layer: 0 for layer in curves}  # position in `allowed`
    n_layer = max(n_layer or len(curves), len(curves), 1)
    n_dense = n_layer - len(curves)

    def mean_density():
        return (n_dense + sum(densities[allowed[p]] for p in pos.values())) / n_layer

    while mean_density() > target + 1e-9:
        best, best_cost = None, np.inf
        for layer, p in pos.items():
            if p + 1 >= len(allowed):
                continue
            i0, i1 = allowed[p], allowed[p + 1]
            cost = (curves[layer][i1][1] - curves[layer][i0][1]) / (densities[i0] - densities[i1])
            if cost < best_cost:
                best, best_cost = layer, cost
        if best is None:
            break
        pos[best] += 1
    return {layer: allowed[p] for layer, p in pos.items()}


def sensitivity_costs(curves: dict, sens: dict, i_p: int) -> dict:
    """The error curves rescaled so that each layer's point ``i_p`` (the probe density)
    costs its measured NLL rise ``sens[layer]`` (allocate_densities then trades measured
    loss). A rise below a tenth of the median is measurement noise (a few chunks): floored."""
    floor = max(0.1 * float(np.median([sens[x] for x in curves])), 1e-6)
    costs = {}
    for layer, curve in curves.items():
        e_p = max(curve[i_p][1], 1e-12)
        costs[layer] = [(t, e * max(sens[layer], floor) / e_p) for t, e in curve]
    return costs


@dataclass
class Trained:
    """Per trained layer: the predictor as stored (``fc1``, ``fc2``), its validation data
    ``val`` (scores, labels, |h|, ||down_j||, label threshold) and its error curve."""

    fc1: dict = field(default_factory=dict)
    fc2: dict = field(default_factory=dict)
    val: dict = field(default_factory=dict)
    curves: dict = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return list(self.curves)

    def put(self, ps: PredictorSet, layer: int, tau: float) -> PredictorSet:
        """Add layer ``layer``'s predictor at threshold ``tau`` to ``ps``."""
        ps.fc1[layer], ps.fc2[layer], ps.thresholds[layer] = self.fc1[layer], self.fc2[layer], tau
        return ps


def predictor_set_at(
    tr: Trained,
    r: float,
    costs: dict,
    *,
    select: str,
    allocate: str,
    max_density: float,
    probe_density: float,
    n_layer: int,
) -> tuple[PredictorSet, dict]:
    """recall mode: every layer at recall r; density mode: mean density r, allocated
    over layers by measured output error (allocate_densities on ``costs``), or every
    layer at the grid density nearest r (``allocate="uniform"``). A layer whose density
    exceeds ``max_density`` stays dense. -> (the set, layer -> metrics: density, recall,
    precision, mass_recall, label_threshold, tau, error)."""
    ps = PredictorSet()
    table = {}
    if select != "density":
        alloc = None
    elif allocate == "uniform":  # every layer at the grid density nearest to r (dense above max_density)
        i_r = int(np.argmin([abs(d - r) for d in LAYER_DENSITIES]))
        alloc = {x: (i_r if LAYER_DENSITIES[i_r] <= max_density + 1e-9 else 0) for x in tr.curves}
    else:
        alloc = allocate_densities(
            costs, r, max_density, n_layer=n_layer, min_density=probe_density if allocate == "sensitivity" else 0.0
        )
    for layer in tr.layers:
        sv, y, hv, dnorm, t_l = tr.val[layer]
        if alloc is None:
            tau = threshold_for_recall(sv, y, r)
            err = None
        else:
            tau, err = tr.curves[layer][alloc[layer]]
        met = layer_metrics(sv, y, hv, dnorm, tau)
        met["label_threshold"] = t_l
        met["tau"] = tau
        met["error"] = err if err is not None else float("nan")
        table[layer] = met
        if np.isfinite(tau) and met["density"] <= max_density + 1e-6:
            tr.put(ps, layer, tau)
    return ps, table


def lowest_within_budget(n: int, within: Callable[[int], bool]) -> int:
    """The lowest index of an ascending grid of ``n`` points whose ``within(i)`` holds
    (binary search: the last point is the most accurate and is tried first); the last
    index when even that misses."""
    lo, hi = 0, n - 1
    if not within(hi):
        return hi
    while lo < hi:
        mid = (lo + hi) // 2
        if within(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo
