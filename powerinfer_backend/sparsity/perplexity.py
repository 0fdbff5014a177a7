"""Perplexity over non-overlapping chunks of ``n_ctx`` tokens, every position after
the first of each chunk scored — the definition a llama-cpp-python ``logits_all=True``
loop gives (and the one ``llama-perplexity`` uses without its half-chunk offset)."""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

import numpy as np


def read_text(path: str, offset_bytes: int = 0, max_bytes: Optional[int] = None) -> str:
    """UTF-8 text of ``path`` from byte ``offset_bytes``, at most ``max_bytes`` bytes
    (a character cut at either end of the slice is dropped).

    Raises:
        ValueError: the file is missing, a folder or empty, the offset is past its end,
            the slice holds no text, or it is not UTF-8 (naming the first bad byte's offset).
    """
    if os.path.isdir(path):
        raise ValueError(f"text file {path} is a folder")
    if not os.path.exists(path):
        raise ValueError(f"text file {path} does not exist")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"cannot read text file {path}: {e}") from e
    if not data:
        raise ValueError(f"text file {path} is empty")
    if max_bytes is not None and max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    if offset_bytes < 0 or offset_bytes >= len(data):
        raise ValueError(f"{path}: offset {offset_bytes} is outside the file ({len(data)} bytes)")
    end = len(data) if max_bytes is None else min(len(data), offset_bytes + max_bytes)
    start = offset_bytes
    while start < end and start - offset_bytes < 3 and (data[start] & 0xC0) == 0x80:
        start += 1  # the slice began inside a character
    chunk = data[start:end]
    try:
        text = chunk.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.reason != "unexpected end of data" or e.start < len(chunk) - 3:
            raise ValueError(
                f"{path} is not UTF-8 text: invalid byte 0x{chunk[e.start]:02x} at offset {start + e.start}"
            ) from None
        text = chunk[: e.start].decode("utf-8")  # the slice ended inside a character
    if not text.strip():
        raise ValueError(f"{path}: no text in bytes {offset_bytes}..{end}")
    return text


def log_softmax_nll(logits: np.ndarray, targets: np.ndarray, rows: int = 64) -> np.ndarray:
    """Negative log-likelihood of ``targets`` (int, shape (n,)) under ``logits``
    (float32, shape (n, n_vocab)): float64 sums of float32 exponentials, ``rows`` at a
    time (a float64 copy of a 512 x 152k chunk is 600 MB and took a fifth of a
    perplexity evaluation; each float32 exp is within an ulp, so the log-sum moves by
    ~1e-7)."""
    logits = np.asarray(logits, np.float32)
    targets = np.asarray(targets)
    out = np.empty(len(targets), np.float64)
    for r in range(0, len(targets), rows):
        z = logits[r : r + rows]
        m = z.max(axis=1, keepdims=True)
        lse = m[:, 0].astype(np.float64) + np.log(np.exp(z - m).sum(axis=1, dtype=np.float64))
        out[r : r + rows] = lse - z[np.arange(len(z)), targets[r : r + rows]]
    return out


def perplexity(
    tokens, eval_chunk: Callable[[list], np.ndarray], n_ctx: int, n_chunks: Optional[int] = None, progress: bool = False
) -> dict:
    """Perplexity of ``tokens`` in chunks of ``n_ctx``.

    Args:
        tokens: token ids of the whole text.
        eval_chunk: evaluates one chunk from an empty cache and returns its logits,
            float32 (len(chunk), n_vocab).
        n_ctx: tokens per chunk (>= 2).
        n_chunks: use at most this many chunks (None = all whole chunks).

    Returns:
        ``{"ppl", "nll", "tokens" (scored), "chunks"}``.

    Raises:
        ValueError: fewer tokens than one chunk, or n_ctx < 2.
    """
    if n_ctx < 2:
        raise ValueError(f"n_ctx must be >= 2 for perplexity, got {n_ctx}")
    available = len(tokens) // n_ctx
    if available == 0:
        raise ValueError(
            f"text has {len(tokens)} token{'' if len(tokens) == 1 else 's'}, fewer than one chunk of {n_ctx}"
        )
    count = available if n_chunks is None else max(1, min(n_chunks, available))
    chunks = range(count)
    if progress:
        from tqdm import tqdm

        chunks = tqdm(chunks, desc="perplexity", unit="chunk")
    total, scored = 0.0, 0
    for c in chunks:
        chunk = list(tokens[c * n_ctx : (c + 1) * n_ctx])
        logits = eval_chunk(chunk)
        nll = log_softmax_nll(logits[:-1], np.asarray(chunk[1:]))
        total += float(nll.sum())
        scored += len(nll)
    return {"ppl": math.exp(total / scored), "nll": total / scored, "tokens": scored, "chunks": count}
