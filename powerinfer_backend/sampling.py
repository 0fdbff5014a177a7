"""Token sampling from a row of logits (first cut: greedy, temperature, top-k,
top-p, min-p, repeat penalty; llama.cpp's sampler chain replaces it in the API
issue). Order follows llama-cpp-python: penalties, top-k, top-p, min-p, temperature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    last_n: int = 64


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
                 history: Optional[Sequence[int]] = None) -> int:
    """Pick the next token id from ``logits`` (float32, shape (n_vocab,)).

    temperature <= 0 is greedy (argmax; ties go to the lowest id, as llama.cpp).
    """
    if params.repeat_penalty != 1.0 and history:
        logits = logits.copy()
        ids = np.unique(np.asarray(history[-params.last_n:], dtype=np.int64))
        vals = logits[ids]
        logits[ids] = np.where(vals > 0, vals / params.repeat_penalty, vals * params.repeat_penalty)
    if params.temperature <= 0:
        return int(np.argmax(logits))
    k = params.top_k if 0 < params.top_k < logits.size else logits.size
    ids = np.argpartition(-logits, k - 1)[:k] if k < logits.size else np.arange(logits.size)
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    z = logits[ids].astype(np.float64)
    p = np.exp(z - z[0])
    p /= p.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), params.top_p) + 1)
        ids, z, p = ids[:keep], z[:keep], p[:keep]
    if params.min_p > 0.0:
        keep = p >= params.min_p * p[0]
        ids, z = ids[keep], z[keep]
    z = z / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    return int(ids[rng.choice(ids.size, p=p)])
