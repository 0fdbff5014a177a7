"""Log-probabilities of logits rows and their top entries, computed as
llama-cpp-python computes them (float32, max-shifted), so reported values match to the bit."""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """float32 log-softmax of ``logits`` along ``axis`` (a row or rows); a row whose
    maximum is not finite is not shifted."""
    top = np.amax(logits, axis=axis, keepdims=True)
    if top.ndim > 0:
        top[~np.isfinite(top)] = 0
    elif not np.isfinite(top):
        top = 0
    shifted = np.subtract(logits, top, dtype=np.single)
    with np.errstate(divide="ignore"):
        log_sum = np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return shifted - log_sum


def top_ids(row: np.ndarray, n: int) -> np.ndarray:
    """The ``n`` token ids of ``row`` (1-D) by decreasing value, equal values by decreasing id."""
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(len(row)), row))  # increasing (value, id)
    return order[::-1][:n]
