"""Decode speed of a sparse configuration against dense, measured on this host at
calibration time (issue 16 item 4: ``sparse="auto"`` never slows a model down).

Whether skipping neurons pays depends on the host (cores, caches, ISA), the thread count,
the model's weight types and the storage of the transposed down, so it is measured where
the model runs rather than predicted: short greedy-free decodes (a fixed token sequence,
one token per step) alternating dense and sparse, and the median of the per-pair time
ratios, which a burst of load on a shared host shifts far less than a single timing.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable, Sequence

__all__ = ["host_id", "decode_seconds", "measure_speedup"]


def host_id() -> str:
    """This machine as the sidecar records it: ``"<node name>/<machine>/<CPUs>cpu"``."""
    return f"{platform.node() or '?'}/{platform.machine() or '?'}/{os.cpu_count() or 0}cpu"


def decode_seconds(ctx, prompt: Sequence[int], steps: Sequence[int]) -> float:
    """Wall seconds for ``len(steps)`` single-token evaluations after ``prompt``
    (from an empty cache). ``ctx``: a NativeContext with room for both."""
    ctx.truncate(0)
    ctx.eval(list(prompt))
    t0 = time.perf_counter()
    for tok in steps:
        ctx.eval([int(tok)])
    return time.perf_counter() - t0


def measure_speedup(
    ctx,
    set_dense: Callable[[], None],
    set_sparse: Callable[[], None],
    tokens: Sequence[int],
    *,
    prompt_tokens: int = 16,
    steps: int = 32,
    repeats: int = 5,
) -> dict:
    """Decode speedup of sparse over dense on this host.

    Args:
        ctx: the NativeContext to time (its thread count is the one measured);
            needs n_ctx >= prompt_tokens + steps.
        set_dense, set_sparse: switch ``ctx`` to either configuration.
        tokens: ids to feed (at least prompt_tokens + steps; real text, so the
            activations and hence the sparse path's kept sets are realistic).
        repeats: dense/sparse pairs, alternating (after one untimed warm-up pair).

    Returns:
        ``{"speedup" (median of dense/sparse time ratios; > 1: sparse is faster),
        "dense_tok_s", "sparse_tok_s" (medians), "repeats", "steps", "threads", "host"}``.
        ``ctx`` is left in the dense configuration.

    Raises:
        ValueError: too few tokens, or repeats/steps < 1.
    """
    if repeats < 1 or steps < 1 or prompt_tokens < 1:
        raise ValueError(f"repeats, steps and prompt_tokens must be >= 1, got {repeats}, {steps}, {prompt_tokens}")
    if len(tokens) < prompt_tokens + steps:
        raise ValueError(f"speed check needs {prompt_tokens + steps} tokens, got {len(tokens)}")
    prompt, run = list(tokens[:prompt_tokens]), list(tokens[prompt_tokens : prompt_tokens + steps])
    dense: list[float] = []
    sparse: list[float] = []
    for r in range(repeats + 1):
        # alternate which runs first, so a trend in the host's load does not favour one side
        order = ((set_dense, dense), (set_sparse, sparse)) if r % 2 else ((set_sparse, sparse), (set_dense, dense))
        for switch, out in order:
            switch()
            t = decode_seconds(ctx, prompt, run)
            if r > 0:  # the first pair warms caches and page mappings
                out.append(t)
    set_dense()
    ratio = statistics.median(d / max(s, 1e-9) for d, s in zip(dense, sparse))
    return {
        "speedup": float(ratio),
        "dense_tok_s": steps / statistics.median(dense),
        "sparse_tok_s": steps / statistics.median(sparse),
        "repeats": repeats,
        "steps": steps,
        "threads": int(ctx.n_threads),
        "host": host_id(),
    }
