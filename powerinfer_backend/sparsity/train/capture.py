"""Predictor training data: every layer's normed FFN input x, captured from the engine
over the training tokens (stored as float16, cached in the artifact folder), and the FFN
activation h recomputed from x with the dequantized gate/up weights (the labels), so
that no (n_tok x n_ff) activations are stored."""

from __future__ import annotations

import numpy as np

__all__ = ["capture_ffn_inputs", "layer_h"]


def _dequant(view) -> np.ndarray:
    from gguf import quants

    n_cols, n_rows = view.ne[0], view.ne[1]
    return np.asarray(quants.dequantize(view.data, view.type), np.float32).reshape(n_rows, n_cols)


def _act(name: str, g: np.ndarray) -> np.ndarray:
    if name == "silu":
        return g / (1.0 + np.exp(-g))
    if name == "gelu":
        return 0.5 * g * (1.0 + np.tanh(0.7978845608 * (g + 0.044715 * g**3)))
    return np.maximum(g, 0.0)


def layer_h(x: np.ndarray, wg: np.ndarray, wu: np.ndarray, act: str, signed: bool = False) -> np.ndarray:
    """|h| = |act(gate.x) * up.x| (drelu: relu(up)) for rows x; float32 (h itself with ``signed``)."""
    g = x @ wg.T
    u = x @ wu.T
    if act == "drelu":
        u = np.maximum(u, 0.0)
    h = (_act(act, g) * u).astype(np.float32)
    return h if signed else np.abs(h)


def capture_ffn_inputs(
    ctx, model_path: str, hp, train_ids, text_sha: str, n_ctx: int, progress: bool = True
) -> np.ndarray:
    """Every layer's normed FFN input for ``train_ids``, run densely through ``ctx`` in
    chunks of ``n_ctx``: float16 (n_layer, len(train_ids), n_embd). Cached in the
    artifact folder, keyed by the text slice and n_ctx (a cache hit is memory-mapped;
    a cache that cannot be written is skipped)."""
    from tqdm.auto import tqdm

    from ...loader.artifacts import artifact_dir, atomic_write_path
    from ..sidecar_run import sha256_bytes

    key = sha256_bytes(repr((text_sha, len(train_ids), n_ctx)).encode())[:16]
    cache = artifact_dir(model_path, create=True) / f"ffn_inputs.{key}.f16.npy"
    if cache.is_file():
        try:
            xs = np.load(cache, mmap_mode="r")
            if xs.shape == (hp.n_layer, len(train_ids), hp.n_embd):
                return xs
        except (OSError, ValueError):
            pass
    xs = np.zeros((hp.n_layer, len(train_ids), hp.n_embd), np.float16)
    cap = np.zeros((hp.n_layer, n_ctx, hp.n_embd), np.float32)
    ctx.set_ffn_capture(cap)
    for s in tqdm(range(0, len(train_ids), n_ctx), desc="capture", unit="chunk", disable=not progress):
        chunk = train_ids[s : s + n_ctx]
        ctx.truncate(0)
        ctx.eval(chunk, logits_all=False)
        xs[:, s : s + len(chunk)] = cap[:, : len(chunk)]
    ctx.set_ffn_capture(None)
    try:
        atomic_write_path(cache, lambda tmp: _save_npy(tmp, xs))
    except OSError:
        pass
    return xs


def _save_npy(path, arr) -> None:
    with open(path, "wb") as f:
        np.save(f, arr)
