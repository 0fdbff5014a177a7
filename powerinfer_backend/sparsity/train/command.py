"""``powerinfer-backend train-predictor``: the orchestration (options, data, per-layer
training, the perplexity-budget search on the held-out tokens), the sidecar it writes
and the per-layer table it prints. The steps are described in the package docstring."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..perplexity import perplexity
from ..predictors import PredictorSet, apply, quantize_q8_0, scores
from ..sidecar_run import SidecarRun, speed_info
from .allocate import (
    DENSITY_GRID,
    LAYER_DENSITIES,
    RECALL_GRID,
    Trained,
    error_curve,
    lowest_within_budget,
    predictor_set_at,
    sensitivity_costs,
)
from .capture import _dequant, capture_ffn_inputs, layer_h
from .fit import fit_layer, have_torch

__all__ = ["train_predictors", "TrainError", "format_table"]


class TrainError(ValueError):
    """Bad training input (empty or short text, bad options)."""


def _check_options(
    *,
    loss,
    recall,
    density,
    select,
    max_ppl_increase,
    rank,
    epochs,
    tokens,
    n_ctx,
    label_sparsity,
    backend,
    allocate,
    probe_density,
    max_density,
    quantize,
) -> str:
    """Raise TrainError for a bad option; -> ``select`` resolved."""
    if loss not in ("mse", "bce"):
        raise TrainError(f"loss must be mse or bce, got {loss!r}")
    if recall is not None and density is not None:
        raise TrainError("give recall or density, not both")
    if select is None:
        select = "recall" if recall is not None else "density"
    if select not in ("density", "recall"):
        raise TrainError(f"select must be density or recall, got {select!r}")
    if density is not None and not 0.0 < density <= 1.0:
        raise TrainError(f"density must be in (0, 1], got {density}")
    if recall is not None and not 0.0 < recall <= 1.0:
        raise TrainError(f"recall must be in (0, 1], got {recall}")
    if recall is None and density is None and (max_ppl_increase is None or not 0.0 < max_ppl_increase < 10.0):
        raise TrainError(f"max_ppl_increase must be in (0, 10) (0.02 = +2%), got {max_ppl_increase}")
    if rank < 1 or epochs < 1 or tokens < 16 or n_ctx < 16:
        raise TrainError("rank, epochs must be >= 1; tokens, n_ctx >= 16")
    if not 0.0 < label_sparsity < 1.0:
        raise TrainError(f"label_sparsity must be in (0, 1), got {label_sparsity}")
    if backend not in ("auto", "torch", "numpy"):
        raise TrainError(f"backend must be auto, torch or numpy, got {backend!r}")
    if backend == "torch" and not have_torch():
        raise TrainError("backend='torch' needs torch: pip install 'powerinfer-backend[train]'")
    if allocate not in ("sensitivity", "error", "uniform"):
        raise TrainError(f"allocate must be sensitivity, error or uniform, got {allocate!r}")
    if probe_density not in LAYER_DENSITIES or probe_density >= 1.0:
        raise TrainError(f"probe_density must be one of {[d for d in LAYER_DENSITIES if d < 1]}")
    if not 0.0 < max_density <= 1.0:
        raise TrainError(f"max_density must be in (0, 1], got {max_density}")
    if quantize not in ("f16", "q8_0"):
        raise TrainError(f"quantize must be f16 or q8_0, got {quantize!r}")
    return select


class _Measure:
    """Perplexity of the training context with a predictor set installed (None: dense),
    every layer's transposed down from the down cache."""

    def __init__(self, ctx, gguf, down_t: np.ndarray, n_ctx: int):
        self.ctx, self.gguf, self.down_t, self.n_ctx = ctx, gguf, down_t, n_ctx

    def _eval_chunk(self, toks):
        self.ctx.truncate(0)
        return self.ctx.eval(toks, logits_all=True)

    def install(self, ps: Optional[PredictorSet]) -> None:
        for layer in range(self.gguf.hparams.n_layer):
            self.ctx.set_ffn_predictor(layer, None)
            self.ctx.set_ffn_sparsity(layer, None)
        if ps is not None and ps.layers:
            apply(self.ctx, self.gguf, ps, down_t={x: self.down_t[x] for x in ps.layers})

    def nll(self, ps: Optional[PredictorSet], tokens) -> float:
        self.install(ps)
        return perplexity(tokens, self._eval_chunk, self.n_ctx)["nll"]

    def held(self, ps: Optional[PredictorSet], tokens) -> tuple[float, float]:
        """-> (perplexity, mean predicted density over the layers) on ``tokens``."""
        self.install(ps)
        ctx = self.ctx
        ctx.ffn_stats(reset=True)
        ctx.predictor_stats(reset=True)
        ppl = perplexity(tokens, self._eval_chunk, self.n_ctx)["ppl"]
        pred = ctx.predictor_stats(reset=True)["predicted"]
        _, total = ctx.ffn_stats(reset=True, per_layer=True)
        dens = np.where(total > 0, pred / np.maximum(total, 1), 1.0)
        return ppl, float(dens.mean())


def _sensitivity(meas: _Measure, tr: Trained, held, train_ids, i_p: int, probe_tokens: int, n_ctx: int) -> dict:
    """layer -> the rise of the NLL with that layer alone at the probe density (point
    ``i_p`` of its error curve), on probe_tokens: the held-out tail first, then the last
    captured chunks (the validation slice's: a probe on those alone was too noisy to
    rank layers, docs/predictors.md)."""
    n_probe = max(1, probe_tokens // n_ctx) * n_ctx
    probe = list(held[:n_probe])
    extra = (n_probe - len(probe)) // n_ctx * n_ctx
    if extra > 0 and len(train_ids) >= extra:
        probe += list(train_ids[len(train_ids) - extra :])
    nll0 = meas.nll(None, probe)
    return {
        layer: meas.nll(tr.put(PredictorSet(), layer, tr.curves[layer][i_p][0]), probe) - nll0 for layer in tr.layers
    }


def train_predictors(
    model_path: str,
    text_path: str,
    *,
    max_ppl_increase: Optional[float] = 0.02,
    recall: Optional[float] = None,
    rank: int = 128,
    epochs: int = 16,
    offset_bytes: int = 0,
    max_bytes: Optional[int] = None,
    force: bool = False,
    out: Optional[str] = None,
    tokens: int = 12288,
    heldout_tokens: int = 2048,
    n_ctx: int = 512,
    label_sparsity: float = 0.5,
    pos_weight: float = 4.0,
    weight_cap: float = 20.0,
    lr: float = 2e-3,
    batch: int = 256,
    max_density: float = 0.9,
    margin: float = 0.75,
    layers: Optional[Sequence[int]] = None,
    n_threads: Optional[int] = None,
    backend: str = "auto",
    seed: int = 0,
    recall_grid: Sequence[float] = RECALL_GRID,
    loss: str = "mse",
    select: Optional[str] = None,
    density: Optional[float] = None,
    density_grid: Sequence[float] = DENSITY_GRID,
    quantize: str = "f16",
    allocate: str = "sensitivity",
    probe_density: float = 0.6,
    probe_tokens: int = 3072,
    speed_check: bool = True,
    progress: bool = True,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> PredictorSet:
    """Train per-layer predictors and write them into the sidecar (see the package
    docstring). Returns the :class:`PredictorSet` (``info`` has the per-layer table).
    With ``speed_check``, decode with the chosen predictors is timed against dense on this
    host (:func:`powerinfer_backend.sparsity.speed.measure_speedup`) and recorded in ``info``
    (``decode_speedup`` ...); ``sparse="auto"`` prefers whichever of predictors, thresholds
    and dense measured fastest.

    Raises:
        TrainError (a ValueError): empty/short/missing text, bad options, no torch when
            ``backend="torch"``. ValueError: an existing sidecar from another model or
            text without ``force``; model loading errors.
    """
    from tqdm.auto import tqdm

    from ...engine.native import default_threads
    from ...loader import load_gguf
    from ..sidecar import check_overwrite, read_sidecar

    select = _check_options(
        loss=loss,
        recall=recall,
        density=density,
        select=select,
        max_ppl_increase=max_ppl_increase,
        rank=rank,
        epochs=epochs,
        tokens=tokens,
        n_ctx=n_ctx,
        label_sparsity=label_sparsity,
        backend=backend,
        allocate=allocate,
        probe_density=probe_density,
        max_density=max_density,
        quantize=quantize,
    )
    use_torch = backend == "torch" or (backend == "auto" and have_torch())
    gguf = load_gguf(model_path, verbose=False)  # first: its errors name the file and tensor
    hp = gguf.hparams
    if gguf.layer_tensor(0, "ffn_gate") is None:  # the labels are act(gate x) * up x
        raise TrainError(
            f"{model_path}: predictor training needs a gated FFN; {gguf.arch}'s is ungated (not implemented yet)"
        )
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
        error=TrainError,
        purpose="training",
    )
    train_ids, held, model_sha, text_sha, path = run.head, run.held, run.model_sha, run.text_sha, run.path
    layers = list(range(hp.n_layer)) if layers is None else sorted(set(int(x) for x in layers))
    if any(not 0 <= x < hp.n_layer for x in layers):
        raise TrainError(f"layers must be in [0, {hp.n_layer})")
    rank = min(int(rank), hp.n_embd * 2)
    if quantize == "q8_0" and (rank % 32 or hp.n_embd % 32):
        raise TrainError(f"--quantize q8_0 needs rank and n_embd multiples of 32 (rank {rank}, n_embd {hp.n_embd})")

    prof = None
    if os.path.exists(path):
        try:
            prof = read_sidecar(path)
        except ValueError:
            prof = None
        if prof is not None and prof.info.get("model_sha256") != model_sha and not force:
            check_overwrite(path, model_sha, text_sha, force=force)
        if prof is not None and prof.info.get("model_sha256") != model_sha:
            prof = None
        if prof is None:
            check_overwrite(path, model_sha, text_sha, force=force)

    t0 = time.time()
    n_threads = n_threads or default_threads()
    with run.context(n_threads) as ctx:
        # 1. capture the FFN inputs
        xs = capture_ffn_inputs(ctx, model_path, hp, train_ids, text_sha, n_ctx, progress)
        t_cap = time.time() - t0

        # 2-3. per-layer training; the last 10% of the captured tokens validate
        n = xs.shape[1]
        n_val = max(1, n // 10)
        n_tr = n - n_val
        rng = np.random.default_rng(seed)
        tr = Trained()
        bar = tqdm(
            total=len(layers) * epochs,
            desc=f"train ({'torch' if use_torch else 'numpy'})",
            unit="epoch",
            disable=not progress,
        )
        t1 = time.time()
        for layer in layers:
            wg = _dequant(gguf.tensors[f"blk.{layer}.ffn_gate.weight"])
            wu = _dequant(gguf.tensors[f"blk.{layer}.ffn_up.weight"])
            dn = _dequant(gguf.tensors[f"blk.{layer}.ffn_down.weight"])  # (n_embd, n_ff)
            dnorm = np.linalg.norm(dn, axis=0).astype(np.float32)
            x = xs[layer].astype(np.float32)
            w1, w2, t_l = fit_layer(
                x,
                n_tr,
                wg,
                wu,
                dnorm,
                hp.act_name,
                rng,
                use_torch=use_torch,
                loss=loss,
                label_sparsity=label_sparsity,
                pos_weight=pos_weight,
                weight_cap=weight_cap,
                rank=rank,
                epochs=epochs,
                lr=lr,
                batch=batch,
                seed=seed + layer,
                n_threads=n_threads,
                progress_cb=lambda ep: bar.update(),
            )
            if quantize == "q8_0":
                tr.fc1[layer] = quantize_q8_0(w1, f"blk.{layer}.fc1.weight")
                tr.fc2[layer] = quantize_q8_0(w2, f"blk.{layer}.fc2.weight")
            else:
                tr.fc1[layer], tr.fc2[layer] = w1.astype(np.float16), w2.astype(np.float16)
            hs = layer_h(x[n_tr:], wg, wu, hp.act_name, signed=True)
            hv = np.abs(hs)
            sv = scores(tr.fc1[layer], tr.fc2[layer], x[n_tr:], n_threads=n_threads)
            tr.curves[layer] = error_curve(sv, hs, dn)
            tr.val[layer] = (sv, (hv >= t_l).astype(np.float32), hv, dnorm, t_l)
        bar.close()
        t_train = time.time() - t1

        # 4. thresholds: measured on the held-out tokens
        meas = _Measure(ctx, gguf, run.down_t(progress), n_ctx)
        ppl_dense, _ = meas.held(None, held)
        costs, sens = tr.curves, {}
        if select == "density" and allocate == "sensitivity":
            sens = _sensitivity(meas, tr, held, train_ids, LAYER_DENSITIES.index(probe_density), probe_tokens, n_ctx)
            costs = sensitivity_costs(tr.curves, sens, LAYER_DENSITIES.index(probe_density))
            log(
                "  sensitivity (NLL rise at density %.2f): %s"
                % (probe_density, " ".join(f"{x}:{sens[x]:.4f}" for x in layers))
            )

        def pset_for(r: float) -> tuple[PredictorSet, dict]:
            return predictor_set_at(
                tr,
                r,
                costs,
                select=select,
                allocate=allocate,
                max_density=max_density,
                probe_density=probe_density,
                n_layer=hp.n_layer,
            )

        fixed = recall if select == "recall" else density
        if fixed is not None:
            r_best = float(fixed)
            ps, table = pset_for(r_best)
            ppl_pred, dens_held = meas.held(ps, held)
        else:
            # the lowest recall / mean density within the budget
            grid = sorted(float(x) for x in (recall_grid if select == "recall" else density_grid))
            what = "recall" if select == "recall" else "mean density"
            assert max_ppl_increase is not None  # _check_options: needed without recall or density
            goal = margin * max_ppl_increase
            measured = {}

            def measure(i):
                if i not in measured:
                    ps_i, table_i = pset_for(grid[i])
                    measured[i] = (meas.held(ps_i, held), ps_i, table_i)
                    log(
                        f"  {what} {grid[i]:.3f}: {len(ps_i.layers)} layers with predictors, held-out density "
                        f"{measured[i][0][1]:.3f}, perplexity {measured[i][0][0] / ppl_dense - 1:+.2%}"
                    )
                return measured[i]

            # even the most accurate point missing the budget is reported (see the log line)
            best = lowest_within_budget(len(grid), lambda i: measure(i)[0][0] <= ppl_dense * (1 + goal))
            (ppl_pred, dens_held), ps, table = measure(best)
            r_best = grid[best]
        speed = None
        if speed_check and ps.layers:
            speed = run.speed(ctx, lambda: meas.install(None), lambda: meas.install(ps))

    # 5. output
    dens = [table[x]["density"] if x in ps.fc1 else 1.0 for x in range(hp.n_layer)]
    ps.info = {
        "select": select,
        "loss": loss,
        "recall_target": r_best if select == "recall" else None,
        "density_target": r_best if select == "density" else None,
        "ppl_dense": ppl_dense,
        "ppl_predictor": ppl_pred,
        "heldout_density": dens_held,
        "rank": float(rank),
        "epochs": float(epochs),
        "tokens_train": float(n_tr),
        "tokens_val": float(n_val),
        "tokens_heldout": float(len(held)),
        "label_sparsity": label_sparsity,
        "max_ppl_increase": max_ppl_increase,
        "quantize": quantize,
        "backend": "torch" if use_torch else "numpy",
        "layer_recall": [table[x]["recall"] if x in table else 0.0 for x in range(hp.n_layer)],
        "layer_precision": [table[x]["precision"] if x in table else 0.0 for x in range(hp.n_layer)],
        "layer_mass_recall": [table[x]["mass_recall"] if x in table else 0.0 for x in range(hp.n_layer)],
        "layer_error": [table[x]["error"] if x in table else 0.0 for x in range(hp.n_layer)],
        "layer_sensitivity": [sens.get(x, 0.0) for x in range(hp.n_layer)],
        "allocate": allocate,
        "density": dens,
        "train_seconds": t_train,
        "capture_seconds": t_cap,
    }
    if speed is not None:
        ps.info.update(speed_info(speed))
    if prof is None:
        prof = _empty_profile(hp)
        prof.info.update(run.provenance())
    prof.predictors = ps
    run.write(prof)
    ps.source = str(path)
    log(format_table(ps, table, hp.n_layer))
    log(
        f"trained {len(layers)} predictors (rank {rank}, {epochs} epochs, {n_tr} tokens, "
        f"{'torch' if use_torch else 'numpy'}) in {time.time() - t0:.0f} s (capture {t_cap:.0f} s, "
        f"training {t_train:.0f} s): {select} target {r_best:.3f}, {len(ps.layers)} layers with predictors, "
        f"held-out predicted density {dens_held:.3f}, perplexity {ppl_dense:.4f} -> {ppl_pred:.4f} "
        f"({ppl_pred / ppl_dense - 1:+.2%}); wrote {path}"
    )
    return ps


def _empty_profile(hp):
    """A sidecar profile with no threshold calibration (every neuron dense), for the
    predictors of a model that has none yet."""
    from ..calibrate import FFN_HIST_BINS
    from ..sidecar import QUANTILES, SparsityProfile

    L, F = hp.n_layer, hp.n_ff
    return SparsityProfile(
        thresholds=np.zeros(L, np.float32),
        layer_sparsity=np.zeros(L, np.float32),
        neuron_freq=np.ones((L, F), np.float32),
        neuron_quantiles=np.zeros((L, F, len(QUANTILES)), np.float32),
        layer_hist=np.zeros((L, FFN_HIST_BINS), np.float32),
        ffn_act=hp.act_name,
        info={"method": "predictors only (no threshold calibration)"},
    )


def format_table(ps: PredictorSet, table: dict, n_layer: int) -> str:
    """The per-layer table train-predictor prints: threshold, density, recall,
    precision, mass recall and output error, ``no (dense)`` where a layer kept no predictor."""
    lines = ["layer  predictor  threshold  density  recall  precision  mass-recall  output-error"]
    for x in range(n_layer):
        if x not in table:
            lines.append(f"{x:5d}  {'-':>9}")
            continue
        m = table[x]
        lines.append(
            f"{x:5d}  {'yes' if x in ps.fc1 else 'no (dense)':>9}  {m['tau']:9.3g}  {m['density']:7.3f}  "
            f"{m['recall']:6.3f}  {m['precision']:9.3f}  {m['mass_recall']:11.4f}  "
            f"{m.get('error', float('nan')):12.4f}"
        )
    return "\n".join(lines)
