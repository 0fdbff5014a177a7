"""Threshold calibration for activation sparsity (``powerinfer-backend calibrate``).

SwiGLU/GeGLU models have no exact zeros in the FFN, so sparsity comes from
skipping neurons whose activation magnitude |h_j| (h = act(gate x) * up x) is
small: CATS (arXiv 2404.08763) thresholds the gate, TEAL (arXiv 2408.14690)
thresholds hidden states per layer and allocates sparsity across layers
greedily. We threshold the product h (the "down-only" form: gate and up stay
dense, rows of the transposed down projection are skipped), which costs far
less quality at equal sparsity (docs/sparsity.md), and choose one threshold
per layer from measured quality, in a few passes over the text:

1. **Statistics** (one dense pass over the calibration tokens): per-layer,
   per-neuron histograms of |h|, and of |act(g)| for the gate form in the same pass,
   collected natively (``pi_context_set_ffn_hist2``).
   A layer's threshold for sparsity s is the s-quantile of its histogram.
2. **Sensitivity**: for each layer alone at a few sparsity levels, the mean
   KL divergence of the next-token distribution from dense on one short chunk.
3. **Candidate paths** from dense to sparse: TEAL-style greedy (repeatedly raise
   the sparsity of the layer whose next 5-point step costs the least KL), and one
   shared threshold for every layer on a geometric grid (each layer then gets its
   own sparsity from its histogram; CATS' single cut).
4. **Budget**: on each path, the sparsest point whose perplexity on a held-out
   tail of the text (never used in steps 1-3) rises by at most
   ``margin * max_ppl_increase`` over dense (the margin guards text the calibration
   never saw), found by an interpolating search (:mod:`.search`, 3-5 evaluations of one
   chunk, or two near the goal; the greedy path only checked once just past the shared
   threshold's result, and searched on only if within), the winner checked on the whole
   tail, and the path reaching the higher mean sparsity wins;
   or, with ``target_sparsity``, the first point reaching it.
5. **Forms and speed** (``threshold_on="auto"``): decode is timed dense vs sparse on
   this host (:mod:`.speed`) for the product form's result, then for the gate form at
   that sparsity (the most it can reach within the same budget); only if that beats
   dense and the product form is step 4 run for the gate form (shared-threshold path
   only) and its result timed. The faster form is kept, its speedup recorded
   (``sparse="auto"`` runs dense when it is below 1).

The result is written as the sparsity sidecar (:mod:`powerinfer_backend.sparsity.sidecar`).
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from ..engine.native import FFN_HIST_BINS, FFN_HIST_MIN_EXP, NativeContext
from .perplexity import perplexity
from .search import search_budget
from .sidecar_run import SidecarRun, speed_info

__all__ = [
    "hist_edges",
    "threshold_for_sparsity",
    "fraction_at_or_above",
    "hist_quantiles",
    "greedy_path",
    "calibrate",
    "CalibrationError",
    "DEFAULT_MAX_PPL_INCREASE",
]

DEFAULT_MAX_PPL_INCREASE = 0.02
#: the search's goal is this fraction of the budget (room for text calibration never saw)
DEFAULT_MARGIN = 0.75
#: sparsity step of the greedy allocation
STEP = 0.05
#: budget-search evaluations per path: by then the bracket is within a point or two of mean
#: sparsity, about what a 1024-token measurement's noise (a few tenths of a percent of
#: perplexity) can resolve
SEARCH_EVALS = 5


class CalibrationError(ValueError):
    """Calibration cannot run on the given input (empty or too short text, ...)."""


# ---- histogram arithmetic ------------------------------------------------------------


def hist_edges() -> np.ndarray:
    """Bin edges of the native |h| histograms: float64 (BINS + 1,), edges[k] is
    bin k's lower edge (edges[0] = 0, edges[BINS] = inf). Bins 1..BINS-2 split
    each octave from 2^FFN_HIST_MIN_EXP upward into four equal parts (the float's
    exponent and top two mantissa bits)."""
    first = (127 + FFN_HIST_MIN_EXP) << 2
    bits = np.arange(first, first + FFN_HIST_BINS - 1, dtype=np.uint32) << np.uint32(21)
    lower = bits.view(np.float32).astype(np.float64)
    return np.concatenate([[0.0], lower, [np.inf]])


_EDGES = hist_edges()


def threshold_for_sparsity(hist: np.ndarray, s: float) -> float:
    """The |h| value below which a fraction ``s`` of the counts in ``hist``
    (one histogram, shape (BINS,)) lie, interpolated linearly inside its bin.
    s <= 0 gives 0.0."""
    total = float(hist.sum())
    if s <= 0.0 or total == 0.0:
        return 0.0
    cdf = np.cumsum(hist, dtype=np.float64)
    want = min(s, 1.0) * total
    k = int(np.searchsorted(cdf, want, side="left"))
    k = min(k, FFN_HIST_BINS - 1)
    below = cdf[k - 1] if k > 0 else 0.0
    frac = (want - below) / max(float(hist[k]), 1.0)
    lo, hi = _EDGES[k], _EDGES[k + 1]
    if not math.isfinite(hi):
        return float(lo)
    return float(lo + frac * (hi - lo))


def fraction_at_or_above(hist: np.ndarray, t: float) -> np.ndarray:
    """Fraction of counts with |h| >= t, per histogram: ``hist`` (..., BINS)
    -> float64 (...). Linear interpolation inside t's bin."""
    counts = hist.astype(np.float64)
    total = counts.sum(axis=-1)
    k = int(np.searchsorted(_EDGES, t, side="right") - 1)
    k = min(max(k, 0), FFN_HIST_BINS - 1)
    lo, hi = _EDGES[k], _EDGES[k + 1]
    inside = 0.0 if not math.isfinite(hi) else (t - lo) / (hi - lo)
    above = counts[..., k + 1 :].sum(axis=-1) + counts[..., k] * (1.0 - inside)
    return np.divide(above, total, out=np.zeros_like(total), where=total > 0)


def hist_quantiles(hist: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """|h| quantiles per histogram: ``hist`` (..., BINS) -> float32 (..., len(qs))."""
    counts = hist.astype(np.float64)
    cdf = np.cumsum(counts, axis=-1)
    total = cdf[..., -1:]
    out = []
    for q in qs:
        want = q * total
        k = np.minimum((cdf < want).sum(axis=-1), FFN_HIST_BINS - 1)
        below = np.where(k > 0, np.take_along_axis(cdf, np.maximum(k - 1, 0)[..., None], -1)[..., 0], 0.0)
        in_bin = np.take_along_axis(counts, k[..., None], -1)[..., 0]
        frac = np.clip((want[..., 0] - below) / np.maximum(in_bin, 1.0), 0.0, 1.0)
        lo, hi = _EDGES[k], _EDGES[k + 1]
        val = np.where(np.isfinite(hi), lo + frac * (np.where(np.isfinite(hi), hi, lo) - lo), lo)
        out.append(np.where(total[..., 0] > 0, val, 0.0))
    return np.stack(out, axis=-1).astype(np.float32)


# ---- allocation ------------------------------------------------------------------------------


def greedy_path(kl: np.ndarray, levels: Sequence[float], step: float = STEP) -> np.ndarray:
    """TEAL-style greedy allocation of sparsity across layers.

    Args:
        kl: float (n_layer, len(levels)): measured cost (KL divergence from
            dense) of each layer alone at each level; the cost at sparsity 0 is 0
            and costs are made non-decreasing in the level.
        levels: increasing sparsity levels in (0, 1).
        step: sparsity increment per greedy move.

    Returns:
        float32 (n_moves + 1, n_layer): row 0 all zeros; each next row raises the
        one layer whose next step adds the least interpolated cost (ties: the
        lower layer), up to max(levels) everywhere.
    """
    kl = np.maximum.accumulate(np.maximum(np.asarray(kl, np.float64), 0.0), axis=1)
    n_layer = kl.shape[0]
    xs = np.concatenate([[0.0], np.asarray(levels, np.float64)])
    grid = np.arange(0.0, xs[-1] + 1e-9, step)
    cost = np.stack([np.interp(grid, xs, np.concatenate([[0.0], kl[i]])) for i in range(n_layer)])
    idx = np.zeros(n_layer, dtype=np.int64)
    rows: list[np.ndarray] = [np.zeros(n_layer, np.float32)]
    last = len(grid) - 1
    for _ in range(n_layer * last):
        open_ = idx < last
        marg = np.where(
            open_, cost[np.arange(n_layer), np.minimum(idx + 1, last)] - cost[np.arange(n_layer), idx], np.inf
        )
        i = int(np.argmin(marg))
        idx[i] += 1
        rows.append(grid[idx].astype(np.float32))
    return np.stack(rows)


# ---- the run -------------------------------------------------------------------------------------


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


@dataclass
class _Setup:
    """The engine pieces one calibration run drives."""

    ctx: NativeContext
    down_t: np.ndarray  # (n_layer, n_ff, n_embd) memmap
    sparse_at_zero: bool  # ReLU family: threshold 0 already skips exact zeros

    def apply(self, thresholds: Optional[np.ndarray], form: str = "product") -> None:
        """Dense when None; else each layer with threshold > 0 (or every layer,
        for the ReLU family) sparse, thresholds compared against ``form``."""
        if thresholds is not None:
            self.ctx.set_ffn_threshold_on(form)
        for layer in range(self.down_t.shape[0]):
            t = 0.0 if thresholds is None else float(thresholds[layer])
            on = thresholds is not None and (t > 0.0 or self.sparse_at_zero)
            self.ctx.set_ffn_sparsity(layer, self.down_t[layer] if on else None, t)

    def eval_all(self, tokens: list) -> np.ndarray:
        self.ctx.truncate(0)
        return self.ctx.eval(tokens, logits_all=True)


@dataclass
class _Choice:
    """One form's result: the thresholds chosen within the budget and what they measured."""

    form: str  # "product" or "gate"
    hist: np.ndarray  # uint32 (n_layer, n_ff, BINS) of the quantity the form thresholds
    thresholds: np.ndarray
    alloc: np.ndarray  # expected per-layer sparsity
    path: str
    ppl: float
    held_sparsity: float
    evals: int
    speed: Optional[dict] = None


def _layer_thresholds(hist_layers: np.ndarray, alloc: np.ndarray) -> np.ndarray:
    return np.array(
        [threshold_for_sparsity(hist_layers[i], float(alloc[i])) for i in range(len(alloc))], dtype=np.float32
    )


def _greedy_candidates(allocs: np.ndarray, hist_layers: np.ndarray):
    """(thresholds rows, expected sparsity rows) along a greedy allocation path."""
    return np.stack([_layer_thresholds(hist_layers, a) for a in allocs]), allocs


def _global_candidates(hist_layers: np.ndarray, max_mean: float, n: int = 160):
    """One threshold for every layer, on a geometric grid, while the expected mean
    sparsity stays <= max_mean (row 0: dense). Each layer's sparsity is then its own
    fraction below the shared threshold."""
    rows_t: list[np.ndarray] = [np.zeros(len(hist_layers), np.float32)]
    rows_a: list[np.ndarray] = [np.zeros(len(hist_layers), np.float32)]
    for t in np.geomspace(1e-4, 16.0, n):
        alloc = (1.0 - fraction_at_or_above(hist_layers, float(t))).astype(np.float32)
        if alloc.mean() > max_mean:
            break
        rows_t.append(np.full(len(hist_layers), t, np.float32))
        rows_a.append(alloc)
    return np.stack(rows_t), np.stack(rows_a)


def _statistics(setup: _Setup, ids: list, n_ctx: int, forms: Sequence[str], shape: tuple, progress: bool) -> dict:
    """Step 1: per-neuron histograms of each form's quantity over ``ids`` (dense), every
    form from the same pass: {form: uint32 (n_layer, n_ff, BINS)}."""
    from tqdm.auto import tqdm

    setup.apply(None)
    hists = {form: np.zeros(shape + (FFN_HIST_BINS,), np.uint32) for form in forms}
    setup.ctx.set_ffn_hists(hists.get("product"), hists.get("gate"))
    try:
        desc = f"statistics ({', '.join(forms)})"
        for s in tqdm(range(0, len(ids), n_ctx), desc=desc, unit="chunk", disable=not progress):
            setup.ctx.truncate(0)
            setup.ctx.eval(ids[s : s + n_ctx], logits_all=False)
    finally:
        setup.ctx.set_ffn_hists(None, None)
    return hists


def _sensitivity(
    setup: _Setup, chunk: list, layer_hist: np.ndarray, levels: Sequence[float], form: str, progress: bool
) -> np.ndarray:
    """Step 2: KL divergence from dense of each layer alone at each level on ``chunk``:
    float64 (n_layer, len(levels))."""
    from tqdm.auto import tqdm

    ctx, down_t = setup.ctx, setup.down_t
    setup.apply(None)
    ctx.set_ffn_threshold_on(form)
    logp = _log_softmax(setup.eval_all(chunk))
    p = np.exp(logp)
    kl = np.zeros((len(layer_hist), len(levels)))
    bar = tqdm(total=kl.size, desc=f"sensitivity ({form})", unit="eval", disable=not progress)
    for layer in range(len(layer_hist)):
        for j, s in enumerate(levels):
            ctx.set_ffn_sparsity(layer, down_t[layer], threshold_for_sparsity(layer_hist[layer], s))
            logq = _log_softmax(setup.eval_all(chunk))
            kl[layer, j] = float((p * (logp - logq)).sum(axis=1).mean())
            bar.update()
        ctx.set_ffn_sparsity(layer, None)
    bar.close()
    return kl


@dataclass
class _Part:
    """One evaluation of a part of the held-out tail: summed NLL, scored tokens, per-layer
    neurons used and available."""

    nll: float
    scored: int
    used: np.ndarray
    total: np.ndarray


class _Held:
    """The held-out tail, chunk by chunk: a budget-search step measures its first chunk, or
    its first ``n_search`` chunks (``search_tokens``' whole chunks, at least one, at most all);
    the final check all of them. Each (key, chunk) is evaluated once; chunks start from an
    empty cache, so their log-likelihoods add up to any prefix's."""

    def __init__(self, setup: _Setup, held: list, n_ctx: int, search_tokens: int):
        self.setup, self.n_ctx = setup, n_ctx
        self.chunks = [held[s : s + n_ctx] for s in range(0, len(held) - n_ctx + 1, n_ctx)]
        self.n_search = max(1, min(search_tokens // n_ctx, len(self.chunks)))  # in chunks
        self.cache: dict[tuple, _Part] = {}

    def evaluations(self, prefix: tuple) -> int:
        """Chunks evaluated for keys starting with ``prefix``."""
        return sum(1 for k, _ in self.cache if k[: len(prefix)] == prefix)

    def measure(self, key: tuple, thresholds: Optional[np.ndarray], form: str, n: int) -> tuple:
        """(perplexity, measured mean FFN sparsity) of ``thresholds`` (None: dense) on the
        first ``n`` chunks."""
        got = []
        for c in range(n):
            if (key, c) not in self.cache:
                self.setup.apply(thresholds, form)
                self.setup.ctx.ffn_stats(reset=True)
                r = perplexity(self.chunks[c], self.setup.eval_all, self.n_ctx)
                used, total = self.setup.ctx.ffn_stats(reset=True, per_layer=True)
                self.cache[key, c] = _Part(r["nll"] * r["tokens"], r["tokens"], used, total)
            got.append(self.cache[key, c])
        used, total = sum(g.used for g in got), sum(g.total for g in got)
        frac = np.where(total == 0, 0.0, 1.0 - used / np.maximum(total, 1))
        return math.exp(sum(g.nll for g in got) / sum(g.scored for g in got)), float(frac.mean())


def _choose_on_paths(
    meter: _Held,
    form: str,
    hist: np.ndarray,
    paths: dict,
    goal: Optional[float],
    target: Optional[float],
    progress: bool,
    prior: Optional[float] = None,
) -> _Choice:
    """Steps 3-4 for one form: on each candidate path the sparsest point within ``goal``
    (relative perplexity increase; :func:`~powerinfer_backend.sparsity.search.search_budget`),
    or the first reaching ``target``; the path reaching more mean sparsity wins.

    A search step measures the held-out tail's first chunk, and its search chunks
    (``meter.n_search``) only when the first chunk's increase lies within half the goal of
    the goal (a point far on one side is decided by one chunk). A later path is measured
    first just past the best point so far, and searched only if that point is within the
    goal (its increase grows along the path, so otherwise it cannot win). The winner is
    then measured on the whole tail and, if over the goal there, searched again below it
    on the whole tail, so the point returned is always within the goal on the whole
    held-out tail. ``prior``: the first path's first guess (mean sparsity)."""
    n_all = len(meter.chunks)
    dense = {n: meter.measure(("dense",), None, form, n)[0] for n in {1, meter.n_search, n_all}}

    def measure(name: str, i: int, n: int) -> tuple[float, float]:
        if i == 0:
            return dense[n], 0.0
        seen = len(meter.cache)
        r = meter.measure((form, name, i), paths[name][0][i], form, n)
        if progress and len(meter.cache) > seen:
            where = "" if n == n_all else f" (first {n * meter.n_ctx} held-out tokens)"
            print(
                f"  {form} {name}: mean sparsity {paths[name][1][i].mean():.1%}: perplexity "
                f"{r[0] / dense[n] - 1:+.2%}{where}",
                file=sys.stderr,
            )
        return r

    def increase(name: str, n: int) -> Callable[[int], float]:
        return lambda k: measure(name, k, n)[0] / dense[n] - 1.0

    def step(name: str) -> Callable[[int], float]:
        assert goal is not None

        def inc(k: int) -> float:
            first = increase(name, 1)(k)
            return first if abs(first - goal) > 0.5 * goal else increase(name, meter.n_search)(k)

        return inc

    best: Optional[tuple[float, str, int]] = None  # (mean expected sparsity, name, index)
    for name, (_, alloc_rows) in paths.items():
        means = alloc_rows.mean(axis=1)
        if target is not None:
            reach = np.nonzero(means >= target - 1e-6)[0]
            i = int(reach[0]) if len(reach) else len(means) - 1
            cand = (-abs(means[i] - target), name, i)
            best = cand if best is None or cand > best else best
            continue
        assert goal is not None  # without a target the search has a perplexity goal
        inc = step(name)
        known: dict[int, float] = {}
        if best is not None:
            j = int(np.searchsorted(means, best[0], side="right"))  # the first row sparser than the best
            if j >= len(means):
                continue
            known[j] = inc(j)
            if known[j] > goal:
                continue
        i, _ = search_budget(means, inc, goal, known=known, prior=prior or 0.3, max_evals=SEARCH_EVALS)
        prior = None
        if best is None or means[i] > best[0]:
            best = (float(means[i]), name, i)
    assert best is not None
    _, name, i = best
    if goal is not None and i > 0 and increase(name, n_all)(i) > goal:
        # over the goal on the whole tail: search the rows below it, measuring the whole tail
        i, _ = search_budget(paths[name][1][:i].mean(axis=1), increase(name, n_all), goal, max_evals=SEARCH_EVALS)
    ppl, held_sparsity = measure(name, i, n_all)
    evals = meter.evaluations((form,))
    return _Choice(form, hist, paths[name][0][i], paths[name][1][i], name, ppl, held_sparsity, evals)


def calibrate(
    model_path: str,
    text_path: str,
    *,
    max_ppl_increase: Optional[float] = DEFAULT_MAX_PPL_INCREASE,
    target_sparsity: Optional[float] = None,
    tokens: int = 2048,
    heldout_tokens: int = 2048,
    search_tokens: int = 1024,
    n_ctx: int = 512,
    offset_bytes: int = 0,
    max_bytes: Optional[int] = None,
    out: Optional[str] = None,
    force: bool = False,
    n_threads: Optional[int] = None,
    margin: float = DEFAULT_MARGIN,
    levels: Sequence[float] = (0.35, 0.7),
    sens_tokens: int = 32,
    threshold_on: str = "auto",
    speed_check: bool = True,
    speed_steps: int = 32,
    speed_repeats: int = 5,
    progress: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
):
    """Calibrate per-layer sparsity thresholds and write the sidecar.

    Args:
        model_path: GGUF model.
        text_path: UTF-8 text; bytes [offset_bytes, offset_bytes + max_bytes) are used.
            Its token sequence is split: the last ``heldout_tokens`` (whole chunks of
            ``n_ctx``; at most a quarter of the text) are held out for the budget
            check, statistics and sensitivities use at most ``tokens`` from the start.
        search_tokens: a budget-search step measures the held-out tail's first chunk, and
            its first ``search_tokens`` (whole chunks, at least one) when that chunk's
            increase lies within half the goal of the goal; the point found is then measured
            on the whole tail (its chunks not measured yet) and, if over the goal there,
            searched again on the whole tail below it.
        max_ppl_increase: relative perplexity budget on the held-out tail (0.02 = +2%),
            met with ``margin`` (the search targets margin * budget).
        target_sparsity: instead of a budget, the lowest allocation with this mean
            FFN sparsity (fraction in (0, 1)); the perplexity is still measured.
        n_ctx: tokens per evaluated chunk.
        out: sidecar path (default :func:`powerinfer_backend.sparsity.sidecar.sidecar_path`).
        force: replace a sidecar made from another model or text.
        levels: sparsity levels of the per-layer sensitivity measurement.
        threshold_on: "product" (|h|: far less quality lost at equal sparsity),
            "gate" (|act(gate x)|, CATS: skips up rows too), or "auto" (default): both
            forms' statistics from one pass; the product form searched, then the gate form
            timed at the product's sparsity (the most it can reach within the budget) and
            searched (shared-threshold path only) only if that decodes faster than dense
            and the product form; the one with the faster measured decode kept. Without
            ``speed_check`` "auto" keeps the product form.
        sens_tokens: tokens of the sensitivity chunk (<= n_ctx).
        speed_check: time decode dense vs sparse on this host (``speed_repeats``
            alternating pairs of ``speed_steps`` tokens) and record the speedup in the
            sidecar; ``sparse="auto"`` runs dense when it is below 1.

    Returns:
        The written :class:`~powerinfer_backend.sparsity.sidecar.SparsityProfile` (``.path`` set).

    Raises:
        CalibrationError (a ValueError): empty text, text shorter than two chunks,
            bad parameters.
        ValueError: an existing sidecar from another model/text without ``force``;
            model loading errors.
    """
    from ..loader import load_gguf
    from .sidecar import QUANTILES, SparsityProfile, check_overwrite

    if target_sparsity is not None:
        if not 0.0 < target_sparsity < 1.0:
            raise CalibrationError(f"target_sparsity must be in (0, 1), got {target_sparsity}")
    elif max_ppl_increase is None or not 0.0 < max_ppl_increase < 10.0:
        raise CalibrationError(f"max_ppl_increase must be in (0, 10) (0.02 = +2%), got {max_ppl_increase}")
    if n_ctx < 16:
        raise CalibrationError(f"n_ctx must be >= 16, got {n_ctx}")
    if tokens < 1 or heldout_tokens < 1 or search_tokens < 1:
        raise CalibrationError("tokens, heldout_tokens and search_tokens must be >= 1")
    if not 0.0 < margin <= 1.0:
        raise CalibrationError(f"margin must be in (0, 1], got {margin}")
    levels = sorted(float(x) for x in levels)
    if not levels or levels[0] <= 0.0 or levels[-1] >= 1.0:
        raise CalibrationError(f"levels must lie in (0, 1), got {levels}")
    sens_tokens = max(2, min(int(sens_tokens), n_ctx))
    if threshold_on not in ("auto", "product", "gate"):
        raise CalibrationError(f"threshold_on must be 'auto', 'product' or 'gate', got {threshold_on!r}")
    if speed_steps < 1 or speed_repeats < 1:
        raise CalibrationError(f"speed_steps and speed_repeats must be >= 1, got {speed_steps}, {speed_repeats}")

    gguf = load_gguf(model_path, verbose=False)  # first: its errors name the file and tensor
    hp = gguf.hparams
    run = SidecarRun.prepare(
        model_path,
        text_path,
        gguf,
        out=out,
        n_ctx=n_ctx,
        tokens=tokens,
        heldout_tokens=heldout_tokens,
        offset_bytes=offset_bytes,
        max_bytes=max_bytes,
        error=CalibrationError,
        purpose="calibration",
    )
    stats_ids, held = run.head, run.held
    check_overwrite(run.path, run.model_sha, run.text_sha, force=force)

    t0, c0 = time.perf_counter(), time.process_time()
    down_t = run.down_t(progress)
    goal = None if target_sparsity is not None or max_ppl_increase is None else margin * max_ppl_increase
    gated = gguf.layer_tensor(0, "ffn_gate") is not None  # an ungated FFN (Falcon, OPT) has no gate form
    forms = (("product", "gate") if gated else ("product",)) if threshold_on == "auto" else (threshold_on,)
    shape = (hp.n_layer, hp.n_ff)
    phases: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - since
        return now

    with run.context(n_threads) as ctx:
        setup = _Setup(ctx, down_t, hp.act_name in ("relu", "drelu"))
        meter = _Held(setup, held, n_ctx, search_tokens)
        ppl_dense = meter.measure(("dense",), None, forms[0], len(meter.chunks))[0]
        t = lap("dense", t0)
        hists = _statistics(setup, stats_ids, n_ctx, forms, shape, progress)
        t = lap("statistics", t)

        def timed(thresholds: np.ndarray, form: str, repeats: int = speed_repeats) -> dict:
            if progress:  # a few seconds to a minute without a bar: say what runs
                print(f"  speed check ({form}): {repeats} pairs of dense and sparse decodes ...", file=sys.stderr)
            r = run.speed(
                ctx,
                lambda: setup.apply(None),
                functools.partial(setup.apply, thresholds, form),
                steps=speed_steps,
                repeats=repeats,
            )
            if progress:
                print(f"  speed check ({form}): {r['speedup']:.2f}x dense", file=sys.stderr)
            return r

        results: list[_Choice] = []
        notes: list[str] = []  # forms not searched, and why
        for form in forms:
            layer_hist = hists[form].sum(axis=1, dtype=np.uint64)
            paths = {"global-threshold": _global_candidates(layer_hist, levels[-1])}
            prior = None
            if form == forms[0]:  # the first form gets the sensitivity pass and the greedy path too
                kl = _sensitivity(setup, stats_ids[:sens_tokens], layer_hist, levels, form, progress)
                paths["kl-greedy"] = _greedy_candidates(greedy_path(kl, levels), layer_hist)
                t = lap("sensitivity", t)
            else:
                first = results[0]
                # A later form (the gate) costs more quality per skipped neuron than the product,
                # so within the same budget it reaches at most the first form's sparsity: timed
                # there, it shows the most it could gain. It is searched only if that beats dense
                # and the first form (with no timings, the first form is kept: nothing to search for).
                means = paths["global-threshold"][1].mean(axis=1)
                k = int(np.searchsorted(means, first.alloc.mean(), side="right")) - 1
                if not speed_check or k <= 0:
                    notes.append(f"{form}: not searched" + ("" if speed_check else " (no speed check)"))
                    continue
                bound = timed(paths["global-threshold"][0][k], form, min(speed_repeats, 3))  # a bound: 3 pairs
                t = lap("speed check", t)
                if bound["speedup"] <= max(1.0, first.speed["speedup"] if first.speed else 0.0):
                    notes.append(f"{form}: not searched ({bound['speedup']:.2f}x at {means[k]:.1%})")
                    continue
                prior = min(0.3, float(means[k]))
            r = _choose_on_paths(meter, form, hists[form], paths, goal, target_sparsity, progress, prior)
            t = lap("budget search", t)
            if r.alloc.mean() > 0 or form == forms[0]:
                results.append(r)
                if speed_check and r.alloc.mean() > 0:
                    r.speed = timed(r.thresholds, form)
                    t = lap("speed check", t)
        # the fastest form within the budget (without timings: the first, the better quality per sparsity)
        best = max(results, key=lambda r: r.speed["speedup"] if r.speed else -1.0) if speed_check else results[0]

    hist, thresholds, alloc = best.hist, best.thresholds, best.alloc
    layer_hist = hist.sum(axis=1, dtype=np.uint64)
    freq = np.stack([fraction_at_or_above(hist[i], float(thresholds[i])) for i in range(hp.n_layer)])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tried = "; ".join(
        f"{r.form}: {r.alloc.mean():.1%} {r.ppl / ppl_dense - 1:+.2%}"
        + (f" {r.speed['speedup']:.2f}x" if r.speed else "")
        for r in results
    )
    tried = "; ".join([tried] + notes)
    info = {
        **run.provenance(),
        "tokens_stats": len(stats_ids),
        "tokens_heldout": len(held),
        "tokens_search": meter.n_search * n_ctx,
        "ppl_dense": ppl_dense,
        "ppl_sparse": best.ppl,
        "max_ppl_increase": max_ppl_increase if target_sparsity is None else None,
        "target_sparsity": target_sparsity,
        "mean_sparsity": float(alloc.mean()),
        "heldout_sparsity": best.held_sparsity,
        "threshold_on": best.form,
        "method": f"{best.path} path, held-out budget search",
        "forms_tried": tried,
        "calibration_seconds": wall,
        "calibration_cpu_seconds": cpu,
    }
    if best.speed:
        info.update(speed_info(best.speed))
    prof = SparsityProfile(
        thresholds=thresholds,
        layer_sparsity=alloc.astype(np.float32),
        neuron_freq=freq.astype(np.float32),
        neuron_quantiles=hist_quantiles(hist, QUANTILES),
        layer_hist=(layer_hist / np.maximum(layer_hist.sum(axis=1, keepdims=True), 1)).astype(np.float32),
        ffn_act=hp.act_name,
        info=info,
    )
    check_overwrite(run.path, run.model_sha, run.text_sha, force=force)  # again: another run may have written it
    path = run.write(prof)
    speed = f"; decode {best.speed['speedup']:.2f}x dense on {best.speed['threads']} threads" if best.speed else ""
    if best.speed and best.speed["speedup"] < 1.0:  # modes._slower_than_dense: auto will not use them
        speed += " (slower: sparse='auto' runs dense, sparse='threshold' forces these thresholds)"
    log(
        f"calibrated {os.path.basename(model_path)} in {wall:.0f} s ({cpu:.0f} s CPU; "
        + ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
        + f"): mean FFN sparsity {alloc.mean():.1%} (held-out {best.held_sparsity:.1%}), held-out perplexity "
        f"{ppl_dense:.4f} -> {best.ppl:.4f} ({best.ppl / ppl_dense - 1:+.2%}) with the {best.form} form on the "
        f"{best.path} path{speed} [{tried}]; {len(stats_ids)} statistics tokens, {len(held)} held-out; wrote {path}"
    )
    return prof


def format_layers(prof) -> str:
    """Per-layer table: threshold, expected sparsity."""
    lines = ["layer  threshold  sparsity"]
    for i in range(prof.n_layer):
        lines.append(f"{i:5d}  {prof.thresholds[i]:9.3g}  {prof.layer_sparsity[i]:8.1%}")
    return "\n".join(lines)
