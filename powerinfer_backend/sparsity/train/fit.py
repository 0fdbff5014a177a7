"""Fitting one layer's predictor ``fc2 . relu(fc1 . x)``: fc1 initialised from the top
right singular vectors of the gate (in +/- pairs), the targets of the two losses (``mse``:
regression onto each neuron's importance; ``bce``: weighted labels), and Adam with a
cosine learning rate, in torch when installed (the ``[train]`` extra) or the same model
and losses in numpy (slower; exact gradients written out)."""

from __future__ import annotations

import math

import numpy as np

from .capture import layer_h

__all__ = ["have_torch", "fit_layer"]


def have_torch() -> bool:
    try:
        import torch  # noqa: F401 - installed?

        return True
    except ImportError:
        return False


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
            idx = np.sort(perm[s : s + batch])
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
    return (l1.weight.detach().numpy().astype(np.float32).copy(), l2.weight.detach().numpy().astype(np.float32).copy())


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
            idx = np.sort(perm[s : s + batch])
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
                mh = m[i] / (1 - b1**k)
                vh = v[i] / (1 - b2**k)
                w -= (lr_k * mh / (np.sqrt(vh) + eps)).astype(np.float32)
        progress_cb(ep)
    return w1, w2


def fit_layer(
    x: np.ndarray,
    n_tr: int,
    wg: np.ndarray,
    wu: np.ndarray,
    dnorm: np.ndarray,
    act: str,
    rng,
    *,
    use_torch: bool,
    loss: str,
    label_sparsity: float,
    pos_weight: float,
    weight_cap: float,
    rank: int,
    epochs: int,
    lr: float,
    batch: int,
    seed: int,
    n_threads,
    progress_cb,
):
    """Fit one layer's predictor on the first ``n_tr`` rows of ``x`` (float32 (n_tok,
    n_embd)); wg/wu (n_ff, n_embd) the dequantized gate/up, dnorm (n_ff,) the norms of
    the down columns. A neuron's label is ``|h| >= t_l``, t_l the ``label_sparsity``
    quantile of the layer's |h| on a sample of 2048 rows. ``progress_cb(epoch)`` after
    each epoch. -> (fc1 (rank, n_embd), fc2 (n_ff, rank) float32, t_l)."""
    n_ff = wg.shape[0]
    sample = layer_h(x[rng.choice(n_tr, min(n_tr, 2048), replace=False)], wg, wu, act)
    t_l = max(float(np.quantile(sample, label_sparsity)), 1e-30)
    h_tr = None
    if n_tr * n_ff * 4 <= 1 << 30:  # cache |h| when it fits in 1 GiB
        h_tr = layer_h(x[:n_tr], wg, wu, act)
    m_l = max(float((sample * dnorm[None, :]).mean()), 1e-30)

    def y_fn(idx):
        h = h_tr[idx] if h_tr is not None else layer_h(x[idx], wg, wu, act)
        if loss == "mse":  # regression onto the neuron's importance |h_j|*||down_j||
            return (h * dnorm[None, :] / m_l).astype(np.float32), np.ones((1, 1), np.float32)
        return _weights(h, t_l, dnorm, pos_weight, weight_cap)

    fit = _fit_torch if use_torch else _fit_numpy
    w1, w2 = fit(
        x[:n_tr], y_fn, _init_fc1(wg, rank, rng), n_ff, epochs, lr, batch, seed, n_threads, progress_cb, loss_kind=loss
    )
    return w1, w2, t_l
