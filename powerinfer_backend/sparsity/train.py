"""Training activation predictors (``powerinfer-backend train-predictor``; docs/predictors.md).

PowerInfer ships predictors but not the code that trains them; this is ours.

1. **Data.** The text (after ``--offset-bytes``/``--max-bytes``) is tokenized; its last
   ``heldout_tokens`` (whole chunks) are held out for the perplexity budget, the first
   ``tokens`` are run densely through the engine while ``pi_context_set_ffn_capture``
   copies every layer's normed FFN input x (stored as float16). The FFN activation
   ``h = act(gate.x) * (up.x)`` is recomputed from x with the dequantized gate/up
   weights (float32), so no (n_tok x n_ff) activations are stored.
2. **Labels.** Per layer, a neuron is "active" when ``|h| >= t_l``, t_l the
   ``label_sparsity``-quantile of the layer's |h| (for SwiGLU/GeGLU the product, not
   the gate alone). ``label_sparsity`` defaults to 0.5.
3. **Loss.** ``loss="mse"`` (default): the score ``fc2.relu(fc1.x)`` regresses onto each
   neuron's importance ``|h_j| * ||down_j|| / m_l`` (m_l the layer's mean), so the
   predictor ranks neurons by what they add to the FFN output. ``loss="bce"``: binary
   cross-entropy on the labels with every positive weighted by
   ``pos_weight * clip(|h| * ||down_j|| / m_l, 0.25, cap)`` (the earlier scheme). fc1 is
   initialised from the top right singular vectors of the gate weights, in +/- pairs.
   Adam, cosine learning rate. torch when installed (the ``[train]`` extra), else the
   same model and losses in numpy (slower; exact gradients written out).
4. **Thresholds.** On a validation slice (the last 10% of the captured tokens) every
   layer gets an error curve: per density d the score threshold keeping a fraction d and
   the relative FFN output error (:func:`error_curve`). ``select="density"`` (default):
   a mean density D is split over the layers by :func:`allocate_densities`, on the
   error curves scaled by each layer's measured NLL rise at ``probe_density``
   (``allocate="sensitivity"``), on the raw curves (``"error"``) or evenly
   (``"uniform"``); ``density`` fixes D, otherwise D is the lowest grid value whose
   held-out perplexity is within ``margin * max_ppl_increase`` of dense.
   ``select="recall"`` (or ``recall=R``): every layer keeps a fraction R of its
   labelled-active neurons. A layer above ``max_density`` gets no predictor.
5. **Output.** The predictors (``blk.N.fc1.weight`` / ``blk.N.fc2.weight``, float16 or
   ``quantize="q8_0"``),
   thresholds and per-layer precision / recall / predicted density go into the
   sparsity sidecar (created if missing, its calibration kept otherwise).
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from .predictors import PredictorSet

__all__ = ["train_predictors", "TrainError", "have_torch", "RECALL_GRID", "DENSITY_GRID", "format_table",
           "error_curve", "allocate_densities"]

RECALL_GRID = (0.80, 0.85, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
#: mean predicted densities tried by the budget search (``select="density"``)
DENSITY_GRID = (0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: per-layer densities the allocation chooses from (1.0: the layer stays dense)
LAYER_DENSITIES = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2)


class TrainError(ValueError):
    """Bad training input (empty or short text, bad options)."""


def have_torch() -> bool:
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def _dequant(view) -> np.ndarray:
    from gguf import quants
    n_cols, n_rows = view.ne[0], view.ne[1]
    return np.asarray(quants.dequantize(view.data, view.type), np.float32).reshape(n_rows, n_cols)


def _act(name: str, g: np.ndarray) -> np.ndarray:
    if name == "silu":
        return g / (1.0 + np.exp(-g))
    if name == "gelu":
        return 0.5 * g * (1.0 + np.tanh(0.7978845608 * (g + 0.044715 * g ** 3)))
    return np.maximum(g, 0.0)


def layer_h(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, act: str, signed: bool = False) -> np.ndarray:
    """|h| = |act(gate.x) * up.x| (drelu: relu(up)) for rows x; float32 (h itself with ``signed``)."""
    g = x @ wg.T
    u = x @ wu.T
    if act == "drelu":
        u = np.maximum(u, 0.0)
    h = (_act(act, g) * u).astype(np.float32)
    return h if signed else np.abs(h)


# ---- fitting -------------------------------------------------------------------------------


def _init_fc1(wg: np.ndarray, rank: int, rng) -> np.ndarray:
    """+/- pairs of the top right singular vectors of the gate (scaled), rank rows."""
    _, s, vt = np.linalg.svd(wg, full_matrices=False)
    k = max(1, rank // 2)
    v = vt[:k] * (s[:k, None] / s[0])
    fc1 = np.concatenate([v, -v])[:rank]
    if fc1.shape[0] < rank:
        fc1 = np.concatenate([fc1, rng.standard_normal((rank - fc1.shape[0], wg.shape[1])) * 0.01])
    return fc1.astype(np.float32)


def _weights(h: np.ndarray, t: float, dnorm: np.ndarray, pos_weight: float, cap: float):
    y = (h >= t).astype(np.float32)
    mag = h * dnorm[None, :]
    m = float(mag[y > 0].mean()) if (y > 0).any() else 1.0
    w = np.where(y > 0, pos_weight * np.minimum(np.maximum(mag / m, 0.25), cap), 1.0).astype(np.float32)
    return y, w


def _fit_torch(x, y_fn, fc1, n_ff, epochs, lr, batch, seed, n_threads, progress_cb, loss_kind="bce"):
    import torch

    torch.manual_seed(seed)
    if n_threads:
        torch.set_num_threads(int(n_threads))
    rank, n_embd = fc1.shape
    l1 = torch.nn.Linear(n_embd, rank, bias=False)
    l2 = torch.nn.Linear(rank, n_ff, bias=False)
    with torch.no_grad():
        l1.weight.copy_(torch.from_numpy(fc1))
        torch.nn.init.normal_(l2.weight, std=1.0 / math.sqrt(rank))
    params = list(l1.parameters()) + list(l2.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    n = x.shape[0]
    steps = epochs * max(1, math.ceil(n / batch))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    rng = np.random.default_rng(seed)
    for ep in range(epochs):
        perm = rng.permutation(n)
        for s in range(0, n, batch):
            idx = np.sort(perm[s:s + batch])
            xb = torch.from_numpy(x[idx].astype(np.float32))
            yb, wb = (torch.from_numpy(a) for a in y_fn(idx))
            logits = l2(torch.relu(l1(xb)))
            if loss_kind == "mse":
                loss = (wb * (logits - yb) ** 2).sum() / xb.shape[0]
            else:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, yb, weight=wb, reduction="sum")
                loss = loss / xb.shape[0]
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        progress_cb(ep)
    return (l1.weight.detach().numpy().astype(np.float32).copy(),
            l2.weight.detach().numpy().astype(np.float32).copy())


def _fit_numpy(x, y_fn, fc1, n_ff, epochs, lr, batch, seed, n_threads, progress_cb, loss_kind="bce"):
    """The same model, losses and optimiser as _fit_torch, in numpy."""
    rng = np.random.default_rng(seed)
    rank = fc1.shape[0]
    w1 = fc1.astype(np.float32).copy()
    w2 = (rng.standard_normal((n_ff, rank)) / math.sqrt(rank)).astype(np.float32)
    m = [np.zeros_like(w1), np.zeros_like(w2)]
    v = [np.zeros_like(w1), np.zeros_like(w2)]
    b1, b2, eps = 0.9, 0.999, 1e-8
    n = x.shape[0]
    steps = epochs * max(1, math.ceil(n / batch))
    k = 0
    for ep in range(epochs):
        perm = rng.permutation(n)
        for s in range(0, n, batch):
            idx = np.sort(perm[s:s + batch])
            xb = x[idx].astype(np.float32)
            yb, wb = y_fn(idx)
            a = xb @ w1.T
            z = np.maximum(a, 0.0)
            logits = z @ w2.T
            if loss_kind == "mse":
                d = (2.0 * wb * (logits - yb) / xb.shape[0]).astype(np.float32)  # dL/dlogits
            else:
                p = 1.0 / (1.0 + np.exp(-np.clip(logits, -30, 30)))
                d = (wb * (p - yb) / xb.shape[0]).astype(np.float32)
            g2 = d.T @ z
            dz = d @ w2
            dz[a <= 0] = 0.0
            g1 = dz.T @ xb
            k += 1
            lr_k = lr * 0.5 * (1 + math.cos(math.pi * (k - 1) / steps))
            for i, (w, g) in enumerate(((w1, g1), (w2, g2))):
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                mh = m[i] / (1 - b1 ** k)
                vh = v[i] / (1 - b2 ** k)
                w -= (lr_k * mh / (np.sqrt(vh) + eps)).astype(np.float32)
        progress_cb(ep)
    return w1, w2


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
    return {"density": float(pred.mean()), "recall": tp / max(1.0, float((y > 0).sum())),
            "precision": tp / max(1.0, float(pred.sum())),
            "mass_recall": float(mag[pred].sum() / max(1e-30, mag.sum()))}


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


def allocate_densities(curves: dict, target: float, max_density: float = 0.9,
                       densities=LAYER_DENSITIES, n_layer: Optional[int] = None, min_density: float = 0.0) -> dict:
    """Per-layer densities with mean <= ``target`` (layers missing from ``curves`` count
    as dense), chosen greedily: each step lowers the layer whose next allowed density
    adds the least output error per unit of density saved. Allowed: 1.0 (dense, no
    predictor) or a grid value in [``min_density``, ``max_density``]. -> layer -> index
    into ``densities``."""
    allowed = [i for i, d in enumerate(densities)
               if d >= 1.0 or min_density - 1e-9 <= d <= max_density + 1e-9]
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


# ---- the command ---------------------------------------------------------------------------


def train_predictors(model_path: str, text_path: str, *, max_ppl_increase: Optional[float] = 0.02,
                     recall: Optional[float] = None, rank: int = 128, epochs: int = 16,
                     offset_bytes: int = 0, max_bytes: Optional[int] = None, force: bool = False,
                     out: Optional[str] = None, tokens: int = 12288, heldout_tokens: int = 2048,
                     n_ctx: int = 512, label_sparsity: float = 0.5, pos_weight: float = 4.0,
                     weight_cap: float = 20.0, lr: float = 2e-3, batch: int = 256,
                     max_density: float = 0.9, margin: float = 0.75, layers: Optional[Sequence[int]] = None,
                     n_threads: Optional[int] = None, backend: str = "auto", seed: int = 0,
                     recall_grid: Sequence[float] = RECALL_GRID, loss: str = "mse", select: Optional[str] = None,
                     density: Optional[float] = None, density_grid: Sequence[float] = DENSITY_GRID,
                     quantize: str = "f16", allocate: str = "sensitivity", probe_density: float = 0.6,
                     probe_tokens: int = 3072, progress: bool = True,
                     log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> PredictorSet:
    """Train per-layer predictors and write them into the sidecar (see the module
    docstring). Returns the :class:`PredictorSet` (``info`` has the per-layer table).

    Raises:
        TrainError (a ValueError): empty/short/missing text, bad options, no torch when
            ``backend="torch"``. ValueError: an existing sidecar from another model or
            text without ``force``; model loading errors.
    """
    from tqdm.auto import tqdm

    from ..loader.artifacts import model_fingerprint
    from .calibrate import _sha256_bytes, split_text_tokens
    from ..engine.down_cache import build_down_cache, down_t_dtype, load_down_cache
    from ..engine.native import NativeContext, NativeModel, default_threads
    from ..loader.gguf_model import load_gguf
    from .perplexity import perplexity
    from .predictors import apply
    from .sidecar import SparsityProfile, check_overwrite, read_sidecar, sidecar_path, write_sidecar

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
    use_torch = backend == "torch" or (backend == "auto" and have_torch())
    fit = _fit_torch if use_torch else _fit_numpy
    gguf = load_gguf(model_path, verbose=False)  # first: its errors name the file and tensor
    hp = gguf.hparams
    if gguf.layer_tensor(0, "ffn_gate") is None:  # the labels below are act(gate x) * up x
        raise TrainError(f"{model_path}: predictor training needs a gated FFN; {gguf.arch}'s is ungated "
                         "(not implemented yet)")
    text_bytes, train_ids, held = split_text_tokens(
        model_path, text_path, offset_bytes=offset_bytes, max_bytes=max_bytes, n_ctx=n_ctx, tokens=tokens,
        heldout_tokens=heldout_tokens, error=TrainError, purpose="training")
    layers = list(range(hp.n_layer)) if layers is None else sorted(set(int(x) for x in layers))
    if any(not 0 <= x < hp.n_layer for x in layers):
        raise TrainError(f"layers must be in [0, {hp.n_layer})")
    rank = min(int(rank), hp.n_embd * 2)
    if quantize == "q8_0" and (rank % 32 or hp.n_embd % 32):
        raise TrainError(f"--quantize q8_0 needs rank and n_embd multiples of 32 (rank {rank}, n_embd {hp.n_embd})")

    model_sha = model_fingerprint(model_path)
    text_sha = _sha256_bytes(text_bytes)
    path = out or str(sidecar_path(model_path, create=True))
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
    model = NativeModel(gguf)
    ctx = NativeContext(model, n_ctx=n_ctx, n_batch=n_ctx, n_threads=n_threads)
    try:
        # 1. capture the FFN inputs (cached in the artifact folder, keyed by text slice and n_ctx)
        from ..loader.artifacts import artifact_dir
        key = _sha256_bytes(repr((text_sha, len(train_ids), n_ctx)).encode())[:16]
        cache = artifact_dir(model_path, create=True) / f"ffn_inputs.{key}.f16.npy"
        xs = None
        if cache.is_file():
            try:
                xs = np.load(cache, mmap_mode="r")
                if xs.shape != (hp.n_layer, len(train_ids), hp.n_embd):
                    xs = None
            except (OSError, ValueError):
                xs = None
        if xs is None:
            xs = np.zeros((hp.n_layer, len(train_ids), hp.n_embd), np.float16)
            cap = np.zeros((hp.n_layer, n_ctx, hp.n_embd), np.float32)
            ctx.set_ffn_capture(cap)
            for s in tqdm(range(0, len(train_ids), n_ctx), desc="capture", unit="chunk", disable=not progress):
                chunk = train_ids[s:s + n_ctx]
                ctx.truncate(0)
                ctx.eval(chunk, logits_all=False)
                xs[:, s:s + len(chunk)] = cap[:, :len(chunk)]
            ctx.set_ffn_capture(None)
            try:
                from ..loader.artifacts import atomic_write_path
                atomic_write_path(cache, lambda tmp: _save_npy(tmp, xs))
            except OSError:
                pass
        t_cap = time.time() - t0

        # 2-3. per-layer training
        n = xs.shape[1]
        n_val = max(1, n // 10)
        n_tr = n - n_val
        rng = np.random.default_rng(seed)
        fc1s, fc2s, val, curves = {}, {}, {}, {}
        bar = tqdm(total=len(layers) * epochs, desc=f"train ({'torch' if use_torch else 'numpy'})", unit="epoch",
                   disable=not progress)
        t1 = time.time()
        for layer in layers:
            wg = _dequant(gguf.tensors[f"blk.{layer}.ffn_gate.weight"])
            wu = _dequant(gguf.tensors[f"blk.{layer}.ffn_up.weight"])
            dn = _dequant(gguf.tensors[f"blk.{layer}.ffn_down.weight"])  # (n_embd, n_ff)
            dnorm = np.linalg.norm(dn, axis=0).astype(np.float32)
            x = xs[layer].astype(np.float32)
            sample = layer_h(x[rng.choice(n_tr, min(n_tr, 2048), replace=False)], wg, wu, hp.act_name)
            t_l = float(np.quantile(sample, label_sparsity))
            t_l = max(t_l, 1e-30)
            h_tr = None
            if n_tr * hp.n_ff * 4 <= 1 << 30:  # cache |h| when it fits in 1 GiB
                h_tr = layer_h(x[:n_tr], wg, wu, hp.act_name)

            m_l = max(float((sample * dnorm[None, :]).mean()), 1e-30)

            def y_fn(idx, h_tr=h_tr, x=x, wg=wg, wu=wu, t_l=t_l, dnorm=dnorm, m_l=m_l):
                h = h_tr[idx] if h_tr is not None else layer_h(x[idx], wg, wu, hp.act_name)
                if loss == "mse":  # regression onto the neuron's importance |h_j|*||down_j||
                    return (h * dnorm[None, :] / m_l).astype(np.float32), np.ones((1, 1), np.float32)
                return _weights(h, t_l, dnorm, pos_weight, weight_cap)

            w1, w2 = fit(x[:n_tr], y_fn, _init_fc1(wg, rank, rng), hp.n_ff, epochs, lr, batch,
                         seed + layer, n_threads, lambda ep: bar.update(), loss_kind=loss)
            if quantize == "q8_0":
                from .predictors import quantize_q8_0
                fc1s[layer] = quantize_q8_0(w1, f"blk.{layer}.fc1.weight")
                fc2s[layer] = quantize_q8_0(w2, f"blk.{layer}.fc2.weight")
            else:
                fc1s[layer], fc2s[layer] = w1.astype(np.float16), w2.astype(np.float16)
            hs = layer_h(x[n_tr:], wg, wu, hp.act_name, signed=True)
            hv = np.abs(hs)
            from .predictors import scores as c_scores
            sv = c_scores(fc1s[layer], fc2s[layer], x[n_tr:], n_threads=n_threads)
            curves[layer] = error_curve(sv, hs, dn)
            val[layer] = (sv, (hv >= t_l).astype(np.float32), hv, dnorm, t_l)
        bar.close()
        t_train = time.time() - t1

        def pset_for(r: float) -> tuple[PredictorSet, dict]:
            """recall mode: every layer at recall r; density mode: mean density r,
            allocated over layers by measured output error (allocate_densities)."""
            ps = PredictorSet()
            table = {}
            if select != "density":
                alloc = None
            elif allocate == "uniform":  # every layer at the grid density nearest to r (dense above max_density)
                i_r = int(np.argmin([abs(d - r) for d in LAYER_DENSITIES]))
                alloc = {x: (i_r if LAYER_DENSITIES[i_r] <= max_density + 1e-9 else 0) for x in curves}
            else:
                alloc = allocate_densities(costs, r, max_density, n_layer=hp.n_layer,
                                           min_density=probe_density if allocate == "sensitivity" else 0.0)
            for layer in layers:
                sv, y, hv, dnorm, t_l = val[layer]
                if alloc is None:
                    tau = threshold_for_recall(sv, y, r)
                    err = None
                else:
                    tau, err = curves[layer][alloc[layer]]
                met = layer_metrics(sv, y, hv, dnorm, tau)
                met["label_threshold"] = t_l
                met["tau"] = tau
                met["error"] = err if err is not None else float("nan")
                table[layer] = met
                if np.isfinite(tau) and met["density"] <= max_density + 1e-6:
                    ps.fc1[layer], ps.fc2[layer], ps.thresholds[layer] = fc1s[layer], fc2s[layer], tau
            return ps, table

        down_t = None
        dtype = down_t_dtype(gguf)
        build_down_cache(model_path, gguf, dtype, progress=progress)
        down_t = load_down_cache(model_path, dtype)

        def eval_chunk(toks):
            ctx.truncate(0)
            return ctx.eval(toks, logits_all=True)

        def install(ps: Optional[PredictorSet]):
            for layer in range(hp.n_layer):
                ctx.set_ffn_predictor(layer, None)
                ctx.set_ffn_sparsity(layer, None)
            if ps is not None and ps.layers:
                apply(ctx, gguf, ps, down_t={x: down_t[x] for x in ps.layers})

        def held_ppl(ps: Optional[PredictorSet]):
            install(ps)
            ctx.ffn_stats(reset=True)
            ctx.predictor_stats(reset=True)
            ppl = perplexity(held, eval_chunk, n_ctx)["ppl"]
            pred = ctx.predictor_stats(reset=True)["predicted"]
            _, total = ctx.ffn_stats(reset=True, per_layer=True)
            dens = np.where(total > 0, pred / np.maximum(total, 1), 1.0)
            return ppl, float(dens.mean())

        ppl_dense, _ = held_ppl(None)
        costs, sens = curves, {}
        if select == "density" and allocate == "sensitivity":
            # measured sensitivity: each layer alone at the probe density, the rise of the
            # NLL on probe_tokens: the held-out tail first, then the last captured chunks
            # (the validation slice's: a probe on those alone was too noisy to rank layers,
            # docs/predictors.md); a layer's error curve is rescaled so that its probe
            # point costs that rise (allocate_densities then trades measured loss)
            i_p = LAYER_DENSITIES.index(probe_density)
            n_probe = max(1, probe_tokens // n_ctx) * n_ctx
            probe = list(held[:n_probe])
            extra = (n_probe - len(probe)) // n_ctx * n_ctx
            if extra > 0 and len(train_ids) >= extra:
                probe += list(train_ids[len(train_ids) - extra:])
            install(None)
            nll0 = perplexity(probe, eval_chunk, n_ctx)["nll"]
            costs = {}
            for layer in layers:
                one = PredictorSet()
                one.fc1[layer], one.fc2[layer], one.thresholds[layer] = fc1s[layer], fc2s[layer], curves[layer][i_p][0]
                install(one)
                sens[layer] = perplexity(probe, eval_chunk, n_ctx)["nll"] - nll0
            # a rise below a tenth of the median is measurement noise (a few chunks): floor it
            floor = max(0.1 * float(np.median([sens[x] for x in layers])), 1e-6)
            for layer in layers:
                e_p = max(curves[layer][i_p][1], 1e-12)
                costs[layer] = [(t, e * max(sens[layer], floor) / e_p) for t, e in curves[layer]]
            log("  sensitivity (NLL rise at density %.2f): %s" % (
                probe_density, " ".join(f"{x}:{sens[x]:.4f}" for x in layers)))
        fixed = recall if select == "recall" else density
        if fixed is not None:
            r_best = float(fixed)
            ps, table = pset_for(r_best)
            ppl_pred, dens_held = held_ppl(ps)
        else:
            # the lowest recall / mean density within the budget (binary search on the
            # ascending grid; its last point is the most accurate)
            grid = sorted(float(x) for x in (recall_grid if select == "recall" else density_grid))
            what = "recall" if select == "recall" else "mean density"
            goal = margin * max_ppl_increase
            measured = {}

            def measure(i):
                if i not in measured:
                    ps_i, table_i = pset_for(grid[i])
                    measured[i] = (held_ppl(ps_i), ps_i, table_i)
                    log(f"  {what} {grid[i]:.3f}: {len(ps_i.layers)} layers with predictors, held-out density "
                        f"{measured[i][0][1]:.3f}, perplexity {measured[i][0][0] / ppl_dense - 1:+.2%}")
                return measured[i]

            lo, hi = 0, len(grid) - 1
            if measure(hi)[0][0] > ppl_dense * (1 + goal):
                best = hi  # even the most accurate point misses the budget: report it (see the log line)
            else:
                while lo < hi:
                    mid = (lo + hi) // 2
                    if measure(mid)[0][0] <= ppl_dense * (1 + goal):
                        hi = mid
                    else:
                        lo = mid + 1
                best = lo
            (ppl_pred, dens_held), ps, table = measure(best)
            r_best = grid[best]
    finally:
        ctx.close()
        model.close()

    dens = [table[x]["density"] if x in ps.fc1 else 1.0 for x in range(hp.n_layer)]
    ps.info = {"select": select, "loss": loss, "recall_target": r_best if select == "recall" else None,
               "density_target": r_best if select == "density" else None,
               "ppl_dense": ppl_dense, "ppl_predictor": ppl_pred,
               "heldout_density": dens_held, "rank": float(rank), "epochs": float(epochs),
               "tokens_train": float(n_tr), "tokens_val": float(n_val), "tokens_heldout": float(len(held)),
               "label_sparsity": label_sparsity, "max_ppl_increase": max_ppl_increase, "quantize": quantize,
               "backend": "torch" if use_torch else "numpy",
               "layer_recall": [table[x]["recall"] if x in table else 0.0 for x in range(hp.n_layer)],
               "layer_precision": [table[x]["precision"] if x in table else 0.0 for x in range(hp.n_layer)],
               "layer_mass_recall": [table[x]["mass_recall"] if x in table else 0.0 for x in range(hp.n_layer)],
               "layer_error": [table[x]["error"] if x in table else 0.0 for x in range(hp.n_layer)],
               "layer_sensitivity": [sens.get(x, 0.0) for x in range(hp.n_layer)], "allocate": allocate,
               "density": dens, "train_seconds": t_train, "capture_seconds": t_cap}
    if prof is None:
        prof = _empty_profile(hp)
        prof.info.update({"model_sha256": model_sha, "model_file": os.path.basename(model_path),
                          "model_size": os.path.getsize(model_path), "text_sha256": text_sha,
                          "text_file": os.path.basename(text_path), "offset_bytes": offset_bytes,
                          "text_bytes": len(text_bytes), "n_ctx": n_ctx, "created": time.time()})
    prof.predictors = ps
    write_sidecar(path, prof)
    ps.source = str(path)
    log(format_table(ps, table, hp.n_layer))
    log(f"trained {len(layers)} predictors (rank {rank}, {epochs} epochs, {n_tr} tokens, "
        f"{'torch' if use_torch else 'numpy'}) in {time.time() - t0:.0f} s (capture {t_cap:.0f} s, "
        f"training {t_train:.0f} s): {select} target {r_best:.3f}, {len(ps.layers)} layers with predictors, "
        f"held-out predicted density {dens_held:.3f}, perplexity {ppl_dense:.4f} -> {ppl_pred:.4f} "
        f"({ppl_pred / ppl_dense - 1:+.2%}); wrote {path}")
    return ps


def _save_npy(path, arr) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)


def _empty_profile(hp):
    from .calibrate import FFN_HIST_BINS
    from .sidecar import QUANTILES, SparsityProfile

    L, F = hp.n_layer, hp.n_ff
    return SparsityProfile(thresholds=np.zeros(L, np.float32), layer_sparsity=np.zeros(L, np.float32),
                           neuron_freq=np.ones((L, F), np.float32),
                           neuron_quantiles=np.zeros((L, F, len(QUANTILES)), np.float32),
                           layer_hist=np.zeros((L, FFN_HIST_BINS), np.float32), ffn_act=hp.act_name,
                           info={"method": "predictors only (no threshold calibration)"})


def format_table(ps: PredictorSet, table: dict, n_layer: int) -> str:
    lines = ["layer  predictor  threshold  density  recall  precision  mass-recall  output-error"]
    for x in range(n_layer):
        if x not in table:
            lines.append(f"{x:5d}  {'-':>9}")
            continue
        m = table[x]
        lines.append(f"{x:5d}  {'yes' if x in ps.fc1 else 'no (dense)':>9}  {m['tau']:9.3g}  {m['density']:7.3f}  "
                     f"{m['recall']:6.3f}  {m['precision']:9.3f}  {m['mass_recall']:11.4f}  "
                     f"{m.get('error', float('nan')):12.4f}")
    return "\n".join(lines)
